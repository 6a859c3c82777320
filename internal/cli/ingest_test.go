package cli

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/agent"
	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/coord"
	"github.com/ddstore-go/ddstore/internal/layout"
	"github.com/ddstore-go/ddstore/internal/source"
	"github.com/ddstore-go/ddstore/internal/testutil"
)

// writeNPY writes a version 1.0 .npy file of float32 rows of shape
// (rows, 3, 5) whose items are row*100 + item, and returns its data.
func writeNPY(t *testing.T, path string, rows int64) []byte {
	t.Helper()
	dict := fmt.Sprintf("{'descr': '<f4', 'fortran_order': False, 'shape': (%d, 3, 5), }", rows)
	pad := 64 - (10+len(dict)+1)%64
	dict += strings.Repeat(" ", pad) + "\n"
	b := append([]byte("\x93NUMPY\x01\x00"), 0, 0)
	binary.LittleEndian.PutUint16(b[8:], uint16(len(dict)))
	b = append(b, dict...)
	data := make([]byte, 0, rows*60)
	for r := range rows {
		for i := range int64(15) {
			data = binary.LittleEndian.AppendUint32(data, math.Float32bits(float32(r*100+i)))
		}
	}
	if err := os.WriteFile(path, append(b, data...), 0o644); err != nil {
		t.Fatal(err)
	}
	return data
}

// node is an agent in this process and the flags that reach it.
type node struct {
	a     *agent.Agent
	name  string
	flags []string
}

// startNodes starts one agent per node of a fresh namespace; several meet
// through a rendezvous address.
// testStart is about when this test process started (at the latest).
var testStart = time.Now()

