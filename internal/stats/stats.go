// Package stats reads the metrics of every broker of a cluster and
// summarizes them as a top-like table (or JSON): `felixctl cluster stats`.
//
// It finds the brokers' admin addresses (shardmap.Node.Admin) in the shard
// map, scrapes each one's /metrics over HTTP, and computes rates and
// latency quantiles between two scrapes. It owns no goroutine beyond one
// Scrape call and knows nothing of QUIC or the CLI.
package stats

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/felix-broker/felix/shardmap"
)

// Metric names as the brokers expose them.
const (
	MetricPublishDuration = "felix_publish_duration_seconds"
	MetricForwardDuration = "felix_forward_duration_seconds"
	MetricFsyncDuration   = "felix_wal_fsync_duration_seconds"
	MetricBatchRecords    = "felix_wal_batch_records"
	MetricRecordsIn       = "felix_records_in_total"
	MetricBytesIn         = "felix_payload_in_bytes_total"
	MetricRecordsOut      = "felix_records_out_total"
	MetricBytesOut        = "felix_payload_out_bytes_total"
	MetricForwards        = "felix_forwards_total"
	MetricErrors          = "felix_errors_total"
	MetricConnections     = "felix_connections"
	MetricQUICStreams     = "felix_quic_streams" // open QUIC streams, by type
	MetricQUICStreamsOld  = "felix_streams"      // its name before it was renamed
	MetricQUICSent        = "felix_quic_packets_sent_total"
	MetricQUICLost        = "felix_quic_packets_lost_total"
	MetricDiskFree        = "felix_disk_free_bytes" // the data directory's filesystem, at the broker's last check
	MetricShardsOwned     = "felix_shards_owned"
	MetricMapEpoch        = "felix_map_epoch"
	MetricSubscriberLag   = "felix_subscriber_lag_records"
	MetricBuildInfo       = "felix_build_info"
)

// Families is one scrape, by metric name.
type Families map[string]*dto.MetricFamily

// Parse reads metrics in the Prometheus text format.
func Parse(r io.Reader) (Families, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	f, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("stats: parsing metrics: %w", err)
	}
	return Families(f), nil
}

// Sum adds the values of every series of a counter or gauge whose labels
// include match (name=value pairs); for a histogram it adds the sample
// counts. ok is false if the metric is absent.
func (f Families) Sum(name string, match ...string) (v float64, ok bool) {
	mf := f[name]
	if mf == nil {
		return 0, false
	}
	for _, m := range mf.GetMetric() {
		if !labelsMatch(m, match) {
			continue
		}
		switch {
		case m.Counter != nil:
			v += m.Counter.GetValue()
		case m.Gauge != nil:
			v += m.Gauge.GetValue()
		case m.Untyped != nil:
			v += m.Untyped.GetValue()
		case m.Histogram != nil:
			v += float64(m.Histogram.GetSampleCount())
		}
	}
	return v, true
}

// Max returns the largest value of a gauge's series.
func (f Families) Max(name string) float64 {
	mf := f[name]
	out := 0.0
	for _, m := range mf.GetMetric() {
		if m.Gauge != nil {
			out = math.Max(out, m.Gauge.GetValue())
		}
	}
	return out
}

// Histogram is a cumulative histogram merged over matching series.
type Histogram struct {
	Count   uint64
	Sum     float64
	Bounds  []float64 // upper bounds, ascending; the last bucket is +Inf
	Buckets []uint64  // cumulative counts per bound
}

// Histogram merges the series of a histogram whose labels include match.
func (f Families) Histogram(name string, match ...string) Histogram {
	var h Histogram
	mf := f[name]
	for _, m := range mf.GetMetric() {
		hm := m.GetHistogram()
		if hm == nil || !labelsMatch(m, match) {
			continue
		}
		h.Count += hm.GetSampleCount()
		h.Sum += hm.GetSampleSum()
		if h.Bounds == nil {
			for _, b := range hm.GetBucket() {
				h.Bounds = append(h.Bounds, b.GetUpperBound())
			}
			h.Buckets = make([]uint64, len(h.Bounds))
		}
		for i, b := range hm.GetBucket() {
			if i < len(h.Buckets) {
				h.Buckets[i] += b.GetCumulativeCount()
			}
		}
	}
	return h
}

