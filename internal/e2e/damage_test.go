package e2e

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/internal/clustertest"
	"github.com/felix-broker/felix/internal/tidseg"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// segEntry is one tidwall entry of a segment file: its length prefix
// starts at prefix, its data (one Felix record) at data, n bytes long.
type segEntry struct {
	prefix, data, n int
	offset          uint64
}

// segment is one segment file of a shard's log, parsed.
type segment struct {
	path    string
	entries []segEntry
}

// readSegments parses the segment files of shard 0 of stream on b:
// tidwall/wal names a segment by the index of its first entry (offset+1),
// and stores entries as uvarint(len) followed by the data.
func readSegments(t *testing.T, b *cluster.Broker, stream string) []segment {
	t.Helper()
	dir := filepath.Join(b.DataDir, "streams", stream, "0")
	names, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var segs []segment
	for _, e := range names {
		first, err := strconv.ParseUint(e.Name(), 10, 64)
		if err != nil || e.IsDir() {
			continue
		}
		path := filepath.Join(dir, e.Name())
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		s := segment{path: path}
		for at, i := 0, uint64(0); at < len(raw); i++ {
			if tidseg.ZeroTail(raw[at:]) {
				break // zeros preallocated after the data (package wal)
			}
			n, w := binary.Uvarint(raw[at:])
			if w <= 0 {
				t.Fatalf("%s: bad entry at %d", path, at)
			}
			s.entries = append(s.entries, segEntry{prefix: at, data: at + w, n: int(n), offset: first - 1 + i})
			at += w + int(n)
		}
		segs = append(segs, s)
	}
	slices.SortFunc(segs, func(a, b segment) int { return int(a.entries[0].offset) - int(b.entries[0].offset) })
	return segs
}

