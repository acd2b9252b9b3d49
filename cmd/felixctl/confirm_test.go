package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStreamRmAsksOnATerminal checks that stream rm asks before deleting
// when its input is a terminal, and keeps the stream unless the answer is
// yes; the question goes to stderr, so that --json output stays clean.
func TestStreamRmAsksOnATerminal(t *testing.T) {
	for _, tc := range []struct {
		answer string
		yes    bool
	}{
		{"y\n", true}, {"YES\n", true}, {" yes ", true},
		{"n\n", false}, {"\n", false}, {"", false}, {"yess\n", false},
	} {
		var stderr bytes.Buffer
		a := &app{stdin: strings.NewReader(tc.answer), stderr: &stderr, interactive: true}
		ok, err := confirm(a, "delete stream pay and all its records?")
		if err != nil || ok != tc.yes {
			t.Errorf("answer %q: confirmed %v, err %v; want %v", tc.answer, ok, err, tc.yes)
		}
		if got := stderr.String(); got != "delete stream pay and all its records? [y/N] " {
			t.Errorf("question %q", got)
		}
	}

	// Not confirmed: refused before any connection is made (the app has
	// no connection flags: reaching the request would fail otherwise).
	var stderr bytes.Buffer
	a := &app{stdin: strings.NewReader("n\n"), stderr: &stderr, interactive: true}
	err := (&streamRmCmd{Name: "pay"}).Run(a)
	if err == nil || !strings.Contains(err.Error(), "stream pay kept: not confirmed (--force deletes without asking)") {
		t.Fatalf("rm answered no: %v", err)
	}
}

// TestRmDoesNotAskWithDevNullStdin: stdin from /dev/null (cron, systemd,
// `docker run` without -t) is no terminal, though a character device:
// stream rm does not ask, as for any script (it once asked, read nothing
// and kept the stream).
func TestRmDoesNotAskWithDevNullStdin(t *testing.T) {
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	var stdout, stderr bytes.Buffer
	runIO([]string{"stream", "rm", "pay", "--cluster", filepath.Join(t.TempDir(), "none.json")},
		null, &stdout, &stderr, func(string) string { return "" })
	if strings.Contains(stderr.String(), "[y/N]") || strings.Contains(stderr.String(), "not confirmed") {
		t.Fatalf("stdin is /dev/null, not a terminal, yet stream rm asked: %q", stderr.String())
	}
}
