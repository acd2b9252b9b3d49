package broker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/transport"
)

// streamPair returns the two ends of one QUIC stream over loopback: the
// one that writes and a reader of the other.
func streamPair(t *testing.T) (*quic.Stream, *transport.Reader) {
	t.Helper()
	dir := t.TempDir()
	if err := transport.GenerateDevCerts(dir, "broker-0", "broker-1"); err != nil {
		t.Fatal(err)
	}
	server, err := cluster.LoadNodeTLS(dir, "broker-0")
	if err != nil {
		t.Fatal(err)
	}
	client, err := cluster.LoadNodeTLS(dir, "broker-1")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := quic.ListenAddr("127.0.0.1:0", server.Server, transport.Config{}.QUIC())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	conn, err := quic.DialAddr(ctx, ln.Addr().String(), client.Peer, transport.Config{}.QUIC())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.CloseWithError(0, "") })
	s, err := conn.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write([]byte{}); err != nil {
		t.Fatal(err)
	}
	sconn, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A stream is announced by its first frame: write the writer's first.
	w := newAckWriter(s, new(sync.WaitGroup), nil)
	w.send(&transport.Ack{Seq: 0})
	rs, err := sconn.AcceptStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := transport.NewReader(rs, transport.DefaultMaxFrame)
	if f, err := r.Read(); err != nil || f.(*transport.Ack).Seq != 0 {
		t.Fatalf("first frame %v, %v", f, err)
	}
	return s, r
}

// TestCorkedAnswers: answers written while a stream is corked stay
// unwritten, holding their slots, until the last uncork writes them
// together, in order; waitUncorked waits for it.
func TestCorkedAnswers(t *testing.T) {
	s, r := streamPair(t)
	var mu sync.Mutex
	freed := int64(0)
	w := newAckWriter(s, new(sync.WaitGroup), func(records, _ int64) {
		mu.Lock()
		freed += records
		mu.Unlock()
	})
	got := make(chan uint64, 16)
	go func() {
		for {
			f, err := r.Read()
			if err != nil {
				close(got)
				return
			}
			got <- f.(*transport.Ack).Seq
		}
	}()

	w.cork()
	w.cork() // two commits answering on one stream
	for seq := uint64(1); seq <= 3; seq++ {
		w.answer(&transport.Ack{Seq: seq}, 10)
	}
	w.uncork()
	select {
	case seq := <-got:
		t.Fatalf("ack %d written while a cork is held", seq)
	case <-time.After(50 * time.Millisecond):
	}
	mu.Lock()
	if freed != 0 {
		t.Fatalf("%d answers released while corked, want 0", freed)
	}
	mu.Unlock()
	waited := make(chan struct{})
	go func() {
		w.waitUncorked()
		close(waited)
	}()
	select {
	case <-waited:
		t.Fatal("waitUncorked returned while a cork is held")
	case <-time.After(20 * time.Millisecond):
	}
	w.uncork()
	<-waited
	for want := uint64(1); want <= 3; want++ {
		select {
		case seq := <-got:
			if seq != want {
				t.Fatalf("ack %d, want %d", seq, want)
			}
		case <-time.After(waitFor):
			t.Fatalf("ack %d not written after the last uncork", want)
		}
	}
	mu.Lock()
	if freed != 3 {
		t.Fatalf("%d answers released after uncork, want 3", freed)
	}
	mu.Unlock()
	// Uncorked, an answer is written at once.
	w.answer(&transport.Ack{Seq: 4}, 10)
	select {
	case seq := <-got:
		if seq != 4 {
			t.Fatalf("ack %d, want 4", seq)
		}
	case <-time.After(waitFor):
		t.Fatal("ack 4 not written")
	}
}
