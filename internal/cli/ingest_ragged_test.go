package cli

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ddstore-go/ddstore"
)

// writeNPYArray writes a version 1.0 .npy file of the items data (little
// endian, of descr such as '<f4') in shape (a Python tuple, "(12, 3)").
func writeNPYArray(t *testing.T, path, descr, shape string, data []byte) {
	t.Helper()
	dict := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape)
	pad := 64 - (10+len(dict)+1)%64
	dict += strings.Repeat(" ", pad) + "\n"
	b := append([]byte("\x93NUMPY\x01\x00"), 0, 0)
	binary.LittleEndian.PutUint16(b[8:], uint16(len(dict)))
	b = append(append(b, dict...), data...)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// raggedPair is a ragged pair's rows: off (rows + 1) and the values,
// float32 units of 3 items whose items tell their unit.
type raggedPair struct {
	off    []int64
	values []byte
}

func newRaggedPair(rows int) *raggedPair {
	p := &raggedPair{off: []int64{0}}
	for g := range rows {
		n := int64((g*7 + 3) % 11) // 0 to 10 units, rows of none too
		p.off = append(p.off, p.off[g]+n)
	}
	for u := range p.off[rows] * 3 {
		p.values = binary.LittleEndian.AppendUint32(p.values, math.Float32bits(float32(u)))
	}
	return p
}

// write writes the pair as two .npy files, the offsets as int64.
func (p *raggedPair) write(t *testing.T, dir string) (values, offsets string) {
	values, offsets = filepath.Join(dir, "pos.npy"), filepath.Join(dir, "pos_offsets.npy")
	writeNPYArray(t, values, "<f4", fmt.Sprintf("(%d, 3)", p.off[len(p.off)-1]), p.values)
	var o []byte
	for _, x := range p.off {
		o = binary.LittleEndian.AppendUint64(o, uint64(x))
	}
	writeNPYArray(t, offsets, "<i8", fmt.Sprintf("(%d,)", len(p.off)), o)
	return values, offsets
}

// check reads every row of the ragged variable name back, in one batch
// and in a reversed one, and compares it with the pair.
func (p *raggedPair) check(t *testing.T, s *ddstore.Store, name string) {
	t.Helper()
	rows := int64(len(p.off)) - 1
	in, err := s.Info(name)
	if err != nil {
		t.Fatal(err)
	}
	if !in.Ragged || in.TotalRows != rows || in.Dtype != "float32" || !slices.Equal(in.Shape, []int64{3}) {
		t.Fatalf("variable %q: %+v; want ragged float32 rows of units [3], %d rows", name, in, rows)
	}
	idx := make([]int64, rows)
	for g := range idx {
		idx[g] = int64(g)
	}
	rev := slices.Clone(idx)
	slices.Reverse(rev)
	for _, order := range [][]int64{idx, rev} {
		var want []byte
		var wantLen []int64
		for _, g := range order {
			want = append(want, p.values[p.off[g]*12:p.off[g+1]*12]...)
			wantLen = append(wantLen, p.off[g+1]-p.off[g])
		}
		dst := make([]byte, len(want))
		lengths := make([]int64, len(order))
		n, err := s.GetRagged(name, dst, order, lengths)
		if err != nil || n != int64(len(want)) || !bytes.Equal(dst, want) || !slices.Equal(lengths, wantLen) {
			t.Fatalf("variable %q: read %d bytes (%v), lengths %v; want %d bytes of the file, lengths %v (same bytes: %v)",
				name, n, err, lengths, len(want), wantLen, bytes.Equal(dst, want))
		}
	}
}

// TestIngestRaggedNPY: a pair of .npy files (values [U, 3] float32,
// offsets int64) loads into a ragged variable on two nodes, each node the
// rows of its half of the units; every row reads back from either node.
// With --capacity, the nodes hold the first rows and the others come from
// the pair through the storage tier.
func TestIngestRaggedNPY(t *testing.T) {
	p := newRaggedPair(301)
	values, offsets := p.write(t, t.TempDir())
	ns, nodes := startNodes(t, 2)
	runs := ingestEveryNode(t, nodes, values, "--offsets", offsets, "--name", "pos", "--read-size", "1K")
	if wantIngested(t, runs); t.Failed() {
		return
	}
	// Rank 1's rows start at the first row at or past half the units.
	half := int64(0)
	for p.off[half] < p.off[301]/2 {
		half++
	}
	for r, w := range []string{fmt.Sprintf("loads rows [0, %d) (%d units)", half, p.off[half]),
		fmt.Sprintf("loads rows [%d, 301) (%d units)", half, p.off[301]-p.off[half])} {
		if !strings.Contains(runs[r].out, w) || !strings.Contains(runs[r].out, fmt.Sprintf("301 ragged rows, %d units of shape [3] float32", p.off[301])) {
			t.Errorf("rank %d's output lacks %q:\n%s", r, w, runs[r].out)
		}
	}
	for _, nd := range nodes {
		s := reader(t, ns, nd)
		p.check(t, s, "pos")
		if in, _ := s.Info("pos"); fmt.Sprint(in.ShardRows) != fmt.Sprintf("[%d %d]", half, 301-half) {
			t.Errorf("shards %v", in.ShardRows)
		}
	}

	// A capacity of 2400 bytes: the first rows of at most 200 units.
	ns, nodes = startNodes(t, 2)
	runs = ingestEveryNode(t, nodes, values, "--offsets", offsets, "--name", "pos", "--capacity", "2400")
	if wantIngested(t, runs); t.Failed() {
		return
	}
	held := int64(0)
	for p.off[held+1]*12 <= 2400 {
		held++
	}
	if !strings.Contains(runs[0].out, fmt.Sprintf("holds rows [0, %d) of 301", held)) {
		t.Errorf("capacity:\n%s", runs[0].out)
	}
	for _, nd := range nodes {
		s := reader(t, ns, nd)
		p.check(t, s, "pos")
		if in, _ := s.Info("pos"); in.HeldRows != held || in.Backing == "" {
			t.Errorf("%d rows held, backing %q; want %d and the pair", in.HeldRows, in.Backing, held)
		}
	}
}

