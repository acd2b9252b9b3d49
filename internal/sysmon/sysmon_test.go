package sysmon

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

func TestConfigured(t *testing.T) {
	for godebug, want := range map[string]bool{
		"":                                false,
		"madvdontneed=1":                  false,
		"schedtrace=0":                    true,
		"madvdontneed=1, schedtrace=1000": true,
		"scheddetail=1":                   false,
	} {
		if got := Configured(godebug); got != want {
			t.Errorf("Configured(%q) = %v, want %v", godebug, got, want)
		}
	}
}

func TestAwake(t *testing.T) {
	for godebug, want := range map[string]bool{
		"":                               false,
		Setting:                          true,
		"madvdontneed=1,schedtrace=1000": true,
		"schedtrace=0":                   false,
		"schedtrace=1000,schedtrace=0":   false,
		"schedtrace=x":                   false,
	} {
		if got := Awake(godebug); got != want {
			t.Errorf("Awake(%q) = %v, want %v", godebug, got, want)
		}
	}
}

func TestEnv(t *testing.T) {
	for _, tc := range []struct {
		in, want []string
	}{
		{[]string{"A=1"}, []string{"A=1", "GODEBUG=" + Setting}},
		{[]string{"GODEBUG=", "A=1"}, []string{"GODEBUG=" + Setting, "A=1"}},
		{[]string{"GODEBUG=x=1", "A=1", "GODEBUG=madvdontneed=1"}, []string{"GODEBUG=x=1", "A=1", "GODEBUG=madvdontneed=1," + Setting}},
		{[]string{"GODEBUG=schedtrace=0"}, []string{"GODEBUG=schedtrace=0"}},
	} {
		in := slices.Clone(tc.in)
		if got := Env(in); !slices.Equal(got, tc.want) {
			t.Errorf("Env(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if !slices.Equal(in, tc.in) {
			t.Errorf("Env changed its argument: %q", in)
		}
	}
}

// TestReexec runs this test binary as a child that calls Reexec and
// prints its pid before and its GODEBUG after: the child must come back
// from the exec as the same process with the setting, and a GODEBUG that
// sets schedtrace is left alone (no exec).
func TestReexec(t *testing.T) {
	if os.Getenv("SYSMON_TEST_CHILD") == "1" {
		println("start", os.Getpid())
		if err := Reexec(); err != nil {
			t.Fatal(err)
		}
		println("GODEBUG=" + os.Getenv("GODEBUG"))
		return
	}
	for _, tc := range []struct {
		godebug, want string
		starts        int // the exec starts the test a second time
	}{
		{"", "GODEBUG=" + Setting, 2},
		{"madvdontneed=1", "GODEBUG=madvdontneed=1," + Setting, 2},
		{"schedtrace=0", "GODEBUG=schedtrace=0", 1},
	} {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestReexec$", "-test.v")
		cmd.Env = append(os.Environ(), "SYSMON_TEST_CHILD=1", "GODEBUG="+tc.godebug)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child (GODEBUG=%q): %v\n%s", tc.godebug, err, out)
		}
		if !strings.Contains(string(out), tc.want+"\n") {
			t.Errorf("child (GODEBUG=%q) printed\n%s\nwant a line %q", tc.godebug, out, tc.want)
		}
		want := fmt.Sprintf("start %d\n", cmd.Process.Pid)
		if n := strings.Count(string(out), want); n != tc.starts {
			t.Errorf("child (GODEBUG=%q, pid %d) printed\n%s\nwant %q %d times", tc.godebug, cmd.Process.Pid, out, want, tc.starts)
		}
	}
}
