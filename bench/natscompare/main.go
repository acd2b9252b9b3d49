// Command natscompare measures Felix and NATS JetStream side by side at
// light load, the way issue 13 compared them: one open-loop generator that
// only sleeps publishes at a fixed rate through the shard's owner (Felix)
// or the stream's leader (NATS), or with -through other through another
// broker or server, which forwards, and every latency is measured alike.
//
// It is a module of its own so that Felix's module does not depend on the
// NATS client. It starts each system itself, one at a time, and alternates
// them trial by trial (Felix first in odd pairs, NATS first in even ones):
//
//	go build -o /tmp/felix ./cmd/felix
//	GOBIN=/tmp go install github.com/nats-io/nats-server/v2@v2.15.3
//	cd bench/natscompare && go run . -felix /tmp/felix -nats-server /tmp/nats-server -rate 1000 -pairs 4
//
// Felix: `felix dev` (a control plane and three broker processes, each at
// GOMAXPROCS 1 on a 2-CPU machine, as any local cluster whose brokers
// outnumber the CPUs). NATS: three nats-server processes in one cluster,
// JetStream with file storage and `sync_interval: always` (an fsync per
// message, as Felix's ack means), each at GOMAXPROCS 1 too. The stream has
// one shard (one subject) and the replication factor -replicas (1 or 3).
//
// Method: the generator sleeps until each record is due and publishes it
// asynchronously at its wake-up; one collector goroutine waits for the
// acks in publish order and takes each latency from the record's start to
// the moment it sees the ack: its wake-up when the generator slept for it
// (the timer's overshoot is not charged to the system under test, and is
// printed as gen-lag), its due time when the generator was behind because
// a publish blocked (a full window, a stalled connection: that wait is
// the system's, as in coordinated-omission-free open loops). Both clients
// thus pay the same hand-off to the collector. Failed publishes are
// counted and printed, not in the percentiles. The first -warm of each
// trial is not measured.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

var (
	felixBin = flag.String("felix", "", "the felix binary (go build ./cmd/felix)")
	natsBin  = flag.String("nats-server", "", "the nats-server binary")
	rate     = flag.Int("rate", 1000, "records per second")
	dur      = flag.Duration("dur", 10*time.Second, "measured length of a trial")
	warm     = flag.Duration("warm", 2*time.Second, "unmeasured start of a trial")
	size     = flag.Int("size", 128, "payload bytes")
	replicas = flag.Int("replicas", 1, "replication factor of the stream: 1 or 3")
	pairs    = flag.Int("pairs", 3, "trials of each system, alternated")
	through  = flag.String("through", "leader", "publish through the shard's leader (leader), or through another broker or server (other), which forwards")
	dir      = flag.String("dir", "", "working directory (default: a temporary one)")
)

// publish sends one record and returns a function that waits for its ack.
type publish func(value []byte) (wait func() error, err error)

// result is one trial's percentiles, in microseconds.
type result struct {
	system                  string
	p50, p90, p99, p999     int64
	lagP50, lagP99          int64
	measured, failed, total int
}

func main() {
	flag.Parse()
	if *felixBin == "" || *natsBin == "" {
		log.Fatal("natscompare: -felix and -nats-server are both needed")
	}
	work := *dir
	if work == "" {
		d, err := os.MkdirTemp("", "natscompare-")
		if err != nil {
			log.Fatal(err)
		}
		defer os.RemoveAll(d)
		work = d
	}
	var felixRes, natsRes []result
	for i := range *pairs {
		order := []string{"felix", "nats"}
		if i%2 == 1 {
			order = []string{"nats", "felix"}
		}
		for _, sys := range order {
			run := runFelix
			if sys == "nats" {
				run = runNATS
			}
			r, err := run(filepath.Join(work, fmt.Sprintf("%s-%d", sys, i)))
			if err != nil {
				log.Fatalf("natscompare: %s, trial %d: %v", sys, i+1, err)
			}
			fmt.Printf("%-5s rate=%d/s R=%d via %s  p50 %5d  p90 %5d  p99 %6d  p99.9 %6d µs  gen-lag p50 %d p99 %d µs  (%d measured, %d failed)\n",
				r.system, *rate, *replicas, *through, r.p50, r.p90, r.p99, r.p999, r.lagP50, r.lagP99, r.measured, r.failed)
			if sys == "felix" {
				felixRes = append(felixRes, r)
			} else {
				natsRes = append(natsRes, r)
			}
		}
	}
	for _, rs := range [][]result{felixRes, natsRes} {
		med := func(f func(result) int64) int64 {
			v := make([]int64, len(rs))
			for i, r := range rs {
				v[i] = f(r)
			}
			slices.Sort(v)
			return v[len(v)/2]
		}
		failed := 0
		for _, r := range rs {
			failed += r.failed
		}
		fmt.Printf("median of %d: %-5s p50 %5d  p99 %6d  p99.9 %6d µs  (%d failed in all, not in the percentiles)\n", len(rs), rs[0].system,
			med(func(r result) int64 { return r.p50 }), med(func(r result) int64 { return r.p99 }), med(func(r result) int64 { return r.p999 }), failed)
	}
}

