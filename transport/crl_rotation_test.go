package transport

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCRLOfTheOtherCAInABundle: ca.crt trusts two CAs (a rotation). A
// certificate of the old CA is revoked; then one of the new CA, with its
// own list (number 1), copied over crl.pem: the running node enforces
// it (numbers order one CA's lists only; before, it was refused as
// older). A file holding two lists is refused. (While the new CA's list
// is in force, the old CA's certificates are checked against none:
// documented on Revocations.)
func TestCRLOfTheOtherCAInABundle(t *testing.T) {
	dir := t.TempDir()
	oldCA, err := NewCA("felix cluster CA")
	if err != nil {
		t.Fatal(err)
	}
	newCA, err := NewCA("felix cluster CA 2")
	if err != nil {
		t.Fatal(err)
	}
	oldLeaf, err := oldCA.Issue(RoleClient, "mallory")
	if err != nil {
		t.Fatal(err)
	}
	newLeaf, err := newCA.Issue(RoleClient, "eve")
	if err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(dir, "ca.crt")
	if err := oldCA.WriteCert(bundle); err != nil {
		t.Fatal(err)
	}
	b1, _ := os.ReadFile(bundle)
	if err := newCA.WriteCert(bundle); err != nil {
		t.Fatal(err)
	}
	b2, _ := os.ReadFile(bundle)
	if err := os.WriteFile(bundle, append(b1, b2...), 0o644); err != nil {
		t.Fatal(err)
	}
	oldDir, newDir := t.TempDir(), t.TempDir()
	// The old CA's list, revoked twice (number 2).
	if _, _, err := oldCA.Revoke(filepath.Join(oldDir, CRLFile), oldLeaf.Leaf.SerialNumber); err != nil {
		t.Fatal(err)
	}
	if _, _, err := oldCA.Revoke(filepath.Join(oldDir, CRLFile)); err != nil {
		t.Fatal(err)
	}
	crl := filepath.Join(dir, CRLFile)
	copyFile := func(from string) {
		data, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(crl, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(filepath.Join(oldDir, CRLFile))
	rev, err := WatchCRL(crl, bundle, RevocationsConfig{Interval: time.Hour, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer rev.Close()
	if rev.Check(oldLeaf.Leaf) == nil {
		t.Fatal("old CA's revoked certificate not revoked")
	}
	// The new CA revokes eve: its own list.
	if _, _, err := newCA.Revoke(filepath.Join(newDir, CRLFile), newLeaf.Leaf.SerialNumber); err != nil {
		t.Fatal(err)
	}
	copyFile(filepath.Join(newDir, CRLFile))
	rev.poll()
	if rev.Check(newLeaf.Leaf) == nil {
		t.Error("running node: the new CA's revocation of eve is not enforced (its list was refused as older)")
	}
	// Two lists in one file (a new one appended): refused, not half read.
	data, err := os.ReadFile(filepath.Join(oldDir, CRLFile))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(crl, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(data)
	f.Close()
	if _, err := WatchCRL(crl, bundle, RevocationsConfig{Interval: time.Hour, Logger: quietLogger()}); err == nil || !strings.Contains(err.Error(), "more than one") {
		t.Errorf("a file of two lists: %v; want refused", err)
	}
}
