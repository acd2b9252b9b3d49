package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/felix-broker/felix/client"
	"github.com/felix-broker/felix/internal/cluster"
	"github.com/felix-broker/felix/internal/clustertest"
	"github.com/felix-broker/felix/internal/stats"
	"github.com/felix-broker/felix/shardmap"
)

// smallDisk mounts a new ext4 filesystem of size bytes (a loop device over
// a file in the test's temp dir) at dir, unmounted when the test ends. It
// skips the test where that cannot be done (not root, no loop device).
func smallDisk(t *testing.T, dir string, size int64) {
	t.Helper()
	img := filepath.Join(t.TempDir(), "disk.img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		t.Skipf("no small filesystem for the test: mkfs.ext4: %v: %s", err, out)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, dir).CombinedOutput(); err != nil {
		t.Skipf("no small filesystem for the test: mount -o loop: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
}

// TestDiskNearlyFullRefusesThenRecovers fills the real filesystem (ext4,
// 64 MiB) under one broker process through a forwarding broker: once less
// than --min-free-bytes is free, every publish to its shard is refused
// with limit_exceeded (nothing else), the shard on the other broker keeps
// taking records, and the nearly full broker's log never fails; once space
// is freed the same publisher is acked again without a restart, and after
// kill -9 and a restart the shard holds exactly the acked records, each at
// its offset.
func TestDiskNearlyFullRefusesThenRecovers(t *testing.T) {
	ctx := testCtx(t)
	const minFree = 16 << 20
	var dir string
	c := clustertest.Start(t, 2, func(o *cluster.Options) {
		dir = o.Dir
		smallDisk(t, filepath.Join(o.Dir, cluster.BrokerID(0)), 64<<20)
		o.BrokerEnv = append(o.BrokerEnv, "FELIX_MIN_FREE_BYTES="+strconv.Itoa(minFree))
	})
	full := c.Broker("broker-0")
	// Ballast the test frees later: the operator's cleanup.
	ballast := filepath.Join(full.DataDir, "ballast")
	if err := os.WriteFile(ballast, make([]byte, 12<<20), 0o644); err != nil {
		t.Fatal(err)
	}

	admin := clustertest.Connect(t, c, "broker-1")
	m := createStream(t, ctx, admin, shardmap.StreamConfig{Name: "fill", Shards: 8})
	st, _ := m.Stream("fill")
	onFull, onOther := -1, -1
	for s := range st.Shards {
		switch st.Placement.Owner(s) {
		case "broker-0":
			onFull = s
		case "broker-1":
			onOther = s
		}
	}
	if onFull < 0 || onOther < 0 {
		t.Fatalf("placement %v: want a shard on each broker", st.Placement)
	}
	pub, err := admin.Publisher(ctx, "fill")
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	acked := map[uint64][]byte{} // offset on shard onFull -> value
	value := func(i int) []byte {
		v := bytes.Repeat([]byte{byte(i)}, 16<<10)
		return append([]byte(fmt.Sprintf("record %d:", i)), v...)
	}
	// publish sends n records to shard onFull, 32 in flight, and returns
	// how many were refused; any other error fails the test.
	i := 0
	publish := func(n int) (refused int) {
		t.Helper()
		type sent struct {
			f *client.Future
			v []byte
		}
		var window []sent
		settle := func(s sent) {
			ack, err := s.f.Wait(ctx)
			switch {
			case err == nil:
				acked[ack.Offset] = s.v
			case errors.Is(err, client.ErrLimitExceeded):
				refused++
			default:
				t.Fatalf("publish to the nearly full broker: %v (want an ack or limit_exceeded)", err)
			}
		}
		for range n {
			v := value(i)
			i++
			f, err := pub.PublishAsync(ctx, nil, v, client.WithShard(onFull))
			if err != nil {
				t.Fatal(err)
			}
			window = append(window, sent{f, v})
			if len(window) == 32 {
				settle(window[0])
				window = window[1:]
			}
		}
		for _, s := range window {
			settle(s)
		}
		return refused
	}

	// Fill: about 35 MiB can go before the line (64 MiB less ext4's own,
	// the ballast and 16 MiB), 2,200 records of 16 KiB; the filesystem
	// could not hold 4,000.
	refusedAt := -1
	for batch := 0; batch < 40 && refusedAt < 0; batch++ {
		if publish(100) > 0 {
			refusedAt = len(acked)
		}
	}
	if refusedAt < 0 {
		t.Fatalf("%d records acked and none refused", len(acked))
	}
	t.Logf("refused from about record %d on (%d acked)", refusedAt, len(acked))
	if got := publish(50); got != 50 {
		t.Fatalf("%d of 50 publishes refused while the disk stays nearly full, want all", got)
	}
	if _, err := pub.Publish(ctx, nil, []byte("elsewhere"), client.WithShard(onOther)); err != nil {
		t.Fatalf("publish to broker-1's shard while broker-0's disk is nearly full: %v", err)
	}
	met, err := stats.Fetch(ctx, &http.Client{Timeout: 5 * time.Second}, c.AdminAddr("broker-0"))
	if err != nil {
		t.Fatal(err)
	}
	if hits, _ := met.Sum("felix_limit_hits_total", "limit", "min_free_bytes"); hits < 50 {
		t.Errorf("felix_limit_hits_total{limit=min_free_bytes} = %v, want at least the 50 refusals", hits)
	}
	if free, ok := met.Sum("felix_disk_free_bytes"); !ok || free <= 0 || free >= minFree {
		t.Errorf("felix_disk_free_bytes = %v (present: %v), want under %d", free, ok, minFree)
	}

	// Free space: the same publisher is acked again, with no restart.
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	before := len(acked)
	deadline := time.Now().Add(10 * time.Second)
	for len(acked) == before {
		if time.Now().After(deadline) {
			t.Fatal("no publish acked within 10s of freeing 12 MiB")
		}
		publish(1)
		time.Sleep(50 * time.Millisecond)
	}
	if got := publish(50); got != 0 {
		t.Fatalf("%d of 50 publishes refused after space was freed", got)
	}
	brokerLog, err := os.ReadFile(filepath.Join(dir, "broker-0.log"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(brokerLog, []byte("commit failed")) || bytes.Contains(brokerLog, []byte("no space left")) {
		t.Fatalf("broker-0's log met the full disk:\n%s", brokerLog)
	}
	if !bytes.Contains(brokerLog, []byte("refusing new records")) || !bytes.Contains(brokerLog, []byte("taking new records")) {
		t.Fatalf("broker-0 did not log both crossings of the line:\n%s", brokerLog)
	}

	// kill -9 and restart: the shard holds exactly the acked records.
	if err := c.Kill("broker-0"); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(ctx, "broker-0"); err != nil {
		t.Fatal(err)
	}
	reader := clustertest.Connect(t, c, "broker-0")
	sub, err := reader.Subscribe(ctx, "fill", client.Earliest(), client.Shard(onFull))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	next, stop := iter.Pull2(sub.Records(ctx))
	defer stop()
	for want := range uint64(len(acked)) {
		rec, err, ok := next()
		if !ok || err != nil {
			t.Fatalf("reading offset %d of %d acked: %v %v", want, len(acked), err, sub.Err())
		}
		v, ok := acked[rec.Offset]
		if rec.Offset != want || !ok || !bytes.Equal(rec.Value, v) {
			t.Fatalf("offset %d: got the record at offset %d (acked: %v, value intact: %v)", want, rec.Offset, ok, bytes.Equal(rec.Value, v))
		}
	}
	// Nothing after the acked ones: a refused record was never written.
	// (Published on the restarted broker itself: broker-1's connection to
	// the killed process is gone, and its lane redials on the next record.)
	direct, err := reader.Publisher(ctx, "fill")
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	probe, err := direct.Publish(ctx, nil, []byte("last"), client.WithShard(onFull))
	if err != nil {
		t.Fatal(err)
	}
	if probe.Offset != uint64(len(acked)) {
		t.Fatalf("the next record went to offset %d, want %d: the log holds records nobody was acked for", probe.Offset, len(acked))
	}
}
