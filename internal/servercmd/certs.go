package servercmd

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/felix-broker/felix/transport"
)

// Certs issues the cluster's certificates in offline steps, as an operator
// of NATS or CockroachDB would: create the CA once on a machine that keeps
// its key, then issue one certificate per broker, control plane and client
// principal, each into a directory of its own holding NAME.crt, NAME.key
// and a copy of ca.crt, never ca.key. Ship each such directory to the one
// process it is for. Revoke adds certificates to the CA's revocation
// list (crl.pem in the CA directory), which the operator copies next to
// ca.crt into every broker's and control plane's directory, where they
// re-read it. Dev writes everything, the CA key included, into one
// directory, for development only, and needs no CRL.
type Certs struct {
	CA     CertsCA     `cmd:"" name:"ca" help:"Create the cluster CA (ca.crt and ca.key) in --ca-dir. Keep this directory offline: ca.key signs every identity in the cluster."`
	Node   CertsNode   `cmd:"" help:"Issue a broker's certificate (role node, CN = node id) into --out."`
	Ctl    CertsCtl    `cmd:"" help:"Issue the control plane's certificate (role ctl) into --out."`
	Client CertsClient `cmd:"" help:"Issue a client certificate (role client, CN = principal name) into --out."`
	Revoke CertsRevoke `cmd:"" help:"Revoke certificates: add them to the CRL (crl.pem) in --ca-dir, signed by the CA. Copy crl.pem next to ca.crt into every broker's and control plane's --certs directory: they re-read it within seconds, refuse the revoked certificates' connections and close those already up. The list says it is current for a year (its next update; --renew signs it again)."`
	Dev    CertsDev    `cmd:"" help:"Write a development PKI into one directory: the CA with its key beside every node's key and an admin client certificate. Not for production."`
}

// caFlags are the flags naming the CA directory, shared by every step.
type caFlags struct {
	CADir string `name:"ca-dir" help:"Directory holding the cluster CA (ca.crt, ca.key)." default:"ca" type:"path"`
}

func (f caFlags) files() (cert, key string) {
	return filepath.Join(f.CADir, "ca.crt"), filepath.Join(f.CADir, "ca.key")
}

// CertsCA creates the cluster CA.
type CertsCA struct {
	caFlags
	Name         string `help:"Common name of the CA certificate." default:"Felix cluster CA"`
	Force        bool   `help:"Replace a CA already in --ca-dir: every certificate the old one issued stops verifying." xor:"existing"`
	KeepExisting bool   `help:"Leave a CA already in --ca-dir as it is and succeed (for provisioning steps that run more than once)." xor:"existing"`
}

func (c *CertsCA) Run(log *slog.Logger) error {
	certFile, keyFile := c.files()
	_, certErr := os.Stat(certFile)
	_, keyErr := os.Stat(keyFile)
	if certErr == nil || keyErr == nil {
		switch {
		case c.KeepExisting:
			if _, err := transport.LoadCAKeyPair(certFile, keyFile); err != nil {
				return fmt.Errorf("--keep-existing: the CA in %s is unusable: %w", c.CADir, err)
			}
			fmt.Printf("kept the cluster CA in %s\n", c.CADir)
			return nil
		case !c.Force:
			return fmt.Errorf("%s already holds a CA (ca.crt or ca.key); --force replaces it, which invalidates every certificate it issued", c.CADir)
		}
	}
	ca, err := transport.NewCA(c.Name)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.CADir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", c.CADir, err)
	}
	if err := ca.WriteFiles(certFile, keyFile); err != nil {
		return err
	}
	fmt.Printf("wrote the cluster CA to %s (ca.crt, ca.key); keep ca.key offline and ship only ca.crt\n", c.CADir)
	return nil
}

// leafFlags are the flags of the steps that issue a certificate.
type leafFlags struct {
	caFlags
	Out string `help:"Directory to write NAME.crt, NAME.key and a copy of ca.crt into; it must not hold a CA key (default: ./NAME)." type:"path" placeholder:"DIR"`
}

// CertsNode issues a broker's certificate.
type CertsNode struct {
	ID string `arg:"" help:"Node id of the broker (its --id); also a DNS name in the certificate."`
	leafFlags
	Host []string `help:"Another DNS name or IP address clients and peers dial the broker by (repeatable), e.g. its advertised host." placeholder:"NAME"`
}

func (c *CertsNode) Run(log *slog.Logger) error {
	return issueLeaf(c.leafFlags, transport.RoleNode, c.ID, c.Host)
}

// CertsCtl issues the control plane's certificate.
type CertsCtl struct {
	Name string `arg:"" optional:"" default:"ctl" help:"Name of the control plane member: its --etcd-name in a control plane of several (felix ctl reads NAME.crt and NAME.key from its --certs), or the default ctl for a single one (ctl.crt, ctl.key); also a DNS name in the certificate, with NAME.felix-ctl.invalid, the name the other members' etcd accepts (no other role's certificate carries one)."`
	leafFlags
	Host []string `help:"Another DNS name or IP address the member is reached by (repeatable): the host in the brokers' --ctl, in its --advertise and in its --etcd-peer-url and --etcd-client-url (e.g. felix-ctl-0.felix-ctl)." placeholder:"NAME"`
}

