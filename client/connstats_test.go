package client

import (
	"testing"
)

// TestConnStatsAcrossRedial checks that ConnStats names the broker, counts
// what the connection carried, and keeps counting across a redial: the
// counters never go back, Dials says how many connections there were.
func TestConnStatsAcrossRedial(t *testing.T) {
	fc, c, ctx := withStream(t)
	b := fc.brokers[0]
	for range 20 {
		if _, err := c.Publish(ctx, "s", nil, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	st := c.ConnStats()
	if len(st) != 1 {
		t.Fatalf("want one broker's stats, got %+v", st)
	}
	first := st[0]
	if first.Broker != c.Addr() || !first.Connected || first.Dials != 1 {
		t.Fatalf("want the connected broker %s dialed once, got %+v", c.Addr(), first)
	}
	// 20 publishes and their acks, at least a packet each way apiece.
	if first.PacketsSent < 20 || first.PacketsReceived < 20 || first.BytesSent == 0 || first.SmoothedRTT <= 0 || first.MinRTT <= 0 || first.CongestionWindow == 0 {
		t.Fatalf("counters of a connection that carried 20 publishes: %+v", first)
	}

	b.restart(t)
	for {
		_, err := c.Publish(ctx, "s", nil, []byte("after"))
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatal(err)
		}
	}
	after := c.ConnStats()[0]
	if after.Dials != 2 || !after.Connected {
		t.Fatalf("after the broker restarted: want 2 dials and a connection, got %+v", after)
	}
	if after.PacketsSent <= first.PacketsSent || after.PacketsReceived <= first.PacketsReceived || after.BytesSent <= first.BytesSent {
		t.Fatalf("counters went back across the redial: before %+v, after %+v", first, after)
	}

	_ = c.Close()
	closed := c.ConnStats()[0]
	if closed.Connected || closed.PacketsSent < after.PacketsSent {
		t.Fatalf("after Close: want no connection and the counters kept, got %+v (before %+v)", closed, after)
	}
}

// TestConnStatsCountSubscriptionConnections: a subscription reads over
// connections of its own; the broker's ConnStats add theirs, while the
// subscription runs and after it ended.
func TestConnStatsCountSubscriptionConnections(t *testing.T) {
	_, c, ctx := withStream(t)
	publishN(t, c, "s", 0, 0, 10)
	before := c.ConnStats()[0]
	sub, err := c.Subscribe(ctx, "s", Earliest())
	if err != nil {
		t.Fatal(err)
	}
	collect(t, sub, 10)
	during := c.ConnStats()
	if len(during) != 1 || during[0].Dials != before.Dials+1 || during[0].PacketsReceived <= before.PacketsReceived || !during[0].Connected {
		t.Fatalf("with a subscription running: %+v; before it %+v", during, before)
	}
	sub.Stop()
	after := c.ConnStats()
	if len(after) != 1 || after[0].Dials != during[0].Dials || after[0].PacketsReceived < during[0].PacketsReceived {
		t.Fatalf("after the subscription stopped: %+v; while it ran %+v", after, during)
	}
}
