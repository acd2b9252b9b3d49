package ctl

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/felix-broker/felix/auth"
	"github.com/felix-broker/felix/shardmap"
)

// ErrConflict is returned when a change was computed from a state another
// control plane has changed since: the compare-and-swap on the epoch key
// failed and nothing was written. The change must be recomputed from the
// current state (by the leader, if this ctl still is one).
var ErrConflict = errors.New("ctl: state changed by another control plane")

// store keeps the control plane's state in etcd under one prefix (the key
// layout is in the package doc). Every write is a transaction guarded by
// the mod revision of the epoch key the change was computed from, and
// every change puts the epoch key, so two writers that read the same
// state cannot both commit: one map per epoch, whoever computes it.
//
// store is not safe for concurrent writes; the server serializes them.
type store struct {
	cli    *clientv3.Client
	prefix string // "/felix/<cluster>/"
	// timeout bounds each request; default etcdOpTimeout.
	timeout time.Duration
	// saveFault, a testing knob, fails save with its error before any
	// request, as a write that timed out would.
	saveFault atomic.Pointer[error]
	// lostFault, a testing knob, fails save with its error after its
	// write committed, as one whose answer was lost would; lostNext does
	// so for the next save only.
	lostFault, lostNext atomic.Pointer[error]
	// readNext, a testing knob, fails the next whole-state read with its
	// error, as a read during an etcd leader change can.
	readNext atomic.Pointer[error]
	// rtt, when set, observes the duration of every etcd round trip.
	rtt func(op string, d time.Duration)

	// snap is the state at revision rev: what the next save diffs
	// against and is guarded by (rev is the epoch key's mod revision; 0
	// for an empty store).
	snap snapshot
	rev  int64
	// pending are writes whose outcome is unknown, by epoch.
	pending map[uint64]snapshot
	// doubt is set when the caller gave up a write of unknown outcome
	// (giveUp): its change is no longer in the caller's state, so if it
	// landed after all, the state misses it and no later save may build
	// on it. Cleared by a save that finds etcd where this store left it
	// (the write never landed and no longer can), and by load.
	doubt bool
	// fence are extra conditions every save must meet: the leader's
	// election key still being its own (see leader.go).
	fence []clientv3.Cmp
	// writer, when set, is put in the writer key by every save, in the
	// same transaction: which ctl, in which election session, committed
	// each epoch (see [writerRecord]).
	writer string
}

// writerRecord is the value of the writer key: the ctl that committed the
// epoch at the key's mod revision. Election is its election key, which
// exists exactly as long as its session lease, so etcd's history shows
// that no ctl committed a map after its leadership ended (the
// multi-host partition test reads it); an operator sees who wrote the
// current map with etcdctl.
type writerRecord struct {
	Name     string `json:"name"`
	ID       string `json:"id"` // the ctl's run, as in its ctl/ entry
	Election string `json:"election"`
}

// fenceWith makes every later save conditional on el's key still being
// the one el created (this ctl leads) and records w as its writer.
func (st *store) fenceWith(el *concurrency.Election, w writerRecord) {
	st.fence = []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(el.Key()), "=", el.Rev())}
	b, _ := json.Marshal(w) // strings only
	st.writer = string(b)
}

// unfence drops the fence and the writer: this ctl no longer leads.
func (st *store) unfence() { st.fence, st.writer = nil, "" }

func newStore(cli *clientv3.Client, cluster string) *store {
	return &store{cli: cli, prefix: "/felix/" + cluster + "/", timeout: etcdOpTimeout}
}

func (st *store) epochKey() string            { return st.prefix + "epoch" }
func (st *store) writerKey() string           { return st.prefix + "writer" }
func (st *store) memberKey(id string) string  { return st.prefix + "members/" + id }
func (st *store) streamKey(n string) string   { return st.prefix + "streams/" + n }
func (st *store) superusersKey() string       { return st.prefix + "superusers" }
func (st *store) requestKey(id string) string { return st.prefix + "requests/" + id }
func (st *store) clusterIDKey() string        { return st.prefix + "cluster-id" }
func (st *store) grantKey(g auth.Grant) string {
	return st.prefix + "grants/" + url.PathEscape(g.Principal) + "/" + string(g.Action) + "/" + url.PathEscape(g.Pattern)
}

