package history

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

func unknown(pub int, v string, call, ret int) Publish {
	return Publish{Publisher: pub, Value: v, Outcome: Unknown, Call: at(call), Return: at(ret)}
}

// TestCheckFailsBadHistories feeds Check histories a broken broker would
// leave and asserts that each fails, for the reason it should.
func TestCheckFailsBadHistories(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pubs  []Publish
		logs  [][]Entry
		check func(Report) bool // the reason it fails
	}{
		{
			name:  "an acked record lost from the middle of a shard",
			pubs:  []Publish{acked(0, "a", 0, 0, 0, 10), acked(1, "b", 0, 1, 20, 30), acked(0, "c", 0, 2, 40, 50)},
			logs:  [][]Entry{log("a", "c")},
			check: func(r Report) bool { return len(r.Lost) == 1 && r.Lost[0].Value == "b" },
		},
		{
			name: "a record acked by an isolated old leader, its offset taken by the new one's",
			pubs: []Publish{
				acked(0, "a", 0, 0, 0, 10),
				{Publisher: 1, Value: "x", Outcome: Acked, Shard: 0, Offset: 1, Owner: "old", Call: at(20), Return: at(30)},
				{Publisher: 2, Value: "y", Outcome: Acked, Shard: 0, Offset: 1, Owner: "new", Call: at(25), Return: at(40)},
			},
			logs:  [][]Entry{log("a", "y")},
			check: func(r Report) bool { return len(r.Lost) == 1 && r.Lost[0].Value == "x" },
		},
		{
			name: "a record acked by an isolated old leader, then written again by the new one",
			pubs: []Publish{
				acked(0, "a", 0, 0, 0, 10),
				{Publisher: 1, Value: "x", Outcome: Acked, Shard: 0, Offset: 1, Owner: "old", Call: at(20), Return: at(30)},
				acked(2, "y", 0, 1, 25, 40),
			},
			logs:  [][]Entry{log("a", "y", "x")},
			check: func(r Report) bool { return len(r.Misplaced) == 1 && r.Misplaced[0].Value == "x" },
		},
		{
			name:  "an acked record found on another shard",
			pubs:  []Publish{acked(0, "a", 1, 0, 0, 10)},
			logs:  [][]Entry{log("a"), nil},
			check: func(r Report) bool { return len(r.Misplaced) == 1 },
		},
		{
			name:  "an acked record written on two shards",
			pubs:  []Publish{acked(0, "a", 0, 0, 0, 10)},
			logs:  [][]Entry{log("a"), log("a")},
			check: func(r Report) bool { return len(r.Duplicated) == 1 },
		},
		{
			name:  "a record of unknown outcome written twice",
			pubs:  []Publish{acked(0, "a", 0, 0, 0, 10), unknown(1, "u", 5, 50)},
			logs:  [][]Entry{log("a", "u", "u")},
			check: func(r Report) bool { return len(r.Duplicated) == 1 && r.Duplicated[0] == "u" },
		},
		{
			name:  "a record no publisher sent",
			pubs:  []Publish{acked(0, "a", 0, 0, 0, 10)},
			logs:  [][]Entry{log("a", "z")},
			check: func(r Report) bool { return len(r.Phantom) == 1 && r.Phantom[0] == "z" },
		},
		{
			name:  "a shard that starts past offset 0",
			pubs:  []Publish{acked(0, "a", 0, 1, 0, 10)},
			logs:  [][]Entry{{{Offset: 1, Value: "a"}}},
			check: func(r Report) bool { return len(r.Gaps) == 1 },
		},
		{
			name:  "an offset repeated",
			pubs:  []Publish{acked(0, "a", 0, 0, 0, 10), acked(0, "b", 0, 1, 20, 30)},
			logs:  [][]Entry{{{Offset: 0, Value: "a"}, {Offset: 0, Value: "b"}}},
			check: func(r Report) bool { return len(r.Gaps) == 1 },
		},
		{
			name: "a pipelined publisher's record of unknown outcome committed after a later one",
			pubs: []Publish{
				acked(0, "a", 0, 0, 0, 5),
				{Publisher: 0, Value: "b", Outcome: Unknown, Stream: "s", Call: at(10), Return: at(40)}, // sent second, timed out...
				onStream(acked(0, "c", 0, 1, 11, 20), "s"),                                              // ...sent third on its stream, committed before it
			},
			logs:  [][]Entry{log("a", "c", "b")},
			check: func(r Report) bool { return len(r.Reordered) == 1 },
		},
		{
			name: "a record of unknown outcome written before it was sent",
			pubs: []Publish{
				acked(0, "a", 0, 1, 0, 10),
				unknown(1, "u", 20, 30), // found at offset 0, below an offset acked before it was sent
			},
			logs:  [][]Entry{log("u", "a")},
			check: func(r Report) bool { return r.Linearizable == porcupine.Illegal },
		},
		{
			name: "an ack at an offset a later-sent record holds on the final read",
			pubs: []Publish{
				acked(0, "a", 0, 0, 0, 10),
				acked(1, "b", 0, 2, 20, 30), // acked at 2 while 1 was not yet sent
				acked(2, "c", 0, 1, 40, 50),
			},
			logs:  [][]Entry{log("a", "c", "b")},
			check: func(r Report) bool { return r.Linearizable == porcupine.Illegal },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Check(tc.pubs, tc.logs, 10*time.Second)
			if r.OK() {
				t.Fatalf("a bad history passed: %s", r)
			}
			if !tc.check(r) {
				t.Fatalf("failed for another reason than the one expected: %s (%+v)", r, r)
			}
		})
	}
}

func onStream(p Publish, stream string) Publish {
	p.Stream = stream
	return p
}

// TestCheckUnorderedUnknown: a record of unknown outcome whose stream is
// not known, or not the one of the publisher's later records (its
// connection ended, or a probe on a client of its own), has no order with
// them; written late, it is no reorder.
func TestCheckUnorderedUnknown(t *testing.T) {
	for _, b := range []Publish{unknown(0, "b", 10, 40), onStream(unknown(0, "b", 10, 40), "s1")} {
		pubs := []Publish{acked(0, "a", 0, 0, 0, 5), b, onStream(acked(0, "c", 0, 1, 41, 50), "s2")}
		if r := Check(pubs, [][]Entry{log("a", "c", "b")}, 10*time.Second); !r.OK() {
			t.Fatalf("stream %q: report: %s", b.Stream, r)
		}
	}
}
