package dockertest

import "testing"

// TestHungAt: of a slow shutdown's goroutine dump, only the goroutines
// in Felix's code are kept, their calls without file lines.
func TestHungAt(t *testing.T) {
	logs := `time=... level=INFO msg="shutting down"
time=... level=WARN msg="ctl: shutdown is slow; every goroutine's stack follows on stderr" after=6s
goroutine 1 [select]:
go.etcd.io/etcd/server/v3/etcdserver.(*EtcdServer).MoveLeader(0x1, {0x2, 0x3}, 0x4, 0x5)
	/root/go/pkg/mod/go.etcd.io/etcd/server/v3@v3.7.3/etcdserver/server.go:1262 +0x412
github.com/felix-broker/felix/ctl.(*Server).Close(0x6)
	/work/main/ctl/server.go:709 +0x116

goroutine 64 [select]:
go.etcd.io/etcd/server/v3/storage/backend.(*backend).run(0x7)
	/root/go/pkg/mod/go.etcd.io/etcd/server/v3@v3.7.3/storage/backend/backend.go:446 +0xf5
`
	want := `goroutine 1 [select]:
go.etcd.io/etcd/server/v3/etcdserver.(*EtcdServer).MoveLeader(0x1, {0x2, 0x3}, 0x4, 0x5)
github.com/felix-broker/felix/ctl.(*Server).Close(0x6)

`
	if got := hungAt(logs); got != want {
		t.Errorf("hungAt:\n%s\nwant:\n%s", got, want)
	}
	if got := hungAt("killed before it logged"); got == "" {
		t.Error("hungAt of a log without stacks is empty: want it to say so")
	}
}
