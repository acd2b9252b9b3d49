package main

import (
	"context"
	"time"

	"github.com/felix-broker/felix/internal/stats"
	"github.com/felix-broker/felix/shardmap"
)

// clusterStatsCmd is a top-like view of every broker's metrics, scraped
// from the admin address each broker advertises in the shard map.
type clusterStatsCmd struct {
	clientFlags
	Interval time.Duration `help:"Time between tables." default:"2s"`
	Count    int           `help:"Print this many tables and exit (0: until interrupted)." default:"0"`
}

func (s *clusterStatsCmd) Run(a *app) error {
	g := &s.clientFlags
	ctx, cancel := context.WithTimeout(a.ctx, g.Timeout)
	c, err := g.connect(ctx, a, "")
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	clear := ""
	if s.Count != 1 && !g.JSON {
		clear = "\x1b[H\x1b[2J"
	}
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
	})
	if err != nil {
		return &brokerError{ID: c.id, Addr: c.addr, Err: err}
	}
	return nil
}
