package main

import (
	"encoding/json"
	"fmt"
	"runtime"

	"github.com/felix-broker/felix/internal/telemetry"
)

// versionCmd is `felixctl version`. The version comes from the same place
// as the brokers' felix_build_info{version} (telemetry.Version): the
// -ldflags -X override of release builds, else what the go command
// stamped into the binary (module version, VCS commit).
type versionCmd struct{}

// versionJSON is the version as --json prints it.
type versionJSON struct {
	Version   string `json:"version"`
	Commit    string `json:"commit,omitempty"`
	Modified  bool   `json:"modified,omitempty"`
	GoVersion string `json:"go_version"`
	Platform  string `json:"platform"`
}

func (v *versionCmd) Run(a *app) error {
	if a.flags.JSON {
		rev, mod := telemetry.Revision()
		b, err := json.Marshal(versionJSON{Version: telemetry.Version(), Commit: rev, Modified: mod,
			GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH})
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.stdout, "%s\n", b)
		return err
	}
	_, err := fmt.Fprintf(a.stdout, "felixctl %s\n", versionLine())
	return err
}

// versionLine is the version and how the binary was built.
func versionLine() string { return telemetry.VersionLine() }
