package ctlclient

import (
	"context"
	"crypto/tls"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/felix-broker/felix/transport"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestJoinNeedsConfig: a config Join cannot work with fails at once,
// saying which field is missing, and starts nothing. (Joining a real
// control plane is tested in package ctl, beside the server.)
func TestJoinNeedsConfig(t *testing.T) {
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS13}
	node := transport.Register{NodeID: "b0", Addr: "127.0.0.1:7400"}
	for _, tc := range []struct {
		cfg  MemberConfig
		want string
	}{
		{MemberConfig{TLS: tlsConf, Node: node}, "CtlAddrs is required"},
		{MemberConfig{CtlAddr: "127.0.0.1:1", Node: node}, "TLS is required"},
		{MemberConfig{CtlAddr: "127.0.0.1:1", TLS: tlsConf, Node: transport.Register{NodeID: "b0"}}, "needs NodeID and Addr"},
	} {
		m, err := Join(context.Background(), tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			if m != nil {
				m.Close()
			}
			t.Errorf("Join(%+v) = %v, want an error saying %q", tc.cfg, err, tc.want)
		}
	}
}

// TestMemberFeatures: a member registers with the features of this build
// unless its config names others (replica reports only with a Report to
// make them); an empty list names none.
func TestMemberFeatures(t *testing.T) {
	node := transport.Register{NodeID: "b0", Addr: "127.0.0.1:7400"}
	report := func() *transport.ReplicaReport { return &transport.ReplicaReport{} }
	if got := (MemberConfig{Node: node, Report: report}).withDefaults().Node.Features; !slices.Equal(got, transport.Features()) ||
		!slices.Contains(got, transport.FeatureReplicaMoves) {
		t.Errorf("features registered by default: %q, want this build's %q", got, transport.Features())
	}
	if got := (MemberConfig{Node: node}).withDefaults().Node.Features; slices.Contains(got, transport.FeatureReplicaReports) ||
		!slices.Contains(got, transport.FeatureReplicaMoves) {
		t.Errorf("features registered by default without a Report: %q, want this build's but %q", got, transport.FeatureReplicaReports)
	}
	node.Features = []string{}
	if got := (MemberConfig{Node: node}).withDefaults().Node.Features; got == nil || len(got) != 0 {
		t.Errorf("features registered when the config names none: %q, want none", got)
	}
}
