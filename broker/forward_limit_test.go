package broker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// startMixedLimits starts two brokers whose record limits differ, as
// during a rolling change of --max-record-bytes: broker 0 takes records
// of up to large bytes, broker 1 of up to small. It returns the two and
// a shard of orders that broker 1 owns.
func startMixedLimits(t *testing.T, small, large int) (ip *inproc, fwd, owner *Broker, shard int) {
	t.Helper()
	ip = startInprocWith(t, func(c *Config) {
		c.MaxPayload = large
		if c.NodeID == cluster.BrokerID(1) {
			c.MaxPayload = small
		}
	}, 2, shardmap.StreamConfig{Name: "orders", Shards: 8})
	fwd, owner = ip.brokers[0], ip.brokers[1]
	for s := range 8 {
		if ip.owner("orders", s) == owner {
			return ip, fwd, owner, s
		}
	}
	t.Fatalf("%s owns no shard of orders", owner.NodeID())
	return
}

// TestForwardOverOwnersRecordLimit: brokers with different MaxPayload. A
// record within the receiving broker's limit but over the owner's is
// refused alone, with the payload_too_large a direct publish to the
// owner gets, naming the owner's limit; the records around it on the same
// forwarding lane are committed, and the lane's pooled connection to the
// owner goes on. Whether the record is the first on its lane or not, and
// however far over the owner's frame limit it is (up to the forwarder's
// own limit). The lane used to be ended by the owner for such a record
// (the first frame on a lane, or one far over the owner's frame limit),
// failing every record on it with an unknown outcome and retiring the
// pooled connection, or the record was refused with a message naming
// the owner's frame limit rather than its record limit.
func TestForwardOverOwnersRecordLimit(t *testing.T) {
	const small, large = 64 << 10, 2 << 20
	ip, fwd, owner, shard := startMixedLimits(t, small, large)
	conn := ip.dial(fwd)
	written := uint64(0)
	sizes := []int{
		small + 1,                        // decodes on the owner
		owner.cfg.Transport.MaxFrame + 1, // over the owner's frame limit
		8 * owner.cfg.Transport.MaxFrame, // far over it
		large - 1<<10,                    // near the forwarder's own limit
	}
	for _, size := range sizes {
		for _, first := range []bool{true, false} {
			t.Run(fmt.Sprintf("%d bytes, first on the lane %v", size, first), func(t *testing.T) {
				pooled := fwd.peers.pooled(owner.NodeID())
				ws := openStream(t, conn)
				ws.w.SetMaxFrame(fwd.cfg.Transport.MaxFrame)
				const n = 40 // small records beside the big one
				bigSeq := uint64(n / 2)
				if first {
					bigSeq = 0
				}
				for i := range n + 1 {
					seq := uint64(i)
					value := []byte("small")
					if seq == bigSeq {
						value = make([]byte, size)
					}
					if err := ws.w.Buffer(&transport.Publish{Seq: seq, Stream: "orders", Shard: int32(shard), Value: value}); err != nil {
						t.Fatal(err)
					}
				}
				if err := ws.w.Flush(); err != nil {
					t.Fatal(err)
				}
				var lost []string
				for range n + 1 {
					switch f := ws.recv().(type) {
					case *transport.Ack:
						if f.Seq == bigSeq {
							t.Fatalf("the record of %d bytes was acked by %s, whose limit is %d", size, f.Owner, small)
						}
						written++
					case *transport.Error:
						if f.Seq != bigSeq {
							lost = append(lost, fmt.Sprintf("seq %d: %v", f.Seq, f))
							continue
						}
						if !errors.Is(f, transport.ErrPayloadTooLarge) || !strings.Contains(f.Message, strconv.Itoa(small)) {
							t.Errorf("the record over the owner's limit got %v, want payload_too_large naming the owner's limit of %d", f, small)
						}
					}
				}
				if len(lost) > 0 {
					t.Fatalf("%d of the %d small records on the lane failed, as:\n%s", len(lost), n, strings.Join(lost[:min(2, len(lost))], "\n"))
				}
				if got := ip.logOf(owner, "orders", shard).NextOffset(); got != written {
					t.Fatalf("the owner's log holds %d records, want the %d small ones", got, written)
				}
				if pooled != nil && fwd.peers.pooled(owner.NodeID()) != pooled {
					t.Fatal("the pooled connection to the owner was replaced")
				}
			})
		}
	}
}

// TestForwardedTooLargeIsTheSDKsError: through the SDK the record over
// the owner's limit fails with client.ErrPayloadTooLarge, forwarded or
// published to the owner directly, with the same message, and the
// publisher goes on.
func TestForwardedTooLargeIsTheSDKsError(t *testing.T) {
	const small, large = 64 << 10, 2 << 20
	ip, _, owner, shard := startMixedLimits(t, small, large)
	key := keyFor(t, shard, 8)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	var msgs []string
	for _, home := range []*Broker{ip.brokers[0], owner} {
		c := ip.sdkAt(t, home)
		pub, err := c.Publisher(ctx, "orders")
		if err != nil {
			t.Fatal(err)
		}
		_, err = pub.Publish(ctx, key, make([]byte, 4*small))
		var berr *client.BrokerError
		if !errors.Is(err, client.ErrPayloadTooLarge) || !errors.As(err, &berr) {
			t.Fatalf("through %s: %v, want payload_too_large", home.NodeID(), err)
		}
		msgs = append(msgs, berr.Message)
		if _, err := pub.Publish(ctx, key, []byte("fits")); err != nil {
			t.Fatalf("through %s, after the refusal: %v", home.NodeID(), err)
		}
	}
	t.Log(msgs[0])
	if msgs[0] != msgs[1] || !strings.Contains(msgs[0], strconv.Itoa(small)) {
		t.Fatalf("forwarded: %q\ndirect: %q\nwant the same message, naming the owner's limit of %d", msgs[0], msgs[1], small)
	}
}

