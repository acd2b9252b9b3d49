package tidseg

import (
	"reflect"
	"sync"
	"time"
	"unsafe"

	tidwall "github.com/tidwall/wal"
)

// tidwall keeps the tail segment's bytes in memory (its segment.ebuf, for
// reads) and appends each entry to them, from nothing after a roll: a
// tail that fills to a segment of 1 MiB grows that buffer a dozen times
// by a quarter (Go's growth for large slices), copying it each time and
// allocating about five times the segment in all. Each growth is a fresh
// allocation the commit that makes it pays for, and on a VM its page
// faults are slow: measured on a 2-vCPU nested VM, growths past 300 KiB
// took 0.1–5.7 ms each, the worst commits of a log at 1,000 records/s
// after the disk's own stalls (`go test -bench TailCache
// ./internal/tidseg` shows them on a machine, as worst-µs). PresizeTail
// gives the tail's cache its final capacity in one allocation instead.
// The price is memory held sooner: a presized cache has its full room
// from the roll on, where it grew with the segment, so only logs that
// fill their segments fast get it (Presizer).

// Presizer decides, at each roll of one log, whether the new tail's
// cache is given its room (PresizeTail): when the segment just left
// filled within PresizeWithin of the roll before it. A log that writes
// slower (a shard of many on a broker, say) keeps tidwall's growth, so
// that it holds no more memory than it used to; so does the first
// segment after a log opens. The zero value has seen no roll. It belongs
// to the log's writer.
type Presizer struct {
	last time.Time // the last roll, by the monotonic clock
}

// PresizeWithin is how fast a log must have filled its last segment for
// its next one's cache to be presized: with 1 MiB segments, about
// 100 KiB a second or more (600 records of 128 bytes a second). Measured,
// a log at 1,000 such records/s rolls every 6 s, and the shards of a
// 768-shard stream at the bench's maximum every 20–25 s.
const PresizeWithin = 10 * time.Second

// Rolled records a roll at now (a monotonic clock reading) and reports
// whether the new tail's cache should be presized.
func (p *Presizer) Rolled(now time.Time) bool {
	fast := !p.last.IsZero() && now.Sub(p.last) < PresizeWithin
	p.last = now
	return fast
}

// Roll is what a log's writer calls after tidwall rolled tw to a new
// tail segment, at now: if the segment before filled fast (Rolled), the
// new tail's cache gets the room of a segment of segmentSize (TailRoom,
// PresizeTail) while reads holds the log's tidwall reads off.
func (p *Presizer) Roll(now time.Time, tw *tidwall.Log, segmentSize int, reads sync.Locker) {
	if !p.Rolled(now) {
		return
	}
	reads.Lock() // tidwall reads the cache
	PresizeTail(tw, TailRoom(segmentSize))
	reads.Unlock()
}

// TailRoom is the capacity PresizeTail callers ask for, for logs of
// segmentSize: tidwall rolls once an entry takes the tail to the segment
// size, so the tail holds up to one entry more; room for 64 KiB more,
// or a quarter of the segment if less, keeps the cache within the 5/4 of
// the segment that Go's growth reached before, which the brokers' memory
// budget counts (a larger entry grows it once, as before).
func TailRoom(segmentSize int) int { return segmentSize + min(64<<10, segmentSize/4) }

// tailLayout is where tidwall v1.2.1 keeps a Log's segments and a
// segment's cache, found by reflection once; ok is false if the fields
// are not there as expected (another tidwall), and then PresizeTail does
// nothing. TestTailLayout fails on such an upgrade.
var tailLayout = func() (l struct {
	ok                bool
	segments, entries uintptr // offsets of Log.segments and segment.ebuf
}) {
	log := reflect.TypeFor[tidwall.Log]()
	segs, ok := log.FieldByName("segments")
	if !ok || segs.Type.Kind() != reflect.Slice || segs.Type.Elem().Kind() != reflect.Pointer ||
		segs.Type.Elem().Elem().Kind() != reflect.Struct {
		return l
	}
	ebuf, ok := segs.Type.Elem().Elem().FieldByName("ebuf")
	if !ok || ebuf.Type != reflect.TypeFor[[]byte]() {
		return l
	}
	l.ok, l.segments, l.entries = true, segs.Offset, ebuf.Offset
	return l
}()

// PresizeTail gives the cache tidwall keeps of tw's tail segment room for
// n bytes, with what it holds copied in, unless it has that room already;
// it reports whether the cache has it now. Presizer.Roll calls it after
// the roll to a new tail of a log that filled its last segment fast, with
// n the segment size and an entry's slack (TailRoom): the tail of such a
// log holds that much anyway by the time it rolls.
//
// The caller must be the log's only writer and hold whatever serializes
// its reads (tidwall reads the cache under its read lock); tw must be
// open.
func PresizeTail(tw *tidwall.Log, n int) bool {
	if !tailLayout.ok {
		return false
	}
	segs := *(*[]unsafe.Pointer)(unsafe.Add(unsafe.Pointer(tw), tailLayout.segments))
	if len(segs) == 0 || segs[len(segs)-1] == nil {
		return false
	}
	buf := (*[]byte)(unsafe.Add(segs[len(segs)-1], tailLayout.entries))
	if cap(*buf) >= n {
		return true
	}
	grown := make([]byte, len(*buf), n)
	copy(grown, *buf)
	*buf = grown
	return true
}
