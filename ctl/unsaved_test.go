package ctl

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/felix-broker/felix/ctl/ctlclient"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestUncommittedMapNotPushed: a liveness change the leader cannot commit
// (its etcd request times out) is not pushed until it is committed, so no
// broker holds a map etcd did not commit: there is one map history. Before,
// the leader logged the failed write and pushed the map anyway.
func TestUncommittedMapNotPushed(t *testing.T) {
	p := newPKI(t)
	srvs := startHA(t, p, 3)
	leader := waitLeader(t, srvs, nil)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	join := func(id string) *ctlclient.Member {
		m, err := ctlclient.Join(ctx, ctlclient.MemberConfig{
			CtlAddrs: []string{leader.Addr()},
			TLS:      p.clientTLS(t, id), Node: transport.Register{NodeID: id, Addr: "127.0.0.1:7400"},
			LeaseTTL: shortTTL, MaxBackoff: 100 * time.Millisecond, Logger: testLogger(t),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	b0, b1 := join("b0"), join("b1")
	waitMap(t, b0, "b0 and b1 live", func(mp *shardmap.Map) bool { return liveCount(mp) == 2 })
	epoch := b0.Map().Epoch

	timedOut := error(context.DeadlineExceeded)
	leader.store.saveFault.Store(&timedOut)
	b1.Close() // its registration ends: the leader marks it down but cannot commit that

	watch := time.After(2 * time.Second)
	for watching := true; watching; {
		changed := b0.Changed()
		if m := b0.Map(); m.Epoch != epoch {
			t.Fatalf("b0 was pushed the map of epoch %d (live %d), which etcd did not commit; the last committed epoch is %d", m.Epoch, liveCount(m), epoch)
		}
		select {
		case <-changed:
		case <-watch:
			watching = false
		}
	}

	// A broker registering meanwhile is sent the map last committed,
	// not the leader's state with the changes not committed.
	b2 := join("b2")
	if m := b2.Map(); m.Epoch != epoch {
		t.Fatalf("b2 registered and was sent the map of epoch %d (live %d); the last committed is %d", m.Epoch, liveCount(m), epoch)
	}

	// etcd answers again: the change is committed, then pushed.
	leader.store.saveFault.Store(nil)
	m := waitMap(t, b0, "b1 down, b2 live", func(mp *shardmap.Map) bool {
		b1, _ := mp.Node("b1")
		return liveCount(mp) == 2 && !b1.Live
	})
	if m.Epoch <= epoch {
		t.Errorf("b1 down at epoch %d, not after %d", m.Epoch, epoch)
	}
	// The followers adopt it from etcd: it was committed.
	deadline := time.Now().Add(waitFor)
	for _, s := range srvs {
		for s != leader && s.Map().Epoch < m.Epoch {
			if time.Now().After(deadline) {
				t.Fatalf("a follower holds epoch %d, never the pushed %d: the pushed map is not in etcd", s.Map().Epoch, m.Epoch)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// TestGivenUpWriteThatLanded: a stream change whose etcd write committed
// but whose answer was lost is refused and undone in the leader's state,
// yet etcd (and every follower) holds it. The next change must not be
// built on the leader's state as if it had not happened: that committed a
// second, different map at the same epoch, which dropped the stream the
// followers already served. Instead the leader reloads (it steps down and
// a leader takes over from etcd), so the change that landed stays, and
// every epoch etcd ever held has one content.
func TestGivenUpWriteThatLanded(t *testing.T) {
	p := newPKI(t)
	srvs := startHA(t, p, 3)
	leader := waitLeader(t, srvs, nil)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := leader.CreateStream(shardmap.StreamConfig{Name: "a", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	lost := error(context.DeadlineExceeded)
	leader.store.lostFault.Store(&lost)
	if err := leader.CreateStream(shardmap.StreamConfig{Name: "x", Shards: 1}); err == nil {
		t.Fatal("stream x created while its write's answer was lost")
	}
	leader.store.lostFault.Store(nil)

	// Every ctl serves x, the leader too, with no other change to make
	// it reload.
	waitStreams(t, srvs, "x")

	// However the next change is answered, once a leader serves it
	// again it is made on top of x.
	for deadline := time.Now().Add(waitFor); ; time.Sleep(20 * time.Millisecond) {
		err := waitLeader(t, srvs, nil).CreateStream(shardmap.StreamConfig{Name: "y", Shards: 1})
		if err == nil || errors.Is(err, ErrStreamExists) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream y: %v", err)
		}
	}
	waitStreams(t, srvs, "x", "y")

	// etcd's history: each revision that put the epoch key, and the
	// streams stored at it.
	st := leader.store
	now, err := st.cli.Get(ctx, st.epochKey())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{} // epoch -> streams
	for rev := int64(1); rev <= now.Header.Revision; rev++ {
		e, err := st.cli.Get(ctx, st.epochKey(), clientv3.WithRev(rev))
		if err != nil {
			t.Fatal(err)
		}
		if len(e.Kvs) == 0 || e.Kvs[0].ModRevision != rev {
			continue
		}
		ss, err := st.cli.Get(ctx, st.streamKey(""), clientv3.WithPrefix(), clientv3.WithRev(rev), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, kv := range ss.Kvs {
			names = append(names, strings.TrimPrefix(string(kv.Key), st.streamKey("")))
		}
		epoch, streams := string(e.Kvs[0].Value), strings.Join(names, ",")
		if before, ok := seen[epoch]; ok && before != streams {
			t.Errorf("etcd held epoch %s twice with different streams: [%s], then [%s] at revision %d", epoch, before, streams, rev)
		}
		seen[epoch] = streams
	}
}

// waitStreams waits until every one of srvs serves a map with streams.
func waitStreams(t *testing.T, srvs []*Server, streams ...string) {
	t.Helper()
	for _, s := range srvs {
		for deadline := time.Now().Add(waitFor); ; time.Sleep(20 * time.Millisecond) {
			var missing []string
			for _, name := range streams {
				if _, ok := s.Map().Stream(name); !ok {
					missing = append(missing, name)
				}
			}
			if len(missing) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s's map (epoch %d) lacks %v", s.name(), s.Map().Epoch, missing)
			}
		}
	}
}

// TestFollowOverUncommittedState: a ctl that led may hold changes it
// never committed, its state epochs ahead of the map it pushed last,
// while the next leader commits other changes at those epochs. It
// adopts them: it compares what it reads with the map it pushed, not with
// its own state. Before, it ignored every map up to its state's epoch and
// kept serving the last one it committed. (It also reads etcd's state as
// soon as it steps down.)
func TestFollowOverUncommittedState(t *testing.T) {
	p := newPKI(t)
	srvs := startHA(t, p, 3)
	leader := waitLeader(t, srvs, nil)
	if err := leader.CreateStream(shardmap.StreamConfig{Name: "a", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	waitStreams(t, srvs, "a")
	f := srvs[0]
	if f == leader {
		f = srvs[1]
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	committed := f.mu.st.snapshot()
	for _, name := range []string{"u", "v"} { // as if f had led and could not commit them
		if err := f.mu.st.createStream(shardmap.StreamConfig{Name: name, Shards: 1}); err != nil {
			t.Fatal(err)
		}
	}
	next := committed // the next leader's commit at the epoch after
	next.Epoch++
	f.adoptLocked(next)
	m := f.Map()
	if _, ok := m.Stream("u"); m.Epoch != next.Epoch || ok {
		t.Errorf("after the leader's epoch %d: f serves epoch %d (stream u: %v), want the leader's map", next.Epoch, m.Epoch, ok)
	}
	if f.mu.st.epoch != next.Epoch {
		t.Errorf("f's state at epoch %d, want the leader's %d", f.mu.st.epoch, next.Epoch)
	}
}
