package transport

// Raft carries a batch of raft messages from one broker to another, for any
// number of replicated shards (raft groups): brokers keep one long-lived
// stream per pair carrying them, whatever the number of groups they share.
// From is the sender's node id, which the receiver checks against the
// peer's certificate. Each message is opaque here: the marshalled
// raftpb.Message, tagged with the group (stream and shard) it belongs to;
// package replica decodes it.
//
// Duplex, set on the first frame of a stream by a broker that reads the
// stream too, lets the receiver send its own raft messages back on it:
// then one QUIC connection carries a pair's raft traffic both ways, and
// each side's acknowledgements ride on its messages instead of packets
// of their own. A receiver that does not know the field ignores it.
type Raft struct {
	From   string
	Msgs   []RaftMsg
	Duplex bool
}

// RaftMsg is one raft message of a [Raft] batch.
type RaftMsg struct {
	Stream string
	Shard  int32
	Data   []byte // a marshalled go.etcd.io/raft/v3/raftpb.Message
}

const (
	raftFields    = 2 // without Duplex, which is written only when set
	raftMsgFields = 3
)

// Type implements [Frame].
func (*Raft) Type() FrameType { return FrameRaft }

func (r *Raft) appendBody(b []byte) ([]byte, error) {
	if r == nil {
		return b, errNilFrame(FrameRaft)
	}
	n := raftFields
	if r.Duplex {
		n++
	}
	b = appendArrayHeader(b, n)
	b = appendStr(b, r.From)
	b = appendArrayHeader(b, len(r.Msgs))
	for i := range r.Msgs {
		m := &r.Msgs[i]
		b = appendArrayHeader(b, raftMsgFields)
		b = appendStr(b, m.Stream)
		b = appendInt(b, int64(m.Shard))
		b = appendBin(b, m.Data)
	}
	if r.Duplex {
		b = appendBool(b, true)
	}
	return b, nil
}

func (r *Raft) decode(d *decoder) {
	n := d.arrayHeader(raftFields)
	r.From = d.str()
	count := d.arrayHeader(0)
	// A message takes at least its array header and three one-byte
	// fields: that bounds how many a body can declare.
	if d.err == nil && count > d.remaining()/(raftMsgFields+1) {
		d.fail("%d raft messages exceed the %d bytes left", count, d.remaining())
	}
	if d.err == nil && count > 0 {
		r.Msgs = make([]RaftMsg, count)
		for i := range r.Msgs {
			m := &r.Msgs[i]
			k := d.arrayHeader(raftMsgFields)
			m.Stream = d.str()
			m.Shard = d.int32()
			m.Data = d.bin()
			d.skipN(k - raftMsgFields)
		}
	}
	r.Duplex = false
	if n > raftFields {
		r.Duplex = d.bool()
		n--
	}
	d.skipN(n - raftFields)
}
