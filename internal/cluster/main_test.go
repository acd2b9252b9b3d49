package cluster

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test closes what it starts in this process: the control plane
// and its etcd, and the goroutines reaping the broker processes.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
