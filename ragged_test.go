package ddstore_test

import (
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
	"github.com/ddstore-go/ddstore/internal/testutil"
)

// raggedJob is the rows of a ragged variable as every rank adds them: rank
// r holds lengths[r] (units of ub bytes), global row g's bytes patterned
// by g, so a row from the wrong place or of the wrong length never passes.
type raggedJob struct {
	lengths [][]int64
	ub      int64
	first   []int64 // first global row of each rank
}

func newRaggedJob(seed uint64, rows []int64, ub int64, maxLen int64) *raggedJob {
	j := &raggedJob{ub: ub, first: make([]int64, len(rows)+1)}
	rng := rand.New(rand.NewPCG(seed, 11))
	for r, n := range rows {
		l := make([]int64, n)
		for i := range l {
			if rng.IntN(5) == 0 {
				continue // rows of no items too
			}
			l[i] = rng.Int64N(maxLen + 1)
		}
		j.lengths = append(j.lengths, l)
		j.first[r+1] = j.first[r] + n
	}
	return j
}

func (j *raggedJob) total() int64 { return j.first[len(j.first)-1] }

// length of global row g.
func (j *raggedJob) length(g int64) int64 {
	r := sortSearch(j.first, g)
	return j.lengths[r][g-j.first[r]]
}

func sortSearch(first []int64, g int64) int {
	r := 0
	for r+1 < len(first)-1 && first[r+1] <= g {
		r++
	}
	for first[r+1] <= g {
		r++
	}
	return r
}

// values is rank r's packed rows.
func (j *raggedJob) values(r int) []byte {
	var b []byte
	for i, n := range j.lengths[r] {
		row := make([]byte, n*j.ub)
		pattern(row, j.first[r]+int64(i))
		b = append(b, row...)
	}
	return b
}

// naive is what a batch of rows reads: the rows copied one after another.
func (j *raggedJob) naive(indices []int64) ([]byte, []int64) {
	var b []byte
	var lengths []int64
	for _, g := range indices {
		n := j.length(g)
		row := make([]byte, n*j.ub)
		pattern(row, g)
		b = append(b, row...)
		lengths = append(lengths, n)
	}
	return b, lengths
}

func (j *raggedJob) add(t testing.TB, c *cluster, name string, dt ddstore.Dtype, shape ...int64) {
	t.Helper()
	c.mustEach(t, func(r int, s *ddstore.Store) error {
		return s.AddRagged(name, j.values(r), j.lengths[r], dt, shape...)
	})
}

// TestClusterRagged: batches of ragged rows of every node, in any order,
// with repeats and runs of neighbouring rows, read the same as a naive copy of the same rows, into plain
// memory and into a receive buffer; the sizes come before the read; one
// row reads alone.
func TestClusterRagged(t *testing.T) {
	c := startCluster(t, []int{2, 1, 2}, viaHandshakeDir)
	rows := []int64{40, 0, 25, 33, 7}
	j := newRaggedJob(1, rows, 12, 9)
	j.add(t, c, "pos", ddstore.Float32, 3)
	c.mustEach(t, func(r int, s *ddstore.Store) error {
		rng := rand.New(rand.NewPCG(uint64(r), 3))
		for batch := range 20 {
			idx := make([]int64, 1+rng.IntN(64))
			for i := range idx {
				idx[i] = rng.Int64N(j.total())
				if batch%3 == 2 && i > 0 && rng.IntN(8) > 0 {
					// Runs of neighbouring rows (across shards, nodes and
					// rows of no items), which local reads copy at once.
					idx[i] = (idx[i-1] + 1) % j.total()
				}
			}
			want, wantLen := j.naive(idx)
			lengths := make([]int64, len(idx))
			n, err := s.RaggedSizes("pos", idx, lengths)
			if err != nil {
				return err
			}
			if n != int64(len(want)) || !slices.Equal(lengths, wantLen) {
				return fmt.Errorf("batch %d: sizes %d bytes, lengths %v; want %d, %v", batch, n, lengths, len(want), wantLen)
			}
			var dst []byte
			if batch%2 == 0 {
				dst = make([]byte, n+int64(rng.IntN(50)))
			} else {
				if dst, err = s.AllocRecv(int(n) + 1); err != nil {
					return err
				}
			}
			clear(lengths)
			got, err := s.GetRagged("pos", dst, idx, lengths)
			if err != nil {
				return fmt.Errorf("batch %d: %w", batch, err)
			}
			if got != n || string(dst[:got]) != string(want) || !slices.Equal(lengths, wantLen) {
				return fmt.Errorf("batch %d of %v: read %d bytes, lengths %v; want %d bytes, lengths %v (the rows differ: %v)",
					batch, idx, got, lengths, len(want), wantLen, string(dst[:min(got, int64(len(want)))]) != string(want[:min(got, int64(len(want)))]))
			}
			if batch%2 == 1 {
				if err := s.FreeRecv(dst); err != nil {
					return err
				}
			}
		}
		for g := range j.total() {
			row := make([]byte, j.length(g)*j.ub)
			n, err := s.GetRaggedRow("pos", row, g)
			if err != nil || n != int64(len(row)) {
				return fmt.Errorf("row %d: %d bytes, %v; want %d", g, n, err, len(row))
			}
			checkRow(t, row, g)
		}
		in, err := s.Info("pos")
		if err != nil {
			return err
		}
		var items int64
		for _, l := range j.lengths {
			for _, n := range l {
				items += n
			}
		}
		if !in.Ragged || !slices.Equal(in.Shape, []int64{3}) || in.TotalRows != j.total() || in.TotalItems != items || in.Bytes != items*12 || in.Dtype != "float32" {
			return fmt.Errorf("info %+v: want ragged rows of shape [3], %d rows, %d units", in, j.total(), items)
		}
		return nil
	})
	p, err := c.stores[0].Profile("pos")
	if err != nil || p.RemoteRows == 0 || p.LocalRows == 0 {
		t.Fatalf("profile %+v, %v: want rows of this node and of others", p, err)
	}
}

