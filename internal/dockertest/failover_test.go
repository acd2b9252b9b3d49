package dockertest

import (
	"context"
	"flag"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
)

var kills = flag.Int("felix.docker.kills", 3, "ctl leader kills per mode in TestCtlLeaderKill (10 or more for failover figures: median and max)")

// failoverBound is the longest a ctl failover may take before the test
// fails: the dead leader's election session lease (CtlTTL, 3s), which a
// new etcd leader extends by its election timeout (1s) when the killed
// ctl's etcd member led etcd too, after etcd's own election (1 to 2s),
// then the takeover (a few etcd round trips); with room for a loaded
// machine.
const failoverBound = 15 * time.Second

// TestCtlLeaderKill kills -9 the container of the ctl leader while
// publishers write through every broker, and checks that another ctl
// leads within failoverBound, that no publish fails or stalls meanwhile
// (the data path does not depend on ctl), and that a stream created after
// the failover is placed on the brokers and takes records through each of
// them. It does so -felix.docker.kills times (default 3) in every mode,
// starting the killed ctl again (it rejoins as a follower) before the
// next kill, and reports the failover times.
func TestCtlLeaderKill(t *testing.T) {
	forModes(t, func(t *testing.T, opts Options) {
		c := Start(t, opts)
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(*kills)*time.Minute+2*time.Minute)
		defer cancel()
		admin := c.adminClient(ctx, t)
		const stream = "events"
		if err := admin.CreateStream(ctx, client.StreamConfig{Name: stream, Shards: 6}); err != nil {
			t.Fatal(err)
		}
		l := c.startLoad(ctx, t, stream)
		time.Sleep(time.Second) // publishing under way before the first kill

		var elected, committed []time.Duration
		for k := range *kills {
			leader, err := c.leader(ctx)
			if err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			if err := c.Kill(ctx, leader); err != nil {
				t.Fatal(err)
			}
			next, took, err := c.newLeader(ctx, leader, killed)
			if err != nil {
				t.Fatalf("kill %d of %s: %v", k+1, leader.Name, err)
			}
			elected = append(elected, took)

			// A stream created after the failover is placed and usable. The
			// create waits for the new leader to commit it (the broker relays
			// it to its ctl, which forwards it to the leader).
			name := "after-" + strconv.Itoa(k)
			if err := createRetrying(ctx, admin, client.StreamConfig{Name: name, Shards: 3}); err != nil {
				t.Fatalf("kill %d: creating %s after the failover: %v", k+1, name, err)
			}
			committed = append(committed, time.Since(killed))
			t.Logf("kill %d: %s killed; %s leads after %v; stream %s created %v after the kill",
				k+1, leader.Name, next.Name, took.Round(time.Millisecond), name, committed[k].Round(time.Millisecond))
			c.checkUsable(ctx, t, name)

			if k < *kills-1 {
				if err := c.Restart(ctx, leader); err != nil {
					t.Fatal(err)
				}
				if err := c.WaitHealthy(ctx); err != nil {
					t.Fatalf("after restarting %s: %v", leader.Name, err)
				}
			}
		}
		acked, refused, maxGap := l.stop(t)
		t.Logf("ctl failover over %d kills: new leader after median %v, max %v; first change committed after median %v, max %v; "+
			"publishes acked %d, refused %d, longest wait for an ack %v",
			len(elected), median(elected), slices.Max(elected).Round(time.Millisecond), median(committed), slices.Max(committed).Round(time.Millisecond),
			acked, refused, maxGap.Round(time.Millisecond))
	})
}
