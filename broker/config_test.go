package broker

import (
	"strings"
	"testing"
)

// TestCtlAddrList: CtlAddr lists the control plane's members separated by
// commas, as `--ctl` takes them from a person: spaces around an address
// and empty entries are dropped, and a broker so configured joins; a list
// naming no address is refused.
func TestCtlAddrList(t *testing.T) {
	ip := startInprocWith(t, func(c *Config) { c.CtlAddr = " " + c.CtlAddr + " , ,," }, 1)
	if n, ok := ip.brokers[0].Map().Node(ip.brokers[0].NodeID()); !ok || !n.Live {
		t.Fatalf("broker joined with --ctl %q: %+v in its map", ip.brokerConfig(0).CtlAddr, n)
	}
	for _, addr := range []string{"", " ", " , ,"} {
		cfg := ip.brokerConfig(0)
		cfg.CtlAddr = addr
		if _, err := cfg.withDefaults(); err == nil || !strings.Contains(err.Error(), "CtlAddr is required") {
			t.Errorf("CtlAddr %q: %v, want it refused as naming no address", addr, err)
		}
	}
}
