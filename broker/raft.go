package broker

// # Raft messages between brokers
//
// The replicated shards this broker hosts (streams of replication factor
// 3, each shard a replica.Group) talk raft over the peer connections the
// publish path forwards on: one long-lived stream per pair of brokers,
// opened by the one whose node id sorts first and written both ways
// (raftPeer: a peer that does not write back, or has not opened its
// stream yet, is sent to on a stream of this broker's own), carrying
// transport.Raft frames, each the messages of one group's Ready for that
// peer, which the group's goroutine queues in quic-go's send buffer itself
// (raftPeer). Thousands of shards mean thousands of groups, but one stream
// and one goroutine (which opens the stream) per peer.
//
// A group's raft ids name their node by their slot: the node's index in
// the replica set sorted by node id (rejoin.go), until a move gives a
// slot to another node (moves.go), which the map says
// (shardmap.Placement.Slots). So every broker, and the same broker across
// restarts, maps ids to nodes alike with nothing stored but the map.
//
// The receiver checks that a frame's From is the node id of the peer's
// certificate, and that each message's raft From is that node's id in the
// group, before the group sees it: a broker can speak only for itself.
// The receiver hands each message to its group's Step as it reads it, so
// QUIC's flow control does not hold a peer back: the group bounds what
// waits for its goroutine (replica's Step drops a message past four
// times its in-flight bound, as a lost one), and raftQueueBytes what
// waits to be sent to one peer.
//
// A raft frame is taken up to raftFrameLimit, what a broker of the
// largest record limit (MaxPayloadCeiling) sends, whatever this broker's
// own limit: a follower does not choose the entries its leader commits,
// and a leader whose limit is larger (a rolling change of
// --max-record-bytes) sends entries larger than the follower's own. A
// limit derived from the follower's had it end the raft stream at such
// an entry, every time the leader sent it again, with the messages of
// every other group on the stream: the entry was never committed.
//
// One ticker (raftNet.runTicker) ticks every hosted group each
// Config.RaftTick. A busy group's heartbeats are one message per group per
// follower every third of the election timeout, batched into the frames
// to that follower. An idle group is quiet (replica's quiescence: no
// ticks, no heartbeats, nothing sent), and the liveness of its members is
// watched per pair of brokers instead: each raft stream carries an empty
// frame on every tick it is otherwise idle (keepAlive), so a broker hears
// each peer it shares groups with at least once a tick, whatever the
// number of groups. A peer not heard for an election timeout is silent:
// every hosted group it is a member of is woken and ticks again; a
// follower whose leader is there campaigns as soon as its raft would have
// had it never gone quiet (replica.Group.WakeSilent): the silence was an
// election timeout without a word from the leader. A silent peer heard
// again wakes them too (replica.Group.Wake), so that a restarted replica
// gets its leader's heartbeats at once.

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/felix-broker/felix/internal/logonce"
	"github.com/felix-broker/felix/replica"
	"github.com/felix-broker/felix/shardmap"
	"github.com/felix-broker/felix/transport"
)

const (
	// raftQueueBytes bounds the raft messages waiting for one peer; past
	// it messages are dropped (raft sends again what is lost).
	raftQueueBytes = 64 << 20
	// raftFrameLimit is the largest raft frame a broker takes from a
	// peer: four entries of a broker whose record limit is
	// MaxPayloadCeiling, and room for the messages' framing, whatever
	// this broker's own limit (see "Raft messages between brokers"). A
	// Reader grows its buffer only as a frame's bytes arrive.
	raftFrameLimit = 4*(MaxPayloadCeiling+entryFraming) + 64<<10
	// raftWriteTimeout bounds one write of a raft frame: a peer that does
	// not read is given up and its stream opened again.
	raftWriteTimeout = 5 * time.Second
	// raftRedial is the least time between two failed attempts to open
	// the raft stream to a peer; messages meanwhile are dropped.
	raftRedial = 200 * time.Millisecond
)

