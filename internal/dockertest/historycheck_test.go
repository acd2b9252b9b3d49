package dockertest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/felix-broker/felix/ctl"
)

// TestHistoryCheck shows that the partition test's checks of etcd's
// history and of the brokers' maps fail when they should: it writes, to
// an etcd member in this process, the histories a broken control plane
// would leave, and needs no Docker.
func TestHistoryCheck(t *testing.T) {
	m, err := ctl.StartEtcdMember(t.TempDir(), ctl.EtcdConfig{Name: "etcd-0"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	elect := func(name string) (string, clientv3.LeaseID) {
		l, err := cli.Grant(ctx, 60)
		if err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprintf("%selection/%x", statePrefix, l.ID)
		if _, err := cli.Put(ctx, key, name, clientv3.WithLease(l.ID)); err != nil {
			t.Fatal(err)
		}
		return key, l.ID
	}
	commit := func(epoch int, w *writer, stream string) {
		ops := []clientv3.Op{clientv3.OpPut(statePrefix+"epoch", fmt.Sprint(epoch)),
			clientv3.OpPut(statePrefix+"streams/"+stream, fmt.Sprintf(`{"name":%q,"shards":1,"owners":["b0"]}`, stream))}
		if w != nil {
			b, _ := json.Marshal(w)
			ops = append(ops, clientv3.OpPut(statePrefix+"writer", string(b)))
		}
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	ea, la := elect("a")
	commit(1, &writer{Name: "a", Election: ea}, "s1") // fine
	eb, _ := elect("b")
	commit(2, &writer{Name: "b", Election: eb}, "s2") // b is second in line
	if _, err := cli.Revoke(ctx, la); err != nil {    // a's session ends
		t.Fatal(err)
	}
	commit(3, &writer{Name: "a", Election: ea}, "s3") // a after its session
	commit(4, &writer{Name: "b", Election: eb}, "s4") // fine: b leads now
	commit(4, &writer{Name: "b", Election: eb}, "s5") // a second map at epoch 4
	commit(6, nil, "s6")                              // no writer

	h, err := readHistory(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"epoch 2 written by b, not the first in line",
		"epoch 3 written by a (" + ea + ") after its election session ended",
		"epoch 4 written after epoch 4",
		"epoch 6 written with no writer record",
	}
	if len(h.errs) != len(want) {
		t.Fatalf("history errors:\n%s\nwant %d", strings.Join(h.errs, "\n"), len(want))
	}
	for i, w := range want {
		if !strings.Contains(h.errs[i], w) {
			t.Errorf("history error %d: %q, want it to say %q", i, h.errs[i], w)
		}
	}
	if len(h.maps) != 6 || h.byEpoch[4].view != `stream s1 1 0 0s b0; stream s2 1 0 0s b0; stream s3 1 0 0s b0; stream s4 1 0 0s b0` {
		t.Errorf("history: %d maps (want 6), epoch 4 is %q", len(h.maps), h.byEpoch[4].view)
	}

	// The brokers' maps: one as committed, one at an epoch never
	// committed, one other than committed, and one going back.
	w := &mapWatch{seen: map[string][]sample{
		"b0": {{epoch: 1, view: h.byEpoch[1].view}, {epoch: 5, view: h.byEpoch[4].view}},
		"b1": {{epoch: 4, view: "stream s1 1 0 0s b0"}, {epoch: 2, view: h.byEpoch[2].view}},
	}}
	_, errs := w.check(h)
	want = []string{"b0 held a map at epoch 5, which etcd never committed", "b1 held a map at epoch 4 other than the one committed", "b1 went back from epoch 4 to 2"}
	joined := strings.Join(errs, "\n")
	for _, w := range want {
		if !strings.Contains(joined, w) {
			t.Errorf("map check errors:\n%s\nwant one saying %q", joined, w)
		}
	}
	if len(errs) != len(want) {
		t.Errorf("map check: %d errors, want %d:\n%s", len(errs), len(want), joined)
	}
}
