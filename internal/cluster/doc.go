// Package cluster is the local cluster harness used by tests, `felix dev`,
// the demo and the bench: the control plane runs in-process, the brokers
// run as real `felix broker` processes on loopback with free ports, dev
// certificates are generated, and everything lives in one directory.
//
// What it exercises: real broker processes (so real QUIC between separate
// processes, real fsync, real kill -9), the real control plane code and
// its pushed maps. What it does not: a control plane in its own process or
// on another host, network partitions or packet loss, and more than one
// machine's disks.
//
// Every process it starts dies with the process that started it (Linux
// parent-death signal) and with Close, so a failing test leaves nothing
// running.
package cluster
