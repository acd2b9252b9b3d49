package client

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestAdminAnswersOverDefaultFrame: answers carrying a map over
// transport.DefaultMaxFrame (4 MiB) and within transport.MaxMapFrame, as
// a broker sends for a cluster of many shards, are read: the SDK read
// them with the 4 MiB limit of its publish and subscribe streams, and
// Map, ClusterStatus and the rest failed with the connection "lost".
func TestAdminAnswersOverDefaultFrame(t *testing.T) {
	fc := newFakeCluster(t, 1)
	c := connect(t, fc, 0)
	ctx := testCtx(t)
	// Three streams of 3,700 shards, each replicated on three nodes of
	// 128-byte ids (the longest allowed): 390 bytes a shard.
	var ids []string
	for i := range 3 {
		ids = append(ids, fmt.Sprintf("n%d.", i)+strings.Repeat("z", 125))
	}
	sets := make([][]string, 3700)
	for s := range sets {
		sets[s] = ids
	}
	fc.mu.Lock()
	m := *fc.mu.m
	m.Epoch++
	for i := range 3 {
		m.Streams = append(m.Streams, shardmap.Stream{StreamConfig: shardmap.StreamConfig{Name: fmt.Sprintf("big-%d", i), Shards: len(sets), Replicas: 3},
			Placement: shardmap.NewReplicatedPlacement(sets...)})
	}
	fc.mu.m = &m
	fc.mu.Unlock()
	frame, err := transport.AppendFrame(nil, &transport.Response{Map: &m})
	if err != nil || len(frame) <= transport.DefaultMaxFrame {
		t.Fatalf("the map's frame is %d bytes (%v): not over the default limit of %d, the test proves nothing", len(frame), err, transport.DefaultMaxFrame)
	}

	got, err := c.Map(ctx)
	if err != nil {
		t.Fatalf("Map: %v", err)
	}
	if got.Epoch != m.Epoch || len(got.Streams) != 3 {
		t.Fatalf("Map: epoch %d with %d streams; want epoch %d with 3", got.Epoch, len(got.Streams), m.Epoch)
	}
	if _, err := c.ClusterStatus(ctx); err != nil {
		t.Fatalf("ClusterStatus: %v", err)
	}
}

// TestAdminAnswerTooLarge: an answer over transport.MaxMapFrame is
// refused with a frame_too_large error, not reported as a connection lost
// with an unknown outcome (and a change is not sent again); an answer that
// announces a frame within the limit and then ends makes the SDK buffer
// what arrived, not what was announced.
func TestAdminAnswerTooLarge(t *testing.T) {
	fc := newFakeCluster(t, 1)
	c := connect(t, fc, 0)
	ctx := testCtx(t)
	header := func(n int) []byte {
		b := binary.BigEndian.AppendUint32(nil, uint32(n))
		return append(b, byte(transport.FrameResponse))
	}

	over := header(transport.MaxMapFrame + 1)
	fc.brokers[0].rawAnswer.Store(&over)
	if _, err := c.Map(ctx); !errors.Is(err, transport.ErrFrameTooLarge) || errors.Is(err, ErrConnectionLost) {
		t.Errorf("Map with an answer over the limit: %v; want frame_too_large, not a lost connection", err)
	}
	if err := c.DeleteStream(ctx, "s"); !errors.Is(err, transport.ErrFrameTooLarge) || errors.Is(err, ErrConnectionLost) {
		t.Errorf("DeleteStream with an answer over the limit: %v; want frame_too_large, not a lost connection", err)
	}

	cut := append(header(transport.MaxMapFrame), make([]byte, 1<<10)...)
	fc.brokers[0].rawAnswer.Store(&cut)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := c.Map(ctx)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrConnectionLost) {
		t.Errorf("Map with an answer cut short: %v; want a lost connection", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > transport.MaxMapFrame/4 {
		t.Errorf("reading 1 KiB of an answer announcing %d bytes allocated %d bytes", transport.MaxMapFrame, alloc)
	}
}
