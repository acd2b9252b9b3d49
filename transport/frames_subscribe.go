package transport

// StartKind says where a subscription starts.
type StartKind uint8

// Start kinds.
const (
	StartEarliest StartKind = 0 // the oldest record the shard still has
	StartLatest   StartKind = 1 // the next record committed
	StartOffset   StartKind = 2 // Subscribe.Offset
)

// Subscribe opens a subscription to one shard on the stream it is sent on.
// The broker answers with [Records] frames, never more records in flight
// than the credit granted (Credit here, then [Credit] frames). A
// subscriber that closes its side of the stream grants no more: it is
// still sent the records its credit covers, and the broker closes the
// stream once that is spent. A subscription that cannot go on ends with
// an [Error] frame (a record too large for any frame: [CodePayloadTooLarge]
// with its offset in From and To); a broker's stream that ends without
// one is a broker going away, and the subscriber may subscribe again
// after the last record it got.
type Subscribe struct {
	Stream string
	Shard  int32
	Start  StartKind
	Offset uint64 // with StartOffset
	Credit uint32 // initial credit, in records
	// Created is the stream's incarnation (shardmap.Stream.Created) the
	// subscriber read before, 0 if none: a broker whose map holds another
	// incarnation (the stream was deleted and created again) refuses the
	// subscription as of an unknown stream, rather than serve the new
	// stream from the old one's offsets.
	Created uint64
	// Epoch is the epoch of the map the subscriber holds, 0 if none: a
	// broker whose map is older and refuses the subscription catches up
	// to it before it judges again (the grant may be in that map, and a
	// map at Created may predate it).
	Epoch uint64
	// Cluster is the ID of the cluster (shardmap.Map.Cluster) whose map
	// the subscriber read the stream in, "" if none: a broker serving
	// another cluster refuses the subscription as of an unknown stream (a
	// cluster built again counts its epochs from the start, so Created
	// alone may match there).
	Cluster string
}

// subscribeFields is the fields a Subscribe is sent with; one without
// Created, Epoch and Cluster (from a client of an earlier version) has
// subscribeFieldsMin, one without Epoch and Cluster one more, one without
// Cluster two more.
const (
	subscribeFields    = 8
	subscribeFieldsMin = 5
)

// Type implements [Frame].
func (*Subscribe) Type() FrameType { return FrameSubscribe }

func (s *Subscribe) appendBody(b []byte) ([]byte, error) {
	if s == nil {
		return b, errNilFrame(FrameSubscribe)
	}
	fields := subscribeFieldsMin
	switch {
	case s.Cluster != "":
		fields = subscribeFields
	case s.Epoch != 0:
		fields = subscribeFieldsMin + 2
	case s.Created != 0:
		fields = subscribeFieldsMin + 1
	}
	b = appendArrayHeader(b, fields)
	b = appendStr(b, s.Stream)
	b = appendInt(b, int64(s.Shard))
	b = appendUint(b, uint64(s.Start))
	b = appendUint(b, s.Offset)
	b = appendUint(b, uint64(s.Credit))
	if fields > subscribeFieldsMin {
		b = appendUint(b, s.Created)
	}
	if fields > subscribeFieldsMin+1 {
		b = appendUint(b, s.Epoch)
	}
	if fields > subscribeFieldsMin+2 {
		b = appendStr(b, s.Cluster)
	}
	return b, nil
}

func (s *Subscribe) decode(d *decoder) {
	n := d.arrayHeader(subscribeFieldsMin)
	s.Stream = d.str()
	s.Shard = d.int32()
	s.Start = StartKind(d.uint8())
	s.Offset = d.uint64()
	s.Credit = d.uint32()
	s.Created, s.Epoch, s.Cluster = 0, 0, ""
	if n > subscribeFieldsMin {
		s.Created = d.uint64()
		n--
	}
	if n > subscribeFieldsMin {
		s.Epoch = d.uint64()
		n--
	}
	if n > subscribeFieldsMin {
		s.Cluster = d.str()
		n--
	}
	d.skipN(n - subscribeFieldsMin)
}

// Record is one committed record as a subscriber receives it.
type Record struct {
	Offset      uint64
	Timestamp   int64 // commit time, unix ns
	Key         []byte
	Value       []byte
	Headers     map[string]string
	ProducerID  string
	ProducerSeq uint64
}

// recordFields is the element count of a record; with the array header a
// record takes at least recordFields+1 bytes, which bounds how many records
// a body can declare.
const recordFields = 7

func (r *Record) append(b []byte) []byte {
	b = appendArrayHeader(b, recordFields)
	b = appendUint(b, r.Offset)
	b = appendInt(b, r.Timestamp)
	b = appendBin(b, r.Key)
	b = appendBin(b, r.Value)
	b = appendHeaders(b, r.Headers)
	b = appendStr(b, r.ProducerID)
	b = appendUint(b, r.ProducerSeq)
	return b
}

func (r *Record) decode(d *decoder) {
	n := d.arrayHeader(recordFields)
	r.Offset = d.uint64()
	r.Timestamp = d.int64()
	r.Key = d.bin()
	r.Value = d.bin()
	r.Headers = d.headers()
	r.ProducerID = d.str()
	r.ProducerSeq = d.uint64()
	d.skipN(n - recordFields)
}

// Records carries records of one shard, in offset order, to a subscriber.
type Records struct {
	Stream  string
	Shard   int32
	Records []Record
}

const recordsFields = 3

// Type implements [Frame].
func (*Records) Type() FrameType { return FrameRecords }

func (r *Records) appendBody(b []byte) ([]byte, error) {
	if r == nil {
		return b, errNilFrame(FrameRecords)
	}
	b = appendArrayHeader(b, recordsFields)
	b = appendStr(b, r.Stream)
	b = appendInt(b, int64(r.Shard))
	if r.Records == nil {
		b = appendNil(b)
	} else {
		b = appendArrayHeader(b, len(r.Records))
		for i := range r.Records {
			b = r.Records[i].append(b)
		}
	}
	return b, nil
}

func (r *Records) decode(d *decoder) {
	n := d.arrayHeader(recordsFields)
	r.Stream = d.str()
	r.Shard = d.int32()
	if d.err == nil && d.remaining() > 0 && d.b[d.off] == 0xc0 {
		d.off++
		r.Records = nil
	} else {
		count := d.arrayHeader(0)
		if d.err == nil && count > d.remaining()/(recordFields+1) {
			d.fail("%d records exceed the %d bytes left", count, d.remaining())
		}
		if d.err == nil {
			r.Records = make([]Record, count)
			for i := range r.Records {
				r.Records[i].decode(d)
			}
		}
	}
	d.skipN(n - recordsFields)
}

// Credit grants a subscription more records.
type Credit struct {
	Records uint32
}

const creditFields = 1

// Type implements [Frame].
func (*Credit) Type() FrameType { return FrameCredit }

func (c *Credit) appendBody(b []byte) ([]byte, error) {
	if c == nil {
		return b, errNilFrame(FrameCredit)
	}
	b = appendArrayHeader(b, creditFields)
	b = appendUint(b, uint64(c.Records))
	return b, nil
}

func (c *Credit) decode(d *decoder) {
	n := d.arrayHeader(creditFields)
	c.Records = d.uint32()
	d.skipN(n - creditFields)
}
