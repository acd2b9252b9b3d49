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
