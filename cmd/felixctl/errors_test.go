package main

import (
	"strings"
	"testing"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/transport"
)

// TestExplainRefusedConnection: a broker that refused the connection (it
// answered, with a wire code) is not called unreachable; a revoked
// certificate is named, with what to do.
func TestExplainRefusedConnection(t *testing.T) {
	revoked := &transport.Error{Code: transport.CodeUnauthorized,
		Message: `certificate revoked: the certificate of felix-client "alice" (serial 1f) is on the cluster's revocation list`}
	full := &transport.Error{Code: transport.CodeLimitExceeded, Message: "alice has 64 connections to broker-0 (MaxConnsPerPrincipal)"}
	for _, tc := range []struct {
		name string
		err  error
		want []string
	}{
		{"revoked, one broker", &noBrokerError{source: "--broker", errs: []*brokerError{{Addr: "127.0.0.1:7100", Err: &client.DialError{Addr: "127.0.0.1:7100", Err: revoked}}}},
			[]string{"the broker at 127.0.0.1:7100 refused the connection: certificate revoked", `felix-client "alice"`, "--cert"}},
		{"revoked, a broker by id", &brokerError{ID: "broker-1", Addr: "127.0.0.1:7101", Err: &client.DialError{Addr: "127.0.0.1:7101", Err: revoked}},
			[]string{"broker-1 (127.0.0.1:7101) refused the connection: certificate revoked"}},
		{"revoked, every broker", &noBrokerError{source: "felix-cluster.json", errs: []*brokerError{
			{ID: "broker-0", Addr: "127.0.0.1:7100", Err: &client.DialError{Addr: "127.0.0.1:7100", Err: revoked}},
			{ID: "broker-1", Addr: "127.0.0.1:7101", Err: &client.DialError{Addr: "127.0.0.1:7101", Err: revoked}}}},
			[]string{"broker-0 (127.0.0.1:7100) refused the connection: certificate revoked"}},
		{"over a limit", &client.DialError{Addr: "127.0.0.1:7100", Err: full},
			[]string{"refused the connection: alice has 64 connections"}},
	} {
		msg, code := explain(tc.err)
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: %q (exit %d); want it to say %q", tc.name, msg, code, w)
			}
		}
		if code != exitFailure || strings.Contains(msg, "not reachable") {
			t.Errorf("%s: %q (exit %d); want a refusal, exit %d", tc.name, msg, code, exitFailure)
		}
	}
}
