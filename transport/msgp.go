package transport

import (
	"encoding/binary"
	"math"
	"unsafe"
)

// This file is a small msgpack encoder and decoder for the hand-encoded
// frames: no reflection, no allocation on encode, and on decode only what
// the frame's fields need. Its output is standard msgpack, readable by any
// msgpack library.

// maxDepth bounds the nesting a body may have, so skipping unknown values
// (here or in the msgpack library) cannot exhaust the stack.
const maxDepth = 32

func appendArrayHeader(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x90|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xdc), uint16(n))
	default:
		return binary.BigEndian.AppendUint32(append(b, 0xdd), uint32(n))
	}
}

func appendMapHeader(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x80|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xde), uint16(n))
	default:
		return binary.BigEndian.AppendUint32(append(b, 0xdf), uint32(n))
	}
}

func appendNil(b []byte) []byte { return append(b, 0xc0) }

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 0xc3)
	}
	return append(b, 0xc2)
}

func appendUint(b []byte, v uint64) []byte {
	switch {
	case v < 128:
		return append(b, byte(v))
	case v <= math.MaxUint8:
		return append(b, 0xcc, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(v))
	default:
		return binary.BigEndian.AppendUint64(append(b, 0xcf), v)
	}
}

func appendInt(b []byte, v int64) []byte {
	switch {
	case v >= 0:
		return appendUint(b, uint64(v))
	case v >= -32:
		return append(b, byte(v))
	case v >= math.MinInt8:
		return append(b, 0xd0, byte(v))
	case v >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(b, 0xd1), uint16(v))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(v))
	default:
		return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(v))
	}
}

func appendStr(b []byte, s string) []byte {
	n := len(s)
	switch {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		b = append(b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}

// appendBin appends v as msgpack bin, or nil for a nil v, so that nil and
// empty survive a round trip.
func appendBin(b []byte, v []byte) []byte {
	if v == nil {
		return appendNil(b)
	}
	n := len(v)
	switch {
	case n <= math.MaxUint8:
		b = append(b, 0xc4, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xc5), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xc6), uint32(n))
	}
	return append(b, v...)
}

// appendStrs appends v as a msgpack array of strings.
func appendStrs(b []byte, v []string) []byte {
	b = appendArrayHeader(b, len(v))
	for _, s := range v {
		b = appendStr(b, s)
	}
	return b
}

// appendHeaders appends m as a msgpack map of strings, or nil for a nil m.
// Map order is random, so equal maps may encode differently.
func appendHeaders(b []byte, m map[string]string) []byte {
	if m == nil {
		return appendNil(b)
	}
	b = appendMapHeader(b, len(m))
	for k, v := range m {
		b = appendStr(b, k)
		b = appendStr(b, v)
	}
	return b
}

// decoder reads msgpack values from b. It is sticky: after the first error
// every read returns a zero value and err keeps that first error, so a
// frame's decode method reads its fields in a row and checks once.
//
// When alias is set, strings and byte slices point into b instead of being
// copied; the caller guarantees b is never modified afterwards.
type decoder struct {
	b     []byte
	off   int
	alias bool
	err   *Error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = malformed(format, args...)
	}
}

func (d *decoder) remaining() int { return len(d.b) - d.off }

// next returns the next byte, or fails at the end of the body.
func (d *decoder) next() (byte, bool) {
	if d.err != nil {
		return 0, false
	}
	if d.off >= len(d.b) {
		d.fail("truncated at byte %d", d.off)
		return 0, false
	}
	c := d.b[d.off]
	d.off++
	return c, true
}

// take returns the next n bytes, or fails if there are fewer.
func (d *decoder) take(n int) ([]byte, bool) {
	if d.err != nil {
		return nil, false
	}
	if n < 0 || n > d.remaining() {
		d.fail("length %d at byte %d exceeds the %d bytes left", n, d.off, d.remaining())
		return nil, false
	}
	v := d.b[d.off : d.off+n : d.off+n]
	d.off += n
	return v, true
}

func (d *decoder) be(n int) uint64 {
	v, ok := d.take(n)
	if !ok {
		return 0
	}
	switch n {
	case 1:
		return uint64(v[0])
	case 2:
		return uint64(binary.BigEndian.Uint16(v))
	case 4:
		return uint64(binary.BigEndian.Uint32(v))
	default:
		return binary.BigEndian.Uint64(v)
	}
}

