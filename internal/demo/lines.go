package demo

import (
	"fmt"

	"github.com/felix-broker/felix/client"
)

// Published returns the line that says which path a record took, word
// for word as the seed prints it (where it landed, shard and offset, is
// in felixctl pub --json, and in the subscriber's lines):
//
//	published "hello" to orders via broker-0 → forwarded to broker-2 → acknowledged
//	published "direct" to orders via broker-2 (the owner) — written locally, no hop
func Published(value string, ack client.Ack) string {
	if ack.Forwarded {
		return fmt.Sprintf("published %q to %s via %s → forwarded to %s → acknowledged", value, ack.Stream, ack.Via, ack.Owner)
	}
	return fmt.Sprintf("published %q to %s via %s (the owner) — written locally, no hop", value, ack.Stream, ack.Via)
}

// Received returns the line a subscriber prints for one record:
//
//	received "hello" from orders (shard 0, offset 0)
func Received(rec client.Record) string {
	return fmt.Sprintf("received %q from %s (shard %d, offset %d)", rec.Value, rec.Stream, rec.Shard, rec.Offset)
}

// Why is the seed's explanation of why twenty-four records published
// concurrently arrive in an order that differs from the order sent.
const Why = "That is correct rather than a defect: concurrent publishes through different brokers have no defined relative order, and the owner assigns offsets as it commits them. Felix orders a publisher’s own sequence, not a race between three of them."
