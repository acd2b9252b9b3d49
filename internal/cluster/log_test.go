package cluster

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/felix-broker/felix/internal/linktest"
)

// A broker's log is never opened through a link planted at its name; a
// log file already there is appended to.
func TestOpenLogIgnoresPlantedLink(t *testing.T) {
	dir := t.TempDir()
	untouched := linktest.Plant(t, filepath.Join(dir, "broker-0.log"), filepath.Join(dir, "victim"))
	if f, err := openLog(filepath.Join(dir, "broker-0.log")); err == nil {
		f.WriteString("broker output\n")
		f.Close()
		t.Error("opened a planted link as the broker's log")
	}
	untouched()

	path := filepath.Join(dir, "broker-1.log")
	for _, line := range []string{"first run\n", "second run\n"} {
		f, err := openLog(path)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(line)
		f.Close()
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "first run\nsecond run\n" {
		t.Errorf("log after two runs: %q, %v", b, err)
	}
}
