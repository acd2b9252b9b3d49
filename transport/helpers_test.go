package transport

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/felix-broker/felix/shardmap"
	"github.com/quic-go/quic-go"
)

type namedFrame struct {
	name string
	f    Frame
}

// sampleFrames returns frames of every type, with zero, nil, empty and
// extreme field values.
func sampleFrames() []namedFrame {
	big := bytes.Repeat([]byte{0xab}, 70000) // bin32
	long := strings.Repeat("s", 300)         // str16
	many := map[string]string{}
	for i := range 20 { // map16
		many[strings.Repeat("k", i+1)] = strings.Repeat("v", i)
	}
	records := make([]Record, 20) // array16
	for i := range records {
		records[i] = Record{Offset: uint64(i), Timestamp: int64(i) * 1e9, Value: []byte{byte(i)}}
	}
	m := shardmap.Build(7,
		[]shardmap.Node{{ID: "n1", Addr: "127.0.0.1:7401", Live: true, Features: Features()}, {ID: "n2", Addr: "127.0.0.1:7402", Admin: "127.0.0.1:8402"}},
		[]shardmap.StreamConfig{{Name: "orders", Shards: 4, RetentionBytes: 1 << 30, RetentionAge: time.Hour}, {Name: "logs", Shards: 1}})
	return []namedFrame{
		{"publish/zero", &Publish{}},
		{"publish/full", &Publish{
			Seq: 1<<64 - 1, Stream: "orders", Shard: -1, Key: []byte("user-42"), Value: []byte("hello"),
			Headers:    map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
			ProducerID: "p1", ProducerSeq: 99, Epoch: 12, Via: "n2", Created: 9,
		}},
		{"publish/empty-not-nil", &Publish{Key: []byte{}, Value: []byte{}, Headers: map[string]string{}}},
		{"publish/extremes", &Publish{Seq: 128, Shard: -2147483648, Value: big, Stream: long, Headers: many, ProducerSeq: 1 << 32, Epoch: 65536}},
		{"publish/max-shard", &Publish{Shard: 2147483647, Key: bytes.Repeat([]byte{1}, 256)}},
		{"ack/zero", &Ack{}},
		{"ack/full", &Ack{Seq: 3, Stream: "orders", Shard: 2, Offset: 1 << 40, Timestamp: time.Now().UnixNano(), Owner: "n1", Via: "n2", Forwarded: true, Duplicate: true, Epoch: 17}},
		{"ack/no-epoch", &Ack{Seq: 3, Stream: "orders", Shard: 2, Offset: 7, Duplicate: true}},
		{"ack/extremes", &Ack{Seq: 1<<64 - 1, Shard: -1, Offset: 1<<64 - 1, Timestamp: -1 << 63}},
		{"error/sentinel", &Error{Code: CodeMalformed}},
		{"error/full", &Error{Seq: 5, Code: CodeNotOwner, Message: "shard orders/2 is owned by n3", Epoch: 9, Owner: "n3"}},
		{"error/unknown-code", &Error{Code: 65535}},
		{"subscribe/zero", &Subscribe{}},
		{"subscribe/full", &Subscribe{Stream: "orders", Shard: 3, Start: StartOffset, Offset: 1000, Credit: 1<<32 - 1, Created: 7, Epoch: 9, Cluster: "c-1"}},
		{"subscribe/no-cluster", &Subscribe{Stream: "orders", Shard: 3, Start: StartOffset, Offset: 1000, Credit: 1<<32 - 1, Created: 7, Epoch: 9}},
		{"subscribe/no-epoch", &Subscribe{Stream: "orders", Shard: 3, Start: StartOffset, Offset: 1000, Credit: 16, Created: 7}},
		{"subscribe/no-created", &Subscribe{Stream: "orders", Shard: 3, Start: StartOffset, Offset: 1000, Credit: 16}},
		{"records/nil", &Records{Stream: "orders"}},
		{"records/empty", &Records{Stream: "orders", Records: []Record{}}},
		{"records/full", &Records{Stream: "orders", Shard: 1, Records: []Record{
			{Offset: 10, Timestamp: 1700000000000000000, Key: []byte("k"), Value: []byte("v"), Headers: map[string]string{"a": "b"}, ProducerID: "p", ProducerSeq: 1},
			{Offset: 11, Key: []byte{}, Value: nil},
		}}},
		{"records/many", &Records{Stream: "x", Shard: 0, Records: records}},
		{"credit/zero", &Credit{}},
		{"credit/max", &Credit{Records: 1<<32 - 1}},
		{"request/zero", &Request{}},
		{"request/create", &Request{Op: "stream.create", Stream: shardmap.StreamConfig{Name: "orders", Shards: 8, RetentionBytes: 1 << 20, RetentionAge: 24 * time.Hour}}},
		{"request/admit", &Request{Op: "replica.admit", Stream: shardmap.StreamConfig{Name: "orders"}, Admit: &ReplicaAdmit{Shard: 2, ID: 8<<40 + 3}}},
		{"request/move", &Request{Op: "stream.move", Stream: shardmap.StreamConfig{Name: "orders"}, Principal: "alice", Move: &ReplicaMove{Shard: 2, From: "n1", To: "n3"}}},
		{"request/move-pick", &Request{Op: "stream.move", Stream: shardmap.StreamConfig{Name: "orders"}, Move: &ReplicaMove{Shard: 4095, From: "n1"}}},
		{"request/admit-and-move", &Request{Op: "x", Admit: &ReplicaAdmit{ID: 1}, Move: &ReplicaMove{}}},
		{"request/remove", &Request{Op: "cluster.remove", Principal: "alice", NodeID: "n2"}},
		{"request/all-trailing", &Request{Op: "x", Admit: &ReplicaAdmit{Shard: 1}, Move: &ReplicaMove{From: "n1"}, NodeID: "n1"}},
		{"response/zero", &Response{}},
		{"response/streams", &Response{Streams: []shardmap.StreamConfig{{Name: "a", Shards: 1}, {Name: "b", Shards: 4096}}}},
		{"response/empty-streams", &Response{Streams: []shardmap.StreamConfig{}}},
		{"response/map", &Response{Map: m}},
		{"response/replicas", &Response{Replicas: []ReplicaState{{Shard: 1, Node: "n1", Leader: "n2", Term: 7, Next: 1 << 40, First: 1 << 39}, {Node: "n3", Err: "stopped"}}}},
		{"response/moved", &Response{Streams: []shardmap.StreamConfig{{Name: "orders", Shards: 4, Replicas: 3}}, Map: m, Moved: &ReplicaMove{Shard: 2, From: "n1", To: "n3"}}},
		{"map/nil", &MapUpdate{}},
		{"map/full", &MapUpdate{Map: m}},
		{"map/empty", &MapUpdate{Map: &shardmap.Map{Epoch: 1}}},
		{"map/features", &MapUpdate{Map: m, Features: Features()}},
		{"map/lease", &MapUpdate{Map: m, Features: Features(), LeaseTTL: 3 * time.Second}},
		{"map/lease-only", &MapUpdate{Map: &shardmap.Map{Epoch: 1}, LeaseTTL: 1}},
		{"register/zero", &Register{}},
		{"register/full", &Register{NodeID: "n1", Addr: "10.0.0.1:7400", Admin: "10.0.0.1:8400"}},
		{"register/features", &Register{NodeID: "n1", Addr: "10.0.0.1:7400", Features: Features()}},
		{"register/features-extremes", &Register{NodeID: "n1", Addr: "a", Features: []string{FeatureReplicaMoves, "", long}}},
		{"heartbeat/full", &Heartbeat{NodeID: "n1", Epoch: 1<<64 - 1}},
		{"heartbeat/report", &Heartbeat{NodeID: "n1", Epoch: 9, Replicas: &ReplicaReport{Applied: 9,
			Unready: []shardmap.ShardID{{Stream: "orders", Shard: 0}, {Stream: "orders", Shard: 7}}, More: true}}},
		{"heartbeat/report-empty", &Heartbeat{NodeID: "n1", Epoch: 9, Replicas: &ReplicaReport{}}},
		{"raft/zero", &Raft{}},
		{"raft/duplex", &Raft{From: "n1", Duplex: true}},
		{"raft/full", &Raft{From: "n2", Msgs: []RaftMsg{
			{Stream: "orders", Shard: 3, Data: []byte{8, 3, 16, 1}},
			{Stream: long, Shard: 2147483647, Data: big},
			{Stream: "", Shard: -1, Data: nil},
		}}},
	}
}

