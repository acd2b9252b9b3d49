package broker

import (
	"context"
	"sync"

	"github.com/quic-go/quic-go"
)

// connKind is what a QUIC connection of the broker carries.
type connKind int

const (
	kindClient connKind = iota // a client's, accepted
	kindPeer                   // another broker's: accepted, or dialed by the peer pool
	connKinds
)

// quicTotals is what connections of one kind sent, and how much of it
// quic-go declared lost (never acknowledged in time, sent again).
// open is how many are open (totals only): felix_connections{type},
// accepted and dialed alike.
type quicTotals struct{ sent, lost, open uint64 }

func (t *quicTotals) add(st quic.ConnectionStats) {
	t.sent += st.PacketsSent
	t.lost += st.PacketsLost
}

// quicAccount sums quic-go's accounting of the broker's connections by
// kind, for felix_quic_packets_{sent,lost}_total: the live connections
// are read when the metrics are collected, and a connection that ends
// leaves its last counts in ended, so the sums never go back.
//
// What it holds is one entry per live connection, which the broker's
// connection limits bound (an accepted connection is watched only once
// admitted and tracked), and one AfterFunc registration each, released
// when the connection ends; nothing per record or per stream.
//
// Lost packets on loopback or a LAN mean a receiver that stopped reading
// for a while (quic-go drops what arrives for a connection 256 packets
// behind): a client, or a peer broker, too busy to keep up.
type quicAccount struct {
	mu    sync.Mutex
	live  map[*quic.Conn]connKind
	ended [connKinds]quicTotals
}

// watch counts conn as kind from now until it ends. The hook that moves
// its counts to ended runs on a goroutine of context.AfterFunc's once
// the connection's context is done, and returns at once.
func (a *quicAccount) watch(conn *quic.Conn, kind connKind) {
	a.mu.Lock()
	if a.live == nil {
		a.live = map[*quic.Conn]connKind{}
	}
	a.live[conn] = kind
	a.mu.Unlock()
	context.AfterFunc(conn.Context(), func() {
		st := conn.ConnectionStats()
		a.mu.Lock()
		delete(a.live, conn)
		a.ended[kind].add(st)
		a.mu.Unlock()
	})
}

// totals returns the sums by kind, ended and live connections together.
func (a *quicAccount) totals() [connKinds]quicTotals {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := a.ended
	for conn, kind := range a.live {
		out[kind].add(conn.ConnectionStats())
		out[kind].open++
	}
	return out
}
