package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/cluster"
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

// TestClusterDrainRemoveUsage: cluster drain's and cluster remove's
// arguments are checked before any cluster is looked for, with a
// sentence and exit 2.
func TestClusterDrainRemoveUsage(t *testing.T) {
	t.Chdir(t.TempDir()) // no felix-cluster.json: nothing to connect to
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"cluster", "drain"}, `expected "<broker>"`},
		{[]string{"cluster", "drain", ""}, "name the broker to drain"},
		{[]string{"cluster", "drain", "broker-1", "--parallel", "0"}, "--parallel must be 1 or more, got 0"},
		{[]string{"cluster", "drain", "broker-1", "--parallel=-1"}, "--parallel must be 1 or more, got -1"},
		{[]string{"cluster", "drain", "broker-1", "--wait", "0"}, "--wait must be positive, got 0s"},
		{[]string{"cluster", "drain", "broker-1", "--wait=-1s"}, "--wait must be positive, got -1s"},
		{[]string{"cluster", "remove"}, `expected "<broker>"`},
		{[]string{"cluster", "remove", ""}, "name the broker to remove"},
		{[]string{"cluster", "remove", "broker-1", "broker-2"}, "unexpected argument broker-2"},
	} {
		r := felixctl(t, nil, tc.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.says) || r.stdout != "" {
			t.Errorf("%v: %+v, want exit 2 saying %q", tc.args, r, tc.says)
		}
	}
	// Good arguments get as far as looking for the cluster.
	for _, args := range [][]string{{"cluster", "drain", "broker-1", "--parallel", "4", "--wait", "1m"}, {"cluster", "remove", "broker-1"}} {
		if r := felixctl(t, nil, args...); r.code != exitFailure || !strings.Contains(r.stderr, "no cluster to talk to") {
			t.Errorf("%v, no cluster: %+v", args, r)
		}
	}
	r := felixctl(t, nil, "cluster", "drain", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "--parallel=2") || !strings.Contains(r.stdout, "stop it first") || !strings.Contains(r.stdout, "--wait=5m") {
		t.Errorf("cluster drain --help: %+v", r)
	}
	r = felixctl(t, nil, "cluster", "remove", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "drain") {
		t.Errorf("cluster remove --help: %+v", r)
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
// four, and follows the new replica until it is a voter; then drains the
// broker of its other replicas and removes it from the cluster, which
// is refused while it owns a shard of replication factor 1.
func TestStreamMove(t *testing.T) {
	c := clustertest.Start(t, 4)
	dir := t.TempDir()
	env := map[string]string{"FELIX_CLUSTER": writeClusterFile(t, c, dir)}
	if r := felixctl(t, env, "stream", "create", "r3", "--shards", "3", "--replicas", "3"); r.code != 0 {
		t.Fatalf("%+v", r)
	}
	if r := felixctl(t, env, "stream", "create", "one", "--shards", "8"); r.code != 0 {
		t.Fatalf("%+v", r)
	}
	m, err := c.WaitMap(context.Background(), func(m *shardmap.Map) bool {
		_, r3 := m.Stream("r3")
		_, one := m.Stream("one")
		return r3 && one
	})
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
	r = felixctl(t, env, "--json", "stream", "info", "r3")
	var info streamJSON
	if err := json.Unmarshal([]byte(r.stdout), &info); r.code != 0 || err != nil || info.State[from] != "down" {
		t.Errorf("stream info --json with %s killed: state %v (%v), want it down: %+v", from, info.State, err, r)
	}
	r = felixctl(t, env, "stream", "move", "r3", "--shard", "1", "--from", from, "--wait", "60s")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	for len(lines) > 1 && strings.HasPrefix(lines[0], "waiting for the other replicas of r3/1 ") {
		lines = lines[1:] // the election after the kill was not over yet
	}
	head := regexp.MustCompile(`^moved r3 shard 1: ` + from + ` → ` + to + ` \(map epoch \d+\); ` + to + ` joins the group and catches up from its leader$`)
	if r.code != 0 || !head.MatchString(lines[0]) || lines[len(lines)-1] != to+": voter" {
		t.Fatalf("stream move: %+v", r)
	}
	r = felixctl(t, env, "stream", "info", "r3")
	if r.code != 0 || !regexp.MustCompile(`(?m)^r3/1 +`+to+` +voter `).MatchString(r.stdout) || regexp.MustCompile(`(?m)^r3/1 +`+from+` `).MatchString(r.stdout) ||
		strings.Contains(r.stdout, "[moving in]") {
		t.Errorf("stream info after the move (settled: no replica moving in): %+v", r)
	}

	drainAndRemove(t, c, env, from)
}

// drainAndRemove drains the down broker from of a cluster holding the
// streams r3 (replication factor 3) and one (factor 1, a shard of which
// from owns), removes it once one is deleted, and checks that cluster
// status no longer lists it.
func drainAndRemove(t *testing.T, c *cluster.Cluster, env map[string]string, from string) {
	m, err := c.WaitMap(context.Background(), func(*shardmap.Map) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	r3, _ := m.Stream("r3")
	one, _ := m.Stream("one")
	moves, owned := r3.Placement.ReplicatedBy(from), one.Placement.OwnedBy(from)
	if len(owned) == 0 {
		t.Fatalf("%s owns no shard of one (%v): the test needs one it does", from, one.Placement)
	}
	r := felixctl(t, env, "cluster", "remove", from)
	if r.code != 1 || !strings.Contains(r.stderr, "of streams of replication factor 1 (one/") || !strings.Contains(r.stderr, "forking their offsets") {
		t.Fatalf("removing %s while it owns shards of one: %+v", from, r)
	}

	r = felixctl(t, env, "cluster", "drain", from, "--parallel", "2", "--wait", "60s")
	movedLine := regexp.MustCompile(`(?m)^moved r3/\d: ` + from + ` → broker-\d \(map epoch \d+\); catching up$`)
	voterLine := regexp.MustCompile(`(?m)^r3/\d: broker-\d is a voter$`)
	if r.code != 1 || len(movedLine.FindAllString(r.stdout, -1)) != len(moves) || len(voterLine.FindAllString(r.stdout, -1)) != len(moves) ||
		!strings.Contains(r.stdout, fmt.Sprintf("replication factor 1 cannot move (their logs stay on %s): one/", from)) ||
		!strings.Contains(r.stderr, fmt.Sprintf("%d shard%s of replication factor 1 stay on %s: their logs cannot move", len(owned), plural(len(owned)), from)) {
		t.Fatalf("cluster drain %s (%d replicas to move): %+v", from, len(moves), r)
	}
	if len(moves) > 0 && !strings.Contains(r.stdout, fmt.Sprintf("moved %s's %s, every new one a voter; its %s of replication factor 1 stay on it", from, replicaCount(len(moves)), shardsCount(len(owned)))) {
		t.Errorf("no summary line: %+v", r)
	}
	r = felixctl(t, env, "cluster", "drain", from, "--json")
	if r.code != 1 || !strings.Contains(r.stdout, `{"drain":{"broker":"`+from+`","replicas":0,"parallel":2,"unmovable":["one/`) || !strings.Contains(r.stdout, `{"summary":{"broker":"`+from+`","replicas":0,"moved":0,"voters":0,`) {
		t.Fatalf("cluster drain %s again: %+v", from, r)
	}

	if r := felixctl(t, env, "stream", "rm", "one"); r.code != 0 {
		t.Fatalf("%+v", r)
	}
	r = felixctl(t, env, "cluster", "remove", from)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "removed broker "+from+" from the cluster") {
		t.Fatalf("cluster remove %s: %+v", from, r)
	}
	r = felixctl(t, env, "cluster", "status", "--json")
	if r.code != 0 || strings.Contains(r.stdout, `"id":"`+from+`"`) || !strings.Contains(r.stdout, `"healthy":true`) {
		t.Fatalf("cluster status after removing %s: %+v", from, r)
	}
	r = felixctl(t, env, "cluster", "drain", from)
	if r.code != 1 || !strings.Contains(r.stderr, from+" is not a member of the cluster") {
		t.Fatalf("draining a removed broker: %+v", r)
	}
}

// TestDrainSummary: what cluster drain says at the end, and the error
// (exit 1) it returns when anything is left to do.
func TestDrainSummary(t *testing.T) {
	ids := func(names ...string) []shardmap.ShardID {
		var out []shardmap.ShardID
		for _, n := range names {
			stream, shard, _ := strings.Cut(n, "/")
			out = append(out, shardmap.ShardID{Stream: stream, Shard: int(shard[0] - '0')})
		}
		return out
	}
	for _, tc := range []struct {
		name              string
		moves, unmovable  []shardmap.ShardID
		moved, voters     int
		notMoved, notVote []string
		interrupted       bool
		out               string
		err               []string // "" for none
	}{
		{name: "nothing to do", out: "b1 holds no replica of a replicated stream: nothing to move\nremove it from the cluster with `felixctl cluster remove b1`\n"},
		{name: "drained", moves: ids("r/0", "r/2"), moved: 2, voters: 2,
			out: "drained b1: 2 replicas moved, every new one a voter\nremove it from the cluster with `felixctl cluster remove b1`\n"},
		{name: "unmovable", moves: ids("r/0"), unmovable: ids("a/1", "a/3", "b/0"), moved: 1, voters: 1,
			out: "moved b1's 1 replica, every new one a voter; its 3 shards of replication factor 1 stay on it\n",
			err: []string{"3 shards of replication factor 1 stay on b1: their logs cannot move; bring b1 back to serve them, or, to remove it (`felixctl cluster remove b1`), delete their streams (a, b) first"}},
		{name: "not a voter in time", moves: ids("r/0", "r/1", "r/2"), moved: 3, voters: 2, notVote: []string{"r/1"},
			out: "drain of b1: 3 of 3 replicas moved, 2 of them voters\n",
			err: []string{"1 new replica did not become a voter within --wait 5m0s (r/1); it goes on joining: follow it with `felixctl stream info STREAM`"}},
		{name: "stopped", moves: ids("r/0", "r/1", "r/2"), moved: 1, voters: 1, notMoved: []string{"r/1: the broker refused the request: no live broker"},
			out: "drain of b1: 1 of 3 replicas moved, 1 of them voters\n",
			err: []string{"the drain stopped with 2 of 3 replicas not moved (r/1: the broker refused the request: no live broker): run `felixctl cluster drain b1` again once that is fixed"}},
		{name: "interrupted", moves: ids("r/0", "r/1"), moved: 1, interrupted: true,
			out: "drain of b1: 1 of 2 replicas moved, 0 of them voters\n",
			err: []string{"interrupted with 1 of 2 replicas not moved yet: run `felixctl cluster drain b1` again to move the rest"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.interrupted {
				cancel()
			}
			var out strings.Builder
			d := &drain{a: &app{stdout: &out, flags: &clientFlags{}, ctx: ctx}, cmd: &clusterDrainCmd{Broker: "b1", Parallel: 2, Wait: 5 * time.Minute},
				moves: tc.moves, unmovable: tc.unmovable, moved: tc.moved, voters: tc.voters, notMoved: tc.notMoved, notVoter: tc.notVote}
			err := d.finish()
			if out.String() != tc.out {
				t.Errorf("printed %q, want %q", out.String(), tc.out)
			}
			if (err == nil) != (len(tc.err) == 0) {
				t.Fatalf("error %v, want one saying %q", err, tc.err)
			}
			for _, w := range tc.err {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestOwnersMarkMoveUnderWay: the replica table marks the target of a
// move not yet settled, and nothing once it is.
func TestOwnersMarkMoveUnderWay(t *testing.T) {
	p, err := shardmap.NewReplicatedPlacement([]string{"a", "b", "c"}, []string{"b", "c", "d"}).Move(0, "a", "e", 7)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	writeOwners(&b, "s", p, nil)
	if !regexp.MustCompile(`(?m)^s/0 +e +e \[moving in\], b, c$`).MatchString(b.String()) || strings.Count(b.String(), "[moving in]") != 1 {
		t.Fatalf("owners with a move under way:\n%s", b.String())
	}
	b.Reset()
	writeOwners(&b, "s", p.Settle(0, 7), nil)
	if strings.Contains(b.String(), "[moving in]") {
		t.Fatalf("owners once the move settled:\n%s", b.String())
	}
}
