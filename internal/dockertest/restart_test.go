package dockertest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/client"
)

// TestCtlRestartAll stops every ctl (and, with an external etcd, every
// etcd member) with docker stop and starts them again, their data kept
// in their containers, while publishers write to an existing stream
// through every broker. Afterwards every stream, its configuration and
// the owner of each of its shards, and every grant are there, identical
// (as the brokers' maps and the control plane's ACL list show them, and
// as etcd stores them); the brokers are live again; every stream takes
// records through every broker; and no publish was refused, since the
// data path does not depend on ctl.
func TestCtlRestartAll(t *testing.T) {
	forModes(t, func(t *testing.T, opts Options) {
		c := Start(t, opts)
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		admin := c.adminClient(ctx, t)
		for _, s := range []client.StreamConfig{
			{Name: "events", Shards: 6},
			{Name: "orders.eu", Shards: 4, RetentionBytes: 1 << 20},
			{Name: "audit", Shards: 2, RetentionAge: time.Hour},
		} {
			if err := admin.CreateStream(ctx, s); err != nil {
				t.Fatal(err)
			}
		}
		grants := []client.Grant{
			{Principal: "alice", Action: auth.Publish, Pattern: "orders.*"},
			{Principal: "alice", Action: auth.Subscribe, Pattern: "orders.eu"},
			{Principal: "bob", Action: auth.Subscribe, Pattern: "*"},
			{Principal: "ops", Action: auth.ClusterRead, Pattern: "*"},
		}
		for _, g := range grants {
			if err := admin.Grant(ctx, g); err != nil {
				t.Fatal(err)
			}
		}
		before := c.placement(ctx, t)
		etcdBefore := c.storedState(ctx, t)
		l := c.startLoad(ctx, t, "events")
		time.Sleep(time.Second)

		stopped := time.Now()
		if err := c.RestartControlPlane(ctx); err != nil {
			t.Fatal(err)
		}
		restarted := time.Since(stopped)
		if err := c.WaitHealthy(ctx); err != nil {
			t.Fatalf("after restarting the control plane: %v", err)
		}
		healthy := time.Since(stopped)
		time.Sleep(time.Second) // publishing under way on the restarted control plane
		acked, refused, maxGap := l.stop(t)

		after := c.placement(ctx, t)
		if before.streams != after.streams {
			t.Errorf("streams and placement changed across the restart:\n  before: %s\n  after:  %s", before.streams, after.streams)
		}
		if !slices.Equal(before.grants, after.grants) {
			t.Errorf("grants changed across the restart:\n  before: %v\n  after:  %v", before.grants, after.grants)
		}
		for _, g := range grants {
			if !slices.Contains(after.grants, g.String()) {
				t.Errorf("grant %q missing after the restart", g)
			}
		}
		if after.epoch <= before.epoch {
			t.Errorf("epoch %d after the restart, %d before: want it to have grown", after.epoch, before.epoch)
		}
		if etcdAfter := c.storedState(ctx, t); etcdAfter != etcdBefore {
			t.Errorf("etcd's streams and grants changed across the restart:\n  before: %s\n  after:  %s", etcdBefore, etcdAfter)
		}
		for _, s := range []string{"events", "orders.eu", "audit"} {
			c.checkUsable(ctx, t, s)
		}
		t.Logf("control plane stopped and started again in %v, healthy (every broker live, one leader) %v after the stop; "+
			"epoch %d before, %d after; %d streams, %d grants kept; publishes acked %d, refused %d, longest wait for an ack %v",
			restarted.Round(time.Millisecond), healthy.Round(time.Millisecond), before.epoch, after.epoch,
			strings.Count(after.streams, "stream "), len(after.grants), acked, refused, maxGap.Round(time.Millisecond))
	})
}

// placement is what a restart must keep, as the cluster shows it: the
// streams with their configuration and owners in every broker's map
// (which must agree), and the grants as the control plane lists them.
type placement struct {
	epoch   uint64
	streams string   // mapView of the streams
	grants  []string // sorted
}

func (c *Cluster) placement(ctx context.Context, t *testing.T) placement {
	t.Helper()
	var p placement
	c.eachBroker(ctx, t, func(b *Node, cl *client.Client, m *client.Map) {
		streams := mapView(nil, m.Streams)
		if p.streams != "" {
			if streams != p.streams {
				t.Errorf("%s's map (epoch %d) differs from %s's (epoch %d):\n  %s\n  %s", b.Name, m.Epoch, c.Brokers[0].Name, p.epoch, streams, p.streams)
			}
			return
		}
		p.epoch, p.streams = m.Epoch, streams
		gs, err := cl.Grants(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range gs {
			p.grants = append(p.grants, g.String())
		}
		slices.Sort(p.grants)
	})
	return p
}

// storedState is the streams (with owners) and grants etcd holds, as
// text.
func (c *Cluster) storedState(ctx context.Context, t *testing.T) string {
	t.Helper()
	etcd, err := c.Etcd()
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, p := range []string{"streams/", "grants/"} {
		resp, err := etcd.Get(ctx, statePrefix+p, clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			lines = append(lines, fmt.Sprintf("%s=%s", kv.Key, kv.Value))
		}
	}
	if len(lines) == 0 {
		t.Fatalf("etcd holds no streams or grants under %s", statePrefix)
	}
	return strings.Join(lines, "\n")
}
