package demo_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/felix-broker/felix/internal/clustertest"
	"github.com/felix-broker/felix/internal/demo"
)

func TestMain(m *testing.M) {
	code := m.Run()
	clustertest.Cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

// TestRun tells the whole story against a real cluster and asserts it line
// by line: the ownership table, the two paths in the seed's words with
// their offsets, what the subscriber received, the six in order and the
// twenty-four complete, the explanation, and the teardown.
func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	res, err := demo.Run(ctx, &out, demo.Options{Binary: clustertest.Binary(t), Dir: t.TempDir()})
	t.Logf("demo output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	owner, other := res.Owner, res.NonOwner
	if owner == "" || other == "" || owner == other {
		t.Fatalf("owner %q, non-owner %q", owner, other)
	}

	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	var pos int
	// expect finds the next line, at or after pos, matching the regular
	// expression re, and moves past it: the lines must come in this order.
	expect := func(re string) []string {
		t.Helper()
		rx := regexp.MustCompile("^" + re + "$")
		for i := pos; i < len(lines); i++ {
			if m := rx.FindStringSubmatch(lines[i]); m != nil {
				pos = i + 1
				return m
			}
		}
		t.Fatalf("no line matching\n  %s\nafter line %d of the output", re, pos)
		return nil
	}
	q := regexp.QuoteMeta

	expect(q("starting a control plane and three broker processes ..."))
	expect(`shard map epoch \d+`)
	expect(`NODE +ADDRESS +STATE +OWNS`)
	for _, id := range []string{"broker-0", "broker-1", "broker-2"} {
		shards := "no shards"
		if id == owner {
			shards = "1 shard"
		}
		expect(q(id) + ` +127\.0\.0\.1:\d+ +live +` + shards)
	}
	expect(`STREAM +SHARD +OWNER`)
	expect(`orders +0 +` + q(owner))
	expect(q(owner + " owns orders/0: a subscriber is attached to it; publishers may go through any broker."))

	// The two paths, word for word as the seed prints them.
	expect(q("$ felixctl pub orders hello --via " + other))
	expect(q(`published "hello" to orders via ` + other + ` → forwarded to ` + owner + ` → acknowledged`))
	expect(q("$ felixctl pub orders direct --via " + owner))
	expect(q(`published "direct" to orders via ` + owner + ` (the owner) — written locally, no hop`))
	expect(q("the subscriber (attached to " + owner + "):"))
	expect(q(`  received "hello" from orders (shard 0, offset 0)`))
	expect(q(`  received "direct" from orders (shard 0, offset 1)`))
	if !res.Hello.Forwarded || res.Hello.Via != other || res.Hello.Owner != owner {
		t.Errorf("hello ack %+v", res.Hello)
	}
	if res.Direct.Forwarded || res.Direct.Via != owner || res.Direct.Owner != owner {
		t.Errorf("direct ack %+v", res.Direct)
	}

	// Six, one at a time, through each broker in turn: acked, and
	// received in the order sent.
	expect(q("six records sent one at a time, through broker-0, broker-1 and broker-2 in turn:"))
	for i := range 6 {
		via := fmt.Sprintf("broker-%d", i%3)
		path := fmt.Sprintf(`published "seq-%03d" to orders via %s → forwarded to %s → acknowledged`, i, via, owner)
		if via == owner {
			path = fmt.Sprintf(`published "seq-%03d" to orders via %s (the owner) — written locally, no hop`, i, via)
		}
		expect("  " + q(path))
	}
	expect(q("the subscriber received: seq-000 seq-001 seq-002 seq-003 seq-004 seq-005"))
	expect(q("in the order sent: each was acknowledged before the next was published."))

	// Twenty-four, twelve at a time: every one arrives exactly once, with
	// offsets dense after the six.
	expect(q("twenty-four records sent twelve at a time, through broker-0, broker-1 and broker-2 at once:"))
	expect(q("  all 24 acknowledged (16 forwarded to " + owner + ", 8 written locally)"))
	expect(q("the subscriber received, in offset order:"))
	var got []string
	for range 2 {
		m := expect(`  ((?:par-\d{3} ?){12})`)
		got = append(got, strings.Fields(m[1])...)
	}
	sorted := slices.Sorted(slices.Values(got))
	for i, v := range sorted {
		if want := fmt.Sprintf("par-%03d", i); v != want {
			t.Fatalf("the 24 received, sorted: %v; %s missing or duplicated", sorted, want)
		}
	}
	for i, r := range res.Concurrent {
		if r.Offset != uint64(8+i) || string(r.Value) != got[i] {
			t.Fatalf("concurrent record %d: offset %d value %q, want offset %d value %q", i, r.Offset, r.Value, 8+i, got[i])
		}
	}
	expect(`all 24, each once(, in an order that differs from the order sent\.|; this time the owner happened to commit them in the order sent\.)`)
	expect(q(demo.Why))
	expect(q("stopping the cluster ..."))
	expect(q("cluster stopped."))
	if pos != len(lines) {
		t.Errorf("unexpected lines after the story: %q", lines[pos:])
	}
}

// TestRunCancelled checks that the demo tears its cluster down when its
// context ends (Ctrl-C): it returns promptly and leaves no broker running.
func TestRunCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var out bytes.Buffer
	done := make(chan error, 1)
	w := &notifyWriter{w: &out, match: "the cluster settled on this ownership", hit: cancel}
	go func() {
		_, err := demo.Run(ctx, w, demo.Options{Binary: clustertest.Binary(t), Dir: t.TempDir(), Pause: time.Minute})
		done <- err
	}()
	var err error
	select {
	case err = <-done:
		if err == nil {
			t.Fatalf("demo finished despite cancellation:\n%s", out.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("demo did not return after its context was cancelled")
	}
	if !strings.Contains(out.String(), "cluster stopped.") {
		t.Errorf("no teardown in the output (the demo returned %v):\n%s", err, out.String())
	}
}

// notifyWriter calls hit once the output contains match.
type notifyWriter struct {
	w     *bytes.Buffer
	match string
	hit   func()
	done  bool
}

func (n *notifyWriter) Write(p []byte) (int, error) {
	k, err := n.w.Write(p)
	if !n.done && strings.Contains(n.w.String(), n.match) {
		n.done = true
		n.hit()
	}
	return k, err
}