// pki is a development PKI in a temporary directory.
type pki struct {
	dir    string
	ca     *x509.CertPool
	nodes  map[string]tls.Certificate
	client tls.Certificate
}

func newPKI(t testing.TB, nodeIDs ...string) *pki {
	t.Helper()
	dir := t.TempDir()
	if err := GenerateDevCerts(dir, nodeIDs...); err != nil {
		t.Fatal(err)
	}
	p := &pki{dir: dir, nodes: map[string]tls.Certificate{}}
	var err error
	if p.ca, err = LoadCA(filepath.Join(dir, "ca.crt")); err != nil {
		t.Fatal(err)
	}
	for _, id := range nodeIDs {
		if p.nodes[id], err = LoadKeyPair(filepath.Join(dir, id+".crt"), filepath.Join(dir, id+".key")); err != nil {
			t.Fatal(err)
		}
	}
	if p.client, err = LoadKeyPair(filepath.Join(dir, DevAdminName+".crt"), filepath.Join(dir, DevAdminName+".key")); err != nil {
		t.Fatal(err)
	}
	return p
}

// startEcho runs Echo on loopback with node n1's certificate and returns
// its address; cleanup stops it and waits for it.
func startEcho(t testing.TB, p *pki, cfg Config) string {
	t.Helper()
	ln, err := Listen("127.0.0.1:0", ServerTLS(p.nodes["n1"], p.ca), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Echo(ctx, ln, cfg.MaxFrame) }()
	t.Cleanup(func() {
		cancel()
		ln.Close()
		if err := <-done; err != nil {
			t.Errorf("Echo: %v", err)
		}
	})
	return ln.Addr().String()
}

// dial connects to addr; cleanup closes the connection.
func dial(t testing.TB, addr string, tlsConf *tls.Config, cfg Config) *quic.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := Dial(ctx, addr, tlsConf, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.CloseWithError(0, "test done") })
	return conn
}
