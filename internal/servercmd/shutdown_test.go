package servercmd

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestCloseWatchedWritesStacksOfASlowShutdown(t *testing.T) {
	var stacks bytes.Buffer
	var logged bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	errShut := errors.New("shut")
	release := make(chan struct{})
	go func() { time.Sleep(200 * time.Millisecond); close(release) }()
	err := closeWatchedTo(log, &stacks, 10*time.Millisecond, "ctl", func() error {
		<-release // a shutdown stuck here until released
		return errShut
	})
	if !errors.Is(err, errShut) {
		t.Fatalf("closeWatchedTo returned %v, want the shutdown's error", err)
	}
	if !strings.Contains(stacks.String(), "TestCloseWatchedWritesStacksOfASlowShutdown") {
		t.Errorf("the stacks written do not show the stuck shutdown:\n%s", stacks.String())
	}
	if !strings.Contains(logged.String(), "ctl: shutdown is slow") {
		t.Errorf("no warning logged: %q", logged.String())
	}
}

func TestCloseWatchedQuietForAPromptShutdown(t *testing.T) {
	var stacks bytes.Buffer
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := closeWatchedTo(log, &stacks, time.Minute, "broker", func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	if stacks.Len() != 0 {
		t.Errorf("stacks written for a prompt shutdown: %d bytes", stacks.Len())
	}
}
