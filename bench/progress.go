package bench

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// progressDelay is how long a run goes before the bar appears: short
// runs print nothing.
const progressDelay = 2 * time.Second

// progress draws a one-line progress bar on a terminal: the current phase,
// its share done and the run's elapsed time. Workers report with add (an
// atomic increment, nothing on the hot path waits); a goroutine owned by
// progress redraws five times a second. A nil *progress is valid and draws
// nothing.
type progress struct {
	w     io.Writer
	start time.Time

	label atomic.Pointer[string]
	total atomic.Int64 // records in the phase, or 0 for a timed phase
	done  atomic.Int64
	began atomic.Int64 // unix nanos the phase began (timed phases)
	span  atomic.Int64 // length of a timed phase in nanoseconds

	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// newProgress returns a progress bar drawing on w if enabled and w is a
// terminal, else nil.
func newProgress(w *os.File, enabled bool) *progress {
	if !enabled || !isTerminal(w) {
		return nil
	}
	p := &progress{w: w, start: time.Now(), stop: make(chan struct{})}
	empty := ""
	p.label.Store(&empty)
	p.wg.Go(p.run)
	return p
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// phase starts a phase of total records.
func (p *progress) phase(label string, total int) {
	if p == nil {
		return
	}
	p.label.Store(&label)
	p.done.Store(0)
	p.span.Store(0)
	p.total.Store(int64(total))
}

// timed starts a phase that lasts d.
func (p *progress) timed(label string, d time.Duration) {
	if p == nil {
		return
	}
	p.label.Store(&label)
	p.total.Store(0)
	p.began.Store(time.Now().UnixNano())
	p.span.Store(int64(d))
}

// add counts n records of the phase done.
func (p *progress) add(n int) {
	if p != nil {
		p.done.Add(int64(n))
	}
}

// close stops drawing and clears the line. It may be called more than
// once.
func (p *progress) close() {
	if p == nil {
		return
	}
	p.closeOnce.Do(func() {
		close(p.stop)
		p.wg.Wait()
		if time.Since(p.start) >= progressDelay {
			fmt.Fprint(p.w, "\r\x1b[K")
		}
	})
}

func (p *progress) run() {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			if time.Since(p.start) >= progressDelay {
				fmt.Fprint(p.w, p.line())
			}
		}
	}
}

func (p *progress) line() string {
	var frac float64
	if span := p.span.Load(); span > 0 {
		frac = float64(time.Now().UnixNano()-p.began.Load()) / float64(span)
	} else if total := p.total.Load(); total > 0 {
		frac = float64(p.done.Load()) / float64(total)
	}
	frac = min(max(frac, 0), 1)
	const width = 30
	filled := int(frac * width)
	bar := strings.Repeat("=", filled) + strings.Repeat(" ", width-filled)
	return fmt.Sprintf("\r\x1b[Kbench %-32s [%s] %3.0f%%  %s", *p.label.Load(), bar, frac*100,
		time.Since(p.start).Truncate(time.Second))
}