// TestIngestRaggedHDF5: the usual HDF5 layout of ragged data (flat values,
// gzip-compressed and chunked, and int32 offsets, as h5py writes them)
// loads on two nodes as h5py reads it.
func TestIngestRaggedHDF5(t *testing.T) {
	needH5py(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "graphs.h5")
	p := newRaggedPair(257)
	if err := os.WriteFile(filepath.Join(dir, "values.bin"), p.values, 0o644); err != nil {
		t.Fatal(err)
	}
	runPython(t, `
import sys, numpy as np, h5py
v = np.fromfile(sys.argv[2], dtype='<f4').reshape(-1, 3)
off = np.array([int(x) for x in sys.argv[3].split(',')], dtype=np.int32)
with h5py.File(sys.argv[1], 'w') as f:
    f.create_dataset('pos', data=v, chunks=(64, 3), compression='gzip')
    f['node_offsets'] = off
`, file, filepath.Join(dir, "values.bin"), strings.Trim(strings.Join(strings.Fields(fmt.Sprint(p.off)), ","), "[]"))
	ns, nodes := startNodes(t, 2)
	if wantIngested(t, ingestEveryNode(t, nodes, file+":/pos", "--offsets", file+":/node_offsets", "--name", "pos")); t.Failed() {
		return
	}
	p.check(t, reader(t, ns, nodes[1]), "pos")
}

// TestIngestRaggedBadInput: offsets that decrease, do not start at 0 or
// end at the values' units, of floats or of two dimensions, a raw values
// file, and a capacity that holds no row each fail naming what was
// expected, and leave nothing loaded.
func TestIngestRaggedBadInput(t *testing.T) {
	ns, nodes := startNodes(t, 1)
	dir := t.TempDir()
	p := newRaggedPair(20)
	values, offsets := p.write(t, dir)
	offs := func(name, descr, shape string, xs ...int64) string {
		var o []byte
		for _, x := range xs {
			o = binary.LittleEndian.AppendUint64(o, uint64(x))
		}
		path := filepath.Join(dir, name)
		writeNPYArray(t, path, descr, shape, o)
		return path
	}
	units := p.off[20]
	down := offs("down.npy", "<i8", "(4,)", 0, 5, 3, units)
	short := offs("short.npy", "<i8", "(3,)", 0, 5, units-1)
	start := offs("start.npy", "<i8", "(3,)", 2, 5, units)
	floats := offs("floats.npy", "<f8", "(3,)", 0, 0, 0)
	twoD := offs("two.npy", "<i8", "(2, 2)", 0, 1, 2, units)
	raw := filepath.Join(dir, "pos.bin")
	if err := os.WriteFile(raw, p.values, 0o644); err != nil {
		t.Fatal(err)
	}
	fl := append([]string{"--rank", "0", "--size", "1"}, nodes[0].flags...)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{values, "--offsets", down}, exitGeometry, "offsets[2] = 3 after offsets[1] = 5: offsets must not decrease"},
		{[]string{values, "--offsets", short}, exitGeometry, fmt.Sprintf("the last offset, offsets[2], is %d but the values have %d units", units-1, units)},
		{[]string{values, "--offsets", start}, exitGeometry, "offsets[0] = 2: want 0"},
		{[]string{values, "--offsets", floats}, exitArgument, "hold items of float64: want integers"},
		{[]string{values, "--offsets", twoD}, exitArgument, "want a 1-D dataset of rows + 1 integers"},
		{[]string{raw, "--row-bytes", "12", "--offsets", offsets}, exitArgument, "want a .npy file or an HDF5 dataset"},
		{[]string{values, "--offsets", offsets, "--capacity", "11"}, exitArgument, "--capacity 11 bytes holds no row of"},
		{[]string{values, "--offsets", offsets, "--dtype", "int32"}, exitArgument, "holds items of float32, not int32"},
	} {
		code, _, errOut := run(t, append(append([]string{"ingest", "--name", "v"}, tc.args...), fl...)...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("ingest %v: exit %d, stderr %q; want exit %d saying %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
	in, err := ddstore.QueryAgent(nodes[0].a.Socket(), ns, nodes[0].name)
	if err != nil || len(in.Variables) != 0 || in.MemoryBytes != 0 {
		t.Errorf("bad input left %+v (%v)", in.Variables, err)
	}
	// The store still takes the pair.
	if code, out, errOut := run(t, append([]string{"ingest", values, "--offsets", offsets, "--name", "v"}, fl...)...); code != 0 {
		t.Fatalf("ingest: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	p.check(t, reader(t, ns, nodes[0]), "v")
}
