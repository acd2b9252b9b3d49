package ctl

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"

	etcdtransport "go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/felix-broker/felix/transport"
)

// The embedded member's TLS. Its https peer and client URLs use the ctl's
// own certificate and the cluster CA (EtcdConfig.CertFile, KeyFile,
// CAFile) and require a client certificate from that CA:
//
//   - Peer URL, both ways (the listener checks the member dialing it, and
//     a member dialing a peer checks the peer): the chain, and that the
//     certificate's CN is a member's name (one of
//     EtcdConfig.InitialCluster's, or the CN of this member's own
//     certificate, for members sharing one); the listener also checks
//     that a SAN names the address the connection comes from. etcd has no
//     hook on its peer connections for more: Felix's role (the
//     certificate's OU) is not checked there, so a node or client
//     certificate issued under a ctl member's name (or under the name of
//     a shared ctl certificate) would pass. Never issue one.
//   - Client URL: the same chain check, then every gRPC request must come
//     with a certificate of role felix-ctl (requireCtlRole); etcd's JSON
//     gateway, which would relay requests under the member's own
//     certificate, is off.
//
// Plaintext is refused where others could reach it: an http:// peer URL
// in a multi-member cluster, or an http:// peer or client URL that is not
// on loopback, unless EtcdConfig.Insecure says so.

// errPlaintext is the error of a plaintext URL EtcdConfig.Insecure does
// not allow.
var errPlaintext = errors.New("ctl: plaintext etcd URL")

// checkPlaintext refuses the http:// URLs of the embedded member that
// others could reach, unless ec.Insecure.
func checkPlaintext(ec EtcdConfig, urls etcdURLs) error {
	if ec.Insecure {
		return nil
	}
	peers, err := initialPeers(ec.InitialCluster)
	if err != nil {
		return err
	}
	multi := len(peers) > 1
	check := func(what, raw string, mustTLS bool) error {
		u, err := url.Parse(raw)
		if err != nil {
			return fmt.Errorf("ctl: etcd %s url %q: %w", what, raw, err)
		}
		if u.Scheme != "http" {
			return nil
		}
		if mustTLS {
			return fmt.Errorf("%w: %s url %s in a cluster of %d members: its raft traffic (all of ctl's state) would travel unencrypted and unauthenticated; use https:// (the ctl's certificate and the cluster CA secure it), or --etcd-insecure on a network no one else shares",
				errPlaintext, what, raw, len(peers))
		}
		if !loopbackHost(u.Hostname()) {
			return fmt.Errorf("%w: %s url %s is not on loopback: anyone who reaches it could read and write ctl's state; use https:// (the ctl's certificate and the cluster CA secure it), or --etcd-insecure on a network no one else shares",
				errPlaintext, what, raw)
		}
		return nil
	}
	if err := check("client", urls.Client, false); err != nil {
		return err
	}
	if err := check("peer", urls.Peer, multi); err != nil {
		return err
	}
	for _, p := range peers {
		if err := check("peer", p.url, multi); err != nil {
			return err
		}
	}
	return nil
}

// loopbackHost reports whether host only ever means this machine.
func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

type initialPeer struct{ name, url string }

// initialPeers parses an initial cluster, name=url,... (a name may be
// listed with several URLs).
func initialPeers(s string) ([]initialPeer, error) {
	if s == "" {
		return nil, nil
	}
	var out []initialPeer
	names := map[string]bool{}
	for _, kv := range strings.Split(s, ",") {
		name, u, ok := strings.Cut(kv, "=")
		if !ok || name == "" || u == "" {
			return nil, fmt.Errorf("ctl: etcd initial cluster %q: %q is not name=url", s, kv)
		}
		out = append(out, initialPeer{name: name, url: u})
		names[name] = true
	}
	if len(names) == 1 {
		return out[:1], nil
	}
	return out, nil
}

