package broker

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/felix-broker/felix/internal/atomicfile"
)

// clusterIDFile, in the data directory, holds the ID of the cluster whose
// maps the broker took (shardmap.Map.Cluster), written when the first map
// naming one arrives. The broker's member refuses a map of another
// cluster (ctlclient.ErrOtherCluster): a control plane that lost its
// state, or another cluster's, never gets to remove or reuse this data.
const clusterIDFile = "cluster-id"

// readClusterID returns the cluster ID kept in dataDir, "" if none is
// (a new broker, or data of a version without cluster IDs).
func readClusterID(dataDir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, clusterIDFile))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the cluster ID this broker's data belongs to: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if id == "" || strings.ContainsFunc(id, func(r rune) bool { return r <= ' ' || r > '~' }) {
		return "", fmt.Errorf("the cluster ID file %s is damaged (%q): it names the cluster this broker's data belongs to; restore it, or remove it to take the ID of the first map again",
			filepath.Join(dataDir, clusterIDFile), b)
	}
	return id, nil
}

// writeClusterID keeps id in dataDir, durably, before the map naming it
// is taken.
func writeClusterID(dataDir, id string) error {
	return atomicfile.WriteFile(filepath.Join(dataDir, clusterIDFile), []byte(id+"\n"), 0o640)
}
