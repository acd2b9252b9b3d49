//go:build !linux

package bench

import (
	"os"
	"syscall"
)

func fdatasync(f *os.File) error { return f.Sync() }

func fsType(string) string { return "unknown" }

func dieWithParent() *syscall.SysProcAttr { return nil }
