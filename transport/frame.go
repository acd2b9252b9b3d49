package transport

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
)

// FrameType is the byte after a frame's length. Types are part of the wire
// format: never renumber one, only add.
type FrameType uint8

// Frame types.
const (
	FramePublish   FrameType = 1  // client or forwarding broker -> broker
	FrameAck       FrameType = 2  // broker -> publisher
	FrameError     FrameType = 3  // either way; also the Go error type
	FrameSubscribe FrameType = 4  // client -> broker: opens a subscription on this stream
	FrameRecords   FrameType = 5  // broker -> subscriber
	FrameCredit    FrameType = 6  // subscriber -> broker: more credit
	FrameRequest   FrameType = 7  // admin/control request
	FrameResponse  FrameType = 8  // its answer
	FrameMap       FrameType = 9  // shard map push (ctl -> broker, broker -> client)
	FrameRegister  FrameType = 10 // broker -> ctl: first frame of the registration stream
	FrameHeartbeat FrameType = 11 // broker -> ctl on the registration stream, and back as ctl's answer
	FrameRaft      FrameType = 12 // broker -> broker: raft messages of replicated shards
)

var frameNames = [...]string{
	FramePublish:   "publish",
	FrameAck:       "ack",
	FrameError:     "error",
	FrameSubscribe: "subscribe",
	FrameRecords:   "records",
	FrameCredit:    "credit",
	FrameRequest:   "request",
	FrameResponse:  "response",
	FrameMap:       "map",
	FrameRegister:  "register",
	FrameHeartbeat: "heartbeat",
	FrameRaft:      "raft",
}

// String returns the frame type's name, such as "publish", or
// "frame_<n>" for a type this version does not know.
func (t FrameType) String() string {
	if int(t) < len(frameNames) && frameNames[t] != "" {
		return frameNames[t]
	}
	return "frame_" + strconv.Itoa(int(t))
}

// Frame is one of the frame types of this package: [*Publish], [*Ack],
// [*Error], [*Subscribe], [*Records], [*Credit], [*Request], [*Response],
// [*MapUpdate], [*Register], [*Heartbeat], [*Raft]. Only this package defines
// frames.
type Frame interface {
	Type() FrameType
	// appendBody appends the msgpack body of the frame.
	appendBody(b []byte) ([]byte, error)
}

// frameHeaderLen is the 4-byte length plus the type byte.
const frameHeaderLen = 5

// DefaultMaxFrame is the default limit on a frame's length N (type byte
// plus body).
const DefaultMaxFrame = 4 << 20

// MaxMapFrame bounds the frames that carry a whole shard map: what the
// control plane writes (map pushes, admin answers) and what a broker
// writes in answer to an admin request (map.get from its own map, the
// control plane's answers it relays), and what their readers accept. A
// map of many streams of thousands of shards outgrows DefaultMaxFrame
// well within the control plane's limits, so these frames are not bound
// by a node's MaxFrame, which bounds what a peer may send unasked. A
// [Reader] grows its buffer only as a frame's bytes arrive: the larger
// limit costs nothing until such a frame is sent.
const MaxMapFrame = 64 << 20

// publishFrameOverhead is what a [Publish] or a one-record [Records] frame
// adds to its record's key, value, producer id and header bytes, with room
// to spare: the type byte, the field headers, a stream name and node id of
// up to 128 bytes each, the integers, and the headers a forwarding broker
// adds for tracing. Each header adds up to 10 bytes more (two string
// headers).
const (
	publishFrameOverhead   = 4 << 10
	publishHeaderOverhead  = 10
	defaultFrameMaxHeaders = 64
)

// PublishFrameLimit returns the frame length limit (for [NewReader] and
// [Writer.SetMaxFrame]) that lets through every [Publish] of a record of up
// to maxRecord bytes of key, value, producer id and headers, with up to
// maxHeaders headers (<= 0 means 64), and every [Records] frame carrying
// one such record alone. A server derives its frame limit from its record
// limit with it, so that a record over the limit is refused for its size
// ([CodePayloadTooLarge]) whatever its frame's size; see [Reader.Read].
func PublishFrameLimit(maxRecord, maxHeaders int) int {
	if maxHeaders <= 0 {
		maxHeaders = defaultFrameMaxHeaders
	}
	return maxRecord + publishFrameOverhead + publishHeaderOverhead*maxHeaders
}

