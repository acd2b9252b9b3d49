//go:build !linux

package msgtrace

// yieldCPU does nothing where sched_yield is not at hand.
func yieldCPU() {}
