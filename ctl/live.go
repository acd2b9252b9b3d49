package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

// A broker's liveness is an etcd lease held by the ctl its registration
// stream reaches (any ctl, leader or not): the key live/<node> is put with
// that lease when the broker registers, the lease is kept alive by every
// heartbeat the broker sends, and the key is deleted when the
// registration ends. A broker whose ctl dies keeps its key until the
// lease runs out; registering with another ctl before then adopts the
// lease, so a ctl restart or failover changes no broker's liveness. The
// leader watches live/ and turns what it sees into the map (see
// leader.go).

// liveValue is the value of a live/<node> key.
type liveValue struct {
	ID    string `json:"id"`
	Addr  string `json:"addr"`
	Admin string `json:"admin,omitempty"`
	// Features are the node's, as it registered (shardmap.Node.Features);
	// absent when a ctl of an earlier version holds the registration.
	Features []string `json:"features,omitempty"`
	Lease    int64    `json:"lease"`
	// Replicas is the broker's last replica report
	// (transport.Heartbeat.Replicas); absent before its first, and when
	// the broker or the ctl holding its registration is of an earlier
	// version.
	Replicas *transport.ReplicaReport `json:"replicas,omitempty"`
	// By is the ctl holding the registration, and Reg a token of that
	// registration: only its own registration may delete the key.
	By  string `json:"by"`
	Reg string `json:"reg"`
}

func (st *store) liveKey(id string) string { return st.prefix + "live/" + id }
func (st *store) livePrefix() string       { return st.prefix + "live/" }

// leaseTTLSeconds is the etcd lease TTL for a broker lease of ttl: whole
// seconds, at least one (etcd may raise it to its own minimum).
func leaseTTLSeconds(ttl time.Duration) int64 {
	return max(1, int64((ttl+time.Second-1)/time.Second))
}

// liveLease is one registration's hold on a live/<node> key.
type liveLease struct {
	key   string
	value string
	lease clientv3.LeaseID
	// session is the key's create revision: the core's session number
	// of the registration (see liveEntry).
	session uint64
}

// acquireLive puts live/<n.ID> for a new registration (or one whose lease
// ran out), with the replica report rep: with the lease of the key
// already there (left by a ctl that died or a registration this one
// replaces) if it is still alive, else with a new lease.
func (s *Server) acquireLive(ctx context.Context, n shardmap.Node, reg string, rep *transport.ReplicaReport) (*liveLease, error) {
	st := s.store
	key := st.liveKey(n.ID)
	ctx, cancel := context.WithTimeout(ctx, st.timeout)
	defer cancel()
	start := time.Now()
	defer st.observe("live", start)
	var lease clientv3.LeaseID
	if resp, err := st.cli.Get(ctx, key); err == nil && len(resp.Kvs) > 0 && resp.Kvs[0].Lease != 0 {
		if _, err := st.cli.KeepAliveOnce(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err == nil {
			lease = clientv3.LeaseID(resp.Kvs[0].Lease)
		}
	}
	for range 2 {
		if lease == 0 {
			g, err := st.cli.Grant(ctx, leaseTTLSeconds(s.cfg.LeaseTTL))
			if err != nil {
				return nil, fmt.Errorf("grant lease for %s: %w", n.ID, err)
			}
			lease = g.ID
		}
		l, err := s.putLive(ctx, n, reg, rep, lease)
		if err == nil {
			return l, nil
		}
		if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return nil, fmt.Errorf("put %s: %w", key, err)
		}
		lease = 0 // the adopted lease ran out just now
	}
	return nil, fmt.Errorf("put %s: lease lost twice", key)
}

// putLive puts live/<n.ID> with lease and the replica report rep.
func (s *Server) putLive(ctx context.Context, n shardmap.Node, reg string, rep *transport.ReplicaReport, lease clientv3.LeaseID) (*liveLease, error) {
	key := s.store.liveKey(n.ID)
	value := s.liveValueOf(n, reg, rep, lease)
	resp, err := s.store.cli.Put(ctx, key, value, clientv3.WithLease(lease), clientv3.WithPrevKV())
	if err != nil {
		return nil, err
	}
	session := uint64(resp.Header.Revision)
	if resp.PrevKv != nil {
		session = uint64(resp.PrevKv.CreateRevision)
	}
	return &liveLease{key: key, value: value, lease: lease, session: session}, nil
}

// liveValueOf is the value of live/<n.ID> for registration reg, held by
// this ctl with lease, carrying the replica report rep.
func (s *Server) liveValueOf(n shardmap.Node, reg string, rep *transport.ReplicaReport, lease clientv3.LeaseID) string {
	b, _ := json.Marshal(liveValue{ID: n.ID, Addr: n.Addr, Admin: n.Admin, Features: n.Features, Lease: int64(lease), Replicas: rep, By: s.name(), Reg: reg})
	return string(b)
}

