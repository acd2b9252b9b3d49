// Package ctlclient is the client side of Felix's control plane (package
// ctl): [Member], with which a broker joins the cluster, keeps its
// registration alive and follows the shard map ctl pushes, and
// [AdminClient], with which a holder of a node or ctl certificate makes
// admin requests to a ctl directly, for a principal it names (ctl
// refuses client certificates; clients go through a broker).
//
// It owns the broker's end of the registration protocol described in
// package ctl: dialing a ctl (moving to the next of CtlAddrs when one
// fails), the long-lived registration stream, heartbeats every LeaseTTL/3
// (the lease the ctl says it holds, with the maps of the registration,
// or MemberConfig.LeaseTTL from a ctl that says none) (and, from a ctl that answers them, transport.FeatureHeartbeatAcks,
// dropping a registration on which ctl sent nothing, no answer and no
// bytes of a map, for half a lease, at least 500ms, for the next ctl (a
// map that takes longer to arrive is not nothing): a ctl whose
// registration handling is stuck while its QUIC stack answers keeps no
// broker; the first map of a registration is waited for as long at most;
// a registration so given up on is ended with codes saying it is handed
// over, so that ctl keeps the broker's lease for the next ctl to adopt
// rather than showing the broker down),
// reconnecting with capped jittered backoff, and adopting each map whose
// epoch is above the one held. The backoff grows after each round of
// ctls that failed and each registration that ended within a lease, and
// starts over only once one lasted a lease: a registration ctl ends as
// soon as it is made is not made again in a loop. One that ctl ends
// because another process registered as the same node
// ([transport.CodeReplaced]) is logged at error level and made again
// only after MaxBackoff. A member registers with the features of
// this build ([transport.Features]) unless MemberConfig.Node names
// others, so the control plane knows what each broker can take. It never imports the control plane server:
// a broker, a data-plane process, links only this client.
//
// # Usage
//
// A broker:
//
//	m, err := ctlclient.Join(ctx, ctlclient.MemberConfig{
//		CtlAddrs: []string{"ctl-0:7000", "ctl-1:7000", "ctl-2:7000"},
//		TLS:      transport.ClientTLS(ca, &nodeCert, "", transport.ALPNCtl),
//		Node:     transport.Register{NodeID: "broker-0", Addr: "10.0.0.5:7400"},
//	})
//	...
//	defer m.Close()
//	for {
//		changed := m.Changed()
//		apply(m.Map())
//		<-changed
//	}
//
// Admin requests, with a node certificate, for a principal:
//
//	c, err := ctlclient.Dial(ctx, "ctl-0:7000", transport.ClientTLS(ca, &nodeCert, "", transport.ALPNCtl), transport.Config{})
//	...
//	defer c.Close()
//	resp, err := c.Request(ctx, &transport.Request{Op: "stream.list", Principal: "alice"})
package ctlclient
