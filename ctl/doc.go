// Package ctl is Felix's control plane. It owns broker registration and
// liveness (leases), the stream registry (persisted), placing shards on
// brokers and pushing the shard map to them. The side of it a broker uses
// to join the cluster and watch the map ([ctlclient.Member]), and the side
// tools use for admin requests ([ctlclient.AdminClient]), are in package
// ctlclient, which does not import this one.
//
// It must never touch a shard's log or forward a record: ctl decides who
// owns what and who is up; brokers move the data.
//
// # Membership, liveness and ownership
//
// A broker connects over QUIC with its node certificate (ALPN
// [transport.ALPNCtl]) to any ctl of the control plane
// (ctlclient.MemberConfig.CtlAddrs; it moves to the next when one fails)
// and opens one long-lived registration stream whose first frame is
// [transport.Register]. The node id in the Register frame must be the
// node id of the certificate. ctl serves node and ctl certificates only:
// the connection of a client certificate is closed at once with
// [transport.CodeUnauthorized] (a client's admin requests come relayed
// by a broker), so it can neither register nor hold ctl's streams and
// goroutines. Before that, connections in their handshake are bounded
// as on a broker: ctl listens with [transport.Listen], whose
// Config.Transport.MaxHandshakes and RetryHandshakes apply, and so does
// Config.Transport.Revocations: a node (or any) certificate on the
// cluster's revocation list is refused unauthorized before it
// registers, and a registration it holds is closed when a reload lists
// it (`felix ctl` enforces crl.pem of its --certs). ctl
// answers with a [transport.MapUpdate]
// holding the current map, then sends one whenever the map changes; the
// broker sends a [transport.Heartbeat] every LeaseTTL/3 (which ctl
// answers: see below), by ctl's LeaseTTL, which each MapUpdate says
// ([transport.MapUpdate].LeaseTTL; a broker configured with another
// goes by ctl's and warns: one with a longer lease would heartbeat past
// the time ctl gives it, and be shown down and register again over and
// over), with a report of
// which of its replicas are not working voters of their groups
// ([transport.ReplicaReport], also sent at once after each map it
// applies), which the ctl holding the registration keeps in the broker's
// live/ key for the leader's move checks (moves.go).
//
// Liveness is an etcd lease held by the ctl the registration reaches (see
// live.go): the key live/<node> is put with it, every heartbeat keeps it
// alive, and the key is deleted when the registration ends (unless it was
// handed over: see below). Brokers do
// not talk to etcd: one protocol, and the mTLS roles of transport, stay
// as they are. The leader watches live/ and makes the map say so. A ctl
// that closes or dies leaves its brokers' leases to run out; a broker
// that re-registers with another ctl (or the same one restarted) before
// then adopts its lease, so a ctl restart or failover changes no
// broker's liveness and no map. A member notices a ctl that died without
// a word within half a lease (its QUIC link to ctl has that idle
// timeout), in time to do so; and one alive but stuck (a deadlock, a
// request hung holding its lock: its QUIC stack still answers) by the
// heartbeats it leaves unanswered. ctl answers each heartbeat it reads
// with a [transport.Heartbeat] of its own, before it renews the lease,
// to a broker that advertises [transport.FeatureHeartbeatAcks], and says
// it does in the maps of the registration ([transport.MapUpdate].Features);
// a member registered with such a ctl drops a registration on which ctl
// sent nothing (no answer, no map) for half a lease (at least 500ms) and
// registers with the next ctl, and it waits as long at most for the first
// map of a registration. (Neither side expects answers from a process of
// an earlier version.) A member cannot tell a stuck ctl from answers
// merely delayed, so it ends a registration it gives up on as handed
// over (QUIC codes streamCodeHandOver, connCodeHandOver; see register.go),
// and the ctl, if it is not stuck, leaves the broker's live/ key for the
// next ctl to adopt the lease, as on its own hand-over: the broker is not
// shown down and back for it. (A ctl of an earlier version takes the
// codes for the stream's end and deletes the key.) A ctl alive but cut
// off from etcd's quorum cannot renew the leases it holds: it tells a
// broker whose lease went unrenewed for half its time to register
// elsewhere (CodeUnavailable), and, once it finds etcd out of reach, all
// of them, refusing new registrations and map.get until it reaches etcd
// again (cutoff.go).
//
// A node that registers becomes a member: membership is persisted, and
// ends only when an operator removes a member lost for good, once it is
// down, holds no shard or replica, and no move of a replica from it is
// pending ([Server.RemoveBroker], cluster.remove; see remove.go). A member whose lease runs out (no
// heartbeat for LeaseTTL, rounded up to whole seconds, and to at least
// 1.5 election timeouts of etcd) or whose registration stream ends is
// marked not Live, but it KEEPS its shards: nothing is reassigned, and
// publishes to its shards fail as unavailable until it registers again.
// Moving a shard means moving its log — a planned membership change with
// handoff, left to a later version — never a side effect of a missed
// heartbeat.
//
// For the same reason a member that JOINS takes no shard that already has
// an owner. A shard is placed once, when its stream is created (or, for a
// stream created before any broker registered, when the first member
// joins), on the member rendezvous hashing picks among the members of that
// moment ([shardmap.Assign]); from then on its owner is persisted with the
// stream and kept in every map. A shard of a replicated stream (Replicas
// 3) is placed on the top three members by rendezvous hashing
// ([shardmap.PlaceReplicas]), and its replica set (the raft group's
// voters) changes only when an operator moves the replica of a broker
// that is down, lost for good, to another ([Server.MoveReplica],
// stream.move; a live broker's replica is not moved); creating one while
// the cluster has fewer members than replicas is refused with
// [ErrTooFewMembers]. A broker added to a running cluster
// therefore owns shards of streams created after it joined, and none of
// the older ones until a planned handoff moves them. A second
// registration of the same node id replaces the first, whose stream ctl
// ends with [transport.CodeReplaced]: two processes running as one node
// (an old one not stopped beside its replacement) would replace each
// other's registration, so a member told so logs it at error level and
// registers again only after its longest backoff. One with a new address
// updates the member's address.
//
// A broker registers with the features of its build
// ([transport.Register].Features, [transport.Features]; ctlclient sends
// them), which the member keeps in the map ([shardmap.Node].Features),
// in etcd while it is down, and replaces when it registers again; a ctl
// advertises its own in its ctl/ entry. A change that a process of an
// earlier version could not take waits until every live broker and
// running ctl advertises the feature: a replica move
// ([transport.FeatureReplicaMoves], see moves.go) is refused until then,
// naming them, so that a cluster upgraded one process at a time keeps
// the ones not yet upgraded in it.
//
// # State in etcd
//
// The state lives in etcd ([EtcdConfig]): by default a single-member etcd
// embedded in DataDir (DataDir/etcd, its https:// loopback URLs in
// DataDir/etcd-urls.json; DataDir is its owner's only); or an embedded
// member of a cluster of several ctls (EtcdConfig.InitialCluster, `felix
// ctl --etcd-name ctl-0 --etcd-peer-url https://ctl-0:2380
// --etcd-initial-cluster ctl-0=https://ctl-0:2380,ctl-1=...`). An
// embedded member is reached with the ctls' own certificates and the
// cluster CA (EtcdConfig.CertFile, KeyFile, CAFile): mutual TLS on its
// peer and client URLs, loopback ones included, where only ctl
// certificates are served (see etcdtls.go); plaintext URLs take
// EtcdConfig.Insecure. Or the state lives in an existing etcd cluster
// (EtcdConfig.Endpoints, `--etcd-endpoints`, with mTLS by `--etcd-ca`,
// `--etcd-cert`, `--etcd-key`), whose members may be the etcd built into
// felix ([StartEtcdMember], `felix etcd`). An embedded member is only
// ever started as one of a new cluster: a member whose data holds
// another membership than EtcdConfig.InitialCluster names refuses to
// start (etcd would ignore the initial cluster and serve its old
// cluster; see checkMembership). The state's keys, under
// /felix/<cluster>/:
//
//	epoch                          the map epoch, decimal
//	writer                         who committed it: {"name","id","election"} JSON, put in the same transaction
//	members/<node>                 {"id","addr","admin","live","features"} JSON
//	streams/<stream>               {"name","shards","retention_bytes","retention_age_ns","owners"} JSON
//	grants/<principal>/<action>/<pattern>  {"principal","action","pattern"} (path-escaped)
//	superusers                     the committing leader's --superuser list, JSON
//	cluster-id                     the cluster's ID (every map's Cluster), made by the first leader, never changed
//	requests/<id>                  an admin change made for a request with that ID: {"what","result","epoch"}, the last 1024
//	live/<node>                    a broker's liveness, with its lease
//	ctl/<name>                     a ctl member {"name","id","addr","etcd","features"}, with its session lease
//	election/<lease>               the leader election (concurrency.Election)
//
// etcd's quota bounds its database file, which only a defragmentation
// shrinks; a full etcd raises NOSPACE and refuses every write. The ctls
// keep the embedded etcd under it (compact, defragment member by member,
// disarm: etcdspace.go) and report an external etcd's alarm. A write
// etcd refuses without applying it (over --max-request-bytes or
// --max-txn-ops, or under NOSPACE once the store read that it did not
// land) is answered CodeLimitExceeded, its outcome known.
//
// The map is a function of epoch, members, streams, grants and
// superusers, so every ctl builds the same map from the same revision.
// The superusers are the committing leader's configuration, committed
// with the state (key superusers) and restored from it by every ctl
// (restoreState): the ctls' --superuser flags may differ during a rolling
// change, and a new list takes effect once a ctl configured with it
// leads.
//
// # Epochs, changes and leadership
//
// Every change to the map (a member joins, goes down or comes back, moves
// address, is removed; a stream is created or deleted, a replica moved; a
// grant) bumps the epoch,
// which only grows. The change is computed by the deterministic core
// (state.go) and committed as one etcd transaction that puts the epoch key
// and the keys that changed, guarded by the mod revision of the epoch key
// the change was computed from and by the leader's election key. So two
// ctls can never commit two different maps for one epoch, and a leader
// whose election session ended (dead, paused, cut off from a quorum)
// cannot commit at all. Every admin change is checked against the
// cluster's limits before it is committed: shards (Config.MaxShardsTotal),
// grants (Config.MaxGrants), and the map itself, which every broker is
// sent whole in one frame of at most ctlclient.MaxMapFrame: a change that
// would grow the map past that less a margin is refused with
// CodeLimitExceeded ([MapTooLargeError], mapsize.go): no admin change
// makes a map ctl cannot send, and the margin is left to the changes it
// cannot refuse (members joining). A stream change that cannot be
// committed is refused and undone; a liveness change that cannot be committed yet
// (etcd slow or out of quorum) stays unpushed and is retried until it is
// committed or this ctl stops leading: brokers are only ever pushed maps
// etcd committed, so they see one map history.
//
// One ctl is the leader (concurrency.Election, session TTL Config.CtlTTL):
// it alone commits. The others follow: they watch etcd, adopt each map the
// leader commits and push it to the brokers registered with them, answer
// reads from it, and forward changes to the leader (over QUIC with their
// ctl certificate, for the principal of the request), returning once they
// hold the resulting map. When the leader's session ends, the next ctl in
// line takes over: it reads the state and live/, and carries on from the
// stored epoch (bumped once). A broker live in the stored map whose lease
// is gone (every ctl was down for longer than a lease, so none could
// renew it) stays live for a lease and a reconnect backoff more, to
// register again, before it is marked down: a control plane outage does
// not take the brokers' shards away. The data path does not depend on ctl:
// brokers keep their last map while no ctl answers.
//
// Close cancels every etcd request of the server before it waits for its
// goroutines: without a quorum of etcd none could succeed, and a leader's
// resignation is given CtlTTL at most (its session lease ends the
// leadership after that anyway).
//
// A data dir holding the JSON state file of earlier versions
// (ctl-state.json) is imported into an empty etcd on first start and
// renamed ctl-state.json.imported.
//
// # Admin requests
//
// Any other stream on a ctl connection carries one admin
// [transport.Request] and gets one [transport.Response] or
// [transport.Error]: stream.create, stream.delete, stream.list,
// stream.info, stream.move (a replica of a replicated shard, from a
// broker that is down to another: see moves.go and
// [Server.MoveReplica]), map.get, cluster.status (which also lists
// the ctl members, their roles and etcd health, in
// [transport.Response].Ctl), cluster.remove (a broker that is down and
// holds nothing, no move from it pending, named by
// [transport.Request].NodeID: see remove.go and
// [Server.RemoveBroker]), and the acl requests.
// Brokers make them for their clients, each request naming the client's
// principal (a node certificate is no principal itself), and so does
// another ctl forwarding a change; a client certificate is not served
// (see above). A broker asking map.get for itself, with no
// principal (ctlclient.Member.Refresh), on the connection of its
// registration made with [transport.FeatureMemberMapGet], gets the whole
// map, as its registration stream pushes it; its certificate allows it
// nothing else. One that registered without the feature (an earlier
// version, whose Refresh asks again at once whenever it is answered) is
// refused, as earlier ctls refused it, and waits its poll interval.
//
// # Usage
//
// The control plane:
//
//	srv, err := ctl.New(ctl.Config{DataDir: dir, TLS: transport.ServerTLS(cert, ca, transport.ALPNCtl),
//		Etcd: ctl.EtcdConfig{CertFile: "ctl.crt", KeyFile: "ctl.key", CAFile: "ca.crt"}})
//	...
//	err = srv.Start()
//	defer srv.Close()
//	err = srv.CreateStream(shardmap.StreamConfig{Name: "orders", Shards: 8})
//
// A broker joins it with [ctlclient.Join] (see package ctlclient).
package ctl