// Sub returns h minus an earlier scrape of the same histogram: the
// observations between the two.
func (h Histogram) Sub(prev Histogram) Histogram {
	out := Histogram{Count: h.Count - min(prev.Count, h.Count), Sum: h.Sum - prev.Sum, Bounds: h.Bounds}
	out.Buckets = make([]uint64, len(h.Buckets))
	for i := range h.Buckets {
		var p uint64
		if i < len(prev.Buckets) {
			p = prev.Buckets[i]
		}
		out.Buckets[i] = h.Buckets[i] - min(p, h.Buckets[i])
	}
	return out
}

// Quantile estimates the q-quantile (0 < q < 1) by linear interpolation
// within the bucket holding it, as Prometheus' histogram_quantile does.
// It returns NaN for an empty histogram.
func (h Histogram) Quantile(q float64) float64 {
	if h.Count == 0 {
		return math.NaN()
	}
	rank := q * float64(h.Count)
	lower, below := 0.0, uint64(0)
	for i, c := range h.Buckets {
		if float64(c) >= rank {
			upper := h.Bounds[i]
			if math.IsInf(upper, 1) {
				return lower
			}
			in := c - below
			if in == 0 {
				return upper
			}
			return lower + (upper-lower)*(rank-float64(below))/float64(in)
		}
		lower, below = h.Bounds[i], c
	}
	return lower // observations above the last finite bound
}

// Mean is Sum/Count, NaN when empty.
func (h Histogram) Mean() float64 {
	if h.Count == 0 {
		return math.NaN()
	}
	return h.Sum / float64(h.Count)
}

