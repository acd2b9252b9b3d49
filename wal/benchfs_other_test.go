//go:build !linux

package wal

func fsType(string) string { return "unknown" }