// runFelix starts `felix dev` in d, publishes to the leader of shard 0 of
// a one-shard stream (or through another broker, which forwards, with
// -through other), and stops the cluster.
func runFelix(d string) (result, error) {
	ctx := context.Background()
	connFile := filepath.Join(d, "felix-cluster.json")
	stop, err := start(d, "felix", *felixBin, nil, "dev", "--dir", filepath.Join(d, "felix-dev"),
		"--conn-file", connFile, "--ctl-port", "0", "--base-port", "0")
	if err != nil {
		return result{}, err
	}
	defer stop()
	var cf *client.ClusterFile
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if cf, err = client.LoadClusterFile(connFile); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return result{}, fmt.Errorf("no %s after a minute: %w", connFile, err)
		}
	}
	opts := []client.Opt{client.WithCAFile(cf.CAFile), client.WithClientCertFile(cf.CertFile, cf.KeyFile)}
	c, err := client.Connect(ctx, cf.Brokers[0].Addr, opts...)
	if err != nil {
		return result{}, err
	}
	stream := "orders" // `felix dev` creates it, one shard, replication factor 1
	if *replicas > 1 {
		stream = fmt.Sprintf("orders-r%d", *replicas)
		if err := c.CreateStream(ctx, client.StreamConfig{Name: stream, Shards: 1, Replicas: *replicas}); err != nil {
			c.Close()
			return result{}, err
		}
		// Leadership moves to the shard's preferred leader once it is
		// caught up: let that happen before the leader is looked up.
		time.Sleep(6 * time.Second)
	}
	var ack client.Ack
	for try := 0; ; try++ {
		if ack, err = c.Publish(ctx, stream, nil, []byte("probe"), client.WithShard(0)); err == nil || try == 40 {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	c.Close()
	if err != nil {
		return result{}, fmt.Errorf("probe record: %w", err)
	}
	b, ok := cf.Broker(ack.Owner)
	if !ok {
		return result{}, fmt.Errorf("the probe's ack names %q, not in %s", ack.Owner, connFile)
	}
	if *through == "other" {
		for _, o := range cf.Brokers {
			if o.ID != ack.Owner {
				b = o
				break
			}
		}
	}
	if c, err = client.Connect(ctx, b.Addr, opts...); err != nil {
		return result{}, err
	}
	defer c.Close()
	pub, err := c.Publisher(ctx, stream)
	if err != nil {
		return result{}, err
	}
	defer pub.Close()
	r := generate(func(v []byte) (func() error, error) {
		f, err := pub.PublishAsync(ctx, nil, v, client.WithShard(0))
		if err != nil {
			return nil, err
		}
		return func() error { _, err := f.Wait(ctx); return err }, nil
	})
	r.system = "felix"
	return r, nil
}

// runNATS starts three nats-server processes in d, publishes to the
// leader of a one-subject stream (or through another server, with
// -through other), and stops them.
func runNATS(d string) (result, error) {
	ctx := context.Background()
	const n = 3
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", 16222+i))
	}
	urls := map[string]string{}
	for i := range n {
		name := fmt.Sprintf("n%d", i+1)
		urls[name] = fmt.Sprintf("nats://127.0.0.1:%d", 14222+i)
		conf := fmt.Sprintf("server_name: %s\nlisten: 127.0.0.1:%d\njetstream { store_dir: %q, sync_interval: always }\n"+
			"cluster { name: compare, listen: 127.0.0.1:%d, routes: [%s] }\n",
			name, 14222+i, filepath.Join(d, name), 16222+i, strings.Join(routes, ", "))
		path := filepath.Join(d, name+".conf")
		if err := os.MkdirAll(d, 0o755); err != nil {
			return result{}, err
		}
		if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
			return result{}, err
		}
		stop, err := start(d, name, *natsBin, []string{"GOMAXPROCS=1"}, "-c", path)
		if err != nil {
			return result{}, err
		}
		defer stop()
	}
	nc, err := nats.Connect(urls["n1"], nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1))
	if err != nil {
		return result{}, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return result{}, err
	}
	cfg := jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders"}, Storage: jetstream.FileStorage, Replicas: *replicas}
	var leader string
	for deadline := time.Now().Add(time.Minute); leader == ""; time.Sleep(250 * time.Millisecond) {
		if time.Now().After(deadline) {
			nc.Close()
			return result{}, errors.New("no stream leader after a minute")
		}
		st, err := js.CreateOrUpdateStream(ctx, cfg)
		if err != nil {
			continue // JetStream not ready yet
		}
		if info, err := st.Info(ctx); err == nil && info.Cluster != nil {
			leader = info.Cluster.Leader
		}
	}
	nc.Close()
	url := urls[leader]
	if *through == "other" {
		for name, u := range urls {
			if name != leader {
				url = u
				break
			}
		}
	}
	if nc, err = nats.Connect(url); err != nil {
		return result{}, err
	}
	defer nc.Close()
	if js, err = jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096)); err != nil {
		return result{}, err
	}
	r := generate(func(v []byte) (func() error, error) {
		f, err := js.PublishAsync("orders", v)
		if err != nil {
			return nil, err
		}
		return func() error {
			select {
			case <-f.Ok():
				return nil
			case err := <-f.Err():
				return err
			}
		}, nil
	})
	r.system = "nats"
	return r, nil
}

