package telemetry

import (
	"runtime/debug"
	"testing"
)

func TestVersionOf(t *testing.T) {
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	for _, c := range []struct {
		name string
		bi   debug.BuildInfo
		want string
	}{
		{"go install module@version", debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}}, "v1.2.3"},
		{"go build in a checkout (Go 1.24+)", debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20260101120000-0123456789ab+dirty"}, Settings: vcs("0123456789abcdef", "true")}, "v0.0.0-20260101120000-0123456789ab+dirty"},
		{"devel with a commit", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs("0123456789abcdef", "false")}, "devel+0123456789ab"},
		{"devel, modified", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs("0123456789abcdef", "true")}, "devel+0123456789ab-dirty"},
		{"nothing recorded", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "devel"},
	} {
		if got := versionOf(&c.bi); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	version = "v9.9.9"
	defer func() { version = "" }()
	if got := Version(); got != "v9.9.9" {
		t.Errorf("with -ldflags -X: %q", got)
	}
}
