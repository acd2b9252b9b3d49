package tidseg

import (
	"errors"
	"fmt"

	tidwall "github.com/tidwall/wal"
)

// ErrShortSegment: a segment file holds fewer entries than its name and
// the next file's say (a segment removed, emptied, or cut short at an
// entry boundary). tidwall indexes its entries without a bounds check
// and panics there; Read and TruncateFront return this instead (with
// tidwall.ErrCorrupt).
var ErrShortSegment = errors.New("a segment file holds fewer entries than its range")

// Read is tidwall's Read of index, with its panic on a damaged segment
// returned as ErrShortSegment: a damaged log, not a crash of the process.
func Read(tw *tidwall.Log, index uint64) (data []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			data, err = nil, shortSegment("reading", index, p)
		}
	}()
	return tw.Read(index)
}

// TruncateFront is tidwall's TruncateFront to index, with its panic on a
// damaged segment (raised before it changes any file) returned as
// ErrShortSegment.
func TruncateFront(tw *tidwall.Log, index uint64) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = shortSegment("truncating the front to", index, p)
		}
	}()
	return tw.TruncateFront(index)
}

func shortSegment(what string, index uint64, p any) error {
	return fmt.Errorf("%w: %w: %s index %d panicked: %v", tidwall.ErrCorrupt, ErrShortSegment, what, index, p)
}
