package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestChangeCutByDeadlineIsUnknown: an admin change written to a broker
// that does not answer before ctx ends may have been made (the broker
// may have relayed it): the error matches ErrConnectionLost as well as
// ctx's. One whose ctx ended before it was written does not.
func TestChangeCutByDeadlineIsUnknown(t *testing.T) {
	fc := newFakeCluster(t, 1)
	c := connect(t, fc, 0)
	fc.brokers[0].hangRequests.Store(true)
	ctx, cancel := context.WithTimeout(testCtx(t), 300*time.Millisecond)
	defer cancel()
	err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "s", Shards: 1})
	t.Logf("CreateStream: %v", err)
	if !errors.Is(err, ErrConnectionLost) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a change sent and unanswered by its deadline: want an error matching ErrConnectionLost and context.DeadlineExceeded, got %v", err)
	}

	done, cancel2 := context.WithCancel(testCtx(t))
	cancel2()
	err = c.DeleteStream(done, "s")
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrConnectionLost) {
		t.Fatalf("a change whose ctx ended before it was sent: want context.Canceled alone, got %v", err)
	}
}

// TestChangeRelayUnavailable: a broker answers unavailable when its relay
// to the control plane fails. Whether the change may have been made
// depends on where it failed: after the broker sent it (no answer read:
// the ctl may have made it) or a ctl that could not commit it to etcd
// (it says it may have been made) leaves the outcome unknown; a broker
// that could not reach the control plane at all made nothing.
func TestChangeRelayUnavailable(t *testing.T) {
	fc := newFakeCluster(t, 1)
	c := connect(t, fc, 0)
	ctx := testCtx(t)
	// Brokers that do not pass request IDs on: each change is sent once.
	fc.clearFeatures()
	if _, err := c.Map(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		msg     string
		unknown bool
	}{
		// broker/admin.go's messages around ctlclient.Request's errors.
		{"broker-0 could not reach the control plane: ctl: request stream.create: read response: context deadline exceeded", true},
		{"broker-0 could not reach the control plane: ctl: request stream.create: read response: timeout: no recent network activity", true},
		{"broker-0 could not reach the control plane: ctl: request stream.create: not connected to ctl: context deadline exceeded", false},
		{"broker-0 could not reach the control plane: ctl: request stream.create: open stream: context deadline exceeded", false},
		// ctl's own answers.
		{"stream create s: not committed to etcd, and it may have been made (send it again with its request ID to learn which): context deadline exceeded", true},
		{"stream.create: the control plane has no reachable leader (is a majority of its etcd members up?): ctl: request stream.create: read response: timeout: no recent network activity", true},
		{"stream.create: the control plane has no reachable leader (is a majority of its etcd members up?): no ctl leader elected", false},
		{"stream create s: this ctl lost its leadership; retry: conflict", false},
	} {
		fc.brokers[0].refuseChanges.Store(&transport.Error{Code: transport.CodeUnavailable, Message: tc.msg})
		err := c.CreateStream(ctx, shardmap.StreamConfig{Name: "s", Shards: 1})
		if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrConnectionLost) != tc.unknown {
			t.Errorf("answer %q: got %v; want ErrUnavailable, and ErrConnectionLost %v", tc.msg, err, tc.unknown)
		}
	}
}