// raftNet owns the raft traffic of the groups this broker hosts: the
// registry of groups (by shard, for incoming messages), a raftPeer per
// peer (its stream) and the ticker. Its goroutines (ticker, retention
// pass, the peers' and their flushers) stop at close.
type raftNet struct {
	node    string
	tick    time.Duration
	batch   int  // message bytes after which a batch is sent as one frame
	simplex bool // one-way streams, as an earlier version's (Knobs.RaftSimplex)
	// handBack, if set, says whether a round of preferOwners runs
	// (Knobs.HandLeadersBack); set once by New.
	handBack func() bool
	// handBackPause is how long a leadership handed over by a replica is
	// not handed back to it (preferOwners): closeTakes.
	handBackPause time.Duration
	log           *slog.Logger
	peers         *peerPool
	mapOf         func() *shardmap.Map // the broker's current map, nil before Start
	// failed, called by the retention pass with a hosted group that has
	// failed (replica.ErrFailed) or lost its log (replica.ErrLogLost),
	// replaces it (shardSet.replaceFailed).
	// Set once before the first pass runs.
	failed func(id shardmap.ShardID, g *replica.Group)
	// toCtl sends a request to the control plane (settle, moves.go); set
	// once by New.
	toCtl func(context.Context, *transport.Request) (*transport.Response, error)
	// diskFull is the broker's free-space state (diskspace.go): while it
	// is set, entries peers send are not written (deliver). Set once by
	// New, before any message arrives.
	diskFull *atomic.Bool

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	bad    logonce.Set // peers that sent what they must not, logged once

	// silentAfter is how long a peer may go unheard before it is silent
	// (an election timeout); heard is when each peer's last raft frame
	// came (nanoseconds since start, on the monotonic clock), silent the
	// peers the ticker last found silent (ticker only).
	start       time.Time
	silentAfter time.Duration
	heard       sync.Map // node id → *atomic.Int64
	silent      map[string]bool
	// since is when the ticker first found each peer among its groups'
	// members (as heard): a peer is given an election timeout to
	// be heard from first. silences counts the peers found silent.
	since    map[string]int64
	silences atomic.Uint64
	// diskRefusals counts the messages deliver left unwritten while the
	// disk was nearly full.
	diskRefusals atomic.Uint64

	mu struct {
		sync.RWMutex
		closed bool
		groups map[shardmap.ShardID]*raftMember
		peers  map[string]*raftPeer
		// downAt is, per broker, when a map applied last showed it
		// down (noteDown): one that handed a leadership over and has
		// been down since has restarted, and may have it back.
		downAt map[string]time.Time
		// served is, per peer, the raft stream it opened that this
		// broker reads (serveRaft): one at a time, each reading a frame
		// of up to raftFrameLimit.
		served map[string]*quic.Stream
	}
}

// raftMember is a hosted group and its raft slots and preferred leader
// (moves.go). stop is closed when it is unregistered (it ends a join).
type raftMember struct {
	id    shardmap.ShardID
	g     *replica.Group
	slots *raftSlots
	move  uint64 // the move that brought the replica here, 0 if none (moves.go)
	stop  chan struct{}
}

func newRaftNet(node string, tick time.Duration, electionTicks, entryBytes int, simplex bool, handBackPause time.Duration, peers *peerPool, mapOf func() *shardmap.Map, log *slog.Logger) *raftNet {
	n := &raftNet{node: node, tick: tick, batch: entryBytes, simplex: simplex, handBackPause: handBackPause,
		peers: peers, mapOf: mapOf, log: log,
		start: time.Now(), silentAfter: time.Duration(electionTicks) * tick, silent: map[string]bool{}, since: map[string]int64{}}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.mu.groups = map[shardmap.ShardID]*raftMember{}
	n.mu.peers = map[string]*raftPeer{}
	n.mu.downAt = map[string]time.Time{}
	n.mu.served = map[string]*quic.Stream{}
	n.wg.Add(1)
	go n.runTicker()
	return n
}

