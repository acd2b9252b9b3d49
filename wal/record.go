package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Record is one entry of a shard's log.
//
// Records returned by Read may share memory with the Log and with other
// readers: callers must not modify them (including Key, Value and Headers).
//
// Appending copies Key and Value, but keeps the Headers map itself for the
// log's in-memory tail (copying it cost a measurable share of a traced
// publish's latency): an appender must not modify Headers afterwards.
type Record struct {
	Offset      uint64            // assigned by the log at commit; dense, from 0
	Timestamp   int64             // commit time by the wall clock, unix nanoseconds, assigned by the log (see clockStep)
	ProducerID  string            // optional publisher identity
	ProducerSeq uint64            // optional publisher sequence
	Headers     map[string]string // optional (trace context etc.)
	Key         []byte
	Value       []byte
}

// Stored record format, inside one tidwall entry (all integers little endian):
//
//	crc32c      uint32  Castagnoli, over every byte after it
//	version     byte    recordVersion
//	offset      uint64  so a record found at the wrong index is detected
//	timestamp   int64   unix nanoseconds
//	producerSeq uint64
//	producerID  uvarint length + bytes
//	headers     uvarint count, then per header uvarint length + key, uvarint length + value
//	key         uvarint length + bytes
//	value       uvarint length + bytes
//
// The record ends exactly after the value. From producerSeq on it is the
// record's body (AppendBody, DecodeBody), which package replica stores in
// its batches in the same form.
const (
	recordVersion = 1

	crcAt       = 0
	versionAt   = 4
	offsetAt    = 5
	timestampAt = 13
	seqAt       = 21
	recordFixed = 29 // bytes before the first variable-length field
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func uvarintLen(x int) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

// encodedSize returns the exact size appendRecord will add for r.
func encodedSize(r *Record) int { return seqAt + BodySize(r) }

// BodySize returns the exact size AppendBody adds for r.
func BodySize(r *Record) int {
	n := 8 + uvarintLen(len(r.ProducerID)) + len(r.ProducerID)
	n += uvarintLen(len(r.Headers))
	for k, v := range r.Headers {
		n += uvarintLen(len(k)) + len(k) + uvarintLen(len(v)) + len(v)
	}
	n += uvarintLen(len(r.Key)) + len(r.Key)
	n += uvarintLen(len(r.Value)) + len(r.Value)
	return n
}

// AppendBody appends r's body (producerSeq, producerID, headers, key and
// value, as in the stored record format above) to dst, and returns where
// in out its key and value bytes start.
func AppendBody(dst []byte, r *Record) (out []byte, keyAt, valueAt int) {
	dst = binary.LittleEndian.AppendUint64(dst, r.ProducerSeq)
	dst = binary.AppendUvarint(dst, uint64(len(r.ProducerID)))
	dst = append(dst, r.ProducerID...)
	dst = binary.AppendUvarint(dst, uint64(len(r.Headers)))
	for k, v := range r.Headers {
		dst = binary.AppendUvarint(dst, uint64(len(k)))
		dst = append(dst, k...)
		dst = binary.AppendUvarint(dst, uint64(len(v)))
		dst = append(dst, v...)
	}
	dst = binary.AppendUvarint(dst, uint64(len(r.Key)))
	keyAt = len(dst)
	dst = append(dst, r.Key...)
	dst = binary.AppendUvarint(dst, uint64(len(r.Value)))
	valueAt = len(dst)
	return append(dst, r.Value...), keyAt, valueAt
}

// appendRecord appends r, stored at offset with timestamp ts, to dst. It
// also returns where in out the key and value bytes start.
func appendRecord(dst []byte, r *Record, offset uint64, ts int64) (out []byte, keyAt, valueAt int) {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, recordVersion)
	dst = binary.LittleEndian.AppendUint64(dst, offset)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(ts))
	dst, keyAt, valueAt = AppendBody(dst, r)
	binary.LittleEndian.PutUint32(dst[start+crcAt:], crc32.Checksum(dst[start+versionAt:], castagnoli))
	return dst, keyAt, valueAt
}

