package main

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/clustertest"
	"github.com/felix-broker/felix/shardmap"
)

// TestStreamMoveUsage: stream move's arguments are checked before any
// cluster is looked for, with a sentence and exit 2.
func TestStreamMoveUsage(t *testing.T) {
	t.Chdir(t.TempDir()) // no felix-cluster.json: nothing to connect to
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"stream", "move", "orders", "--from", "broker-1"}, "missing flags: --shard=N"},
		{[]string{"stream", "move", "orders", "--shard", "2"}, "missing flags: --from=BROKER-ID"},
		{[]string{"stream", "move", "--shard", "2", "--from", "broker-1"}, `expected "<name>"`},
		{[]string{"stream", "move", "orders", "--shard", "-1", "--from", "broker-1"}, "--shard must be a shard number (0 or more), got -1"},
		{[]string{"stream", "move", "orders", "--shard=-1", "--from", "broker-1"}, "--shard must be a shard number (0 or more), got -1"},
		{[]string{"stream", "move", "orders", "--shard", "2", "--from", "broker-1", "--to", "broker-1"}, "--to broker-1 is the broker the replica moves from"},
		{[]string{"stream", "move", "orders", "--shard", "2", "--from", "broker-1", "--wait=-1s"}, "--wait must not be negative, got -1s"},
		{[]string{"stream", "move", "bad/name", "--shard", "2", "--from", "broker-1"}, `cannot move a replica of stream "bad/name": invalid stream name`},
	} {
		r := felixctl(t, nil, tc.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.says) || r.stdout != "" {
			t.Errorf("%v: %+v, want exit 2 saying %q", tc.args, r, tc.says)
		}
		if strings.Contains(r.stderr, "shardmap:") {
			t.Errorf("%v: an internal package prefix leaks: %q", tc.args, r.stderr)
		}
	}
	// Good arguments get as far as looking for the cluster.
	r := felixctl(t, nil, "stream", "move", "orders", "--shard", "2", "--from", "broker-1", "--wait", "0")
	if r.code != exitFailure || !strings.Contains(r.stderr, "no cluster to talk to") {
		t.Errorf("good arguments, no cluster: %+v", r)
	}
	r = felixctl(t, nil, "stream", "move", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "--from=BROKER-ID") || !strings.Contains(r.stdout, "stop it first") || !strings.Contains(r.stdout, `--wait=60s`) {
		t.Errorf("stream move --help: %+v", r)
	}
}

// TestMoveProgress: what stream move prints of the moved replica while it
// joins, and when: a line per change of state, and a learner's offsets
// once a second at most.
func TestMoveProgress(t *testing.T) {
	states := func(target client.ReplicaState) []client.ReplicaState {
		return []client.ReplicaState{
			{Shard: 2, Node: "broker-0", Leader: "broker-0", Next: 300, Member: "voter"},
			{Shard: 2, Node: "broker-2", Leader: "broker-0", Next: 290, Member: "voter"},
			{Shard: 1, Node: "broker-3", Leader: "broker-0", Next: 7, Member: "voter"},
			target,
		}
	}
	none := targetProgress(states(client.ReplicaState{Shard: 0, Node: "broker-0", Next: 5}), 2, "broker-3")
	down := targetProgress(states(client.ReplicaState{Shard: 2, Node: "broker-3", Err: "broker-3 is down in the shard map"}), 2, "broker-3")
	joining := targetProgress(states(client.ReplicaState{Shard: 2, Node: "broker-3", Member: "joining"}), 2, "broker-3")
	learner := targetProgress(states(client.ReplicaState{Shard: 2, Node: "broker-3", Leader: "broker-0", Next: 120, Member: "learner"}), 2, "broker-3")
	further := targetProgress(states(client.ReplicaState{Shard: 2, Node: "broker-3", Leader: "broker-0", Next: 250, Member: "learner"}), 2, "broker-3")
	voter := targetProgress(states(client.ReplicaState{Shard: 2, Node: "broker-3", Leader: "broker-0", Next: 300, Member: "voter"}), 2, "broker-3")
	for _, tc := range []struct {
		p    replicaProgress
		line string
		done bool
	}{
		{none, "broker-3: no replica reported yet", false},
		{down, "broker-3: not reporting (broker-3 is down in the shard map)", false},
		{joining, "broker-3: joining (not admitted to the group yet)", false},
		{learner, "broker-3: learner at offset 120 of 300", false},
		{voter, "broker-3: voter", true},
	} {
		if got := tc.p.String(); got != tc.line || tc.p.done() != tc.done {
			t.Errorf("%+v: %q (done %v), want %q (done %v)", tc.p, got, tc.p.done(), tc.line, tc.done)
		}
	}

	t0 := time.Now()
	for _, tc := range []struct {
		name       string
		p, last    replicaProgress
		since      time.Duration // since the last line
		first, new bool
	}{
		{name: "first", p: none, first: true, new: true},
		{name: "same", p: none, last: none, new: false},
		{name: "reported", p: joining, last: none, new: true},
		{name: "admitted", p: learner, last: joining, new: true},
		{name: "offsets within a second", p: further, last: learner, since: 300 * time.Millisecond, new: false},
		{name: "offsets after a second", p: further, last: learner, since: time.Second, new: true},
		{name: "voter at once", p: voter, last: further, since: 10 * time.Millisecond, new: true},
		{name: "error", p: down, last: learner, new: true},
	} {
		printed := t0.Add(-tc.since)
		if tc.first {
			printed = time.Time{}
		}
		if got := tc.p.newsSince(tc.last, printed, t0); got != tc.new {
			t.Errorf("%s: news %v, want %v", tc.name, got, tc.new)
		}
	}
	if got := none.status(); !strings.Contains(got, "has not reported the replica yet") {
		t.Errorf("status of an unreported replica: %q", got)
	}
	if got := learner.status(); got != "it is a learner at offset 120 of 300" {
		t.Errorf("status of a learner: %q", got)
	}
}