// recordOverhead is the most a [Record]'s encoding adds to its key,
// value, producer id and header bytes, headers aside: the array header,
// the two integers and the sequence at their longest, and the headers of
// the key, value, producer id and header map. Each header adds
// publishHeaderOverhead (two string headers).
//
// recordsFrameOverhead is the most a [Records] frame's length (type byte
// plus body) adds to its records' encodings and its stream name: the type
// byte, the array headers, the stream name's header and the shard.
const (
	recordOverhead       = 1 + 9 + 9 + 5 + 5 + 5 + 5 + 9
	recordsFrameOverhead = 1 + 1 + 5 + 9 + 5
)

// RecordLen returns the most a [Record] whose key, value, producer id and
// header names and values hold size bytes, with headers headers, takes
// encoded in a [Records] frame.
func RecordLen(size, headers int) int {
	return size + recordOverhead + publishHeaderOverhead*headers
}

// RecordsRoom returns how much of a frame length limit of maxFrame a
// [Records] frame of stream leaves to its records: frames whose records'
// [RecordLen] sum to no more than that are within the limit.
func RecordsRoom(maxFrame int, stream string) int {
	return maxFrame - recordsFrameOverhead - len(stream)
}

// AppendFrame appends f, header and body, to dst. On error dst is returned
// unchanged.
func AppendFrame(dst []byte, f Frame) ([]byte, error) {
	if f == nil {
		return dst, &Error{Code: CodeInvalid, Message: "nil frame"}
	}
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, byte(f.Type()))
	dst, err := f.appendBody(dst)
	if err != nil {
		return dst[:start], err
	}
	n := len(dst) - start - 4
	if n > math.MaxUint32 {
		return dst[:start], &Error{Code: CodeFrameTooLarge, Message: fmt.Sprintf("%s frame of %d bytes", f.Type(), n)}
	}
	binary.BigEndian.PutUint32(dst[start:], uint32(n))
	return dst, nil
}

// DecodeFrame decodes the body of a frame of type typ. The frame does not
// alias body: a frame whose fields hold strings or byte slices makes one
// copy of body and points all of them into it, so keeping one such field
// alive keeps that copy alive (use strings.Clone or bytes.Clone for a field
// kept long after the frame).
//
// Bad input yields an [*Error]: [CodeUnknownFrame] for an unknown type,
// [CodeMalformed] for a body that does not decode. It never panics.
func DecodeFrame(typ FrameType, body []byte) (Frame, error) {
	// Each case calls decode on its concrete type, so that d stays on the
	// stack (an interface call would move it to the heap).
	var d decoder
	start := func(alias bool) {
		if alias && len(body) > 0 {
			body = bytes.Clone(body)
		}
		d = decoder{b: body, alias: alias}
	}
	var f Frame
	switch typ {
	case FramePublish:
		p := new(Publish)
		start(true)
		p.decode(&d)
		f = p
	case FrameAck:
		a := new(Ack)
		start(true)
		a.decode(&d)
		f = a
	case FrameError:
		e := new(Error)
		start(true)
		e.decode(&d)
		f = e
	case FrameSubscribe:
		s := new(Subscribe)
		start(true)
		s.decode(&d)
		f = s
	case FrameRecords:
		r := new(Records)
		start(true)
		r.decode(&d)
		f = r
	case FrameCredit:
		c := new(Credit)
		start(false)
		c.decode(&d)
		f = c
	case FrameRequest:
		r := new(Request)
		start(false)
		r.decode(&d)
		f = r
	case FrameResponse:
		r := new(Response)
		start(false)
		r.decode(&d)
		f = r
	case FrameMap:
		m := new(MapUpdate)
		start(false)
		m.decode(&d)
		f = m
	case FrameRegister:
		r := new(Register)
		start(true)
		r.decode(&d)
		f = r
	case FrameHeartbeat:
		h := new(Heartbeat)
		start(true)
		h.decode(&d)
		f = h
	case FrameRaft:
		r := new(Raft)
		start(true)
		r.decode(&d)
		f = r
	default:
		return nil, &Error{Code: CodeUnknownFrame, Message: fmt.Sprintf("frame type %d", uint8(typ))}
	}
	if d.err == nil && d.off != len(d.b) {
		d.fail("%d bytes after the body", len(d.b)-d.off)
	}
	if d.err != nil {
		d.err.Message = typ.String() + ": " + d.err.Message
		return nil, d.err
	}
	return f, nil
}
