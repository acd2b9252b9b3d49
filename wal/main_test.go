package wal

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// logSink is a slog handler that counts records by level.
type logSink struct {
	mu     sync.Mutex
	counts map[slog.Level]int
	msgs   []string
}

func (s *logSink) Enabled(context.Context, slog.Level) bool { return true }
func (s *logSink) Handle(_ context.Context, r slog.Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.counts == nil {
		s.counts = map[slog.Level]int{}
	}
	s.counts[r.Level]++
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool { msg += " " + a.String(); return true })
	s.msgs = append(s.msgs, msg)
	return nil
}
func (s *logSink) WithAttrs([]slog.Attr) slog.Handler { return s }
func (s *logSink) WithGroup(string) slog.Handler      { return s }
func (s *logSink) count(l slog.Level) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[l]
}

// testLog opens a log whose errors fail the test at cleanup.
func testLog(t *testing.T, dir string, opts Options) (*Log, *logSink) {
	t.Helper()
	sink := &logSink{}
	opts.Logger = slog.New(sink)
	if opts.Name == "" {
		opts.Name = "test/0"
	}
	l, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("Open(%q): %v", dir, err)
	}
	t.Cleanup(func() {
		_ = l.Close()
		if n := sink.count(slog.LevelError); n > 0 {
			t.Errorf("log reported %d errors: %q", n, sink.msgs)
		}
	})
	return l, sink
}

// rec builds a distinguishable record for index i.
func rec(i int) *Record {
	r := &Record{
		Key:   fmt.Appendf(nil, "key-%d", i),
		Value: bytes.Repeat([]byte{byte('a' + i%26)}, 20+i%50),
	}
	if i%3 == 0 {
		r.ProducerID = fmt.Sprintf("producer-%d", i%7)
		r.ProducerSeq = uint64(i)
	}
	if i%4 == 0 {
		r.Headers = map[string]string{"traceparent": fmt.Sprintf("00-%032d-01", i), "n": fmt.Sprint(i)}
	}
	if i%10 == 9 {
		r.Key = nil
	}
	return r
}

// sameRecord reports how got differs from want (ignoring offset and timestamp).
func sameRecord(got Record, want *Record) error {
	if !bytes.Equal(got.Key, want.Key) || !bytes.Equal(got.Value, want.Value) ||
		got.ProducerID != want.ProducerID || got.ProducerSeq != want.ProducerSeq ||
		len(got.Headers) != len(want.Headers) {
		return fmt.Errorf("got %+v, want %+v", got, *want)
	}
	for k, v := range want.Headers {
		if got.Headers[k] != v {
			return fmt.Errorf("header %q = %q, want %q", k, got.Headers[k], v)
		}
	}
	return nil
}

// readAll reads offsets [from, next) in small chunks.
func readAll(t *testing.T, l *Log, from uint64) []Record {
	t.Helper()
	var out []Record
	for next := l.NextOffset(); from < next; {
		recs, err := l.Read(from, 7, 300)
		if err != nil {
			t.Fatalf("Read(%d): %v", from, err)
		}
		if len(recs) == 0 {
			t.Fatalf("Read(%d) returned nothing below next %d", from, next)
		}
		for _, r := range recs {
			if r.Offset != from {
				t.Fatalf("Read returned offset %d, want %d", r.Offset, from)
			}
			from++
		}
		out = append(out, recs...)
	}
	return out
}

const (
	slogLevelError = slog.LevelError
	slogLevelWarn  = slog.LevelWarn
)
