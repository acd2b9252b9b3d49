package dockertest

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
)

// TestCtlLeaderPartition cuts the ctl leader off the network (docker
// network disconnect) while publishers write to an existing stream
// through every broker, and checks:
//
//   - the majority side elects a new leader within failoverBound, and a
//     stream created during the partition is placed and usable;
//   - the cut-off ctl stops acting as leader: its log says it stepped
//     down, it is a follower once back (unless an election after the new
//     leader's session ended chose it again), and etcd's history shows no map
//     committed by it after its election session ended (readHistory: each
//     commit records its writer and election key in the same transaction,
//     and etcd's revisions order the commits and the session's end
//     without any clock);
//   - after it is connected again there is one map history: strictly
//     increasing epochs in etcd, every map a broker held (asked every
//     100ms) is the map etcd committed at its epoch, and every epoch a
//     broker applied or a ctl pushed, by their logs, is one etcd
//     committed;
//   - no publish was refused.
func TestCtlLeaderPartition(t *testing.T) {
	forModes(t, func(t *testing.T, opts Options) {
		c := Start(t, opts)
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		admin := c.adminClient(ctx, t)
		const stream = "events"
		if err := admin.CreateStream(ctx, client.StreamConfig{Name: stream, Shards: 6}); err != nil {
			t.Fatal(err)
		}
		maps, err := c.watchMaps(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer maps.stop()
		l := c.startLoad(ctx, t, stream)
		time.Sleep(time.Second)

		leader, err := c.leader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cut := time.Now()
		if err := c.Disconnect(ctx, leader); err != nil {
			t.Fatal(err)
		}
		next, took, err := c.newLeader(ctx, leader, cut)
		if err != nil {
			t.Fatal(err)
		}
		if err := createRetrying(ctx, admin, client.StreamConfig{Name: "during", Shards: 3}); err != nil {
			t.Fatalf("creating a stream during the partition: %v", err)
		}
		created := time.Since(cut)
		c.checkUsable(ctx, t, "during")
		// Keep it cut off long enough to see its own session end (CtlTTL
		// after its last renewal) before it is back.
		if wait := 2*ctlTTL - time.Since(cut); wait > 0 {
			time.Sleep(wait)
		}
		// And until its log says it stepped down, for up to 2 CtlTTL
		// more: etcd's client declares the session lost a TTL after the
		// last keep-alive answer it had, which a cut-off member's
		// forwarding can delay (once seen 8.6 s after the cut).
		for deadline := time.Now().Add(2 * ctlTTL); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if _, ok := steppedDown(c.Logs(leader, 100000), cut); ok {
				break
			}
		}
		if err := c.Connect(ctx, leader); err != nil {
			t.Fatal(err)
		}
		back := time.Now()
		if err := c.WaitHealthy(ctx); err != nil {
			t.Fatalf("after reconnecting %s: %v", leader.Name, err)
		}
		healed := time.Since(back)
		now, err := c.leader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if now == leader {
			// Only a fresh election may bring it back: one that followed
			// the end of the new leader's session (etcd can lose a
			// session's lease while the cut-off member rejoins). A stale
			// leadership would show as maps it committed after its own
			// session ended, which readHistory checks below.
			if after, ended := steppedDown(c.Logs(next, 100000), cut); ended {
				t.Logf("%s leads again after reconnecting, elected after %s's session ended (%s after the cut, by its log)", leader.Name, next.Name, after.Round(time.Millisecond))
			} else {
				t.Errorf("%s leads again after reconnecting, before %s's session ended", leader.Name, next.Name)
			}
		}
		if err := createRetrying(ctx, admin, client.StreamConfig{Name: "after", Shards: 3}); err != nil {
			t.Fatalf("creating a stream after the partition: %v", err)
		}
		c.checkUsable(ctx, t, "after")
		time.Sleep(500 * time.Millisecond) // the brokers' last maps sampled
		maps.stop()
		acked, refused, maxGap := l.stop(t)

		// It stepped down, by its own log, while cut off.
		stepped, ok := steppedDown(c.Logs(leader, 100000), cut)
		if !ok {
			t.Errorf("%s's log does not say it stopped leading after the partition", leader.Name)
		}

		etcd, err := c.Etcd()
		if err != nil {
			t.Fatal(err)
		}
		h, err := readHistory(ctx, etcd)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range h.errs {
			t.Errorf("etcd's history: %s", e)
		}
		// The cut-off leader's maps and the end of its session, for the
		// report (readHistory already failed any map after that end).
		var oldLast, newFirst int64
		var oldKey string
		for _, m := range h.maps {
			switch {
			case m.writer.Name == leader.Name && newFirst == 0:
				oldLast, oldKey = m.rev, m.writer.Election
			case m.writer.Name == next.Name && newFirst == 0 && oldLast > 0:
				newFirst = m.rev
			}
		}
		oldEnd := h.sessionEnd[oldKey]
		t.Logf("etcd's map history, epoch@revision(writer): %s", h.epochs())
		held, errs := maps.check(h)
		for _, e := range errs {
			t.Error(e)
		}
		logged, errs := c.checkLogged(h)
		for _, e := range errs {
			t.Error(e)
		}
		t.Logf("partition of %s: %s leads %v after the cut (stream created %v after it); %s stepped down %v after the cut, by its log; "+
			"healthy again %v after reconnecting, %s leading; etcd: %d maps, epochs up to %d, %s's last map at revision %d, its session ended at revision %d, %s's first map at revision %d; "+
			"brokers held %d distinct maps, logs name %d applied or pushed maps, all committed; publishes acked %d, refused %d, longest wait for an ack %v",
			leader.Name, next.Name, took.Round(time.Millisecond), created.Round(time.Millisecond), leader.Name, stepped.Round(time.Millisecond),
			healed.Round(time.Millisecond), now.Name, len(h.maps), lastEpoch(h), leader.Name, oldLast, oldEnd, next.Name, newFirst,
			held, logged, acked, refused, maxGap.Round(time.Millisecond))
	})
}

// ctlTTL is the ctls' election session lease (felix ctl's default).
const ctlTTL = 3 * time.Second

func lastEpoch(h *history) uint64 {
	if len(h.maps) == 0 {
		return 0
	}
	return h.maps[len(h.maps)-1].epoch
}

var stepDownLine = regexp.MustCompile(`time=(\S+) level=\w+ msg="ctl is no longer the leader"`)

// steppedDown returns how long after since a ctl's log first says it
// stopped leading (the container's clock is the host's).
func steppedDown(logs string, since time.Time) (time.Duration, bool) {
	for _, m := range stepDownLine.FindAllStringSubmatch(logs, -1) {
		at, err := time.Parse(time.RFC3339Nano, strings.Trim(m[1], `"`))
		if err == nil && at.After(since) {
			return at.Sub(since), true
		}
	}
	return 0, false
}
