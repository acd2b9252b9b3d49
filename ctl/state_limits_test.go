package ctl

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestCreateStreamNames: names that are unsafe as a directory name are
// refused as invalid, on the wire too, and change nothing.
func TestCreateStreamNames(t *testing.T) {
	s := threeNodes(t)
	if err := s.createStream(shardmap.StreamConfig{Name: "0", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	epoch := s.Map().Epoch
	for _, name := range []string{".", "..", ".hidden", "a/b", "../x", `a\b`, "a\x00b", "ünï", "ORDERS/../0"} {
		err := s.createStream(shardmap.StreamConfig{Name: name, Shards: 1})
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("create %q: err=%v, want ErrInvalid", name, err)
		}
		if we := wireError(err); we.Code != transport.CodeInvalid {
			t.Errorf("create %q: wire code %v, want invalid", name, we.Code)
		}
	}
	if s.Map().Epoch != epoch || len(s.Map().Streams) != 1 {
		t.Fatalf("refused creates changed the map: epoch %d -> %d, %d streams", epoch, s.Map().Epoch, len(s.Map().Streams))
	}
}

// TestCreateStreamCaseFold: a name that differs from an existing one only
// in case is refused (on a case-insensitive filesystem both would share a
// directory), without naming the existing stream, which the caller may not
// be allowed to see (grant patterns are case-sensitive); distinct names
// that are prefixes of each other are fine.
func TestCreateStreamCaseFold(t *testing.T) {
	s := threeNodes(t)
	for _, name := range []string{"orders", "order", "orders2", "0", "00"} {
		if err := s.createStream(shardmap.StreamConfig{Name: name, Shards: 1}); err != nil {
			t.Fatalf("create %q: %v", name, err)
		}
	}
	if err := s.createStream(shardmap.StreamConfig{Name: "Orders", Shards: 1}); !errors.Is(err, ErrInvalid) || strings.Contains(err.Error(), `"orders"`) {
		t.Fatalf("create Orders next to orders: err=%v, want ErrInvalid not naming the existing stream", err)
	}
}

// TestCreateStreamShardLimit: streams are created until their shards
// would pass maxShardsTotal; the one that would is refused with
// CodeLimitExceeded, and deleting a stream makes room again.
func TestCreateStreamShardLimit(t *testing.T) {
	s := threeNodes(t)
	if s.maxShardsTotal != 0 {
		t.Fatal("a bare state should use the default")
	}
	// The default: 20 streams of 4096 shards (the attack that ran brokers
	// out of file descriptors) stop at the fifth.
	created := 0
	var err error
	for i := range 20 {
		if err = s.createStream(shardmap.StreamConfig{Name: fmt.Sprintf("big%d", i), Shards: shardmap.MaxShards}); err != nil {
			break
		}
		created++
	}
	if created != DefaultMaxShardsTotal/shardmap.MaxShards {
		t.Fatalf("created %d streams of %d shards, want %d", created, shardmap.MaxShards, DefaultMaxShardsTotal/shardmap.MaxShards)
	}
	if !errors.Is(err, ErrLimitExceeded) {
		t.Fatalf("err=%v, want ErrLimitExceeded", err)
	}
	if we := wireError(err); we.Code != transport.CodeLimitExceeded || !errors.Is(we, ErrLimitExceeded) {
		t.Fatalf("wire error %v (code %v), want limit_exceeded matching ErrLimitExceeded", we, we.Code)
	}

	s = threeNodes(t)
	s.maxShardsTotal = 10
	if err := s.createStream(shardmap.StreamConfig{Name: "a", Shards: 6}); err != nil {
		t.Fatal(err)
	}
	if err := s.createStream(shardmap.StreamConfig{Name: "b", Shards: 5}); !errors.Is(err, ErrLimitExceeded) {
		t.Fatalf("create past the limit: err=%v", err)
	}
	if err := s.createStream(shardmap.StreamConfig{Name: "b", Shards: 4}); err != nil {
		t.Fatalf("create up to the limit: %v", err)
	}
	if err := s.deleteStream("a"); err != nil {
		t.Fatal(err)
	}
	if err := s.createStream(shardmap.StreamConfig{Name: "c", Shards: 6}); err != nil {
		t.Fatalf("create after a delete made room: %v", err)
	}
}
