package transport

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/felix-broker/felix/internal/atomicfile"
)

// Role is what a certificate is for, written in its subject's
// OrganizationalUnit.
type Role string

// Roles.
//
// Roles are separate identities: a client certificate cannot act as a peer
// or as the control plane, the control plane's cannot act as a broker, and
// a broker's cannot act as the control plane.
const (
	RoleNode   Role = "felix-node"   // a broker: server and client, CN = node id
	RoleCtl    Role = "felix-ctl"    // a control plane member: server and client, CN = its name
	RoleClient Role = "felix-client" // an application or operator: client only, CN = principal name
)

// serves reports whether certificates of role r are servers as well as
// clients (ExtKeyUsage server and client, the name as a SAN).
func (r Role) serves() bool { return r == RoleNode || r == RoleCtl }

// CtlMemberDomain is the DNS domain in which every ctl certificate, and
// no other, names its holder: [CA.Issue] gives a ctl certificate named
// name the subject alternative name [CtlMemberHost](name), and refuses
// any name or host in this domain otherwise. The control plane's etcd
// peer port, which can check a certificate's names but not its role
// (the OrganizationalUnit), accepts only the member host names of its
// members: a node or client certificate under a member's name is not
// one. ".invalid" never resolves (RFC 2606). Never change it: issued
// certificates carry it.
const CtlMemberDomain = "felix-ctl.invalid"

// CtlMemberHost returns the host name a ctl certificate named name
// carries: name + "." + [CtlMemberDomain].
func CtlMemberHost(name string) string { return name + "." + CtlMemberDomain }

// inCtlMemberDomain reports whether the host name h is, or would match
// as a pattern, a name in CtlMemberDomain (compared as x509 compares
// host names: without case or a trailing dot).
func inCtlMemberDomain(h string) bool {
	h = strings.TrimRight(strings.ToLower(h), ".")
	return h == CtlMemberDomain || strings.HasSuffix(h, "."+CtlMemberDomain)
}

// Names in a development PKI (see [GenerateDevCerts]).
const (
	DevCtlName   = "ctl"   // the control plane's certificate, role ctl
	DevAdminName = "admin" // the operator's client certificate, a superuser
)

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 825 * 24 * time.Hour
	// renewBefore is how close to expiry GenerateDevCerts replaces a leaf.
	renewBefore = 30 * 24 * time.Hour
)

// CA is a certificate authority that issues the cluster's node and client
// certificates.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// NewCA returns a new self-signed CA named name, with an ECDSA P-256 key.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("transport: generating CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"Felix"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("transport: creating CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("transport: parsing CA certificate: %w", err)
	}
	return &CA{Cert: cert, Key: key}, nil
}

// LoadCAKeyPair reads a CA certificate and its private key (PEM).
func LoadCAKeyPair(certFile, keyFile string) (*CA, error) {
	pair, err := LoadKeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	if !pair.Leaf.IsCA {
		return nil, fmt.Errorf("transport: loading CA %q: not a CA certificate", certFile)
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("transport: loading CA key %q: %T cannot sign", keyFile, pair.PrivateKey)
	}
	return &CA{Cert: pair.Leaf, Key: key}, nil
}

// Pool returns a pool holding the CA's certificate, to verify peers with.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// WriteFiles writes the CA's certificate and key as PEM, the key readable
// by the owner only.
func (ca *CA) WriteFiles(certFile, keyFile string) error {
	return WriteKeyPair(tls.Certificate{Certificate: [][]byte{ca.Cert.Raw}, PrivateKey: ca.Key}, certFile, keyFile)
}

// WriteCert writes the CA's certificate alone (never its key) as PEM,
// replacing certFile atomically: what a node or client is given to verify
// the cluster with.
func (ca *CA) WriteCert(certFile string) error {
	return writeFileAtomic(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw}), 0o644)
}

