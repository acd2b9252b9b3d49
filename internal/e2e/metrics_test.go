package e2e

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/clustertest"
	"github.com/felix-broker/felix/internal/stats"
	"github.com/felix-broker/felix/shardmap"
)

// TestBrokerMetricsScraped publishes directly and through a forward to
// real broker processes, subscribes, then scrapes each broker's /metrics
// from the admin address it registered in the map, and checks the series
// an operator relies on, and the health endpoints.
func TestBrokerMetricsScraped(t *testing.T) {
	ctx := testCtx(t)
	c := clustertest.Start(t, 2)
	admin := clustertest.Connect(t, c, "broker-0")
	m := createStream(t, ctx, admin, shardmap.StreamConfig{Name: "orders", Shards: 1})
	owner, other := ownerAndOther(t, c, m, "orders")

	const each = 50
	for _, via := range []string{owner, other} {
		cl := clustertest.Connect(t, c, via)
		for i := range each {
			if _, err := cl.Publish(ctx, "orders", nil, []byte(fmt.Sprint(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	// One error answer: a stream that does not exist.
	if _, err := clustertest.Connect(t, c, other).Publish(ctx, "nope", nil, []byte("x")); err == nil {
		t.Fatal("publish to a missing stream succeeded")
	}
	sub, err := clustertest.Connect(t, c, owner).Subscribe(ctx, "orders", client.Earliest())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	n := 0
	for _, err := range sub.Records(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		if n++; n == 2*each {
			break
		}
	}

	hc := &http.Client{Timeout: 5 * time.Second}
	for _, id := range []string{owner, other} {
		addr := c.AdminAddr(id)
		if addr == "" {
			t.Fatalf("%s registered no admin address", id)
		}
		for _, path := range []string{"/healthz", "/readyz"} {
			resp, err := hc.Get("http://" + addr + path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s %s: %s %s", id, path, resp.Status, body)
			}
		}
	}

	scrape := func(id string) stats.Families {
		t.Helper()
		f, err := stats.Fetch(ctx, hc, c.AdminAddr(id))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	// The subscriber's position is published after each frame, and
	// brokers record latencies and batches a moment after they answer
	// (off the publish path): wait until the owner's lag gauge has caught
	// up with what was delivered and both have recorded every publish.
	var of, ff stats.Families
	deadline := time.Now().Add(10 * time.Second)
	for {
		of, ff = scrape(owner), scrape(other)
		lag, ok := of.Sum(stats.MetricSubscriberLag, "stream", "orders", "shard", "0")
		local, _ := of.Sum(stats.MetricPublishDuration, "path", "local")
		fwd, _ := ff.Sum(stats.MetricPublishDuration, "path", "forwarded")
		if ok && lag == 0 && local == each && fwd == each || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}

	var names []string
	for name := range of {
		if strings.HasPrefix(name, "felix_") {
			names = append(names, name+" ("+of[name].GetType().String()+")")
		}
	}
	sort.Strings(names)
	t.Logf("felix series on the owner:\n  %s", strings.Join(names, "\n  "))

	type check struct {
		f     stats.Families
		name  string
		match []string
		test  func(float64) bool
		want  string
	}
	atLeast := func(n float64) func(float64) bool { return func(v float64) bool { return v >= n } }
	equal := func(n float64) func(float64) bool { return func(v float64) bool { return v == n } }
	for _, c := range []check{
		{of, stats.MetricBuildInfo, nil, equal(1), "1"},
		{of, stats.MetricPublishDuration, []string{"path", "local"}, equal(each), "count 50"},
		{ff, stats.MetricPublishDuration, []string{"path", "forwarded"}, equal(each), "count 50"},
		{ff, stats.MetricForwardDuration, []string{"peer", owner}, equal(each), "count 50"},
		{ff, stats.MetricForwards, []string{"peer", owner}, equal(each), "50"},
		{of, stats.MetricFsyncDuration, nil, atLeast(1), ">= 1 fsync"},
		{of, stats.MetricRecordsIn, []string{"source", "client"}, equal(each), "50"},
		{of, stats.MetricRecordsIn, []string{"source", "peer"}, equal(each), "50"},
		{ff, stats.MetricRecordsIn, []string{"source", "client"}, equal(each + 1), "51"},
		{of, stats.MetricBytesIn, nil, atLeast(2 * each), ">= 100 bytes"},
		{of, stats.MetricRecordsOut, nil, equal(2 * each), "100"},
		{of, stats.MetricBytesOut, nil, atLeast(2 * each), ">= 100 bytes"},
		{ff, stats.MetricErrors, []string{"code", "unknown_stream"}, equal(1), "1"},
		{of, stats.MetricShardsOwned, nil, equal(1), "1"},
		{ff, stats.MetricShardsOwned, nil, equal(0), "0"},
		{of, stats.MetricMapEpoch, nil, atLeast(1), ">= 1"},
		{of, stats.MetricConnections, []string{"type", "client"}, atLeast(1), ">= 1"},
		{of, stats.MetricConnections, []string{"type", "peer"}, atLeast(1), ">= 1"},
		{of, stats.MetricQUICStreams, []string{"type", "subscribe"}, equal(1), "1"},
		{of, stats.MetricSubscriberLag, []string{"stream", "orders", "shard", "0"}, equal(0), "0"},
		{of, "felix_wal_written_bytes_total", nil, atLeast(2 * each), ">= 100"},
	} {
		v, ok := c.f.Sum(c.name, c.match...)
		if !ok || !c.test(v) {
			t.Errorf("%s%v = %v (present %v), want %s", c.name, c.match, v, ok, c.want)
		}
	}
	fsync := of.Histogram(stats.MetricFsyncDuration)
	if p50 := fsync.Quantile(0.5); !(p50 > 0 && p50 < 1) || fsync.Sum <= 0 {
		t.Errorf("fsync p50 %v s, sum %v s: not a sane fsync time", p50, fsync.Sum)
	}
	batch := of.Histogram(stats.MetricBatchRecords)
	if batch.Sum != 2*each || batch.Count != fsync.Count {
		t.Errorf("records per fsync: %v records in %d batches, want 100 records in the %d fsyncs", batch.Sum, batch.Count, fsync.Count)
	}
	local := of.Histogram(stats.MetricPublishDuration, "path", "local")
	fwd := ff.Histogram(stats.MetricPublishDuration, "path", "forwarded")
	if p := local.Quantile(0.5); !(p > 0 && p < 1) {
		t.Errorf("local publish p50 %v s", p)
	}
	if p := fwd.Quantile(0.5); !(p > 0 && p < 1) {
		t.Errorf("forwarded publish p50 %v s", p)
	}
	t.Logf("p50: local publish %.0fµs, forwarded publish %.0fµs, fsync %.0fµs; %.1f records per fsync",
		local.Quantile(0.5)*1e6, fwd.Quantile(0.5)*1e6, fsync.Quantile(0.5)*1e6, batch.Mean())

	// The summary felixctl prints.
	rows := stats.Summarize(nil, stats.ScrapeAll(ctx, hc, c.Ctl().Map()))
	var sb strings.Builder
	if err := stats.WriteTable(&sb, rows); err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster stats:\n%s", sb.String())
	for _, r := range rows {
		if r.Error != "" || math.IsNaN(r.PublishP50) {
			t.Errorf("stats row %+v", r)
		}
	}
	_ = context.Background
}
