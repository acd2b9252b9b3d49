package ctl

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
)

// The golden files in testdata were written by the version whose stream
// placement was a bare owners slice (shardmap.Stream.Owners []string):
// ctl-state-v1.json by its saveState, etcd-streams-v1.jsonl one streams/
// value per line as its store put them in etcd. This version must read
// them as they were, and write the same bytes.

// goldenOrders is the placed stream of the golden files.
var goldenOrders = shardmap.Stream{
	StreamConfig: shardmap.StreamConfig{Name: "orders", Shards: 4, RetentionBytes: 1 << 30, RetentionAge: 24 * time.Hour},
	Placement:    shardmap.NewPlacement("b1", "b0", "", "b1"),
}

// goldenUnplaced is the golden stream created before any member joined.
var goldenUnplaced = shardmap.Stream{StreamConfig: shardmap.StreamConfig{Name: "unplaced", Shards: 2}}

func sameStream(a, b shardmap.Stream) bool {
	return a.StreamConfig == b.StreamConfig && a.Placement.Equal(b.Placement)
}

func TestReadOldStateFile(t *testing.T) {
	golden, err := os.ReadFile(filepath.Join("testdata", "ctl-state-v1.json"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, stateFile), golden, 0o600); err != nil {
		t.Fatal(err)
	}
	snap, err := loadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Epoch != 41 || len(snap.Members) != 2 || len(snap.Streams) != 2 || len(snap.Grants) != 1 {
		t.Fatalf("loaded %+v", snap)
	}
	if !sameStream(snap.Streams[0], goldenOrders) || !sameStream(snap.Streams[1], goldenUnplaced) {
		t.Fatalf("streams %+v, want %+v and %+v", snap.Streams, goldenOrders, goldenUnplaced)
	}
	// Loaded, the unplaced stream is placed over the members; the placed
	// one keeps its owners, "" aside.
	st, _ := newState(snap, nil).Map().Stream("orders")
	for shard, want := range []string{"b1", "b0", shardmap.Owner("orders", 2, []string{"b0", "b1"}), "b1"} {
		if got := st.Placement.Owner(shard); got != want {
			t.Errorf("orders/%d owned by %q after load, want %q", shard, got, want)
		}
	}

	out := t.TempDir()
	if err := saveState(out, snap); err != nil {
		t.Fatal(err)
	}
	again, err := os.ReadFile(filepath.Join(out, stateFile))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, golden) {
		t.Fatalf("state file written differently:\n%s\nwant\n%s", again, golden)
	}
}

func TestReadOldEtcdStreams(t *testing.T) {
	golden, err := os.ReadFile(filepath.Join("testdata", "etcd-streams-v1.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSpace(golden), []byte("\n"))
	want := []shardmap.Stream{goldenOrders, goldenUnplaced}
	if len(lines) != len(want) {
		t.Fatalf("%d golden documents, want %d", len(lines), len(want))
	}
	for i, line := range lines {
		var fs fileStream
		if err := json.Unmarshal(line, &fs); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		st, err := fs.stream()
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		if !sameStream(st, want[i]) {
			t.Fatalf("%s read as %+v, want %+v", line, st, want[i])
		}
		b, err := json.Marshal(toFileStream(st))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, line) {
			t.Fatalf("stream stored as %s, was %s", b, line)
		}
	}
	var fs fileStream
	if err := json.Unmarshal([]byte(`{"name":"x","shards":1,"owners":["a","b"]}`), &fs); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.stream(); err == nil {
		t.Fatal("a stream with more owners than shards must be refused")
	}
}
