package bench

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestFullRun is `felixctl bench --local --json --plot` with the default
// settings, for running the whole bench from this package:
//
//	FELIX_BENCH_OUT=/tmp/bench go test -run TestFullRun -timeout 20m ./bench/
//
// writes report.json, report.txt, latency.svg and latency.png there. It is
// skipped unless FELIX_BENCH_OUT is set.
func TestFullRun(t *testing.T) {
	out := os.Getenv("FELIX_BENCH_OUT")
	if out == "" {
		t.Skip("set FELIX_BENCH_OUT=DIR to run the full bench")
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	var c Command
	if err := defaults(&c); err != nil {
		t.Fatal(err)
	}
	c.Local, c.JSON, c.Binary = true, true, felixBinary
	c.Plot = filepath.Join(out, "latency.svg")
	f, err := os.Create(filepath.Join(out, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	rep, err := c.Execute(ctx, slog.New(slog.NewTextHandler(os.Stderr, nil)), f)
	if err != nil {
		t.Fatal(err)
	}
	if err := writePlot(filepath.Join(out, "latency.png"), rep); err != nil {
		t.Fatal(err)
	}
	txt, err := os.Create(filepath.Join(out, "report.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer txt.Close()
	if err := rep.writeTable(txt); err != nil {
		t.Fatal(err)
	}
}