func startNodes(t *testing.T, n int) (string, []node) {
	t.Helper()
	ns := fmt.Sprintf("clitest-%d-%d", os.Getpid(), nsSeq.Add(1))
	dir := privateDir(t)
	rdv := ""
	if n > 1 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		rdv = l.Addr().String()
		l.Close()
	}
	var nodes []node
	for i := range n {
		name := fmt.Sprintf("n%d", i)
		sock := filepath.Join(dir, name+".sock")
		a, err := agent.Start(agent.Config{Namespace: ns, Node: name, Socket: sock, Rendezvous: rdv,
			PeerListen: "127.0.0.1:0", Timeout: 5 * time.Second, JoinTimeout: 10 * time.Second,
			Secret: "ingest-test-secret-0123456789"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		nodes = append(nodes, node{a: a, name: name, flags: []string{"--socket", sock, "--namespace", ns, "--node", name}})
	}
	return ns, nodes
}

// reader opens a store that reads what ingest left in a namespace.
func reader(t *testing.T, ns string, nd node) *ddstore.Store {
	t.Helper()
	s, err := ddstore.Open(ddstore.Config{Namespace: ns, Node: nd.name, Socket: nd.a.Socket(), Rank: 0, Size: 1, NoSpawn: true, Reader: true, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// checkVariable reads every row of a variable back and compares with want.
func checkVariable(t *testing.T, s *ddstore.Store, name string, want []byte, rows, disp int64, dtype string) {
	t.Helper()
	in, err := s.Info(name)
	if err != nil {
		t.Fatal(err)
	}
	itemsize, _ := layout.ItemSize(dtype)
	if in.TotalRows != rows || in.Disp != disp || in.ItemSize != itemsize || in.Dtype != dtype {
		t.Fatalf("variable %q: %d rows of disp %d, itemsize %d, %q; want %d, %d, %d, %q", name, in.TotalRows, in.Disp, in.ItemSize, in.Dtype, rows, disp, itemsize, dtype)
	}
	got := make([]byte, len(want))
	if err := s.Get(name, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("variable %q differs from the file", name)
	}
}

func TestIngestNPY(t *testing.T) {
	ns, nodes := startNodes(t, 1)
	path := filepath.Join(t.TempDir(), "feat.npy")
	want := writeNPY(t, path, 1001)
	// Flags go on either side of the file; small reads make many pieces.
	args := append([]string{"ingest", "--name", "feat", path, "--rank", "0", "--size", "1", "--read-size", "4K", "--readers", "3"}, nodes[0].flags...)
	code, out, errOut := run(t, args...)
	if code != 0 || errOut != "" {
		t.Fatalf("ingest: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	for _, w := range []string{
		fmt.Sprintf("ingest %s: 1001 rows of shape [3 5] float32 (58.7 KiB); rank 0 of 1 on node n0 loads rows [0, 1001) into \"feat\"", path),
		`ingested "feat": rows [0, 1001) of 1001, 58.7 KiB, in `, " GB/s\n",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("ingest output lacks %q:\n%s", w, out)
		}
	}
	checkVariable(t, reader(t, ns, nodes[0]), "feat", want, 1001, 15, "float32")

	// The name is taken now.
	code, _, errOut = run(t, args...)
	if code != exitExists || !strings.Contains(errOut, `variable "feat" already exists`) {
		t.Errorf("second ingest: exit %d, stderr %q", code, errOut)
	}
}

func TestIngestRaw(t *testing.T) {
	ns, nodes := startNodes(t, 1)
	path := filepath.Join(t.TempDir(), "rows.bin")
	want := make([]byte, 40*333)
	for i := range want {
		want[i] = byte(i * 31)
	}
	if err := os.WriteFile(path, want, 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, append([]string{"ingest", path, "--name", "raw", "--row-bytes", "40", "--dtype", "int64", "--capacity", "1M"}, nodes[0].flags...)...)
	if code != 0 {
		t.Fatalf("ingest: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	checkVariable(t, reader(t, ns, nodes[0]), "raw", want, 333, 5, "int64")
}

// ingestRun is what one `ddstore ingest` printed and returned.
type ingestRun struct {
	code        int
	out, errOut string
}

// ingestEveryNode runs `ddstore ingest FILE args... --rank r --size n` on
// every node at once, as one job, and returns each rank's run.
func ingestEveryNode(t *testing.T, nodes []node, file string, args ...string) []ingestRun {
	t.Helper()
	runs := make([]ingestRun, len(nodes))
	var wg sync.WaitGroup
	for r, nd := range nodes {
		wg.Go(func() {
			a := append([]string{"ingest", file}, args...)
			a = append(append(a, "--rank", fmt.Sprint(r), "--size", fmt.Sprint(len(nodes))), nd.flags...)
			runs[r].code, runs[r].out, runs[r].errOut = run(t, a...)
		})
	}
	wg.Wait()
	return runs
}

// wantIngested fails unless every rank's ingest exited 0.
func wantIngested(t *testing.T, runs []ingestRun) {
	t.Helper()
	for r, x := range runs {
		if x.code != 0 {
			t.Errorf("ingest rank %d: exit %d, stdout %q, stderr %q", r, x.code, x.out, x.errOut)
		}
	}
}

// TestIngestTwoNodes: two ingest processes, one per node, each load their
// share; every row reads back from either node.
func TestIngestTwoNodes(t *testing.T) {
	ns, nodes := startNodes(t, 2)
	path := filepath.Join(t.TempDir(), "feat.npy")
	want := writeNPY(t, path, 777)
	runs := ingestEveryNode(t, nodes, path, "--name", "feat", "--read-size", "1K")
	if wantIngested(t, runs); t.Failed() {
		return
	}
	if !strings.Contains(runs[0].out, "loads rows [0, 388)") || !strings.Contains(runs[1].out, "loads rows [388, 777)") {
		t.Errorf("shares:\n%s\n%s", runs[0].out, runs[1].out)
	}
	for _, nd := range nodes {
		s := reader(t, ns, nd)
		checkVariable(t, s, "feat", want, 777, 15, "float32")
		in, _ := s.Info("feat")
		if fmt.Sprint(in.ShardRows) != "[388 389]" || fmt.Sprint(in.Nodes) != "[n0 n1]" {
			t.Errorf("shards %v on %v", in.ShardRows, in.Nodes)
		}
		if _, err := s.Info(commitName("feat")); !errors.Is(err, base.ErrUnknown) {
			t.Errorf("the commit variable is still there: %v", err)
		}
	}
}

// TestIngestCapacity: with a capacity below the dataset, two nodes hold the
// file's first rows, a quarter of them, and every row still reads back —
// the rest from the file, through the storage tier.
func TestIngestCapacity(t *testing.T) {
	ns, nodes := startNodes(t, 2)
	path := filepath.Join(t.TempDir(), "feat.npy")
	want := writeNPY(t, path, 800)
	runs := ingestEveryNode(t, nodes, path, "--name", "feat", "--capacity", "12000")
	if wantIngested(t, runs); t.Failed() {
		return
	}
	if !strings.Contains(runs[0].out, "loads rows [0, 100)") || !strings.Contains(runs[1].out, "loads rows [100, 200)") ||
		!strings.Contains(runs[0].out, "holds rows [0, 200) of 800: the other 600 stay in the file") {
		t.Errorf("shares:\n%s\n%s", runs[0].out, runs[1].out)
	}
	for _, nd := range nodes {
		s := reader(t, ns, nd)
		checkVariable(t, s, "feat", want, 800, 15, "float32")
		in, _ := s.Info("feat")
		if fmt.Sprint(in.ShardRows) != "[100 100]" || in.HeldRows != 200 || in.Backing != path {
			t.Errorf("shards %v, %d held, backing %q", in.ShardRows, in.HeldRows, in.Backing)
		}
	}
}

// badSource reads like its inner source but fails at one row.
type badSource struct {
	source.Source
	failAt int64
}

func (b *badSource) ReadRows(start, count int64, dst []byte) error {
	if b.failAt >= start && b.failAt < start+count {
		return base.Errorf(base.ErrArgument, "row %d is unreadable", b.failAt)
	}
	return b.Source.ReadRows(start, count, dst)
}

// TestIngestFailureLeavesNothing: when one node cannot read its rows, or
// the nodes read files of different lengths, every node fails and the
// variable is gone everywhere.
func TestIngestFailureLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	path, short := filepath.Join(dir, "feat.npy"), filepath.Join(dir, "short.npy")
	writeNPY(t, path, 500)
	writeNPY(t, short, 499)
	open := func(p string) source.Source {
		src, err := source.Open(p, source.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { src.Close() })
		return src
	}
	for _, tc := range []struct {
		name string
		srcs func() []source.Source
		want []string // per rank
	}{
		{"unreadable row", func() []source.Source { return []source.Source{open(path), &badSource{open(path), 400}} },
			[]string{"another rank failed, so nothing is kept", "row 400 is unreadable"}},
		{"other lengths", func() []source.Source { return []source.Source{open(path), open(short)} },
			[]string{"another rank failed", "another rank failed"}},
		{"one node", func() []source.Source { return []source.Source{&badSource{open(path), 0}} },
			[]string{"row 0 is unreadable"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srcs := tc.srcs()
			ns, nodes := startNodes(t, len(srcs))
			errs := make([]error, len(srcs))
			var wg sync.WaitGroup
			for r, nd := range nodes {
				wg.Go(func() {
					s, err := ddstore.Open(ddstore.Config{Namespace: ns, Node: nd.name, Socket: nd.a.Socket(), Rank: r, Size: len(srcs),
						LocalRank: 0, LocalSize: 1, NoSpawn: true, PublishTimeout: 10 * time.Second})
					if err != nil {
						errs[r] = err
						return
					}
					defer s.Close()
					errs[r] = ingest(context.Background(), s, srcs[r], "feat", srcs[r].Rows(), nil, source.ReadOptions{PieceBytes: 600})
				})
			}
			wg.Wait()
			for r, err := range errs {
				if err == nil || !strings.Contains(err.Error(), tc.want[r]) {
					t.Errorf("rank %d: %v, want an error saying %q", r, err, tc.want[r])
				}
			}
			for _, nd := range nodes {
				in, err := ddstore.QueryAgent(nd.a.Socket(), ns, nd.name)
				if err != nil {
					t.Fatal(err)
				}
				if in.MemoryBytes != 0 {
					t.Errorf("node %s keeps %d bytes: %+v", nd.name, in.MemoryBytes, in.Variables)
				}
				for _, v := range in.Variables {
					// The agent keeps an empty record (no shard, no bytes)
					// of the failed commit round; the variable is gone.
					if v.Published || v.Name == "feat" || v.LocalBytes != 0 {
						t.Errorf("node %s keeps %+v", nd.name, v)
					}
				}
			}
		})
	}
}

// TestIngestBadInput: each is a clear error, and nothing is loaded.
func TestIngestBadInput(t *testing.T) {
	ns, nodes := startNodes(t, 1)
	dir := t.TempDir()
	path := filepath.Join(dir, "feat.npy")
	writeNPY(t, path, 100)
	trunc := filepath.Join(dir, "trunc.npy")
	writeNPY(t, trunc, 100)
	if err := os.Truncate(trunc, 64+99*60); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty.npy")
	writeNPY(t, empty, 0)
	raw := filepath.Join(dir, "rows.bin")
	if err := os.WriteFile(raw, make([]byte, 100), 0o644); err != nil {
		t.Fatal(err)
	}
	fl := append([]string{"--rank", "0", "--size", "1"}, nodes[0].flags...)
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{path, "--capacity", "59"}, exitArgument, "--capacity 59 bytes holds no row of 60 bytes"},
		{[]string{trunc}, exitArgument, "trunc.npy is truncated"},
		{[]string{empty}, exitArgument, "has no rows"},
		{[]string{filepath.Join(dir, "none.npy")}, exitArgument, "none.npy: no such file or directory"},
		{[]string{raw}, exitArgument, "unknown format"},
		{[]string{raw, "--row-bytes", "7"}, exitArgument, "100 bytes is not a whole number of 7-byte rows"},
		{[]string{path, "--dtype", "float64"}, exitArgument, "holds items of float32, not float64"},
		{[]string{path, "--row-bytes", "8"}, exitArgument, "has rows of 60 bytes"},
		{[]string{path, "--capacity", "lots"}, exitArgument, `size "lots"`},
		{[]string{path, "--read-size", "0"}, exitArgument, `size "0"`},
		{[]string{path, "--readers", "0"}, exitArgument, "--readers 0"},
	}
	if !source.HDF5 {
		cases = append(cases, struct {
			args []string
			code int
			want string
		}{[]string{filepath.Join(dir, "x.h5:/data")}, exitArgument, "built without HDF5: rebuild with `go build -tags hdf5"})
	}
	for _, tc := range cases {
		code, out, errOut := run(t, append(append([]string{"ingest", "--name", "v"}, tc.args...), fl...)...)
		if code != tc.code || out != "" || !strings.Contains(errOut, tc.want) {
			t.Errorf("ingest %v: exit %d, stdout %q, stderr %q; want exit %d saying %q", tc.args, code, out, errOut, tc.code, tc.want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"ingest", path}, "--name is required"},
		{[]string{"ingest", "--name", "v"}, "name the file to load"},
		{[]string{"ingest", "--name", "v", path, "--rank", "1"}, "give --rank and --size together"},
	} {
		code, _, errOut := run(t, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) || !strings.Contains(errOut, "Usage: ddstore ingest") {
			t.Errorf("%v: exit %d, stderr %q", tc.args, code, errOut)
		}
	}
	in, err := ddstore.QueryAgent(nodes[0].a.Socket(), ns, nodes[0].name)
	if err != nil || len(in.Variables) != 0 || in.MemoryBytes != 0 {
		t.Errorf("bad input left %+v (%v)", in.Variables, err)
	}
	code, _, errOut := run(t, "ingest", "--help")
	for _, w := range []string{"FILE[:DATASET] --name NAME", "stops 30 s after its last client", "ddstore agent --daemon"} {
		if code != 0 || !strings.Contains(errOut, w) {
			t.Errorf("ingest --help lacks %q: exit %d\n%s", w, code, errOut)
		}
	}
}

func TestShare(t *testing.T) {
	for _, n := range []int64{0, 1, 7, 100, 1001, math.MaxInt64} {
		for _, p := range []int{1, 2, 3, 7, 64, 1000} {
			at := int64(0)
			for r := range p {
				lo, hi := share(n, r, p)
				if d := hi - lo; lo != at || d < n/int64(p) || d-n/int64(p) > 1 {
					t.Fatalf("share(%d, %d, %d) = [%d, %d) after %d", n, r, p, lo, hi, at)
				}
				at = hi
			}
			if at != n {
				t.Fatalf("shares of %d over %d end at %d", n, p, at)
			}
		}
	}
}

func TestProgress(t *testing.T) {
	var buf bytes.Buffer
	if isTerminal(&buf) || isTerminal(os.NewFile(^uintptr(0), "none")) {
		t.Fatal("a buffer is no terminal")
	}
	p := &progress{w: &buf, total: 1000, rb: 1000, t0: time.Now().Add(-time.Second)}
	if got := p.line(250, false); !strings.HasPrefix(got, "ingest:  25.0%  250/1000 rows  0.") || !strings.Contains(got, "GB/s  ETA 3s") {
		t.Errorf("line: %q", got)
	}
	if got := p.line(500, true); !strings.HasPrefix(got, "[===============               ]  50.0%  500/1000 rows") {
		t.Errorf("bar: %q", got)
	}
	if got := p.line(0, false); !strings.Contains(got, "ETA ?") {
		t.Errorf("line before any row: %q", got)
	}
	// Not on a terminal: a line per tenth, nothing after the end. Each
	// tenth is added once the reporter has written the line of the last.
	var w testutil.Buffer
	q := startProgressEvery(&w, 100, 10, time.Millisecond)
	for tenth := range 10 {
		q.add(10)
		if tenth == 9 {
			break
		}
		testutil.WaitFor(t, 10*time.Second, func() error {
			if n := strings.Count(w.String(), "\n"); n != tenth+1 {
				return fmt.Errorf("%d progress lines after %d%%, want %d:\n%s", n, 10*(tenth+1), tenth+1, w.String())
			}
			return nil
		})
	}
	q.finish()
	out := w.String()
	if n := strings.Count(out, "\n"); n != 9 || strings.Contains(out, "\r") || strings.Contains(out, "100.0%") || !strings.HasPrefix(out, "ingest: ") {
		t.Errorf("plain progress:\n%s", out)
	}
}

const python = "/usr/bin/python3"

// needH5py skips unless this build reads HDF5 and python3 has h5py.
func needH5py(t testing.TB) {
	t.Helper()
	if !source.HDF5 {
		t.Skip("built without HDF5 (go test -tags hdf5)")
	}
	if out, err := exec.Command(python, "-c", "import h5py").CombinedOutput(); err != nil {
		t.Skipf("%s cannot import h5py (Debian: apt-get install python3-h5py): %v: %s", python, err, bytes.TrimSpace(out))
	}
}

func runPython(t testing.TB, code string, args ...string) string {
	t.Helper()
	out, err := exec.Command(python, append([]string{"-c", code}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	return string(out)
}

// TestIngestHDF5: gzip-compressed and plain chunked datasets that h5py
// writes load, on two nodes, as h5py reads them.
func TestIngestHDF5(t *testing.T) {
	needH5py(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "data.h5")
	runPython(t, `
import sys, numpy as np, h5py
a = np.arange(3001 * 12, dtype=np.int32).reshape(3001, 3, 4) * 7
with h5py.File(sys.argv[1], 'w') as f:
    f.create_dataset('g/gzip', data=a, chunks=(100, 3, 4), compression='gzip')
    f.create_dataset('plain', data=a, chunks=(64, 3, 4))
open(sys.argv[2], 'wb').write(a.tobytes())
`, file, filepath.Join(dir, "data.bin"))
	want, err := os.ReadFile(filepath.Join(dir, "data.bin"))
	if err != nil {
		t.Fatal(err)
	}
	for _, ds := range []string{"g/gzip", "/plain"} {
		ns, nodes := startNodes(t, 2)
		if wantIngested(t, ingestEveryNode(t, nodes, file+":"+ds, "--name", "x", "--read-size", "8K")); !t.Failed() {
			checkVariable(t, reader(t, ns, nodes[1]), "x", want, 3001, 12, "int32")
		}
	}
	_, nodes := startNodes(t, 1)
	code, _, errOut := run(t, append([]string{"ingest", file + ":/nope", "--name", "x"}, nodes[0].flags...)...)
	if code != exitArgument || !strings.Contains(errOut, `has no dataset "/nope" (datasets there: /g/gzip, /plain)`) {
		t.Errorf("missing dataset: exit %d, stderr %q", code, errOut)
	}
}

// BenchmarkIngestHDF5 loads a 256 MiB chunked HDF5 dataset into a fresh
// variable (Init, chunk-aligned parallel reads into the shard, Free not
// timed) and, in the same run, times what bounds it: h5py's read_direct of
// the same dataset into a reused buffer (before and after), the same
// chunk-aligned reader into a reused buffer, and populating as much fresh
// shared memory (/dev/shm) — what any load into a new shard pays. The file
// is read before, so every figure reads from the page cache.
//
//	go test -tags hdf5 -run '^$' -bench IngestHDF5 -benchtime 10x ./internal/cli/
func BenchmarkIngestHDF5(b *testing.B) {
	needH5py(b)
	dir := b.TempDir()
	file := filepath.Join(dir, "bench.h5")
	// 65536 rows of 1024 float32 (4 KiB), chunks of 256 rows (1 MiB);
	// "gzip" is the same shape of compressible int32, gzip level 1.
	runPython(b, `
import sys, numpy as np, h5py
rng = np.random.default_rng(0)
with h5py.File(sys.argv[1], 'w') as f:
    f.create_dataset('plain', data=rng.standard_normal((65536, 1024), dtype=np.float32), chunks=(256, 1024))
    f.create_dataset('gzip', data=rng.integers(0, 16, (65536, 1024), dtype=np.int32), chunks=(256, 1024), compression='gzip', compression_opts=1)
`, file)
	for _, ds := range []string{"plain", "gzip"} {
		b.Run(ds, func(b *testing.B) {
			h5pyRate := func() float64 {
				out := runPython(b, `
import sys, time, numpy as np, h5py
with h5py.File(sys.argv[1], 'r') as f:
    d = f[sys.argv[2]]
    buf = np.empty(d.shape, d.dtype)
    d.read_direct(buf)
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        d.read_direct(buf)
        ts.append(time.perf_counter() - t0)
    print(buf.nbytes / sorted(ts)[2] / 1e9)
`, file, ds)
				var r float64
				if _, err := fmt.Sscan(out, &r); err != nil {
					b.Fatalf("h5py said %q", out)
				}
				return r
			}
			before := h5pyRate()
			ns := fmt.Sprintf("clibench-%d-%d", os.Getpid(), nsSeq.Add(1))
			runDir := b.TempDir()
			if err := os.Chmod(runDir, 0o700); err != nil {
				b.Fatal(err)
			}
			sock := filepath.Join(runDir, "a.sock")
			a, err := agent.Start(agent.Config{Namespace: ns, Node: "n0", Socket: sock})
			if err != nil {
				b.Fatal(err)
			}
			defer a.Close()
			s, err := ddstore.Open(ddstore.Config{Namespace: ns, Node: "n0", Socket: sock, Rank: 0, Size: 1, LocalRank: 0, LocalSize: 1, NoSpawn: true})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			src, err := source.Open(file+":"+ds, source.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer src.Close()
			size := src.Rows() * source.RowBytes(src)
			reused := make([]byte, size)
			rate := func(f func() error) float64 {
				t0 := time.Now()
				if err := f(); err != nil {
					b.Fatal(err)
				}
				return float64(size) / time.Since(t0).Seconds() / 1e9
			}
			readReused := func() error {
				return source.Read(context.Background(), src, 0, src.Rows(), reused, source.ReadOptions{})
			}
			rate(readReused)
			var ingestRates, reusedRates, shmRates []float64
			b.SetBytes(size)
			b.ResetTimer()
			for i := range b.N {
				name := fmt.Sprint("v", i)
				ingestRates = append(ingestRates, rate(func() error { return ingest(context.Background(), s, src, name, src.Rows(), nil, source.ReadOptions{}) }))
				b.StopTimer()
				if err := s.Free(name); err != nil {
					b.Fatal(err)
				}
				reusedRates = append(reusedRates, rate(readReused))
				shmRates = append(shmRates, rate(func() error { return populateShm(size) }))
				b.StartTimer()
			}
			b.StopTimer()
			h5py := (before + h5pyRate()) / 2
			b.ReportMetric(median(ingestRates), "ingest-GB/s")
			b.ReportMetric(h5py, "h5py-GB/s")
			b.ReportMetric(median(ingestRates)/h5py, "ingest/h5py")
			b.ReportMetric(median(reusedRates), "reader-GB/s")
			b.ReportMetric(median(reusedRates)/h5py, "reader/h5py")
			b.ReportMetric(median(shmRates), "shm-populate-GB/s")
		})
	}
}

// populateShm maps n bytes of fresh shared memory and makes the kernel
// allocate every page (what writing a new shard costs before any data).
func populateShm(n int64) error {
	f, err := os.CreateTemp("/dev/shm", "ddstore-bench-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := f.Truncate(n); err != nil {
		return err
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return err
	}
	defer unix.Munmap(mem)
	return unix.Madvise(mem, unix.MADV_POPULATE_WRITE)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestIngestOneNodeCannotStart: a node whose file cannot be opened makes
// the others fail at once, not at the timeout.
func TestIngestOneNodeCannotStart(t *testing.T) {
	ns, nodes := startNodes(t, 2)
	// Both ranks are this test process. Once rank 1's failed round has no
	// live process (its store closed), the coordinator takes rank 0 for a
	// rank of that job only if its process started coord.JobStartSlack
	// before then; a job started after one died is a new one. A test run
	// alone can reach here sooner after the process started.
	testutil.WaitFor(t, 10*time.Second, func() error {
		if age := time.Since(testStart); age <= 2*coord.JobStartSlack {
			return fmt.Errorf("this process has run %v, not yet twice coord.JobStartSlack", age)
		}
		return nil
	})
	path := filepath.Join(t.TempDir(), "feat.npy")
	writeNPY(t, path, 100)
	files := []string{path, path + ".missing.npy"}
	wants := []string{"rank 1 could not create its shard", "feat.npy.missing.npy: no such file or directory"}
	codes := []int{exitGeometry, exitArgument} // the others learn rank 1 failed; rank 1 has no file
	var wg sync.WaitGroup
	for r, nd := range nodes {
		wg.Go(func() {
			// Each rank its own file: not ingestEveryNode, which gives all one.
			code, _, errOut := run(t, append([]string{"ingest", files[r], "--name", "feat", "--rank", fmt.Sprint(r), "--size", "2"}, nd.flags...)...)
			if code != codes[r] || !strings.Contains(errOut, wants[r]) {
				t.Errorf("rank %d: exit %d, stderr %q; want exit %d and %q", r, code, errOut, codes[r], wants[r])
			}
		})
	}
	wg.Wait()
	for _, nd := range nodes {
		in, err := ddstore.QueryAgent(nd.a.Socket(), ns, nd.name)
		if err != nil || in.MemoryBytes != 0 {
			t.Errorf("node %s keeps %d bytes (%v)", nd.name, in.MemoryBytes, err)
		}
	}
}

// TestIngestMoreNodesThanRows: a node whose share is empty still takes
// part.
func TestIngestMoreNodesThanRows(t *testing.T) {
	ns, nodes := startNodes(t, 2)
	path := filepath.Join(t.TempDir(), "feat.npy")
	want := writeNPY(t, path, 1)
	for r, x := range ingestEveryNode(t, nodes, path, "--name", "feat") {
		if x.code != 0 || !strings.Contains(x.out, fmt.Sprintf("loads rows [0, %d)", r)) {
			t.Errorf("rank %d: exit %d, stdout %q, stderr %q", r, x.code, x.out, x.errOut)
		}
	}
	checkVariable(t, reader(t, ns, nodes[0]), "feat", want, 1, 15, "float32")
}