// TestStreamMove moves a replica off a killed broker of a real cluster of
// four, and follows the new replica until it is a voter.
func TestStreamMove(t *testing.T) {
	c := clustertest.Start(t, 4)
	dir := t.TempDir()
	env := map[string]string{"FELIX_CLUSTER": writeClusterFile(t, c, dir)}
	if r := felixctl(t, env, "stream", "create", "r3", "--shards", "2", "--replicas", "3"); r.code != 0 {
		t.Fatalf("%+v", r)
	}
	m, err := c.WaitMap(context.Background(), func(m *shardmap.Map) bool { _, ok := m.Stream("r3"); return ok })
	if err != nil {
		t.Fatal(err)
	}
	st, _ := m.Stream("r3")
	set := st.Placement.Replicas(1)
	if r := felixctl(t, env, "pub", "r3", "before", "--shard", "1", "--count", "20"); r.code != 0 {
		t.Fatalf("%+v", r)
	}
	from, to := set[1], ""
	for _, n := range m.Nodes {
		if !slices.Contains(set, n.ID) {
			to = n.ID
		}
	}

	r := felixctl(t, env, "stream", "move", "r3", "--shard", "1", "--from", from)
	if r.code != 1 || !strings.Contains(r.stderr, from+" is live: stop it first") || strings.Contains(r.stderr, " ctl: ") {
		t.Fatalf("move off a live broker: %+v", r)
	}
	if err := c.Kill(from); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.WaitMap(ctx, func(m *shardmap.Map) bool { n, _ := m.Node(from); return !n.Live }); err != nil {
		t.Fatal(err)
	}
	r = felixctl(t, env, "stream", "move", "r3", "--shard", "1", "--from", from, "--wait", "60s")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	head := regexp.MustCompile(`^moved r3 shard 1: ` + from + ` → ` + to + ` \(map epoch \d+\); ` + to + ` joins the group and catches up from its leader$`)
	if r.code != 0 || !head.MatchString(lines[0]) || lines[len(lines)-1] != to+": voter" {
		t.Fatalf("stream move: %+v", r)
	}
	r = felixctl(t, env, "stream", "info", "r3")
	if r.code != 0 || !regexp.MustCompile(`(?m)^r3/1 +`+to+` +voter `).MatchString(r.stdout) || regexp.MustCompile(`(?m)^r3/1 +`+from+` `).MatchString(r.stdout) {
		t.Errorf("stream info after the move: %+v", r)
	}
}