// decodeRecord decodes a stored record that must hold offset want. Key and
// Value alias data. Any mismatch is a *CorruptError naming shard and want;
// it never panics, whatever data holds.
func decodeRecord(shard string, data []byte, want uint64) (Record, error) {
	corrupt := func(reason string) (Record, error) {
		return Record{}, &CorruptError{Shard: shard, Offset: want, From: want, To: want, Reason: reason}
	}
	if len(data) < recordFixed {
		return corrupt(fmt.Sprintf("record of %d bytes is shorter than its header", len(data)))
	}
	if got, sum := binary.LittleEndian.Uint32(data[crcAt:]), crc32.Checksum(data[versionAt:], castagnoli); got != sum {
		return corrupt(fmt.Sprintf("checksum mismatch (stored %08x, computed %08x)", got, sum))
	}
	if v := data[versionAt]; v != recordVersion {
		return corrupt(fmt.Sprintf("unknown format version %d", v))
	}
	if off := binary.LittleEndian.Uint64(data[offsetAt:]); off != want {
		return corrupt(fmt.Sprintf("record holds offset %d", off))
	}
	r := Record{
		Offset:    want,
		Timestamp: int64(binary.LittleEndian.Uint64(data[timestampAt:])),
	}
	rest, err := DecodeBody(data[seqAt:], &r)
	if err != nil {
		return corrupt(err.Error())
	}
	if len(rest) != 0 {
		return corrupt(fmt.Sprintf("%d trailing bytes", len(rest)))
	}
	return r, nil
}

// DecodeBody decodes the record body at the front of data (see AppendBody)
// into r's ProducerSeq, ProducerID, Headers, Key and Value, Key and Value
// aliasing data, and returns the bytes after it. It never panics, whatever
// data holds; an error says what is malformed.
func DecodeBody(data []byte, r *Record) (rest []byte, err error) {
	if len(data) < 8 {
		return nil, fmt.Errorf("body of %d bytes is shorter than its producer sequence", len(data))
	}
	r.ProducerSeq = binary.LittleEndian.Uint64(data)
	d := decoder{b: data[8:]}
	if pid := d.bytes(); len(pid) > 0 {
		r.ProducerID = string(pid)
	}
	nh := d.uvarint()
	if nh > uint64(len(d.b)/2) { // each header takes at least two bytes
		return nil, fmt.Errorf("header count %d exceeds record size", nh)
	}
	if nh > 0 {
		r.Headers = make(map[string]string, nh)
		for i := uint64(0); i < nh && !d.bad; i++ {
			k := d.bytes()
			v := d.bytes()
			r.Headers[string(k)] = string(v)
		}
	}
	r.Key = d.bytes()
	r.Value = d.bytes()
	if d.bad {
		return nil, errors.New("malformed field lengths")
	}
	return d.b, nil
}

// BodyProducer reads the producer sequence and id of the record body at
// the front of data (see AppendBody) and returns the bytes after the
// body, without decoding the rest: id aliases data. It never panics,
// whatever data holds; an error says what is malformed.
func BodyProducer(data []byte) (seq uint64, id []byte, rest []byte, err error) {
	if len(data) < 8 {
		return 0, nil, nil, fmt.Errorf("body of %d bytes is shorter than its producer sequence", len(data))
	}
	seq = binary.LittleEndian.Uint64(data)
	d := decoder{b: data[8:]}
	id = d.bytes()
	nh := d.uvarint()
	if nh > uint64(len(d.b)/2) { // each header takes at least two bytes
		return 0, nil, nil, fmt.Errorf("header count %d exceeds record size", nh)
	}
	for i := uint64(0); i < 2*nh+2 && !d.bad; i++ { // headers' keys and values, key, value
		d.bytes()
	}
	if d.bad {
		return 0, nil, nil, errors.New("malformed field lengths")
	}
	return seq, id, d.b, nil
}

// decoder reads uvarint-prefixed fields; after the first error it sets bad
// and returns zero values.
type decoder struct {
	b   []byte
	bad bool
}

func (d *decoder) uvarint() uint64 {
	if d.bad {
		return 0
	}
	x, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.bad = true
		return 0
	}
	d.b = d.b[n:]
	return x
}

// bytes returns the next length-prefixed field, nil if it is empty.
func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.bad {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.bad = true
		return nil
	}
	if n == 0 {
		return nil
	}
	out := d.b[:n:n]
	d.b = d.b[n:]
	return out
}

// ReadSize is what a record counts against Read's maxBytes: its key,
// value, producer id and headers (package replica counts alike).
func ReadSize(r *Record) int {
	n := len(r.Key) + len(r.Value) + len(r.ProducerID)
	for k, v := range r.Headers {
		n += len(k) + len(v)
	}
	return n
}
