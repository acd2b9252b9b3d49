//go:build !unix

package dirlock

import (
	"errors"
	"os"
)

var errLocked = errors.New("locked")

// flock locks nothing where flock(2) does not exist: the directory is
// not protected there.
func flock(*os.File) error { return nil }
