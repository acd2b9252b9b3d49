//go:build !linux

package tidseg

import (
	"errors"
	"os"
)

// ParkedSyncer is Linux-only (AIO fdatasync); elsewhere NewParkedSyncer
// fails and callers use Fdatasync.
type ParkedSyncer struct{}

// NewParkedSyncer fails: there is no parked fdatasync on this system.
func NewParkedSyncer() (*ParkedSyncer, error) {
	return nil, errors.New("tidseg: parked fdatasync needs Linux")
}

// Fdatasync is Fdatasync(f).
func (s *ParkedSyncer) Fdatasync(f *os.File) error { return Fdatasync(f) }

// Close does nothing.
func (s *ParkedSyncer) Close() error { return nil }
