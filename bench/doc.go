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
// # Telemetry overhead
//
// With --local --telemetry the bench runs only a comparison (issue 7: p50
// with tracing and metrics on within 5% of off): it starts two local
// clusters, one whose brokers record no spans and no metrics and one whose
// brokers sample every span and drop it in-process
// (OTEL_TRACES_EXPORTER=discard) and record metrics, and runs direct and
// forwarded in closed loop on both at once, each record sent to one and
// then the other, which goes first alternating from record to record. The
// "on" side's client traces every publish with an SDK tracer provider
// whose exporter drops the spans, and records its metrics. The report
// gives each side's p50 and p99 (median over the trials) and the ratio of
// the p50s, overall and per trial.
//
// # Usage
//
//	felixctl bench --local --json --plot latency.svg
//	felixctl bench --scenarios direct,forwarded          # the cluster of ./felix-cluster.json, like every felixctl command
//	felixctl bench --cluster other.json
//	felixctl bench --broker 10.0.0.5:7100 --ca ca.crt --cert me.crt --cert-key me.key --dir /var/lib/felix
//	felixctl bench --local --telemetry --count 5000
//
// Against an existing cluster, --dir should be a directory on the brokers'
// data disk (the fsync floor is measured there), the bench should run on a
// broker's host (the echo floor is a round trip on this host), and broker
// CPU and RSS are not reported (the broker processes are not ours to see).
package bench
