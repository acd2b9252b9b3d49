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
// replica set, owner first (one node today). Every reader goes through
// Placement's methods, never an index into a slice, so that a shard's
// placement can become a replica set without changing them.
//
// The control plane assigns owners with [Assign] (or [Place], which keeps
// the owners already placed) when a shard is first placed, keeps them in
// the maps it builds with [Assemble], and pushes the maps; brokers and
// clients obey the pushed map and never recompute their own. [Build] is
// Assign and Assemble over every stream at once.
//
// The package is pure: no I/O, no goroutines, no clocks.
//
// # Usage
//
//	m := shardmap.Build(7, nodes, streams)
//	shard, owner, err := m.Route("orders", key)
//	moves := shardmap.Diff(old, m)
package shardmap
