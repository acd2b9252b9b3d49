package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/felix-broker/felix/transport"
)

// writeCtlStatus renders the control plane's members of a cluster.status
// response (transport.Response.Ctl): each ctl, its role and the health of
// its etcd member. It writes nothing for a ctl too old to report them.
func writeCtlStatus(w io.Writer, members []transport.CtlMember) error {
	if len(members) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CTL\tADDR\tROLE\tETCD\tETCD HEALTH")
	for _, m := range members {
		health := "healthy"
		switch {
		case !m.EtcdHealthy && m.EtcdError != "":
			health = "unhealthy: " + m.EtcdError
		case !m.EtcdHealthy:
			health = "unknown"
		case m.EtcdLeader:
			health = "healthy (raft leader)"
		}
		etcd := m.Etcd
		if etcd == "" {
			etcd = "external"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.Name, m.Addr, m.Role, etcd, health)
	}
	return tw.Flush()
}

// ctlDown counts the control plane's members that no live ctl runs.
func ctlDown(members []transport.CtlMember) int {
	n := 0
	for _, m := range members {
		if m.Role == "down" {
			n++
		}
	}
	return n
}