// transport returns the replica.Transport of the group of shard id,
// whose raft slots are slots.
func (n *raftNet) transport(id shardmap.ShardID, slots *raftSlots) replica.Transport {
	return &groupTransport{n: n, stream: id.Stream, shard: int32(id.Shard), slots: slots}
}

// register makes incoming messages for shard id reach g, and has the
// ticker hand g's leadership back to the slots' owner when it can. A
// replica that replaces a lost one, or a moved one (join), gets a
// goroutine that asks to be admitted.
func (n *raftNet) register(id shardmap.ShardID, g *replica.Group, slots *raftSlots, move uint64, join bool) {
	gm := &raftMember{id: id, g: g, slots: slots, move: move, stop: make(chan struct{})}
	n.mu.Lock()
	defer n.mu.Unlock()
	if old := n.mu.groups[id]; old != nil {
		close(old.stop)
	}
	n.mu.groups[id] = gm
	if join && !n.mu.closed {
		n.wg.Add(1)
		go n.join(id, gm)
	}
}

// unregister stops delivering to g (if it is still the group of id).
func (n *raftNet) unregister(id shardmap.ShardID, g *replica.Group) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if m := n.mu.groups[id]; m != nil && m.g == g {
		close(m.stop)
		delete(n.mu.groups, id)
	}
}

// member returns the hosted group of shard id, nil if none.
func (n *raftNet) member(id shardmap.ShardID) *raftMember {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.mu.groups[id]
}

// voting reports whether this broker's replica of id is open, working,
// and a voter of its group in its own slot.
func (n *raftNet) voting(id shardmap.ShardID) bool {
	gm := n.member(id)
	return gm != nil && gm.g.Err() == nil && gm.g.Lost() == nil && membership(gm.g) == replica.Voter
}

// preferEvery is the ticks between two looks for hosted groups this
// broker leads although their owner (the preferred leader) is live: 5 s
// with the default tick.
const preferEvery = 50

// runTicker ticks every hosted group each tick (a quiet group ignores
// it), keeps the raft streams to the peers it shares groups with alive,
// wakes the groups of peers that fell silent or came back, and every
// preferEvery ticks hands leaderships back to their owners.
func (n *raftNet) runTicker() {
	defer n.wg.Done()
	t := time.NewTicker(n.tick)
	defer t.Stop()
	var gs []*raftMember
	for ticks := 1; ; ticks++ {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		if ticks%preferEvery == 0 && (n.handBack == nil || n.handBack()) {
			n.preferOwners()
		}
		gs = n.members(gs[:0])
		for _, m := range gs {
			m.g.Tick()
		}
		n.watchPeers(gs)
		clear(gs)
	}
}

// members appends the hosted groups to dst.
func (n *raftNet) members(dst []*raftMember) []*raftMember {
	n.mu.RLock()
	defer n.mu.RUnlock()
	for _, m := range n.mu.groups {
		dst = append(dst, m)
	}
	return dst
}

// retentionWait bounds the wait for one group in a retention pass.
const retentionWait = 10 * time.Second

// startRetention starts the retention pass over the hosted groups every
// interval (runRetention), which also hands each failed group to failed.
func (n *raftNet) startRetention(every time.Duration, failed func(shardmap.ShardID, *replica.Group)) {
	n.failed = failed
	n.wg.Add(1)
	go n.runRetention(every)
}

