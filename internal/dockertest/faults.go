package dockertest

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// nodes returns every node of the cluster: etcd members, ctls, brokers.
func (c *Cluster) nodes() []*Node {
	return append(append(append([]*Node{}, c.Etcds...), c.Ctls...), c.Brokers...)
}

// Disconnect cuts n off the cluster's network (docker network
// disconnect): it keeps running, reaching no one and reached by no one,
// until Connect.
func (c *Cluster) Disconnect(ctx context.Context, n *Node) error {
	_, err := docker(ctx, "network", "disconnect", c.network, n.Container)
	return err
}

// IsolatePeers cuts n off from every other node of the cluster (the other
// brokers, the control plane, etcd) while the host, where the tests'
// clients run, still reaches it both ways: a partition between brokers,
// not between a broker and its clients. A leader so cut off still takes
// publishes, and must never ack one (Disconnect, which cuts the clients
// off too, cannot show that). The rules are iptables rules in n's
// network namespace, entered from the host (the images hold no tools);
// HealPeers removes them, and so does a restart of n's container.
func (c *Cluster) IsolatePeers(ctx context.Context, n *Node) error {
	var rules [][]string
	for _, m := range c.nodes() {
		if m != n {
			rules = append(rules, []string{"-A", "INPUT", "-s", m.IP, "-j", "DROP"}, []string{"-A", "OUTPUT", "-d", m.IP, "-j", "DROP"})
		}
	}
	return c.inNetns(ctx, n, rules...)
}

// HealPeers undoes IsolatePeers.
func (c *Cluster) HealPeers(ctx context.Context, n *Node) error {
	return c.inNetns(ctx, n, []string{"-F", "INPUT"}, []string{"-F", "OUTPUT"})
}

// inNetns runs iptables with each of rules in n's network namespace.
func (c *Cluster) inNetns(ctx context.Context, n *Node, rules ...[]string) error {
	pid, err := docker(ctx, "inspect", "--format", "{{.State.Pid}}", n.Container)
	if err != nil {
		return err
	}
	if pid == "" || pid == "0" {
		return fmt.Errorf("%s is not running", n.Name)
	}
	for _, rule := range rules {
		args := append([]string{"--net=/proc/" + pid + "/ns/net", "iptables", "-w"}, rule...)
		if out, err := exec.CommandContext(ctx, "nsenter", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("nsenter %s: %w: %s (the tests need nsenter and iptables on the host, as root)", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// Connect puts n back on the cluster's network at its address.
func (c *Cluster) Connect(ctx context.Context, n *Node) error {
	_, err := docker(ctx, "network", "connect", "--ip", n.IP, c.network, n.Container)
	return err
}

// Stop stops the containers of nodes (docker stop: SIGTERM, then SIGKILL
// after 10s), all at once; their containers stay, with their data, for
// StartAgain.
func (c *Cluster) Stop(ctx context.Context, nodes ...*Node) error {
	_, err := docker(ctx, append([]string{"stop"}, containers(nodes)...)...)
	return err
}

// StartAgain starts the stopped or killed containers of nodes, all at
// once: the same process arguments, addresses and data.
func (c *Cluster) StartAgain(ctx context.Context, nodes ...*Node) error {
	if len(nodes) == 0 {
		return nil
	}
	_, err := docker(ctx, append([]string{"start"}, containers(nodes)...)...)
	return err
}

func containers(nodes []*Node) []string {
	out := make([]string, len(nodes))
	for i, n := range nodes {
		out[i] = n.Container
	}
	return out
}

// RestartControlPlane stops every ctl and etcd member (docker stop) and
// starts them again: the external etcd members first, once they answer
// the ctls (which exit when no etcd quorum answers them at start). It
// fails if one did not exit cleanly on SIGTERM.
func (c *Cluster) RestartControlPlane(ctx context.Context) error {
	if err := c.Stop(ctx, append(append([]*Node{}, c.Ctls...), c.Etcds...)...); err != nil {
		return err
	}
	for _, n := range append(append([]*Node{}, c.Ctls...), c.Etcds...) {
		code, err := c.ExitCode(ctx, n)
		if err != nil {
			return err
		}
		if code != "0" {
			return fmt.Errorf("%s exited with code %s on docker stop (137: killed after docker's grace, its shutdown hung); where it hung:\n%s",
				n.Name, code, hungAt(c.Logs(n, 20000)))
		}
	}
	if err := c.StartAgain(ctx, c.Etcds...); err != nil {
		return err
	}
	if err := c.waitEtcd(ctx); err != nil {
		return fmt.Errorf("after restarting the etcd members: %w", err)
	}
	return c.StartAgain(ctx, c.Ctls...)
}

// ExitCode returns the exit code of n's stopped container (137: killed
// by SIGKILL, as docker stop does after its grace period).
func (c *Cluster) ExitCode(ctx context.Context, n *Node) (string, error) {
	return docker(ctx, "inspect", "--format", "{{.State.ExitCode}}", n.Container)
}

// Pause freezes every process of n's container (docker pause: the cgroup
// freezer, as SIGSTOP): it holds its connections and answers nothing
// until Unpause.
func (c *Cluster) Pause(ctx context.Context, n *Node) error {
	_, err := docker(ctx, "pause", n.Container)
	return err
}

// Unpause lets n's processes run again after Pause.
func (c *Cluster) Unpause(ctx context.Context, n *Node) error {
	_, err := docker(ctx, "unpause", n.Container)
	return err
}

// Replace removes n's container, and its data with it (a machine lost),
// and runs a new one of the same name, arguments and address: the same
// node, with an empty data directory.
func (c *Cluster) Replace(ctx context.Context, n *Node) error {
	if _, err := docker(ctx, "rm", "--force", "--volumes", n.Container); err != nil {
		return err
	}
	_, err := docker(ctx, n.args...)
	return err
}

// Running reports whether n's container is running, and if not, its exit
// code.
func (c *Cluster) Running(ctx context.Context, n *Node) (bool, string, error) {
	out, err := docker(ctx, "inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", n.Container)
	if err != nil {
		return false, "", err
	}
	running, code, _ := strings.Cut(out, " ")
	return running == "true", code, nil
}

// Broker returns the broker node named name, or nil.
func (c *Cluster) Broker(name string) *Node {
	for _, n := range c.Brokers {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// hungAt condenses the goroutine stacks a server writes when its shutdown
// is slow (servercmd.shutdownWatch) to the goroutines in Felix's code, one
// line per call: the dump itself runs to thousands of lines, most of them
// etcd's and quic-go's idle loops, and a test log cut short would lose the
// lines that matter.
func hungAt(logs string) string {
	_, dump, ok := strings.Cut(logs, "shutdown is slow")
	if ok {
		_, dump, ok = strings.Cut(dump, "\ngoroutine ")
		dump = "goroutine " + dump
	}
	if !ok {
		return "(no goroutine stacks in its log: it hung before its shutdown began, or wrote them nowhere)"
	}
	var out strings.Builder
	for g := range strings.SplitSeq(dump, "\n\n") {
		if !strings.Contains(g, "felix-broker/felix/") {
			continue
		}
		for line := range strings.SplitSeq(g, "\n") {
			if line != "" && !strings.HasPrefix(line, "\t") {
				out.WriteString(line + "\n")
			}
		}
		out.WriteString("\n")
	}
	return out.String()
}
