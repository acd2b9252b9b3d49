package replica

import (
	"errors"
	"os"
	"testing"
	"time"
)

// TestLostLogStopsTheReplicaNotTheProcess: a replica whose directory was
// deleted comes back empty, and the leader's heartbeat carries a commit
// index beyond its log, which raft refuses with a panic: the replica must
// fail (ErrFailed) instead of crashing the process, and the other two go
// on committing.
func TestLostLogStopsTheReplicaNotTheProcess(t *testing.T) {
	c := newCluster(t, 3, 1, nil)
	leader := c.waitLeader()
	for i := range 5 {
		c.commit([]byte{byte(i)})
	}
	var lost uint64
	for _, id := range c.ids {
		if id != leader.ID() {
			lost = id
			break
		}
	}
	c.waitConverged(5)
	c.kill(lost)
	if err := os.RemoveAll(c.dirs[lost]); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(c.dirs[lost], 0o750); err != nil {
		t.Fatal(err)
	}
	g := c.start(lost)
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := <-appendTo(g, []byte("x"))
		if errors.Is(r.err, ErrFailed) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica with a lost log answers %v, want ErrFailed", r.err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.commit([]byte("after")) // the other two still make a majority
}
