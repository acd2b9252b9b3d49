package ctl

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// node returns member id as a broker of this build registers it, with
// this build's features.
func node(id string) shardmap.Node {
	return shardmap.Node{ID: id, Addr: "127.0.0.1:" + id, Admin: "127.0.0.1:9" + id, Features: transport.Features()}
}

// threeNodes returns a fresh state with nodes 3, 1, 2 registered under
// sessions 1, 2, 3.
func threeNodes(t *testing.T) *state {
	t.Helper()
	s := newState(snapshot{}, nil)
	for i, id := range []string{"3", "1", "2"} {
		if _, joined, err := s.register(node(id), uint64(i+1)); err != nil || !joined {
			t.Fatalf("register %s: joined=%v err=%v", id, joined, err)
		}
	}
	return s
}

func liveOf(m *shardmap.Map) map[string]bool {
	out := map[string]bool{}
	for _, n := range m.Nodes {
		out[n.ID] = n.Live
	}
	return out
}

func TestRegisterBuildsRendezvousMap(t *testing.T) {
	s := threeNodes(t)
	if err := s.createStream(shardmap.StreamConfig{Name: "orders", Shards: 8}); err != nil {
		t.Fatal(err)
	}
	m := s.Map()
	if got, want := len(m.Nodes), 3; got != want {
		t.Fatalf("nodes = %d, want %d", got, want)
	}
	for i, n := range m.Nodes {
		if want := []string{"1", "2", "3"}[i]; n.ID != want || !n.Live || n.Addr != node(want).Addr || n.Admin != node(want).Admin {
			t.Errorf("node %d = %+v, want live %s sorted by id", i, n, want)
		}
	}
	st, ok := m.Stream("orders")
	if !ok {
		t.Fatal("stream orders missing from map")
	}
	for shard, owner := range st.Placement.All() {
		if want := shardmap.Owner("orders", shard, []string{"1", "2", "3"}); owner != want {
			t.Errorf("owner of orders/%d = %q, want rendezvous owner %q", shard, owner, want)
		}
	}
	// 1 initial epoch, 3 joins, 1 create.
	if m.Epoch != 5 {
		t.Errorf("epoch = %d, want 5", m.Epoch)
	}
}

// TestNodeDownKeepsOwnership: a member whose registration ends (its
// stream closed or its lease in etcd ran out: the leader calls end either
// way) goes down and keeps its shards; registering again brings it back.
func TestNodeDownKeepsOwnership(t *testing.T) {
	s := threeNodes(t)
	if err := s.createStream(shardmap.StreamConfig{Name: "orders", Shards: 16}); err != nil {
		t.Fatal(err)
	}
	before := s.Map()
	if !s.end("2", 3) {
		t.Fatal("end of node 2's registration did not change the map")
	}
	after := s.Map()
	if after.Epoch <= before.Epoch {
		t.Errorf("epoch %d after node 2 went down, not above %d", after.Epoch, before.Epoch)
	}
	if live := liveOf(after); !reflect.DeepEqual(live, map[string]bool{"1": true, "2": false, "3": true}) {
		t.Errorf("live = %v", live)
	}
	if moves := shardmap.Diff(before, after); len(moves) != 0 {
		t.Errorf("node 2 going down moved shards: %v", moves)
	}
	// A new registration (a new live/ key) brings it back, its shards
	// still its own.
	if changed, joined, err := s.register(node("2"), 20); err != nil || !changed || joined {
		t.Fatalf("register again: changed=%v joined=%v err=%v", changed, joined, err)
	}
	if !liveOf(s.Map())["2"] {
		t.Error("node 2 not live after registering again")
	}
	if moves := shardmap.Diff(before, s.Map()); len(moves) != 0 {
		t.Errorf("node 2 coming back moved shards: %v", moves)
	}
}

