package ddstore_test

// Ragged variables with a backing file: a pair of datasets, the flat
// values and the offsets, here two .npy files (raggedtier_hdf5_test.go:
// datasets of one HDF5 file, written by h5py).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/agent"
	"github.com/ddstore-go/ddstore/internal/testutil"
)

// raggedFile is a ragged dataset as its backing pair holds it: the
// offsets of every row (in units of ub bytes), row g's bytes patterned by
// g, so that a row from the wrong place or of the wrong length never
// passes.
type raggedFile struct {
	off []int64 // N+1
	ub  int64
}

func newRaggedFile(seed uint64, n, ub, maxLen int64) *raggedFile {
	rng := rand.New(rand.NewPCG(seed, 5))
	f := &raggedFile{off: make([]int64, n+1), ub: ub}
	for g := range n {
		l := int64(0)
		if rng.IntN(6) != 0 { // rows of no units too
			l = rng.Int64N(maxLen + 1)
		}
		f.off[g+1] = f.off[g] + l
	}
	return f
}

func (f *raggedFile) rows() int64 { return int64(len(f.off)) - 1 }

// span is rows [lo, hi) packed, and their lengths.
func (f *raggedFile) span(lo, hi int64) ([]byte, []int64) {
	return f.naive(rangeOf(lo, hi))
}

func rangeOf(lo, hi int64) []int64 {
	idx := make([]int64, 0, hi-lo)
	for g := lo; g < hi; g++ {
		idx = append(idx, g)
	}
	return idx
}

// naive is what a batch of rows reads: the rows copied one after another.
func (f *raggedFile) naive(indices []int64) ([]byte, []int64) {
	var b []byte
	lengths := make([]int64, 0, len(indices))
	for _, g := range indices {
		n := f.off[g+1] - f.off[g]
		row := make([]byte, n*f.ub)
		pattern(row, g)
		b = append(b, row...)
		lengths = append(lengths, n)
	}
	return b, lengths
}

// nonEmpty counts the rows of [lo, hi) that are not empty.
func (f *raggedFile) nonEmpty(lo, hi int64) int {
	n := 0
	for g := lo; g < hi; g++ {
		if f.off[g+1] > f.off[g] {
			n++
		}
	}
	return n
}

// writeNPYArray writes data as a .npy array of the given descr and shape.
func writeNPYArray(t testing.TB, path, descr string, shape []int64, data []byte) {
	t.Helper()
	dims := make([]string, len(shape))
	for i, d := range shape {
		dims[i] = fmt.Sprint(d)
	}
	sh := strings.Join(dims, ", ")
	if len(shape) == 1 {
		sh += ","
	}
	dict := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, sh)
	pad := (64 - (10+len(dict)+1)%64) % 64
	header := dict + strings.Repeat(" ", pad) + "\n"
	buf := []byte("\x93NUMPY\x01\x00")
	buf = append(buf, byte(len(header)), byte(len(header)>>8))
	buf = append(buf, header...)
	buf = append(buf, data...)
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Fatal(err)
	}
}

// offsetsBytes is offsets as little-endian int64s.
func offsetsBytes(off []int64) []byte {
	b := make([]byte, 8*len(off))
	for i, o := range off {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(o))
	}
	return b
}

// writeNPYPair writes f as values.npy (float32, shape (units, 3)) and
// offsets.npy (int64) in dir and returns their names.
func (f *raggedFile) writeNPYPair(t testing.TB, dir string) (values, offsets string) {
	t.Helper()
	values, offsets = filepath.Join(dir, "values.npy"), filepath.Join(dir, "offsets.npy")
	v, _ := f.span(0, f.rows())
	writeNPYArray(t, values, "<f4", []int64{f.off[f.rows()], 3}, v)
	writeNPYArray(t, offsets, "<i8", []int64{int64(len(f.off))}, offsetsBytes(f.off))
	return values, offsets
}

// addBacked adds f as ragged float32 rows of shape [3] backed by the
// pair, its first held rows spread over the ranks in contiguous blocks.
func (f *raggedFile) addBacked(t testing.TB, c *cluster, name, values, offsets string, held int64) {
	t.Helper()
	c.mustEach(t, func(r int, s *ddstore.Store) error { return f.add(c, r, s, name, values, offsets, held) })
}