// runRetention applies each hosted group's retention (replica.Group.
// EnforceRetention: a no-op for a stream without limits) every interval,
// one group at a time: a pass is a round of each group's goroutine, and a
// quiet group stays quiet. A group whose goroutine does not take the pass
// within retentionWait (stuck in a write) is left for the next pass, so
// that it holds up no other. A replica that stopped is skipped, as it has
// been logged already.
func (n *raftNet) runRetention(every time.Duration) {
	defer n.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	var gs []*raftMember
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		gs = n.members(gs[:0])
		for _, m := range gs {
			// A replica whose log was lost under it (Group.Lost) never
			// catches up under its raft id: it is replaced as a failed
			// one is, by a new one that joins.
			if err := m.g.Err(); errors.Is(err, replica.ErrFailed) || m.g.Lost() != nil {
				n.failed(m.id, m.g)
				continue
			}
			ctx, cancel := context.WithTimeout(n.ctx, retentionWait)
			dropped, err := m.g.EnforceRetention(ctx, time.Now())
			cancel()
			switch {
			case n.ctx.Err() != nil:
				return
			case errors.Is(err, replica.ErrFailed):
				n.failed(m.id, m.g)
			case err != nil && !errors.Is(err, replica.ErrClosed):
				n.log.Warn("retention pass on a replica failed; the next pass tries again", "err", err)
			case dropped > 0:
				n.log.Debug("retention dropped records from a replica", "records", dropped, "first_offset", m.g.FirstOffset())
			}
		}
		clear(gs)
	}
}

// watchPeers, once a tick: keeps alive the raft stream to every peer
// that is a member of a group of gs, and wakes the groups of each peer
// that fell silent or was heard again since the last tick.
func (n *raftNet) watchPeers(gs []*raftMember) {
	now := n.now()
	changed := map[string]bool{}
	for _, m := range gs {
		for _, node := range m.slots.nodes() {
			if node == n.node {
				continue
			}
			if _, seen := changed[node]; seen {
				continue
			}
			n.peer(node).keepAlive()
			if _, known := n.since[node]; !known {
				n.since[node] = now
			}
			silent := now-max(n.lastHeard(node), n.since[node]) > int64(n.silentAfter)
			changed[node] = silent != n.silent[node]
			n.silent[node] = silent
		}
	}
	n.prune(changed) // every member, changed or not
	for node, ok := range changed {
		if !ok {
			delete(changed, node)
		}
	}
	if len(changed) == 0 {
		return
	}
	woken := 0
	for _, m := range gs {
		for _, node := range m.slots.nodes() {
			if !changed[node] {
				continue
			}
			if n.silent[node] {
				m.g.WakeSilent(memberAt(m.g, slotOf(m.slots.idOf(node))))
			} else {
				m.g.Wake()
			}
			woken++
			break
		}
	}
	for node := range changed {
		if n.silent[node] {
			n.silences.Add(1)
			n.log.Warn("raft peer silent for an election timeout: its groups here tick again, and elect another leader where it led", "peer", node, "silent_for", n.silentAfter, "groups_woken", woken)
		} else {
			n.log.Info("raft peer heard again: its groups here tick again", "peer", node, "groups_woken", woken)
		}
	}
}

// prune ends the sender of each peer that is neither a member of a
// hosted group (members, every one the ticker found) nor a node of the
// current map, unless it writes on a stream the peer opened (the peer
// talks to this broker: a map that lags), and forgets what the ticker
// kept of it. A group that sends to it again starts another.
func (n *raftNet) prune(members map[string]bool) {
	m := n.mapOf()
	if m == nil {
		return
	}
	var gone []string
	n.mu.RLock()
	for node := range n.mu.peers {
		if _, member := members[node]; !member {
			if _, ok := m.Node(node); !ok {
				gone = append(gone, node)
			}
		}
	}
	n.mu.RUnlock()
	if len(gone) == 0 {
		return // every tick, the usual case: the read lock only
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, node := range gone {
		p := n.mu.peers[node]
		if p == nil {
			continue
		}
		p.mu.Lock()
		adopted := p.mu.w != nil && p.mu.adopted
		p.mu.Unlock()
		if adopted {
			continue
		}
		delete(n.mu.peers, node)
		close(p.stop)
		delete(n.since, node)
		delete(n.silent, node)
		n.heard.Delete(node)
	}
}

// groupStates counts the hosted groups that are quiet and the others.
func (n *raftNet) groupStates() (quiet, active int) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	for _, m := range n.mu.groups {
		if m.g.Quiesced() {
			quiet++
		} else {
			active++
		}
	}
	return quiet, active
}