func TestReregistration(t *testing.T) {
	s := threeNodes(t)
	e := s.Map().Epoch

	// Same node, same address, new session (a replacing registration): no
	// visible change, but the old session is now stale.
	if changed, joined, err := s.register(node("1"), 10); err != nil || changed || joined {
		t.Fatalf("replacing registration: changed=%v joined=%v err=%v", changed, joined, err)
	}
	if s.end("1", 2) {
		t.Error("end of a replaced session changed the map")
	}
	if !liveOf(s.Map())["1"] || s.Map().Epoch != e {
		t.Fatalf("replaced session's end took node 1 down or bumped the epoch")
	}

	// New address: epoch bumps, address updated.
	moved := node("1")
	moved.Addr = "10.0.0.1:7001"
	if changed, _, err := s.register(moved, 11); err != nil || !changed {
		t.Fatalf("register at a new address: changed=%v err=%v", changed, err)
	}
	if n, _ := s.Map().Node("1"); n.Addr != moved.Addr || s.Map().Epoch != e+1 {
		t.Errorf("node 1 = %+v at epoch %d, want addr %s at epoch %d", n, s.Map().Epoch, moved.Addr, e+1)
	}

	// The current session ends: down at once.
	if !s.end("1", 11) || liveOf(s.Map())["1"] {
		t.Error("end of the current session did not take node 1 down")
	}
	if s.end("1", 11) {
		t.Error("second end changed the map")
	}

	for _, bad := range []shardmap.Node{{ID: "", Addr: "x:1"}, {ID: "x", Addr: ""}} {
		if _, _, err := s.register(bad, 12); !errors.Is(err, ErrInvalid) {
			t.Errorf("register %+v: err=%v, want ErrInvalid", bad, err)
		}
	}
}

