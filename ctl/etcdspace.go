package ctl

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/storage"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// This file keeps etcd's database within its quota (the NOSPACE alarm)
// and tells etcd's refusals of a transaction from failures whose outcome
// is unknown.
//
// etcd checks its quota (--quota-backend-bytes, 2 GiB by default) against
// the size of its database FILE, which compaction does not shrink: pages
// freed by compaction are reused, but only a defragmentation returns them
// to the file system. Once a write would pass the quota, etcd raises the
// NOSPACE alarm and refuses every write (puts, transactions, lease
// grants: no admin change, no broker registration, no election) until
// the alarm is disarmed, which an operator does with etcdctl, after
// compacting and defragmenting (etcd's maintenance guide). For the etcd
// it runs (the embedded member), ctl does so itself: every ctl checks
// etcd's state every Knobs.EtcdCheckEvery (and at start), and on a
// NOSPACE alarm compacts the history to the current revision,
// defragments the members one at a time, and disarms the alarm once
// every member's file is back under three quarters of the quota. Any
// ctl does this, not only the leader: under the alarm no ctl can be
// elected (a campaign grants a lease). Out of the alarm, the leader
// defragments, one member per check, a member whose file holds more than
// a quarter of the quota of free pages: rare, and bounded (a defrag
// blocks its member for about a second per GiB). An external etcd is the
// operator's: ctl reports its alarm (log, Stats) and touches nothing.

// errEtcdRefused marks an etcd refusal of a transaction it did not
// apply: etcd's answer says the change was not made.
var errEtcdRefused = errors.New("ctl: etcd refused the transaction without applying it")

// etcdRefusal returns what etcd's error err says, if it is a refusal of
// a request before etcd applied it: a request over --max-request-bytes
// (etcd's check before proposing it, or gRPC's on its size), a
// transaction of more than --max-txn-ops operations. etcd's NOSPACE
// error is not one: the write that passes the quota is applied and
// answered with it (etcdserver/apply/quota.go), so the store reads
// whether it landed (see resolveNoSpace).
func etcdRefusal(err error) (string, bool) {
	switch {
	case errors.Is(err, rpctypes.ErrRequestTooLarge):
		return "the change's etcd transaction is larger than etcd's --max-request-bytes (felix needs 10 MiB, the embedded etcd's setting)", true
	case errors.Is(err, rpctypes.ErrTooManyOps):
		return "the change's etcd transaction has more operations than etcd's --max-txn-ops (felix needs 65536, the embedded etcd's setting)", true
	}
	if st, ok := status.FromError(err); ok && st.Code() == codes.ResourceExhausted && !errors.Is(err, rpctypes.ErrNoSpace) {
		// gRPC's size check, on the client's send ("trying to send
		// message larger than max") or etcd's receive ("received
		// message larger than max"): nothing reached etcd's apply.
		return "the change's etcd transaction is larger than etcd accepts (--max-request-bytes; felix needs 10 MiB)", true
	}
	return "", false
}

// noSpaceAdvice is what a change refused for NOSPACE tells its caller.
func noSpaceAdvice(embedded bool) string {
	if embedded {
		return "etcd's database is full (NOSPACE alarm); the change was not made; the control plane is compacting and defragmenting etcd and disarms the alarm by itself: retry in a minute"
	}
	return "etcd's database is full (NOSPACE alarm); the change was not made; the operator of the external etcd must compact it, defragment each member and disarm the alarm (etcdctl compact, defrag, alarm disarm), or raise --quota-backend-bytes"
}

// DefaultEtcdCheckEvery is the default Knobs.EtcdCheckEvery.
const DefaultEtcdCheckEvery = 30 * time.Second

// defragTimeout bounds one member's defragmentation.
const defragTimeout = 2 * time.Minute

