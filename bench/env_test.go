package bench

import (
	"testing"

	"github.com/felix-broker/felix/shardmap"
)

func TestBalancedName(t *testing.T) {
	members := []string{"broker-0", "broker-1", "broker-2"}
	for _, shards := range []int{3, 6, 12, 96} {
		base := "felix-bench-0a1b2c3d-throughput"
		name := balancedName(base, shards, members)
		if name != balancedName(base, shards, members) {
			t.Fatalf("%d shards: balancedName is not deterministic", shards)
		}
		got := placementSpread(shardmap.Assign(name, shards, members), members)
		if shards <= 12 && got > 1 {
			t.Errorf("%d shards: %s spreads them %d apart, want at most 1", shards, name, got)
		}
		if plain := placementSpread(shardmap.Assign(base, shards, members), members); got > plain {
			t.Errorf("%d shards: %s spreads them %d apart, worse than the base name's %d", shards, name, got, plain)
		}
	}
	if got := balancedName("s", 1, members); got != "s" {
		t.Errorf("one shard: got %q, want the base name", got)
	}
	if got := balancedName("s", 6, members[:1]); got != "s" {
		t.Errorf("one broker: got %q, want the base name", got)
	}
}

func TestPlacementSpread(t *testing.T) {
	members := []string{"a", "b", "c"}
	for _, tc := range []struct {
		owners []string
		want   int
	}{
		{[]string{"a", "b", "c", "a", "b", "c"}, 0},
		{[]string{"a", "a", "a", "b", "b", "b"}, 3}, // c owns none
		{[]string{"a", "a", "b", "c"}, 1},
	} {
		if got := placementSpread(shardmap.NewPlacement(tc.owners...), members); got != tc.want {
			t.Errorf("%v: spread %d, want %d", tc.owners, got, tc.want)
		}
	}
}
