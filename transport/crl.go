package transport

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/big"
	"os"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/felix-broker/felix/internal/logonce"
)

// CRLFile is the name of the cluster's certificate revocation list: in
// the CA directory, where [CA.Revoke] keeps it, and beside ca.crt in the
// certificate directory of every broker and control plane member, which
// [WatchCRL] reads.
const CRLFile = "crl.pem"

// CRLValidity is how long after it is written a CRL of [CA.Revoke] says
// it is current (its NextUpdate): a year. A node keeps enforcing a CRL
// past its NextUpdate (a revocation does not lapse), with a warning.
const CRLValidity = 365 * 24 * time.Hour

// crlPEMType is the PEM block type of a CRL (RFC 7468).
const crlPEMType = "X509 CRL"

// Revoke adds the certificates with serials to the CRL in file, signed
// by ca, and writes it back atomically: entries already there are kept
// (with the time they were revoked), its Number is the previous one's
// plus one (1 for a new file), its ThisUpdate now and its NextUpdate
// [CRLValidity] later. Serials already on the list are not added twice;
// when every serial given is, the file is left as it was and added is
// 0. With no serials the list is signed again as it is: renewed, with
// the next number and dates (created empty when there is none). A CRL
// in file that ca did not sign is an error, and is left alone.
func (ca *CA) Revoke(file string, serials ...*big.Int) (crl *x509.RevocationList, added int, err error) {
	var entries []x509.RevocationListEntry
	number := big.NewInt(1)
	old, err := readCRL(file)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, 0, err
	default:
		if err := old.CheckSignatureFrom(ca.Cert); err != nil {
			return nil, 0, fmt.Errorf("transport: CRL %q was not signed by the CA %q: %w", file, ca.Cert.Subject.CommonName, err)
		}
		entries = old.RevokedCertificateEntries
		if old.Number != nil {
			number.Add(old.Number, big.NewInt(1))
		}
	}
	listed := make(map[string]bool, len(entries)+len(serials))
	for _, e := range entries {
		listed[string(e.SerialNumber.Bytes())] = true
	}
	now := time.Now().UTC()
	for _, s := range serials {
		if s == nil || s.Sign() <= 0 {
			return nil, 0, fmt.Errorf("transport: revoking serial %v: a certificate serial is a positive number", s)
		}
		if listed[string(s.Bytes())] {
			continue
		}
		listed[string(s.Bytes())] = true
		entries = append(entries, x509.RevocationListEntry{SerialNumber: new(big.Int).Set(s), RevocationTime: now})
		added++
	}
	if added == 0 && old != nil && len(serials) > 0 {
		return old, 0, nil
	}
	der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{
		Number:                    number,
		ThisUpdate:                now,
		NextUpdate:                now.Add(CRLValidity),
		RevokedCertificateEntries: entries,
	}, ca.Cert, ca.Key)
	if err != nil {
		return nil, 0, fmt.Errorf("transport: signing CRL %q: %w", file, err)
	}
	if crl, err = x509.ParseRevocationList(der); err != nil {
		return nil, 0, fmt.Errorf("transport: parsing the CRL just signed: %w", err)
	}
	if err := writeFileAtomic(file, pem.EncodeToMemory(&pem.Block{Type: crlPEMType, Bytes: der}), 0o644); err != nil {
		return nil, 0, err
	}
	return crl, added, nil
}

// readCRL reads and parses the PEM CRL in file, without checking who
// signed it.
func readCRL(file string) (*x509.RevocationList, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("transport: reading CRL: %w", err)
	}
	block, rest := pem.Decode(data)
	if block == nil || block.Type != crlPEMType {
		return nil, fmt.Errorf("transport: CRL %q: no PEM %q block in it", file, crlPEMType)
	}
	if more, _ := pem.Decode(rest); more != nil {
		// A list appended to another (cat >>) would otherwise be
		// ignored without a word: the file holds one list, the CA's.
		return nil, fmt.Errorf("transport: CRL %q holds more than one PEM block: it must hold one CRL, the latest felix certs revoke wrote", file)
	}
	crl, err := x509.ParseRevocationList(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("transport: CRL %q: %w", file, err)
	}
	return crl, nil
}

// ErrRevoked is the local cause of the [CodeUnauthorized] error that
// refuses a certificate on the revocation list: errors.Is(err,
// ErrRevoked) tells it from other refusals on the side that refused
// (the other side sees CodeUnauthorized and the message).
var ErrRevoked = errors.New("certificate revoked")

// RevocationsConfig configures [WatchCRL]. The zero value is ready to
// use.
type RevocationsConfig struct {
	// Interval is how often the CRL file's modification time and size
	// are looked at; it is read again only when they change. Default 3s.
	Interval time.Duration
	// Logger gets a line for each CRL loaded and each one refused.
	// Default slog.Default().
	Logger *slog.Logger
}

const defaultCRLInterval = 3 * time.Second

