package stats

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"text/tabwriter"
	"time"

	"github.com/felix-broker/felix/shardmap"
)

// WriteTable writes rows as an aligned table, one broker per line.
func WriteTable(w io.Writer, rows []Row) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "NODE\tSTATE\tEPOCH\tSTREAMS\tSHARDS\tCONNS\tIN/s\tOUT/s\tFWD/s\tERR/s\tPUB p50\tPUB p99\tFSYNC p50\tREC/FSYNC\tMAX LAG\tQUIC LOST/s\tDISK FREE\t")
	for _, r := range rows {
		state := "live"
		if !r.Live {
			state = "down"
		}
		if r.Error != "" {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t\n", r.Node, state)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f\t%s\t%s\t\n",
			r.Node, state, r.Epoch, r.Streams, r.ShardsOwned, r.Connections,
			num(r.InPerSec), num(r.OutPerSec), num(r.FwdPerSec), num(r.ErrPerSec),
			dur(r.PublishP50), dur(r.PublishP99), dur(r.FsyncP50), num(r.PerFsync), r.MaxLag, num(r.QUICLostPerSec), bytesOf(r.DiskFree))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rows {
		if r.Error != "" {
			fmt.Fprintf(w, "%s: %s\n", r.Node, r.Error)
		}
	}
	return nil
}

// WriteJSON writes rows as JSON, one object per line (NDJSON); unknown
// quantiles and free space are null.
func WriteJSON(w io.Writer, rows []Row) error {
	type jrow struct {
		Row
		PublishP50 *float64 `json:"publish_p50_seconds"`
		PublishP99 *float64 `json:"publish_p99_seconds"`
		FsyncP50   *float64 `json:"fsync_p50_seconds"`
		PerFsync   *float64 `json:"records_per_fsync"`
		DiskFree   *float64 `json:"disk_free_bytes"`
	}
	opt := func(v float64) *float64 {
		if math.IsNaN(v) {
			return nil
		}
		return &v
	}
	enc := json.NewEncoder(w)
	for _, r := range rows {
		if err := enc.Encode(jrow{Row: r, PublishP50: opt(r.PublishP50), PublishP99: opt(r.PublishP99),
			FsyncP50: opt(r.FsyncP50), PerFsync: opt(r.PerFsync), DiskFree: opt(r.DiskFree)}); err != nil {
			return err
		}
	}
	return nil
}

func num(v float64) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case v >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.1fk", v/1e3)
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

// bytesOf renders a byte count in binary units ("-" for NaN).
func bytesOf(n float64) string {
	switch {
	case math.IsNaN(n):
		return "-"
	case n >= 1<<40:
		return fmt.Sprintf("%.1fTiB", n/(1<<40))
	case n >= 1<<30:
		return fmt.Sprintf("%.1fGiB", n/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.0fMiB", n/(1<<20))
	}
	return fmt.Sprintf("%.0fKiB", n/(1<<10))
}

func dur(secs float64) string {
	if math.IsNaN(secs) {
		return "-"
	}
	d := time.Duration(secs * float64(time.Second))
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d.Microseconds())
	case d < time.Second:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	}
	return d.Round(time.Millisecond).String()
}

// Options configures Run.
type Options struct {
	// Map returns the current shard map (felixctl fetches it from a broker).
	Map func(context.Context) (*shardmap.Map, error)
	// Interval between scrapes; default 2s.
	Interval time.Duration
	// Count is how many tables to print; 0 means until ctx ends. Each
	// table covers one interval.
	Count int
	// JSON prints each table as JSON instead, one object per broker and
	// line.
	JSON bool
	// OnTable, if set, is called with the rows of each table once it is
	// printed (felixctl exits 3 when the last one shows a broker down).
	OnTable func([]Row)
	// HTTP scrapes; nil means a client with a 5s timeout.
	HTTP *http.Client
	// Clear is written before each table after the first (e.g. "\x1b[H\x1b[2J"
	// on a terminal for a top-like display); default nothing.
	Clear string
}

// Run is `felixctl cluster stats`: it scrapes every broker in the map,
// waits Interval, scrapes again and prints the rows for that interval,
// and repeats Count times (or until ctx ends, which is not an error).
func Run(ctx context.Context, w io.Writer, opts Options) error {
	if opts.Interval <= 0 {
		opts.Interval = 2 * time.Second
	}
	m, err := opts.Map(ctx)
	if err != nil {
		return fmt.Errorf("stats: getting the shard map: %w", err)
	}
	prev := ScrapeAll(ctx, opts.HTTP, m)
	for i := 0; opts.Count == 0 || i < opts.Count; i++ {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(opts.Interval):
		}
		if nm, err := opts.Map(ctx); err == nil {
			m = nm
		}
		cur := ScrapeAll(ctx, opts.HTTP, m)
		rows := Summarize(prev, cur)
		prev = cur
		countStreams(rows, m)
		if i > 0 && opts.Clear != "" {
			io.WriteString(w, opts.Clear)
		}
		if opts.JSON {
			err = WriteJSON(w, rows)
		} else {
			fmt.Fprintf(w, "felix cluster: epoch %d, %d brokers, interval %s\n", m.Epoch, len(m.Nodes), opts.Interval)
			err = WriteTable(w, rows)
		}
		if err != nil {
			return err
		}
		if opts.OnTable != nil {
			opts.OnTable(rows)
		}
	}
	return nil
}

// countStreams fills each row's Streams: the streams of m with a shard
// owned by the row's broker.
func countStreams(rows []Row, m *shardmap.Map) {
	for i := range rows {
		for _, st := range m.Streams {
			for _, o := range st.Placement.All() {
				if o == rows[i].Node {
					rows[i].Streams++
					break
				}
			}
		}
	}
}