func (c *CertsCtl) Run(log *slog.Logger) error {
	return issueLeaf(c.leafFlags, transport.RoleCtl, c.Name, c.Host)
}

// CertsClient issues a client certificate.
type CertsClient struct {
	Name string `arg:"" help:"Principal name the certificate authenticates (what permissions and --superuser name); not ctl, the control plane's default name."`
	leafFlags
}

func (c *CertsClient) Run(log *slog.Logger) error {
	return issueLeaf(c.leafFlags, transport.RoleClient, c.Name, nil)
}

// issueLeaf issues a certificate of role for name from the CA in
// f.CADir and writes it, its key and a copy of ca.crt into f.Out.
func issueLeaf(f leafFlags, role transport.Role, name string, hosts []string) error {
	if err := checkCertName(name); err != nil {
		return err
	}
	if r, ok := reservedNames[name]; ok && r.role != role {
		return fmt.Errorf("name %q: reserved for %s (a %s certificate); a %s certificate cannot carry it", name, r.what, r.role, role)
	}
	out := f.Out
	if out == "" {
		out = name
	}
	caCert, caKey := f.files()
	ca, err := transport.LoadCAKeyPair(caCert, caKey)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("no CA in %s (create one with `felix certs ca --ca-dir %s`): %w", f.CADir, f.CADir, err)
		}
		return err
	}
	// Never write a key where a CA key lives: the directory is shipped to
	// a node whole.
	if _, err := os.Stat(filepath.Join(out, "ca.key")); err == nil {
		return fmt.Errorf("--out %s holds a CA key (ca.key); issue into a directory of its own, which is what gets shipped", out)
	}
	if same, err := sameDir(out, f.CADir); err != nil {
		return err
	} else if same {
		return fmt.Errorf("--out %s is the CA directory; issue into a directory of its own, which is what gets shipped", out)
	}
	cert, err := ca.Issue(role, name, hosts...)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", out, err)
	}
	if err := transport.WriteKeyPair(cert, filepath.Join(out, name+".crt"), filepath.Join(out, name+".key")); err != nil {
		return err
	}
	if err := ca.WriteCert(filepath.Join(out, "ca.crt")); err != nil {
		return err
	}
	names := slices.Clone(cert.Leaf.DNSNames)
	for _, ip := range cert.Leaf.IPAddresses {
		names = append(names, ip.String())
	}
	if len(names) > 0 {
		fmt.Printf("wrote %s.crt (%s %q, names %s), %s.key and ca.crt to %s\n", name, role, name, strings.Join(names, ", "), name, out)
	} else {
		fmt.Printf("wrote %s.crt (%s %q), %s.key and ca.crt to %s\n", name, role, name, name, out)
	}
	return nil
}

// CertsRevoke adds certificates to the cluster's revocation list.
type CertsRevoke struct {
	caFlags
	Certs  []string `arg:"" optional:"" help:"PEM certificate files to revoke (each NAME.crt as issued; the CA must have issued them)." type:"existingfile" placeholder:"CERT.pem"`
	Serial []string `help:"Serial number of a certificate to revoke, in hex (as openssl x509 -serial prints it; colons allowed), for one whose file is no longer at hand (repeatable)." placeholder:"HEX"`
	Renew  bool     `help:"Sign the list again as it is, with a new number and a next update a year ahead (a CRL is valid for a year; brokers warn past it), or write an empty one if there is none."`
}

func (c *CertsRevoke) Run(log *slog.Logger) error {
	if len(c.Certs) == 0 && len(c.Serial) == 0 && !c.Renew {
		return errors.New("nothing to revoke: name certificate files, or serials with --serial (or --renew the list)")
	}
	caCert, caKey := c.files()
	ca, err := transport.LoadCAKeyPair(caCert, caKey)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("no CA in %s (the CRL is signed with ca.key): %w", c.CADir, err)
		}
		return err
	}
	var serials []*big.Int
	for _, f := range c.Certs {
		cert, err := readCertFile(f)
		if err != nil {
			return err
		}
		if err := cert.CheckSignatureFrom(ca.Cert); err != nil {
			return fmt.Errorf("%s was not issued by the CA in %s: %w", f, c.CADir, err)
		}
		serials = append(serials, cert.SerialNumber)
	}
	for _, h := range c.Serial {
		s, ok := new(big.Int).SetString(strings.ReplaceAll(strings.TrimPrefix(strings.ToLower(h), "0x"), ":", ""), 16)
		if !ok || s.Sign() <= 0 {
			return fmt.Errorf("--serial %q: want a positive hexadecimal number", h)
		}
		serials = append(serials, s)
	}
	file := filepath.Join(c.CADir, transport.CRLFile)
	crl, added, err := ca.Revoke(file, serials...)
	if err != nil {
		return err
	}
	if added == 0 && len(serials) > 0 {
		fmt.Printf("%s already revokes every certificate named (number %v, %d revoked); left as it was\n", file, crl.Number, len(crl.RevokedCertificateEntries))
		return nil
	}
	fmt.Printf("wrote %s (number %v, %d revoked, %d new; next update %s)\n", file, crl.Number, len(crl.RevokedCertificateEntries), added, crl.NextUpdate.Format(time.DateOnly))
	fmt.Printf("copy it next to ca.crt into every broker's and control plane's --certs directory (as %s): they load it within seconds\n", transport.CRLFile)
	return nil
}

