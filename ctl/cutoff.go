package ctl

import (
	"fmt"
	"time"

	"github.com/felix-broker/felix/transport"
)

// A ctl cut off from etcd's quorum (its member partitioned from the
// others, or an external etcd out of reach) while its brokers still reach
// it can renew none of their leases: the leader, on the quorum's side,
// would see them expire and mark the brokers down for as long as the cut
// lasts, although they are up and another ctl could hold them. And the
// map it answers with is stale. So such a ctl lets go of its brokers:
//
//   - a registration whose lease has gone unrenewed for renewGrace, half
//     the lease etcd holds, is handed over (readHeartbeats): the broker
//     is told CodeUnavailable, moves to the next ctl of its list and
//     adopts its lease there before it runs out;
//   - once the ctl sees etcd out of reach as a whole (its watch canceled
//     for want of an etcd leader, or a full read of the state failing:
//     watchLoop), it hands over every registration at once, refuses new
//     ones, and answers map.get with CodeUnavailable rather than a map
//     that may be stale, until a full read succeeds again.
//
// One slow renewal moves no broker: only the time since the last one that
// succeeded does. A handed-over registration leaves its live/ key to the
// broker's next registration (or to its lease), as Close does.

// liveLeaseTTL is the lease etcd holds for a broker: Config.LeaseTTL in
// whole seconds, at least one.
func (s *Server) liveLeaseTTL() time.Duration {
	return time.Duration(leaseTTLSeconds(s.cfg.LeaseTTL)) * time.Second
}

// renewGrace is how long a registration's lease may go unrenewed before
// the registration is handed over to another ctl: half the lease, which
// leaves the other half for the broker to register there.
func (s *Server) renewGrace() time.Duration { return s.liveLeaseTTL() / 2 }

// markCutOff records that etcd is out of reach, since when, and hands
// every registration over to another ctl the first time.
func (s *Server) markCutOff(why error) {
	now := time.Now()
	if !s.cutOff.CompareAndSwap(0, now.UnixNano()) {
		return
	}
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return
	}
	n := len(s.mu.sessions)
	for _, ss := range s.mu.sessions {
		ss.handOver(transport.Errorf(transport.CodeUnavailable, "ctl %s cannot reach etcd: register with another ctl: %v", s.name(), why))
	}
	s.mu.Unlock()
	s.log.Warn("ctl cut off from etcd: its brokers' registrations handed over to other ctls, map.get refused until it reads etcd again",
		"brokers", n, "err", why)
}

// markReachable records that a full read of etcd succeeded.
func (s *Server) markReachable() {
	if since := s.cutOff.Swap(0); since != 0 {
		s.log.Info("ctl reaches etcd again", "cut_off_for", time.Since(time.Unix(0, since)).Round(time.Millisecond))
	}
}

// Readiness returns nil while the ctl reaches etcd (a readiness probe), or
// since when it has not: cut off, it holds no registration and answers no
// map (see cutOffErr).
func (s *Server) Readiness() error { return s.cutOffErr() }

// cutOffErr says since when etcd has been out of reach, or nil.
func (s *Server) cutOffErr() error {
	since := s.cutOff.Load()
	if since == 0 {
		return nil
	}
	return fmt.Errorf("ctl %s has not reached etcd for %v", s.name(), time.Since(time.Unix(0, since)).Round(time.Millisecond))
}
