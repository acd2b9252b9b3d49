// Package bench is the latency and throughput harness behind
// `felixctl bench`.
//
// It owns: driving a Felix cluster with the Go SDK in the scenarios the
// performance targets name (direct, forwarded, e2e, throughput, fanout),
// closed loop (one record in flight), open loop at a fixed rate, and open
// loop at fractions of the throughput measured in the same run (latency
// under load); measuring the machine's floors in the same run
// (write+fdatasync of one record on the brokers' disk, appended and over
// zeros written beforehand, and a QUIC round trip to an echo process); and
// reporting every latency next to those floors, as a table, as JSON and
// as a percentile plot. The targets' fsync floor is write+fdatasync over
// preallocated zeros, what a shard log and a replica pay (package wal,
// internal/tidseg), and the plain append only when that was not measured:
// the append also writes the inode and costs more, and a floor Felix
// beats is no floor. It never changes a cluster beyond the bench streams
// it creates (and deletes again), and it never reaches into a broker:
// what it reports is what a client sees, what /proc says of the broker
// processes it started, and what the brokers' /metrics say of their WAL
// batches.
//
// # Method
//
// Latencies go into HDR histograms (microseconds, three significant
// digits). Each scenario runs several trials after a warm-up that is not
// recorded; the reported percentiles are the median over the trials, the
// max is the largest seen, and the spread of p50 and p99 over the trials is
// reported with them. The floors are sampled half before the scenarios
// and half after, and their percentiles are taken the same way: the
// median over batches of 250 samples in the order taken (8 batches with
// the default --floor-count), so that one bad stretch raises one batch's
// p99 and not the bound a target derives from it. Closed loop measures
// service time: a record is sent when the previous one is acked.
//
// Open loop sends at a fixed rate whatever the acks do. One generator
// goroutine sleeps on a timer until each record is due (pacer); it never
// spins, because on a 2-core machine a busy-waiting generator takes the
// CPU the brokers need. Each latency runs from the record's intended send
// time, so a stall delays every record scheduled during it and shows in
// the percentiles (coordinated-omission correction), with one exception:
// when the generator's own timer overshoots (timers are coarse here: a
// 200 µs sleep can take a millisecond), the records it then finds due are
// charged from its wake-up, and the overshoot is reported as the
// generator's lag beside the row. Whatever the system makes a send wait
// for after that (a full window, a blocked write, the sends before it in
// the same burst) is charged, and reported as the send wait. Under load
// the generator's lag is not only its timer's coarseness: it also waits
// for CPUs the brokers hold, and a stall that delays its wake-up would be
// excused with it. So each open-loop row also gives its percentiles from
// the intended send time with nothing excused (from_intended_p50_us to
// from_intended_p999_us, median over the trials), beside the row's own;
// the targets keep the row's. Each ack is timestamped as its publisher's
// ack reader reads it.
// On a local cluster (the brokers share the bench's clock) each row is
// also split at the stamp the owner put on the record's batch before its
// write and fsync, which the ack carries: the way in (due -> stamp) and
// the write, fsync and way back (stamp -> ack).
//
// With --replicas 1,3 (the default) every scenario runs on streams of
// replication factor 1, and then, on streams of factor 3 (rows marked
// R=3), direct and forwarded again in closed loop and throughput over the
// first --shards with its load rows.
//
// Latency under load (the load rows, --load) is open loop over the
// throughput scenario's publishers and stream at fractions (10%, 50%, 80%
// by default) of the acked records/s that scenario measured just before,
// record i through publisher i mod publishers: the way OpenMessaging
// Benchmark users read a system, at loads it sustains rather than at
// saturation, where closed-loop pipelined latency is only queueing.
//
// records_per_fsync is derived from the acks: the owner's log stamps every
// record of one commit (one write and one fdatasync) with the same commit
// timestamp, so acks of one shard that share a timestamp were made durable
// by one fsync. It counts only the bench's records: on a cluster that
// carries other traffic it is a lower bound. The throughput rows add
// wal_records_per_fsync, the brokers' own count (felix_wal_batch_records
// between two scrapes of /metrics around the measured part), which also
// sees one fsync shared by several shards, and wal_fsync_mean_us, the
// mean duration of the brokers' writes and fdatasyncs (shard logs and
// replicas) over the same part (felix_wal_fsync_duration_seconds): under
// load an fsync takes several
// times the idle floor (the disk serves one flush at a time, and each
// fdatasync needs CPU that the row keeps busy). They also give the CPU per
// acked record: the brokers' CPU time (user and system, /proc) over the
// measured part divided by the records acked in it, and the machine's busy
// time divided the same way (the bench's publishers included). When the
// CPUs are what bound throughput, that, not records/s, is what a change to
// the path moves; it still moves with batching (fewer records per fsync
// cost more each), so compare it within one run (A/B). The throughput and
// load rows give the largest broker's RSS at the end and its peak RSS
// while the row was measured: VmHWM, which the kernel keeps over a
// process's life, is reset at the start of each measured window
// (/proc/PID/clear_refs), so a row never carries an earlier row's peak;
// where the reset fails, the report says the peak is the lifetime's.
//
// # Shards sweep
//
// With several --shards (--shards 6,96,768) the throughput scenario runs
// over a stream of each count in turn (the load rows over the first), each
// stream deleted before the next is created, and the report adds a sweep:
// records/s and its ratio to the fewest shards, records per fsync, the
// largest broker's RSS, and the memory per shard, the brokers' summed RSS
// growth divided by the shard count, read once the stream exists (idle
// shards: no log open yet) and again after one record to each shard (open
// logs). RSS moves by pages and with the Go heap: with few shards the
// per-shard figure is rough.
//
// # A/B
//
// With --local --ab FELIX (or --ab-rev REV, which builds cmd/felix at a git
// revision from a git archive export into a temporary directory) the bench
// runs only a comparison of two builds: cluster A's brokers run this
// executable, cluster B's run FELIX, both under this build's in-process
// control plane. Direct and forwarded run closed loop on both at once,
// each record sent to one cluster and then the other, which goes first
// alternating from record to record; throughput runs in alternating
// trials (A B, B A, …), never both clusters loaded at once. The report
// gives each side's p50 and p99 (and records/s) and every figure as the
// ratio B/A, overall and per trial, with the spread of the per-trial
// ratios, and, for throughput, each side's brokers' CPU per acked record:
// a change's effect as a ratio measured in one run.
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
//	felixctl bench --local --scenarios throughput --shards 6,96,768 --load ''
//	felixctl bench --local --ab /tmp/before/felix          # A: this build, B: the other; ratios B/A
//	felixctl bench --local --ab-rev HEAD~1 --scenarios direct,forwarded
//
// Against an existing cluster, --dir should be a directory on the brokers'
// data disk (the fsync floor is measured there), the bench should run on a
// broker's host (the echo floor is a round trip on this host), and broker
// CPU and RSS are not reported (the broker processes are not ours to see).
package bench