// Issue returns a new certificate signed by ca, with an ECDSA P-256 key,
// for role with common name name (the node id for RoleNode). A node or
// ctl certificate serves and connects (ExtKeyUsage server and client)
// and has name and hosts as subject alternative names, a ctl
// certificate [CtlMemberHost](name) last; a client certificate only
// connects. hosts are DNS names or IP addresses; neither name nor a host
// may be in [CtlMemberDomain], which only Issue gives, to ctl
// certificates.
func (ca *CA) Issue(role Role, name string, hosts ...string) (tls.Certificate, error) {
	if role != RoleNode && role != RoleCtl && role != RoleClient {
		return tls.Certificate{}, fmt.Errorf("transport: issuing certificate for %q: unknown role %q", name, role)
	}
	if name == "" {
		return tls.Certificate{}, errors.New("transport: issuing certificate: empty name")
	}
	for _, h := range append([]string{name}, hosts...) {
		if inCtlMemberDomain(h) {
			return tls.Certificate{}, fmt.Errorf("transport: issuing certificate for %q: %q is in %s, reserved for the names Issue gives ctl certificates (their members' names for etcd's peer port)", name, h, CtlMemberDomain)
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("transport: generating key for %q: %w", name, err)
	}
	serial, err := newSerial()
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			CommonName:         name,
			Organization:       []string{"Felix"},
			OrganizationalUnit: []string{string(role)},
		},
		NotBefore:   now.Add(-time.Hour),
		NotAfter:    now.Add(leafValidity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter
	}
	if role.serves() {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		hosts = append([]string{name}, hosts...)
	}
	if role == RoleCtl {
		// Last: etcd's peer port looks the DNS names up in order to match
		// the address a member connects from, and this one never
		// resolves.
		hosts = append(hosts, CtlMemberHost(name))
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("transport: issuing certificate for %q: %w", name, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("transport: parsing certificate for %q: %w", name, err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// WriteKeyPair writes cert's chain and private key as PEM files, the key
// readable by the owner only. Each file is replaced atomically.
func WriteKeyPair(cert tls.Certificate, certFile, keyFile string) error {
	var certPEM []byte
	for _, der := range cert.Certificate {
		certPEM = append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		return fmt.Errorf("transport: encoding key for %q: %w", keyFile, err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	if err := writeFileAtomic(keyFile, keyPEM, 0o600); err != nil {
		return err
	}
	return writeFileAtomic(certFile, certPEM, 0o644)
}

// GenerateDevCerts writes a development PKI to dir: ca.crt and ca.key (an
// existing CA there is reused), <id>.crt and <id>.key for each node id
// (role ctl for the id [DevCtlName], role node for the others; SANs
// localhost, 127.0.0.1, ::1 and the id), and admin.crt and admin.key (role
// client, CN [DevAdminName]: the principal a development control plane
// makes a superuser). Certificates already in dir that the CA verifies for
// the same role and name, and that are not near expiry, are kept, so
// running it again changes nothing (but a ctl certificate lacking its
// [CtlMemberHost], of an earlier version, is issued again). Node ids must be file-name safe and
// cannot be "ca" or "admin".
//
// It is for development and tests: it keeps the CA key beside the
// certificates. A production PKI keeps the CA key offline (see `felix
// certs`).
//
// It is not safe to run concurrently on one dir: run it once before
// starting the processes that read the files.
func GenerateDevCerts(dir string, nodeIDs ...string) error {
	for _, id := range nodeIDs {
		if err := checkNodeID(id); err != nil {
			return fmt.Errorf("transport: generating dev certs in %q: %w", dir, err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("transport: generating dev certs: %w", err)
	}
	caCert, caKey := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	ca, err := LoadCAKeyPair(caCert, caKey)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("transport: generating dev certs: existing CA unusable: %w", err)
		}
		if ca, err = NewCA("Felix development CA"); err != nil {
			return err
		}
		if err := ca.WriteFiles(caCert, caKey); err != nil {
			return err
		}
	}
	type leaf struct {
		role  Role
		name  string
		hosts []string
	}
	leaves := []leaf{{RoleClient, DevAdminName, nil}}
	for _, id := range nodeIDs {
		role := RoleNode
		if id == DevCtlName {
			role = RoleCtl
		}
		leaves = append(leaves, leaf{role, id, []string{"localhost", "127.0.0.1", "::1"}})
	}
	for _, l := range leaves {
		certFile, keyFile := filepath.Join(dir, l.name+".crt"), filepath.Join(dir, l.name+".key")
		if ca.issued(certFile, keyFile, l.role, l.name) {
			continue
		}
		cert, err := ca.Issue(l.role, l.name, l.hosts...)
		if err != nil {
			return err
		}
		if err := WriteKeyPair(cert, certFile, keyFile); err != nil {
			return err
		}
	}
	return nil
}

// issued reports whether the key pair in certFile and keyFile is a usable
// certificate from ca for role and name.
func (ca *CA) issued(certFile, keyFile string, role Role, name string) bool {
	pair, err := LoadKeyPair(certFile, keyFile)
	if err != nil {
		return false
	}
	usage := x509.ExtKeyUsageClientAuth
	if role.serves() {
		usage = x509.ExtKeyUsageServerAuth
	}
	_, err = pair.Leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{usage}})
	if err != nil || time.Until(pair.Leaf.NotAfter) < renewBefore {
		return false
	}
	if role == RoleCtl && pair.Leaf.VerifyHostname(CtlMemberHost(name)) != nil {
		return false // issued before ctl certificates named their member
	}
	id, err := identityOf(tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{pair.Leaf}}})
	return err == nil && id == Identity{Role: role, Name: name}
}

func checkNodeID(id string) error {
	if id == "" || len(id) > 128 {
		return fmt.Errorf("node id %q: must be 1..128 characters", id)
	}
	if id == "ca" || id == DevAdminName {
		return fmt.Errorf("node id %q: reserved for the %s files", id, id)
	}
	for i, c := range id {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '-' || c == '_' || c == '.' && i > 0
		if !ok {
			return fmt.Errorf("node id %q: character %q not allowed (use letters, digits, '-', '_', '.')", id, c)
		}
	}
	return nil
}

func newSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("transport: generating certificate serial: %w", err)
	}
	return serial, nil
}

// writeFileAtomic replaces name with data (see internal/atomicfile), so
// a reader never sees a partial file.
func writeFileAtomic(name string, data []byte, perm os.FileMode) error {
	if err := atomicfile.WriteFile(name, data, perm); err != nil {
		return fmt.Errorf("transport: writing %q: %w", name, err)
	}
	return nil
}
