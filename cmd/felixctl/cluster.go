package main

import (
	"context"
	"fmt"

	"github.com/felix-broker/felix/internal/cluster"
)

type clusterCmd struct {
	Status clusterStatusCmd `cmd:"" help:"Show the brokers, their liveness, the map epoch, the owner of every shard and the control plane's members (leader, etcd health); exit 3 if a broker is down."`
	Stats  clusterStatsCmd  `cmd:"" help:"A top-like view of every broker's metrics: rates, publish and fsync latency, records per fsync, subscriber lag."`
	Drain  clusterDrainCmd  `cmd:"" help:"Move every replica a broker lost for good (down) holds to other brokers, following each until it is a voter, a few at a time; exit 1 if any is left, or the broker owns shards of replication factor 1."`
	Remove clusterRemoveCmd `cmd:"" help:"Remove a broker lost for good from the cluster: it must be down and hold no replica (drain it first)."`
}

type clusterStatusCmd struct {
}

// statusJSON is the cluster status as --json prints it.
type statusJSON struct {
	Healthy bool         `json:"healthy"`
	Epoch   uint64       `json:"epoch"`
	Via     string       `json:"via"` // the broker that answered
	Nodes   []nodeJSON   `json:"nodes"`
	Streams []streamJSON `json:"streams"`
	// Ctl lists the control plane's members (none from a control plane
	// too old to report them).
	Ctl []ctlJSON `json:"ctl"`
}

type ctlJSON struct {
	Name        string `json:"name"`
	Addr        string `json:"addr"`
	Role        string `json:"role"`
	Etcd        string `json:"etcd,omitempty"` // "" with an external etcd
	EtcdHealthy bool   `json:"etcd_healthy"`
	EtcdLeader  bool   `json:"etcd_leader"`
	EtcdError   string `json:"etcd_error,omitempty"`
}

type nodeJSON struct {
	ID     string `json:"id"`
	Addr   string `json:"addr"`
	Live   bool   `json:"live"`
	Shards int    `json:"shards"`
}

func (s *clusterStatusCmd) Run(a *app) error {
	g := a.flags
	ctx, cancel := context.WithTimeout(a.ctx, g.Timeout)
	defer cancel()
	c, err := g.connect(ctx, a, "")
	if err != nil {
		return err
	}
	defer c.Close()
	m, err := c.ClusterStatus(ctx)
	if err != nil {
		return &brokerError{ID: c.id, Addr: c.addr, Err: err}
	}
	ctlMembers, err := c.ControlPlane(ctx)
	if err != nil {
		return &brokerError{ID: c.id, Addr: c.addr, Err: err}
	}
	var down []string
	for _, n := range m.Nodes {
		if !n.Live {
			down = append(down, n.ID)
		}
	}
	if g.JSON {
		out := statusJSON{Healthy: len(down) == 0, Epoch: m.Epoch, Via: c.id, Nodes: []nodeJSON{}, Streams: []streamJSON{}, Ctl: []ctlJSON{}}
		for _, cm := range ctlMembers {
			out.Ctl = append(out.Ctl, ctlJSON{Name: cm.Name, Addr: cm.Addr, Role: cm.Role, Etcd: cm.Etcd,
				EtcdHealthy: cm.EtcdHealthy, EtcdLeader: cm.EtcdLeader, EtcdError: cm.EtcdError})
		}
		for _, n := range m.Nodes {
			out.Nodes = append(out.Nodes, nodeJSON{ID: n.ID, Addr: n.Addr, Live: n.Live, Shards: len(m.OwnedBy(n.ID))})
		}
		for _, st := range m.Streams {
			out.Streams = append(out.Streams, toJSON(st.StreamConfig, st.Placement))
		}
		if err := printJSON(a.stdout, out); err != nil {
			return err
		}
	} else {
		cluster.WriteOwnership(a.stdout, m)
		if len(ctlMembers) > 0 {
			fmt.Fprintln(a.stdout)
			if err := writeCtlStatus(a.stdout, ctlMembers); err != nil {
				return err
			}
			fmt.Fprintln(a.stdout)
		}
		if len(down) == 0 {
			fmt.Fprintf(a.stdout, "healthy: all %d brokers live\n", len(m.Nodes))
		} else {
			fmt.Fprintf(a.stdout, "unhealthy: %d of %d brokers down\n", len(down), len(m.Nodes))
		}
		if n := ctlDown(ctlMembers); n > 0 {
			fmt.Fprintf(a.stdout, "control plane: %d of %d members down (it keeps working while a majority is up)\n", n, len(ctlMembers))
		}
	}
	if len(down) > 0 {
		return &errUnhealthy{down: down}
	}
	return nil
}