func (f *raggedFile) add(c *cluster, r int, s *ddstore.Store, name, values, offsets string, held int64) error {
	p := int64(len(c.stores))
	lo, hi := int64(r)*held/p, int64(r+1)*held/p
	v, lengths := f.span(lo, hi)
	return s.AddRaggedBacked(name, v, lengths, ddstore.Float32, ddstore.Backing{File: values, Offsets: offsets, Rows: f.rows()}, 3)
}

// readAll reads f's variable from every rank in shuffled batches with
// repeats, prefetching the next batch, then row by row, and checks every
// row against the file.
func (f *raggedFile) readAll(t testing.TB, c *cluster, name string) {
	t.Helper()
	n := f.rows()
	c.mustEach(t, func(r int, s *ddstore.Store) error {
		rng := rand.New(rand.NewPCG(uint64(r), 17))
		perm := rng.Perm(int(n))
		const batch = 16
		next := func(step int) []int64 {
			idx := make([]int64, 0, batch+1)
			for _, g := range perm[min(step*batch, int(n)):min((step+1)*batch, int(n))] {
				idx = append(idx, int64(g))
			}
			if len(idx) > 0 {
				idx = append(idx, idx[0]) // a repeat
			}
			return idx
		}
		dst := make([]byte, 0)
		for step := 0; step*batch < int(n); step++ {
			if nx := next(step + 1); len(nx) > 0 {
				if err := s.Prefetch(name, nx); err != nil {
					return fmt.Errorf("prefetch: %w", err)
				}
			}
			idx := next(step)
			want, wantLen := f.naive(idx)
			lengths := make([]int64, len(idx))
			size, err := s.RaggedSizes(name, idx, lengths)
			if err != nil {
				return err
			}
			if size != int64(len(want)) || !slices.Equal(lengths, wantLen) {
				return fmt.Errorf("sizes of %v: %d bytes, %v; want %d, %v", idx, size, lengths, len(want), wantLen)
			}
			if int64(cap(dst)) < size {
				dst = make([]byte, size)
			}
			got, err := s.GetRagged(name, dst[:size], idx, lengths)
			if err != nil {
				return fmt.Errorf("rows %v: %w", idx, err)
			}
			if got != size || string(dst[:got]) != string(want) {
				return fmt.Errorf("rows %v: read %d bytes, want %d; the rows differ from the file", idx, got, len(want))
			}
		}
		for g := range n {
			row := make([]byte, (f.off[g+1]-f.off[g])*f.ub)
			got, err := s.GetRaggedRow(name, row, g)
			if err != nil || got != int64(len(row)) {
				return fmt.Errorf("row %d: %d bytes, %v; want %d", g, got, err, len(row))
			}
			if err := samePattern(row, g); err != nil {
				return err
			}
		}
		return nil
	})
}

// counters are node i's agent counters.
func (c *cluster) counters(t testing.TB, i int) map[string]int {
	t.Helper()
	in, err := ddstore.QueryAgent(c.agents[i].Socket(), c.ns, fmt.Sprintf("node%d", i))
	if err != nil {
		t.Fatal(err)
	}
	return in.Counters
}

