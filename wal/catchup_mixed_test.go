package wal

import (
	"bytes"
	"encoding/binary"
	"github.com/felix-broker/felix/internal/catchuptest"
	"testing"

	"github.com/felix-broker/felix/internal/procio"
)

// mixedValue: 128-byte values naming their offset, every 8th one 1,000
// bytes (a subscriber's stream with some bigger records).
func mixedValue(i uint64) []byte {
	n := 128
	if i%8 == 0 {
		n = 1000
	}
	v := make([]byte, n)
	binary.LittleEndian.PutUint64(v, i)
	copy(v[8:], bytes.Repeat([]byte{byte('a' + i%26)}, n-8))
	return v
}

// TestCatchUpReadersMixedSizes: TestCatchUpReadersInterleaved with
// records of two sizes (128 and 1,000 bytes) instead of one: an entry larger
// than a read expected is read whole, not left to the whole-segment path
// (a review measured 1,022,392 bytes read per record before).
func TestCatchUpReadersMixedSizes(t *testing.T) {
	if _, ok := procio.Read(); !ok {
		t.Skip("no /proc/self/io")
	}
	l, _ := testLog(t, t.TempDir(), Options{Name: "mixed/0", TailRecords: 64})
	starts := fillValues(t, l, 12, mixedValue)
	at := catchuptest.Starts(t, starts, 4)
	readers := make([]*Reader, len(at))
	for k := range readers {
		readers[k] = l.NewReader()
	}
	span := starts[2] - starts[1]
	next := append([]uint64(nil), at...)
	step := func(n int) {
		for i := range n {
			k := i % len(readers)
			recs, err := readers[k].Read(next[k], 1, 1<<20)
			if err != nil || len(recs) != 1 || recs[0].Offset != next[k] || !bytes.Equal(recs[0].Value, mixedValue(next[k])) {
				t.Fatalf("reader %d: Read(%d): %d records, %v", k, next[k], len(recs), err)
			}
			if next[k]++; next[k] == at[k]+span {
				next[k] = at[k]
			}
		}
	}
	step(len(readers))
	r0, _ := procio.Read()
	const n = 800
	step(n)
	r1, _ := procio.Read()
	perRecord := (r1 - r0) / n
	t.Logf("%d records, %d bytes read per record", n, perRecord)
	if perRecord > 64<<10 {
		t.Fatalf("%d readers interleaved read %d bytes of segment files per record delivered, want under 64 KiB (as with records of one size)", len(at), perRecord)
	}
}
