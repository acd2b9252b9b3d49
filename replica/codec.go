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
//	records     count times, each a record body as package wal stores it
//	            (wal.AppendBody):
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

// recordSize is the exact size appendBatchRecord adds for r.
func recordSize(r *wal.Record) int { return wal.BodySize(r) }

// appendBatchHeader starts a batch of count records in dst.
func appendBatchHeader(dst []byte, h batchHeader) []byte {
	dst = append(dst, batchVersion)
	dst = binary.LittleEndian.AppendUint64(dst, h.proposer)
	dst = binary.LittleEndian.AppendUint64(dst, h.seq)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(h.ts))
	return binary.AppendUvarint(dst, uint64(h.count))
}

// appendBatchRecord appends one record of a batch to dst: its body as
// package wal stores it (wal.AppendBody).
func appendBatchRecord(dst []byte, r *wal.Record) []byte {
	dst, _, _ = wal.AppendBody(dst, r)
	return dst
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
	recs := make([]wal.Record, h.count)
	for i := range recs {
		r := &recs[i]
		r.Offset, r.Timestamp = base+uint64(i), h.ts
		if rest, err = wal.DecodeBody(rest, r); err != nil {
			return h, nil, fmt.Errorf("%w: record %d: %v", errBadBatch, i, err)
		}
	}
	if len(rest) != 0 {
		return h, nil, fmt.Errorf("%w: %d bytes after the last record", errBadBatch, len(rest))
	}
	return h, recs, nil
}
