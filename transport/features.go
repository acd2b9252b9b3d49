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
)

// Features returns the features of this build, a new slice each call.
func Features() []string { return []string{FeatureReplicaMoves} }