// flip XORs mask into byte at of the file at path.
func flip(t *testing.T, path string, at int, mask byte) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	raw[at] ^= mask
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestDamagedLogServedAround damages a real broker's log on disk in each
// way a disk can — a flipped bit in a record's length prefix, in its
// header, in its payload, garbage appended to a segment — and restarts
// it: every intact record is served at its offset, each damaged one is
// reported to the SDK subscriber as a typed error naming the shard and
// the offsets, skipping past it works, and no acknowledged offset is ever
// handed out again.
func TestDamagedLogServedAround(t *testing.T) {
	ctx := testCtx(t)
	c := clustertest.Start(t, 1, func(o *cluster.Options) {
		o.BrokerEnv = append(o.BrokerEnv, "FELIX_SEGMENT_SIZE=16384")
	})
	b := c.Brokers()[0]
	admin := clustertest.Connect(t, c, b.ID)
	createStream(t, ctx, admin, shardmap.StreamConfig{Name: "dmg", Shards: 1})
	const n = 400
	value := make([]byte, 200)
	for i := range n {
		binary.BigEndian.PutUint32(value, uint32(i))
		if _, err := admin.Publish(ctx, "dmg", nil, value); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Stop(b.ID); err != nil {
		t.Fatal(err)
	}
	segs := readSegments(t, b, "dmg")
	if len(segs) < 5 {
		t.Fatalf("%d segments; the test needs 5", len(segs))
	}
	// One kind of damage per older segment; the last one is left alone.
	damaged := map[uint64]bool{}
	e := segs[0].entries[5]
	flip(t, segs[0].path, e.prefix, 0x40) // the length prefix
	damaged[e.offset] = true
	e = segs[1].entries[3]
	flip(t, segs[1].path, e.data+6, 0x01) // the record's stored offset, in its header
	damaged[e.offset] = true
	e = segs[2].entries[7]
	flip(t, segs[2].path, e.data+e.n-1, 0x80) // the payload's last byte
	damaged[e.offset] = true
	f, err := os.OpenFile(segs[3].path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("\x17garbage that is no record at all"))
	f.Close()

	if err := c.Restart(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	cl := clustertest.Connect(t, c, b.ID)

	// Read everything, resubscribing past each damaged range as the error
	// says to.
	got := map[uint64]bool{}
	reported := map[uint64]bool{}
	from := uint64(0)
	for from < n {
		sub, err := cl.Subscribe(ctx, "dmg", client.AtOffset(from))
		if err != nil {
			t.Fatal(err)
		}
		for rec, err := range sub.Records(ctx) {
			if err != nil {
				var ce *client.CorruptError
				if !errors.As(err, &ce) || !errors.Is(err, client.ErrCorrupt) || ce.Stream != "dmg" || ce.Shard != 0 {
					t.Fatalf("reading at %d: %v, want a *client.CorruptError for dmg/0", from, err)
				}
				for o := ce.From; o <= ce.To; o++ {
					reported[o] = true
				}
				from = ce.To + 1
				break
			}
			if binary.BigEndian.Uint32(rec.Value) != uint32(rec.Offset) {
				t.Fatalf("offset %d holds record %d", rec.Offset, binary.BigEndian.Uint32(rec.Value))
			}
			got[rec.Offset] = true
			from = rec.Offset + 1
			if from == n {
				break
			}
		}
		sub.Stop()
	}
	for o := range uint64(n) {
		switch {
		case damaged[o] && !reported[o]:
			t.Errorf("damaged offset %d not reported", o)
		case !damaged[o] && !got[o]:
			t.Errorf("intact offset %d not served (reported damaged: %v)", o, reported[o])
		}
	}
	if len(reported) != len(damaged) {
		t.Errorf("reported damaged %v, want exactly %v", keys(reported), keys(damaged))
	}

	// SkipCorrupt goes on by itself.
	sub, err := cl.Subscribe(ctx, "dmg", client.Earliest(), client.SkipCorrupt())
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for rec, err := range sub.Records(ctx) {
		if err != nil {
			t.Fatalf("with SkipCorrupt: %v", err)
		}
		count++
		if rec.Offset == n-1 {
			break
		}
	}
	sub.Stop()
	if count != n-len(damaged) {
		t.Errorf("SkipCorrupt delivered %d records, want %d", count, n-len(damaged))
	}

	// No acknowledged offset is handed out again.
	ack, err := cl.Publish(ctx, "dmg", nil, []byte("after"))
	if err != nil || ack.Offset != n {
		t.Fatalf("publish after the damage: %+v, %v; want offset %d", ack, err, n)
	}
}

func keys(m map[uint64]bool) []uint64 {
	var out []uint64
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestTruncatedLogNeverReusesOffsets cuts a real broker's last segment in
// the middle of acknowledged records — damage, not a crash — and restarts
// it: the shard refuses to hand out the lost offsets again and says so
// (unavailable, naming the lost range) until an operator accepts the loss
// for that shard; then it continues after the old end, and the lost
// offsets read as damaged.
func TestTruncatedLogNeverReusesOffsets(t *testing.T) {
	ctx := testCtx(t)
	c := clustertest.Start(t, 1)
	b := c.Brokers()[0]
	admin := clustertest.Connect(t, c, b.ID)
	createStream(t, ctx, admin, shardmap.StreamConfig{Name: "cut", Shards: 1})
	const n = 50
	for i := range n {
		if _, err := admin.Publish(ctx, "cut", nil, []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Kill(b.ID); err != nil {
		t.Fatal(err)
	}
	segs := readSegments(t, b, "cut")
	last := segs[len(segs)-1]
	cutAt := last.entries[len(last.entries)-20] // inside acked record n-20
	if err := os.Truncate(last.path, int64(cutAt.data+cutAt.n/2)); err != nil {
		t.Fatal(err)
	}

	if err := c.Restart(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	cl := clustertest.Connect(t, c, b.ID)
	_, err := cl.Publish(ctx, "cut", nil, []byte("reuse?"))
	if !errors.Is(err, transport.ErrUnavailable) || !strings.Contains(err.Error(), "refusing to reuse their offsets") {
		t.Fatalf("publish to a log that lost acked records: %v, want unavailable naming the loss", err)
	}
	cl.Close()

	if err := c.Stop(b.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.RestartWithEnv(ctx, b.ID, "FELIX_ACCEPT_LOSS=cut/0"); err != nil {
		t.Fatal(err)
	}
	cl = clustertest.Connect(t, c, b.ID)
	ack, err := cl.Publish(ctx, "cut", nil, []byte("after"))
	if err != nil || ack.Offset != n {
		t.Fatalf("publish after accepting the loss: %+v, %v; want offset %d, never a reused one", ack, err, n)
	}
	sub, err := cl.Subscribe(ctx, "cut", client.Earliest(), client.SkipCorrupt())
	if err != nil {
		t.Fatal(err)
	}
	var offsets []uint64
	for rec, err := range sub.Records(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		offsets = append(offsets, rec.Offset)
		if rec.Offset == n {
			break
		}
	}
	sub.Stop()
	lostFrom := cutAt.offset
	if len(offsets) != int(lostFrom)+1 || offsets[len(offsets)-1] != n || offsets[len(offsets)-2] != lostFrom-1 {
		t.Fatalf("read back %d records ending %v; want 0..%d then %d", len(offsets), offsets[max(0, len(offsets)-3):], lostFrom-1, n)
	}
}
