package ctlclient

import (
	"context"
	"crypto/tls"
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
