package tidseg

import "os"

// Parker is a ParkedSyncer made on first use, for an owner that may never
// park: where the kernel gives no AIO context (not Linux, or
// fs.aio-max-nr reached) every Fdatasync blocks instead. Like a
// ParkedSyncer it is owned by one goroutine. The zero value is ready.
type Parker struct {
	s   *ParkedSyncer
	off bool // NewParkedSyncer failed: do not try again
}

// Fdatasync syncs f parked, or blocking where no syncer could be made.
func (p *Parker) Fdatasync(f *os.File) error {
	if p.s == nil && !p.off {
		s, err := NewParkedSyncer()
		if err != nil {
			p.off = true
		}
		p.s = s
	}
	if p.off {
		return Fdatasync(f)
	}
	return p.s.Fdatasync(f)
}

// Close releases the syncer, if one was made.
func (p *Parker) Close() error {
	if p.s == nil {
		return nil
	}
	s := p.s
	p.s = nil
	return s.Close()
}
