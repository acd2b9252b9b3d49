package workload

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/history"
	"github.com/felix-broker/felix/transport"
)

func TestOutcome(t *testing.T) {
	for _, c := range []struct {
		err  error
		want history.Outcome
	}{
		{nil, history.Acked},
		{fmt.Errorf("publish: %w", transport.ErrUnauthorized), history.Failed},
		{transport.ErrUnknownStream, history.Failed},
		{client.ErrConnectionLost, history.Unknown},
		{transport.ErrUnavailable, history.Unknown}, // a leader may have committed it before it died
		{errors.New("context deadline exceeded"), history.Unknown},
	} {
		if got := Outcome(c.err); got != c.want {
			t.Errorf("Outcome(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func e(offset uint64, value string) history.Entry { return history.Entry{Offset: offset, Value: value} }

func TestCompare(t *testing.T) {
	logs := [][]history.Entry{{e(0, "a"), e(1, "b")}, {e(0, "c")}}
	if errs := Compare("s", [][]history.Entry{{e(0, "a")}, {e(0, "c")}}, logs); len(errs) != 0 {
		t.Errorf("a prefix of the logs: %v", errs)
	}
	errs := Compare("s", [][]history.Entry{{e(0, "a"), e(1, "x")}, {e(0, "c"), e(1, "d")}}, logs)
	want := []string{`s: shard 0: "x" at offset 1, where the log has "b"`, `s: shard 1: "d" at offset 1, past the log's 1 records`}
	if strings.Join(errs, "\n") != strings.Join(want, "\n") {
		t.Errorf("Compare:\n%s\nwant\n%s", strings.Join(errs, "\n"), strings.Join(want, "\n"))
	}
}
