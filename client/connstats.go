package client

import (
	"slices"
	"strings"
	"time"

	"github.com/quic-go/quic-go"
)

// ConnStats is what the client's QUIC connection to one broker has seen,
// by quic-go's own accounting. The counters add up every connection the
// client made to the broker (a redial starts a new one); the RTTs and the
// congestion window are the current connection's, zero while there is
// none.
//
// PacketsLost counts packets this client sent that quic-go declared lost
// (never acknowledged in time) and sent again. On loopback or a LAN that
// is rarely the network: a QUIC connection whose goroutine falls 256
// packets behind drops what comes next (quic-go's receive queue), so lost
// packets say a broker, or this process, stopped reading for a while.
// Each loss also shrinks the congestion window, which can hold the
// client's next packets back.
type ConnStats struct {
	Broker    string // the broker's address
	Connected bool   // a connection is up now
	Dials     int    // connections established to the broker

	SmoothedRTT      time.Duration
	MinRTT           time.Duration
	LatestRTT        time.Duration
	CongestionWindow uint64 // bytes

	PacketsSent, PacketsReceived, PacketsLost uint64
	BytesSent, BytesReceived, BytesLost       uint64
}

// ConnStats returns the stats of the client's connections to each broker
// it has used, sorted by address: its own connection's, with the counters
// and dials of the connections its subscriptions read over (each has its
// own, see [Subscription]) added. It never blocks on the network.
func (c *Client) ConnStats() []ConnStats {
	c.mu.Lock()
	conns := make([]*brokerConn, 0, len(c.mu.conns))
	for _, b := range c.mu.conns {
		conns = append(conns, b)
	}
	extra := make([]*brokerConn, 0, len(c.mu.extra))
	for b := range c.mu.extra {
		extra = append(extra, b)
	}
	byAddr := make(map[string]ConnStats, len(conns)+len(c.mu.retired))
	for addr, st := range c.mu.retired {
		byAddr[addr] = st
	}
	c.mu.Unlock()
	for _, b := range conns {
		st, past := b.stats(), byAddr[b.addr]
		st.Dials += past.Dials
		st.addCounters(past)
		byAddr[b.addr] = st
	}
	for _, b := range extra {
		st := b.stats()
		sum, ok := byAddr[b.addr]
		if !ok {
			sum.Broker = b.addr
		}
		sum.Dials += st.Dials
		sum.addCounters(st)
		if !sum.Connected && st.Connected {
			sum.Connected = true
			sum.SmoothedRTT, sum.MinRTT, sum.LatestRTT, sum.CongestionWindow = st.SmoothedRTT, st.MinRTT, st.LatestRTT, st.CongestionWindow
		}
		byAddr[b.addr] = sum
	}
	out := make([]ConnStats, 0, len(byAddr))
	for addr, st := range byAddr {
		st.Broker = addr
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b ConnStats) int { return strings.Compare(a.Broker, b.Broker) })
	return out
}

// stats returns b's ConnStats: its past connections' counters and its
// current connection's.
func (b *brokerConn) stats() ConnStats {
	b.mu.Lock()
	st, l := b.mu.past, b.mu.link
	st.Broker, st.Dials = b.addr, b.mu.dials
	b.mu.Unlock()
	var conn *quic.Conn
	if l != nil {
		conn = l.conn
	}
	if conn != nil && conn.Context().Err() == nil {
		q := conn.ConnectionStats()
		st.Connected = true
		st.SmoothedRTT, st.MinRTT, st.LatestRTT, st.CongestionWindow = q.SmoothedRTT, q.MinRTT, q.LatestRTT, q.CongestionWindow
		st.add(q)
	} else if conn != nil {
		st.add(conn.ConnectionStats()) // dead, not yet replaced
	}
	return st
}

// addCounters adds o's packet and byte counters to s's.
func (s *ConnStats) addCounters(o ConnStats) {
	s.PacketsSent += o.PacketsSent
	s.PacketsReceived += o.PacketsReceived
	s.PacketsLost += o.PacketsLost
	s.BytesSent += o.BytesSent
	s.BytesReceived += o.BytesReceived
	s.BytesLost += o.BytesLost
}

// add adds q's counters to s's.
func (s *ConnStats) add(q quic.ConnectionStats) {
	s.addCounters(ConnStats{PacketsSent: q.PacketsSent, PacketsReceived: q.PacketsReceived, PacketsLost: q.PacketsLost,
		BytesSent: q.BytesSent, BytesReceived: q.BytesReceived, BytesLost: q.BytesLost})
}