func (st *store) observe(op string, start time.Time) {
	if st.rtt != nil {
		st.rtt(op, time.Since(start))
	}
}

// load reads the whole state at one revision and makes it the base of the
// next save.
func (st *store) load(ctx context.Context) (snapshot, error) {
	snap, rev, err := st.read(ctx)
	if err != nil {
		return snapshot{}, err
	}
	st.adopt(snap, rev)
	return snap, nil
}

// adopt makes snap, read at revision rev (read), the state the next save
// diffs against and is guarded by.
func (st *store) adopt(snap snapshot, rev int64) {
	st.snap, st.rev, st.pending, st.doubt = snap, rev, nil, false
}

// read reads the whole state at one revision. rev is the mod revision of
// the epoch key (0 when the store is empty: a new cluster).
func (st *store) read(ctx context.Context) (snap snapshot, rev int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, st.timeout)
	defer cancel()
	start := time.Now()
	resp, err := st.cli.Get(ctx, st.prefix, clientv3.WithPrefix())
	st.observe("load", start)
	if f := st.readNext.Swap(nil); f != nil && err == nil {
		err = *f
	}
	if err != nil {
		return snapshot{}, 0, fmt.Errorf("ctl: load state from etcd %s: %w", st.prefix, err)
	}
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		rest := strings.TrimPrefix(key, st.prefix)
		bad := func(err error) error { return fmt.Errorf("ctl: load state: corrupt key %s: %w", key, err) }
		switch {
		case rest == "epoch":
			if snap.Epoch, err = strconv.ParseUint(string(kv.Value), 10, 64); err != nil {
				return snapshot{}, 0, bad(err)
			}
			rev = kv.ModRevision
		case strings.HasPrefix(rest, "members/"):
			var m fileMember
			if err := json.Unmarshal(kv.Value, &m); err != nil {
				return snapshot{}, 0, bad(err)
			}
			snap.Members = append(snap.Members, m.node())
		case strings.HasPrefix(rest, "streams/"):
			var s fileStream
			if err := json.Unmarshal(kv.Value, &s); err != nil {
				return snapshot{}, 0, bad(err)
			}
			stream, err := s.stream()
			if err != nil {
				return snapshot{}, 0, bad(err)
			}
			snap.Streams = append(snap.Streams, stream)
		case strings.HasPrefix(rest, "grants/"):
			var g fileGrant
			if err := json.Unmarshal(kv.Value, &g); err != nil {
				return snapshot{}, 0, bad(err)
			}
			ag := g.grant()
			if err := ag.Validate(); err != nil {
				return snapshot{}, 0, bad(err)
			}
			snap.Grants = append(snap.Grants, ag)
		case rest == "superusers":
			snap.Superusers = []string{}
			if err := json.Unmarshal(kv.Value, &snap.Superusers); err != nil {
				return snapshot{}, 0, bad(err)
			}
		case rest == "cluster-id":
			snap.ClusterID = string(kv.Value)
		case strings.HasPrefix(rest, "requests/"):
			var r fileRequest
			if err := json.Unmarshal(kv.Value, &r); err != nil {
				return snapshot{}, 0, bad(err)
			}
			snap.Requests = append(snap.Requests, appliedRequest{ID: strings.TrimPrefix(rest, "requests/"), What: r.What, Result: r.Result, Epoch: r.Epoch})
		}
	}
	slices.SortStableFunc(snap.Requests, func(a, b appliedRequest) int { return cmp.Compare(a.Epoch, b.Epoch) })
	return snap, rev, nil
}

