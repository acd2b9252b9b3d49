//go:build !linux

package bench

import (
	"os"
	"sync/atomic"
	"syscall"
	"time"
)

func fdatasync(f *os.File) error { return f.Sync() }

func fsType(string) string { return "unknown" }

func dieWithParent() *syscall.SysProcAttr { return nil }

// futexWait sleeps a little: startGate polls where there is no futex.
func futexWait(*atomic.Uint32, uint32) { time.Sleep(10 * time.Microsecond) }

func futexWakeAll(*atomic.Uint32) {}
