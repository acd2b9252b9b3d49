package tidseg

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// Padding is the zeros a log's owner writes ahead of tidwall's writes in
// the tail segment, so that tidwall's entries overwrite blocks the file
// already has: an fdatasync after an append must also write the inode of
// the grown file (one more synchronous write on ext4), after an overwrite
// it writes the data alone. Measured on a 2-vCPU VM with ext4 (no
// journal), 100-byte records each followed by its fdatasync: p50 225–282
// µs appended, 155–190 µs over zeros.
//
// The zeros are written into the page cache just before a batch that
// would come within PadLow of their end (PadChunk at a time, never past
// the segment size), and that batch's fdatasync makes them durable with
// it: one fdatasync in PadChunk bytes still grows the file, none is added.
//
// They are never entries (no Felix entry is empty; an empty tidwall entry
// is one zero byte), and tidwall must never see them where it reads a
// segment to find its end, its last one: the owner cuts them (Cut) from
// the tail it leaves on a roll, before it closes the log, and before any
// tidwall call that may rewrite or reopen the tail (a truncation), and a
// crash leaves them for the repair on open to cut (ZeroTail tells them
// from a torn tail). An older segment that kept its zeros (a crash
// between a roll and its cut reaching the disk) is harmless: tidwall
// finds an older segment's entries by index, counted from its name, and
// never asks it for one past its data.
//
// The zero value has no zeros written. It belongs to the goroutine that
// writes the log.
type Padding struct {
	end int64 // where the zeros end; 0 for none
}

// PadChunk is how many zeros Padding writes at a time, PadLow how close to
// their end a batch may come before it writes more.
const (
	PadChunk = 256 << 10
	PadLow   = 64 << 10
)

// zeros is PadChunk zero bytes, never written to.
var zeros = make([]byte, PadChunk)

// Extend writes zeros to f, the tail segment, which holds size bytes of
// entries, before a batch of entries of sizes is written to it, if the
// batch stays in the segment (by TailEnd) and would come within PadLow of
// the zeros' end.
func (p *Padding) Extend(f io.WriterAt, size, segmentSize int64, sizes []int) error {
	end, left := TailEnd(size, segmentSize, sizes)
	have := max(p.end, size)
	if left || end+PadLow <= have || have >= segmentSize {
		return nil
	}
	to := min(max(end+PadLow, size+PadChunk), segmentSize)
	for at := have; at < to; {
		n, err := f.WriteAt(zeros[:min(to-at, PadChunk)], at)
		if err != nil {
			return err
		}
		at += int64(n)
	}
	p.end = to
	return nil
}

// Found records zeros that a file opened without knowing of them holds
// up to end (after its entries).
func (p *Padding) Found(end int64) { p.end = end }

// Size returns the size f has with size bytes of entries: the zeros' end
// if it is past them.
func (p *Padding) Size(size int64) int64 { return max(size, p.end) }

// Extra returns how many zeros follow size bytes of entries.
func (p *Padding) Extra(size int64) int64 { return max(0, p.end-size) }

// Unpad returns segs with the size of the tail segment (the last one,
// when it starts at index tail) less the zeros p wrote after its size
// bytes of entries: what the segments hold in entries, as retention counts
// them.
func (p *Padding) Unpad(segs []Segment, tail uint64, size int64) []Segment {
	if n := len(segs); n > 0 && segs[n-1].Index == tail {
		segs[n-1].Size -= p.Extra(size)
	}
	return segs
}

// ErrNotZeros: Cut found bytes other than zeros where the zeros should be
// (the owner's count of its entries' bytes is wrong), and cut nothing.
var ErrNotZeros = errors.New("tidseg: not zeros after the entries")

// PadFile is a tail segment as Cut needs it.
type PadFile interface {
	io.ReaderAt
	Truncate(size int64) error
}

// Cut truncates f to size, the end of its entries, if zeros follow them,
// and forgets them either way (the next tail starts with none). It first
// reads what it would cut, and cuts nothing, returning ErrNotZeros, if
// that is not all zeros: an entry never is (its length comes first, and
// no entry is empty), so a wrong size can never cut one.
func (p *Padding) Cut(f PadFile, size int64) error {
	end := p.end
	p.end = 0
	if end <= size {
		return nil
	}
	b := make([]byte, end-size)
	n, err := f.ReadAt(b, size)
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if !ZeroTail(b[:n]) {
		return fmt.Errorf("%w: at bytes %d-%d", ErrNotZeros, size, size+int64(n))
	}
	if n == 0 {
		return nil // the file ends at size
	}
	return f.Truncate(size)
}

// EntriesEnd returns where the whole entries at the start of a segment's
// data end, and whether nothing but zeros (or nothing) follows them: a
// preallocated tail's zeros, not a torn entry.
func EntriesEnd(data []byte) (end int, zeros bool) {
	for end < len(data) && !ZeroTail(data[end:]) {
		_, n, ok := NextEntry(data[end:])
		if !ok {
			return end, false
		}
		end += n
	}
	return end, true
}

// DataSize returns the bytes of entries segs hold: the files' total less
// the zeros preallocated after the last one's entries, found by reading
// the last one whole.
func DataSize(segs []Segment) (int64, error) {
	n := Total(segs)
	if len(segs) == 0 {
		return n, nil
	}
	data, err := os.ReadFile(segs[len(segs)-1].Path)
	if err != nil {
		return 0, err
	}
	if end, zeros := EntriesEnd(data); zeros {
		n -= int64(len(data) - end)
	}
	return n, nil
}
