//go:build !(linux || darwin || freebsd)

package broker

import "errors"

// freeBytes is not implemented here: the broker logs that once and takes
// publishes as if the disk had room.
func freeBytes(string) (int64, error) {
	return 0, errors.New("reading a filesystem's free space is not implemented on this platform")
}
