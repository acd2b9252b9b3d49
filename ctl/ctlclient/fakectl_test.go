package ctlclient

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// fakeCtl is a control plane of a few lines, for what package ctl cannot
// be made to do (behave as an earlier version, or stop answering): it
// answers a registration with its map, reads heartbeats, and answers
// map.get with its map, counting what it serves. It runs until the test
// ends.
type fakeCtl struct {
	ln        *transport.Listener
	memberTLS *tls.Config // b0's, for Join
	mp        atomic.Pointer[shardmap.Map]

	registrations, heartbeats, mapGets atomic.Int64
	// handOvers counts the registrations the member ended as left for
	// another ctl (streamCodeHandOver, connCodeHandOver).
	handOvers atomic.Int64

	// endRegistrations makes it end each registration right after its
	// first map, saying nothing, as an earlier ctl replacing it did.
	endRegistrations atomic.Bool
	// features are advertised with its maps (none: an earlier ctl's).
	features []string
	// lease is the broker lease said with its maps (0: none, as an
	// earlier ctl).
	lease atomic.Int64
	// logger is the joined member's (nil: none).
	logger *slog.Logger
	// withholdMaps makes it answer no registration, as a ctl whose
	// registration handling is stuck.
	withholdMaps atomic.Bool
	// answer makes it answer heartbeats, as a ctl with
	// transport.FeatureHeartbeatAcks does unless it is stuck.
	answer atomic.Bool
	// answerWithMaps makes it answer each heartbeat with its map instead
	// (a map pushed, no answer).
	answerWithMaps atomic.Bool
	// slowMap, when set, is pushed once, at the next heartbeat, in
	// chunks of slowChunk bytes every slowEvery (a large map on a slow
	// link), with no answer meanwhile.
	slowMap   atomic.Pointer[shardmap.Map]
	slowChunk int
	slowEvery time.Duration

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startFakeCtl starts a fake ctl on loopback, with a map of epoch 1,
// advertising features.
func startFakeCtl(t *testing.T, features ...string) *fakeCtl {
	t.Helper()
	dir := t.TempDir()
	if err := transport.GenerateDevCerts(dir, transport.DevCtlName, "b0"); err != nil {
		t.Fatal(err)
	}
	ca, err := transport.LoadCA(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	load := func(name string) tls.Certificate {
		c, err := transport.LoadKeyPair(filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ln, err := transport.Listen("127.0.0.1:0", transport.ServerTLS(load(transport.DevCtlName), ca, transport.ALPNCtl), transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	b0 := load("b0")
	f := &fakeCtl{ln: ln, memberTLS: transport.ClientTLS(ca, &b0, "", transport.ALPNCtl), features: features}
	f.mp.Store(&shardmap.Map{Epoch: 1})
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.wg.Go(f.accept)
	t.Cleanup(func() {
		f.cancel()
		ln.Close()
		f.wg.Wait()
	})
	return f
}

func (f *fakeCtl) addr() string { return f.ln.Addr().String() }

// join registers b0 with f.
func (f *fakeCtl) join(t *testing.T) *Member {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := Join(ctx, MemberConfig{
		CtlAddr:    f.addr(),
		TLS:        f.memberTLS,
		Node:       transport.Register{NodeID: "b0", Addr: "127.0.0.1:7400"},
		LeaseTTL:   300 * time.Millisecond,
		MaxBackoff: 100 * time.Millisecond,
		Logger:     cmp.Or(f.logger, slog.New(slog.DiscardHandler)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func (f *fakeCtl) accept() {
	for {
		conn, err := f.ln.Accept(f.ctx)
		if err != nil {
			return
		}
		f.wg.Go(func() { f.serveConn(conn) })
	}
}

func (f *fakeCtl) serveConn(conn *quic.Conn) {
	for {
		str, err := conn.AcceptStream(f.ctx)
		if err != nil {
			return
		}
		f.wg.Go(func() { f.serveStream(str) })
	}
}

func (f *fakeCtl) serveStream(str *quic.Stream) {
	defer str.CancelRead(0)
	defer str.Close()
	r, w := transport.NewReader(str, MaxMapFrame), transport.NewWriter(str)
	first, err := r.Read()
	if err != nil {
		return
	}
	switch req := first.(type) {
	case *transport.Request:
		if req.Op == opMapGet {
			f.mapGets.Add(1)
			_ = w.Write(&transport.Response{Map: f.mp.Load()})
		}
	case *transport.Register:
		f.registrations.Add(1)
		if !f.withholdMaps.Load() {
			if w.Write(f.mapUpdate(f.mp.Load())) != nil || f.endRegistrations.Load() {
				return
			}
		}
		for {
			if _, err := r.Read(); err != nil {
				if handedOver(err) {
					f.handOvers.Add(1)
				}
				return
			}
			f.heartbeats.Add(1)
			if mp := f.slowMap.Swap(nil); mp != nil {
				if transport.NewWriter(slowWriter{str, f.slowChunk, f.slowEvery}).Write(f.mapUpdate(mp)) != nil {
					return
				}
				continue
			}
			var answer transport.Frame
			switch {
			case f.withholdMaps.Load():
			case f.answerWithMaps.Load():
				answer = f.mapUpdate(f.mp.Load())
			case f.answer.Load():
				answer = &transport.Heartbeat{NodeID: "b0", Epoch: f.mp.Load().Epoch}
			}
			if answer != nil && w.Write(answer) != nil {
				return
			}
		}
	}
}

// mapUpdate is mp as f pushes it, with its features and lease.
func (f *fakeCtl) mapUpdate(mp *shardmap.Map) *transport.MapUpdate {
	return &transport.MapUpdate{Map: mp, Features: f.features, LeaseTTL: time.Duration(f.lease.Load())}
}

// handedOver reports whether err, which ended the reads of a
// registration, is the member leaving for another ctl.
func handedOver(err error) bool {
	var se *quic.StreamError
	var ae *quic.ApplicationError
	return errors.As(err, &se) && se.Remote && se.ErrorCode == streamCodeHandOver ||
		errors.As(err, &ae) && ae.Remote && ae.ErrorCode == connCodeHandOver
}

// slowWriter writes to w chunk bytes at a time, every every.
type slowWriter struct {
	w     io.Writer
	chunk int
	every time.Duration
}

func (s slowWriter) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		k := min(s.chunk, len(b))
		m, err := s.w.Write(b[:k])
		n += m
		if err != nil {
			return n, err
		}
		b = b[k:]
		if len(b) > 0 {
			time.Sleep(s.every)
		}
	}
	return n, nil
}
