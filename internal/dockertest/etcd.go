package dockertest

import (
	"context"
	"crypto/tls"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Etcd returns a client of the cluster's etcd (its external members, or
// the ctls' embedded ones), for tests that read what the control plane
// stored: the state, and its history. It is closed with the cluster.
func (c *Cluster) Etcd() (*clientv3.Client, error) {
	if c.etcdCli != nil {
		return c.etcdCli, nil
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.EtcdEndpoints(), DialTimeout: 5 * time.Second, TLS: c.etcdTLS(), Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("dockertest: etcd client: %w", err)
	}
	c.etcdCli = cli
	return cli, nil
}

// waitEtcd waits until every external etcd member answers and the
// cluster has a leader (a linearizable read succeeds). Without external
// members it returns at once.
func (c *Cluster) waitEtcd(ctx context.Context) error {
	if len(c.Etcds) == 0 {
		return nil
	}
	if err := poll(ctx, func() error { return c.etcdUp(ctx) }); err != nil {
		return fmt.Errorf("the etcd members did not come up: %w", err)
	}
	return nil
}

func (c *Cluster) etcdUp(ctx context.Context) error {
	for _, n := range c.Etcds {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdURL(n)}, DialTimeout: 2 * time.Second, TLS: c.etcdTLS(), Logger: zap.NewNop()})
		if err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = cli.Get(rctx, "health")
		cancel()
		cli.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
	}
	return nil
}

// etcdTLS is the TLS of the test's etcd clients: a ctl certificate, and
// the cluster CA verifying the members (their certificates name their IP
// addresses).
func (c *Cluster) etcdTLS() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{c.etcdCert}, RootCAs: c.ca, MinVersion: tls.VersionTLS13}
}