func labelsMatch(m *dto.Metric, match []string) bool {
	for i := 0; i+1 < len(match); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == match[i] && l.GetValue() == match[i+1] {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// Scrape is one broker's metrics at one moment.
type Scrape struct {
	Node  string
	Admin string
	Live  bool
	At    time.Time
	Err   error    // the scrape failed (or the node has no admin address)
	Fams  Families // nil if Err
}

// ScrapeAll fetches /metrics from the admin address of every node of m,
// concurrently, each bounded by ctx. hc nil means a client with a 5s
// timeout.
func ScrapeAll(ctx context.Context, hc *http.Client, m *shardmap.Map) []Scrape {
	if hc == nil {
		hc = &http.Client{Timeout: 5 * time.Second}
	}
	out := make([]Scrape, len(m.Nodes))
	var wg sync.WaitGroup
	for i, n := range m.Nodes {
		out[i] = Scrape{Node: n.ID, Admin: n.Admin, Live: n.Live}
		if n.Admin == "" {
			out[i].Err = fmt.Errorf("stats: %s registered no admin address (start it with --admin)", n.ID)
			continue
		}
		wg.Add(1)
		go func(s *Scrape) {
			defer wg.Done()
			s.Fams, s.Err = Fetch(ctx, hc, s.Admin)
			s.At = time.Now()
		}(&out[i])
	}
	wg.Wait()
	return out
}

// Fetch scrapes http://admin/metrics.
func Fetch(ctx context.Context, hc *http.Client, admin string) (Families, error) {
	url := admin
	if !strings.Contains(url, "://") {
		url = "http://" + url
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("stats: scraping %s: %w", admin, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("stats: scraping %s: %s", admin, resp.Status)
	}
	return Parse(resp.Body)
}

// Row summarizes one broker: gauges at the later scrape, rates and
// latency quantiles over the interval between the two scrapes (or since
// the broker started, with a single scrape). Latencies are in seconds;
// NaN (null in JSON) when nothing was observed.
type Row struct {
	Node          string  `json:"node"`
	Admin         string  `json:"admin"`
	Live          bool    `json:"live"`
	Error         string  `json:"error,omitempty"`
	Epoch         uint64  `json:"epoch"`
	ShardsOwned   int     `json:"shards_owned"`
	Connections   int     `json:"connections"`
	QUICStreams   int     `json:"quic_streams"` // open QUIC streams (client and peer)
	Streams       int     `json:"streams"`      // Felix streams with a shard owned here (from the map)
	Interval      float64 `json:"interval_seconds"`
	InPerSec      float64 `json:"records_in_per_second"`
	InBytesPerSec float64 `json:"bytes_in_per_second"`
	OutPerSec     float64 `json:"records_out_per_second"`
	FwdPerSec     float64 `json:"forwards_per_second"`
	ErrPerSec     float64 `json:"errors_per_second"`
	PublishP50    float64 `json:"publish_p50_seconds"`
	PublishP99    float64 `json:"publish_p99_seconds"`
	FsyncP50      float64 `json:"fsync_p50_seconds"`
	PerFsync      float64 `json:"records_per_fsync"`
	MaxLag        float64 `json:"subscriber_lag_max_records"`
	// QUIC packets the broker sent per second, and those quic-go declared
	// lost: on loopback or a LAN, receivers (clients, peers) that stopped
	// reading for a while. Zero from a broker too old to count them.
	QUICSentPerSec float64 `json:"quic_packets_sent_per_second"`
	QUICLostPerSec float64 `json:"quic_packets_lost_per_second"`
	// DiskFree is the free space of the broker's data directory's
	// filesystem (under its --min-free-bytes it refuses new records); NaN
	// (null in JSON) from a broker too old to report it.
	DiskFree float64 `json:"disk_free_bytes"`
}

// Summarize turns scrapes into rows. prev, if not nil, is an earlier
// ScrapeAll of the same cluster; rates are then over the interval between
// them, else since each broker started (Interval 0, rates are totals).
func Summarize(prev, cur []Scrape) []Row {
	before := map[string]Scrape{}
	for _, s := range prev {
		before[s.Node] = s
	}
	rows := make([]Row, 0, len(cur))
	for _, s := range cur {
		r := Row{Node: s.Node, Admin: s.Admin, Live: s.Live}
		if s.Err != nil {
			r.Error = s.Err.Error()
			r.PublishP50, r.PublishP99, r.FsyncP50, r.PerFsync, r.DiskFree = math.NaN(), math.NaN(), math.NaN(), math.NaN(), math.NaN()
			rows = append(rows, r)
			continue
		}
		f := s.Fams
		epoch, _ := f.Sum(MetricMapEpoch)
		owned, _ := f.Sum(MetricShardsOwned)
		conns, _ := f.Sum(MetricConnections)
		quic, ok := f.Sum(MetricQUICStreams)
		if !ok {
			quic, _ = f.Sum(MetricQUICStreamsOld)
		}
		r.Epoch, r.ShardsOwned, r.Connections, r.QUICStreams = uint64(epoch), int(owned), int(conns), int(quic)
		r.MaxLag = f.Max(MetricSubscriberLag)
		r.DiskFree = math.NaN()
		if free, ok := f.Sum(MetricDiskFree); ok {
			r.DiskFree = free
		}

		p, havePrev := before[s.Node]
		havePrev = havePrev && p.Err == nil && p.At.Before(s.At)
		secs := 1.0
		if havePrev {
			secs = s.At.Sub(p.At).Seconds()
			r.Interval = secs
		}
		rate := func(name string) float64 {
			v, _ := f.Sum(name)
			if havePrev {
				old, _ := p.Fams.Sum(name)
				v = math.Max(v-old, 0)
			}
			return v / secs
		}
		hist := func(name string) Histogram {
			h := f.Histogram(name)
			if havePrev {
				h = h.Sub(p.Fams.Histogram(name))
			}
			return h
		}
		r.InPerSec = rate(MetricRecordsIn)
		r.InBytesPerSec = rate(MetricBytesIn)
		r.OutPerSec = rate(MetricRecordsOut)
		r.FwdPerSec = rate(MetricForwards)
		r.ErrPerSec = rate(MetricErrors)
		r.QUICSentPerSec = rate(MetricQUICSent)
		r.QUICLostPerSec = rate(MetricQUICLost)
		pub := hist(MetricPublishDuration)
		r.PublishP50, r.PublishP99 = pub.Quantile(0.5), pub.Quantile(0.99)
		r.FsyncP50 = hist(MetricFsyncDuration).Quantile(0.5)
		r.PerFsync = hist(MetricBatchRecords).Mean()
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Node < rows[j].Node })
	return rows
}