// generate runs one open-loop trial through pub.
func generate(pub publish) result {
	value := make([]byte, *size)
	total := int((*warm + *dur).Seconds() * float64(*rate))
	skip := int(warm.Seconds() * float64(*rate))
	type sent struct {
		at   time.Time
		wait func() error
	}
	queue := make(chan sent, total)
	lat := make([]time.Duration, 0, total)
	failed := 0
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		i := 0
		for s := range queue {
			err := s.wait()
			if i >= skip {
				if err != nil {
					failed++
				} else {
					lat = append(lat, time.Since(s.at))
				}
			}
			i++
		}
	}()
	lag := make([]time.Duration, 0, total)
	every := time.Second / time.Duration(*rate)
	t0 := time.Now()
	for i := range total {
		// Latency runs from the record's due time, less the timer's own
		// overshoot when the generator slept (a wake-up late is the
		// generator's, reported as its lag); when it did not sleep, it
		// was behind because a publish blocked (a full window, a stalled
		// connection), which is the system's to pay.
		due := t0.Add(time.Duration(i) * every)
		start := due
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
			start = time.Now()
			if i >= skip {
				lag = append(lag, start.Sub(due))
			}
		} else if i >= skip {
			lag = append(lag, 0)
		}
		wait, err := pub(value)
		if err != nil {
			wait = func() error { return err }
		}
		queue <- sent{start, wait}
	}
	close(queue)
	<-collected
	slices.Sort(lat)
	slices.Sort(lag)
	q := func(s []time.Duration, p float64) int64 {
		if len(s) == 0 {
			return -1
		}
		return s[int(p*float64(len(s)-1))].Microseconds()
	}
	return result{p50: q(lat, .5), p90: q(lat, .9), p99: q(lat, .99), p999: q(lat, .999),
		lagP50: q(lag, .5), lagP99: q(lag, .99), measured: len(lat), failed: failed, total: total}
}

// start runs bin with args in its own process group, its output in
// d/name.log, and returns a function that stops it (SIGTERM, then SIGKILL
// after 10 s) and waits for it.
func start(d, name, bin string, env []string, args ...string) (stop func(), err error) {
	if err := os.MkdirAll(d, 0o755); err != nil {
		return nil, err
	}
	out, err := os.Create(filepath.Join(d, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	return func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		out.Close()
	}, nil
}