// heardFrom notes that a raft frame came from peer now.
func (n *raftNet) heardFrom(peer string) {
	v, ok := n.heard.Load(peer)
	if !ok {
		v, _ = n.heard.LoadOrStore(peer, new(atomic.Int64))
	}
	v.(*atomic.Int64).Store(n.now())
}

// now is the time since the raftNet started, in nanoseconds (monotonic).
func (n *raftNet) now() int64 { return int64(time.Since(n.start)) }

// lastHeard returns when peer's last raft frame came (as now), 0 if none
// has.
func (n *raftNet) lastHeard(peer string) int64 {
	if v, ok := n.heard.Load(peer); ok {
		return v.(*atomic.Int64).Load()
	}
	return 0
}

// preferOwners asks each hosted group this broker leads, and whose owner
// is another broker live in the map, to hand the leadership back to it:
// after a failover the leaders would otherwise stay where they moved, and
// a broker that restarts would lead nothing. The group hands it over only
// to an owner that answers and has every committed entry, and not to an
// owner that handed it this leadership less than handBackPause ago: that
// one resigned because it is closing (Broker.Close), still live in the
// map while it drains, and a leadership handed back bounced between
// them, each time leaving the closing broker leader for a moment, which
// refused what it was forwarded. An owner a map has shown down since it
// handed the leadership over (it closed and started again) has it back
// at once.
func (n *raftNet) preferOwners() {
	m := n.mapOf()
	if m == nil {
		return
	}
	type move struct {
		gm     *raftMember
		downAt time.Time // when a map last showed the owner down
	}
	var moves []move
	n.mu.RLock()
	for _, gm := range n.mu.groups {
		if owner := gm.slots.owner(); owner != n.node && gm.g.IsLeader() && live(m, owner) {
			moves = append(moves, move{gm, n.mu.downAt[owner]})
		}
	}
	n.mu.RUnlock()
	for _, mv := range moves {
		// The voter in the owner's slot: a transfer to one that does not
		// answer or lags (a moved replica not yet replaced) does nothing.
		gm := mv.gm
		to := memberAt(gm.g, slotOf(gm.slots.idOf(gm.slots.owner())))
		if to == 0 {
			continue
		}
		if by, at := gm.g.HandedOverBy(); by == to && time.Since(at) < n.handBackPause && !mv.downAt.After(at) {
			continue // it resigned, closing, and has not been down since
		}
		gm.g.TransferLeadership(to)
	}
}

// noteDown records when m, being applied, shows brokers down (see
// preferOwners).
func (n *raftNet) noteDown(m *shardmap.Map) {
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, node := range m.Nodes {
		if !node.Live {
			n.mu.downAt[node.ID] = now
		}
	}
}

// resign asks every hosted group to give its leadership away for good
// (replica.Group.Resign: to the voter that answers and holds the most of
// the log), as a broker that shuts down does before it drains, so that
// the other replicas take over at once instead of waiting out an
// election timeout of silence. It waits, for all groups at once and for
// at most wait, until none leads or has a voter to hand over to, and
// returns how many still lead.
func (n *raftNet) resign(wait time.Duration) (leading int) {
	gs := n.members(nil)
	if len(gs) == 0 {
		return 0
	}
	timeout := time.NewTimer(wait)
	defer timeout.Stop()
	resigned := make([]<-chan struct{}, len(gs))
	for i, m := range gs {
		resigned[i] = m.g.Resign()
	}
	for i, ch := range resigned {
		select {
		case <-ch:
		case <-timeout.C:
			for _, m := range gs[i:] {
				if m.g.IsLeader() {
					leading++
				}
			}
			return leading
		}
	}
	return 0
}

// groupTransport is one group's replica.Transport: it marshals each
// message and writes it on its peer's raft stream (raftPeer.send).
type groupTransport struct {
	n      *raftNet
	stream string
	shard  int32
	slots  *raftSlots
}