// arrayHeader reads an array header and requires at least min elements.
// Each element takes at least one byte, so a length over the bytes left is
// malformed and never allocates.
func (d *decoder) arrayHeader(min int) int {
	c, ok := d.next()
	if !ok {
		return min
	}
	var n int
	switch {
	case c&0xf0 == 0x90:
		n = int(c & 0x0f)
	case c == 0xdc:
		n = int(d.be(2))
	case c == 0xdd:
		n = int(d.be(4))
	default:
		d.fail("want array, got 0x%02x at byte %d", c, d.off-1)
		return min
	}
	if d.err != nil {
		return min
	}
	if n > d.remaining() {
		d.fail("array of %d elements exceeds the %d bytes left", n, d.remaining())
		return min
	}
	if n < min {
		d.fail("array of %d elements, want at least %d", n, min)
		return min
	}
	return n
}

// mapHeader reads a map header; nil reads as -1.
func (d *decoder) mapHeader() int {
	c, ok := d.next()
	if !ok {
		return -1
	}
	var n int
	switch {
	case c == 0xc0:
		return -1
	case c&0xf0 == 0x80:
		n = int(c & 0x0f)
	case c == 0xde:
		n = int(d.be(2))
	case c == 0xdf:
		n = int(d.be(4))
	default:
		d.fail("want map, got 0x%02x at byte %d", c, d.off-1)
		return -1
	}
	if d.err != nil {
		return -1
	}
	if n > d.remaining()/2 {
		d.fail("map of %d entries exceeds the %d bytes left", n, d.remaining())
		return -1
	}
	return n
}

// uint64 reads any msgpack integer that is not negative. nil reads as 0.
func (d *decoder) uint64() uint64 {
	c, ok := d.next()
	if !ok {
		return 0
	}
	switch {
	case c < 0x80:
		return uint64(c)
	case c == 0xc0:
		return 0
	case c >= 0xcc && c <= 0xcf:
		return d.be(1 << (c - 0xcc))
	case c >= 0xd0 && c <= 0xd3:
		v := d.signed(c)
		if v < 0 {
			d.fail("negative integer %d, want unsigned", v)
			return 0
		}
		return uint64(v)
	case c >= 0xe0:
		d.fail("negative integer %d, want unsigned", int8(c))
		return 0
	}
	d.fail("want integer, got 0x%02x at byte %d", c, d.off-1)
	return 0
}

// signed reads the payload of an int8..int64 whose code c was read.
func (d *decoder) signed(c byte) int64 {
	switch c {
	case 0xd0:
		return int64(int8(d.be(1)))
	case 0xd1:
		return int64(int16(d.be(2)))
	case 0xd2:
		return int64(int32(d.be(4)))
	default:
		return int64(d.be(8))
	}
}

// int64 reads any msgpack integer that fits an int64. nil reads as 0.
func (d *decoder) int64() int64 {
	c, ok := d.next()
	if !ok {
		return 0
	}
	switch {
	case c < 0x80:
		return int64(c)
	case c >= 0xe0:
		return int64(int8(c))
	case c == 0xc0:
		return 0
	case c >= 0xd0 && c <= 0xd3:
		return d.signed(c)
	case c >= 0xcc && c <= 0xcf:
		v := d.be(1 << (c - 0xcc))
		if v > math.MaxInt64 {
			d.fail("integer %d overflows int64", v)
			return 0
		}
		return int64(v)
	}
	d.fail("want integer, got 0x%02x at byte %d", c, d.off-1)
	return 0
}

func (d *decoder) int32() int32 {
	v := d.int64()
	if v < math.MinInt32 || v > math.MaxInt32 {
		d.fail("integer %d overflows int32", v)
		return 0
	}
	return int32(v)
}

func (d *decoder) uint32() uint32 {
	v := d.uint64()
	if v > math.MaxUint32 {
		d.fail("integer %d overflows uint32", v)
		return 0
	}
	return uint32(v)
}

func (d *decoder) uint16() uint16 {
	v := d.uint64()
	if v > math.MaxUint16 {
		d.fail("integer %d overflows uint16", v)
		return 0
	}
	return uint16(v)
}

func (d *decoder) uint8() uint8 {
	v := d.uint64()
	if v > math.MaxUint8 {
		d.fail("integer %d overflows uint8", v)
		return 0
	}
	return uint8(v)
}

func (d *decoder) bool() bool {
	c, ok := d.next()
	if !ok {
		return false
	}
	switch c {
	case 0xc2, 0xc0:
		return false
	case 0xc3:
		return true
	}
	d.fail("want bool, got 0x%02x at byte %d", c, d.off-1)
	return false
}