func TestStreamRegistry(t *testing.T) {
	s := threeNodes(t)
	epochs := []uint64{s.Map().Epoch}
	step := func(what string, err error, want error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Fatalf("%s: err=%v, want %v", what, err, want)
		}
		epochs = append(epochs, s.Map().Epoch)
	}
	step("create a", s.createStream(shardmap.StreamConfig{Name: "a", Shards: 2}), nil)
	step("create b", s.createStream(shardmap.StreamConfig{Name: "b", Shards: 1}), nil)
	if err := s.createStream(shardmap.StreamConfig{Name: "a", Shards: 3}); !errors.Is(err, ErrStreamExists) {
		t.Fatalf("create a again: err=%v, want ErrStreamExists", err)
	}
	if err := s.createStream(shardmap.StreamConfig{Name: "bad name", Shards: 3}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("create with bad name: err=%v, want ErrInvalid", err)
	}
	if err := s.createStream(shardmap.StreamConfig{Name: "c", Shards: 0}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("create with 0 shards: err=%v, want ErrInvalid", err)
	}
	step("delete a", s.deleteStream("a"), nil)
	if err := s.deleteStream("a"); !errors.Is(err, ErrUnknownStream) {
		t.Fatalf("delete a again: err=%v, want ErrUnknownStream", err)
	}
	if len(epochs) != 4 || epochs[3] != epochs[0]+3 {
		t.Errorf("epochs = %v: want one bump per successful change, none per failed one", epochs)
	}
	for i := 1; i < len(epochs); i++ {
		if epochs[i] <= epochs[i-1] {
			t.Errorf("epoch went from %d to %d", epochs[i-1], epochs[i])
		}
	}
	if _, ok := s.Map().Stream("a"); ok {
		t.Error("deleted stream a still in the map")
	}
	if c, err := s.stream("b"); err != nil || c.Shards != 1 {
		t.Errorf("stream b = %+v, %v", c, err)
	}
	// A stream's Created is the epoch of its first map; created again
	// under the same name, it is another stream.
	if b, _ := s.Map().Stream("b"); b.Created != epochs[2] {
		t.Errorf("stream b created at epoch %d, first in the map of epoch %d", b.Created, epochs[2])
	}
	if err := s.createStream(shardmap.StreamConfig{Name: "a", Shards: 2}); err != nil {
		t.Fatal(err)
	}
	if a, _ := s.Map().Stream("a"); a.Created != s.Map().Epoch || a.Created <= epochs[1] {
		t.Errorf("stream a created again at epoch %d (map %d; the first a at %d)", a.Created, s.Map().Epoch, epochs[1])
	}

	cp := s.checkpoint()
	before := s.Map()
	if err := s.createStream(shardmap.StreamConfig{Name: "z", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	s.rollback(cp)
	if s.Map() != before || s.epoch != before.Epoch {
		t.Error("rollback did not restore the map and epoch")
	}
	if _, err := s.stream("z"); !errors.Is(err, ErrUnknownStream) {
		t.Error("rollback kept stream z")
	}
}

func TestPersistRoundTripAndRestart(t *testing.T) {
	dir := t.TempDir()
	s := threeNodes(t)
	for _, c := range []shardmap.StreamConfig{
		{Name: "orders", Shards: 4, RetentionBytes: 1 << 30, RetentionAge: 24 * time.Hour},
		{Name: "audit", Shards: 1},
	} {
		if err := s.createStream(c); err != nil {
			t.Fatal(err)
		}
	}
	s.end("2", 3) // a down member stays a member
	snap := s.snapshot()
	if err := saveState(dir, snap); err != nil {
		t.Fatal(err)
	}
	loaded, err := loadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i := range snap.Members {
		// The state file of earlier versions holds no liveness, nor
		// features, nor superusers.
		snap.Members[i].Live, snap.Members[i].Features = false, nil
	}
	snap.Superusers = nil
	if !reflect.DeepEqual(loaded, snap) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", loaded, snap)
	}

	r := newState(loaded, nil)
	before, after := s.Map(), r.Map()
	if after.Epoch != before.Epoch+1 {
		t.Errorf("restart epoch = %d, want %d (one bump)", after.Epoch, before.Epoch+1)
	}
	for _, n := range after.Nodes {
		if n.Live {
			t.Errorf("node %s live after restart before registering", n.ID)
		}
	}
	if len(after.Nodes) != 3 || len(after.Streams) != 2 {
		t.Fatalf("restart kept %d nodes and %d streams, want 3 and 2", len(after.Nodes), len(after.Streams))
	}
	if moves := shardmap.Diff(before, after); len(moves) != 0 {
		t.Errorf("restart moved shards: %v", moves)
	}
	if o, _ := after.Stream("orders"); o.RetentionAge != 24*time.Hour || o.RetentionBytes != 1<<30 {
		t.Errorf("orders config after restart = %+v", o.StreamConfig)
	}
}

func TestLoadState(t *testing.T) {
	dir := t.TempDir()
	if snap, err := loadState(dir); err != nil || snap.Epoch != 0 || snap.Members != nil {
		t.Fatalf("missing file: %+v, %v; want an empty state", snap, err)
	}
	for name, body := range map[string]string{
		"not json":     "{",
		"version":      `{"version":2,"epoch":1}`,
		"dup member":   `{"version":1,"members":[{"id":"a","addr":"x"},{"id":"a","addr":"y"}]}`,
		"empty member": `{"version":1,"members":[{"id":"","addr":"x"}]}`,
		"bad stream":   `{"version":1,"streams":[{"name":"x","shards":0}]}`,
		"dup stream":   `{"version":1,"streams":[{"name":"x","shards":1},{"name":"x","shards":1}]}`,
	} {
		if err := os.WriteFile(filepath.Join(dir, stateFile), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := loadState(dir); err == nil {
			t.Errorf("%s: loaded without error", name)
		}
	}
	// No temporary files are left behind by saves.
	if err := saveState(dir, snapshot{Epoch: 3}); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("dir holds %d entries after save, want only %s", len(entries), stateFile)
	}
}
