// Package shardmap owns the cluster's shard map: which node owns each shard
// of each stream, versioned by an epoch that only grows.
//
// Ownership is decided by rendezvous (highest random weight) hashing: the
// owner of shard s of stream x is the member node with the highest
// xxhash("x/s" + nodeID). Membership decides ownership; liveness (Node.Live)
// decides availability only, so a node that misses heartbeats keeps its
// shards and publishes to them fail as unavailable until it returns.
//
// Where the shards of a stream live is its [Placement]: for each shard, its
// replica set, owner first: the owner alone for a stream of replication
// factor 1 ([StreamConfig.Replicas]); for factor 3 the three nodes of
// highest weight ([Top]), the owner being the preferred leader of the
// shard's raft group. Every reader goes through Placement's methods, never
// an index into a slice.
//
// The control plane assigns owners with [Assign] (or [Place], which keeps
// the owners already placed; [PlaceReplicas] for replica sets, which it
// never changes once placed: only an operator's move does, one replica at
// a time, [Placement.Move]) when a shard is first placed, keeps them in
// the maps it builds with [Assemble], and pushes the maps; brokers and
// clients obey the pushed map and never recompute their own. [Build] is
// the placement and Assemble over every stream at once.
//
// The package is pure: no I/O, no goroutines, no clocks.
//
// # Usage
//
//	m := shardmap.Build(7, nodes, streams)
//	shard, owner, err := m.Route("orders", key)
//	moves := shardmap.Diff(old, m)
package shardmap