// checkCoalesced reads rows [lo, hi) of f's variable (only the file holds
// them, none read before, and they lie within a few KiB of the file) on
// rank 0 and checks that node 0's agent read them with one read; then
// prefetches rows [hi, hi+k), waits until they are read ahead and reads
// them from staging.
func (f *raggedFile) checkCoalesced(t *testing.T, c *cluster, name string, lo, hi, k int64) {
	t.Helper()
	s := c.stores[0]
	before := c.counters(t, 0)
	want, _ := f.span(lo, hi)
	dst := make([]byte, len(want))
	if _, err := s.GetRagged(name, dst, rangeOf(lo, hi), nil); err != nil || string(dst) != string(want) {
		t.Fatalf("rows [%d, %d): %v, or they differ from the file", lo, hi, err)
	}
	after := c.counters(t, 0)
	if d, rows := after["storage_reads"]-before["storage_reads"], after["storage_rows"]-before["storage_rows"]; d != 1 || rows != f.nonEmpty(lo, hi) {
		t.Errorf("rows [%d, %d) of the file took %d reads for %d rows: want 1 read of %d rows (those not empty)", lo, hi, d, rows, f.nonEmpty(lo, hi))
	}
	ahead := rangeOf(hi, hi+k)
	nonEmpty := f.nonEmpty(hi, hi+k)
	if err := s.Prefetch(name, ahead); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		if got := c.counters(t, 0)["prefetch_rows"] - after["prefetch_rows"]; got < nonEmpty {
			return fmt.Errorf("%d rows read ahead, want %d", got, nonEmpty)
		}
		return nil
	})
	want, _ = f.span(hi, hi+k)
	dst = make([]byte, len(want))
	if _, err := s.GetRagged(name, dst, ahead, nil); err != nil || string(dst) != string(want) {
		t.Fatalf("rows [%d, %d) read ahead: %v, or they differ from the file", hi, hi+k, err)
	}
	if got := c.counters(t, 0)["staged_rows"] - after["staged_rows"]; got != nonEmpty {
		t.Errorf("%d rows served from staging, want %d", got, nonEmpty)
	}
}

// TestClusterRaggedBackedNPY: a ragged variable backed by two .npy files,
// a quarter of its rows in memory, reads the same as the file from every
// rank of two nodes, in shuffled batches with prefetch and row by row;
// neighbouring rows of the file cost one read, rows read ahead are served
// from staging, and a staging area far smaller than the rows still reads
// them right.
func TestClusterRaggedBackedNPY(t *testing.T) {
	f := newRaggedFile(1, 400, 12, 24)
	values, offsets := f.writeNPYPair(t, t.TempDir())
	for _, staging := range []int64{0, 2 << 10} {
		t.Run(fmt.Sprintf("staging=%d", staging), func(t *testing.T) {
			c := startCluster(t, []int{2, 1}, viaRendezvous, func(cfg *agent.Config) { cfg.StagingBytes = staging })
			f.addBacked(t, c, "pos", values, offsets, 100)
			if staging == 0 {
				f.checkCoalesced(t, c, "pos", 300, 310, 20)
			}
			f.readAll(t, c, "pos")
			in, err := c.stores[1].Info("pos")
			if err != nil {
				t.Fatal(err)
			}
			if !in.Ragged || in.TotalRows != f.rows() || in.TotalItems != f.off[f.rows()] || in.HeldRows != 100 || in.Backing != values || in.BackingOffsets != offsets {
				t.Errorf("info %+v: want %d ragged rows of %d units, 100 held", in, f.rows(), f.off[f.rows()])
			}
			ai, err := ddstore.QueryAgent(c.agents[0].Socket(), c.ns, "node0")
			if err != nil || len(ai.Variables) != 1 {
				t.Fatalf("agent info %+v, %v", ai, err)
			}
			if av := ai.Variables[0]; av.Backing != values || av.BackingOffsets != offsets || av.TotalBytes != f.off[f.rows()]*12 || av.IndexBytes != (f.rows()+1)*8 {
				t.Errorf("agent's variable %+v: want backing %s and %s, %d bytes, an index of %d offsets", av, values, offsets, f.off[f.rows()]*12, f.rows()+1)
			}
			if p, err := c.stores[2].Profile("pos"); err != nil || p.StorageRows == 0 || p.RemoteRows == 0 || p.LocalRows == 0 {
				t.Errorf("profile %+v, %v: want rows of this node, of the other and of the file", p, err)
			}
			c.mustEach(t, func(r int, s *ddstore.Store) error { return s.Free("pos") })
		})
	}
}