// readCertFile reads the first PEM certificate in file.
func readCertFile(file string) (*x509.Certificate, error) {
	certs, err := transport.ReadCertificates(file)
	if err != nil {
		return nil, err
	}
	return certs[0], nil
}

// CertsDev writes a development PKI: today's `felix dev` layout.
type CertsDev struct {
	Dir   string   `help:"Directory to write ca.crt, ca.key, <node>.crt/.key and admin.crt/.key into." default:"certs" type:"path"`
	Nodes []string `help:"Node ids to issue certificates for (\"ctl\" gets the control plane's role; each id is also a DNS name in its certificate)." default:"ctl,broker-0,broker-1,broker-2"`
	Host  []string `help:"Extra name for a node's certificate, as NODE=NAME (repeatable), e.g. broker-0=broker-0.felix-broker." placeholder:"NODE=NAME"`
}

func (c *CertsDev) Run(log *slog.Logger) error {
	extra := map[string][]string{}
	for _, h := range c.Host {
		node, name, ok := strings.Cut(h, "=")
		if !ok || node == "" || name == "" {
			return fmt.Errorf("--host %q: want NODE=NAME", h)
		}
		if !slices.Contains(c.Nodes, node) {
			return fmt.Errorf("--host %q: %s is not one of --nodes %v", h, node, c.Nodes)
		}
		extra[node] = append(extra[node], name)
	}
	if err := transport.GenerateDevCerts(c.Dir, c.Nodes...); err != nil {
		return err
	}
	if len(extra) > 0 {
		ca, err := transport.LoadCAKeyPair(filepath.Join(c.Dir, "ca.crt"), filepath.Join(c.Dir, "ca.key"))
		if err != nil {
			return err
		}
		for _, node := range c.Nodes {
			hosts := extra[node]
			if len(hosts) == 0 {
				continue
			}
			role := transport.RoleNode
			if node == transport.DevCtlName {
				role = transport.RoleCtl
			}
			cert, err := ca.Issue(role, node, append([]string{"localhost", "127.0.0.1", "::1"}, hosts...)...)
			if err != nil {
				return fmt.Errorf("issuing %s with %v: %w", node, hosts, err)
			}
			if err := transport.WriteKeyPair(cert, filepath.Join(c.Dir, node+".crt"), filepath.Join(c.Dir, node+".key")); err != nil {
				return err
			}
		}
	}
	fmt.Printf("wrote a development PKI to %s: the CA (its key too), certificates for %v and the client %q\n",
		c.Dir, c.Nodes, transport.DevAdminName)
	fmt.Println("for development only: every process reading this directory holds the CA key (see `felix certs ca`)")
	return nil
}

// reservedNames are the names issued under one role only. Names the
// control plane's etcd checks are in transport.CtlMemberDomain, which
// transport.CA.Issue gives ctl certificates alone; these are the
// defaults a reader (or an ACL) takes for those roles.
var reservedNames = map[string]struct {
	role transport.Role
	what string
}{
	transport.DevCtlName:   {transport.RoleCtl, "the control plane's default member"},
	transport.DevAdminName: {transport.RoleClient, "the operator's principal, the default superuser"},
}

// checkCertName rejects names that are not safe as a file name in --out
// or as a certificate's common name.
func checkCertName(name string) error {
	if name == "" || len(name) > 128 {
		return fmt.Errorf("name %q: must be 1..128 characters", name)
	}
	if name == "ca" {
		return fmt.Errorf("name %q: reserved for the CA's files", name)
	}
	for i, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '-' || c == '_' || c == '.' && i > 0
		if !ok {
			return fmt.Errorf("name %q: character %q not allowed (use letters, digits, '-', '_', and '.' after the first)", name, c)
		}
	}
	return nil
}

// sameDir reports whether a and b are the same existing directory.
func sameDir(a, b string) (bool, error) {
	ai, err := os.Stat(a)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	bi, err := os.Stat(b)
	if err != nil {
		return false, err
	}
	return os.SameFile(ai, bi), nil
}
