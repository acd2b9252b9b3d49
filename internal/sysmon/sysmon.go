// Package sysmon keeps the Go runtime's system monitor (sysmon) out of its
// deep sleep in Felix's server processes: a broker, and the echo process
// the bench measures the round-trip floor against, so that floor and
// broker run alike.
//
// When every P of a Go process is idle, sysmon parks on a note; the next
// goroutine that enters a system call wakes it first (runtime
// entersyscallWakeSysmon: a futex wake of another thread), so the first
// syscall after each idle moment pays a thread wake-up before it starts.
// A broker idles between records at light load and through an owner's
// fsync when it forwards, and each record's path starts with syscalls
// (recvmmsg, sendmsg, write, fdatasync): on a VM, where waking a thread
// on an idle vCPU is an inter-processor interrupt and a VM exit, that
// wake-up was the largest single cost on the path. Measured on a 2-vCPU
// VM (docs/performance.md, "Idle CPUs and the Go runtime's sysmon"),
// three alternated pairs of `felixctl bench --local` runs: the forwarding hop 69-90 µs
// against 177-183 µs, replication factor 3 direct p50 489-521 µs against
// 608-847 µs, light-load p50 over closed loop +21-84 µs against +76-184.
//
// The runtime has no setting for it. One of its debug settings has it as a
// side effect: with GODEBUG=schedtrace=N (N > 0) sysmon never deep-sleeps,
// so that it can print a scheduler trace every N milliseconds. Setting is
// the largest N (2^31-1 ms, about 24.8 days): sysmon then wakes at most
// every 10 ms when the process idles (its longest sleep), and the trace's
// one line goes to standard error only on a host up for longer than that
// (the first check counts from boot), then every 24.8 days. Go reads
// GODEBUG's runtime settings once, at start, so a process gets it by being
// started with it: Reexec replaces the process with itself (same pid, same
// file descriptors) with the setting added, before anything has started.
// A GODEBUG that already sets schedtrace, to anything (schedtrace=0 turns
// this off), is the operator's choice and is kept.
package sysmon

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Setting is the GODEBUG setting that keeps sysmon awake.
const Setting = "schedtrace=2147483647"

// Configured reports whether the GODEBUG value godebug sets schedtrace.
func Configured(godebug string) bool {
	for _, kv := range strings.Split(godebug, ",") {
		if k, _, _ := strings.Cut(strings.TrimSpace(kv), "="); k == "schedtrace" {
			return true
		}
	}
	return false
}

// Awake reports whether the GODEBUG value godebug keeps sysmon out of its
// deep sleep: its last schedtrace setting is a positive number.
func Awake(godebug string) bool {
	n := 0
	for _, kv := range strings.Split(godebug, ",") {
		if k, v, _ := strings.Cut(strings.TrimSpace(kv), "="); k == "schedtrace" {
			n, _ = strconv.Atoi(v)
		}
	}
	return n > 0
}

// Env returns env (KEY=VALUE entries) with Setting added to its GODEBUG
// (the last GODEBUG entry, as Go reads it), or env itself when GODEBUG
// already sets schedtrace.
func Env(env []string) []string {
	last := -1
	for i, kv := range env {
		if strings.HasPrefix(kv, "GODEBUG=") {
			last = i
		}
	}
	if last < 0 {
		return append(env[:len(env):len(env)], "GODEBUG="+Setting)
	}
	cur := strings.TrimPrefix(env[last], "GODEBUG=")
	if Configured(cur) {
		return env
	}
	out := append([]string(nil), env...)
	if cur == "" {
		out[last] = "GODEBUG=" + Setting
	} else {
		out[last] = "GODEBUG=" + cur + "," + Setting
	}
	return out
}

// Reexec replaces this process with the same executable and arguments
// under Env(os.Environ()), unless GODEBUG already sets schedtrace. It
// returns only when it does not replace the process: nil when the
// setting is there already, else why the exec failed (the caller goes on
// without it). Call it first thing, before any goroutine, file or socket
// of the process's own is started, from the main goroutine of a program
// whose init locked it to the first thread (runtime.LockOSThread): an
// exec from another thread loses the parent-death signal the process was
// started with.
func Reexec() error {
	if Configured(os.Getenv("GODEBUG")) {
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("sysmon: find this executable: %w", err)
	}
	if err := syscall.Exec(exe, os.Args, Env(os.Environ())); err != nil {
		return fmt.Errorf("sysmon: re-execute %s with GODEBUG=%s: %w", exe, Setting, err)
	}
	return nil // not reached
}