// TestClusterRaggedBackedPeerLoss: once a node's agent is gone, the rows
// it held of a ragged variable with a backing file are read from the file.
func TestClusterRaggedBackedPeerLoss(t *testing.T) {
	f := newRaggedFile(2, 120, 12, 10)
	values, offsets := f.writeNPYPair(t, t.TempDir())
	c := startCluster(t, []int{1, 1}, viaRendezvous)
	f.addBacked(t, c, "pos", values, offsets, f.rows()) // all in memory, rank 1 holding [60, 120)
	idx := []int64{5, 70, 119, 0, 61}
	want, _ := f.naive(idx)
	dst := make([]byte, len(want))
	s := c.stores[0]
	if _, err := s.GetRagged("pos", dst, idx, nil); err != nil || string(dst) != string(want) {
		t.Fatalf("before the loss: %v, or the rows differ", err)
	}
	c.agents[1].Close()
	clear(dst)
	if _, err := s.GetRagged("pos", dst, idx, nil); err != nil || string(dst) != string(want) {
		t.Fatalf("rows of a lost node: %v, or the rows differ from the file", err)
	}
	var lost int
	for _, g := range idx {
		if g >= 60 && f.off[g+1] > f.off[g] {
			lost++
		}
	}
	if got := c.counters(t, 0)["peer_fallback_rows"]; got != lost {
		t.Errorf("peer_fallback_rows = %d, want %d", got, lost)
	}
}