// TestClusterRaggedErrors: a destination too small, indices out of range,
// fixed-row reads of a ragged variable and ragged reads of a fixed one
// fail naming what was expected, and the store keeps working.
func TestClusterRaggedErrors(t *testing.T) {
	c := startCluster(t, []int{1, 1}, viaHandshakeDir)
	j := newRaggedJob(2, []int64{6, 5}, 8, 4)
	j.lengths[1][1] = 3 // global row 7: a remote row that is not empty
	j.add(t, c, "seq", ddstore.Int64)
	c.addPattern(t, "fixed", []int64{2, 2}, 1, 8)
	s := c.stores[0]
	idx := []int64{7, 0, 7}
	n, err := s.RaggedSizes("seq", idx, make([]int64, 3))
	if err != nil || n < 24 {
		t.Fatalf("RaggedSizes = %d, %v", n, err)
	}
	_, err = s.GetRagged("seq", make([]byte, n-1), idx, nil)
	want := fmt.Sprintf("destination of %d bytes for 3 ragged rows of %d bytes", n-1, n)
	if !errors.Is(err, ddstore.ErrBuffer) || !strings.Contains(err.Error(), want) {
		t.Fatalf("GetRagged into too small a buffer = %v, want ErrBuffer saying %q", err, want)
	}
	if _, err := s.GetRagged("seq", make([]byte, n), []int64{0, 11}, nil); !errors.Is(err, ddstore.ErrIndex) || !strings.Contains(err.Error(), "indices[1] = 11 not in [0, 11)") {
		t.Fatalf("GetRagged of row 11 of 11 = %v, want ErrIndex naming it", err)
	}
	if _, err := s.RaggedSizes("seq", []int64{-1}, nil); !errors.Is(err, ddstore.ErrIndex) {
		t.Fatalf("RaggedSizes of row -1 = %v, want ErrIndex", err)
	}
	if _, err := s.RaggedSizes("seq", idx, make([]int64, 2)); !errors.Is(err, ddstore.ErrArgument) || !strings.Contains(err.Error(), "2 lengths for 3 indices") {
		t.Fatalf("RaggedSizes with 2 lengths for 3 rows = %v, want ErrArgument", err)
	}
	if err := s.GetBatch("seq", make([]byte, 8), []int64{0}); !errors.Is(err, ddstore.ErrArgument) || !strings.Contains(err.Error(), "GetRagged") {
		t.Fatalf("GetBatch of a ragged variable = %v, want ErrArgument pointing to GetRagged", err)
	}
	if err := s.Get("seq", make([]byte, 8), 0); !errors.Is(err, ddstore.ErrArgument) {
		t.Fatalf("Get of a ragged variable = %v, want ErrArgument", err)
	}
	if _, err := s.GetRagged("fixed", make([]byte, 8), []int64{0}, nil); !errors.Is(err, ddstore.ErrArgument) || !strings.Contains(err.Error(), "rows of one size (8 bytes)") {
		t.Fatalf("GetRagged of fixed rows = %v, want ErrArgument", err)
	}
	// Still working.
	dst := make([]byte, n)
	if got, err := s.GetRagged("seq", dst, idx, nil); err != nil || got != n {
		t.Fatalf("GetRagged after the errors = %d, %v", got, err)
	}
	want2, _ := j.naive(idx)
	if string(dst) != string(want2) {
		t.Fatal("GetRagged after the errors read other rows")
	}
}

