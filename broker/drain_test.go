package broker

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestClosingBrokerAnswersEveryRecord: a publisher pipelining records
// into a broker that closes gracefully gets an answer to every record it
// sent: an ack, or a refusal that says nothing was written
// (shutting_down; unavailable once a forward's owner is down), never
// silence nor "may or may not have been written". The publisher acts as
// the SDK does: it stops sending and ends its side of the stream on the
// first refusal naming its own broker (Owner). Directly, and through a
// forwarder whose owner closes. Before the drain the broker stopped
// reading at once (STOP_SENDING): the records it had not read stayed
// unanswered, of unknown outcome to the publisher.
func TestClosingBrokerAnswersEveryRecord(t *testing.T) {
	for _, forwarded := range []bool{false, true} {
		name := "direct"
		if forwarded {
			name = "forwarded"
		}
		t.Run(name, func(t *testing.T) {
			ip := startInproc(t, 2, shardmap.StreamConfig{Name: "orders", Shards: 1})
			closing, via := ip.owner("orders", 0), ip.owner("orders", 0)
			if forwarded {
				via = ip.nonOwner("orders", 0)
			}
			run := pipelineThroughClose(t, via, closing, ip.dial(via))
			t.Logf("%s: %d sent, %d acked, %d refused (%s)", name, run.sent, len(run.acked), len(run.refused), run.codes())
			if run.sent <= 1000 {
				t.Fatalf("only %d records sent", run.sent)
			}
			if len(run.refused) == 0 {
				t.Errorf("no record refused: the close did not fall among the records sent")
			}
			for seq := uint64(1); seq <= run.sent; seq++ {
				_, acked := run.acked[seq]
				_, refused := run.refused[seq]
				if !acked && !refused {
					t.Errorf("record %d of %d got no answer before the stream ended (%v)", seq, run.sent, run.end)
					break
				}
			}
			for seq, e := range run.refused {
				if !errors.Is(e, transport.ErrShuttingDown) && !errors.Is(e, transport.ErrUnavailable) || strings.Contains(e.Message, "may or may not") {
					t.Fatalf("record %d refused with %v: want shutting_down, or unavailable saying nothing was written", seq, e)
				}
				if errors.Is(e, transport.ErrShuttingDown) && e.Owner != closing.NodeID() {
					t.Fatalf("record %d refused shutting_down naming %q; %s is the one closing", seq, e.Owner, closing.NodeID())
				}
			}

			// Restarted on its data, the closing broker has every acked
			// record where its ack said, and none of the refused.
			i := slices.Index(ip.brokers, closing)
			ip.brokers[i] = ip.startBroker(i)
			recs, err := ip.brokers[i].shards.mustLog(t, "orders", 0).Read(0, 1<<30, 1<<30)
			if err != nil {
				t.Fatal(err)
			}
			at := map[string]uint64{}
			for off, r := range recs {
				at[string(r.Value)] = uint64(off)
			}
			for seq, off := range run.acked {
				if got, ok := at[fmt.Sprint(seq)]; !ok || got != off {
					t.Fatalf("record %d acked at offset %d; in the log: %d, %v", seq, off, got, ok)
				}
			}
			for seq, e := range run.refused {
				if _, ok := at[fmt.Sprint(seq)]; ok {
					t.Fatalf("record %d was refused (%v) and is in the log", seq, e)
				}
			}
		})
	}
}

// pipelineRun is what a publisher was told in pipelineThroughClose.
type pipelineRun struct {
	sent    uint64                      // records 1..sent were written to the stream
	acked   map[uint64]uint64           // by Seq: the acked offset
	refused map[uint64]*transport.Error // by Seq
	end     error                       // how the stream ended
}

func (r *pipelineRun) codes() string {
	n := map[string]int{}
	for _, e := range r.refused {
		n[e.Code.String()]++
	}
	return fmt.Sprint(n)
}

// pipelineThroughClose publishes records 1, 2, ... (value: the Seq) on a
// stream of conn to via, pipelined, closes closing after 1,000 acks, and
// reads every answer until via ends the stream. The publisher ends its
// side of the stream once via refuses a record naming itself (as the SDK
// does), or once closing has closed.
func pipelineThroughClose(t *testing.T, via, closing *Broker, conn *quic.Conn) *pipelineRun {
	ws := openStream(t, conn)
	stop := make(chan struct{})
	sent := make(chan uint64, 1)
	window := make(chan struct{}, 512) // a token per record unanswered, as the SDK's WithMaxInFlight
	go func() {
		// The writer alone writes and closes the stream (quic-go's Close
		// must not run beside a Write).
		var n uint64
		defer func() {
			ws.s.Close()
			sent <- n
		}()
		for i := uint64(1); ; i++ {
			select {
			case <-stop:
				return
			case window <- struct{}{}:
			}
			if err := ws.w.Buffer(publish(i, "orders", fmt.Sprint(i))); err != nil {
				return
			}
			if i%16 == 0 || len(window) == cap(window) {
				if ws.w.Flush() != nil {
					return
				}
				n = i
			}
		}
	}()
	run := &pipelineRun{acked: map[uint64]uint64{}, refused: map[uint64]*transport.Error{}}
	var closed chan error // Close's result, once closing closes
	closeDone := false
	stopped := false
	stopWriter := func() {
		if !stopped {
			stopped = true
			close(stop)
		}
	}
	defer stopWriter()
	for {
		ws.s.SetReadDeadline(time.Now().Add(waitFor))
		f, err := ws.r.Read()
		if err != nil {
			run.end = err
			var aerr *quic.ApplicationError
			if !errors.Is(err, io.EOF) && !(errors.As(err, &aerr) && via == closing) {
				t.Fatalf("publisher stream through %s ended with %v", via.NodeID(), err)
			}
			break
		}
		switch f := f.(type) {
		case *transport.Ack:
			run.acked[f.Seq] = f.Offset
		case *transport.Error:
			if f.Seq != 0 {
				run.refused[f.Seq] = f
			}
			if errors.Is(f, transport.ErrShuttingDown) && f.Owner == via.NodeID() {
				stopWriter()
			}
		}
		select {
		case <-window:
		default:
		}
		if len(run.acked) == 1000 && closed == nil {
			closed = make(chan error, 1)
			go func() { closed <- closing.Close() }()
		}
		if closed != nil && !closeDone && len(closed) > 0 {
			closeDone = true
			if err := <-closed; err != nil {
				t.Fatal(err)
			}
			stopWriter()
		}
	}
	stopWriter()
	run.sent = <-sent
	if closed != nil && !closeDone {
		if err := <-closed; err != nil {
			t.Fatal(err)
		}
	}
	return run
}
