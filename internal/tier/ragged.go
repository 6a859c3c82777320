package tier

// The backing file of a ragged variable: a pair of datasets, the flat
// values (units of the trailing shape one after another) and the offsets
// (N+1 integers, row g being units [off[g], off[g+1])), as naming.Pair
// names them. The offsets are read once, into the node's index; the tier
// reads rows of the values by them.

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/naming"
	"github.com/ddstore-go/ddstore/internal/source"
)

// offsetsBlock is how many offsets one read of the offsets dataset takes.
const offsetsBlock = 1 << 16

// OpenRagged opens the backing pair (naming.Pair as sent) of a ragged
// variable with units of ub bytes of dtype ("" for untyped) and total
// rows, and checks it: values of rows of ub bytes (of dtype), offsets a
// 1-D dataset of integers, at least total+1 of them, starting at 0, never
// decreasing, the last one the values' length. It reads every offset to
// check them (in blocks: it holds none) and returns both datasets open.
func OpenRagged(spec, dtype string, ub, total int64) (values, offsets source.Source, err error) {
	values, offsets, err = OpenPair(spec, dtype, ub, total)
	if err != nil {
		return nil, nil, err
	}
	p, _ := naming.ParsePair(spec)
	if err := checkOffsets(p.Offsets.String(), offsets, values.Rows()); err != nil {
		values.Close()
		offsets.Close()
		return nil, nil, err
	}
	return values, offsets, nil
}

// OpenPair is OpenRagged without reading the offsets: both datasets open,
// their shapes and types checked, as the node's index is filled from the
// offsets after every rank's agent has checked them (OpenRagged).
func OpenPair(spec, dtype string, ub, total int64) (values, offsets source.Source, err error) {
	p, err := naming.ParsePair(spec)
	if err != nil {
		return nil, nil, err
	}
	vs, ofs := p.Values.String(), p.Offsets.String()
	values, err = source.Open(vs, source.Options{RowBytes: ub, Dtype: dtype, ChunkBytes: gapBytes})
	if err != nil {
		return nil, nil, fmt.Errorf("ragged values: %w", err)
	}
	offsets, err = source.Open(ofs, source.Options{ChunkBytes: gapBytes})
	if err == nil {
		err = checkOffsetsShape(ofs, offsets, total)
	} else {
		err = fmt.Errorf("ragged offsets: %w", err)
	}
	if err != nil {
		values.Close()
		if offsets != nil {
			offsets.Close()
		}
		return nil, nil, err
	}
	return values, offsets, nil
}

// checkOffsetsShape checks that the offsets dataset is 1-D integers, at
// least total+1 of them.
func checkOffsetsShape(spec string, src source.Source, total int64) error {
	if sh := src.RowShape(); len(sh) != 0 {
		return base.Errorf(base.ErrArgument, "ragged offsets %s: shape (%d, %v): want a 1-D dataset of rows + 1 integers", spec, src.Rows(), sh)
	}
	if _, ok := offsetTypes[src.Dtype()]; !ok {
		return base.Errorf(base.ErrArgument, "ragged offsets %s hold items of %s: want integers (int64, int32, uint64, uint32)", spec, src.Dtype())
	}
	if m := src.Rows(); m < total+1 {
		return base.Errorf(base.ErrGeometry, "ragged offsets %s: %d offsets are %d rows: the variable has %d", spec, m, max(m-1, 0), total)
	}
	return nil
}

// checkOffsets reads every offset, checking that they start at 0, never
// decrease and end at the values' units.
func checkOffsets(spec string, src source.Source, units int64) error {
	m := src.Rows()
	buf := make([]int64, min(m, offsetsBlock))
	prev := int64(0)
	for lo := int64(0); lo < m; lo += offsetsBlock {
		b := buf[:min(offsetsBlock, m-lo)]
		if err := ReadOffsets(src, lo, b); err != nil {
			return fmt.Errorf("ragged offsets %s: %w", spec, err)
		}
		for i, o := range b {
			g := lo + int64(i)
			switch {
			case g == 0 && o != 0:
				return base.Errorf(base.ErrGeometry, "ragged offsets %s: offsets[0] = %d: want 0", spec, o)
			case o < prev:
				return base.Errorf(base.ErrGeometry, "ragged offsets %s: offsets[%d] = %d after offsets[%d] = %d: offsets must not decrease", spec, g, o, g-1, prev)
			}
			prev = o
		}
	}
	if prev != units {
		return base.Errorf(base.ErrGeometry, "ragged offsets %s: the last offset, offsets[%d], is %d but the values have %d units: want them equal", spec, m-1, prev, units)
	}
	return nil
}

// offsetTypes are the integer types an offsets dataset may hold, by size.
var offsetTypes = map[string]int64{"int64": 8, "uint64": 8, "int32": 4, "uint32": 4}

// ReadOffsets reads offsets [first, first+len(dst)) of an offsets dataset
// into dst: straight into it for int64, else through a scratch buffer,
// widened.
func ReadOffsets(src source.Source, first int64, dst []int64) error {
	n := int64(len(dst))
	if n == 0 {
		return nil
	}
	raw := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(dst))), n*8)
	switch src.Dtype() {
	case "int64":
		return src.ReadRows(first, n, raw)
	case "uint64":
		if err := src.ReadRows(first, n, raw); err != nil {
			return err
		}
		for i, o := range dst {
			if o < 0 {
				return base.Errorf(base.ErrGeometry, "offsets[%d] = %d: more than an int64 holds", first+int64(i), uint64(o))
			}
		}
		return nil
	case "int32", "uint32":
		// The 4-byte items go in the first half of dst's bytes, then
		// widen from the last down, so that no item is overwritten unread.
		if err := src.ReadRows(first, n, raw[:n*4]); err != nil {
			return err
		}
		signed := src.Dtype() == "int32"
		for i := n - 1; i >= 0; i-- {
			u := binary.LittleEndian.Uint32(raw[i*4:])
			if signed {
				dst[i] = int64(int32(u))
			} else {
				dst[i] = int64(u)
			}
		}
		return nil
	}
	return base.Errorf(base.ErrArgument, "offsets of %s: want integers", src.Dtype())
}