// TestClusterRaggedBadInput: lengths that are negative or do not add up,
// and ranks that disagree on the type or the trailing shape, fail the Add
// on every rank naming the values; a correct Add of the name then works.
func TestClusterRaggedBadInput(t *testing.T) {
	c := startCluster(t, []int{1, 2}, viaHandshakeDir)
	j := newRaggedJob(3, []int64{4, 3, 5}, 4, 3)
	for _, tc := range []struct {
		name string
		add  func(r int, s *ddstore.Store) error
		// every rank's error says this; the rank at fault's says mine
		all, mine string
		at        int
	}{
		{"negative length", func(r int, s *ddstore.Store) error {
			l := slices.Clone(j.lengths[r])
			if r == 1 {
				l[1] = -2
			}
			return s.AddRagged("v", j.values(r), l, ddstore.Float32)
		}, "rank 1 could not create its shard", "lengths[1] = -2: want >= 0", 1},
		{"lengths do not add up", func(r int, s *ddstore.Store) error {
			v := j.values(r)
			if r == 2 {
				v = append(v, 0, 0, 0, 0)
			}
			return s.AddRagged("v", v, j.lengths[r], ddstore.Float32)
		}, "rank 2 could not create its shard", "but the values are", 2},
		{"dtype differs", func(r int, s *ddstore.Store) error {
			dt := ddstore.Float32
			if r == 2 {
				dt = ddstore.Int32
			}
			return s.AddRagged("v", j.values(r), j.lengths[r], dt)
		}, `"int32"`, `"float32"`, 0},
		{"trailing shape differs", func(r int, s *ddstore.Store) error {
			shape := []int64{2, 2}
			if r == 0 {
				shape = []int64{4}
			}
			return s.AddRagged("v", j.values(r), j.lengths[r], ddstore.Uint8, shape...)
		}, "trailing shape", "[2 2]", 0},
		{"ragged and fixed", func(r int, s *ddstore.Store) error {
			if r == 1 {
				return s.Add("v", make([]byte, 8), 1, 4)
			}
			return s.AddRagged("v", j.values(r), j.lengths[r], ddstore.Float32)
		}, "ragged rows", "fixed rows", 1},
	} {
		errs := c.each(tc.add)
		for r, err := range errs {
			if !errors.Is(err, ddstore.ErrGeometry) {
				t.Fatalf("%s: rank %d: %v, want ErrGeometry", tc.name, r, err)
			}
			if r != tc.at && !strings.Contains(err.Error(), tc.all) {
				t.Fatalf("%s: rank %d: %q does not say %q", tc.name, r, err, tc.all)
			}
		}
		if !strings.Contains(errs[tc.at].Error(), tc.mine) {
			t.Fatalf("%s: rank %d: %q does not say %q", tc.name, tc.at, errs[tc.at], tc.mine)
		}
	}
	j.add(t, c, "v", ddstore.Float32)
	c.mustEach(t, func(r int, s *ddstore.Store) error {
		idx := []int64{11, 0, 5}
		want, _ := j.naive(idx)
		dst := make([]byte, len(want))
		if _, err := s.GetRagged("v", dst, idx, nil); err != nil {
			return err
		}
		if string(dst) != string(want) {
			return fmt.Errorf("rows %v differ", idx)
		}
		return nil
	})
}

