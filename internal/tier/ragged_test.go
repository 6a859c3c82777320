package tier

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/naming"
	"github.com/ddstore-go/ddstore/internal/testutil"
)

// ub is the bytes of a unit of the ragged rows here: uint8 pairs.
const ub = 2

// writeNPY writes data as a .npy array of the given descr and shape.
func writeNPY(t *testing.T, path, descr, shape string, data []byte) {
	t.Helper()
	dict := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, shape)
	header := dict + strings.Repeat(" ", (64-(10+len(dict)+1)%64)%64) + "\n"
	buf := append([]byte("\x93NUMPY\x01\x00"), byte(len(header)), byte(len(header)>>8))
	buf = append(append(buf, header...), data...)
	if err := os.WriteFile(path, buf, 0o600); err != nil {
		t.Fatal(err)
	}
}

// raggedPair writes rows of lengths[g] units, every byte of row g being
// g, as values.npy (uint8, shape (units, 2)) and offsets.npy (int64), and
// returns the pair as sent and the offsets.
func raggedPair(t *testing.T, lengths []int64) (string, []int64) {
	t.Helper()
	dir := t.TempDir()
	off := make([]int64, len(lengths)+1)
	var values []byte
	for g, n := range lengths {
		off[g+1] = off[g] + n
		values = append(values, slices.Repeat([]byte{byte(g)}, int(n*ub))...)
	}
	ob := make([]byte, 8*len(off))
	for i, o := range off {
		binary.LittleEndian.PutUint64(ob[8*i:], uint64(o))
	}
	vs, ofs := filepath.Join(dir, "values.npy"), filepath.Join(dir, "offsets.npy")
	writeNPY(t, vs, "|u1", fmt.Sprintf("%d, %d", off[len(lengths)], ub), values)
	writeNPY(t, ofs, "<i8", fmt.Sprintf("%d,", len(off)), ob)
	return vs + naming.PairSep + ofs, off
}

// newRaggedTier is the tier of a ragged variable of the given rows, the
// first held in shards, with staging bytes of staging.
func newRaggedTier(t *testing.T, lengths []int64, held, staging int64, admit func(int64, func(string) string) (func(), error)) (*Tier, []int64, *Counters) {
	t.Helper()
	spec, off := raggedPair(t, lengths)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	c := &Counters{}
	tr := New(Config{Name: "g", Spec: spec, Dtype: "uint8", RowBytes: ub, Offsets: off, Held: held, Total: int64(len(lengths)),
		StagingBytes: staging, Admit: admit, Context: ctx, Timeout: 5 * time.Second, Counters: c,
		Go: func(f func()) { wg.Add(1); go func() { defer wg.Done(); f() }() }})
	t.Cleanup(func() {
		tr.Close()
		cancel()
		wg.Wait()
	})
	return tr, off, c
}

func raggedBuffers(off, rows []int64) [][]byte {
	dst := make([][]byte, len(rows))
	for i, g := range rows {
		dst[i] = make([]byte, (off[g+1]-off[g])*ub)
	}
	return dst
}

func checkRagged(t *testing.T, rows []int64, dst [][]byte) {
	t.Helper()
	for i, g := range rows {
		for _, b := range dst[i] {
			if b != byte(g) {
				t.Fatalf("row %d: % x", g, dst[i])
			}
		}
	}
}

// Neighbouring ragged rows, asked in any order and repeated, are read
// with one read of the units from the first's start to the last's end; a
// row larger than a run is read alone.
func TestRaggedReadCoalesces(t *testing.T) {
	lengths := make([]int64, 100)
	for g := range lengths {
		lengths[g] = int64(g % 7)
	}
	lengths[90] = maxRunBytes/ub + 5
	tr, off, c := newRaggedTier(t, lengths, 10, 0, noBudget)
	rows := []int64{50, 12, 13, 51, 12}
	dst := raggedBuffers(off, rows)
	if err := tr.Read(context.Background(), rows, dst); err != nil {
		t.Fatal(err)
	}
	checkRagged(t, rows, dst)
	if want := (off[52] - off[12]) * ub; c.Reads.Load() != 1 || c.Rows.Load() != 5 || c.Bytes.Load() != want {
		t.Errorf("reads %d rows %d bytes %d: want 1 read of 5 rows, %d bytes", c.Reads.Load(), c.Rows.Load(), c.Bytes.Load(), want)
	}
	rows = []int64{89, 90, 91}
	dst = raggedBuffers(off, rows)
	if err := tr.Read(context.Background(), rows, dst); err != nil {
		t.Fatal(err)
	}
	checkRagged(t, rows, dst)
	if c.Reads.Load() != 1+3 {
		t.Errorf("%d reads for rows 89, 90 (more than a run), 91: want 3", c.Reads.Load()-1)
	}
}

