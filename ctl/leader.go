package ctl

import (
	"context"
	crand "crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/felix-broker/felix/ctl/ctlclient"
	"github.com/felix-broker/felix/transport"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Every ctl campaigns in one etcd election (key prefix election/, through
// concurrency.Election) with its own session lease (TTL Config.CtlTTL).
// The one elected is the leader: it alone places shards and writes maps,
// every write fenced by its election key (a transaction that fails once
// the key is gone), so a leader that lost its lease — partitioned, paused
// — cannot write a map after it. The others are followers: they hold
// registrations, serve reads from the map they watch, and forward changes
// to the leader. When the leader's lease ends (it died, or cannot reach a
// quorum of etcd), the next in line takes over: it reads the state, the
// broker leases (live/) and carries on from the stored epoch.

// The election value and the ctl/ registry entry of each ctl.
type ctlInfo struct {
	Name string `json:"name"`
	// ID tells this run of the ctl from others of the same name.
	ID   string `json:"id"`
	Addr string `json:"addr"` // QUIC address other ctls and tools reach it at
	Etcd string `json:"etcd,omitempty"`
	// Features are what the ctl's build supports (transport.Features),
	// absent from the entry of a ctl of an earlier version: a change
	// that such a ctl could not take is refused while one runs (see
	// Server.ctlsWithout).
	Features []string `json:"features,omitempty"`
}

func (st *store) electionPrefix() string    { return st.prefix + "election" }
func (st *store) ctlPrefix() string         { return st.prefix + "ctl/" }
func (st *store) ctlKey(name string) string { return st.ctlPrefix() + name }

// electLoop campaigns until Close: a session, a campaign, leadership
// until the session ends; then again with a new session.
func (s *Server) electLoop() {
	defer s.wg.Done()
	backoff := 50 * time.Millisecond
	for s.ctx.Err() == nil {
		err := s.campaign()
		if s.ctx.Err() != nil {
			return
		}
		if err != nil {
			s.log.Warn("ctl election: retrying", "err", err)
		}
		select {
		case <-time.After(backoff/2 + rand.N(backoff/2+1)):
		case <-s.ctx.Done():
			return
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// campaign runs one session: it registers this ctl under ctl/, campaigns,
// and leads until the session ends.
func (s *Server) campaign() error {
	sess, err := concurrency.NewSession(s.store.cli, concurrency.WithTTL(int(leaseTTLSeconds(s.cfg.CtlTTL))), concurrency.WithContext(s.ctx))
	if err != nil {
		return err
	}
	defer sess.Close()
	el := concurrency.NewElection(sess, s.store.electionPrefix())
	s.el.Lock()
	s.el.sess, s.el.el, s.el.won = sess, el, false
	err = s.announceLocked()
	info := s.info()
	s.el.Unlock()
	defer func() {
		s.el.Lock()
		s.el.sess, s.el.el, s.el.won = nil, nil, false
		s.el.Unlock()
	}()
	if err != nil {
		return err
	}
	campaign := make(chan error, 1)
	cctx, ccancel := context.WithCancel(s.ctx)
	defer ccancel()
	go func() { campaign <- el.Campaign(cctx, info) }()
	select {
	case err := <-campaign:
		if err != nil {
			return err
		}
	case <-sess.Done():
		ccancel()
		<-campaign
		return errors.New("session lease lost while campaigning")
	}
	s.el.Lock()
	s.el.won = true
	if s.info() != info { // Start set the address while this campaigned
		err = s.announceLocked()
	}
	s.el.Unlock()
	if err != nil {
		return err
	}
	held, err := s.takeOver(el)
	if err != nil {
		s.stepDown("takeover failed")
		s.resign(el)
		return err
	}
	if len(held) > 0 {
		s.log.Info("brokers live in the last map whose leases ran out keep their liveness until they register again",
			"nodes", held, "grace", s.registrationGrace())
	}
	graceTimer := time.NewTimer(s.registrationGrace())
	defer graceTimer.Stop()
	grace := graceTimer.C
	for leading := true; leading; {
		select {
		case <-grace:
			grace = nil
			s.endGrace()
		case <-sess.Done():
			s.stepDown("session lease lost")
			return errors.New("leader's session lease lost")
		case <-s.lost:
			s.stepDown("a write was refused: no longer the leader")
			leading = false
		case <-s.ctx.Done():
			s.stepDown("closing")
			leading = false
		}
	}
	s.resign(el)
	return nil
}

// registrationGrace is how long a new leader keeps live the brokers it
// holds live with no lease (see takeOver): a lease, and the longest
// reconnect backoff of a broker (MemberConfig.MaxBackoff's default),
// which grew while no ctl answered.
func (s *Server) registrationGrace() time.Duration {
	return s.cfg.LeaseTTL + ctlclient.DefaultMaxBackoff
}

// endGrace ends the registration grace: it marks down the brokers held
// live (at the takeover, or when their lease ran out during the grace)
// that have not registered since.
func (s *Server) endGrace() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.mu.leader || s.mu.closed {
		return
	}
	s.mu.graceUntil = time.Time{}
	if ids := s.mu.st.endHeld(); len(ids) > 0 {
		s.log.Warn("brokers live at the takeover did not register again; marked down", "nodes", ids, "grace", s.registrationGrace())
		s.commitLocked("not registered since the takeover: " + strings.Join(ids, ","))
	}
}

// resign gives up the leadership, so that the next ctl in line takes over
// at once instead of when this one's session lease runs out. It waits no
// longer than that lease would take anyway (CtlTTL): without a quorum of
// etcd the write cannot succeed, and the lease ends the leadership all
// the same. While the ctl closes it waits a second at most: a whole
// control plane stopped at once has no quorum left, and the wait would
// only hold up the exit.
func (s *Server) resign(el *concurrency.Election) {
	wait := min(s.cfg.CtlTTL, s.store.timeout)
	if s.ctx.Err() != nil {
		wait = min(wait, time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := el.Resign(ctx); err != nil {
		s.log.Debug("ctl resign failed; the election key goes with the session lease", "err", err)
	}
}

// election is the election session of the campaign under way, for
// announce. Its mutex is held across the etcd writes of announceLocked.
type election struct {
	sync.Mutex
	sess *concurrency.Session
	el   *concurrency.Election
	won  bool
}

// info is this ctl's ctl/ entry and election value.
func (s *Server) info() string {
	b, _ := json.Marshal(ctlInfo{Name: s.name(), ID: s.regToken, Addr: s.advertise(), Etcd: s.etcd.clientURL, Features: transport.Features()})
	return string(b)
}

// announce republishes this ctl's address (once Start knows it) in its
// ctl/ entry, and as the election value if it leads.
func (s *Server) announce() {
	s.el.Lock()
	defer s.el.Unlock()
	if err := s.announceLocked(); err != nil {
		s.log.Warn("could not publish this ctl's address in etcd", "err", err)
	}
}

func (s *Server) announceLocked() error {
	if s.el.sess == nil {
		return nil // the next campaign announces it
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.store.timeout)
	defer cancel()
	info := s.info()
	if _, err := s.store.cli.Put(ctx, s.store.ctlKey(s.name()), info, clientv3.WithLease(s.el.sess.Lease())); err != nil {
		return err
	}
	if s.el.won {
		return s.el.el.Proclaim(ctx, info)
	}
	return nil
}

// takeOver makes this ctl the leader: under the lock, it fences the
// store with its election key, reads the state and the broker leases,
// brings the members' liveness up to date and commits that.
//
// A member Live in the stored map whose lease is gone is held Live, and
// returned in held: when every ctl was down for longer than a lease, no
// ctl could renew the brokers' leases, and they ran out while the brokers
// served on with their last map. Marking them down now would refuse their
// publishes until they register again; instead they get
// registrationGrace to do so (campaign then calls endGrace). A lease that
// runs out within that grace is held likewise (applyLive): etcd restarted
// with the ctls renews its leases for one TTL, which can end before the
// broker's backoff brings it back. A broker that died meanwhile is down
// that much later, as if its lease had been that much longer.
func (s *Server) takeOver(el *concurrency.Election) (held []string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return nil, errors.New("closed")
	}
	s.store.fenceWith(el, writerRecord{Name: s.name(), ID: s.regToken, Election: el.Key()})
	snap, err := s.store.load(s.ctx)
	if err != nil {
		s.store.unfence()
		return nil, err
	}
	live, _, err := s.store.readLive(s.ctx)
	if err != nil {
		s.store.unfence()
		return nil, err
	}
	if snap.ClusterID == "" {
		// A new cluster, or one stored by a version without IDs: its ID
		// is made here, once, and committed with the save below (a
		// leader that loses the race to commit loses its ID with it).
		snap.ClusterID = newClusterID()
		s.log.Info("the cluster has no ID yet: made one", "cluster_id", snap.ClusterID)
	}
	st := newState(snap, s.cfg.Superusers)
	st.stateLimits = s.limits()
	for _, e := range live {
		if _, err := st.registerLive(e); err != nil {
			s.log.Warn("ignoring a malformed broker lease", "node", e.node.ID, "err", err)
		}
	}
	for _, n := range snap.Members {
		if _, ok := live[n.ID]; !ok && n.Live && st.holdLive(n.ID) {
			held = append(held, n.ID)
		}
	}
	if err := s.store.save(s.ctx, st.snapshot()); err != nil {
		s.store.unfence()
		return nil, err
	}
	s.mu.st = st
	s.mu.leader = true
	s.stats.leaderChanges.Add(1)
	s.publishLocked("leader elected")
	s.mu.graceUntil = time.Now().Add(s.registrationGrace())
	s.log.Info("ctl is the leader", "name", s.name(), "epoch", st.epoch, "live", st.liveIDs())
	return held, nil
}

// stepDown makes this ctl a follower.
func (s *Server) stepDown(why string) {
	s.mu.Lock()
	was := s.mu.leader
	s.mu.leader = false
	s.mu.graceUntil = time.Time{}
	s.mu.unsaved = "" // the next leader re-reads the broker leases
	s.store.unfence()
	s.mu.Unlock()
	select {
	case <-s.lost:
	default:
	}
	if was && s.ctx.Err() == nil {
		// The state may hold a change never committed: read etcd's,
		// rather than wait for the next leader's next change.
		s.followState(0)
	}
	if was {
		s.stats.leaderChanges.Add(1)
		level := slog.LevelWarn
		if s.ctx.Err() != nil {
			level = slog.LevelInfo // closing
		}
		s.log.Log(context.Background(), level, "ctl is no longer the leader", "name", s.name(), "why", why)
	}
}

// lostLeadership tells campaign a fenced write failed. s.mu is held.
func (s *Server) lostLeadershipLocked() {
	select {
	case s.lost <- struct{}{}:
	default:
	}
}

// watchLoop follows etcd: a follower adopts every new map the leader
// commits and pushes it to its brokers; the leader turns the broker
// leases (live/) into liveness changes. A broken watch is re-established
// after a full read. A watch etcd cancels for want of a leader, or a full
// read that fails, tells this ctl it is cut off from etcd (markCutOff: it
// hands its brokers over to other ctls); the next full read that
// succeeds, that it is not (see cutoff.go).
//
// The value a deletion of a live/ key deleted comes from the live/ keys
// this loop keeps (read at the watch's start revision, then following
// its events), not from the watch (WithPrevKV): etcd would read it on
// the server's watch goroutine, and an embedded etcd that is closing can
// close its backend under that read, a nil-pointer panic that takes the
// process down (etcd-io/etcd#17223, seen here in a ctl test).
func (s *Server) watchLoop(rev int64) {
	defer s.wg.Done()
	live, _, err := s.store.readLiveKeys(s.ctx, rev)
	if err != nil {
		live = nil // read again with the state below
	}
	for s.ctx.Err() == nil {
		if live == nil {
			r, keys, err := s.resync()
			if err != nil {
				if s.ctx.Err() != nil {
					return
				}
				s.log.Warn("etcd unreachable; holding the last map", "err", err)
				s.markCutOff(err)
				select {
				case <-time.After(100 * time.Millisecond):
				case <-s.ctx.Done():
				}
				continue
			}
			s.markReachable()
			rev, live = r, keys
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(s.ctx))
		wch := s.store.cli.Watch(wctx, s.store.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		for resp := range wch {
			if err := resp.Err(); err != nil {
				s.log.Warn("etcd watch failed; re-reading the state", "err", err)
				if errors.Is(err, rpctypes.ErrNoLeader) && s.ctx.Err() == nil {
					// etcd canceled it: its member has had no leader for
					// several election timeouts.
					s.markCutOff(err)
				}
				break
			}
			live.follow(s.store, resp.Events)
			if err := s.applyEvents(resp.Events); err != nil {
				// A follower that could not read what the leader
				// committed: the event is spent, and waiting for the next
				// left it on the old map (a revoked grant in force) until
				// another change came. Read the whole state again, as
				// after a broken watch, retrying until it can.
				s.log.Warn("could not read the new state from etcd; re-reading it", "err", err)
				live = nil
				break
			}
			rev = resp.Header.Revision
		}
		cancel()
		if s.ctx.Err() != nil {
			return
		}
		// Start over from the current state.
		select {
		case <-time.After(100 * time.Millisecond):
		case <-s.ctx.Done():
			return
		}
		live = nil
	}
}

// applyEvents handles one batch of watch events. It returns the error of
// a follower's read of the state the leader committed.
func (s *Server) applyEvents(evs []*clientv3.Event) error {
	epochRev := int64(0) // the last write of the epoch key in evs
	var lives []*clientv3.Event
	for _, ev := range evs {
		key := string(ev.Kv.Key)
		switch {
		case key == s.store.epochKey():
			epochRev = ev.Kv.ModRevision
		case strings.HasPrefix(key, s.store.livePrefix()):
			lives = append(lives, ev)
		}
	}
	if len(lives) > 0 {
		s.applyLive(lives)
	}
	if epochRev != 0 {
		return s.followState(epochRev)
	}
	return nil
}

// applyLive applies broker lease events on the leader: a put registers
// (or updates) the node, a delete ends its registration, which marks it
// down.
func (s *Server) applyLive(evs []*clientv3.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.mu.leader || s.mu.closed {
		return
	}
	changed := false
	var reasons []string
	for _, ev := range evs {
		if ev.Type == mvccpb.PUT {
			e, ok := parseLive(s.store, ev.Kv.Key, ev.Kv.Value, ev.Kv.CreateRevision)
			if !ok {
				continue
			}
			c, err := s.mu.st.registerLive(e)
			if err == nil && c {
				changed = true
				reasons = append(reasons, "node live "+e.node.ID)
			}
			continue
		}
		if ev.PrevKv == nil {
			continue
		}
		e, ok := parseLive(s.store, ev.PrevKv.Key, ev.PrevKv.Value, ev.PrevKv.CreateRevision)
		if !ok {
			continue
		}
		if time.Now().Before(s.mu.graceUntil) && s.leaseGone(e.lease) && s.mu.st.hold(e.node.ID, e.session) {
			s.stats.leaseExpiries.Add(1)
			s.log.Warn("broker lease expired during the takeover's registration grace; kept live until it registers again",
				"node", e.node.ID, "ttl", s.cfg.LeaseTTL, "grace_until", s.mu.graceUntil.Format(time.RFC3339Nano))
			continue
		}
		if s.mu.st.end(e.node.ID, e.session) {
			changed = true
			why := "node down " + e.node.ID
			if s.leaseGone(e.lease) {
				s.stats.leaseExpiries.Add(1)
				why = "lease expired " + e.node.ID
				s.log.Warn("broker lease expired", "node", e.node.ID, "ttl", s.cfg.LeaseTTL)
			}
			reasons = append(reasons, why)
		}
	}
	if changed {
		s.commitLocked(strings.Join(reasons, ", "))
	}
}

// leaseGone reports whether an etcd lease no longer exists: its key was
// deleted by expiry, not by the end of a registration (which leaves the
// lease to run out on its own).
func (s *Server) leaseGone(id int64) bool {
	ctx, cancel := context.WithTimeout(s.ctx, s.store.timeout)
	defer cancel()
	resp, err := s.store.cli.TimeToLive(ctx, clientv3.LeaseID(id))
	return err == nil && resp.TTL == -1 // etcd answers -1 for a lease it does not have; a live one under a second has 0
}

// followState makes a follower adopt the state the leader committed,
// told that the epoch key was written at revision rev.
//
// On the leader, a write of it that this ctl's store did not make or
// adopt is one it gave up on (store.giveUp) that landed after all: the
// leader's state misses that change, and its brokers' map with it, until
// the next save fails on it. It steps down at once instead; the next
// leader reads the state from etcd.
//
// A follower reads etcd without s.mu held (a read can take the store's
// timeout while etcd is cut off, and registrations, heartbeats and admin
// requests take s.mu), then adopts what it read unless this ctl became
// the leader meanwhile (its takeover read its own) or adopted a newer
// read. It returns the read's error.
func (s *Server) followState(rev int64) error {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return nil
	}
	if s.mu.leader {
		if s.store.doubt && rev > s.store.rev {
			s.log.Warn("a change given up on was committed after all; stepping down to read the state again", "revision", rev)
			s.lostLeadershipLocked()
		}
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	return s.adoptCommitted(false)
}

// adoptCommitted makes a follower adopt the state etcd holds: read
// without s.mu held, adopted unless this ctl became the leader meanwhile
// (its takeover read its own) or, unless anyRev, adopted a newer read.
// (A full re-read after a broken watch takes whatever etcd holds, at a
// lower revision too: an etcd restored from a backup.)
func (s *Server) adoptCommitted(anyRev bool) error {
	snap, srev, err := s.store.read(s.ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed || s.mu.leader || srev < s.store.rev && !anyRev {
		return nil
	}
	s.store.adopt(snap, srev)
	s.adoptLocked(snap)
	return nil
}

// adoptLocked makes snap, as committed by the leader, this follower's
// state, and its map current if it is newer than the map pushed last. The
// state is compared with that map, not with itself: a ctl that led may
// hold a change it never committed, at the epoch the next leader commits
// another. s.mu is held.
func (s *Server) adoptLocked(snap snapshot) {
	cur := s.Map().Epoch
	if snap.Epoch < cur || snap.Epoch == cur && cur != 0 && s.mu.st.epoch == cur {
		return
	}
	s.mu.st = restoreState(snap, s.cfg.Superusers, s.limits())
	if snap.Epoch > cur || cur == 0 {
		s.publishLocked("map from the leader")
	}
}

// resync re-reads the whole state after a broken watch and returns the
// revision to watch from, with the live/ keys as of it. The leader
// re-applies every broker lease.
func (s *Server) resync() (int64, liveKeys, error) {
	keys, rev, err := s.store.readLiveKeys(s.ctx, 0)
	if err != nil {
		return 0, nil, err
	}
	live := keys.entries(s.store)
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return rev, keys, nil
	}
	if !s.mu.leader {
		s.mu.Unlock()
		if err := s.adoptCommitted(true); err != nil {
			return 0, nil, err
		}
		return rev, keys, nil
	}
	defer s.mu.Unlock()
	changed := false
	for _, e := range live {
		if c, err := s.mu.st.registerLive(e); err == nil && c {
			changed = true
		}
	}
	for _, n := range s.mu.st.Map().Nodes {
		if _, ok := live[n.ID]; !ok && n.Live {
			m := s.mu.st.members[n.ID]
			if s.mu.st.end(n.ID, m.session) {
				changed = true
			}
		}
	}
	if changed {
		s.commitLocked("broker leases re-read")
	}
	return rev, keys, nil
}

// restoreState is a follower's core: the state as the leader committed
// it, members Live as stored, epoch as stored, and the leader's
// superusers; superusers, this ctl's own, only where the state records
// none. So every ctl pushes the same map at an epoch, even while their
// configurations differ (a rolling change of --superuser): the leader's
// configuration is the cluster's.
func restoreState(snap snapshot, superusers []string, limits stateLimits) *state {
	if snap.Superusers != nil {
		superusers = snap.Superusers
	}
	st := newState(snap, superusers)
	st.epoch = snap.Epoch
	st.stateLimits = limits
	for _, n := range snap.Members {
		st.members[n.ID].node.Live = n.Live
	}
	st.rebuild()
	return st
}

// ctlsWithout returns the names of the running ctls (those with an entry
// under ctl/, which lives as long as the ctl's election session) whose
// entry does not advertise feature, sorted: ctls of an earlier version.
// An entry that does not parse counts as one of them.
func (s *Server) ctlsWithout(feature string) ([]string, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.store.timeout)
	defer cancel()
	resp, err := s.store.cli.Get(ctx, s.store.ctlPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read the control plane's members (%s): %w", s.store.ctlPrefix(), err)
	}
	var out []string
	for _, kv := range resp.Kvs {
		var info ctlInfo
		if json.Unmarshal(kv.Value, &info) != nil || !slices.Contains(info.Features, feature) {
			out = append(out, strings.TrimPrefix(string(kv.Key), s.store.ctlPrefix()))
		}
	}
	slices.Sort(out)
	return out, nil
}

// leaderInfo returns the elected leader's entry, if there is one.
func (s *Server) leaderInfo(ctx context.Context) (ctlInfo, bool) {
	ctx, cancel := context.WithTimeout(ctx, s.store.timeout)
	defer cancel()
	resp, err := s.store.cli.Get(ctx, s.store.electionPrefix()+"/", clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) == 0 {
		return ctlInfo{}, false
	}
	var info ctlInfo
	if json.Unmarshal(resp.Kvs[0].Value, &info) != nil {
		return ctlInfo{}, false
	}
	return info, true
}

// newClusterID returns a new cluster ID: 128 random bits in base32.
func newClusterID() string { return crand.Text() }
