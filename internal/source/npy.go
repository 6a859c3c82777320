package source

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ddstore-go/ddstore/internal/base"
)

// The .npy format (numpy/lib/format.py): the magic "\x93NUMPY", a major and
// a minor version byte, the header's length (2 bytes little-endian in
// version 1, 4 in versions 2 and 3), then the header — a Python dict
// literal with the keys descr, fortran_order and shape, latin-1 in versions
// 1 and 2, UTF-8 in 3 — padded so that the data that follows is aligned.

var npyMagic = []byte("\x93NUMPY")

// maxNPYHeader bounds the header numpy's dict may take (numpy itself
// refuses more than 10000 bytes by default).
const maxNPYHeader = 1 << 20

// npyHeader is what a .npy header says.
type npyHeader struct {
	major, minor int
	dataOff      int64 // where the array's data begin
	descr        string
	fortran      bool
	shape        []int64
}

// readNPYHeader reads and parses the header at the start of r.
func readNPYHeader(r io.Reader) (npyHeader, error) {
	var h npyHeader
	pre := make([]byte, 8)
	if _, err := io.ReadFull(r, pre); err != nil {
		return h, fmt.Errorf("too short for a .npy header: %w", err)
	}
	if !bytes.Equal(pre[:6], npyMagic) {
		return h, fmt.Errorf("not a .npy file: it begins with %q, not %q", pre[:6], npyMagic)
	}
	h.major, h.minor = int(pre[6]), int(pre[7])
	var hlen int64
	switch h.major {
	case 1:
		b := make([]byte, 2)
		if _, err := io.ReadFull(r, b); err != nil {
			return h, fmt.Errorf("truncated .npy header: %w", err)
		}
		hlen, h.dataOff = int64(binary.LittleEndian.Uint16(b)), 10
	case 2, 3:
		b := make([]byte, 4)
		if _, err := io.ReadFull(r, b); err != nil {
			return h, fmt.Errorf("truncated .npy header: %w", err)
		}
		hlen, h.dataOff = int64(binary.LittleEndian.Uint32(b)), 12
	default:
		return h, fmt.Errorf(".npy format version %d.%d: want 1.0, 2.0 or 3.0", h.major, h.minor)
	}
	if h.minor != 0 {
		return h, fmt.Errorf(".npy format version %d.%d: want 1.0, 2.0 or 3.0", h.major, h.minor)
	}
	if hlen > maxNPYHeader {
		return h, fmt.Errorf(".npy header of %d bytes: want at most %d", hlen, maxNPYHeader)
	}
	text := make([]byte, hlen)
	if _, err := io.ReadFull(r, text); err != nil {
		return h, fmt.Errorf("truncated .npy header (%d bytes announced): %w", hlen, err)
	}
	h.dataOff += hlen
	var s string
	if h.major == 3 {
		if !utf8.Valid(text) {
			return h, fmt.Errorf(".npy version 3 header is not UTF-8")
		}
		s = string(text)
	} else {
		// latin-1: every byte is the code point of the same value.
		rs := make([]rune, len(text))
		for i, b := range text {
			rs[i] = rune(b)
		}
		s = string(rs)
	}
	if err := h.parseDict(s); err != nil {
		return h, err
	}
	return h, nil
}

// parseDict reads the header's dict as numpy does: exactly the keys
// descr, fortran_order and shape.
func (h *npyHeader) parseDict(s string) error {
	p := &pyParser{s: s}
	v, err := p.value(0)
	if err == nil {
		p.space()
		if p.i != len(p.s) {
			err = p.errorf("unexpected %q after the dict", p.rest())
		}
	}
	if err != nil {
		return fmt.Errorf(".npy header %q: %w", strings.TrimSpace(s), err)
	}
	d, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf(".npy header %q is not a dict", strings.TrimSpace(s))
	}
	for _, k := range []string{"descr", "fortran_order", "shape"} {
		if _, ok := d[k]; !ok {
			return fmt.Errorf(".npy header %q has no %q", strings.TrimSpace(s), k)
		}
	}
	if len(d) != 3 {
		return fmt.Errorf(".npy header %q: want exactly the keys descr, fortran_order and shape", strings.TrimSpace(s))
	}
	switch descr := d["descr"].(type) {
	case string:
		h.descr = descr
	case []any:
		return fmt.Errorf(".npy header: a structured dtype (descr %s): want an array of one plain type (int, uint, float or bool)", pyRepr(descr))
	default:
		return fmt.Errorf(".npy header: descr %s is not a type string", pyRepr(d["descr"]))
	}
	fo, ok := d["fortran_order"].(bool)
	if !ok {
		return fmt.Errorf(".npy header: fortran_order %s is not True or False", pyRepr(d["fortran_order"]))
	}
	h.fortran = fo
	shape, ok := d["shape"].(tuple)
	if !ok {
		return fmt.Errorf(".npy header: shape %s is not a tuple", pyRepr(d["shape"]))
	}
	h.shape = make([]int64, len(shape))
	for i, x := range shape {
		n, ok := x.(int64)
		if !ok || n < 0 {
			return fmt.Errorf(".npy header: shape %s: want non-negative integers", pyRepr(d["shape"]))
		}
		h.shape[i] = n
	}
	return nil
}

