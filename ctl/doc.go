// Package ctl is Felix's control plane. It owns broker registration and
// liveness (leases), the stream registry (persisted), placing shards on
// brokers and pushing the shard map to them; and [Member],
// the side of it a broker uses to join the cluster and watch the map, and
// [AdminClient], the side tools use for admin requests.
//
// It must never touch a shard's log or forward a record: ctl decides who
// owns what and who is up; brokers move the data.
//
// # Membership, liveness and ownership
//
// A broker connects over QUIC with its node certificate (ALPN
// [transport.ALPNCtl]) and opens one long-lived registration stream whose
// first frame is [transport.Register]. The node id in the Register frame
// must be the node id of the certificate; a client certificate cannot
// register ([transport.CodeUnauthorized]). ctl answers with a
// [transport.MapUpdate] holding the current map, then sends one whenever
// the map changes; the broker sends a [transport.Heartbeat] every
// LeaseTTL/3.
//
// A node that registers becomes a member for good: membership is persisted
// and, in this version, permanent. A member whose lease runs out (no
// heartbeat for LeaseTTL) or whose registration stream ends is marked not
// Live, but it KEEPS its shards: nothing is reassigned, and publishes to
// its shards fail as unavailable until it registers again. Moving a shard
// means moving its log — a planned membership change with handoff, left
// to a later version — never a side effect of a missed heartbeat.
//
// For the same reason a member that JOINS takes no shard that already has
// an owner. A shard is placed once, when its stream is created (or, for a
// stream created before any broker registered, when the first member
// joins), on the member rendezvous hashing picks among the members of that
// moment ([shardmap.Assign]); from then on its owner is persisted with the
// stream and kept in every map. A broker added to a running cluster
// therefore owns shards of streams created after it joined, and none of
// the older ones until a planned handoff moves them. A second
// registration of the same node id replaces the first (whose stream ctl
// closes); one with a new address updates the member's address.
//
// # Epochs and persistence
//
// Every change to the map (a member joins, goes down or comes back, moves
// address; a stream is created or deleted) bumps the epoch, which only
// grows, also across restarts. The state — epoch, members with their
// addresses, and streams — is a JSON file in DataDir, rewritten atomically
// (temporary file, fsync, rename, fsync of the directory) before each new
// map is pushed. On start ctl loads it, marks every member not Live until
// it registers again and bumps the epoch once, so its first map supersedes
// any map an earlier run pushed. A stream change whose state cannot be
// written is refused and undone; a liveness change that cannot be written
// is logged and pushed anyway (it is a fact, not a request), and the next
// successful write persists its epoch.
//
// # Admin requests
//
// Any other stream on a ctl connection carries one admin
// [transport.Request] and gets one [transport.Response] or
// [transport.Error]: stream.create, stream.delete, stream.list,
// stream.info, map.get and cluster.status. Node and client certificates
// may both make them (brokers proxy their clients' admin requests).
//
// # Usage
//
// The control plane:
//
//	srv, err := ctl.New(ctl.Config{DataDir: dir, TLS: transport.ServerTLS(cert, ca, transport.ALPNCtl)})
//	...
//	err = srv.Start()
//	defer srv.Close()
//	err = srv.CreateStream(shardmap.StreamConfig{Name: "orders", Shards: 8})
//
// A broker:
//
//	m, err := ctl.Join(ctx, ctl.MemberConfig{
//		CtlAddr: addr,
//		TLS:     transport.ClientTLS(ca, &nodeCert, "", transport.ALPNCtl),
//		Node:    transport.Register{NodeID: "broker-0", Addr: "10.0.0.5:7400"},
//	})
//	...
//	defer m.Close()
//	for {
//		changed := m.Changed()
//		apply(m.Map())
//		<-changed
//	}
package ctl
