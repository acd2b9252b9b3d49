package ctl

import (
	"context"
	"crypto/tls"
	"crypto/x509"
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
//     certificate is a ctl certificate of a member: that it names
//     transport.CtlMemberHost of a member's name (one of
//     EtcdConfig.InitialCluster's, or the CN of this member's own
//     certificate, for members sharing one), a name transport.CA.Issue
//     gives ctl certificates only; the listener also checks that a SAN
//     names the address the connection comes from. etcd has no hook on
//     its peer connections to check Felix's role (the certificate's OU)
//     itself, only its names (AllowedHostnames); its CN (AllowedCNs, as
//     before) a node or client certificate could carry too. A member whose
//     own certificate lacks that name (issued by an earlier `felix
//     certs`) would be refused by its peers: with peers, it does not
//     start, saying to issue it again.
//   - Client URL: the same chain check, then every gRPC request must come
//     with a certificate of role felix-ctl that the cluster's revocation
//     list (EtcdConfig.Revocations) does not name (requireCtlRole, per
//     request, so a revocation also ends what a connection made before
//     it may do); etcd's JSON
//     gateway, which would relay requests under the member's own
//     certificate, is off. etcd's own authentication is off: the ctl
//     certificate is the only credential.
//
// ctl's own etcd client presents the same certificate, and accepts a
// member presenting a ctl certificate of the CA (etcdClientTLS).
//
// The URLs are https by default, the single member's on loopback too
// (any local user could otherwise read and rewrite the state, ACL
// included). Plaintext is refused unless EtcdConfig.Insecure says so;
// a standalone member (StartEtcdMember, `felix etcd`) still has it on
// loopback by default, where its operator secures its clients.

// errPlaintext is the error of a plaintext URL EtcdConfig.Insecure does
// not allow.
var errPlaintext = errors.New("ctl: plaintext etcd URL")

// checkPlaintext refuses the http:// URLs of the embedded member, unless
// ec.Insecure; a standalone member's only where others than its host
// could reach them.
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
		if !ec.standalone {
			return fmt.Errorf("%w: %s url %s: any process on this host, of any user, could read and rewrite ctl's state through it, permissions included; use https:// (the default, secured by the ctl's certificate and the cluster CA), or --etcd-insecure on a host no one else uses",
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
		return nil, fmt.Errorf("ctl: embedded etcd with https URLs (client %s, peer %s; https is the default) needs EtcdConfig.CertFile, KeyFile and CAFile (the ctl's certificate and the cluster CA)",
			&c.AdvertiseClientUrls[0], &c.AdvertisePeerUrls[0])
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
		own := cert.Leaf.Subject.CommonName
		if peers, _ := initialPeers(c.InitialCluster); len(peers) > 1 && cert.Leaf.VerifyHostname(transport.CtlMemberHost(own)) != nil {
			return nil, fmt.Errorf("ctl: embedded etcd TLS: %s does not name %s, which the other members' etcd require of a ctl certificate on their peer port (only ctl certificates carry it; an earlier felix issued this one without): issue it again with `felix certs ctl %s` (and the same --host flags), for every member",
				ec.CertFile, transport.CtlMemberHost(own), own)
		}
		c.PeerTLSInfo = info
		c.PeerTLSInfo.AllowedHostnames = memberHosts(c, own)
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
			if err := requireCtlRole(ctx, ec.Revocations); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := requireCtlRole(ss.Context(), ec.Revocations); err != nil {
				return err
			}
			return h(srv, ss)
		}))
	return etcdClientTLS(cert, ca), nil
}

// etcdClientTLS is the TLS config ctl's etcd client reaches the embedded
// members with (its own, and the others' for their health): it presents
// cert, ctl's, and accepts a member presenting a ctl certificate that ca
// issued, with the usual check of the host name dialed when the URL names
// one. A URL naming an IP address, as the default https://127.0.0.1:port
// of ctl's own member does, is not checked against the certificate's IP
// addresses (crypto/tls does not tell VerifyConnection the address
// dialed): a ctl certificate (`felix certs ctl`) names the hosts brokers
// and other members reach the ctl by, seldom 127.0.0.1, and any holder
// of a ctl certificate is trusted with the whole state anyway.
func etcdClientTLS(cert tls.Certificate, ca *x509.CertPool) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		RootCAs:      ca,
		Certificates: []tls.Certificate{cert},
		// Verified by VerifyConnection instead, without the IP address.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("ctl: etcd member presented no certificate")
			}
			opts := x509.VerifyOptions{Roots: ca, DNSName: cs.ServerName, Intermediates: x509.NewCertPool()}
			for _, c := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(c)
			}
			leaf := cs.PeerCertificates[0]
			if _, err := leaf.Verify(opts); err != nil {
				return fmt.Errorf("ctl: etcd member's certificate: %w", err)
			}
			id, err := transport.CertIdentity(leaf)
			if err != nil {
				return fmt.Errorf("ctl: etcd member's certificate: %w", err)
			}
			if id.Role != transport.RoleCtl {
				return fmt.Errorf("ctl: etcd member presented a %s certificate (%q), not a ctl certificate", id.Role, id.Name)
			}
			return nil
		},
	}
}

// memberHosts are the certificate names etcd's peer listener accepts:
// transport.CtlMemberHost of the member names of the initial cluster
// and this member's, and of own, the CN of this member's certificate
// (members may share one certificate).
func memberHosts(c *embed.Config, own string) []string {
	names := []string{c.Name, own}
	peers, _ := initialPeers(c.InitialCluster)
	for _, p := range peers {
		names = append(names, p.name)
	}
	hosts := make([]string, len(names))
	for i, n := range names {
		hosts[i] = transport.CtlMemberHost(n)
	}
	slices.Sort(hosts)
	return slices.Compact(hosts)
}

// requireCtlRole fails a gRPC request on the embedded member's TLS client
// URL unless it came with a verified certificate of role felix-ctl that
// rev (nil: none) does not list as revoked. It
// guards https:// client URLs only (an http:// one, which only
// EtcdConfig.Insecure allows, has no interceptor): a request with no TLS
// is refused.
func requireCtlRole(ctx context.Context, rev *transport.Revocations) error {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return status.Error(codes.Unauthenticated, "felix: no peer")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return status.Error(codes.Unauthenticated, "felix: this etcd serves ctl members only: no TLS")
	}
	if len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return status.Error(codes.Unauthenticated, "felix: this etcd serves ctl members only: no verified certificate")
	}
	leaf := ti.State.VerifiedChains[0][0]
	id, err := transport.CertIdentity(leaf)
	if err != nil || id.Role != transport.RoleCtl {
		return status.Errorf(codes.PermissionDenied, "felix: this etcd serves ctl members only, not %q (role %q)", id.Name, id.Role)
	}
	if rev != nil {
		if err := rev.Check(leaf); err != nil {
			return status.Error(codes.PermissionDenied, err.Error())
		}
	}
	return nil
}
