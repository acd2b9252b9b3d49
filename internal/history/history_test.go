package history

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

var t0 = time.Unix(1000, 0)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func acked(pub int, v string, shard int, off uint64, call, ret int) Publish {
	return Publish{Publisher: pub, Value: v, Outcome: Acked, Shard: shard, Offset: off, Call: at(call), Return: at(ret)}
}

func log(values ...string) []Entry {
	out := make([]Entry, len(values))
	for i, v := range values {
		out[i] = Entry{Offset: uint64(i), Value: v}
	}
	return out
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pubs  []Publish
		logs  [][]Entry
		ok    bool
		check func(Report) bool
	}{
		{
			name: "clean, with an unknown outcome written and one not",
			pubs: []Publish{
				acked(0, "a", 0, 0, 0, 10),
				{Publisher: 1, Value: "u1", Outcome: Unknown, Call: at(5), Return: at(50)},
				acked(0, "b", 0, 2, 20, 30),
				{Publisher: 1, Value: "u2", Outcome: Unknown, Call: at(60), Return: at(70)},
				{Publisher: 2, Value: "f", Outcome: Failed, Call: at(1), Return: at(2)},
			},
			logs:  [][]Entry{log("a", "u1", "b")},
			ok:    true,
			check: func(r Report) bool { return r.Unknown == 2 && r.UnknownWritten == 1 && r.Acked == 2 },
		},
		{
			name:  "an acked record lost",
			pubs:  []Publish{acked(0, "a", 0, 0, 0, 10), acked(0, "b", 0, 1, 20, 30)},
			logs:  [][]Entry{log("a")},
			check: func(r Report) bool { return len(r.Lost) == 1 && r.Lost[0].Value == "b" },
		},
		{
			name:  "a record written twice",
			pubs:  []Publish{acked(0, "a", 0, 0, 0, 10)},
			logs:  [][]Entry{log("a", "a")},
			check: func(r Report) bool { return len(r.Duplicated) == 1 },
		},
		{
			name:  "a failed publish found in the log",
			pubs:  []Publish{{Value: "f", Outcome: Failed, Call: at(0), Return: at(1)}},
			logs:  [][]Entry{log("f")},
			check: func(r Report) bool { return len(r.Phantom) == 1 },
		},
		{
			name: "a publisher's records out of order",
			pubs: []Publish{
				acked(0, "a", 0, 1, 0, 100),
				acked(0, "b", 0, 0, 10, 20), // pipelined: called after a, committed before it
			},
			logs:  [][]Entry{log("b", "a")},
			check: func(r Report) bool { return len(r.Reordered) == 1 },
		},
		{
			name: "an ack that contradicts real time",
			pubs: []Publish{
				acked(0, "a", 0, 1, 0, 10),  // acked at offset 1 before b was even sent...
				acked(1, "b", 0, 0, 20, 30), // ...and b took offset 0
			},
			logs:  [][]Entry{log("b", "a")},
			check: func(r Report) bool { return r.Linearizable == porcupine.Illegal },
		},
		{
			name:  "a gap in the offsets",
			pubs:  []Publish{acked(0, "a", 0, 0, 0, 10)},
			logs:  [][]Entry{{{Offset: 0, Value: "a"}, {Offset: 2, Value: "x"}}},
			check: func(r Report) bool { return len(r.Gaps) == 1 },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Check(tc.pubs, tc.logs, 10*time.Second)
			if r.OK() != tc.ok || (tc.check != nil && !tc.check(r)) {
				t.Fatalf("report: %s (%+v)", r, r)
			}
		})
	}
}