func (t *groupTransport) Send(msgs []*pb.Message) {
	// A replica set has two other members: a Ready's messages go to at
	// most two peers, each written as one run of frames, in order.
	var to [2]struct {
		node string
		msgs []transport.RaftMsg
	}
	for _, m := range msgs {
		node := t.slots.nodeOf(m.GetTo())
		if node == "" || node == t.n.node {
			continue
		}
		data, err := proto.Marshal(m)
		if err != nil {
			t.n.log.Error("raft message not encodable; dropped", "shard", t.stream, "err", err)
			continue
		}
		rm := transport.RaftMsg{Stream: t.stream, Shard: t.shard, Data: data}
		i := 0
		for i < len(to) && to[i].node != "" && to[i].node != node {
			i++
		}
		if i == len(to) { // a third peer, which a replica set never has
			t.n.send(node, []transport.RaftMsg{rm})
			continue
		}
		to[i].node = node
		to[i].msgs = append(to[i].msgs, rm)
	}
	for _, p := range to {
		if p.node != "" {
			t.n.send(p.node, p.msgs)
		}
	}
}

// send writes msgs on node's raft stream, or queues them. It never blocks
// on the network.
func (n *raftNet) send(node string, msgs []transport.RaftMsg) {
	if p := n.peer(node); p != nil {
		p.send(msgs)
	}
}

// peer returns node's sender, starting it if need be; nil once closed.
func (n *raftNet) peer(node string) *raftPeer {
	n.mu.RLock()
	p := n.mu.peers[node]
	closed := n.mu.closed
	n.mu.RUnlock()
	if closed {
		return nil
	}
	if p == nil {
		n.mu.Lock()
		defer n.mu.Unlock()
		if n.mu.closed {
			return nil
		}
		if p = n.mu.peers[node]; p == nil {
			p = &raftPeer{n: n, id: node, wake: make(chan struct{}, 1), stop: make(chan struct{})}
			n.mu.peers[node] = p
			n.wg.Add(1)
			go p.run()
		}
	}
	return p
}

// deliver hands a message a peer sent to its group, after checking that
// the peer speaks for itself. A message for a group not hosted here (not
// yet opened, or closed) is dropped: raft sends it again.
func (n *raftNet) deliver(peer string, rm *transport.RaftMsg) {
	id := shardmap.ShardID{Stream: rm.Stream, Shard: int(rm.Shard)}
	gm := n.member(id)
	if gm == nil {
		return
	}
	m := &pb.Message{}
	if err := proto.Unmarshal(rm.Data, m); err != nil {
		n.refuse(peer, "undecodable raft message", id, err)
		return
	}
	if gm.slots.nodeOf(m.GetFrom()) != peer {
		n.refuse(peer, "raft message in another node's name", id, nil)
		return
	}
	if m.GetTo() != gm.g.ID() {
		// For the replica this one replaced (rejoin.go), which the
		// sender's configuration still holds: nobody is there to get it.
		return
	}
	if n.diskFull != nil && n.diskFull.Load() && writesLog(m) {
		// This broker's disk is nearly full: leave the entries unwritten,
		// as if the message were lost (raft allows any message to be).
		// The group commits with its other replicas; the leader sends
		// them again (its heartbeats find this replica behind) once the
		// disk has room, and this replica catches up. Writing them would
		// fail the replica on a full disk, and its replacement with it.
		n.diskRefusals.Add(1)
		return
	}
	if err := gm.g.Step(m); err != nil {
		n.refuse(peer, "raft message refused by its group", id, err)
	}
}

// writesLog reports whether m, stepped into a follower, makes it write to
// its log: entries to append, or a snapshot to install.
func writesLog(m *pb.Message) bool {
	switch m.GetType() {
	case pb.MsgApp:
		return len(m.GetEntries()) > 0
	case pb.MsgSnap:
		return true
	}
	return false
}

