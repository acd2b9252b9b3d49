package cluster

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/felix-broker/felix/shardmap"
)

// WriteOwnership prints the nodes of m with their liveness and the owner of
// every shard, the way `felix dev`, `felixctl cluster status` and the demo
// show it.
func WriteOwnership(w io.Writer, m *shardmap.Map) {
	fmt.Fprintf(w, "shard map epoch %d\n", m.Epoch)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADDRESS\tSTATE\tOWNS")
	for _, n := range m.Nodes {
		state := "live"
		if !n.Live {
			state = "down"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", n.ID, n.Addr, state, shardCount(len(m.OwnedBy(n.ID))))
	}
	tw.Flush()
	if len(m.Streams) == 0 {
		fmt.Fprintln(w, "no streams yet")
		return
	}
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tSHARD\tOWNER")
	for _, s := range m.Streams {
		for shard, owner := range s.Placement.All() {
			fmt.Fprintf(tw, "%s\t%d\t%s\n", s.Name, shard, owner)
		}
	}
	tw.Flush()
}

// shardCount says how many shards a node owns, in words, so that the
// count does not read as a shard number beside the STREAM SHARD OWNER
// table: "1 shard", "3 shards", "no shards".
func shardCount(n int) string {
	switch n {
	case 0:
		return "no shards"
	case 1:
		return "1 shard"
	}
	return fmt.Sprintf("%d shards", n)
}

// Ownership returns WriteOwnership's text.
func Ownership(m *shardmap.Map) string {
	var b strings.Builder
	WriteOwnership(&b, m)
	return b.String()
}
