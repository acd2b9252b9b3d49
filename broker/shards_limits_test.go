package broker

import (
	"crypto/tls"
	"strings"
	"testing"
	"time"
)

// TestLogMemoryBudget: LogMemory caps the open logs at what fits in it,
// at logMemory each (5/4 of the segment, twice the tail), never below
// 16, and never above MaxOpenShards.
func TestLogMemoryBudget(t *testing.T) {
	const mib = 1 << 20
	if got, want := logMemory(0, 0), int64(mib*5/4+2*mib); got != want {
		t.Fatalf("logMemory at the defaults = %d, want %d", got, want)
	}
	if got, want := logMemory(128<<10, 64<<10), int64(160<<10+128<<10); got != want {
		t.Fatalf("logMemory(128 KiB, 64 KiB) = %d, want %d", got, want)
	}
	for _, tc := range []struct {
		name             string
		cfg              Config
		maxOpen          int
		memory, perShard int64
	}{
		{"defaults", Config{}, min(defaultMaxOpenShards(), 315), DefaultLogMemory, logMemory(0, 0)},
		{"small budget", Config{LogMemory: 64 * mib}, 19, 64 * mib, logMemory(0, 0)},
		{"floor", Config{LogMemory: mib}, 16, mib, logMemory(0, 0)},
		{"small logs", Config{LogMemory: 64 * mib, SegmentSize: 128 << 10, TailBytes: 64 << 10}, min(defaultMaxOpenShards(), 227), 64 * mib, logMemory(128<<10, 64<<10)},
		{"MaxOpenShards lower", Config{MaxOpenShards: 4}, 4, DefaultLogMemory, logMemory(0, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.NodeID, cfg.DataDir, cfg.CtlAddr = "n", t.TempDir(), "127.0.0.1:1"
			cfg.ServerTLS, cfg.PeerTLS, cfg.CtlTLS = &tls.Config{}, &tls.Config{}, &tls.Config{}
			got, err := cfg.withDefaults()
			if err != nil {
				t.Fatal(err)
			}
			if got.MaxOpenShards != tc.maxOpen || got.LogMemory != tc.memory {
				t.Fatalf("MaxOpenShards %d, LogMemory %d; want %d, %d", got.MaxOpenShards, got.LogMemory, tc.maxOpen, tc.memory)
			}
			if tc.maxOpen > minOpenShards && int64(got.MaxOpenShards)*tc.perShard > got.LogMemory {
				t.Fatalf("%d open logs of %d bytes pass LogMemory %d", got.MaxOpenShards, tc.perShard, got.LogMemory)
			}
		})
	}
}

// TestConfigRefusesWhatBreaksTheBroker: a lease too short to heartbeat
// (LeaseTTL/3 of 0 panicked the broker's ticker once it registered), a
// negative record limit (every publish refused), one over the ceiling
// (its raft entries larger than its peers take) and a raft tick under a
// millisecond (every group ticking without pause) are refused by New.
func TestConfigRefusesWhatBreaksTheBroker(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		says string
	}{
		{"lease of 2ns", Config{LeaseTTL: 2}, "LeaseTTL 2ns is under 30ms"},
		{"negative lease", Config{LeaseTTL: -time.Second}, "LeaseTTL -1s is under 30ms"},
		{"negative record limit", Config{MaxPayload: -5}, "MaxPayload -5 is negative"},
		{"record limit over the ceiling", Config{MaxPayload: MaxPayloadCeiling + 1}, "MaxPayload 33554433 is over MaxPayloadCeiling"},
		{"raft tick of 1ns", Config{RaftTick: 1}, "RaftTick 1ns is under 1ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.NodeID, cfg.DataDir, cfg.CtlAddr = "n", t.TempDir(), "127.0.0.1:1"
			cfg.ServerTLS, cfg.PeerTLS, cfg.CtlTLS = &tls.Config{}, &tls.Config{}, &tls.Config{}
			if b, err := New(cfg); err == nil || !strings.Contains(err.Error(), tc.says) {
				if b != nil {
					b.Close()
				}
				t.Fatalf("New: %v, want an error saying %q", err, tc.says)
			}
		})
	}
}
