package ctlclient

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// TestMemberCluster: a member takes the cluster of the first map naming
// one (handing it to OnCluster first, once), takes maps of that cluster
// and maps naming none (a control plane older than cluster IDs), and
// refuses a map of another cluster, as a control plane that does not
// check a registration's cluster would send it.
func TestMemberCluster(t *testing.T) {
	var kept []string
	m := &Member{cfg: MemberConfig{Node: transport.Register{NodeID: "n1"}, OnCluster: func(id string) error {
		kept = append(kept, id)
		return nil
	}}, log: slog.New(slog.DiscardHandler)}
	m.mu.changed = make(chan struct{})
	adopt := func(epoch uint64, cluster string) error {
		t.Helper()
		_, err := m.adopt(&shardmap.Map{Epoch: epoch, Cluster: cluster})
		return err
	}
	if err := adopt(1, ""); err != nil {
		t.Fatalf("a map naming no cluster: %v", err)
	}
	if err := adopt(2, "C1"); err != nil || len(kept) != 1 || kept[0] != "C1" {
		t.Fatalf("the first map naming a cluster: %v; kept %q", err, kept)
	}
	if err := adopt(3, "C2"); !errors.Is(err, ErrOtherCluster) || !errors.Is(err, transport.ErrInvalid) {
		t.Fatalf("a map of another cluster: %v, want ErrOtherCluster", err)
	}
	if got := m.Map().Epoch; got != 2 {
		t.Fatalf("holding epoch %d after the refusal, want 2", got)
	}
	if err := adopt(4, "C1"); err != nil || len(kept) != 1 || m.Map().Epoch != 4 {
		t.Fatalf("a map of its cluster: %v, kept %q, epoch %d", err, kept, m.Map().Epoch)
	}

	if err := adopt(5, "C1 x"); !errors.Is(err, transport.ErrMalformed) {
		t.Fatalf("a map naming a cluster ID with a space: %v, want malformed", err)
	}

	// OnCluster failing refuses the map.
	m2 := &Member{cfg: MemberConfig{OnCluster: func(string) error { return errors.New("disk full") }}, log: slog.New(slog.DiscardHandler)}
	m2.mu.changed = make(chan struct{})
	if _, err := m2.adopt(&shardmap.Map{Epoch: 1, Cluster: "C1"}); err == nil || m2.Map() != nil {
		t.Fatalf("a map whose cluster could not be kept: %v, map %v", err, m2.Map())
	}
}
