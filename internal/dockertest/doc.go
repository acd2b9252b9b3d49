// Package dockertest runs Felix clusters of containers, one process per
// container on a Docker network of the cluster's own, for the tests that
// need machines to die or be cut off: three `felix ctl` forming an
// embedded etcd cluster, or using an external one of three `felix etcd`
// containers (Options.ExternalEtcd), and three `felix broker`, started in
// one line ([Start]), killed with SIGKILL ([Cluster.Kill]) and started
// again ([Cluster.Restart]), cut off the network ([Cluster.Disconnect],
// [Cluster.Connect]), or stopped and started together
// ([Cluster.RestartControlPlane]).
//
// The image is built from the code under test: a static felix binary on
// an empty base (FROM scratch); nothing is pulled. Every node has a fixed
// address on the network, which is in its certificate and which the test
// process reaches directly, so a test drives the cluster with the Go SDK
// as any client would. Without a Docker engine the tests skip.
//
// It removes only what it created (every container, network and image it
// makes carries the label felix.dockertest), and never touches a
// container's data from outside: what a test checks, it checks through
// Felix's own protocols, the containers' logs, and etcd's client API
// ([Cluster.Etcd]) for what the control plane stored and the history of
// its writes.
//
// The tests of this package are the multi-host scenarios of issue 15,
// each run with the embedded and with the external etcd (subtests
// /embedded and /external), and the Jepsen-style ones of replicated
// streams (issue 16): TestReplicatedNemesis (publishers and subscribers
// through every broker while a nemesis kills -9 shard leaders, pauses a
// broker and cuts one off the network, the history checked with
// porcupine through internal/history; over 8 shards, so that each broker
// has enough busy replicas to park fdatasyncs, which it checks through
// felix_wal_fsyncs_parked_total), TestReplicatedDataLoss (a
// broker's data directory lost) and TestReplicatedBitFlip (one bit
// flipped in each of a broker's replicas while it is down):
//
//	go test ./internal/dockertest/                          # all: kills, partition, restart, nemesis (a few minutes)
//	go test ./internal/dockertest/ -run 'CtlLeaderKill/external' -args -felix.docker.kills=10   # failover figures
//	go test ./internal/dockertest/ -run TestReplicatedNemesis -timeout 1h -args -felix.docker.cycles=50   # a long nemesis run
//	go test ./internal/dockertest/ -run TestReplicatedNemesis -timeout 1h -args -felix.docker.cycles=20 -felix.docker.faults=kill   # R=3 failover figures
//	go test ./internal/dockertest/ -run TestReplicatedNemesis -timeout 1h -args -felix.docker.cycles=20 -felix.docker.faults=kill,pause,partition,bitflip   # with bit flips
package dockertest
