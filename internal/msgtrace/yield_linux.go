package msgtrace

import "syscall"

// yieldCPU gives this thread's CPU to another thread waiting for it, if
// any (sched_yield); it returns at once when none is.
func yieldCPU() {
	_, _, _ = syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
}
