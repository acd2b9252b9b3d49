// Command tracemerge prints one timeline of the goroutines of several Go
// processes on one machine from their execution traces: the brokers'
// (FELIX_PPROF, /debug/pprof/trace on each admin listener) and the
// bench's (felixctl bench --trace), taken over the same seconds. Go
// stamps trace events with the monotonic clock, which the processes of
// one machine share, so a record's path can be followed from the
// client's send through every broker's goroutines to its ack: who woke
// whom, who waited for the P, which system call took how long.
//
//	tracemerge -from 500 -dur 1 C=bench.trace L=broker-0.trace F1=broker-1.trace
//
// prints, for the millisecond starting 500 ms after the first file's
// first event, each goroutine that starts running, is readied (and by
// whom, where), blocks (why, where), enters or leaves a system call, or
// yields, one line each: microseconds since that first event, the
// file's name, the event.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"golang.org/x/exp/trace"
)

type line struct {
	at  trace.Time
	txt string
}

func main() {
	from := flag.Float64("from", 0, "start of the window, in ms after the first file's first event")
	dur := flag.Float64("dur", 2, "length of the window, in ms")
	depth := flag.Int("depth", 3, "frames of each stack to print")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: tracemerge [-from MS] [-dur MS] [-depth N] NAME=TRACE...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	var lines []line
	var base trace.Time
	for _, arg := range flag.Args() {
		name, path, ok := strings.Cut(arg, "=")
		if !ok {
			fmt.Fprintf(os.Stderr, "tracemerge: %q is not NAME=TRACE\n", arg)
			os.Exit(2)
		}
		got, first, err := read(name, path, base, *from, *dur, *depth)
		if err != nil {
			fmt.Fprintf(os.Stderr, "tracemerge: %s: %v\n", path, err)
			os.Exit(1)
		}
		if base == 0 {
			base = first
		}
		lines = append(lines, got...)
	}
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].at < lines[j].at })
	for _, l := range lines {
		fmt.Printf("%10.1f  %s\n", float64(l.at-base)/1e3, l.txt)
	}
}

// read returns the lines of the trace at path that fall in the window
// (from, from+dur ms after base, or after its own first event when base
// is 0), and its first event's time.
func read(name, path string, base trace.Time, from, dur float64, depth int) ([]line, trace.Time, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	r, err := trace.NewReader(f)
	if err != nil {
		return nil, 0, err
	}
	var lines []line
	var first trace.Time
	for {
		ev, err := r.ReadEvent()
		if err == io.EOF {
			return lines, first, nil
		}
		if err != nil {
			return nil, 0, err
		}
		if first == 0 {
			first = ev.Time()
			if base == 0 {
				base = first
			}
		}
		ms := float64(ev.Time()-base) / 1e6
		if ms < from || ms > from+dur || ev.Kind() != trace.EventStateTransition {
			continue
		}
		if txt := describe(ev, depth); txt != "" {
			lines = append(lines, line{ev.Time(), fmt.Sprintf("%-3s %s", name, txt)})
		}
	}
}

// describe says what a goroutine's state transition is, or "" for one
// of another resource.
func describe(ev trace.Event, depth int) string {
	st := ev.StateTransition()
	if st.Resource.Kind != trace.ResourceGoroutine {
		return ""
	}
	g := st.Resource.Goroutine()
	was, is := st.Goroutine()
	switch {
	case is == trace.GoRunning:
		return fmt.Sprintf("g%d runs (%v->) on M%d", g, was, ev.Thread())
	case is == trace.GoRunnable && was == trace.GoWaiting:
		return fmt.Sprintf("g%d readied by g%d at %s", g, ev.Goroutine(), frames(ev.Stack(), depth))
	case is == trace.GoWaiting:
		return fmt.Sprintf("g%d waits %q at %s", g, st.Reason, frames(st.Stack, depth))
	case is == trace.GoSyscall:
		return fmt.Sprintf("g%d syscall at %s", g, frames(st.Stack, depth))
	case was == trace.GoSyscall:
		return fmt.Sprintf("g%d syscall done -> %v", g, is)
	case is == trace.GoRunnable && was == trace.GoRunning:
		return fmt.Sprintf("g%d yields or is preempted at %s", g, frames(st.Stack, depth))
	}
	return fmt.Sprintf("g%d %v->%v", g, was, is)
}

// frames returns the innermost depth frames of st, innermost first, each
// function named without its package path.
func frames(st trace.Stack, depth int) string {
	var fs []string
	for f := range st.Frames() {
		fn := f.Func
		if i := strings.LastIndex(fn, "/"); i >= 0 {
			fn = fn[i+1:]
		}
		fs = append(fs, fn)
		if len(fs) == depth {
			break
		}
	}
	return strings.Join(fs, "<")
}
