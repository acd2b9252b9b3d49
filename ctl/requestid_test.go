package ctl

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestRequestSentAgain: an admin change sent again with its request ID
// is answered as the first time, by this leader or the next, and never
// made twice; the same ID with another change is refused. The case it is
// for: a change whose answer was lost (here the leader's etcd write
// commits and reports a timeout, so the leader answers internal) sent
// again through a follower. Without the IDs the retry is refused with
// "stream exists", though the first one made it.
func TestRequestSentAgain(t *testing.T) {
	srvs := startHA(t, newPKI(t), 3)
	leader, follower := leaderAndFollower(t, srvs)
	create := func(name, id string) *transport.Request {
		return &transport.Request{Op: OpStreamCreate, Stream: shardmap.StreamConfig{Name: name, Shards: 2}, ID: id}
	}
	// until sends req to s until it is answered other than unavailable
	// (the leader stepping down, an election).
	until := func(s *Server, req *transport.Request) (*transport.Response, error) {
		t.Helper()
		for deadline := time.Now().Add(waitFor); ; time.Sleep(20 * time.Millisecond) {
			resp, err := s.handle("alice", req)
			var we *transport.Error
			if err == nil || !errors.As(err, &we) || we.Code != transport.CodeUnavailable || time.Now().After(deadline) {
				return resp, err
			}
		}
	}
	if err := leader.Grant(auth.Grant{Principal: "alice", Action: auth.ClusterAdmin, Pattern: "*"}); err != nil {
		t.Fatal(err)
	}
	if err := leader.Grant(auth.Grant{Principal: "alice", Action: auth.StreamAdmin, Pattern: "*"}); err != nil {
		t.Fatal(err)
	}

	// Sent twice to the leader: one change.
	if _, err := leader.handle("alice", create("a", "req-a")); err != nil {
		t.Fatal(err)
	}
	epoch := leader.Map().Epoch
	if resp, err := leader.handle("alice", create("a", "req-a")); err != nil || len(resp.Streams) != 1 || resp.Streams[0].Name != "a" {
		t.Fatalf("stream a sent again: %+v, %v; want it answered as created", resp, err)
	}
	if got := leader.Map().Epoch; got != epoch {
		t.Fatalf("stream a sent again moved the epoch from %d to %d", epoch, got)
	}
	// Without an ID, as before: the stream exists.
	if _, err := leader.handle("alice", create("a", "")); !errors.Is(err, transport.ErrStreamExists) {
		t.Fatalf("stream a again without an ID: %v, want stream exists", err)
	}
	// The same ID with another change is refused.
	if _, err := leader.handle("alice", create("b", "req-a")); !errors.Is(err, transport.ErrInvalid) {
		t.Fatalf("request id of stream a reused for stream b: %v, want invalid", err)
	}
	if _, err := leader.handle("alice", create("b", "bad id")); !errors.Is(err, transport.ErrInvalid) {
		t.Fatalf("an id with a space: %v, want invalid", err)
	}

	// The answer lost: the write commits, the leader answers internal.
	lost := error(context.DeadlineExceeded)
	leader.store.lostFault.Store(&lost)
	if _, err := leader.handle("alice", create("x", "req-x")); err == nil {
		t.Fatal("stream x created while its write's answer was lost")
	}
	leader.store.lostFault.Store(nil)
	waitStreams(t, srvs, "x")
	x, _ := follower.Map().Stream("x")
	if _, err := until(follower, create("x", "req-x")); err != nil {
		t.Fatalf("stream x sent again through a follower: %v, want it answered as created", err)
	}
	if now, _ := follower.Map().Stream("x"); now.Created != x.Created {
		t.Fatalf("stream x sent again was created again: at epoch %d, first at %d", now.Created, x.Created)
	}

	// A delete sent again, and a move: answered the same.
	del := &transport.Request{Op: OpStreamDelete, Stream: shardmap.StreamConfig{Name: "a"}, ID: "req-del"}
	for i := range 2 {
		if _, err := until(follower, del); err != nil {
			t.Fatalf("delete of a, attempt %d: %v", i+1, err)
		}
	}

	// The next leader answers them too: the IDs are committed with the
	// state.
	old := waitLeader(t, srvs, nil)
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	next := waitLeader(t, srvs, map[*Server]bool{old: true})
	before := next.Map().Epoch
	if _, err := until(next, create("x", "req-x")); err != nil {
		t.Fatalf("stream x sent again to the next leader: %v", err)
	}
	if _, err := until(next, del); err != nil {
		t.Fatalf("delete of a sent again to the next leader: %v", err)
	}
	if got := next.Map().Epoch; got != before {
		t.Fatalf("requests sent again to the next leader moved the epoch from %d to %d", before, got)
	}
}

// TestRequestsRemembered: the state keeps the last maxRequests changes
// made for requests with an ID, and a rollback forgets one remembered
// since its checkpoint.
func TestRequestsRemembered(t *testing.T) {
	s := newState(snapshot{}, nil)
	for i := range maxRequests + 10 {
		s.bump()
		s.remember(appliedRequest{ID: fmt.Sprint(i), What: "w"})
	}
	if len(s.requests) != maxRequests {
		t.Fatalf("%d requests remembered, want %d", len(s.requests), maxRequests)
	}
	if _, ok := s.answered("9"); ok {
		t.Fatal("request 9 still remembered: the oldest go first")
	}
	if r, ok := s.answered("10"); !ok || r.Epoch != 12 {
		t.Fatalf("request 10: %+v %v, want remembered at epoch 12", r, ok)
	}
	cp := s.checkpoint()
	s.bump()
	s.remember(appliedRequest{ID: "new"})
	s.rollback(cp)
	if _, ok := s.answered("new"); ok {
		t.Fatal("a request remembered after the checkpoint survived the rollback")
	}
	if _, ok := s.answered("10"); !ok {
		t.Fatal("the rollback lost request 10")
	}
}

// TestForwardedChangeAnswerLost: a follower forwarding a change sends
// every attempt with one request ID, its own when the request has none.
// The leader's etcd write commits and reports a timeout, so the leader
// answers unavailable; the follower sends the change again, and the
// answer is that it was made, not that the stream exists.
func TestForwardedChangeAnswerLost(t *testing.T) {
	srvs := startHA(t, newPKI(t), 3)
	leader, follower := leaderAndFollower(t, srvs)
	lost := error(context.DeadlineExceeded)
	leader.store.lostNext.Store(&lost)
	if err := follower.CreateStream(shardmap.StreamConfig{Name: "x", Shards: 1}); err != nil {
		t.Fatalf("create through a follower, the leader's first answer lost: %v, want it made", err)
	}
	waitStreams(t, srvs, "x")
}

// leaderAndFollower waits for srvs' leader and returns it with one of
// its followers.
func leaderAndFollower(t *testing.T, srvs []*Server) (leader, follower *Server) {
	t.Helper()
	leader = waitLeader(t, srvs, nil)
	for _, s := range srvs {
		if s != leader {
			return leader, s
		}
	}
	t.Fatal("no follower")
	return nil, nil
}
