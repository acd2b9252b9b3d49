package servercmd

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test closes what it starts in this process: a failed felix
// ctl's control plane and etcd, the shutdown watch.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