// etcdSpace watches etcd's database size and alarms. One goroutine
// (Server.keepEtcd) uses it; Stats reads the atomics.
type etcdSpace struct {
	cli      *clientv3.Client
	embedded bool
	quota    int64 // the embedded member's quota; 0 for an external etcd
	epochKey string

	dbSize, dbInUse atomic.Int64 // largest of the members, at the last check
	noSpace         atomic.Bool  // a NOSPACE alarm was raised at the last check
	defrags         atomic.Int64
}

// memberStatus is a member's Status, by its client URL.
type memberStatus struct {
	url string
	id  uint64
	st  *clientv3.StatusResponse // nil if it did not answer
}

// statuses asks every member for its status. An external etcd's members
// are the client's endpoints.
func (e *etcdSpace) statuses(ctx context.Context) ([]memberStatus, error) {
	var out []memberStatus
	if e.embedded {
		cctx, cancel := context.WithTimeout(ctx, etcdOpTimeout)
		ml, err := e.cli.MemberList(cctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("list etcd members: %w", err)
		}
		for _, m := range ml.Members {
			if len(m.ClientURLs) > 0 {
				out = append(out, memberStatus{url: m.ClientURLs[0], id: m.ID})
			}
		}
	} else {
		for _, ep := range e.cli.Endpoints() {
			out = append(out, memberStatus{url: ep})
		}
	}
	for i := range out {
		cctx, cancel := context.WithTimeout(ctx, etcdOpTimeout)
		out[i].st, _ = e.cli.Status(cctx, out[i].url)
		cancel()
	}
	return out, nil
}

// check looks at etcd once and does what is needed (see the top of this
// file); leading says whether this ctl leads (routine defragmentation).
func (s *Server) checkEtcdSpace(ctx context.Context, leading bool) {
	e := s.space
	ms, err := e.statuses(ctx)
	if err != nil {
		s.log.Debug("etcd space check: "+err.Error(), "err", err)
		return
	}
	var size, inUse int64
	for _, m := range ms {
		if m.st != nil {
			size, inUse = max(size, m.st.DbSize), max(inUse, m.st.DbSizeInUse)
		}
	}
	e.dbSize.Store(size)
	e.dbInUse.Store(inUse)
	cctx, cancel := context.WithTimeout(ctx, etcdOpTimeout)
	al, err := e.cli.AlarmList(cctx)
	cancel()
	if err != nil {
		return
	}
	var alarms []*etcdserverpb.AlarmMember
	for _, a := range al.Alarms {
		if a.Alarm == etcdserverpb.AlarmType_NOSPACE {
			alarms = append(alarms, a)
		}
	}
	was := e.noSpace.Swap(len(alarms) > 0)
	if len(alarms) == 0 {
		if was {
			s.log.Info("etcd NOSPACE alarm cleared", "db_bytes", size, "db_in_use_bytes", inUse)
		}
		if leading && e.embedded {
			s.defragSparse(ctx, ms)
		}
		return
	}
	if !was {
		what := "ctl compacts and defragments it and disarms the alarm by itself"
		if !e.embedded {
			what = "the operator of this external etcd must compact it, defragment each member and disarm the alarm (etcdctl compact, defrag, alarm disarm), or raise --quota-backend-bytes"
		}
		s.log.Error("etcd raised its NOSPACE alarm: its database is full and every change and registration is refused until it is disarmed; "+what,
			"db_bytes", size, "db_in_use_bytes", inUse, "quota_bytes", e.quota)
	}
	if !e.embedded {
		return
	}
	s.recoverNoSpace(ctx, ms, alarms)
}

