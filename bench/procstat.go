package bench

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/felix-broker/felix/internal/sysmon"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat:
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// procSample is a process's CPU time so far and its memory.
type procSample struct {
	cpuTicks uint64 // utime + stime
	rssKiB   uint64 // VmRSS
	hwmKiB   uint64 // VmHWM: the peak RSS
}

// readProc samples /proc/PID/stat and /proc/PID/status.
func readProc(pid int) (procSample, error) {
	var s procSample
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, fmt.Errorf("bench: read /proc/%d/stat: %w", pid, err)
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// fields are counted from the last ')'. utime and stime are fields 14
	// and 15, the 12th and 13th after it.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return s, fmt.Errorf("bench: malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 13 {
		return s, fmt.Errorf("bench: malformed /proc/%d/stat", pid)
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return s, fmt.Errorf("bench: malformed /proc/%d/stat", pid)
	}
	s.cpuTicks = utime + stime

	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, fmt.Errorf("bench: read /proc/%d/status: %w", pid, err)
	}
	for line := range strings.Lines(string(status)) {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !slices.Contains([]string{"VmRSS", "VmHWM"}, name) {
			continue
		}
		kib, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if name == "VmRSS" {
			s.rssKiB = kib
		} else {
			s.hwmKiB = kib
		}
	}
	return s, nil
}

// ProcUsage is what one process used during a measured interval.
type ProcUsage struct {
	Name string `json:"name"`
	Pid  int    `json:"pid"`
	// CPUPct is CPU time over wall time, in percent of one core (200 is
	// both cores of a 2-core machine).
	CPUPct float64 `json:"cpu_pct"`
	// RSSMiB is the resident set at the end of the interval, PeakRSSMiB
	// the highest during it (VmHWM, reset at its start), or, with
	// PeakLifetime, the highest since the process started: the reset
	// failed, and the peak may be an earlier interval's.
	RSSMiB       float64 `json:"rss_mib"`
	PeakRSSMiB   float64 `json:"peak_rss_mib"`
	PeakLifetime bool    `json:"peak_rss_lifetime,omitempty"`
}

// procWatch measures a set of processes, and the machine, over an
// interval. A nil *procWatch measures nothing.
type procWatch struct {
	names  []string
	pids   []int
	before []procSample
	read   []bool    // before[i] was read
	reset  []bool    // pids[i]'s peak RSS was reset at begin
	cpus   cpuSample // the machine's at begin
}

// begin resets every process's peak RSS and samples it at the start of
// the interval. A process that cannot be read is left out of the result.
func (w *procWatch) begin() {
	if w == nil {
		return
	}
	w.before = make([]procSample, len(w.pids))
	w.read = make([]bool, len(w.pids))
	w.reset = make([]bool, len(w.pids))
	for i, pid := range w.pids {
		w.reset[i] = resetPeakRSS(pid) == nil
		var err error
		w.before[i], err = readProc(pid)
		w.read[i] = err == nil
	}
	w.cpus, _ = readCPUs()
}

// resetPeakRSS sets the peak RSS (VmHWM) of process pid to its RSS now,
// so that the next reading is the peak since: "5" to /proc/PID/clear_refs
// (Linux 4.0 and later), allowed for a process of the same user, or as
// root. VmHWM is otherwise the peak over the process's life, and every
// row would carry the peaks of the rows before it.
func resetPeakRSS(pid int) error {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		return fmt.Errorf("bench: reset the peak RSS of process %d: %w", pid, err)
	}
	return nil
}

// end samples them again and returns their usage over wall seconds, the
// machine's as one more entry (named machineName) when /proc/stat reads.
func (w *procWatch) end(wallSeconds float64) []ProcUsage {
	if w == nil {
		return nil
	}
	var out []ProcUsage
	if after, err := readCPUs(); err == nil && after.total > w.cpus.total && w.cpus.total > 0 {
		busy := float64(after.busy-w.cpus.busy) / float64(after.total-w.cpus.total)
		out = append(out, ProcUsage{Name: machineName, CPUPct: round1(busy * float64(after.n) * 100)})
	}
	for i, pid := range w.pids {
		after, err := readProc(pid)
		if err != nil || !w.read[i] || wallSeconds <= 0 {
			continue // not read at both ends: its lifetime is no interval
		}
		cpu := float64(after.cpuTicks-w.before[i].cpuTicks) / clockTicks
		out = append(out, ProcUsage{
			Name:         w.names[i],
			Pid:          pid,
			CPUPct:       round1(cpu / wallSeconds * 100),
			RSSMiB:       round1(float64(after.rssKiB) / 1024),
			PeakRSSMiB:   round1(float64(after.hwmKiB) / 1024),
			PeakLifetime: !w.reset[i],
		})
	}
	return out
}

// machineName names the machine's entry among the usages procWatch.end
// returns: every CPU's busy time, whoever used it (the brokers, the bench,
// the kernel's threads and interrupts).
const machineName = "machine"

// cpuSample is the machine's CPU time so far, in ticks of /proc/stat's
// first line, over its n CPUs.
type cpuSample struct {
	busy, total uint64
	n           int
}

// readCPUs samples /proc/stat (parseCPUs).
func readCPUs() (cpuSample, error) {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuSample{}, fmt.Errorf("bench: read /proc/stat: %w", err)
	}
	return parseCPUs(string(raw))
}

// parseCPUs reads a sample from the text of /proc/stat: busy is every
// state but idle, iowait and steal; total is every state.
func parseCPUs(raw string) (cpuSample, error) {
	var s cpuSample
	for line := range strings.Lines(raw) {
		f := strings.Fields(line)
		switch {
		case len(f) > 5 && f[0] == "cpu":
			for i, v := range f[1:] {
				n, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					return s, fmt.Errorf("bench: malformed /proc/stat: %q", strings.TrimSpace(line))
				}
				// user nice system idle iowait irq softirq steal guest
				// guest_nice: guest and guest_nice are within user and
				// nice; steal (a VM's CPU run by another) is time, not
				// work of this machine's.
				if i >= 8 {
					break
				}
				s.total += n
				if i != 3 && i != 4 && i != 7 { // idle, iowait, steal
					s.busy += n
				}
			}
		case len(f) > 0 && strings.HasPrefix(f[0], "cpu"):
			s.n++
		}
	}
	if s.n == 0 || s.total == 0 {
		return s, errors.New("bench: no cpu line in /proc/stat")
	}
	return s, nil
}

// processGodebug returns the GODEBUG setting the process pid runs with,
// as /proc/PID/environ shows it: "" when it has none or cannot be read.
func processGodebug(pid int) string { return processEnv(pid, "GODEBUG") }

// processEnv returns the value of the environment variable name in the
// process pid, as /proc/PID/environ shows it: "" when it has none or
// cannot be read.
func processEnv(pid int, name string) string {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	if err != nil {
		return ""
	}
	value := ""
	for kv := range strings.SplitSeq(string(raw), "\x00") {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			value = v // the last one counts, as for Go
		}
	}
	return value
}

// sysmonNote says how the Go runtime's sysmon ran in the brokers, from a
// broker's GODEBUG (see package sysmon).
func sysmonNote(godebug string) string {
	if sysmon.Awake(godebug) {
		return "the brokers and the echo process ran with GODEBUG=" + godebug + ": Go's sysmon never parks, so a syscall after idleness wakes no thread (package sysmon)"
	}
	return fmt.Sprintf("the brokers ran with GODEBUG=%q: Go's sysmon parks while they idle, and the next syscall wakes it (package sysmon)", godebug)
}