func (n *raftNet) refuse(peer, what string, id shardmap.ShardID, err error) {
	if n.bad.First(peer + "\x00" + what) {
		n.log.Warn(what+" (logged once per peer)", "peer", peer, "shard", id.String(), "err", err)
	}
}

// close stops the ticker and the senders and waits for them; nothing is
// sent afterwards.
func (n *raftNet) close() {
	n.mu.Lock()
	n.mu.closed = true
	n.mu.Unlock()
	n.cancel()
	n.wg.Wait()
}

// serveRaft reads the raft stream a peer opened, first being its first
// frame, and delivers the messages until the stream ends. A duplex stream
// from a peer whose node id sorts before this broker's carries this
// broker's messages to it too, while it lasts (raftPeer.adopt).
func (b *Broker) serveRaft(s *quic.Stream, r *transport.Reader, first *transport.Raft, from caller) {
	if from.peerID == "" {
		b.refuse(s, transport.Errorf(transport.CodeUnauthorized, "raft messages come from brokers only"))
		return
	}
	if first.From != from.peerID {
		// Refused before it replaces the peer's stream (serve).
		b.refuse(s, impersonation(from.peerID, first.From))
		return
	}
	r.SetMaxFrame(raftFrameLimit)
	b.raft.serve(from.peerID, s)
	defer b.raft.served(from.peerID, s)
	var p *raftPeer
	var back *frameWriter
	if first.Duplex && !b.raft.simplex && first.From == from.peerID && from.peerID < b.raft.node {
		if p = b.raft.peer(from.peerID); p != nil {
			back = p.adopt(s)
		}
	}
	err := b.raft.receive(from.peerID, r, first)
	if back != nil {
		p.release(back)
	}
	if err != nil {
		b.refuse(s, err)
		return
	}
	s.CancelRead(0)
	s.Close()
}

// impersonation is the error for raft messages peer sent in another's
// name.
func impersonation(peer, as string) error {
	return transport.Errorf(transport.CodeUnauthorized, "peer %q sent raft messages as %q: a broker speaks for itself only", peer, as)
}

// serve makes s the raft stream of peer this broker reads, ending the one
// it read before, if any: a peer has one (it opens another when it sees
// the first fail, perhaps before this broker does), and each may hold a
// frame of up to raftFrameLimit as its bytes arrive, so a peer that
// opened many would make the broker hold that many times as much.
func (n *raftNet) serve(peer string, s *quic.Stream) {
	n.mu.Lock()
	old := n.mu.served[peer]
	n.mu.served[peer] = s
	n.mu.Unlock()
	if old != nil {
		old.CancelRead(quic.StreamErrorCode(transport.CodeLimitExceeded))
	}
}

// served forgets s, the raft stream of peer, unless another replaced it.
func (n *raftNet) served(peer string, s *quic.Stream) {
	n.mu.Lock()
	if n.mu.served[peer] == s {
		delete(n.mu.served, peer)
	}
	n.mu.Unlock()
}

// receive delivers the raft frames peer sends on one stream, starting
// with first if it was read already (else nil), until the stream ends
// (nil) or the peer breaks the protocol (a *transport.Error).
func (n *raftNet) receive(peer string, r *transport.Reader, first *transport.Raft) error {
	for f := first; ; f = nil {
		if f == nil {
			// ReadIf: a frame of another type is refused undecoded (a
			// body of many small elements decodes to many times its
			// size, and a raft frame may be of raftFrameLimit).
			next, err := r.ReadIf(transport.FrameRaft)
			if err != nil {
				var werr *transport.Error
				if errors.As(err, &werr) && werr.Code == transport.CodeUnexpectedFrame {
					return werr
				}
				return nil
			}
			f = next.(*transport.Raft)
		}
		if f.From != peer {
			return impersonation(peer, f.From)
		}
		n.heardFrom(peer)
		for i := range f.Msgs {
			n.deliver(peer, &f.Msgs[i])
		}
	}
}
