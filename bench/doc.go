// Package bench is the latency and throughput harness behind
// `felixctl bench`.
//
// It owns: driving a Felix cluster with the Go SDK in the scenarios the
// performance targets name (direct, forwarded, e2e, throughput, fanout),
// closed loop (one record in flight) and open loop at a fixed rate;
// measuring the machine's floors in the same run (write+fdatasync of one
// record on the brokers' disk, and a QUIC round trip to an echo process);
// and reporting every latency next to those floors, as a table, as JSON
// and as a percentile plot. It never changes a cluster beyond the bench
// streams it creates (and deletes again), and it never reaches into a
// broker: what it reports is what a client sees, plus what /proc says of
// the broker processes it started.
//
// # Method
//
// Latencies go into HDR histograms (microseconds, three significant
// digits). Each scenario runs several trials after a warm-up that is not
// recorded; the reported percentiles are the median over the trials, the
// max is the largest seen, and the spread of p50 and p99 over the trials is
// reported with them. Closed loop measures service time: a record is sent
// when the previous one is acked. Open loop sends at a fixed rate whatever
// the acks do and measures each latency from the record's intended send
// time, so a stall delays every record scheduled during it and shows in the
// percentiles (coordinated-omission correction); the generator's own lag
// (actual minus intended send time, which on a machine with coarse timers
// is part of what open loop reports) is reported beside it.
//
// records_per_fsync is derived from the acks: the owner's log stamps every
// record of one commit (one write and one fdatasync) with the same commit
// timestamp, so acks of one shard that share a timestamp were made durable
// by one fsync. It counts only the bench's records: on a cluster that
// carries other traffic it is a lower bound.
//
// # Usage
//
//	felixctl bench --local --json --plot latency.svg
//	felixctl bench --cluster felix-cluster.json --scenarios direct,forwarded
//	felixctl bench --broker 10.0.0.5:7100 --ca ca.crt --dir /var/lib/felix
//
// Against an existing cluster, --dir should be a directory on the brokers'
// data disk (the fsync floor is measured there), the bench should run on a
// broker's host (the echo floor is a round trip on this host), and broker
// CPU and RSS are not reported (the broker processes are not ours to see).
package bench