// raw reads a str or bin value (either is accepted for either kind); nil
// reads as (nil, true).
func (d *decoder) raw() (v []byte, isNil bool) {
	c, ok := d.next()
	if !ok {
		return nil, false
	}
	var n int
	switch {
	case c == 0xc0:
		return nil, true
	case c&0xe0 == 0xa0:
		n = int(c & 0x1f)
	case c == 0xd9 || c == 0xc4:
		n = int(d.be(1))
	case c == 0xda || c == 0xc5:
		n = int(d.be(2))
	case c == 0xdb || c == 0xc6:
		n = int(d.be(4))
	default:
		d.fail("want str or bin, got 0x%02x at byte %d", c, d.off-1)
		return nil, false
	}
	v, _ = d.take(n)
	return v, false
}

func (d *decoder) str() string {
	v, _ := d.raw()
	if len(v) == 0 {
		return ""
	}
	if d.alias {
		return unsafe.String(&v[0], len(v))
	}
	return string(v)
}

// bin reads a byte slice; msgpack nil reads as a nil slice and an empty
// bin as an empty, non-nil one.
func (d *decoder) bin() []byte {
	v, isNil := d.raw()
	if isNil || d.err != nil {
		return nil
	}
	if d.alias {
		return v
	}
	return append(make([]byte, 0, len(v)), v...)
}

func (d *decoder) headers() map[string]string {
	n := d.mapHeader()
	if n < 0 {
		return nil
	}
	// The map grows with its distinct keys, not with the count a frame
	// declares: a header map declaring 500,000 copies of one key once
	// sized a map for all of them, which the shard's tail then kept
	// (tens of MiB per record). A key given twice is malformed.
	m := make(map[string]string, min(n, 16))
	for range n {
		k := d.str()
		v := d.str()
		if d.err != nil {
			return nil
		}
		if _, dup := m[k]; dup {
			d.fail("header %q given twice", k)
			return nil
		}
		m[k] = v
	}
	return m
}

// strs reads an array of strings; msgpack nil reads as a nil slice.
func (d *decoder) strs() []string {
	if d.err == nil && d.off < len(d.b) && d.b[d.off] == 0xc0 {
		d.off++
		return nil
	}
	n := d.arrayHeader(0)
	if d.err != nil {
		return nil
	}
	out := make([]string, n)
	for i := range out {
		out[i] = d.str()
	}
	if d.err != nil {
		return nil
	}
	return out
}

// skipN skips n values: the trailing fields a newer peer added.
func (d *decoder) skipN(n int) {
	for ; n > 0 && d.err == nil; n-- {
		d.skip(0)
	}
}

// value reads the extent of the next value, whatever it is, checking every
// length in it against the bytes present.
func (d *decoder) value() []byte {
	start := d.off
	d.skip(0)
	if d.err != nil {
		return nil
	}
	return d.b[start:d.off:d.off]
}

// skip skips one value, checking each length it declares.
func (d *decoder) skip(depth int) {
	if depth > maxDepth {
		d.fail("nested deeper than %d", maxDepth)
		return
	}
	c, ok := d.next()
	if !ok {
		return
	}
	var n int // bytes to skip
	switch {
	case c < 0x80 || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		return
	case c&0xf0 == 0x80 || c == 0xde || c == 0xdf: // map
		d.off--
		m := d.mapHeader()
		for i := 0; i < 2*m && d.err == nil; i++ {
			d.skip(depth + 1)
		}
		return
	case c&0xf0 == 0x90 || c == 0xdc || c == 0xdd: // array
		d.off--
		a := d.arrayHeader(0)
		for i := 0; i < a && d.err == nil; i++ {
			d.skip(depth + 1)
		}
		return
	case c&0xe0 == 0xa0:
		n = int(c & 0x1f)
	case c == 0xc4 || c == 0xd9:
		n = int(d.be(1))
	case c == 0xc5 || c == 0xda:
		n = int(d.be(2))
	case c == 0xc6 || c == 0xdb:
		n = int(d.be(4))
	case c == 0xc7: // ext8
		n = int(d.be(1)) + 1
	case c == 0xc8: // ext16
		n = int(d.be(2)) + 1
	case c == 0xc9: // ext32
		n = int(d.be(4)) + 1
	case c == 0xca:
		n = 4
	case c == 0xcb:
		n = 8
	case c >= 0xcc && c <= 0xcf:
		n = 1 << (c - 0xcc)
	case c >= 0xd0 && c <= 0xd3:
		n = 1 << (c - 0xd0)
	case c >= 0xd4 && c <= 0xd8: // fixext 1..16
		n = 1<<(c-0xd4) + 1
	default: // 0xc1, never used
		d.fail("invalid msgpack code 0x%02x at byte %d", c, d.off-1)
		return
	}
	d.take(n)
}
