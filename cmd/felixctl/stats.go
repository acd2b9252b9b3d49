package main

import (
	"context"
	"os"
	"time"

	"github.com/felix-broker/felix/internal/stats"
	"github.com/felix-broker/felix/shardmap"
)

// clusterStatsCmd is a top-like view of every broker's metrics, scraped
// from the admin address each broker advertises in the shard map.
type clusterStatsCmd struct {
	Interval time.Duration `help:"Time between tables." default:"2s"`
	Count    int           `help:"Print this many tables and exit (0: until interrupted). Exit 3 if the last one shows a broker down." default:"0"`
}

func (s *clusterStatsCmd) Run(a *app) error {
	g := a.flags
	ctx, cancel := context.WithTimeout(a.ctx, g.Timeout)
	c, err := g.connect(ctx, a, "")
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	clear := ""
	if s.Count != 1 && !g.JSON && isTTY(a.stdout) {
		clear = "\x1b[H\x1b[2J" // redraw in place, like top, only on a terminal
	}
	var down []string
	err = stats.Run(a.ctx, a.stdout, stats.Options{
		Map: func(ctx context.Context) (*shardmap.Map, error) {
			ctx, cancel := context.WithTimeout(ctx, g.Timeout)
			defer cancel()
			return c.ClusterStatus(ctx)
		},
		Interval: s.Interval,
		Count:    s.Count,
		JSON:     g.JSON,
		Clear:    clear,
		OnTable: func(rows []stats.Row) {
			down = down[:0]
			for _, r := range rows {
				if !r.Live {
					down = append(down, r.Node)
				}
			}
		},
	})
	if err != nil {
		return &brokerError{ID: c.id, Addr: c.addr, Err: err}
	}
	if len(down) > 0 {
		return &errUnhealthy{down: down}
	}
	return nil
}

// isTTY reports whether w is a terminal (a character device: a pipe, a
// file or a test's buffer is not).
func isTTY(w any) bool {
	f, ok := w.(*os.File)
	return ok && isTerminal(f)
}
