package stats

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

const sample = `# TYPE felix_publish_duration_seconds histogram
felix_publish_duration_seconds_bucket{path="local",le="0.001"} 10
felix_publish_duration_seconds_bucket{path="local",le="0.002"} 30
felix_publish_duration_seconds_bucket{path="local",le="+Inf"} 40
felix_publish_duration_seconds_sum{path="local"} 0.06
felix_publish_duration_seconds_count{path="local"} 40
# TYPE felix_forwards_total counter
felix_forwards_total{peer="broker-1"} 7
felix_forwards_total{peer="broker-2"} 3
`

func TestParseSumQuantile(t *testing.T) {
	f, err := Parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := f.Sum(MetricForwards); v != 10 {
		t.Errorf("forwards %v, want 10", v)
	}
	if v, _ := f.Sum(MetricForwards, "peer", "broker-2"); v != 3 {
		t.Errorf("forwards to broker-2 %v, want 3", v)
	}
	h := f.Histogram(MetricPublishDuration, "path", "local")
	// rank 20 of 40 lies halfway through the (1ms, 2ms] bucket.
	if q := h.Quantile(0.5); math.Abs(q-0.0015) > 1e-9 {
		t.Errorf("p50 %v, want 0.0015", q)
	}
	if q := h.Quantile(0.99); q != 0.002 {
		t.Errorf("p99 %v, want the last finite bound 0.002", q)
	}
	if d := h.Sub(h); d.Count != 0 || !math.IsNaN(d.Quantile(0.5)) {
		t.Errorf("h - h = %+v", d)
	}
}

// TestSummarizeQUICRates: the QUIC packet counters become per-second
// rates over the interval between two scrapes, summed over both types of
// connection.
func TestSummarizeQUICRates(t *testing.T) {
	scrape := func(at time.Time, sent, lost int) Scrape {
		f, err := Parse(strings.NewReader(fmt.Sprintf(`# TYPE felix_quic_packets_sent_total counter
felix_quic_packets_sent_total{type="client"} %d
felix_quic_packets_sent_total{type="peer"} 100
# TYPE felix_quic_packets_lost_total counter
felix_quic_packets_lost_total{type="client"} %d
felix_quic_packets_lost_total{type="peer"} 1
`, sent, lost)))
		if err != nil {
			t.Fatal(err)
		}
		return Scrape{Node: "broker-0", Live: true, At: at, Fams: f}
	}
	t0 := time.Now()
	rows := Summarize([]Scrape{scrape(t0, 1000, 10)}, []Scrape{scrape(t0.Add(2*time.Second), 3000, 50)})
	if len(rows) != 1 {
		t.Fatalf("rows %+v", rows)
	}
	if r := rows[0]; r.QUICSentPerSec != 1000 || r.QUICLostPerSec != 20 {
		t.Fatalf("QUIC sent %v/s lost %v/s over 2 s, want 1000 and 20", r.QUICSentPerSec, r.QUICLostPerSec)
	}
	var b strings.Builder
	if err := WriteTable(&b, rows); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "QUIC LOST/s") {
		t.Fatalf("table without the QUIC LOST/s column:\n%s", b.String())
	}
}

// TestDiskFree: the free space a broker reports is in the row, the table
// (DISK FREE, binary units) and the JSON; a broker that does not report it
// shows "-" and null.
func TestDiskFree(t *testing.T) {
	withFree, err := Parse(strings.NewReader("# TYPE felix_disk_free_bytes gauge\nfelix_disk_free_bytes 3221225472\n"))
	if err != nil {
		t.Fatal(err)
	}
	rows := Summarize(nil, []Scrape{
		{Node: "broker-0", Live: true, At: time.Now(), Fams: withFree},
		{Node: "broker-1", Live: true, At: time.Now(), Fams: Families{}},
	})
	if rows[0].DiskFree != 3<<30 || !math.IsNaN(rows[1].DiskFree) {
		t.Fatalf("disk free %v and %v, want 3 GiB and NaN", rows[0].DiskFree, rows[1].DiskFree)
	}
	var table, js strings.Builder
	if err := WriteTable(&table, rows); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "DISK FREE") || !strings.Contains(table.String(), "3.0GiB") {
		t.Fatalf("table:\n%s", table.String())
	}
	if err := WriteJSON(&js, rows); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(js.String(), `"disk_free_bytes":3221225472`) || !strings.Contains(js.String(), `"disk_free_bytes":null`) {
		t.Fatalf("JSON:\n%s", js.String())
	}
}
