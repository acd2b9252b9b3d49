package e2e

import (
	"context"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/felix-broker/felix/internal/clustertest"
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

// testCtx bounds a whole test: generous, because a loaded 2-core machine
// is slow, but finite, so a hang fails instead of stalling CI.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