// npyType maps a .npy type string to a ddstore dtype and item size.
func npyType(descr string) (string, int64, error) {
	if len(descr) >= 2 && descr[1] == 'O' {
		return "", 0, fmt.Errorf("dtype %q holds Python objects (pointers), not data", descr)
	}
	if len(descr) < 3 {
		return "", 0, fmt.Errorf("dtype %q: want e.g. '<f4'", descr)
	}
	order, kind := descr[0], descr[1]
	size, err := strconv.ParseInt(descr[2:], 10, 64)
	if err != nil || size <= 0 {
		return "", 0, fmt.Errorf("dtype %q: want e.g. '<f4'", descr)
	}
	switch order {
	case '<', '|':
	case '=':
		if !littleEndian {
			return "", 0, fmt.Errorf("dtype %q: native order on a big-endian machine", descr)
		}
	case '>':
		if size > 1 {
			return "", 0, fmt.Errorf("dtype %q is big-endian: save the array little-endian (numpy: a.astype('<%c%d'))", descr, kind, size)
		}
	default:
		return "", 0, fmt.Errorf("dtype %q: unknown byte order %q", descr, order)
	}
	var name string
	switch kind {
	case 'b':
		if size == 1 {
			name = "bool"
		}
	case 'i':
		name = map[int64]string{1: "int8", 2: "int16", 4: "int32", 8: "int64"}[size]
	case 'u':
		name = map[int64]string{1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}[size]
	case 'f':
		name = map[int64]string{2: "float16", 4: "float32", 8: "float64"}[size]
	default:
		return "", 0, fmt.Errorf("dtype %q (kind %q): want bool, int, uint or float items", descr, kind)
	}
	if name == "" {
		return "", 0, fmt.Errorf("dtype %q: no %d-byte items of kind %q", descr, size, kind)
	}
	if !littleEndian && size > 1 {
		return "", 0, fmt.Errorf("dtype %q is little-endian and this machine is not", descr)
	}
	return name, size, nil
}

var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// openNPY opens a .npy array; its rows are the first dimension.
func openNPY(name string, opts Options) (Source, error) {
	f, size, err := openRegular(name)
	if err != nil {
		return nil, err
	}
	s, err := npyFromHeader(name, f, size, opts)
	if err != nil {
		f.Close()
		return nil, err
	}
	return s, nil
}

func npyFromHeader(name string, f *os.File, size int64, opts Options) (*flat, error) {
	h, err := readNPYHeader(io.NewSectionReader(f, 0, min(size, maxNPYHeader+12)))
	if err != nil {
		return nil, base.Errorf(base.ErrArgument, "source %s: %v", name, err)
	}
	if h.fortran {
		return nil, base.Errorf(base.ErrArgument, "source %s: fortran_order is True (column-major): rows are not contiguous; save it C-ordered (numpy: np.save(f, np.ascontiguousarray(a)))", name)
	}
	dtype, is, err := npyType(h.descr)
	if err != nil {
		return nil, base.Errorf(base.ErrArgument, "source %s: %v", name, err)
	}
	if err := checkGeometry(name, h.shape, is); err != nil {
		return nil, err
	}
	rowShape := h.shape[1:]
	rb := Disp(rowShape) * is
	want := h.shape[0] * rb // checkGeometry bounds it
	if size-h.dataOff < want {
		return nil, base.Errorf(base.ErrArgument, "source %s is truncated: its header says shape %s of %s, %d bytes of data after a %d-byte header, but the file has %d bytes (%d short)",
			name, shapeRepr(h.shape), h.descr, want, h.dataOff, size, h.dataOff+want-size)
	}
	return &flat{f: f, name: name, off: h.dataOff, geometry: geometry{rows: h.shape[0], rowShape: rowShape, dtype: dtype,
		itemSize: is, rowBytes: rb, chunkRows: chunkRowsFor(rb, opts.ChunkBytes)}}, nil
}

