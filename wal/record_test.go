package wal

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"
)

func TestRecordRoundTrip(t *testing.T) {
	for i := range 40 {
		r := rec(i)
		b, _, _ := appendRecord([]byte("prefix"), r, uint64(i), int64(1000+i))
		b = b[len("prefix"):]
		if len(b) != encodedSize(r) {
			t.Fatalf("record %d: encoded %d bytes, encodedSize says %d", i, len(b), encodedSize(r))
		}
		got, err := decodeRecord("s", b, uint64(i))
		if err != nil {
			t.Fatalf("decode %d: %v", i, err)
		}
		if err := sameRecord(got, r); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if got.Offset != uint64(i) || got.Timestamp != int64(1000+i) {
			t.Fatalf("record %d: offset %d ts %d", i, got.Offset, got.Timestamp)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	r := rec(4)
	good, _, _ := appendRecord(nil, r, 7, 1)
	cases := map[string]struct {
		data []byte
		want uint64
	}{
		"wrong offset": {good, 8},
		"empty":        {nil, 7},
		"truncated":    {good[:len(good)-1], 7},
		"extended":     {append(append([]byte{}, good...), 0), 7},
	}
	for i := range good {
		b := append([]byte{}, good...)
		b[i] ^= 0x01
		cases["flip "+string(rune('A'+i%26))+string(rune('0'+i/26))] = struct {
			data []byte
			want uint64
		}{b, 7}
	}
	for name, c := range cases {
		_, err := decodeRecord("orders/2", c.data, c.want)
		var ce *CorruptError
		if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s: err = %v, want *CorruptError", name, err)
		}
		if ce.Shard != "orders/2" || ce.Offset != c.want {
			t.Fatalf("%s: error names %q/%d", name, ce.Shard, ce.Offset)
		}
	}
}

func FuzzDecodeRecord(f *testing.F) {
	for i := range 8 {
		b, _, _ := appendRecord(nil, rec(i), uint64(i), int64(i))
		f.Add(b, uint64(i))
	}
	f.Add([]byte{}, uint64(0))
	f.Fuzz(func(t *testing.T, data []byte, off uint64) {
		checkDecode(t, data, off)
		// Also with a valid checksum, so the fields behind it are exercised.
		if len(data) >= recordFixed {
			fixed := append([]byte{}, data...)
			binary.LittleEndian.PutUint32(fixed, crc32.Checksum(fixed[versionAt:], castagnoli))
			checkDecode(t, fixed, off)
		}
	})
}

func checkDecode(t *testing.T, data []byte, off uint64) {
	r, err := decodeRecord("fuzz", data, off)
	if err != nil {
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("error %v is not ErrCorrupt", err)
		}
		return
	}
	// Whatever decodes must re-encode to a record that decodes the same.
	b, _, _ := appendRecord(nil, &r, r.Offset, r.Timestamp)
	r2, err := decodeRecord("fuzz", b, off)
	if err != nil {
		t.Fatalf("re-encoded record does not decode: %v", err)
	}
	if err := sameRecord(r2, &r); err != nil {
		t.Fatal(err)
	}
}

// FuzzBodyProducer: BodyProducer reads what DecodeBody decodes of a body
// (producer sequence and id, and where the body ends), and fails where it
// fails.
func FuzzBodyProducer(f *testing.F) {
	for i := range 8 {
		b, _, _ := AppendBody(nil, rec(i))
		f.Add(append(b, 0xee))
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var r Record
		rest, err := DecodeBody(data, &r)
		seq, id, prest, perr := BodyProducer(data)
		if (err == nil) != (perr == nil) {
			t.Fatalf("DecodeBody: %v, BodyProducer: %v", err, perr)
		}
		if err != nil {
			return
		}
		if seq != r.ProducerSeq || string(id) != r.ProducerID || len(prest) != len(rest) {
			t.Fatalf("BodyProducer: seq %d id %q, %d bytes after; DecodeBody: seq %d id %q, %d bytes after",
				seq, id, len(prest), r.ProducerSeq, r.ProducerID, len(rest))
		}
	})
}
