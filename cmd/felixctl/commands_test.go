package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/felix-broker/felix/internal/clustertest"
	"github.com/felix-broker/felix/shardmap"
)

// TestCommands drives pub, sub, stream and cluster status against a real
// cluster, with and without --json, through every way of finding it, and
// then with a broker killed.
func TestCommands(t *testing.T) {
	c := clustertest.Start(t, 3)
	dir := t.TempDir()
	file := writeClusterFile(t, c, dir)
	env := map[string]string{"FELIX_CLUSTER": file}

	// The stream, and who owns it.
	r := felixctl(t, env, "stream", "create", "orders", "--shards", "1")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "created stream orders with 1 shard, retention unlimited\n") {
		t.Fatalf("stream create: %+v", r)
	}
	m, err := c.WaitMap(context.Background(), func(m *shardmap.Map) bool { _, ok := m.Stream("orders"); return ok })
	if err != nil {
		t.Fatal(err)
	}
	o, _ := m.Owner("orders", 0)
	owner := o.ID
	other := "broker-0"
	if owner == other {
		other = "broker-1"
	}
	if r := felixctl(t, env, "stream", "create", "orders"); r.code != 1 || !strings.Contains(r.stderr, `stream "orders" already exists`) {
		t.Errorf("creating it again: %+v", r)
	}

	t.Run("pub prints the path in the seed's words", func(t *testing.T) {
		r := felixctl(t, env, "pub", "orders", "hello", "--via", other)
		want := fmt.Sprintf("published \"hello\" to orders via %s → forwarded to %s → acknowledged\n", other, owner)
		if r.code != 0 || r.stdout != want {
			t.Fatalf("got %q (exit %d), want %q", r.stdout, r.code, want)
		}
		r = felixctl(t, env, "pub", "orders", "direct", "--via", owner)
		want = fmt.Sprintf("published \"direct\" to orders via %s (the owner) — written locally, no hop\n", owner)
		if r.code != 0 || r.stdout != want {
			t.Fatalf("got %q (exit %d), want %q", r.stdout, r.code, want)
		}
	})

	t.Run("pub --json", func(t *testing.T) {
		r := felixctl(t, env, "pub", "orders", "j", "--json", "--via", other)
		var ack pubJSON
		if err := json.Unmarshal([]byte(r.stdout), &ack); err != nil || r.code != 0 {
			t.Fatalf("%v: %+v", err, r)
		}
		if ack.Stream != "orders" || ack.Offset != 2 || ack.Via != other || ack.Owner != owner || !ack.Forwarded || ack.Value != "j" {
			t.Errorf("ack %+v", ack)
		}
	})

	t.Run("pub --count through each broker in turn", func(t *testing.T) {
		r := felixctl(t, env, "pub", "orders", "seq", "--count", "3", "--via", "broker-0,broker-1,broker-2", "--json")
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if r.code != 0 || len(lines) != 3 {
			t.Fatalf("%+v", r)
		}
		for i, l := range lines {
			var ack pubJSON
			if err := json.Unmarshal([]byte(l), &ack); err != nil || ack.Value != fmt.Sprintf("seq-%03d", i) || ack.Via != fmt.Sprintf("broker-%d", i) ||
				ack.Shard != 0 || ack.Offset != uint64(3+i) {
				t.Errorf("line %d: %q (%v)", i, l, err)
			}
		}
	})

	t.Run("sub", func(t *testing.T) {
		r := felixctl(t, env, "sub", "orders", "--count", "3", "--wait", "20s")
		want := "received \"hello\" from orders (shard 0, offset 0)\nreceived \"direct\" from orders (shard 0, offset 1)\nreceived \"j\" from orders (shard 0, offset 2)\n"
		if r.code != 0 || r.stdout != want {
			t.Fatalf("got %q, want %q", r.stdout, want)
		}
		if !strings.Contains(r.stderr, "subscribed to orders from earliest") {
			t.Errorf("no header on stderr: %q", r.stderr)
		}
		r = felixctl(t, env, "sub", "orders", "--via", owner, "--from", "5", "--count", "1", "--wait", "20s")
		if r.code != 0 || r.stdout != "received \"seq-002\" from orders (shard 0, offset 5)\n" ||
			!strings.Contains(r.stderr, "attached to "+owner+" (the owner)") {
			t.Errorf("from offset 5 via the owner: %+v", r)
		}
		r = felixctl(t, env, "sub", "orders", "--json", "--count", "1", "--wait", "20s")
		var rec subJSON
		if err := json.Unmarshal([]byte(r.stdout), &rec); err != nil || rec.Value != "hello" || rec.Offset != 0 || r.stderr != "" {
			t.Errorf("sub --json: %v %+v", err, r)
		}
		// Fewer records than --count within --wait: a failure that says so.
		r = felixctl(t, env, "sub", "orders", "--from", "latest", "--count", "2", "--wait", "300ms")
		if r.code != 1 || !strings.Contains(r.stderr, "received 0 of 2 records from orders within 300ms") {
			t.Errorf("sub past --wait: %+v", r)
		}
		// Without --count, --wait is how long to listen: exit 0 after it.
		start := time.Now()
		r = felixctl(t, env, "sub", "orders", "--from", "latest", "--wait", "500ms")
		if r.code != 0 || r.stdout != "" || time.Since(start) < 500*time.Millisecond {
			t.Errorf("sub --wait without --count: %+v", r)
		}
		// An offset must be an offset; a shard must be one of the stream's.
		r = felixctl(t, env, "sub", "orders", "--from", "-5")
		if r.code != 2 || !strings.Contains(r.stderr, "felixctl: --from must be earliest, latest or an offset (0 or more), got -5") {
			t.Errorf("sub --from -5: %+v", r)
		}
		r = felixctl(t, env, "sub", "orders", "--shard", "3", "--count", "1")
		if r.code != 2 || !strings.Contains(r.stderr, `felixctl: stream "orders" has 1 shard: --shard must be 0, got 3`) {
			t.Errorf("sub --shard 3: %+v", r)
		}
		if strings.Contains(r.stderr, "shardmap:") || strings.Contains(r.stderr, "client:") {
			t.Errorf("an internal package prefix leaks: %q", r.stderr)
		}
	})

	t.Run("values from stdin and files, headers, large values", func(t *testing.T) {
		r := felixctlIn(t, env, "from stdin", "pub", "orders", "-", "--header", "trace=abc", "-H", "kind=note", "--json")
		var ack pubJSON
		if err := json.Unmarshal([]byte(r.stdout), &ack); err != nil || r.code != 0 || ack.Value != "from stdin" {
			t.Fatalf("pub - : %v %+v", err, r)
		}
		r = felixctl(t, env, "sub", "orders", "--from", fmt.Sprint(ack.Offset), "--count", "1", "--wait", "20s", "--json")
		var rec subJSON
		if err := json.Unmarshal([]byte(r.stdout), &rec); err != nil || rec.Value != "from stdin" ||
			rec.Headers["trace"] != "abc" || rec.Headers["kind"] != "note" {
			t.Errorf("the record published from stdin: %v %+v", err, r)
		}
		big := strings.Repeat("x", 5000)
		file := filepath.Join(t.TempDir(), "big.txt")
		if err := os.WriteFile(file, []byte(big), 0o644); err != nil {
			t.Fatal(err)
		}
		r = felixctl(t, env, "pub", "orders", "--file", file, "--via", owner)
		if r.code != 0 || !strings.HasPrefix(r.stdout, `published "`+big[:32]+`…" (4.9 KiB) to orders via `+owner) || len(r.stdout) > 200 {
			t.Errorf("pub --file of 5000 bytes: %+v", r)
		}
		if r := felixctl(t, env, "pub", "orders", "x", "--header", "nokey"); r.code != 2 || !strings.Contains(r.stderr, `--header "nokey": write it as KEY=VALUE`) {
			t.Errorf("a header without '=': %+v", r)
		}
		if r := felixctl(t, env, "pub", "--help"); r.code != 0 || !strings.Contains(r.stdout, "--max-record-bytes") || !strings.Contains(r.stdout, "1 MiB") {
			t.Errorf("pub --help does not document the record size limit: %+v", r)
		}
	})

	t.Run("global flags anywhere", func(t *testing.T) {
		// Before the command, after it, and between its words.
		for _, args := range [][]string{
			{"--json", "stream", "ls"},
			{"stream", "--json", "ls"},
			{"stream", "ls", "--json"},
			{"--cluster", file, "--json", "stream", "ls"},
		} {
			r := felixctl(t, env, args...)
			var st streamJSON
			if err := json.Unmarshal([]byte(strings.SplitN(r.stdout, "\n", 2)[0]), &st); r.code != 0 || err != nil || st.Name == "" {
				t.Errorf("%v: %v %+v", args, err, r)
			}
		}
		// A command's help lists its own flags, not the connection flags.
		r := felixctl(t, env, "pub", "--help")
		if strings.Contains(r.stdout, "--cert-key=FILE") || !strings.Contains(r.stdout, "--concurrency") || !strings.Contains(r.stdout, "Connection flags") {
			t.Errorf("pub --help: %+v", r)
		}
		if r := felixctl(t, env, "--help"); !strings.Contains(r.stdout, "--cert-key=FILE") {
			t.Errorf("--help lacks the connection flags: %+v", r)
		}
	})

	t.Run("version", func(t *testing.T) {
		for _, args := range [][]string{{"version"}, {"--version"}} {
			r := felixctl(t, env, args...)
			if r.code != 0 || !regexp.MustCompile(`^felixctl \S+ \(`).MatchString(r.stdout) {
				t.Errorf("%v: %+v", args, r)
			}
		}
		r := felixctl(t, env, "version", "--json")
		var v versionJSON
		if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.Version == "" || v.GoVersion == "" {
			t.Errorf("version --json: %v %+v", err, r)
		}
	})

	t.Run("contexts", func(t *testing.T) {
		cfg := t.TempDir()
		cenv := map[string]string{"XDG_CONFIG_HOME": cfg}
		t.Chdir(t.TempDir()) // no felix-cluster.json here
		if r := felixctl(t, cenv, "context", "ls"); r.code != 0 || !strings.HasPrefix(r.stdout, "no contexts saved in "+filepath.Join(cfg, "felix")) {
			t.Errorf("context ls, none: %+v", r)
		}
		if r := felixctl(t, cenv, "cluster", "status"); r.code != 1 || !strings.Contains(r.stderr, "no cluster to talk to") {
			t.Errorf("no context, no file: %+v", r)
		}
		if r := felixctl(t, cenv, "context", "add", "local", "--cluster", file, "--description", "the test cluster"); r.code != 0 || r.stdout != "saved context local: "+file+"\n" {
			t.Fatalf("context add: %+v", r)
		}
		b := c.Broker(other)
		cert, key := c.AdminCert()
		if r := felixctl(t, cenv, "context", "add", "one", "--broker", b.Addr, "--ca", c.CAFile(), "--cert", cert, "--cert-key", key, "--use"); r.code != 0 ||
			!strings.Contains(r.stdout, "selected context one") {
			t.Fatalf("context add --use: %+v", r)
		}
		r := felixctl(t, cenv, "context", "ls")
		if r.code != 0 || !regexp.MustCompile(`(?m)^ +local +`+regexp.QuoteMeta(file)+` +the test cluster$`).MatchString(r.stdout) ||
			!regexp.MustCompile(`(?m)^\* +one +`+regexp.QuoteMeta(b.Addr)).MatchString(r.stdout) {
			t.Errorf("context ls: %+v", r)
		}
		// The selected context is used when nothing else names a cluster.
		r = felixctl(t, cenv, "pub", "orders", "ctx")
		if r.code != 0 || !strings.HasPrefix(r.stdout, `published "ctx" to orders via `+other) {
			t.Errorf("pub through the selected context: %+v", r)
		}
		// --context beats the selected one; the environment beats the
		// selected one; a flag beats the environment.
		if r := felixctl(t, cenv, "--context", "local", "cluster", "status"); r.code != 0 {
			t.Errorf("--context local: %+v", r)
		}
		withEnv := map[string]string{"XDG_CONFIG_HOME": cfg, "FELIX_CONTEXT": "nope"}
		if r := felixctl(t, withEnv, "cluster", "status"); r.code != 2 || !strings.Contains(r.stderr, `there is no context "nope"; the saved ones are local, one`) {
			t.Errorf("FELIX_CONTEXT=nope: %+v", r)
		}
		if r := felixctl(t, withEnv, "cluster", "status", "--context", "local"); r.code != 0 {
			t.Errorf("--context over FELIX_CONTEXT: %+v", r)
		}
		if r := felixctl(t, cenv, "context", "use", "local"); r.code != 0 || !strings.HasPrefix(r.stdout, "selected context local: ") {
			t.Errorf("context use: %+v", r)
		}
		r = felixctl(t, cenv, "context", "ls", "--json")
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		var first contextJSON
		if len(lines) != 2 || json.Unmarshal([]byte(lines[0]), &first) != nil || first.Name != "local" || !first.Selected || first.Cluster != file {
			t.Errorf("context ls --json: %+v", r)
		}
		if r := felixctl(t, cenv, "context", "rm", "local"); r.code != 0 || r.stdout != "deleted context local\n" {
			t.Errorf("context rm: %+v", r)
		}
		if r := felixctl(t, cenv, "context", "add", "bad"); r.code != 2 || !strings.Contains(r.stderr, "say where the cluster is") {
			t.Errorf("context add with no cluster: %+v", r)
		}
	})

	t.Run("stream ls, info, rm", func(t *testing.T) {
		if r := felixctl(t, env, "stream", "create", "pay", "--shards", "3"); r.code != 0 {
			t.Fatalf("%+v", r)
		}
		r := felixctl(t, env, "stream", "ls")
		if r.code != 0 || !regexp.MustCompile(`(?m)^orders +1 +1 +unlimited$`).MatchString(r.stdout) || !regexp.MustCompile(`(?m)^pay +3 +1 +unlimited$`).MatchString(r.stdout) {
			t.Errorf("stream ls: %+v", r)
		}
		r = felixctl(t, env, "stream", "ls", "--json")
		if list := ndjson[streamJSON](t, r.stdout); len(list) != 2 || list[0].Name != "orders" || list[1].Shards != 3 {
			t.Errorf("stream ls --json: %+v", r)
		}
		r = felixctl(t, env, "stream", "info", "orders")
		if r.code != 0 || !strings.HasPrefix(r.stdout, "stream orders: 1 shard, retention unlimited\n") ||
			!regexp.MustCompile(`(?m)^orders/0 +`+owner+` +live$`).MatchString(r.stdout) {
			t.Errorf("stream info: %+v", r)
		}
		// An offset of a stream of several shards needs --shard: a usage
		// error (it exited 1, with the SDK's error).
		if r := felixctl(t, env, "sub", "pay", "--from", "3", "--count", "1"); r.code != exitUsage || !strings.Contains(r.stderr, "add --shard") {
			t.Errorf("sub --from 3 on a stream of 3 shards: %+v", r)
		}
		r = felixctl(t, env, "stream", "info", "pay", "--json")
		var info struct {
			Shards int      `json:"shards"`
			Owners []string `json:"owners"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &info); err != nil || info.Shards != 3 || len(info.Owners) != 3 {
			t.Errorf("stream info --json: %v %+v", err, r)
		}
		if r := felixctl(t, env, "stream", "rm", "pay"); r.code != 0 || r.stdout != "deleted stream pay and its records\n" {
			t.Errorf("stream rm: %+v", r)
		}
		r = felixctl(t, env, "stream", "info", "nope")
		if r.code != 1 || !strings.Contains(r.stderr, "felixctl: stream \"nope\" does not exist: create it with `felixctl stream create nope --shards N`") {
			t.Errorf("info of a missing stream: %+v", r)
		}
		r = felixctl(t, env, "pub", "nope", "x")
		if r.code != 1 || !strings.Contains(r.stderr, "stream \"nope\" does not exist") {
			t.Errorf("pub to a missing stream: %+v", r)
		}

	})

	t.Run("replicated stream", func(t *testing.T) {
		if r := felixctl(t, env, "stream", "create", "r3", "--replicas", "2"); r.code == 0 || !strings.Contains(r.stderr, "replicas must be 1 or 3") {
			t.Errorf("--replicas 2: %+v", r)
		}
		r := felixctl(t, env, "stream", "create", "r3", "--shards", "2", "--replicas", "3")
		if r.code != 0 || !strings.HasPrefix(r.stdout, "created stream r3 with 2 shards, retention unlimited, 3 replicas per shard\n") {
			t.Fatalf("create --replicas 3: %+v", r)
		}
		r = felixctl(t, env, "stream", "info", "r3")
		// Each shard lists its three replicas, the owner (preferred
		// leader) first.
		if r.code != 0 || !regexp.MustCompile(`(?m)^r3/1 +broker-\d +live +broker-\d \(live\), broker-\d \(live\), broker-\d \(live\)$`).MatchString(r.stdout) {
			t.Errorf("stream info of a replicated stream: %+v", r)
		}
		r = felixctl(t, env, "stream", "info", "r3", "--json")
		var info struct {
			Replicas int        `json:"replicas"`
			Owners   [][]string `json:"owners"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &info); err != nil || info.Replicas != 3 || len(info.Owners) != 2 || len(info.Owners[0]) != 3 {
			t.Errorf("stream info --json of a replicated stream: %v %+v", err, r)
		}
		if r := felixctl(t, env, "pub", "r3", "hello", "--shard", "1", "--json"); r.code != 0 || !strings.Contains(r.stdout, `"shard":1,"offset":0,`) {
			t.Errorf("pub to a replicated stream: %+v", r)
		}
		// Each replica reports the leader it knows and its committed
		// offsets: the record is on every replica (none behind) once
		// the followers learn the commit.
		caughtUp := regexp.MustCompile(`(?m)^r3/1 +broker-\d +voter +broker-\d +\d+ +0 +1 +0$`)
		deadline := time.Now().Add(10 * time.Second)
		for {
			r = felixctl(t, env, "stream", "info", "r3")
			if len(caughtUp.FindAllString(r.stdout, -1)) == 3 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("stream info does not show three replicas of r3/1 with the record committed: %+v", r)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if r := felixctl(t, env, "stream", "rm", "r3"); r.code != 0 {
			t.Errorf("stream rm of a replicated stream: %+v", r)
		}
	})

	t.Run("discovery", func(t *testing.T) {
		// No flags, no environment: the file in the working directory.
		t.Chdir(dir)
		r := felixctl(t, nil, "pub", "orders", "found", "--via", owner)
		if r.code != 0 || !strings.HasPrefix(r.stdout, `published "found" to orders via `+owner) {
			t.Errorf("no-flag discovery: %+v", r)
		}
		// The environment beats the file...
		r = felixctl(t, map[string]string{"FELIX_CLUSTER": "/nonexistent.json"}, "cluster", "status")
		if r.code != 1 || !strings.Contains(r.stderr, "felixctl: no cluster to talk to: the connection file /nonexistent.json (FELIX_CLUSTER) does not exist") {
			t.Errorf("env over file: %+v", r)
		}
		// ... and flags beat the environment.
		r = felixctl(t, map[string]string{"FELIX_CLUSTER": "/nonexistent.json"}, "cluster", "status", "--cluster", file)
		if r.code != 0 {
			t.Errorf("flag over env: %+v", r)
		}
		b := c.Broker(other)
		cert, key := c.AdminCert()
		r = felixctl(t, map[string]string{"FELIX_CLUSTER": "/nonexistent.json"}, "pub", "orders", "addr", "--broker", b.Addr, "--ca", c.CAFile(), "--cert", cert, "--cert-key", key)
		if r.code != 0 || !strings.HasPrefix(r.stdout, `published "addr" to orders via `+other+" → forwarded to "+owner) {
			t.Errorf("--broker: %+v", r)
		}
		// --via an id the cluster file does not list: found in the map.
		r = felixctl(t, map[string]string{"FELIX_BROKER": b.Addr, "FELIX_CA": c.CAFile(), "FELIX_CERT": cert, "FELIX_CERT_KEY": key}, "pub", "orders", "addr", "--via", owner)
		if r.code != 0 || !strings.Contains(r.stdout, "via "+owner+" (the owner)") {
			t.Errorf("FELIX_BROKER with --via: %+v", r)
		}
		r = felixctl(t, nil, "pub", "orders", "x", "--broker", b.Addr)
		if r.code != 2 || !strings.Contains(r.stderr, "--broker needs the cluster CA certificate") {
			t.Errorf("--broker without --ca: %+v", r)
		}
		r = felixctl(t, map[string]string{"FELIX_BROKER": b.Addr, "FELIX_CA": c.CAFile()}, "pub", "orders", "x")
		if r.code != 2 || !strings.Contains(r.stderr, "names no client certificate: add --cert FILE --cert-key FILE") {
			t.Errorf("--broker without --cert: %+v", r)
		}
		r = felixctl(t, nil, "pub", "orders", "x", "--via", "broker-9")
		if r.code != 2 || !strings.Contains(r.stderr, "the cluster has no broker broker-9; its brokers are broker-0, broker-1, broker-2") {
			t.Errorf("--via an unknown broker: %+v", r)
		}
	})

	t.Run("acl", func(t *testing.T) {
		cert, key, err := c.IssueClientCert("carol")
		if err != nil {
			t.Fatal(err)
		}
		carol := map[string]string{"FELIX_CLUSTER": file, "FELIX_CERT": cert, "FELIX_CERT_KEY": key}
		r := felixctl(t, carol, "pub", "orders", "hi")
		if r.code != 1 || !strings.Contains(r.stderr, `principal "carol" is not authorized for publish on stream "orders"`) {
			t.Fatalf("carol publishes without a grant: %+v", r)
		}
		if r := felixctl(t, carol, "acl", "grant", "carol", "publish", "orders"); r.code != 1 || !strings.Contains(r.stderr, "not authorized for cluster.admin") {
			t.Fatalf("carol grants herself: %+v", r)
		}
		if r := felixctl(t, env, "acl", "grant", "carol", "publish", "orders"); r.code != 0 || r.stdout != "granted: carol may publish orders\n" {
			t.Fatalf("admin grants carol: %+v", r)
		}
		if r := felixctl(t, env, "acl", "ls"); r.code != 0 || !regexp.MustCompile(`(?m)^carol +publish +orders$`).MatchString(r.stdout) {
			t.Fatalf("acl ls: %+v", r)
		}
		// The grant reaches every broker with the next map; carol's next
		// publish through any of them is allowed.
		deadline := time.Now().Add(10 * time.Second)
		for {
			r = felixctl(t, carol, "pub", "orders", "hi", "--via", other)
			if r.code == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if r.code != 0 {
			t.Fatalf("carol publishes after the grant: %+v", r)
		}
		if r := felixctl(t, carol, "sub", "orders", "--from", "earliest", "--count", "1", "--wait", "2s"); r.code == 0 || !strings.Contains(r.stderr, "not authorized for subscribe") {
			t.Fatalf("carol subscribes with only publish: %+v", r)
		}
		if r := felixctl(t, env, "acl", "revoke", "carol", "publish", "orders"); r.code != 0 {
			t.Fatalf("revoke: %+v", r)
		}
		if r := felixctl(t, env, "acl", "grant", "carol", "frobnicate"); r.code != 2 || !strings.Contains(r.stderr, `unknown action "frobnicate"`) {
			t.Fatalf("grant of an unknown action: %+v", r)
		}
	})

	t.Run("usage", func(t *testing.T) {
		for _, args := range [][]string{{"pub", "orders"}, {"frobnicate"}, {"pub", "orders", "x", "--count", "0"}, {"sub", "orders", "--from", "soon"}} {
			if r := felixctl(t, env, args...); r.code != 2 || r.stderr == "" {
				t.Errorf("%v: %+v", args, r)
			}
		}
	})

	t.Run("cluster status healthy", func(t *testing.T) {
		r := felixctl(t, env, "cluster", "status")
		if r.code != 0 || !strings.HasSuffix(r.stdout, "healthy: all 3 brokers live\n") ||
			!regexp.MustCompile(`(?m)^orders +0 +`+owner+`$`).MatchString(r.stdout) ||
			!regexp.MustCompile(`(?m)^\S+ +127\.0\.0\.1:\d+ +leader +https://127\.0\.0\.1:\d+ +healthy \(raft leader\)$`).MatchString(r.stdout) {
			t.Errorf("%+v", r)
		}
		r = felixctl(t, env, "cluster", "status", "--json")
		var st statusJSON
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || !st.Healthy || len(st.Nodes) != 3 || st.Epoch == 0 ||
			len(st.Ctl) != 1 || st.Ctl[0].Role != "leader" || !st.Ctl[0].EtcdHealthy {
			t.Errorf("%v %+v", err, r)
		}
	})

	t.Run("cluster stats", func(t *testing.T) {
		// Traffic during the interval, so the owner shows rates.
		done := make(chan struct{})
		go func() {
			defer close(done)
			felixctl(t, env, "pub", "orders", "stats", "--count", "50", "--via", owner)
		}()
		r := felixctl(t, env, "cluster", "stats", "--count", "1", "--interval", "1s", "--json")
		<-done
		rows := ndjson[map[string]any](t, r.stdout)
		if r.code != 0 || len(rows) != 3 {
			t.Fatalf("%+v", r)
		}
		for _, row := range rows {
			if row["live"] != true || row["epoch"].(float64) == 0 {
				t.Errorf("row %v", row)
			}
			if _, ok := row["quic_streams"]; !ok {
				t.Errorf("row %v has no quic_streams", row)
			}
			if sent, lost := row["quic_packets_sent_per_second"].(float64), row["quic_packets_lost_per_second"].(float64); sent < 0 || lost < 0 ||
				row["node"] == owner && sent <= 0 {
				t.Errorf("row %v: QUIC packets sent %v/s, lost %v/s (the owner answered 50 publishes)", row, sent, lost)
			}
			if free, _ := row["disk_free_bytes"].(float64); free <= 0 {
				t.Errorf("row %v: disk_free_bytes %v, want the broker's free space", row, row["disk_free_bytes"])
			}
			if row["node"] == owner && (row["shards_owned"].(float64) != 1 || row["streams"].(float64) < 1) {
				t.Errorf("owner row %v", row)
			}
		}
		// Piped (not a terminal): several tables, and no clear-screen
		// escapes between them.
		r = felixctl(t, env, "cluster", "stats", "--count", "2", "--interval", "200ms")
		if r.code != 0 || !strings.Contains(r.stdout, "FSYNC p50") || !strings.Contains(r.stdout, "QUIC LOST/s") || !strings.Contains(r.stdout, "DISK FREE") || !strings.Contains(r.stdout, owner) ||
			strings.Count(r.stdout, "felix cluster: epoch") != 2 || strings.Contains(r.stdout, "\x1b") {
			t.Errorf("%+v", r)
		}
	})

	// A stream with one shard on the broker about to be killed and one
	// elsewhere, and a record on the latter.
	wide, downShard, upShard := twoShardStream(t, other)
	if r := felixctl(t, env, "stream", "create", wide, "--shards", "2"); r.code != 0 {
		t.Fatalf("%+v", r)
	}
	if _, err := c.WaitMap(context.Background(), func(m *shardmap.Map) bool {
		st, ok := m.Stream(wide)
		return ok && st.Placement.Owner(downShard) == other && st.Placement.Owner(upShard) != other
	}); err != nil {
		t.Fatalf("stream %s is not placed as rendezvous hashing says: %v", wide, err)
	}
	if r := felixctl(t, env, "pub", wide, "up", "--shard", fmt.Sprint(upShard)); r.code != 0 {
		t.Fatalf("%+v", r)
	}

	// Kill a broker that does not own orders/0: the cluster is unhealthy
	// (exit 3), publishing through it fails with a sentence.
	if err := c.Kill(other); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.WaitMap(ctx, func(m *shardmap.Map) bool { n, _ := m.Node(other); return !n.Live }); err != nil {
		t.Fatal(err)
	}
	t.Run("cluster status unhealthy", func(t *testing.T) {
		r := felixctl(t, env, "cluster", "status")
		if r.code != exitUnhealthy || !regexp.MustCompile(`(?m)^`+other+` +\S+ +down +1 shard$`).MatchString(r.stdout) ||
			!strings.Contains(r.stderr, "felixctl: the cluster is unhealthy: "+other+" is down, and its shards are unavailable until it is back: restart it") {
			t.Errorf("%+v", r)
		}
		r = felixctl(t, env, "cluster", "status", "--json")
		var st statusJSON
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.Healthy || r.code != exitUnhealthy {
			t.Errorf("%v %+v", err, r)
		}
		// cluster stats too: the table shows it down, and the exit is 3.
		r = felixctl(t, env, "cluster", "stats", "--count", "1", "--interval", "100ms")
		if r.code != exitUnhealthy || !regexp.MustCompile(`(?m)^ *`+other+` +down `).MatchString(r.stdout) ||
			!strings.Contains(r.stderr, other+" is down") {
			t.Errorf("cluster stats with a broker down: %+v", r)
		}
	})
	t.Run("sub with a shard's owner down", func(t *testing.T) {
		// The shard on the live broker flows; the other is named, with
		// why; the exit is 1 once --wait passes, not later.
		start := time.Now()
		r := felixctl(t, env, "sub", wide, "--count", "2", "--wait", "3s", "--check", "500ms")
		took := time.Since(start)
		down := fmt.Sprintf("%s/%d", wide, downShard)
		if r.code != 1 || r.stdout != fmt.Sprintf("received \"up\" from %s (shard %d, offset 0)\n", wide, upShard) {
			t.Errorf("sub: %+v", r)
		}
		if !strings.Contains(r.stderr, "felixctl: shard "+down+" cannot be read: its owner "+other+" ("+c.Broker(other).Addr+") is down") ||
			!strings.Contains(r.stderr, "the other shards go on") {
			t.Errorf("sub does not say which shard is stuck and why: %q", r.stderr)
		}
		if !strings.Contains(r.stderr, "felixctl: received 1 of 2 records from "+wide+" within 3s (--wait): shard "+down+" could not be read: its owner "+other) {
			t.Errorf("sub's final error: %q", r.stderr)
		}
		if took > 6*time.Second {
			t.Errorf("sub took %s with --wait 3s", took)
		}
		// Without --count: listening for --wait is not met either.
		r = felixctl(t, env, "sub", wide, "--wait", "1s")
		if r.code != 1 || !strings.Contains(r.stderr, "felixctl: listened to "+wide+" for 1s (--wait), but shard "+down+" could not be read") {
			t.Errorf("sub --wait without --count: %+v", r)
		}
	})
	t.Run("pub through a dead broker", func(t *testing.T) {
		// The others answer, and say it is down: the sentence says so.
		r := felixctl(t, env, "pub", "orders", "x", "--via", other, "--dial-timeout", "500ms")
		want := fmt.Sprintf("felixctl: %s (%s) is down or unreachable; the other brokers answer (", other, c.Broker(other).Addr)
		if r.code != 1 || !strings.HasPrefix(r.stderr, want) || !strings.Contains(r.stderr, "the control plane has "+other+" down: restart it") {
			t.Errorf("got %q, want %q...", r.stderr, want)
		}
		// Without --via, the brokers still up answer.
		if r := felixctl(t, env, "pub", "orders", "y"); r.code != 0 {
			t.Errorf("%+v", r)
		}
	})
}

// TestNothingRunning checks the sentences and exit codes when there is no
// cluster: no connection file, and a connection file of a cluster that is
// gone.
func TestNothingRunning(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	for _, args := range [][]string{{"pub", "orders", "x"}, {"sub", "orders"}, {"cluster", "status"}, {"stream", "ls"}} {
		r := felixctl(t, nil, args...)
		if r.code != 1 || !strings.HasPrefix(r.stderr, "felixctl: no cluster to talk to: there is no felix-cluster.json in this directory. Start a local cluster in this directory with `felix dev`") {
			t.Errorf("%v: %+v", args, r)
		}
	}

	// A cluster file whose brokers are gone (its CA is still there).
	c := clustertest.Start(t, 3)
	writeClusterFile(t, c, dir)
	c.Close()
	var names []string
	for _, b := range c.Brokers() {
		names = append(names, fmt.Sprintf("%s (%s)", b.ID, b.Addr))
	}
	want := "felixctl: no broker listed in felix-cluster.json is reachable (" + strings.Join(names, ", ") + "): is `felix dev` running?\n"
	for _, args := range [][]string{{"pub", "orders", "x"}, {"cluster", "status"}} {
		r := felixctl(t, nil, append(args, "--dial-timeout", "300ms")...)
		if r.code != 1 || r.stderr != want {
			t.Errorf("%v: got %q, want %q", args, r.stderr, want)
		}
	}
	r := felixctl(t, nil, "pub", "orders", "x", "--via", "broker-1", "--dial-timeout", "300ms")
	if want := fmt.Sprintf("felixctl: broker-1 (%s) is not reachable: is `felix dev` running?\n", c.Broker("broker-1").Addr); r.code != 1 || r.stderr != want {
		t.Errorf("got %q, want %q", r.stderr, want)
	}
}

// twoShardStream names a stream of two shards of which rendezvous hashing
// (over broker-0..2) puts one on broker id and the other elsewhere.
func twoShardStream(t *testing.T, id string) (name string, onID, elsewhere int) {
	t.Helper()
	ids := []string{"broker-0", "broker-1", "broker-2"}
	for i := range 1000 {
		name := fmt.Sprintf("wide-%d", i)
		o0, o1 := shardmap.Owner(name, 0, ids), shardmap.Owner(name, 1, ids)
		switch {
		case o0 == id && o1 != id:
			return name, 0, 1
		case o1 == id && o0 != id:
			return name, 1, 0
		}
	}
	t.Fatal("no stream name splits its two shards as wanted")
	return "", 0, 0
}

// ndjson decodes one JSON object per line.
func ndjson[T any](t *testing.T, out string) []T {
	t.Helper()
	var list []T
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var v T
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Errorf("not one JSON object per line: %v: %q", err, line)
			return nil
		}
		list = append(list, v)
	}
	return list
}