// The staging of ragged rows counts bytes: it charges the budget with at
// most its bytes (no more than the rows only the file holds), queues rows
// while their bytes fit, and serves them; what does not fit is dropped and
// read on demand.
func TestRaggedStagingCountsBytes(t *testing.T) {
	lengths := make([]int64, 60)
	for g := range lengths {
		lengths[g] = 8 // 16 bytes a row
	}
	lengths[30] = 0
	var mu sync.Mutex
	var charged int64
	admit := func(n int64, _ func(string) string) (func(), error) {
		mu.Lock()
		charged += n
		mu.Unlock()
		return func() { mu.Lock(); charged -= n; mu.Unlock() }, nil
	}
	tr, off, c := newRaggedTier(t, lengths, 20, 100, admit)
	rows := []int64{30, 40, 41, 42, 43, 44, 45, 46, 47}
	if err := tr.Prefetch(rows); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if charged != 100 {
		t.Errorf("charged %d bytes, want the staging's 100", charged)
	}
	mu.Unlock()
	// 100 bytes hold 6 rows of 16 bytes; the empty row is nothing to read.
	if c.Dropped.Load() != 2 {
		t.Errorf("%d rows dropped, want 2 (of 16 bytes each past 96 of 100)", c.Dropped.Load())
	}
	testutil.WaitFor(t, 5*time.Second, func() error {
		if n := c.Prefetched.Load(); n < 4 {
			return fmt.Errorf("%d rows read ahead, want at least 4", n)
		}
		return nil
	})
	dst := raggedBuffers(off, rows)
	if err := tr.Read(context.Background(), rows, dst); err != nil {
		t.Fatal(err)
	}
	checkRagged(t, rows, dst)
	if s := c.Staged.Load(); s < 4 || s > 6 {
		t.Errorf("%d rows served from staging, want 4 to 6", s)
	}
	// The buffers are used again: a second round of other rows fits.
	more := []int64{50, 51, 52, 53}
	if err := tr.Prefetch(more); err != nil {
		t.Fatal(err)
	}
	dst = raggedBuffers(off, more)
	if err := tr.Read(context.Background(), more, dst); err != nil {
		t.Fatal(err)
	}
	checkRagged(t, more, dst)
	// A tiny variable charges only the bytes its file rows have.
	tr2, _, _ := newRaggedTier(t, []int64{1, 2, 3}, 1, 1<<20, admit)
	if err := tr2.Prefetch([]int64{1, 2}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if charged != 100+5*ub {
		t.Errorf("charged %d bytes for rows of 10 bytes, want 10", charged-100)
	}
}

// A bad pair fails OpenRagged, naming the value and what was expected.
func TestOpenRaggedErrors(t *testing.T) {
	spec, off := raggedPair(t, []int64{2, 0, 3, 1})
	vs, ofs, _ := strings.Cut(spec, naming.PairSep)
	dir := t.TempDir()
	offsets := func(name, descr string, size int, vals []int64) string {
		b := make([]byte, size*len(vals))
		for i, o := range vals {
			if size == 8 {
				binary.LittleEndian.PutUint64(b[8*i:], uint64(o))
			} else {
				binary.LittleEndian.PutUint32(b[4*i:], uint32(o))
			}
		}
		p := filepath.Join(dir, name)
		writeNPY(t, p, descr, fmt.Sprintf("%d,", len(vals)), b)
		return p
	}
	if v, o, err := OpenRagged(spec, "uint8", ub, 4); err != nil {
		t.Fatal(err)
	} else {
		v.Close()
		o.Close()
	}
	// Offsets of int32 and uint32 widen to the same values.
	for _, descr := range []string{"<i4", "<u4"} {
		v, o, err := OpenRagged(vs+naming.PairSep+offsets("o"+descr[1:]+".npy", descr, 4, off), "uint8", ub, 4)
		if err != nil {
			t.Fatalf("offsets of %s: %v", descr, err)
		}
		got := make([]int64, len(off))
		if err := ReadOffsets(o, 0, got); err != nil || !slices.Equal(got, off) {
			t.Errorf("offsets of %s read %v, %v; want %v", descr, got, err, off)
		}
		v.Close()
		o.Close()
	}
	for _, tc := range []struct {
		name, spec, dtype string
		ub, total         int64
		want              error
		words             string
	}{
		{"decreasing", vs + naming.PairSep + offsets("d.npy", "<i8", 8, []int64{0, 2, 1, 5, 6}), "uint8", ub, 4, base.ErrGeometry, "offsets[2] = 1 after offsets[1] = 2: offsets must not decrease"},
		{"not from 0", vs + naming.PairSep + offsets("z.npy", "<i8", 8, []int64{1, 2, 2, 5, 6}), "uint8", ub, 4, base.ErrGeometry, "offsets[0] = 1: want 0"},
		{"short of the values", vs + naming.PairSep + offsets("s.npy", "<i8", 8, []int64{0, 2, 2, 5, 5}), "uint8", ub, 4, base.ErrGeometry, "offsets[4], is 5 but the values have 6 units"},
		{"too few", spec, "uint8", ub, 5, base.ErrGeometry, "5 offsets are 4 rows: the variable has 5"},
		{"floats", vs + naming.PairSep + offsets("f.npy", "<f8", 8, off), "uint8", ub, 4, base.ErrArgument, "hold items of float64: want integers"},
		{"2-D offsets", vs + naming.PairSep + vs, "uint8", ub, 4, base.ErrArgument, "values and offsets are both"},
		{"values of another type", spec, "int16", ub, 4, base.ErrArgument, "holds items of uint8, not int16"},
		{"values of another unit", spec, "uint8", 3, 4, base.ErrArgument, "rows of 2 bytes"},
		{"missing values", filepath.Join(dir, "none.npy") + naming.PairSep + ofs, "uint8", ub, 4, base.ErrArgument, "none.npy"},
		{"not a pair", vs, "uint8", ub, 4, base.ErrArgument, "want a values and an offsets dataset"},
	} {
		_, _, err := OpenRagged(tc.spec, tc.dtype, tc.ub, tc.total)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.words) {
			t.Errorf("%s: %v, want %v saying %q", tc.name, err, tc.want, tc.words)
		}
	}
}