// TestClusterRaggedBackedErrors: bad pairs fail the add on every rank with
// an error naming the value and what was expected, and the store keeps
// working.
func TestClusterRaggedBackedErrors(t *testing.T) {
	dir := t.TempDir()
	f := newRaggedFile(3, 50, 12, 6)
	values, offsets := f.writeNPYPair(t, dir)
	write := func(name string, off []int64) string {
		p := filepath.Join(dir, name)
		writeNPYArray(t, p, "<i8", []int64{int64(len(off))}, offsetsBytes(off))
		return p
	}
	down := slices.Clone(f.off)
	down[20], down[21] = f.off[21]+1, f.off[21] // offsets[21] < offsets[20]
	decreasing := write("decreasing.npy", down)
	short := slices.Clone(f.off)
	short[len(short)-1]--
	shortEnd := write("short.npy", short)
	floats := filepath.Join(dir, "floatoffsets.npy")
	writeNPYArray(t, floats, "<f8", []int64{int64(len(f.off))}, offsetsBytes(f.off))
	c := startCluster(t, []int{1, 1}, viaRendezvous)
	add := func(values, offsets string, rows int64, dt ddstore.Dtype, shape ...int64) []error {
		return c.each(func(r int, s *ddstore.Store) error {
			v, lengths := f.span(int64(r)*5, int64(r+1)*5)
			return s.AddRaggedBacked("v", v, lengths, dt, ddstore.Backing{File: values, Offsets: offsets, Rows: rows}, shape...)
		})
	}
	for _, tc := range []struct {
		name  string
		errs  []error
		want  error
		words string
	}{
		{"decreasing offsets", add(values, decreasing, 50, ddstore.Float32, 3), ddstore.ErrGeometry, fmt.Sprintf("offsets[21] = %d after offsets[20] = %d: offsets must not decrease", down[21], down[20])},
		{"last offset not the values' length", add(values, shortEnd, 50, ddstore.Float32, 3), ddstore.ErrGeometry, fmt.Sprintf("is %d but the values have %d units", short[50], f.off[50])},
		{"values of another type", add(values, offsets, 50, ddstore.Int32, 3), ddstore.ErrArgument, "holds items of float32, not int32"},
		{"values of another trailing shape", c.each(func(r int, s *ddstore.Store) error {
			return s.AddRaggedBacked("v", nil, nil, ddstore.Float32, ddstore.Backing{File: values, Offsets: offsets, Rows: 50}, 4)
		}), ddstore.ErrArgument, "rows of 12 bytes"},
		{"offsets of floats", add(values, floats, 50, ddstore.Float32, 3), ddstore.ErrArgument, "hold items of float64: want integers"},
		{"missing offsets file", add(values, filepath.Join(dir, "nope.npy"), 50, ddstore.Float32, 3), ddstore.ErrArgument, "nope.npy"},
		{"more rows than the offsets", add(values, offsets, 51, ddstore.Float32, 3), ddstore.ErrGeometry, "51 offsets are 50 rows: the variable has 51"},
		{"no offsets named", add(values, "", 50, ddstore.Float32, 3), ddstore.ErrArgument, "want both files named"},
		{"one file for both", add(values, values, 50, ddstore.Float32, 3), ddstore.ErrArgument, "values and offsets are both"},
		{"offsets for fixed rows", c.each(func(r int, s *ddstore.Store) error {
			return s.AddBacked("v", make([]byte, 12), 3, ddstore.Float32, ddstore.Backing{File: values, Offsets: offsets, Rows: 50})
		}), ddstore.ErrArgument, "offsets are for a ragged variable"},
	} {
		for r, err := range tc.errs {
			if !errors.Is(err, tc.want) && !(r > 0 && errors.Is(err, ddstore.ErrGeometry)) {
				t.Errorf("%s: rank %d: %v, want %v", tc.name, r, err, tc.want)
				continue
			}
			if r == 0 && !strings.Contains(err.Error(), tc.words) {
				t.Errorf("%s: rank %d: %q does not say %q", tc.name, r, err, tc.words)
			}
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	// Shards whose rows are not the file's first rows: the round
	// completes, then every node finds it building its index.
	errs := c.each(func(r int, s *ddstore.Store) error {
		lengths := []int64{f.off[1] - f.off[0] + 1}
		return s.AddRaggedBacked("v", make([]byte, lengths[0]*12), lengths, ddstore.Float32, ddstore.Backing{File: values, Offsets: offsets, Rows: 50}, 3)
	})
	for r, err := range errs {
		if !errors.Is(err, ddstore.ErrGeometry) || !strings.Contains(err.Error(), "the backing file's offsets say") {
			t.Errorf("shards that are not the file's rows: rank %d: %v", r, err)
		}
	}
	c.each(func(r int, s *ddstore.Store) error { return s.Free("v") })
	// After all that, the name is free and a correct add works.
	f.addBacked(t, c, "v", values, offsets, 10)
	f.readAll(t, c, "v")
}

// TestAgentRestartReadoptsRaggedBacked: a ragged variable with a backing
// file survives a SIGKILLed agent: the restarted agent re-adopts its
// shards and its node index of every row (the same files), and a store
// opened then reads every row, the file's too.
func TestAgentRestartReadoptsRaggedBacked(t *testing.T) {
	dir := t.TempDir()
	ns := fmt.Sprintf("rbrestart%d", os.Getpid())
	runDir := filepath.Join(dir, "run")
	removeSegmentsAtEnd(t, ns)
	f := newRaggedFile(6, 60, 12, 8)
	values, offsets := f.writeNPYPair(t, dir)
	p := startRestartableAgent(t, "--namespace", ns, "--node", "n0", "--run-dir", runDir, "--timeout", "5s")
	open := func(rank, size int) *ddstore.Store { return openLocal(t, ns, "n0", runDir, rank, size, rank, size) }
	c := &cluster{ns: ns, stores: []*ddstore.Store{open(0, 2), open(1, 2)}}
	f.addBacked(t, c, "rg", values, offsets, 20)
	segs := segments(ns)
	if len(segs) != 3 { // two shards and the index
		t.Fatalf("segments %v", segs)
	}
	before := map[string]uint64{}
	for _, s := range segs {
		before[s] = inode(t, s)
	}
	sock := ddstore.SocketPath(runDir, ns, "n0")
	in, err := ddstore.QueryAgent(sock, ns, "n0")
	if err != nil || len(in.Variables) != 1 || in.Variables[0].IndexBytes != 61*8 {
		t.Fatalf("info %+v, %v: want one ragged variable with an index of 61 offsets", in.Variables, err)
	}
	p.kill()
	p.start()
	testutil.WaitFor(t, 20*time.Second, func() (err error) {
		in, err = ddstore.QueryAgent(sock, ns, "n0")
		return err
	})
	if in.Counters["adopted_variables"] != 1 {
		t.Fatalf("after the restart: adopted %d variables, want 1", in.Counters["adopted_variables"])
	}
	late := open(0, 2)
	want, _ := f.span(0, f.rows())
	dst := make([]byte, len(want))
	if _, err := late.GetRagged("rg", dst, rangeOf(0, f.rows()), nil); err != nil {
		t.Fatal(err)
	}
	if string(dst) != string(want) {
		t.Fatal("rows read after the restart differ from the file")
	}
	for _, s := range segments(ns) {
		if inode(t, s) != before[s] {
			t.Errorf("segment %s was made again, not re-adopted", s)
		}
	}
}