// reportLive puts the replica report rep in l's key, with its lease, for
// the leader to see (state.notVoter), and returns the key's new hold. A
// key no longer this registration's (a newer one took it over) is left
// as it is.
func (s *Server) reportLive(ctx context.Context, n shardmap.Node, reg string, rep *transport.ReplicaReport, l *liveLease) (*liveLease, error) {
	st := s.store
	ctx, cancel := context.WithTimeout(ctx, st.timeout)
	defer cancel()
	start := time.Now()
	defer st.observe("live", start)
	value := s.liveValueOf(n, reg, rep, l.lease)
	resp, err := st.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(l.key), "=", l.value)).
		Then(clientv3.OpPut(l.key, value, clientv3.WithLease(l.lease))).
		Commit()
	if err != nil || !resp.Succeeded {
		return l, err
	}
	nl := *l
	nl.value = value
	return &nl, nil
}

// renewLive keeps l's lease alive for a heartbeat. A lease that ran out
// (the broker was silent too long, or etcd unreachable for as long) is
// replaced: the key is put again, and the leader sees the node come back.
func (s *Server) renewLive(ctx context.Context, n shardmap.Node, reg string, rep *transport.ReplicaReport, l *liveLease) (*liveLease, error) {
	st := s.store
	cctx, cancel := context.WithTimeout(ctx, st.timeout)
	start := time.Now()
	_, err := st.cli.KeepAliveOnce(cctx, l.lease)
	st.observe("keepalive", start)
	cancel()
	if err == nil {
		return l, nil
	}
	if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return l, err
	}
	s.stats.leaseExpiries.Add(1)
	s.log.Warn("broker lease had expired; renewed", "node", n.ID)
	return s.acquireLive(ctx, n, reg, rep)
}

// releaseLive deletes l's key if it is still this registration's, and
// reports whether it did. The
// lease is left to run out (it holds nothing else), so that the leader
// can tell an ended registration (lease alive, key gone) from an expired
// one. Close cuts it short, as if the registration had ended with the
// ctl: without an etcd quorum the write would hold Close for its whole
// timeout.
func (s *Server) releaseLive(l *liveLease) bool {
	st := s.store
	ctx, cancel := context.WithTimeout(s.ctx, st.timeout)
	defer cancel()
	resp, err := st.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(l.key), "=", l.value)).
		Then(clientv3.OpDelete(l.key)).
		Commit()
	if err != nil {
		s.log.Warn("could not end a broker's liveness in etcd; its lease will run out", "key", l.key, "err", err)
		return false
	}
	return resp.Succeeded
}

// readLive reads every live/ key, by node id.
func (st *store) readLive(ctx context.Context) (map[string]liveEntry, int64, error) {
	kvs, rev, err := st.readLiveKeys(ctx, 0)
	if err != nil {
		return nil, 0, err
	}
	return kvs.entries(st), rev, nil
}

// liveKeys are the live/ keys, by key.
type liveKeys map[string]*mvccpb.KeyValue

// entries parses k, by node id.
func (k liveKeys) entries(st *store) map[string]liveEntry {
	out := map[string]liveEntry{}
	for _, kv := range k {
		if e, ok := parseLive(st, kv.Key, kv.Value, kv.CreateRevision); ok {
			out[e.node.ID] = e
		}
	}
	return out
}

// readLiveKeys reads every live/ key as of revision rev (0: the latest),
// and returns the revision read.
func (st *store) readLiveKeys(ctx context.Context, rev int64) (liveKeys, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, st.timeout)
	defer cancel()
	resp, err := st.cli.Get(ctx, st.livePrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		return nil, 0, fmt.Errorf("ctl: read broker leases: %w", err)
	}
	out := liveKeys{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = kv
	}
	return out, resp.Header.Revision, nil
}

// follow keeps k up to date with evs, and gives each deletion of a
// live/ key the value it deletes (the watch asks etcd for no previous
// values: see watchLoop).
func (k liveKeys) follow(st *store, evs []*clientv3.Event) {
	for _, ev := range evs {
		key := string(ev.Kv.Key)
		if !strings.HasPrefix(key, st.livePrefix()) {
			continue
		}
		if ev.Type == mvccpb.PUT {
			k[key] = ev.Kv
			continue
		}
		ev.PrevKv = k[key]
		delete(k, key)
	}
}

// liveEntry is a live/<node> key as the leader uses it: the node and the
// registration's session number for the core (the key's create revision,
// which a new registration on another ctl changes).
type liveEntry struct {
	node    shardmap.Node
	session uint64
	lease   int64
	report  *transport.ReplicaReport // nil: none yet, or none from this version
}

func parseLive(st *store, key, value []byte, createRev int64) (liveEntry, bool) {
	id := strings.TrimPrefix(string(key), st.livePrefix())
	var v liveValue
	if err := json.Unmarshal(value, &v); err != nil || v.ID != id {
		return liveEntry{}, false
	}
	return liveEntry{node: shardmap.Node{ID: v.ID, Addr: v.Addr, Admin: v.Admin, Features: featureSet(v.Features)}, session: uint64(createRev), lease: v.Lease,
		report: v.Replicas}, true
}