// save writes next: the difference between the state last loaded or
// saved and next, if and only if the epoch key is still at the revision
// that state was read at. It fails with ErrConflict when another writer
// got there first (nothing is written; the caller must reload).
//
// A write whose outcome is unknown (a timeout, a lost connection) is
// remembered as pending: if a later save finds the epoch key moved to
// that write's epoch, it was this store's write that landed, and the
// later save proceeds from it.
func (st *store) save(ctx context.Context, next snapshot) error {
	if f := st.saveFault.Load(); f != nil {
		return fmt.Errorf("ctl: commit epoch %d to etcd: %w", next.Epoch, *f)
	}
	for range 2 {
		ops := st.diff(st.snap, next)
		cctx, cancel := context.WithTimeout(ctx, st.timeout)
		start := time.Now()
		resp, err := st.cli.Txn(cctx).
			If(append([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(st.epochKey()), "=", st.rev)}, st.fence...)...).
			Then(ops...).
			Else(clientv3.OpGet(st.epochKey())).
			Commit()
		cancel()
		st.observe("commit", start)
		if err == nil {
			if f := st.lostFault.Load(); f != nil {
				err = *f
			} else if f := st.lostNext.Swap(nil); f != nil {
				err = *f
			}
		}
		if err != nil {
			if what, ok := etcdRefusal(err); ok {
				return fmt.Errorf("ctl: commit epoch %d to etcd: %w: %s: %w", next.Epoch, errEtcdRefused, what, err)
			}
			if errors.Is(err, rpctypes.ErrNoSpace) && ctx.Err() == nil {
				landed, rerr := st.landed(ctx, next)
				switch {
				case rerr == nil && landed:
					// The write that passed the quota: etcd applied it,
					// answered NOSPACE and raised the alarm.
					return nil
				case rerr == nil:
					return fmt.Errorf("ctl: commit epoch %d to etcd: %w: %w", next.Epoch, errEtcdRefused, err)
				}
			}
			if st.pending == nil {
				st.pending = map[uint64]snapshot{}
			}
			st.pending[next.Epoch] = next
			return fmt.Errorf("ctl: commit epoch %d to etcd: %w", next.Epoch, err)
		}
		if resp.Succeeded {
			st.snap, st.rev, st.pending, st.doubt = next, resp.Header.Revision, nil, false
			return nil
		}
		have, haveRev := uint64(0), int64(0)
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			have, _ = strconv.ParseUint(string(kvs[0].Value), 10, 64)
			haveRev = kvs[0].ModRevision
		}
		if st.doubt {
			return fmt.Errorf("commit epoch %d computed at revision %d: etcd holds epoch %d at revision %d, possibly from a write given up on: %w",
				next.Epoch, st.rev, have, haveRev, ErrConflict)
		}
		if p, ok := st.pending[have]; ok && haveRev > st.rev {
			st.snap, st.rev = p, haveRev // our earlier write landed after all
			delete(st.pending, have)
			continue
		}
		return fmt.Errorf("commit epoch %d computed at revision %d: etcd holds epoch %d at revision %d: %w", next.Epoch, st.rev, have, haveRev, ErrConflict)
	}
	return fmt.Errorf("commit epoch %d: %w", next.Epoch, ErrConflict)
}

// landed reads whether next, whose write etcd answered with an error
// (NOSPACE), landed after all: the epoch key holds next's epoch at a
// later revision than the one next was computed at, put by this writer.
// If so, the store adopts next.
func (st *store) landed(ctx context.Context, next snapshot) (bool, error) {
	cctx, cancel := context.WithTimeout(ctx, st.timeout)
	defer cancel()
	resp, err := st.cli.Txn(cctx).Then(clientv3.OpGet(st.epochKey()), clientv3.OpGet(st.writerKey())).Commit()
	if err != nil {
		return false, err
	}
	ek, wk := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	if len(ek) == 0 || ek[0].ModRevision <= st.rev || string(ek[0].Value) != strconv.FormatUint(next.Epoch, 10) {
		return false, nil
	}
	if st.writer != "" && (len(wk) == 0 || string(wk[0].Value) != st.writer || wk[0].ModRevision != ek[0].ModRevision) {
		return false, nil
	}
	st.snap, st.rev = next, ek[0].ModRevision
	delete(st.pending, next.Epoch)
	return true, nil
}

// giveUp records that the caller undid the change of its last save,
// which failed with its outcome unknown: its write of that epoch may
// still have landed, and then etcd holds a change the caller's state does
// not. A later save that finds etcd moved on fails with ErrConflict (the
// caller must reload) rather than build on it: building on it would
// commit a second, different map at that epoch, or undo the change
// without anyone asking.
func (st *store) giveUp(epoch uint64) {
	delete(st.pending, epoch)
	st.doubt = true
}

