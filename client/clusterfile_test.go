package client

import (
	"path/filepath"
	"testing"

	"github.com/felix-broker/felix/internal/linktest"
)

// TestClusterFileWriteIgnoresPlantedLink: a link another local user
// placed where Write used to put its temporary file (path + ".tmp")
// is not followed: the file it points to is left as it was, and path is
// a file of its own holding the cluster. Write used to write through the
// link (overwriting any file the process could write) and rename the
// link over path.
func TestClusterFileWriteIgnoresPlantedLink(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, DefaultClusterFile)
	untouched := linktest.Plant(t, path+".tmp", filepath.Join(dir, "victim"))
	cf := &ClusterFile{Name: "dev", Brokers: []ClusterBroker{{ID: "b0", Addr: "127.0.0.1:7400"}}}
	if err := cf.Write(path); err != nil {
		t.Fatal(err)
	}
	untouched()
	linktest.Regular(t, path)
	got, err := LoadClusterFile(path)
	if err != nil || len(got.Brokers) != 1 || got.Brokers[0] != cf.Brokers[0] {
		t.Fatalf("read back %+v, %v", got, err)
	}
}