// TestOwnersJSONStaysAnArray: --json's owners is an array of owners, or
// of replica sets, also while a replica moves and after (it became the
// map's own encoding of a placement for good after any move).
func TestOwnersJSONStaysAnArray(t *testing.T) {
	p := shardmap.NewReplicatedPlacement([]string{"broker-0", "broker-1", "broker-2"})
	moving, err := p.Move(0, "broker-2", "broker-3", 7)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []shardmap.Placement{moving, moving.Settle(0, 7)} {
		b, err := json.Marshal(toJSON(shardmap.StreamConfig{Name: "pay", Shards: 1, Replicas: 3}, q))
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			Owners [][]string   `json:"owners"`
			Moving []movingJSON `json:"moving"`
		}
		if err := json.Unmarshal(b, &out); err != nil || len(out.Owners) != 1 || len(out.Owners[0]) != 3 {
			t.Fatalf("owners in %s: %v (%v); want one replica set of three", b, out.Owners, err)
		}
		if to, _ := q.Pending(0); (to == "") != (len(out.Moving) == 0) || (to != "" && out.Moving[0] != movingJSON{Shard: 0, To: "broker-3"}) {
			t.Errorf("moving in %s: %+v, want broker-3 moving into shard 0 while the move is pending, nothing after", b, out.Moving)
		}
	}
	b, _ := json.Marshal(toJSON(shardmap.StreamConfig{Name: "orders", Shards: 2}, shardmap.NewPlacement("broker-0", "broker-1")))
	var out struct {
		Owners []string `json:"owners"`
	}
	if err := json.Unmarshal(b, &out); err != nil || len(out.Owners) != 2 || out.Owners[1] != "broker-1" {
		t.Fatalf("owners in %s: %v (%v); want [broker-0 broker-1]", b, out.Owners, err)
	}
}

// TestStoryCommandsRefuseJSON: demo and dev print a story and a server's
// log, no JSON; asked for --json they say so, start nothing, and exit 2
// (they ignored it).
func TestStoryCommandsRefuseJSON(t *testing.T) {
	t.Chdir(t.TempDir())
	for _, args := range [][]string{{"--json", "demo"}, {"dev", "--json"}, {"--json", "dev", "run"}} {
		r := felixctl(t, nil, args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, "has no --json output") || r.stdout != "" {
			t.Errorf("%v: %+v, want exit 2 saying it has no --json output", args, r)
		}
	}
	if entries, _ := os.ReadDir("."); len(entries) != 0 {
		t.Errorf("files left: %v", entries)
	}
}
