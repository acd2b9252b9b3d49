package ctl

import (
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/ctl/ctlclient"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// The map every broker is sent is one frame of at most
// ctlclient.MaxMapFrame bytes, holding every member, stream and grant. A
// map past it cannot be sent to any broker: each registration's writer
// fails to encode it and ends the registration, and every broker goes
// down and registers again in a loop. So an admin change whose map would
// pass maxMapBytes is refused before it is committed (checkMapSize, from
// Server.changeOrForward, which every admin change goes through), with a
// margin under the frame limit for the changes ctl cannot refuse: members
// joining or coming back, the epoch growing.

// defaultMaxMapBytes is the largest map frame an admin change may make
// (Knobs.MaxMapBytes): ctlclient.MaxMapFrame less a sixteenth (4 MiB,
// the members of thousands of brokers).
const defaultMaxMapBytes = ctlclient.MaxMapFrame - ctlclient.MaxMapFrame/16

// MapTooLargeError is the error of an admin change refused because the
// map it would make, which every broker is sent whole, would be larger
// than ctl allows. It matches ErrLimitExceeded; on the wire it is
// CodeLimitExceeded.
type MapTooLargeError struct {
	// Bytes is the length of the frame the map would be sent in.
	Bytes int
	// Limit is the largest frame an admin change may make: the map frame
	// limit (ctlclient.MaxMapFrame) less a margin.
	Limit int
}

func (e *MapTooLargeError) Error() string {
	return fmt.Sprintf("%v: the change would make the map every broker is sent %.1f MiB (%d bytes), over its limit of %.1f MiB (%d bytes: the map frame limit of %d MiB less a margin); revoke grants or delete streams first",
		ErrLimitExceeded, mib(e.Bytes), e.Bytes, mib(e.Limit), e.Limit, ctlclient.MaxMapFrame>>20)
}

// Unwrap makes the error match ErrLimitExceeded.
func (e *MapTooLargeError) Unwrap() error { return ErrLimitExceeded }

func mib(n int) float64 { return float64(n) / (1 << 20) }

// checkMapSize refuses the change made since the map before: with a
// *MapTooLargeError if it made the map's frame longer than maxMapBytes
// and longer than before's. A change that does not grow the map is never
// refused, so that one making room (a revoke, a delete) goes through
// even when the map is over the limit already (the limit lowered, or
// members joined).
func (s *state) checkMapSize(before *shardmap.Map) error {
	limit := s.maxMapBytes
	if limit <= 0 || limit > defaultMaxMapBytes {
		limit = defaultMaxMapBytes
	}
	n, err := s.sizer.frameBytes(s.cur)
	if err != nil {
		return fmt.Errorf("ctl: measuring the map of epoch %d: %w", s.epoch, err)
	}
	if n <= limit {
		return nil
	}
	// Over the limit: measured once more, before the change, which is rare
	// (it costs an encode of the map without its grants).
	if was, err := s.sizer.frameBytes(before); err == nil && n <= was {
		return nil
	}
	return &MapTooLargeError{Bytes: n, Limit: limit}
}

// mapSizer measures the frame a map is pushed to brokers in (a
// transport.MapUpdate, as writeMaps sends it) without encoding the whole
// map at every change. The map is its grants and the rest (members,
// streams, superusers); a grant's encoding is known from the lengths of
// its strings (grantsBytes), and the rest is encoded only when it
// changed: its frame length is kept for the nodes and streams slices it
// was measured with (the maps of a state share them until members or
// streams change: see state.bumpPolicy). So a grant or revoke costs a
// pass over the grants' lengths (well under a millisecond for 100,000)
// instead of an encode of up to 64 MiB (about 0.6s); a stream change or
// one of members costs one encode of the map without its grants (20ms
// for 16,384 streams of 3 replicas) the first time it is measured.
//
// The length is exact but for the epoch, counted as its longest
// encoding (8 bytes more at most).
type mapSizer struct {
	valid      bool
	nodes      []shardmap.Node
	streams    []shardmap.Stream
	superusers []string
	cluster    string
	// rest is the frame length of the map with no grants.
	rest int
}

// frameBytes returns the length N (type byte and body) of the frame m
// is pushed in.
func (z *mapSizer) frameBytes(m *shardmap.Map) (int, error) {
	var superusers []string
	var grants []auth.Grant
	if m.ACL != nil {
		superusers, grants = m.ACL.Superusers, m.ACL.Grants
	}
	if !z.valid || !sameSlice(z.nodes, m.Nodes) || !sameSlice(z.streams, m.Streams) || !slices.Equal(z.superusers, superusers) || z.cluster != m.Cluster {
		// The longest epoch and lease, and a policy with no grants (a
		// nil slice, one byte), whose bytes grantsBytes replaces. A map
		// with no policy (omitted) is counted as one with an empty
		// policy.
		probe := &shardmap.Map{Epoch: math.MaxUint64, Nodes: m.Nodes, Streams: m.Streams, ACL: &auth.Policy{Superusers: superusers}, Cluster: m.Cluster}
		b, err := transport.AppendFrame(nil, &transport.MapUpdate{Map: probe, Features: transport.Features(), LeaseTTL: math.MaxInt64})
		if err != nil {
			return 0, err
		}
		*z = mapSizer{valid: true, nodes: m.Nodes, streams: m.Streams, superusers: superusers, cluster: m.Cluster, rest: len(b) - 4}
	}
	return z.rest - 1 + grantsBytes(grants), nil
}

// sameSlice reports whether a and b are the same slice: the same
// elements in the same memory (maps are immutable, so the same content).
func sameSlice[T any](a, b []T) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// grantsBytes returns the length of the msgpack encoding of grants, as a
// Policy's Grants: an array header, and for each grant the encoding of a
// Grant with empty strings (measured once, with the encoder the
// transport uses) plus its strings' bytes and the longer string headers
// they need past 31 bytes.
func grantsBytes(grants []auth.Grant) int {
	n := arrayHeaderBytes(len(grants))
	empty := emptyGrantBytes()
	for _, g := range grants {
		n += empty + extraStrBytes(len(g.Principal)) + extraStrBytes(len(g.Action)) + extraStrBytes(len(g.Pattern))
	}
	return n
}

// emptyGrantBytes is the length of the msgpack encoding of auth.Grant{}.
var emptyGrantBytes = sync.OnceValue(func() int {
	b, err := msgpack.Marshal(auth.Grant{})
	if err != nil {
		panic(fmt.Sprintf("ctl: encoding an empty grant: %v", err))
	}
	return len(b)
})

// extraStrBytes is how much longer the msgpack encoding of a string of n
// bytes is than that of an empty string (one byte): its bytes, and a
// longer header past fixstr.
func extraStrBytes(n int) int {
	switch {
	case n < 32:
		return n // fixstr
	case n < 1<<8:
		return n + 1 // str8
	case n < 1<<16:
		return n + 2 // str16
	}
	return n + 4 // str32
}

// arrayHeaderBytes is the length of the msgpack header of an array of n
// elements.
func arrayHeaderBytes(n int) int {
	switch {
	case n < 16:
		return 1 // fixarray
	case n < 1<<16:
		return 3 // array16
	}
	return 5 // array32
}
