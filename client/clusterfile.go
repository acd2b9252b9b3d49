package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/felix-broker/felix/internal/atomicfile"
)

// DefaultClusterFile is the connection file `felix dev` writes in its
// working directory and that ConnectFile and felixctl read by default.
const DefaultClusterFile = "felix-cluster.json"

// ClusterFile describes how to reach a cluster: its brokers, the CA that
// signed their certificates, and the client certificate to present.
type ClusterFile struct {
	Name     string          `json:"name"`
	CAFile   string          `json:"ca_file"`
	CertFile string          `json:"cert_file,omitempty"` // client certificate (PEM)
	KeyFile  string          `json:"key_file,omitempty"`  // its private key (PEM)
	Brokers  []ClusterBroker `json:"brokers"`
	// Admin is the HTTP admin address of the process that runs the
	// control plane (for `felix dev`: /metrics, /healthz, /readyz, and
	// its supervisor's POST /restart?broker=ID), if it has one.
	Admin string `json:"admin,omitempty"`
}

// ClusterBroker is one broker in a ClusterFile.
type ClusterBroker struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
	// Admin is the broker's HTTP admin address (/metrics, /healthz,
	// /readyz), if known when the file was written.
	Admin string `json:"admin,omitempty"`
}

// ErrNoClusterFile is returned by LoadClusterFile when the file is missing.
var ErrNoClusterFile = errors.New("client: no cluster connection file")

// LoadClusterFile reads a connection file. A relative CAFile, CertFile or
// KeyFile is resolved against the file's directory.
func LoadClusterFile(path string) (*ClusterFile, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s does not exist (is `felix dev` running in this directory?)", ErrNoClusterFile, path)
	}
	if err != nil {
		return nil, fmt.Errorf("client: read cluster file: %w", err)
	}
	var cf ClusterFile
	if err := json.Unmarshal(b, &cf); err != nil {
		return nil, fmt.Errorf("client: cluster file %s: %w", path, err)
	}
	if len(cf.Brokers) == 0 {
		return nil, fmt.Errorf("client: cluster file %s lists no brokers", path)
	}
	for _, f := range []*string{&cf.CAFile, &cf.CertFile, &cf.KeyFile} {
		if *f != "" && !filepath.IsAbs(*f) {
			*f = filepath.Join(filepath.Dir(path), *f)
		}
	}
	return &cf, nil
}

// Write replaces the file at path whole (internal/atomicfile: through a
// new temporary file beside it, never one at a name another user could
// have placed a link at).
func (cf *ClusterFile) Write(path string) error {
	b, err := json.MarshalIndent(cf, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("client: write cluster file: %w", err)
	}
	return nil
}

// Broker returns the broker with id.
func (cf *ClusterFile) Broker(id string) (ClusterBroker, bool) {
	for _, b := range cf.Brokers {
		if b.ID == id {
			return b, true
		}
	}
	return ClusterBroker{}, false
}

// ConnectFile connects to the first reachable broker listed in the cluster
// file at path (DefaultClusterFile when empty), verifying it against the
// file's CA.
func ConnectFile(ctx context.Context, path string, opts ...Opt) (*Client, error) {
	if path == "" {
		path = DefaultClusterFile
	}
	cf, err := LoadClusterFile(path)
	if err != nil {
		return nil, err
	}
	if cf.CAFile != "" {
		opts = append([]Opt{WithCAFile(cf.CAFile)}, opts...)
	}
	if cf.CertFile != "" {
		opts = append([]Opt{WithClientCertFile(cf.CertFile, cf.KeyFile)}, opts...)
	}
	var errs []error
	for _, b := range cf.Brokers {
		c, err := Connect(ctx, b.Addr, opts...)
		if err == nil {
			return c, nil
		}
		errs = append(errs, fmt.Errorf("%s (%s): %w", b.ID, b.Addr, err))
	}
	return nil, fmt.Errorf("client: no broker in %s is reachable: %w", path, errors.Join(errs...))
}
