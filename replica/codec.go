package replica

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/felix-broker/felix/wal"
)

// Batch format: the Data of a normal raft entry, one group-commit batch of
// records (all integers little endian):
//
//	version     byte    batchVersion
//	proposer    uint64  raft id of the node that proposed it
//	seq         uint64  the proposer's sequence number for it
//	timestamp   int64   unix nanoseconds, chosen by the proposer: every replica stores the same
//	count       uvarint number of records
//	records     count times:
//	  producerSeq uint64
//	  producerID  uvarint length + bytes
//	  headers     uvarint count, then per header uvarint length + key, uvarint length + value
//	  key         uvarint length + bytes
//	  value       uvarint length + bytes
//
// The batch ends exactly after the last record. It carries no checksum of
// its own: on disk the stored entry's CRC-32C covers it (see storage.go),
// and on the wire the peer connection's TLS does. Offsets are not in it:
// they are assigned when the entry applies.
const (
	batchVersion = 1
	batchFixed   = 1 + 8 + 8 + 8
)

// errBadBatch marks an entry whose data does not decode as a batch.
var errBadBatch = errors.New("replica: malformed batch")

// batchHeader is the fixed part of a batch.
type batchHeader struct {
	proposer uint64
	seq      uint64
	ts       int64
	count    int
}

func uvarintLen(x int) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

// recordSize is the exact size appendBatchRecord adds for r.
func recordSize(r *wal.Record) int {
	n := 8 + uvarintLen(len(r.ProducerID)) + len(r.ProducerID)
	n += uvarintLen(len(r.Headers))
	for k, v := range r.Headers {
		n += uvarintLen(len(k)) + len(k) + uvarintLen(len(v)) + len(v)
	}
	n += uvarintLen(len(r.Key)) + len(r.Key)
	n += uvarintLen(len(r.Value)) + len(r.Value)
	return n
}

// appendBatchHeader starts a batch of count records in dst.
func appendBatchHeader(dst []byte, h batchHeader) []byte {
	dst = append(dst, batchVersion)
	dst = binary.LittleEndian.AppendUint64(dst, h.proposer)
	dst = binary.LittleEndian.AppendUint64(dst, h.seq)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(h.ts))
	return binary.AppendUvarint(dst, uint64(h.count))
}

// appendBatchRecord appends one record of a batch to dst.
func appendBatchRecord(dst []byte, r *wal.Record) []byte {
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
	dst = append(dst, r.Key...)
	dst = binary.AppendUvarint(dst, uint64(len(r.Value)))
	return append(dst, r.Value...)
}

// decodeBatchHeader decodes the fixed part of a batch and returns the rest.
func decodeBatchHeader(data []byte) (batchHeader, []byte, error) {
	if len(data) < batchFixed+1 {
		return batchHeader{}, nil, fmt.Errorf("%w: %d bytes is shorter than its header", errBadBatch, len(data))
	}
	if data[0] != batchVersion {
		return batchHeader{}, nil, fmt.Errorf("%w: version %d", errBadBatch, data[0])
	}
	h := batchHeader{
		proposer: binary.LittleEndian.Uint64(data[1:]),
		seq:      binary.LittleEndian.Uint64(data[9:]),
		ts:       int64(binary.LittleEndian.Uint64(data[17:])),
	}
	n, w := binary.Uvarint(data[batchFixed:])
	// Every record takes at least 12 bytes, which bounds a lying count.
	if w <= 0 || n > uint64(len(data)-batchFixed)/12 {
		return batchHeader{}, nil, fmt.Errorf("%w: bad record count", errBadBatch)
	}
	h.count = int(n)
	return h, data[batchFixed+w:], nil
}

// decodeBatch decodes a whole batch, the records aliasing data, with
// offsets from base. It never panics, whatever data holds.
func decodeBatch(data []byte, base uint64) (batchHeader, []wal.Record, error) {
	h, rest, err := decodeBatchHeader(data)
	if err != nil {
		return h, nil, err
	}
	d := decoder{b: rest}
	recs := make([]wal.Record, h.count)
	for i := range recs {
		r := &recs[i]
		r.Offset, r.Timestamp = base+uint64(i), h.ts
		r.ProducerSeq = d.u64()
		r.ProducerID = string(d.bytes())
		if nh := d.uvarint(); nh > 0 && d.err == nil {
			if nh > uint64(len(d.b))/2 {
				return h, nil, fmt.Errorf("%w: record %d: bad header count", errBadBatch, i)
			}
			r.Headers = make(map[string]string, nh)
			for range nh {
				k := d.bytes()
				r.Headers[string(k)] = string(d.bytes())
			}
		}
		r.Key = d.bytes()
		r.Value = d.bytes()
		if d.err != nil {
			return h, nil, fmt.Errorf("%w: record %d: %v", errBadBatch, i, d.err)
		}
	}
	if len(d.b) != 0 {
		return h, nil, fmt.Errorf("%w: %d bytes after the last record", errBadBatch, len(d.b))
	}
	return h, recs, nil
}

// decoder reads the fields of a batch; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) u64() uint64 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 8 {
		d.err = errors.New("truncated")
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errors.New("bad length")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = errors.New("length past the end")
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}
