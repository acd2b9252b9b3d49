package replica

import (
	"fmt"
	"math/rand/v2"
	"sync"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Transport carries a group's raft messages to its peers.
//
// Send is called by the group's goroutine with the messages of one Ready;
// each goes to the replica m.GetTo() names, whose owner hands it to that
// replica's Group.Step. Send must not block on the network and may lose
// messages (raft retransmits), but must keep the order of the messages to
// one peer. The messages are not modified by the group afterwards, but
// raft may still hold the entries in them: a transport marshals them, it
// does not modify them.
type Transport interface {
	Send(msgs []*pb.Message)
}

// MemNetwork is an in-memory network of replicas, for tests: messages are
// marshalled and unmarshalled (as on a wire) and handed to the receiver's
// Step on the sender's goroutine. Links can be cut and messages dropped at
// random.
type MemNetwork struct {
	mu    sync.Mutex
	nodes map[uint64]*Group
	cut   map[[2]uint64]bool // directed links that lose every message
	drop  float64            // probability of losing any message
	rng   *rand.Rand
	// appended is, per receiver, the highest entry index delivered to it
	// in an append message.
	appended map[uint64]uint64
	sent     uint64 // messages delivered
	// recent holds the last messages delivered, message number
	// sent-len(recent)+1 first: what a test that counts messages reports
	// when the count is wrong.
	recent []sentMsg
}

// sentMsg is what MemNetwork keeps of a message it delivered.
type sentMsg struct {
	from, to, term, index, commit uint64
	typ                           pb.MessageType
	entries                       int
}

// recentKept bounds MemNetwork.recent.
const recentKept = 64

// Sent returns the number of messages the network has delivered.
func (n *MemNetwork) Sent() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sent
}

// SentSince describes the messages delivered after the first n (as Sent
// counted them), of the last 64 at most.
func (n *MemNetwork) SentSince(first uint64) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	skip := int(first) - (int(n.sent) - len(n.recent))
	if skip < 0 {
		skip = 0
	}
	if skip > len(n.recent) {
		skip = len(n.recent)
	}
	var out []string
	for _, m := range n.recent[skip:] {
		out = append(out, fmt.Sprintf("%d->%d %s term %d index %d commit %d entries %d", m.from, m.to, m.typ, m.term, m.index, m.commit, m.entries))
	}
	return out
}

// Appended returns the highest entry index delivered to replica id in an
// append message.
func (n *MemNetwork) Appended(id uint64) uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.appended[id]
}

// NewMemNetwork returns an empty network; seed drives its random drops.
func NewMemNetwork(seed uint64) *MemNetwork {
	return &MemNetwork{nodes: map[uint64]*Group{}, cut: map[[2]uint64]bool{}, appended: map[uint64]uint64{}, rng: rand.New(rand.NewPCG(seed, seed))}
}

// Transport returns the transport replica id sends with.
func (n *MemNetwork) Transport(id uint64) Transport { return memTransport{n, id} }

// Attach makes g receive the messages sent to its id; Detach stops that.
func (n *MemNetwork) Attach(g *Group) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.nodes[g.ID()] = g
}

// Detach stops delivering messages to id.
func (n *MemNetwork) Detach(id uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.nodes, id)
}

// Isolate cuts the links both ways between id and each of others (id
// itself among them is skipped).
func (n *MemNetwork) Isolate(id uint64, others ...uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, o := range others {
		if o != id {
			n.cut[[2]uint64{id, o}], n.cut[[2]uint64{o, id}] = true, true
		}
	}
}

// Cut cuts the link from one replica to another, one way.
func (n *MemNetwork) Cut(from, to uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut[[2]uint64{from, to}] = true
}

// Heal restores every link and stops random drops.
func (n *MemNetwork) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.cut)
	n.drop = 0
}

// SetDrop makes every message lost with probability p.
func (n *MemNetwork) SetDrop(p float64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.drop = p
}

type memTransport struct {
	n    *MemNetwork
	from uint64
}

func (t memTransport) Send(msgs []*pb.Message) {
	type delivery struct {
		to *Group
		m  *pb.Message
	}
	var out []delivery
	n := t.n
	n.mu.Lock()
	for _, m := range msgs {
		to := t.n.nodes[m.GetTo()]
		if to == nil || t.n.cut[[2]uint64{t.from, m.GetTo()}] || (t.n.drop > 0 && t.n.rng.Float64() < t.n.drop) {
			continue
		}
		b, err := proto.Marshal(m)
		if err != nil {
			continue
		}
		c := &pb.Message{}
		if err := proto.Unmarshal(b, c); err != nil {
			continue
		}
		if ents := c.GetEntries(); c.GetType() == pb.MsgApp && len(ents) > 0 {
			n.appended[c.GetTo()] = max(n.appended[c.GetTo()], ents[len(ents)-1].GetIndex())
		}
		out = append(out, delivery{to, c})
		n.sent++
		if len(n.recent) == recentKept {
			n.recent = append(n.recent[:0], n.recent[1:]...)
		}
		n.recent = append(n.recent, sentMsg{c.GetFrom(), c.GetTo(), c.GetTerm(), c.GetIndex(), c.GetCommit(), c.GetType(), len(c.GetEntries())})
	}
	t.n.mu.Unlock()
	for _, d := range out {
		_ = d.to.Step(d.m) // a closed or failed receiver loses it, as a dead peer would
	}
}