func shapeRepr(shape []int64) string {
	parts := make([]string, len(shape))
	for i, n := range shape {
		parts[i] = strconv.FormatInt(n, 10)
	}
	if len(parts) == 1 {
		return "(" + parts[0] + ",)"
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// pyParser reads the Python literals a .npy header holds: dicts, tuples,
// lists, strings, integers, True, False and None.
type pyParser struct {
	s string
	i int
}

// maxPyDepth bounds nesting (structured dtypes nest; nothing else does).
const maxPyDepth = 32

func (p *pyParser) errorf(format string, args ...any) error {
	return fmt.Errorf("at byte %d: %s", p.i, fmt.Sprintf(format, args...))
}

func (p *pyParser) rest() string {
	r := p.s[p.i:]
	if len(r) > 16 {
		r = r[:16] + "..."
	}
	return r
}

func (p *pyParser) space() {
	for p.i < len(p.s) && strings.IndexByte(" \t\n\r", p.s[p.i]) >= 0 {
		p.i++
	}
}

func (p *pyParser) value(depth int) (any, error) {
	if depth > maxPyDepth {
		return nil, p.errorf("nested more than %d deep", maxPyDepth)
	}
	p.space()
	if p.i >= len(p.s) {
		return nil, p.errorf("unexpected end")
	}
	switch c := p.s[p.i]; {
	case c == '{':
		return p.dict(depth)
	case c == '(' || c == '[':
		return p.seq(depth)
	case c == '\'' || c == '"':
		return p.str()
	case c == '-' || (c >= '0' && c <= '9'):
		return p.int()
	default:
		for _, kw := range []struct {
			word string
			v    any
		}{{"True", true}, {"False", false}, {"None", nil}} {
			if strings.HasPrefix(p.s[p.i:], kw.word) {
				p.i += len(kw.word)
				return kw.v, nil
			}
		}
		return nil, p.errorf("unexpected %q", p.rest())
	}
}

func (p *pyParser) dict(depth int) (any, error) {
	p.i++ // {
	d := map[string]any{}
	for {
		p.space()
		if p.i < len(p.s) && p.s[p.i] == '}' {
			p.i++
			return d, nil
		}
		k, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		key, ok := k.(string)
		if !ok {
			return nil, p.errorf("dict key %s is not a string", pyRepr(k))
		}
		p.space()
		if p.i >= len(p.s) || p.s[p.i] != ':' {
			return nil, p.errorf("want ':' after key %q", key)
		}
		p.i++
		v, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		if _, dup := d[key]; dup {
			return nil, p.errorf("key %q twice", key)
		}
		d[key] = v
		p.space()
		if p.i < len(p.s) && p.s[p.i] == ',' {
			p.i++
			continue
		}
		if p.i < len(p.s) && p.s[p.i] == '}' {
			p.i++
			return d, nil
		}
		return nil, p.errorf("want ',' or '}' in a dict")
	}
}

// seq reads a tuple or a list; a tuple of one item needs its comma, as in
// Python, so that (3) is the integer 3.
func (p *pyParser) seq(depth int) (any, error) {
	open := p.s[p.i]
	closer := byte(')')
	if open == '[' {
		closer = ']'
	}
	p.i++
	var items []any
	commas := 0
	for {
		p.space()
		if p.i < len(p.s) && p.s[p.i] == closer {
			p.i++
			break
		}
		v, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		items = append(items, v)
		p.space()
		if p.i < len(p.s) && p.s[p.i] == ',' {
			p.i++
			commas++
			continue
		}
		if p.i < len(p.s) && p.s[p.i] == closer {
			p.i++
			break
		}
		return nil, p.errorf("want ',' or %q", closer)
	}
	if open == '(' && len(items) == 1 && commas == 0 {
		return items[0], nil // parentheses around a value
	}
	if items == nil {
		items = []any{}
	}
	if open == '(' {
		return tuple(items), nil
	}
	return items, nil
}

// tuple is a parsed tuple; a list is a []any.
type tuple []any

func (p *pyParser) str() (any, error) {
	q := p.s[p.i]
	p.i++
	var b strings.Builder
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == q:
			p.i++
			return b.String(), nil
		case c == '\\':
			if p.i+1 >= len(p.s) {
				return nil, p.errorf("unterminated string")
			}
			b.WriteByte(p.s[p.i+1])
			p.i += 2
		default:
			b.WriteByte(c)
			p.i++
		}
	}
	return nil, p.errorf("unterminated string")
}

