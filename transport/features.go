package transport

// Features name what a build of Felix supports that a process of an
// earlier version does not: brokers advertise theirs when they register
// ([Register].Features) and ctls theirs in their entry in etcd, and the
// control plane refuses a change that a member of an earlier version
// could not take (see package ctl) until every member advertises the
// feature. A feature name is never reused for something else.
const (
	// FeatureReplicaMoves: the process reads a shard map holding a
	// moved placement (see shardmap.Placement.Move), which versions
	// before replica moves fail to decode.
	FeatureReplicaMoves = "replica-moves"
	// FeatureRequestIDs: the process passes on an admin request's ID
	// ([Request].ID), and a control plane of it answers a change sent
	// again with its ID as done. A client sends a change again only
	// while every broker of the map advertises it (and the map names its
	// cluster, which control planes of it do): an earlier broker or ctl
	// would drop the ID, and the retry of a change made would be refused
	// as done already, or made twice.
	FeatureRequestIDs = "request-ids"
	// FeatureReplicaReports: the broker says with its heartbeats where
	// its replicas stand ([Heartbeat].Replicas), and the control plane
	// refuses to move another replica of a shard while one of such a
	// broker is not a voter of the group (see package ctl). A broker
	// without it reports nothing and is not checked.
	FeatureReplicaReports = "replica-reports"
	// FeatureHeartbeatAcks: a ctl answers each heartbeat of a broker that
	// registered with it (on the registration stream, with a [Heartbeat]
	// of its own) and says so in the maps it sends there
	// ([MapUpdate].Features); a broker drops a registration with such a
	// ctl that answered none for half a lease and registers with the next
	// ctl. A ctl answers only a broker that advertises it (an earlier one
	// would refuse the frame), and a broker expects answers only from a
	// ctl that does.
	FeatureHeartbeatAcks = "heartbeat-acks"
	// FeatureMemberMapGet: the broker's own map.get (no principal
	// relayed, as ctlclient's Member.Refresh asks it) waits for a push
	// or its poll interval when the map answered is older than it waits
	// for, and a ctl answers it (with the whole map, as the registration
	// stream pushes it) only from a broker that advertises this, on the
	// connection of its registration. A broker of an earlier version
	// asks again at once whenever it is answered: it is refused, as
	// earlier ctls refused it, and waits its poll interval.
	FeatureMemberMapGet = "member-map-get"
)

// Features returns the features of this build, a new slice each call.
func Features() []string {
	return []string{FeatureReplicaMoves, FeatureRequestIDs, FeatureReplicaReports, FeatureHeartbeatAcks, FeatureMemberMapGet}
}