// TestClusterRaggedFreeAgain: a ragged variable freed by every rank goes on
// every node, index included, and its name can be created again with
// other rows, which read as the new ones.
func TestClusterRaggedFreeAgain(t *testing.T) {
	c := startCluster(t, []int{1, 1}, viaHandshakeDir)
	for round := range 3 {
		j := newRaggedJob(uint64(10+round), []int64{int64(3 + round*5), int64(8 - round)}, 2, int64(4+round))
		j.add(t, c, "again", ddstore.Int16)
		c.mustEach(t, func(r int, s *ddstore.Store) error {
			idx := make([]int64, j.total())
			for i := range idx {
				idx[i] = j.total() - 1 - int64(i)
			}
			want, wantLen := j.naive(idx)
			dst := make([]byte, len(want))
			lengths := make([]int64, len(idx))
			if _, err := s.GetRagged("again", dst, idx, lengths); err != nil {
				return err
			}
			if string(dst) != string(want) || !slices.Equal(lengths, wantLen) {
				return fmt.Errorf("round %d: rows differ", round)
			}
			return s.Free("again")
		})
	}
}

// TestAgentRestartReadoptsRagged: a ragged variable's shards and its node
// index survive a SIGKILLed agent; the restarted agent re-adopts both (the
// same files, counted in its memory) and a store opened then reads the
// rows.
func TestAgentRestartReadoptsRagged(t *testing.T) {
	dir := t.TempDir()
	ns := fmt.Sprintf("rrestart%d", os.Getpid())
	runDir := filepath.Join(dir, "run")
	removeSegmentsAtEnd(t, ns)
	p := startRestartableAgent(t, "--namespace", ns, "--node", "n0", "--run-dir", runDir, "--timeout", "5s")
	open := func(rank, size int) *ddstore.Store { return openLocal(t, ns, "n0", runDir, rank, size, rank, size) }
	c := &cluster{ns: ns, stores: []*ddstore.Store{open(0, 2), open(1, 2)}}
	j := newRaggedJob(7, []int64{30, 20}, 4, 6)
	j.add(t, c, "rg", ddstore.Int32)
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
	if err != nil || len(in.Variables) != 1 || in.Variables[0].Kind != "ragged" || in.Variables[0].IndexBytes != 51*8 {
		t.Fatalf("info %+v, %v: want one ragged variable with an index of 51 offsets", in.Variables, err)
	}
	used := in.MemoryBytes
	p.kill()
	p.start()
	testutil.WaitFor(t, 20*time.Second, func() (err error) {
		in, err = ddstore.QueryAgent(sock, ns, "n0")
		return err
	})
	if in.Counters["adopted_variables"] != 1 || in.MemoryBytes != used {
		t.Fatalf("after the restart: adopted %d, memory %d bytes; want 1 and %d", in.Counters["adopted_variables"], in.MemoryBytes, used)
	}
	late := open(0, 2)
	idx := make([]int64, j.total())
	for i := range idx {
		idx[i] = int64(i)
	}
	want, _ := j.naive(idx)
	dst := make([]byte, len(want))
	if _, err := late.GetRagged("rg", dst, idx, nil); err != nil {
		t.Fatal(err)
	}
	if string(dst) != string(want) {
		t.Fatal("rows read after the restart differ")
	}
	for _, s := range segments(ns) {
		if inode(t, s) != before[s] {
			t.Errorf("segment %s was made again, not re-adopted", s)
		}
	}
}

