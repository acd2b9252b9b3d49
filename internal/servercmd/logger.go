package servercmd

import (
	"log/slog"
	"os"
	"strings"
)

// NewLogger returns the process logger on stderr: format "json" or "text",
// level "debug", "info", "warn" or "error".
func NewLogger(format, level string) *slog.Logger {
	var lvl slog.Level
	lvl.UnmarshalText([]byte(strings.ToUpper(level)))
	opts := &slog.HandlerOptions{Level: lvl}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}