func (p *pyParser) int() (any, error) {
	j := p.i
	if p.s[j] == '-' {
		j++
	}
	for j < len(p.s) && p.s[j] >= '0' && p.s[j] <= '9' {
		j++
	}
	n, err := strconv.ParseInt(p.s[p.i:j], 10, 64)
	if err != nil {
		return nil, p.errorf("integer %q: %v", p.s[p.i:j], err)
	}
	p.i = j
	if p.i < len(p.s) && (p.s[p.i] == 'L' || p.s[p.i] == 'l') {
		p.i++ // Python 2 wrote long integers so
	}
	return n, nil
}

// pyRepr writes a parsed value back, for error messages.
func pyRepr(v any) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case bool:
		if x {
			return "True"
		}
		return "False"
	case string:
		return strconv.Quote(x)
	case int64:
		return strconv.FormatInt(x, 10)
	case tuple:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = pyRepr(e)
		}
		if len(parts) == 1 {
			return "(" + parts[0] + ",)"
		}
		return "(" + strings.Join(parts, ", ") + ")"
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = pyRepr(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case map[string]any:
		return "{...}"
	}
	return fmt.Sprint(v)
}

// ReadNPYInts reads a 1-d .npy array of integers (int8 … int64, uint8 …
// uint64) from r, named name in errors, as int64s: sizes and offsets of
// rows, as `ddstore schedule --sizes` takes them.
func ReadNPYInts(r io.Reader, name string) ([]int64, error) {
	h, err := readNPYHeader(r)
	if err != nil {
		return nil, base.Errorf(base.ErrArgument, "%s: %v", name, err)
	}
	dtype, is, err := npyType(h.descr)
	if err != nil {
		return nil, base.Errorf(base.ErrArgument, "%s: %v", name, err)
	}
	if len(h.shape) != 1 {
		return nil, base.Errorf(base.ErrArgument, "%s: shape %s: want a 1-d array", name, shapeRepr(h.shape))
	}
	if !strings.HasPrefix(dtype, "int") && !strings.HasPrefix(dtype, "uint") {
		return nil, base.Errorf(base.ErrArgument, "%s: dtype %s: want integers", name, dtype)
	}
	n := h.shape[0]
	if n > math.MaxInt32+1 {
		return nil, base.Errorf(base.ErrArgument, "%s: %d items, above %d", name, n, int64(math.MaxInt32)+1)
	}
	// The header's padding after the dict was read with it; the data
	// follow, read a block at a time (a header may announce more than the
	// stream holds).
	out := make([]int64, 0, min(n, 1<<20))
	block := make([]byte, 64<<10)
	for int64(len(out)) < n {
		k := min(n-int64(len(out)), int64(len(block))/is)
		if _, err := io.ReadFull(r, block[:k*is]); err != nil {
			return nil, base.Errorf(base.ErrArgument, "%s is truncated: %d items of %s want %d bytes of data, it ends after item %d: %v",
				name, n, h.descr, n*is, len(out), err)
		}
		for j := range k {
			v, err := npyInt(block[j*is:], dtype)
			if err != nil {
				return nil, base.Errorf(base.ErrArgument, "%s: item %d: %v", name, len(out), err)
			}
			out = append(out, v)
		}
	}
	return out, nil
}

// npyInt decodes one little-endian integer of dtype at the start of b.
func npyInt(b []byte, dtype string) (int64, error) {
	switch dtype {
	case "int8":
		return int64(int8(b[0])), nil
	case "uint8":
		return int64(b[0]), nil
	case "int16":
		return int64(int16(binary.LittleEndian.Uint16(b))), nil
	case "uint16":
		return int64(binary.LittleEndian.Uint16(b)), nil
	case "int32":
		return int64(int32(binary.LittleEndian.Uint32(b))), nil
	case "uint32":
		return int64(binary.LittleEndian.Uint32(b)), nil
	case "int64":
		return int64(binary.LittleEndian.Uint64(b)), nil
	default: // uint64
		u := binary.LittleEndian.Uint64(b)
		if u > math.MaxInt64 {
			return 0, fmt.Errorf("%d is above %d", u, int64(math.MaxInt64))
		}
		return int64(u), nil
	}
}