// recoverNoSpace compacts etcd's history to the current revision,
// defragments the members one at a time, and disarms alarms once every
// member's file is under three quarters of the quota.
func (s *Server) recoverNoSpace(ctx context.Context, ms []memberStatus, alarms []*etcdserverpb.AlarmMember) {
	e := s.space
	cctx, cancel := context.WithTimeout(ctx, etcdOpTimeout)
	defer cancel()
	resp, err := e.cli.Get(cctx, e.epochKey)
	if err != nil {
		s.log.Warn("etcd NOSPACE recovery: read the current revision", "err", err)
		return
	}
	rev := resp.Header.Revision
	if _, err := e.cli.Compact(cctx, rev, clientv3.WithCompactPhysical()); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		s.log.Warn("etcd NOSPACE recovery: compact", "revision", rev, "err", err)
		return
	}
	s.log.Warn("etcd NOSPACE recovery: history compacted to the current revision", "revision", rev)
	ok := true
	for _, m := range ms {
		if !s.defrag(ctx, m, "NOSPACE recovery") {
			ok = false
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, etcdOpTimeout)
		st, err := e.cli.Status(sctx, m.url)
		cancel()
		if err != nil || st.DbSize > e.quota-e.quota/4 {
			var size int64
			if st != nil {
				size = st.DbSize
			}
			s.log.Error("etcd NOSPACE recovery: a member's database is still over three quarters of the quota once compacted and defragmented: the state itself is too large; delete streams or grants (refused changes cannot add any) or raise the quota",
				"member", m.url, "db_bytes", size, "quota_bytes", e.quota, "err", err)
			ok = false
		}
	}
	if !ok {
		return
	}
	for _, a := range alarms {
		dctx, cancel := context.WithTimeout(ctx, etcdOpTimeout)
		_, err := e.cli.AlarmDisarm(dctx, &clientv3.AlarmMember{MemberID: a.MemberID, Alarm: a.Alarm})
		cancel()
		if err != nil {
			s.log.Warn("etcd NOSPACE recovery: disarm the alarm", "member_id", fmt.Sprintf("%x", a.MemberID), "err", err)
			return
		}
		s.log.Warn("etcd NOSPACE recovery: alarm disarmed; changes go through again", "member_id", fmt.Sprintf("%x", a.MemberID))
	}
	e.noSpace.Store(false)
}

// defragSparse defragments the first member whose file holds more than
// a quarter of the quota of free pages: one member per check.
func (s *Server) defragSparse(ctx context.Context, ms []memberStatus) {
	e := s.space
	for _, m := range ms {
		if m.st != nil && m.st.DbSize-m.st.DbSizeInUse > e.quota/4 {
			s.defrag(ctx, m, "free pages over a quarter of the quota")
			return
		}
	}
}

// defrag defragments the member m, logging it; it reports whether it
// succeeded.
func (s *Server) defrag(ctx context.Context, m memberStatus, why string) bool {
	e := s.space
	var before int64
	if m.st != nil {
		before = m.st.DbSize
	}
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, defragTimeout)
	_, err := e.cli.Defragment(dctx, m.url)
	cancel()
	if err != nil {
		s.log.Warn("etcd member not defragmented", "member", m.url, "why", why, "err", err)
		return false
	}
	e.defrags.Add(1)
	var after int64
	sctx, cancel := context.WithTimeout(ctx, etcdOpTimeout)
	if st, err := e.cli.Status(sctx, m.url); err == nil {
		after = st.DbSize
	}
	cancel()
	s.log.Warn("etcd member defragmented", "member", m.url, "why", why, "db_bytes_before", before, "db_bytes_after", after, "took", time.Since(start).Round(time.Millisecond))
	return true
}

// keepEtcd checks etcd's space at start and every Knobs.EtcdCheckEvery
// until the server closes.
func (s *Server) keepEtcd() {
	defer s.wg.Done()
	every := s.cfg.Knobs.EtcdCheckEvery
	if every <= 0 {
		every = DefaultEtcdCheckEvery
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		s.checkEtcdSpace(s.ctx, s.IsLeader())
		select {
		case <-t.C:
		case <-s.ctx.Done():
			return
		}
	}
}

// embeddedQuota is the quota of the embedded member started with q.
func embeddedQuota(q int64) int64 {
	if q <= 0 {
		return storage.DefaultQuotaBytes
	}
	return q
}