// Revocations is the certificate revocation list a node enforces: the
// CRL in a file, signed by the cluster CA, re-read when it changes. Set
// it as [Config.Revocations] on a node's listener and dials: a
// connection whose peer certificate it lists is refused (closed with
// [CodeUnauthorized] right after its handshake, before anything on it is
// read), and when a new CRL lists the certificate of a connection
// already up, that connection is closed the same way. The check costs a
// map lookup per handshake and nothing per frame.
//
// A goroutine polls the file (see [RevocationsConfig.Interval]) until
// Close. A new CRL that cannot be read, is not signed by the CA, or has
// a lower Number than the one in force of the same CA, or none (an older
// copy, which would undo revocations) is logged and the one in force
// kept; so is a CRL file that disappears, and one holding more than one
// list. The file holds one CA's list: while ca.crt holds two CAs (a
// rotation), the list in force is the last one loaded, so certificates
// of the CA it is not from are not checked against any.
type Revocations struct {
	file string
	cas  []*x509.Certificate
	log  *slog.Logger

	stop chan struct{}
	done chan struct{}
	once sync.Once

	// refused remembers the serials whose refusal was logged, so that a
	// revoked client redialing logs one line, not one per attempt.
	refused logonce.Set

	// seen is the modification time and size of the file last looked
	// at; only the polling goroutine (and WatchCRL before it) uses it.
	seen fileStamp

	// mu guards the list in force and the connections admitted under it,
	// so that a connection is either admitted before a new list is put
	// in force (and then checked against it) or checked against the new
	// one.
	mu struct {
		sync.Mutex
		list  *revokedSet
		conns map[*quic.Conn]*x509.Certificate // peer certificate of each live connection admitted
	}
}

// revokedSet is a parsed CRL: the serials it lists, for certificates of
// its issuer.
type revokedSet struct {
	number  *big.Int // nil for none (no file)
	issuer  []byte   // the CRL's raw issuer name; a certificate of another issuer is not on it
	serials map[string]struct{}
}

func (s *revokedSet) revoked(cert *x509.Certificate) bool {
	if s == nil || len(s.serials) == 0 || cert.SerialNumber == nil || string(cert.RawIssuer) != string(s.issuer) {
		return false
	}
	_, ok := s.serials[string(cert.SerialNumber.Bytes())]
	return ok
}

type fileStamp struct {
	mod  time.Time
	size int64
	err  string // the last error looking at the file, to log it once
}

// WatchCRL loads the CRL in crlFile, checks that a CA certificate in
// caFile (PEM, as ca.crt) signed it, and returns the revocations it
// lists, re-read whenever the file changes until Close. A missing
// crlFile revokes nothing until it appears. A CRL the CA did not sign,
// or one that cannot be parsed, is an error naming the file.
func WatchCRL(crlFile, caFile string, cfg RevocationsConfig) (*Revocations, error) {
	cas, err := ReadCertificates(caFile)
	if err != nil {
		return nil, err
	}
	if cfg.Interval <= 0 {
		cfg.Interval = defaultCRLInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &Revocations{file: crlFile, cas: cas, log: cfg.Logger.With("crl", crlFile), stop: make(chan struct{}), done: make(chan struct{})}
	r.mu.conns = map[*quic.Conn]*x509.Certificate{}
	r.mu.list = &revokedSet{}
	stamp, err := stampOf(crlFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		r.seen = fileStamp{err: err.Error()}
		r.log.Debug("no certificate revocation list: none revoked until the file appears")
	case err != nil:
		return nil, fmt.Errorf("transport: CRL %q: %w", crlFile, err)
	default:
		list, err := r.load(nil)
		if err != nil {
			return nil, err
		}
		r.mu.list, r.seen = list, stamp
	}
	go r.run(cfg.Interval)
	return r, nil
}

// ReadCertificates reads the PEM certificates in file (a CA's, a
// node's), in order; a file with none is an error.
func ReadCertificates(file string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("transport: reading certificates: %w", err)
	}
	var cas []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("transport: reading certificates of %q: %w", file, err)
		}
		cas = append(cas, c)
	}
	if len(cas) == 0 {
		return nil, fmt.Errorf("transport: reading certificates of %q: no PEM certificate in it", file)
	}
	return cas, nil
}

func stampOf(file string) (fileStamp, error) {
	fi, err := os.Stat(file)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{mod: fi.ModTime(), size: fi.Size()}, nil
}

