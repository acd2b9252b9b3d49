package ctl

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/shardmap"
)

// stateFile is the name of the control plane's state file in DataDir.
const stateFile = "ctl-state.json"

// stateVersion is the format version of the state file.
const stateVersion = 1

// snapshot is what the control plane persists: the last epoch it used,
// its members with their addresses, and the stream registry. Liveness is
// not persisted: after a restart every member is down until it registers.
type snapshot struct {
	Epoch   uint64
	Members []shardmap.Node
	Streams []shardmap.Stream // with their owners
	Grants  []auth.Grant      // the policy's grants (superusers are configuration)
}

// The on-disk form has its own types with explicit JSON names so that
// renaming a Go field never silently changes the file format.
type fileState struct {
	Version int          `json:"version"`
	Epoch   uint64       `json:"epoch"`
	Members []fileMember `json:"members"`
	Streams []fileStream `json:"streams"`
	Grants  []fileGrant  `json:"grants,omitempty"`
}

type fileGrant struct {
	Principal string `json:"principal"`
	Action    string `json:"action"`
	Pattern   string `json:"pattern"`
}

type fileMember struct {
	ID    string `json:"id"`
	Addr  string `json:"addr"`
	Admin string `json:"admin,omitempty"`
}

type fileStream struct {
	Name             string `json:"name"`
	Shards           int    `json:"shards"`
	RetentionBytes   int64  `json:"retention_bytes,omitempty"`
	RetentionAgeNano int64  `json:"retention_age_ns,omitempty"`
	// Owners[s] is the node owning shard s; missing or "" means not yet
	// placed (placed by rendezvous over the members on load).
	Owners []string `json:"owners,omitempty"`
}

// loadState reads the state file in dir. A missing file is an empty state
// at epoch 0 (a new cluster).
func loadState(dir string) (snapshot, error) {
	path := filepath.Join(dir, stateFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return snapshot{}, nil
	}
	if err != nil {
		return snapshot{}, fmt.Errorf("ctl: load state: %w", err)
	}
	var f fileState
	if err := json.Unmarshal(b, &f); err != nil {
		return snapshot{}, fmt.Errorf("ctl: load state %s: corrupt: %w", path, err)
	}
	if f.Version != stateVersion {
		return snapshot{}, fmt.Errorf("ctl: load state %s: format version %d, this build reads %d", path, f.Version, stateVersion)
	}
	snap := snapshot{Epoch: f.Epoch}
	seen := map[string]bool{}
	for _, m := range f.Members {
		if m.ID == "" || seen[m.ID] {
			return snapshot{}, fmt.Errorf("ctl: load state %s: corrupt: empty or duplicate member id %q", path, m.ID)
		}
		seen[m.ID] = true
		snap.Members = append(snap.Members, shardmap.Node{ID: m.ID, Addr: m.Addr, Admin: m.Admin})
	}
	clear(seen)
	for _, s := range f.Streams {
		c := shardmap.StreamConfig{Name: s.Name, Shards: s.Shards, RetentionBytes: s.RetentionBytes, RetentionAge: time.Duration(s.RetentionAgeNano)}
		if err := c.Validate(); err != nil || seen[c.Name] {
			return snapshot{}, fmt.Errorf("ctl: load state %s: corrupt stream %q: %v", path, s.Name, err)
		}
		if len(s.Owners) > c.Shards {
			return snapshot{}, fmt.Errorf("ctl: load state %s: corrupt stream %q: %d owners for %d shards", path, s.Name, len(s.Owners), c.Shards)
		}
		seen[c.Name] = true
		snap.Streams = append(snap.Streams, shardmap.Stream{StreamConfig: c, Owners: s.Owners})
	}
	for _, g := range f.Grants {
		ag := auth.Grant{Principal: g.Principal, Action: auth.Action(g.Action), Pattern: g.Pattern}
		if err := ag.Validate(); err != nil {
			return snapshot{}, fmt.Errorf("ctl: load state %s: corrupt grant: %v", path, err)
		}
		snap.Grants = append(snap.Grants, ag)
	}
	return snap, nil
}

// saveState writes snap to the state file in dir atomically: a temporary
// file is written and fsynced, renamed over the state file, and the
// directory fsynced so the rename itself is durable. A crash leaves either
// the old or the new file, never a mix.
func saveState(dir string, snap snapshot) error {
	f := fileState{Version: stateVersion, Epoch: snap.Epoch, Members: []fileMember{}, Streams: []fileStream{}}
	for _, n := range snap.Members {
		f.Members = append(f.Members, fileMember{ID: n.ID, Addr: n.Addr, Admin: n.Admin})
	}
	for _, c := range snap.Streams {
		f.Streams = append(f.Streams, fileStream{Name: c.Name, Shards: c.Shards, RetentionBytes: c.RetentionBytes,
			RetentionAgeNano: int64(c.RetentionAge), Owners: c.Owners})
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

func writeFileAtomic(path string, b []byte) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(b); err != nil {
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("rename %s: %w", tmp.Name(), err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open dir %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	return nil
}