// TestClusterRaggedReaderNode: a node holding no shard of a ragged
// variable builds its own index for a reader there (PeerOffsets from both
// owners); once the variable is freed and made again, the stale index goes
// with the stale table, its memory given back, and the old reader and a
// new one read the new rows.
func TestClusterRaggedReaderNode(t *testing.T) {
	c := startCluster(t, []int{1, 1, 0}, viaHandshakeDir)
	reader := func() *ddstore.Store {
		r, err := ddstore.Open(ddstore.Config{Namespace: c.ns, Rank: 0, Size: 1, Node: "node2",
			Socket: c.agents[2].Socket(), NoSpawn: true, Reader: true, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	readAll := func(r *ddstore.Store, j *raggedJob) error {
		idx := make([]int64, j.total())
		for i := range idx {
			idx[i] = int64(i)
		}
		want, _ := j.naive(idx)
		dst := make([]byte, len(want))
		if _, err := r.GetRagged("rr", dst, idx, nil); err != nil {
			return err
		}
		if string(dst) != string(want) {
			return fmt.Errorf("rows differ")
		}
		return nil
	}
	j1 := newRaggedJob(21, []int64{9, 14}, 8, 5)
	j1.add(t, c, "rr", ddstore.Float64)
	r1 := reader()
	if err := readAll(r1, j1); err != nil {
		t.Fatal(err)
	}
	info := func() ddstore.AgentInfo {
		in, err := ddstore.QueryAgent(c.agents[2].Socket(), c.ns, "node2")
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	in := info()
	if len(in.Variables) != 1 || in.Variables[0].IndexBytes != 24*8 {
		t.Fatalf("node2 %+v: want the index of 23 rows and nothing else", in.Variables)
	}
	used := in.MemoryBytes // the index, and the reader's staging region
	c.mustEach(t, func(r int, s *ddstore.Store) error { return s.Free("rr") })
	j2 := newRaggedJob(22, []int64{5, 3}, 8, 9)
	j2.add(t, c, "rr", ddstore.Float64)
	// The reader that read the old variable reads the new one: its read by
	// the stale table was refused, and it looked the name up again.
	if err := readAll(r1, j2); err != nil {
		t.Fatalf("the old reader, after the variable was made again: %v", err)
	}
	if in := info(); len(in.Variables) != 1 || in.Variables[0].IndexBytes != 9*8 || in.MemoryBytes != used-24*8+9*8 {
		t.Fatalf("node2 after the stale read: %+v, memory %d: want the new index of 8 rows only, %d bytes", in.Variables, in.MemoryBytes, used-24*8+9*8)
	}
	if err := readAll(reader(), j2); err != nil {
		t.Fatal(err)
	}
}

// TestClusterRaggedFromFailedRead: AddRaggedFrom fills each rank's shard
// in place; a read that fails on one rank fails the add on every rank,
// naming that rank's error there, and leaves the name free for an add
// that reads.
func TestClusterRaggedFromFailedRead(t *testing.T) {
	c := startCluster(t, []int{1, 1}, viaHandshakeDir)
	j := newRaggedJob(4, []int64{9, 12}, 12, 6)
	unreadable := errors.New("values file unreadable at unit 3")
	errs := c.each(func(r int, s *ddstore.Store) error {
		v := j.values(r)
		return s.AddRaggedFrom("from", int64(len(v)), func(dst []byte) error {
			if r == 1 {
				return unreadable
			}
			copy(dst, v)
			return nil
		}, j.lengths[r], ddstore.Float32, nil, 3)
	})
	if !errors.Is(errs[1], unreadable) || errs[0] == nil {
		t.Fatalf("a failed read on rank 1: errors %v; want rank 1's own and one on rank 0", errs)
	}
	c.mustEach(t, func(r int, s *ddstore.Store) error {
		v := j.values(r)
		return s.AddRaggedFrom("from", int64(len(v)), func(dst []byte) error { copy(dst, v); return nil }, j.lengths[r], ddstore.Float32, nil, 3)
	})
	idx := []int64{20, 0, 9, 3}
	want, wantLen := j.naive(idx)
	dst := make([]byte, len(want))
	lengths := make([]int64, len(idx))
	if _, err := c.stores[0].GetRagged("from", dst, idx, lengths); err != nil || string(dst) != string(want) || !slices.Equal(lengths, wantLen) {
		t.Fatalf("rows read back differ (%v)", err)
	}
}

// TestClusterRaggedIndexPeerGone: a node holding no shard builds its
// index from the other nodes' agents at once; with one of them gone, the
// read fails naming that node's rank, the other fetches stop, and the node
// keeps no half-built index (a second read fails the same way, no hang).
func TestClusterRaggedIndexPeerGone(t *testing.T) {
	c := startCluster(t, []int{1, 1, 1, 0}, viaHandshakeDir)
	j := newRaggedJob(24, []int64{9, 14, 11}, 8, 5)
	j.add(t, c, "rr", ddstore.Float64)
	if err := c.agents[2].Close(); err != nil {
		t.Fatal(err)
	}
	r, err := ddstore.Open(ddstore.Config{Namespace: c.ns, Rank: 0, Size: 1, Node: "node3",
		Socket: c.agents[3].Socket(), NoSpawn: true, Reader: true, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	dst := make([]byte, 1<<12)
	for try := range 2 {
		_, err := r.GetRagged("rr", dst, []int64{0, 30}, nil)
		if err == nil || !strings.Contains(err.Error(), `rank 2's offsets from node "node2"`) {
			t.Fatalf("read %d with node2's agent gone: %v; want the index's fetch of rank 2's offsets to fail", try, err)
		}
	}
	in, err := ddstore.QueryAgent(c.agents[3].Socket(), c.ns, "node3")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range in.Variables {
		if v.IndexBytes != 0 {
			t.Errorf("node3 keeps an index of %d bytes of %q after its build failed", v.IndexBytes, v.Name)
		}
	}
}
