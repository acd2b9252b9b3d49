package ctl

import (
	"encoding/json"
	"fmt"
	"path/filepath"
)

// saveState writes snap as the state file of ctl before etcd, for the
// tests of reading and importing one.
func saveState(dir string, snap snapshot) error {
	f := fileState{Version: stateVersion, Epoch: snap.Epoch, Members: []fileMember{}, Streams: []fileStream{}}
	for _, n := range snap.Members {
		f.Members = append(f.Members, fileMember{ID: n.ID, Addr: n.Addr, Admin: n.Admin}) // liveness is not kept in the file
	}
	for _, c := range snap.Streams {
		f.Streams = append(f.Streams, toFileStream(c))
	}
	for _, g := range snap.Grants {
		f.Grants = append(f.Grants, fileGrant{Principal: g.Principal, Action: string(g.Action), Pattern: g.Pattern})
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("ctl: save state: encode: %w", err)
	}
	b = append(b, '\n')
	if err := writeFileAtomic(filepath.Join(dir, stateFile), b); err != nil {
		return fmt.Errorf("ctl: save state at epoch %d: %w", snap.Epoch, err)
	}
	return nil
}
