package wire

import (
	"encoding/binary"
	"unsafe"

	"github.com/ddstore-go/ddstore/internal/base"
)

// Encoder appends little-endian fields to a byte slice.
type Encoder struct{ b []byte }

// Bytes is what has been encoded.
func (e *Encoder) Bytes() []byte { return e.b }

func (e *Encoder) U8(v uint8)   { e.b = append(e.b, v) }
func (e *Encoder) U16(v uint16) { e.b = binary.LittleEndian.AppendUint16(e.b, v) }
func (e *Encoder) U32(v uint32) { e.b = binary.LittleEndian.AppendUint32(e.b, v) }
func (e *Encoder) U64(v uint64) { e.b = binary.LittleEndian.AppendUint64(e.b, v) }
func (e *Encoder) I64(v int64)  { e.U64(uint64(v)) }

// Raw appends bytes encoded before: a message kept encoded to be sent
// again (a variable's table, to each of a node's clients).
func (e *Encoder) Raw(b []byte) { e.b = append(e.b, b...) }

// String writes a name: u16 length then bytes (names are short).
func (e *Encoder) String(s string) {
	if len(s) > 0xFFFF {
		s = s[:0xFFFF]
	}
	e.U16(uint16(len(s)))
	e.b = append(e.b, s...)
}

// String32 writes a long text (error messages, JSON): u32 length then bytes.
func (e *Encoder) String32(s string) {
	e.U32(uint32(len(s)))
	e.b = append(e.b, s...)
}

// I64s writes a list: u32 count then the values.
func (e *Encoder) I64s(v []int64) {
	e.U32(uint32(len(v)))
	if len(v) == 0 {
		return
	}
	if hostLittleEndian {
		e.b = append(e.b, unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 8*len(v))...)
		return
	}
	for _, x := range v {
		e.I64(x)
	}
}

// Strings writes a list of names.
func (e *Encoder) Strings(v []string) {
	e.U32(uint32(len(v)))
	for _, s := range v {
		e.String(s)
	}
}

// Decoder reads fields; the first short or bad read sets a sticky error and
// every later read returns zero values, so message decoders check once.
type Decoder struct {
	b   []byte
	err error
}

// NewDecoder decodes b.
func NewDecoder(b []byte) *Decoder { return &Decoder{b: b} }

// Err is the first error met, nil if none.
func (d *Decoder) Err() error { return d.err }

// Done is Err, plus an error when bytes are left over (a frame of another
// shape than expected).
func (d *Decoder) Done() error {
	if d.err == nil && len(d.b) != 0 {
		d.err = base.Errorf(base.ErrProtocol, "%d bytes left over after the message", len(d.b))
	}
	return d.err
}

func (d *Decoder) fail(what string, need int) {
	if d.err == nil {
		d.err = base.Errorf(base.ErrProtocol, "truncated message: %s needs %d bytes, %d left", what, need, len(d.b))
	}
	d.b = nil
}

func (d *Decoder) take(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.fail(what, n)
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *Decoder) U8() uint8 {
	if b := d.take(1, "u8"); b != nil {
		return b[0]
	}
	return 0
}

func (d *Decoder) U16() uint16 {
	if b := d.take(2, "u16"); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (d *Decoder) U32() uint32 {
	if b := d.take(4, "u32"); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (d *Decoder) U64() uint64 {
	if b := d.take(8, "u64"); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (d *Decoder) I64() int64 { return int64(d.U64()) }

func (d *Decoder) String() string   { return string(d.take(int(d.U16()), "string")) }
func (d *Decoder) String32() string { return string(d.take(int(d.U32()), "text")) }

// I64s reads a list into dst's storage when it is large enough.
func (d *Decoder) I64s(dst []int64) []int64 {
	n := int(d.U32())
	if d.err != nil {
		return nil
	}
	if n > len(d.b)/8 {
		d.fail("list", 8*n)
		return nil
	}
	if cap(dst) < n {
		dst = make([]int64, n)
	}
	dst = dst[:n]
	b := d.take(8*n, "list")
	for i := range dst {
		dst[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return dst
}

// Strings reads a list of names.
func (d *Decoder) Strings() []string {
	n := int(d.U32())
	if d.err != nil {
		return nil
	}
	if n > len(d.b)/2 {
		d.fail("names", 2*n)
		return nil
	}
	out := make([]string, n)
	for i := range out {
		out[i] = d.String()
	}
	if d.err != nil {
		return nil
	}
	return out
}

var hostLittleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()
