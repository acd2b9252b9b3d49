package servercmd

import "testing"

func TestIsGoRun(t *testing.T) {
	for arg0, want := range map[string]bool{
		"/tmp/go-build2971623614/b001/exe/felix":             true,
		"/home/me/.cache/go-build/tmp/go-build1/b001/exe/fx": true,
		"/root/.cache/go-build/d0/d0871c2f9e-d/felix":        true,
		"/home/me/go-build/felix":                            false,
		"felixctl":                                           false,
		"/usr/local/bin/felix":                               false,
		"/home/me/go/bin/felixctl":                           false,
		"./felix":                                            false,
	} {
		if got := isGoRun(arg0); got != want {
			t.Errorf("isGoRun(%q) = %v, want %v", arg0, got, want)
		}
	}
}