// load reads the CRL file and checks it: signed by one of the CAs, and
// not older (a lower Number) than cur, the list in force.
func (r *Revocations) load(cur *revokedSet) (*revokedSet, error) {
	crl, err := readCRL(r.file)
	if err != nil {
		return nil, err
	}
	var sigErr error
	signed := false
	for _, ca := range r.cas {
		if sigErr = crl.CheckSignatureFrom(ca); sigErr == nil {
			signed = true
			break
		}
	}
	if !signed {
		return nil, fmt.Errorf("transport: CRL %q is not signed by the cluster CA (%s): %w", r.file, r.cas[0].Subject.CommonName, sigErr)
	}
	if cur != nil && cur.number != nil && string(crl.RawIssuer) == string(cur.issuer) {
		// Numbers order the lists of one CA; a list of another (ca.crt
		// holding two CAs during a rotation) starts its own count.
		if crl.Number == nil || crl.Number.Cmp(cur.number) < 0 {
			return nil, fmt.Errorf("transport: CRL %q has number %v, older than the one in force (%v): an older copy would undo revocations", r.file, crl.Number, cur.number)
		}
	}
	if !crl.NextUpdate.IsZero() && time.Now().After(crl.NextUpdate) {
		r.log.Warn("the certificate revocation list is past its next update; still enforcing it: renew it with felix certs revoke --renew", "next_update", crl.NextUpdate)
	}
	list := &revokedSet{number: crl.Number, issuer: crl.RawIssuer, serials: make(map[string]struct{}, len(crl.RevokedCertificateEntries))}
	for _, e := range crl.RevokedCertificateEntries {
		if e.SerialNumber != nil {
			list.serials[string(e.SerialNumber.Bytes())] = struct{}{}
		}
	}
	r.log.Info("certificate revocation list loaded", "number", crl.Number, "revoked", len(list.serials))
	return list, nil
}

func (r *Revocations) run(interval time.Duration) {
	defer close(r.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			r.poll()
		}
	}
}

// poll reloads the CRL if its file changed, and closes the connections
// it newly revokes.
func (r *Revocations) poll() {
	stamp, err := stampOf(r.file)
	if err != nil {
		if msg := err.Error(); msg != r.seen.err {
			r.seen = fileStamp{err: msg}
			if r.current().number != nil {
				r.log.Warn("certificate revocation list unreadable; keeping the one in force", "err", err)
			}
		}
		return
	}
	if stamp == r.seen {
		return
	}
	r.seen = stamp
	list, err := r.load(r.current())
	if err != nil {
		r.log.Error("new certificate revocation list refused; keeping the one in force", "err", err)
		return
	}
	r.mu.Lock()
	r.mu.list = list
	revoked := map[*quic.Conn]*x509.Certificate{}
	for c, cert := range r.mu.conns {
		if list.revoked(cert) {
			revoked[c] = cert
		}
	}
	r.mu.Unlock()
	var wg sync.WaitGroup
	for c, cert := range revoked {
		wg.Go(func() { refuse(c, r.errRevoked(cert)) })
	}
	wg.Wait()
	if len(revoked) > 0 {
		r.log.Warn("closed connections of revoked certificates", "connections", len(revoked))
	}
}

func (r *Revocations) current() *revokedSet {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mu.list
}

// Check returns a [CodeUnauthorized] error wrapping [ErrRevoked] when
// cert (a peer's, verified against the cluster CA) is on the list in
// force, nil otherwise.
func (r *Revocations) Check(cert *x509.Certificate) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.list.revoked(cert) {
		return r.errRevoked(cert)
	}
	return nil
}

// errRevoked says whose certificate was revoked: its role, name and
// serial (hex, as `felix certs revoke --serial` takes it).
func (r *Revocations) errRevoked(cert *x509.Certificate) *Error {
	who := fmt.Sprintf("%q", cert.Subject.CommonName)
	if id, err := CertIdentity(cert); err == nil {
		who = fmt.Sprintf("%s %q", id.Role, id.Name)
	}
	return Errorf(CodeUnauthorized, "%w: the certificate of %s (serial %s) is on the cluster's revocation list", ErrRevoked, who, cert.SerialNumber.Text(16))
}

// admit checks the certificate conn's peer presented against the list
// in force and, if it is not revoked, keeps conn until it closes, to
// close it should a later list revoke it. A connection with no verified
// peer certificate is admitted untracked: there is nothing to revoke
// (servers refuse such peers by their identity checks). It returns the
// refusal for a revoked certificate; the caller closes conn with it.
func (r *Revocations) admit(conn *quic.Conn) *Error {
	chains := conn.ConnectionState().TLS.VerifiedChains
	if len(chains) == 0 || len(chains[0]) == 0 {
		return nil
	}
	cert := chains[0][0]
	r.mu.Lock()
	if r.mu.list.revoked(cert) {
		r.mu.Unlock()
		err := r.errRevoked(cert)
		if r.refused.First(string(cert.SerialNumber.Bytes())) {
			r.log.Warn("refused a connection: its peer's certificate is revoked (logged once per certificate)", "remote", conn.RemoteAddr(), "err", err)
		}
		return err
	}
	r.mu.conns[conn] = cert
	r.mu.Unlock()
	context.AfterFunc(conn.Context(), func() {
		r.mu.Lock()
		delete(r.mu.conns, conn)
		r.mu.Unlock()
	})
	return nil
}

// refuse closes conn, whose peer certificate is revoked, with err.
func refuse(conn *quic.Conn, err *Error) {
	conn.CloseWithError(quic.ApplicationErrorCode(CodeUnauthorized), err.Message)
}

// Close stops watching the file. Connections stay as they are. It may
// be called more than once, and on a nil *Revocations.
func (r *Revocations) Close() error {
	if r == nil {
		return nil
	}
	r.once.Do(func() { close(r.stop) })
	<-r.done
	return nil
}
