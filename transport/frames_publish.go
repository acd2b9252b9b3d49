package transport

// Publish asks a broker to append one record. A client sends it on a
// publisher stream; a broker forwarding to the shard's owner sends it with
// Epoch and Via set. Each Publish is answered by an [Ack] or an [*Error]
// with the same Seq, in order.
type Publish struct {
	Seq         uint64 // publisher-chosen per stream, echoed in Ack/Error
	Stream      string
	Shard       int32 // -1 = broker derives shard from Key
	Key         []byte
	Value       []byte
	Headers     map[string]string // W3C traceparent etc.
	ProducerID  string            // an idempotent publisher's id on the shard: up to MaxProducerIDLen bytes
	ProducerSeq uint64
	Epoch       uint64 // set by a forwarding broker: the map epoch it routed by
	Via         string // set by a forwarding broker: its node id
	// Created is the stream's incarnation (shardmap.Stream.Created) in
	// the map the sender picked Shard by, 0 if it did not pick it: a
	// forwarding broker sets it, and a client that picked the shard from
	// its map. A broker whose map holds another incarnation (the stream
	// was deleted and created again) does not write the record to the
	// shard of another stream's count: it refuses it, or, for a client's
	// plain record, places it by its own map (see Ack.Epoch). An owner holding an
	// older map that has the same incarnation of the stream, and this
	// shard on itself, need not wait for the newer map.
	Created uint64
}

// MaxProducerIDLen bounds [Publish.ProducerID]: a broker refuses a longer
// one as invalid (the SDK's are about 20 bytes).
const MaxProducerIDLen = 128

// publishFields is the fields a Publish is sent with; one without Created
// (a client's, or from a peer of an earlier version) has publishFieldsMin.
const (
	publishFields    = 11
	publishFieldsMin = 10
)

// Type implements [Frame].
func (*Publish) Type() FrameType { return FramePublish }

func (p *Publish) appendBody(b []byte) ([]byte, error) {
	if p == nil {
		return b, errNilFrame(FramePublish)
	}
	fields := publishFieldsMin
	if p.Created != 0 {
		fields = publishFields
	}
	b = appendArrayHeader(b, fields)
	b = appendUint(b, p.Seq)
	b = appendStr(b, p.Stream)
	b = appendInt(b, int64(p.Shard))
	b = appendBin(b, p.Key)
	b = appendBin(b, p.Value)
	b = appendHeaders(b, p.Headers)
	b = appendStr(b, p.ProducerID)
	b = appendUint(b, p.ProducerSeq)
	b = appendUint(b, p.Epoch)
	b = appendStr(b, p.Via)
	if p.Created != 0 {
		b = appendUint(b, p.Created)
	}
	return b, nil
}

func (p *Publish) decode(d *decoder) {
	n := d.arrayHeader(publishFieldsMin)
	p.Seq = d.uint64()
	p.Stream = d.str()
	p.Shard = d.int32()
	p.Key = d.bin()
	p.Value = d.bin()
	p.Headers = d.headers()
	p.ProducerID = d.str()
	p.ProducerSeq = d.uint64()
	p.Epoch = d.uint64()
	p.Via = d.str()
	p.Created = 0
	if n > publishFieldsMin {
		p.Created = d.uint64()
		n--
	}
	d.skipN(n - publishFieldsMin)
}

// Ack tells a publisher that the record it published with Seq is durable:
// the owner wrote it and fsynced its log.
type Ack struct {
	Seq       uint64
	Stream    string
	Shard     int32
	Offset    uint64
	Timestamp int64  // commit time, unix ns
	Owner     string // node id that committed it
	Via       string // node id the client published through
	Forwarded bool
	// Duplicate: the record had been committed before, by an earlier
	// attempt of the same idempotent publish (same ProducerID and
	// ProducerSeq); it was not written again, and Offset and Timestamp
	// are the original's.
	Duplicate bool
	// Epoch is set when the broker placed the record by a newer map than
	// the one the client picked its shard by (Publish.Created named a
	// stream since deleted and created again; only a plain record, whose
	// shard any map may pick, is placed again rather than refused): that
	// map's epoch, for the client to fetch before it picks again. 0
	// otherwise, and then not sent.
	Epoch uint64
}

// ackFields is the fields an Ack is sent with, ackFieldsEpoch with an
// Epoch; one from a peer of an earlier version has ackFieldsMin (no
// Duplicate).
const (
	ackFieldsEpoch = 10
	ackFields      = 9
	ackFieldsMin   = 8
)

// Type implements [Frame].
func (*Ack) Type() FrameType { return FrameAck }

func (a *Ack) appendBody(b []byte) ([]byte, error) {
	if a == nil {
		return b, errNilFrame(FrameAck)
	}
	n := ackFields
	if a.Epoch != 0 {
		n = ackFieldsEpoch
	}
	b = appendArrayHeader(b, n)
	b = appendUint(b, a.Seq)
	b = appendStr(b, a.Stream)
	b = appendInt(b, int64(a.Shard))
	b = appendUint(b, a.Offset)
	b = appendInt(b, a.Timestamp)
	b = appendStr(b, a.Owner)
	b = appendStr(b, a.Via)
	b = appendBool(b, a.Forwarded)
	b = appendBool(b, a.Duplicate)
	if a.Epoch != 0 {
		b = appendUint(b, a.Epoch)
	}
	return b, nil
}

func (a *Ack) decode(d *decoder) {
	n := d.arrayHeader(ackFieldsMin)
	a.Seq = d.uint64()
	a.Stream = d.str()
	a.Shard = d.int32()
	a.Offset = d.uint64()
	a.Timestamp = d.int64()
	a.Owner = d.str()
	a.Via = d.str()
	a.Forwarded = d.bool()
	a.Duplicate, a.Epoch = false, 0
	if n > ackFieldsMin {
		a.Duplicate = d.bool()
		n--
	}
	if n > ackFieldsMin {
		a.Epoch = d.uint64()
		n--
	}
	d.skipN(n - ackFieldsMin)
}
