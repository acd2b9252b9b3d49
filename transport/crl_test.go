package transport

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

func devCA(t *testing.T, dir string) *CA {
	t.Helper()
	ca, err := LoadCAKeyPair(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// TestCARevoke: Revoke keeps earlier entries, numbers each new list one
// higher, signs it with the CA, adds nothing (and leaves the file) for a
// serial already listed, and refuses to extend a CRL of another CA.
func TestCARevoke(t *testing.T) {
	p := newPKI(t, "n1", "n2")
	ca := devCA(t, p.dir)
	file := filepath.Join(t.TempDir(), CRLFile)
	s1, s2 := p.nodes["n1"].Leaf.SerialNumber, p.nodes["n2"].Leaf.SerialNumber

	crl, added, err := ca.Revoke(file, s1)
	if err != nil || added != 1 || crl.Number.Int64() != 1 {
		t.Fatalf("first Revoke: added %d, number %v, err %v; want 1, 1, nil", added, crl.Number, err)
	}
	before, _ := os.ReadFile(file)
	if _, added, err := ca.Revoke(file, s1); err != nil || added != 0 {
		t.Fatalf("Revoke of a listed serial: added %d, err %v; want 0, nil", added, err)
	}
	if after, _ := os.ReadFile(file); !bytes.Equal(before, after) {
		t.Fatal("Revoke of a listed serial rewrote the file")
	}
	if _, added, err = ca.Revoke(file, s2, s1); err != nil || added != 1 {
		t.Fatalf("second Revoke: added %d, err %v; want 1, nil", added, err)
	}
	got, err := readCRL(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := got.CheckSignatureFrom(ca.Cert); err != nil {
		t.Fatalf("CRL signature: %v", err)
	}
	if got.Number.Int64() != 2 || len(got.RevokedCertificateEntries) != 2 ||
		got.RevokedCertificateEntries[0].SerialNumber.Cmp(s1) != 0 || got.RevokedCertificateEntries[1].SerialNumber.Cmp(s2) != 0 {
		t.Fatalf("CRL: number %v, entries %v; want 2 and [%v %v]", got.Number, got.RevokedCertificateEntries, s1, s2)
	}
	if d := got.NextUpdate.Sub(got.ThisUpdate); d != CRLValidity {
		t.Errorf("NextUpdate - ThisUpdate = %v, want %v", d, CRLValidity)
	}

	other, err := NewCA("other")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := other.Revoke(file, big.NewInt(7)); err == nil || !strings.Contains(err.Error(), file) {
		t.Fatalf("another CA's Revoke over this CRL: %v; want an error naming %s", err, file)
	}
}

// TestWatchCRLRefusesAnotherCAsList: a CRL that the cluster CA did not
// sign fails WatchCRL with an error naming the file; a missing file
// revokes nothing.
func TestWatchCRLRefusesAnotherCAsList(t *testing.T) {
	p := newPKI(t, "n1")
	other, err := NewCA("other")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(p.dir, CRLFile)
	rev, err := WatchCRL(file, filepath.Join(p.dir, "ca.crt"), RevocationsConfig{Logger: quietLogger()})
	if err != nil {
		t.Fatalf("WatchCRL with no CRL file: %v", err)
	}
	rev.Close()
	if _, _, err := other.Revoke(file, p.nodes["n1"].Leaf.SerialNumber); err != nil {
		t.Fatal(err)
	}
	rev, err = WatchCRL(file, filepath.Join(p.dir, "ca.crt"), RevocationsConfig{Logger: quietLogger()})
	if err == nil {
		rev.Close()
		t.Fatal("WatchCRL accepted a CRL signed by another CA")
	}
	if !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), "not signed by the cluster CA") {
		t.Fatalf("WatchCRL: %v; want an error naming %s and the CA", err, file)
	}
}

// closedWith waits for conn to close and returns the peer's reason.
func closedWith(t *testing.T, conn *quic.Conn) *Error {
	t.Helper()
	select {
	case <-conn.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("connection still open")
	}
	return ClosedWith(context.Cause(conn.Context()))
}

// TestRevokedPeerCertificate: over real QUIC connections, a listener
// enforcing a CRL refuses a revoked client certificate with
// unauthorized (naming role, name and serial), closes a connection that
// was up when a reload revoked its certificate, keeps the list in force
// when a bad or an older one replaces it, and a dial enforcing it
// refuses a revoked server certificate.
func TestRevokedPeerCertificate(t *testing.T) {
	p := newPKI(t, "n1", "n2", "n3")
	ca := devCA(t, p.dir)
	file := filepath.Join(p.dir, CRLFile)
	n2, n3 := p.nodes["n2"], p.nodes["n3"]
	if _, _, err := ca.Revoke(file, n3.Leaf.SerialNumber); err != nil {
		t.Fatal(err)
	}
	older, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	// The test polls itself: an hour is never.
	rev, err := WatchCRL(file, filepath.Join(p.dir, "ca.crt"), RevocationsConfig{Interval: time.Hour, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer rev.Close()
	addr, accepted := certServer(t, p, p.nodes["n1"], Config{Revocations: rev})

	// n2 is not revoked: its connection is accepted.
	live := dial(t, addr, ClientTLS(p.ca, &n2, "n1", ALPNPeer), Config{})
	srv := accept(t, accepted)
	if id, err := PeerNodeID(srv); err != nil || id != "n2" {
		t.Fatalf("accepted %q, %v; want n2", id, err)
	}

	// n3 is revoked: refused right after its handshake.
	refused := dial(t, addr, ClientTLS(p.ca, &n3, "n1", ALPNPeer), Config{})
	reason := closedWith(t, refused)
	if reason == nil || !errors.Is(reason, ErrUnauthorized) || !strings.Contains(reason.Message, `felix-node "n3"`) ||
		!strings.Contains(reason.Message, n3.Leaf.SerialNumber.Text(16)) {
		t.Fatalf("revoked n3's connection closed with %v; want unauthorized naming felix-node \"n3\" and its serial", reason)
	}

	// A reload that revokes n2 closes its live connection.
	if _, _, err := ca.Revoke(file, n2.Leaf.SerialNumber); err != nil {
		t.Fatal(err)
	}
	rev.poll()
	if reason := closedWith(t, live); reason == nil || !errors.Is(reason, ErrUnauthorized) || !strings.Contains(reason.Message, `"n2"`) {
		t.Fatalf("n2's live connection closed with %v; want unauthorized naming n2", reason)
	}

	// A bad list is refused and the one in force kept.
	if err := os.WriteFile(file, []byte("not a CRL"), 0o644); err != nil {
		t.Fatal(err)
	}
	rev.poll()
	if err := rev.Check(n2.Leaf); !errors.Is(err, ErrRevoked) || !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("after a bad CRL, Check(n2) = %v; want it still revoked", err)
	}

	// So is an older list (a lower number), which would undo n2's
	// revocation.
	if err := os.WriteFile(file, older, 0o644); err != nil {
		t.Fatal(err)
	}
	rev.poll()
	if err := rev.Check(n2.Leaf); !errors.Is(err, ErrRevoked) {
		t.Fatalf("after an older CRL, Check(n2) = %v; want it still revoked", err)
	}

	// The admin client certificate still gets in, and is the next one
	// accepted: n3's was never handed to the server.
	dial(t, addr, ClientTLS(p.ca, &p.client, "n1", ALPNPeer), Config{})
	if id, err := PeerIdentity(accept(t, accepted)); err != nil || id.Name != DevAdminName {
		t.Fatalf("next accepted: %v, %v; want the admin's", id, err)
	}

	// Dialing a server whose certificate is revoked fails, typed.
	addr3, _ := certServer(t, p, n3, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n1 := p.nodes["n1"]
	conn, err := Dial(ctx, addr3, ClientTLS(p.ca, &n1, "n3", ALPNPeer), Config{Revocations: rev})
	if err == nil {
		conn.CloseWithError(0, "")
		t.Fatal("Dial accepted a revoked server certificate")
	}
	if !errors.Is(err, ErrUnauthorized) || !errors.Is(err, ErrRevoked) {
		t.Fatalf("Dial of a revoked server: %v; want unauthorized, revoked", err)
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// BenchmarkRevocationsCheck is the cost a handshake pays for the
// revocation check against a list of 10,000 revoked certificates (not
// the peer's).
func BenchmarkRevocationsCheck(b *testing.B) {
	p := newPKI(b, "n1")
	ca, err := LoadCAKeyPair(filepath.Join(p.dir, "ca.crt"), filepath.Join(p.dir, "ca.key"))
	if err != nil {
		b.Fatal(err)
	}
	file := filepath.Join(p.dir, CRLFile)
	serials := make([]*big.Int, 10000)
	for i := range serials {
		serials[i] = big.NewInt(int64(i + 1))
	}
	if _, _, err := ca.Revoke(file, serials...); err != nil {
		b.Fatal(err)
	}
	rev, err := WatchCRL(file, filepath.Join(p.dir, "ca.crt"), RevocationsConfig{Interval: time.Hour, Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	defer rev.Close()
	leaf := p.nodes["n1"].Leaf
	b.ReportAllocs()
	for b.Loop() {
		if err := rev.Check(leaf); err != nil {
			b.Fatal(err)
		}
	}
}