// diff returns the etcd operations turning old into next: the epoch, and
// a put or delete for each member, stream and grant that changed.
func (st *store) diff(old, next snapshot) []clientv3.Op {
	ops := []clientv3.Op{clientv3.OpPut(st.epochKey(), strconv.FormatUint(next.Epoch, 10))}
	if st.writer != "" {
		ops = append(ops, clientv3.OpPut(st.writerKey(), st.writer))
	}
	put := func(key string, v any) {
		b, _ := json.Marshal(v) // plain structs of strings and numbers
		ops = append(ops, clientv3.OpPut(key, string(b)))
	}

	oldM := map[string]fileMember{}
	for _, n := range old.Members {
		oldM[n.ID] = toFileMember(n)
	}
	for _, n := range next.Members {
		fm := toFileMember(n)
		if o, ok := oldM[n.ID]; !ok || !o.equal(fm) {
			put(st.memberKey(n.ID), fm)
		}
		delete(oldM, n.ID)
	}
	for id := range oldM {
		ops = append(ops, clientv3.OpDelete(st.memberKey(id)))
	}

	oldS := map[string]shardmap.Stream{}
	for _, s := range old.Streams {
		oldS[s.Name] = s
	}
	for _, s := range next.Streams {
		if o, ok := oldS[s.Name]; !ok || o.StreamConfig != s.StreamConfig || o.Created != s.Created || !o.Placement.Equal(s.Placement) {
			put(st.streamKey(s.Name), toFileStream(s))
		}
		delete(oldS, s.Name)
	}
	for name := range oldS {
		ops = append(ops, clientv3.OpDelete(st.streamKey(name)))
	}

	oldG := map[auth.Grant]bool{}
	for _, g := range old.Grants {
		oldG[g] = true
	}
	for _, g := range next.Grants {
		if !oldG[g] {
			put(st.grantKey(g), toFileGrant(g))
		}
		delete(oldG, g)
	}
	for g := range oldG {
		ops = append(ops, clientv3.OpDelete(st.grantKey(g)))
	}
	if next.Superusers != nil && (old.Superusers == nil || !slices.Equal(old.Superusers, next.Superusers)) {
		put(st.superusersKey(), next.Superusers)
	}

	if next.ClusterID != old.ClusterID {
		ops = append(ops, clientv3.OpPut(st.clusterIDKey(), next.ClusterID))
	}

	// A request's record never changes: only which are kept does.
	oldR := map[string]bool{}
	for _, r := range old.Requests {
		oldR[r.ID] = true
	}
	for _, r := range next.Requests {
		if !oldR[r.ID] {
			put(st.requestKey(r.ID), fileRequest{What: r.What, Result: r.Result, Epoch: r.Epoch})
		}
		delete(oldR, r.ID)
	}
	for id := range oldR {
		ops = append(ops, clientv3.OpDelete(st.requestKey(id)))
	}
	return ops
}

func toFileMember(n shardmap.Node) fileMember {
	return fileMember{ID: n.ID, Addr: n.Addr, Admin: n.Admin, Live: n.Live, Features: n.Features}
}

func toFileStream(c shardmap.Stream) fileStream {
	return fileStream{Name: c.Name, Shards: c.Shards, RetentionBytes: c.RetentionBytes,
		RetentionAgeNano: int64(c.RetentionAge), Owners: c.Placement, Replicas: c.Replicas, Created: c.Created}
}

func toFileGrant(g auth.Grant) fileGrant {
	return fileGrant{Principal: g.Principal, Action: string(g.Action), Pattern: g.Pattern}
}

func (g fileGrant) grant() auth.Grant {
	return auth.Grant{Principal: g.Principal, Action: auth.Action(g.Action), Pattern: g.Pattern}
}

func (s fileStream) stream() (shardmap.Stream, error) {
	c := shardmap.StreamConfig{Name: s.Name, Shards: s.Shards, RetentionBytes: s.RetentionBytes, RetentionAge: time.Duration(s.RetentionAgeNano), Replicas: s.Replicas}
	if err := c.Validate(); err != nil {
		return shardmap.Stream{}, err
	}
	if s.Owners.Len() > c.Shards {
		return shardmap.Stream{}, fmt.Errorf("stream %q: %d owners for %d shards", s.Name, s.Owners.Len(), c.Shards)
	}
	return shardmap.Stream{StreamConfig: c, Placement: s.Owners, Created: s.Created}, nil
}
