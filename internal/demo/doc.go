// Package demo is the story of seed/cross-broker-publishing.txt told
// against a real local cluster: the ownership the cluster settled on, a
// publish forwarded by a broker that does not own the shard, one written
// locally by the owner, what a subscriber attached to the owner received,
// six records sent one at a time arriving in order, and twenty-four sent
// twelve at a time arriving all, in commit order.
//
// `felixctl demo` (and `task cluster:demo`) prints it in one pane; the
// three-pane tmux variant lives in cmd/felixctl and reuses Published and
// Received so that both speak the seed's words.
//
// The package writes to an io.Writer and returns what it observed
// (Result), so a test can assert the story line by line. It owns the
// cluster it starts with Run and tears it down before returning, also when
// ctx is cancelled (Ctrl-C). It must never print anything the cluster did
// not do: every line comes from an ack or a delivered record.
package demo