// keyFor returns a key that goes to shard of a stream of shards shards.
func keyFor(t *testing.T, shard, shards int) []byte {
	t.Helper()
	for i := range 10000 {
		if k := []byte(strconv.Itoa(i)); shardmap.ShardFor(k, shards) == shard {
			return k
		}
	}
	t.Fatalf("no key for shard %d", shard)
	return nil
}

// TestReplicatedEntryOverFollowersLimit: a leader whose record limit is
// larger than its followers' (a rolling change of --max-record-bytes)
// replicates a record over their raft frame limit: the followers take
// the entry (they do not refuse what their group's leader committed to
// its log), the record is acked, and the shard goes on. Their raft frame
// limit was derived from their own record limit, so they ended the raft
// stream the entry came on, every time the leader sent it again, and the
// record was never committed.
func TestReplicatedEntryOverFollowersLimit(t *testing.T) {
	const small, large = 64 << 10, 6 << 20
	ip := startInprocWith(t, func(c *Config) {
		c.MaxPayload, c.CommitTimeout = small, 5*time.Second
		if c.NodeID == cluster.BrokerID(0) {
			c.MaxPayload = large
		}
	}, 3, shardmap.StreamConfig{Name: "r3", Shards: 8, Replicas: 3})
	leader, m := ip.brokers[0], ip.ctl.Map()
	st, _ := m.Stream("r3")
	shard := -1
	for s := range 8 {
		if st.Placement.Owner(s) == leader.NodeID() {
			shard = s
			break
		}
	}
	if shard < 0 {
		t.Fatalf("%s is the placed leader of no shard of r3", leader.NodeID())
	}
	id := shardmap.ShardID{Stream: "r3", Shard: shard}
	waitOwnerLeads(t, ip, ip.brokers, id)
	// Over four entries of a follower's own size: the raft frame limit a
	// follower derived from its own record limit.
	big := 5 << 20
	if own := 4*entryBytes(ip.brokers[1].cfg) + 64<<10; big <= own {
		t.Fatalf("a %d-byte record fits in a follower's own raft frame limit (%d)", big, own)
	}
	// A leadership that moved to a follower meanwhile (an election on a
	// loaded machine) has the record forwarded there and refused by the
	// follower's own limit, nothing written: then the owner is waited for
	// again and the record sent again, on a new stream.
	for attempt := 1; ; attempt++ {
		ws := openStream(t, ip.dial(leader))
		ws.w.SetMaxFrame(leader.cfg.Transport.MaxFrame)
		ws.send(&transport.Publish{Seq: 1, Stream: "r3", Shard: int32(shard), Value: make([]byte, big)})
		f := ws.recv()
		if e, ok := f.(*transport.Error); ok && e.Code == transport.CodePayloadTooLarge && attempt < 3 &&
			!strings.Contains(e.Message, "limit of "+leader.NodeID()+",") {
			t.Logf("attempt %d: %v: another broker than %s led %s; again", attempt, e, leader.NodeID(), id)
			ws.s.Close()
			waitOwnerLeads(t, ip, ip.brokers, id)
			continue
		}
		wantAck(t, f, 1)
		ws.send(&transport.Publish{Seq: 2, Stream: "r3", Shard: int32(shard), Value: []byte("small")})
		wantAck(t, ws.recv(), 2)
		break
	}
	for _, b := range ip.brokers {
		e := groupOf(b, id)
		deadline := time.Now().Add(waitFor)
		for e.sl.NextOffset() < 2 {
			if time.Now().After(deadline) {
				t.Fatalf("%s holds %d records of %s, want 2", b.NodeID(), e.sl.NextOffset(), id)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestForwardedRecordAtTheLimit: an idempotent publisher's record of
// exactly the record limit is acked whether it is published to the
// owner or through another broker of the same limit. The receiving
// broker scopes the producer id by the client's principal, and the owner
// counted the scoped id toward the limit: the forwarded record was
// refused payload_too_large, the same record sent to the owner acked.
func TestForwardedRecordAtTheLimit(t *testing.T) {
	const limit = 64 << 10
	ip, fwd, owner, shard := startMixedLimits(t, limit, limit)
	for i, b := range []*Broker{owner, fwd} {
		id := fmt.Sprint("producer-", i)
		ws := openStream(t, ip.dial(b))
		ws.send(&transport.Publish{Seq: 1, Stream: "orders", Shard: int32(shard), ProducerID: id, ProducerSeq: 1,
			Key: []byte("k"), Value: make([]byte, limit-1-len(id))})
		if f, ok := ws.recv().(*transport.Error); ok {
			t.Fatalf("a record of the limit's size, through %s: %v", b.NodeID(), f)
		}
	}
}