// secureEmbedded sets the TLS of c, the embedded member's etcd config,
// for its https URLs, and returns the client TLS config this ctl reaches
// its member (and the other members' health) with: nil when its client
// URL is http.
func secureEmbedded(c *embed.Config, ec EtcdConfig, lg *zap.Logger) (*tls.Config, error) {
	peerTLS := c.AdvertisePeerUrls[0].Scheme == "https"
	clientTLS := c.AdvertiseClientUrls[0].Scheme == "https"
	if peers, _ := initialPeers(c.InitialCluster); slices.ContainsFunc(peers, func(p initialPeer) bool { return strings.HasPrefix(p.url, "https:") }) {
		peerTLS = true
	}
	if !peerTLS && !clientTLS {
		return nil, nil
	}
	if ec.CertFile == "" || ec.KeyFile == "" || ec.CAFile == "" {
		return nil, errors.New("ctl: embedded etcd with https URLs needs EtcdConfig.CertFile, KeyFile and CAFile (the ctl's certificate and the cluster CA)")
	}
	cert, err := transport.LoadKeyPair(ec.CertFile, ec.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("ctl: embedded etcd TLS: %w", err)
	}
	if id, err := transport.CertIdentity(cert.Leaf); err != nil || id.Role != transport.RoleCtl {
		return nil, fmt.Errorf("ctl: embedded etcd TLS: %s is not a ctl certificate (role %q): etcd members authenticate each other with the ctl's own certificate", ec.CertFile, id.Role)
	}
	ca, err := transport.LoadCA(ec.CAFile)
	if err != nil {
		return nil, fmt.Errorf("ctl: embedded etcd TLS: %w", err)
	}
	var info etcdtransport.TLSInfo
	info.CertFile, info.KeyFile, info.TrustedCAFile = ec.CertFile, ec.KeyFile, ec.CAFile
	info.ClientCertAuth = true
	info.MinVersion = tls.VersionTLS13
	info.Logger = lg
	if peerTLS {
		c.PeerTLSInfo = info
		c.PeerTLSInfo.AllowedCNs = memberCNs(c, cert.Leaf.Subject.CommonName)
	}
	if !clientTLS {
		return nil, nil
	}
	c.ClientTLSInfo = info
	// The gateway relays JSON requests over gRPC under the member's own
	// certificate, past requireCtlRole: off.
	c.EnableGRPCGateway = false
	c.GRPCAdditionalServerOptions = append(c.GRPCAdditionalServerOptions,
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := requireCtlRole(ctx); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := requireCtlRole(ss.Context()); err != nil {
				return err
			}
			return h(srv, ss)
		}))
	// This ctl's client accepts members presenting ctl certificates only.
	return transport.VerifyPeer(&tls.Config{
		MinVersion:   tls.VersionTLS13,
		RootCAs:      ca,
		Certificates: []tls.Certificate{cert},
	}, transport.RoleCtl, ""), nil
}

// memberCNs are the certificate names etcd's peer listener accepts: the
// member names of the initial cluster and this member's, and own, the CN
// of this member's certificate (members may share one certificate).
func memberCNs(c *embed.Config, own string) []string {
	cns := []string{c.Name, own}
	peers, _ := initialPeers(c.InitialCluster)
	for _, p := range peers {
		cns = append(cns, p.name)
	}
	slices.Sort(cns)
	return slices.Compact(cns)
}

// requireCtlRole fails a gRPC request on the embedded member's TLS client
// URL unless it came with a verified certificate of role felix-ctl. A
// request on a plaintext URL (loopback, or allowed by
// EtcdConfig.Insecure) has no certificate to check and passes.
func requireCtlRole(ctx context.Context) error {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return status.Error(codes.Unauthenticated, "felix: no peer")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil
	}
	if len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return status.Error(codes.Unauthenticated, "felix: this etcd serves ctl members only: no verified certificate")
	}
	id, err := transport.CertIdentity(ti.State.VerifiedChains[0][0])
	if err != nil || id.Role != transport.RoleCtl {
		return status.Errorf(codes.PermissionDenied, "felix: this etcd serves ctl members only, not %q (role %q)", id.Name, id.Role)
	}
	return nil
}
