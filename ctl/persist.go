package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/shardmap"

	"github.com/felix-broker/felix/internal/atomicfile"
)

// This file reads the state file of ctl before etcd (issue 15), so that a
// data dir holding one is imported into etcd on first start. Its types
// are also the JSON values of the members/, streams/ and grants/ keys in
// etcd (see store.go).

// stateFile is the name of the control plane's state file in DataDir.
const stateFile = "ctl-state.json"

// stateVersion is the format version of the state file.
const stateVersion = 1

// snapshot is what the control plane commits to etcd: the epoch, its
// members with their addresses and liveness, the stream registry with
// each shard's owner, and the grants. (The state file of earlier versions
// held no liveness: after an import every member is down until it
// registers.)
type snapshot struct {
	Epoch   uint64
	Members []shardmap.Node
	Streams []shardmap.Stream // with their owners
	Grants  []auth.Grant      // the policy's grants
	// Superusers are the superusers of the leader that committed the
	// state, from its configuration (sorted; empty for none). Nil when
	// none are recorded, as in a state written before they were: each
	// ctl then uses its own.
	Superusers []string
	// ClusterID is the cluster's ID (shardmap.Map.Cluster), made by the
	// first leader that found none; "" until then.
	ClusterID string
	// Requests are the admin changes made for requests with an ID,
	// oldest first (see state.requests).
	Requests []appliedRequest
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

// fileRequest is the value of a requests/<id> key: an admin change made
// for the request with that ID (appliedRequest).
type fileRequest struct {
	What   string `json:"what"`
	Result string `json:"result,omitempty"`
	Epoch  uint64 `json:"epoch"`
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
	// Live is the member's liveness in the map of the stored epoch; the
	// state file of earlier versions does not hold it.
	Live bool `json:"live,omitempty"`
	// Features are the member's as it last registered
	// (shardmap.Node.Features), kept while it is down so that a restarted
	// ctl knows them; absent for a member of an earlier version, and in
	// values a ctl of an earlier version wrote.
	Features []string `json:"features,omitempty"`
}

// equal reports whether m and o are the same value.
func (m fileMember) equal(o fileMember) bool {
	return m.ID == o.ID && m.Addr == o.Addr && m.Admin == o.Admin && m.Live == o.Live && slices.Equal(m.Features, o.Features)
}

// node returns m as a member of the map.
func (m fileMember) node() shardmap.Node {
	return shardmap.Node{ID: m.ID, Addr: m.Addr, Admin: m.Admin, Live: m.Live, Features: featureSet(m.Features)}
}

type fileStream struct {
	Name             string `json:"name"`
	Shards           int    `json:"shards"`
	RetentionBytes   int64  `json:"retention_bytes,omitempty"`
	RetentionAgeNano int64  `json:"retention_age_ns,omitempty"`
	// Owners holds the node owning each shard s, as the array of earlier
	// versions (owners[s]); missing or "" means not yet placed (placed by
	// rendezvous over the members on load).
	Owners shardmap.Placement `json:"owners,omitzero"`
	// Replicas is the replication factor, absent for 1 (as in the files
	// of earlier versions); its shards' replica sets are in Owners.
	Replicas int `json:"replicas,omitempty"`
	// Created is the epoch of the stream's first map
	// (shardmap.Stream.Created), absent in files of earlier versions.
	Created uint64 `json:"created,omitempty"`
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
		m.Live = false // the state file holds no liveness
		snap.Members = append(snap.Members, m.node())
	}
	clear(seen)
	for _, s := range f.Streams {
		c := shardmap.StreamConfig{Name: s.Name, Shards: s.Shards, RetentionBytes: s.RetentionBytes, RetentionAge: time.Duration(s.RetentionAgeNano), Replicas: s.Replicas}
		if err := c.Validate(); err != nil || seen[c.Name] {
			return snapshot{}, fmt.Errorf("ctl: load state %s: corrupt stream %q: %v", path, s.Name, err)
		}
		if s.Owners.Len() > c.Shards {
			return snapshot{}, fmt.Errorf("ctl: load state %s: corrupt stream %q: %d owners for %d shards", path, s.Name, s.Owners.Len(), c.Shards)
		}
		seen[c.Name] = true
		snap.Streams = append(snap.Streams, shardmap.Stream{StreamConfig: c, Placement: s.Owners, Created: s.Created})
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

// writeFileAtomic replaces path with b (see internal/atomicfile).
func writeFileAtomic(path string, b []byte) error {
	return atomicfile.WriteFile(path, b, 0o600)
}

// importedSuffix is appended to the state file once etcd holds its state.
const importedSuffix = ".imported"

// importStateFile moves the state file of an earlier version of ctl (a
// JSON file in dir) into an empty etcd store, then renames the file so it
// is imported only once. With etcd already holding state, a file whose
// epoch is not above etcd's is the remains of an import interrupted
// before the rename, and is renamed; a newer one is an error, since
// silently preferring either could lose streams.
func importStateFile(ctx context.Context, dir string, st *store, log *slog.Logger) error {
	path := filepath.Join(dir, stateFile)
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	snap, err := loadState(dir)
	if err != nil {
		return err
	}
	if st.rev == 0 {
		if err := st.save(ctx, snap); err != nil {
			return fmt.Errorf("ctl: import %s into etcd: %w", path, err)
		}
		log.Info("state file imported into etcd", "file", path, "epoch", snap.Epoch, "members", len(snap.Members), "streams", len(snap.Streams), "grants", len(snap.Grants))
	} else if snap.Epoch > st.snap.Epoch {
		return fmt.Errorf("ctl: %s holds epoch %d but etcd (%s) already holds state at epoch %d: move one aside to choose", path, snap.Epoch, st.prefix, st.snap.Epoch)
	}
	if err := os.Rename(path, path+importedSuffix); err != nil {
		return fmt.Errorf("ctl: rename imported state file: %w", err)
	}
	return nil
}
