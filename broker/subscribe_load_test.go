package broker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
	"github.com/felix-broker/felix/wal"
)

// TestTailSubscribersUnderPublishLoad: several pipelined publishers into
// one shard and several raw subscribers following its tail. Every
// subscriber sees every offset once, in order, and no error: a subscriber
// is never sent records past the log's end (which used to cut it off with
// out_of_range under load, issue 12).
func TestTailSubscribersUnderPublishLoad(t *testing.T) {
	const (
		publishers  = 4
		perPub      = 3000
		subscribers = 6
		total       = publishers * perPub
	)
	// A small in-memory tail makes subscribers alternate between it and
	// the disk.
	ip := startInprocWith(t, func(c *Config) { c.TailBytes = 64 << 10; c.SegmentSize = 256 << 10 }, 1,
		shardmap.StreamConfig{Name: "orders", Shards: 1})
	b := ip.brokers[0]

	var wg sync.WaitGroup
	errs := make(chan error, publishers+subscribers)
	for s := range subscribers {
		sub := openStream(t, ip.dial(b))
		sub.send(&transport.Subscribe{Stream: "orders", Shard: 0, Start: transport.StartEarliest, Credit: 256})
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := uint64(0)
			for next < total {
				f, err := sub.r.Read()
				if err != nil {
					errs <- fmt.Errorf("subscriber %d at offset %d: %w", s, next, err)
					return
				}
				recs, ok := f.(*transport.Records)
				if !ok {
					errs <- fmt.Errorf("subscriber %d at offset %d: got %T %v", s, next, f, f)
					return
				}
				for _, r := range recs.Records {
					if r.Offset != next {
						errs <- fmt.Errorf("subscriber %d: got offset %d, want %d", s, r.Offset, next)
						return
					}
					next++
				}
				if err := sub.w.Write(&transport.Credit{Records: uint32(len(recs.Records))}); err != nil {
					errs <- fmt.Errorf("subscriber %d: grant: %w", s, err)
					return
				}
			}
		}()
	}
	for p := range publishers {
		pub := openStream(t, ip.dial(b))
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i := range perPub {
				pub.w.Buffer(publish(uint64(i+1), "orders", fmt.Sprint(p, "-", i)))
				if i%32 == 31 {
					if err := pub.w.Flush(); err != nil {
						errs <- err
						return
					}
				}
			}
			if err := pub.w.Flush(); err != nil {
				errs <- err
			}
		}()
		go func() {
			defer wg.Done()
			for i := range perPub {
				f, err := pub.r.Read()
				if err != nil {
					errs <- fmt.Errorf("publisher %d: %w", p, err)
					return
				}
				if a, ok := f.(*transport.Ack); !ok || a.Seq != uint64(i+1) {
					errs <- fmt.Errorf("publisher %d: want ack %d, got %T %v", p, i+1, f, f)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestReadErrorCodes: a corrupt read becomes the corrupt wire error with
// the damaged range; retention and a closed log keep their codes.
func TestReadErrorCodes(t *testing.T) {
	id := shardmap.ShardID{Stream: "orders", Shard: 2}
	e := readError("n1", id, 1013, &wal.CorruptError{Shard: "orders/2", Offset: 1013, From: 1012, To: 1014, Reason: "checksum mismatch"})
	if !errors.Is(e, transport.ErrCorrupt) || e.From != 1012 || e.To != 1014 {
		t.Fatalf("corrupt read: %+v", e)
	}
	if want := "orders/2: records at offsets 1012-1014 are damaged in n1's log (checksum mismatch); subscribe at offset 1015 to skip them"; e.Message != want {
		t.Fatalf("message %q, want %q", e.Message, want)
	}
	if e := readError("n1", id, 3, &wal.OutOfRangeError{Shard: "orders/2", Offset: 3, First: 10, Next: 20}); !errors.Is(e, transport.ErrOutOfRange) {
		t.Fatalf("out of range read: %+v", e)
	}
	if e := readError("n1", id, 3, wal.ErrClosed); !errors.Is(e, transport.ErrShuttingDown) {
		t.Fatalf("closed log: %+v", e)
	}
}

// TestSubscribeDamagedLog: a record damaged on disk in an older segment of
// the owner's log reaches a subscriber as the corrupt wire error naming
// the damaged offset, after every record before it; subscribing past it
// serves the rest.
func TestSubscribeDamagedLog(t *testing.T) {
	ip := startInprocWith(t, func(c *Config) { c.TailBytes = 4 << 10; c.SegmentSize = 4 << 10 }, 1,
		shardmap.StreamConfig{Name: "orders", Shards: 1})
	b := ip.brokers[0]
	pub := openStream(t, ip.dial(b))
	const n = 300
	for i := range n {
		pub.w.Buffer(publish(uint64(i+1), "orders", fmt.Sprintf("record-%04d", i)))
	}
	if err := pub.w.Flush(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		wantAck(t, pub.recv(), uint64(i+1))
	}

	// Flip a bit in the length prefix of the fourth record of the second
	// segment file.
	var segs []string
	err := filepath.WalkDir(filepath.Join(ip.dir, b.NodeID()), func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && len(d.Name()) == 20 && strings.Trim(d.Name(), "0123456789") == "" {
			segs = append(segs, path)
		}
		return err
	})
	if err != nil || len(segs) < 3 {
		t.Fatalf("want several segment files, got %v (%v)", segs, err)
	}
	sort.Strings(segs)
	data, err := os.ReadFile(segs[1])
	if err != nil {
		t.Fatal(err)
	}
	first, _ := strconv.ParseUint(filepath.Base(segs[1]), 10, 64)
	pos := 0
	for range 3 {
		size, h := binary.Uvarint(data[pos:])
		pos += h + int(size)
	}
	data[pos] ^= 0x04
	if err := os.WriteFile(segs[1], data, 0o640); err != nil {
		t.Fatal(err)
	}
	bad := first - 1 + 3

	sub := openStream(t, ip.dial(b))
	sub.send(&transport.Subscribe{Stream: "orders", Shard: 0, Start: transport.StartEarliest, Credit: n})
	next := uint64(0)
	for {
		f := sub.recv()
		if e, ok := f.(*transport.Error); ok {
			if !errors.Is(e, transport.ErrCorrupt) || e.From != bad || e.To != bad || next != bad {
				t.Fatalf("at offset %d: %v (range %d-%d), want corrupt at %d", next, e, e.From, e.To, bad)
			}
			break
		}
		for _, r := range f.(*transport.Records).Records {
			if r.Offset != next {
				t.Fatalf("got offset %d, want %d", r.Offset, next)
			}
			next++
		}
	}
	sub = openStream(t, ip.dial(b))
	sub.send(&transport.Subscribe{Stream: "orders", Shard: 0, Start: transport.StartOffset, Offset: bad + 1, Credit: n})
	for next = bad + 1; next < n; {
		recs, ok := sub.recv().(*transport.Records)
		if !ok {
			t.Fatalf("at offset %d: want records", next)
		}
		for _, r := range recs.Records {
			if r.Offset != next || string(r.Value) != fmt.Sprintf("record-%04d", next) {
				t.Fatalf("got offset %d %q, want %d", r.Offset, r.Value, next)
			}
			next++
		}
	}
}
