//go:build unix

package dirlock

import (
	"errors"
	"os"
	"syscall"
)

var errLocked = errors.New("locked")

// flock takes an exclusive flock on f without waiting.
func flock(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, syscall.EWOULDBLOCK):
			return errLocked
		case errors.Is(err, syscall.EINTR):
			continue
		default:
			return err
		}
	}
}
