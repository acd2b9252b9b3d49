package dirlock

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestTakeExcludes: a second Take of a directory fails ErrInUse, naming
// the holder's pid, until the first is released; then it succeeds.
func TestTakeExcludes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	first, err := Take(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Take(dir)
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "process "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("second Take: %v, want ErrInUse naming pid %d", err, os.Getpid())
	}
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	again, err := Take(dir)
	if err != nil {
		t.Fatalf("Take after Release: %v", err)
	}
	again.Release()
}

// TestLockDiesWithItsProcess: the lock of a process killed with -9 is
// gone with it (the kernel drops a flock when its process exits).
func TestLockDiesWithItsProcess(t *testing.T) {
	if os.Getenv("DIRLOCK_HOLD") != "" {
		if _, err := Take(os.Getenv("DIRLOCK_HOLD")); err != nil {
			os.Exit(3)
		}
		os.Stdout.WriteString("held\n")
		select {}
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestLockDiesWithItsProcess$")
	cmd.Env = append(os.Environ(), "DIRLOCK_HOLD="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := out.Read(buf); err != nil || string(buf) != "held\n" {
		t.Fatalf("holder said %q, %v", buf, err)
	}
	if _, err := Take(dir); !errors.Is(err, ErrInUse) {
		t.Fatalf("Take while another process holds it: %v", err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	l, err := Take(dir)
	if err != nil {
		t.Fatalf("Take after the holder was killed: %v", err)
	}
	l.Release()
}
