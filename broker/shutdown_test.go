package broker

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestGracefulShutdownAcksWhatItCommits: publishes pipelined into a broker
// that shuts down each get an ack or a clear error, every acked record is
// there after a restart on the same data, and offsets continue.
func TestGracefulShutdownAcksWhatItCommits(t *testing.T) {
	ip := startInproc(t, 1, shardmap.StreamConfig{Name: "orders", Shards: 1})
	b := ip.brokers[0]
	ws := openStream(t, ip.dial(b))
	const n = 3000
	w := ws.w
	go func() {
		for i := range n {
			if w.Write(publish(uint64(i), "orders", fmt.Sprint(i))) != nil {
				return
			}
		}
	}()
	acked := map[uint64]string{} // offset -> value
	closed := make(chan error, 1)
	for i := 0; ; i++ {
		if i == 200 {
			go func() { closed <- b.Close() }()
		}
		f, err := ws.r.Read()
		if err != nil {
			var serr *quic.StreamError
			var aerr *quic.ApplicationError
			if !errors.Is(err, io.EOF) && !errors.As(err, &serr) && !errors.As(err, &aerr) {
				t.Fatalf("stream ended with %v", err)
			}
			break
		}
		switch f := f.(type) {
		case *transport.Ack:
			acked[f.Offset] = fmt.Sprint(f.Seq)
		case *transport.Error:
			if !errors.Is(f, transport.ErrShuttingDown) {
				t.Fatalf("unexpected error during shutdown: %v", f)
			}
		}
	}
	if err := <-closed; err != nil {
		t.Fatalf("close: %v", err)
	}
	if len(acked) < 200 {
		t.Fatalf("only %d acks before shutdown", len(acked))
	}

	b = ip.startBroker(0)
	ip.brokers[0] = b
	l := ip.logOf(b, "orders", 0)
	for off, want := range acked {
		recs, err := b.shards.mustLog(t, "orders", 0).Read(off, 1, 1<<20)
		if err != nil || len(recs) != 1 || string(recs[0].Value) != want {
			t.Fatalf("acked offset %d (value %s) after restart: %v %v", off, want, recs, err)
		}
	}
	next := l.NextOffset()
	// A new variable: the writer goroutine above read ws, with no sync
	// after it returned (the race detector saw it once).
	again := openStream(t, ip.dial(b))
	again.send(publish(1, "orders", "after restart"))
	if a := wantAck(t, again.recv(), 1); a.Offset != next {
		t.Fatalf("offset after restart %d, want %d", a.Offset, next)
	}
}
