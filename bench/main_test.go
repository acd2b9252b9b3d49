package bench

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/felix-broker/felix/internal/cluster"
)

// felixBinary is the felix executable built from the code under test: the
// brokers and the echo process of the --local tests run it.
var felixBinary string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "felix-bench-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	felixBinary, err = cluster.BuildFelix(ctx, dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}
