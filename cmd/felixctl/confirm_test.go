package main

import (
	"bytes"
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
