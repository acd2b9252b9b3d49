package tidseg

// FollowRoll says what tidwall's WriteBatch did to the segments when it
// wrote a batch of entries (the first at index first, their sizes as
// EntrySize gives them) onto a tail segment of tailSize bytes, with the
// log's segmentSize. tidwall starts a new segment before a batch if the
// tail is over segmentSize, and after any entry that brings the tail to
// segmentSize; it fsyncs each segment it leaves, so only the final tail
// needs the caller's sync.
//
// started is the first index of the last segment the batch started (0 if
// none: the tail is the same file); size is the tail's size after the
// batch; written is the bytes the batch added over all segments. A caller
// that sees started != 0 must open that segment as its new tail and fsync
// the directory, so that the new file's name survives a crash.
func FollowRoll(tailSize, segmentSize int64, first uint64, sizes []int) (started uint64, size, written int64) {
	size = tailSize
	if size > segmentSize {
		started, size = first, 0
	}
	for i, n := range sizes {
		written += int64(n)
		if size += int64(n); size >= segmentSize {
			started, size = first+uint64(i)+1, 0
		}
	}
	return started, size, written
}

// TailEnd returns the size the tail segment, of tailSize bytes, has once
// tidwall has written a batch of entries of sizes onto it, and whether the
// batch left it for a new segment (by FollowRoll's rule: a tail over
// segmentSize is left before the batch; one brought to segmentSize by an
// entry is left after it).
func TailEnd(tailSize, segmentSize int64, sizes []int) (end int64, left bool) {
	if tailSize > segmentSize {
		return tailSize, true
	}
	for _, n := range sizes {
		if tailSize += int64(n); tailSize >= segmentSize {
			return tailSize, true
		}
	}
	return tailSize, false
}

// ZeroTail reports whether every byte of b is zero: what is left of a
// segment after its last entry when its writer preallocated it with zeros
// (an entry never starts with a zero byte in a Felix log: none is empty).
func ZeroTail(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
