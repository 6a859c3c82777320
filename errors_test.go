package ddstore_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/testutil"
)

// The tests of this file feed each public method a bad input and check
// three things: the error wraps the right sentinel, its message names the
// value at fault, and the store still works afterwards (nothing lost, no
// lane or collective left in a bad state).

// errRows is the shard layout of the variable "x" of the error tests: a job
// of 4 ranks on 2 nodes (ranks 0, 1 on node0; 2, 3 on node1), with an
// empty shard on rank 2.
var errRows = []int64{5, 3, 0, 4}

const (
	errDisp  = 3
	errItem  = 8
	errRB    = errDisp * errItem
	errTotal = 12
)

func errCluster(t *testing.T) *cluster {
	t.Helper()
	c := startCluster(t, []int{2, 2}, viaRendezvous)
	c.addPattern(t, "x", errRows, errDisp, errItem)
	return c
}

// wantErr checks that err wraps sentinel and that its message holds every
// one of parts.
func wantErr(t testing.TB, what string, err, sentinel error, parts ...string) {
	t.Helper()
	if e := testutil.CheckErr(err, sentinel, parts...); e != nil {
		t.Fatalf("%s: %v", what, e)
	}
}

// rowsOK reports, without failing the test (it runs in other goroutines),
// whether dst holds the patterned rows idx.
func rowsOK(dst []byte, idx []int64, rb int) error {
	want := make([]byte, rb)
	for i, g := range idx {
		pattern(want, g)
		if got := dst[i*rb : (i+1)*rb]; !bytes.Equal(got, want) {
			return fmt.Errorf("row %d (position %d): got %x..., want %x...", g, i, got[:min(16, rb)], want[:min(16, rb)])
		}
	}
	return nil
}

// readAll reads every row of a patterned variable on s, with Get and with a
// reversed GetBatch, and checks them.
func readAll(t testing.TB, s *ddstore.Store, name string, total int64, rb int) {
	t.Helper()
	all := make([]byte, total*int64(rb))
	if err := s.Get(name, all, 0); err != nil {
		t.Fatalf("rank %d: Get %q after the error: %v", s.Rank(), name, err)
	}
	for g := range total {
		checkRow(t, all[g*int64(rb):(g+1)*int64(rb)], g)
	}
	idx := make([]int64, total)
	for i := range idx {
		idx[i] = total - 1 - int64(i)
	}
	dst := make([]byte, len(idx)*rb)
	if err := s.GetBatch(name, dst, idx); err != nil {
		t.Fatalf("rank %d: GetBatch %q after the error: %v", s.Rank(), name, err)
	}
	for i, g := range idx {
		checkRow(t, dst[i*rb:(i+1)*rb], g)
	}
}

func readAllRanks(t testing.TB, c *cluster, name string, total int64, rb int) {
	t.Helper()
	for _, s := range c.stores {
		readAll(t, s, name, total, rb)
	}
}

// eachWithin runs f on every rank like c.each but fails, instead of
// hanging, when the ranks have not all returned within d.
func eachWithin(t testing.TB, c *cluster, d time.Duration, f func(rank int, s *ddstore.Store) error) []error {
	t.Helper()
	done := make(chan []error, 1)
	go func() { done <- c.each(f) }()
	select {
	case errs := <-done:
		return errs
	case <-time.After(d):
		t.Fatalf("collective did not return within %v (hang)", d)
		return nil
	}
}

func filled(n int) []byte { return bytes.Repeat([]byte{0xAB}, n) }

func untouched(t testing.TB, what string, dst []byte) {
	t.Helper()
	for i, b := range dst {
		if b != 0xAB {
			t.Fatalf("%s: destination byte %d changed to %#x though the call failed", what, i, b)
		}
	}
}

// 1. A variable that was never added.
func TestClusterErrUnknownVariable(t *testing.T) {
	c := errCluster(t)
	for _, r := range []int{0, 3} { // one rank on the coordinator's node, one on the other
		s := c.stores[r]
		dst := filled(2 * errRB)
		wantErr(t, "GetBatch", s.GetBatch("nope", dst, []int64{0, 1}), ddstore.ErrUnknown, `"nope"`)
		untouched(t, "GetBatch", dst)
		wantErr(t, "Get", s.Get("nope", dst, 0), ddstore.ErrUnknown, `"nope"`)
		untouched(t, "Get", dst)
		_, err := s.Info("nope")
		wantErr(t, "Info", err, ddstore.ErrUnknown, `"nope"`)
		_, err = s.Profile("nope")
		wantErr(t, "Profile", err, ddstore.ErrUnknown, `"nope"`)
		wantErr(t, "Update", s.Update("nope", make([]byte, errRB), 0), ddstore.ErrUnknown, `"nope"`)
		// The lookup failure must not leave a half-known variable behind.
		wantErr(t, "GetBatch again", s.GetBatch("nope", dst, []int64{0, 1}), ddstore.ErrUnknown, `"nope"`)
	}
	readAllRanks(t, c, "x", errTotal, errRB)
	// The name is still free: every rank can add it now.
	c.addPattern(t, "nope", []int64{1, 1, 1, 1}, 2, 4)
	readAllRanks(t, c, "nope", 4, 8)
}

// 2. Indices outside [0, total).
func TestClusterBadIndex(t *testing.T) {
	c := errCluster(t)
	cases := []struct {
		name  string
		idx   []int64
		parts []string
	}{
		{"total", []int64{0, errTotal, 1}, []string{"indices[1] = 12", "[0, 12)"}},
		{"negative", []int64{11, 2, -1}, []string{"indices[2] = -1", "[0, 12)"}},
		{"last valid then bad", []int64{5, 8, 9, 11, 13}, []string{"indices[4] = 13"}},
		{"max int64", []int64{3, math.MaxInt64}, []string{fmt.Sprint(int64(math.MaxInt64))}},
		{"min int64", []int64{math.MinInt64}, []string{fmt.Sprint(int64(math.MinInt64))}},
	}
	for _, r := range []int{0, 2} {
		s := c.stores[r]
		for _, tc := range cases {
			t.Run(fmt.Sprintf("GetBatch/rank%d/%s", r, tc.name), func(t *testing.T) {
				dst := filled(len(tc.idx) * errRB)
				err := s.GetBatch("x", dst, tc.idx)
				wantErr(t, "GetBatch", err, ddstore.ErrIndex, append([]string{`"x"`}, tc.parts...)...)
				untouched(t, "GetBatch", dst)
				readAll(t, s, "x", errTotal, errRB)
			})
		}
		gets := []struct {
			name  string
			start int64
			rows  int
			parts []string
		}{
			{"start at total", errTotal, 1, []string{"12", "[0, 12)"}},
			{"start far out", 1 << 40, 2, []string{fmt.Sprint(int64(1 << 40))}},
			{"start negative", -1, 1, []string{"-1"}},
			{"past the end", errTotal - 1, 2, []string{"[11, 13)", "12"}},
			{"past the end from 0", 0, errTotal + 1, []string{"[0, 13)"}},
			{"past the end, remote start", 9, 4, []string{"[9, 13)"}},
		}
		for _, tc := range gets {
			t.Run(fmt.Sprintf("Get/rank%d/%s", r, tc.name), func(t *testing.T) {
				dst := filled(tc.rows * errRB)
				err := s.Get("x", dst, tc.start)
				wantErr(t, "Get", err, ddstore.ErrIndex, append([]string{`"x"`}, tc.parts...)...)
				untouched(t, "Get", dst)
				readAll(t, s, "x", errTotal, errRB)
			})
		}
	}
	readAllRanks(t, c, "x", errTotal, errRB)
}

// 3. Destinations of the wrong size.
func TestClusterBadBuffer(t *testing.T) {
	c := errCluster(t)
	for _, r := range []int{1, 3} {
		s := c.stores[r]
		batches := []struct {
			name string
			n    int // dst bytes
			idx  []int64
		}{
			{"one byte short", 2*errRB - 1, []int64{0, 9}},
			{"one byte long", 2*errRB + 1, []int64{0, 9}},
			{"a row too many", 3 * errRB, []int64{0, 9}},
			{"empty for rows", 0, []int64{4}},
			{"rows for no index", errRB, nil},
		}
		for _, tc := range batches {
			t.Run(fmt.Sprintf("GetBatch/rank%d/%s", r, tc.name), func(t *testing.T) {
				dst := filled(tc.n)
				err := s.GetBatch("x", dst, tc.idx)
				wantErr(t, "GetBatch", err, ddstore.ErrBuffer, `"x"`, fmt.Sprintf("destination of %d bytes", tc.n),
					fmt.Sprintf("want %d bytes", len(tc.idx)*errRB))
				untouched(t, "GetBatch", dst)
				readAll(t, s, "x", errTotal, errRB)
			})
		}
		for _, n := range []int{errRB - 1, errRB + 1, 2*errRB + 7, 0} {
			t.Run(fmt.Sprintf("Get/rank%d/%dbytes", r, n), func(t *testing.T) {
				dst := filled(n)
				err := s.Get("x", dst, 0)
				wantErr(t, "Get", err, ddstore.ErrBuffer, `"x"`, fmt.Sprintf("destination of %d bytes", n), fmt.Sprint(errRB))
				untouched(t, "Get", dst)
				wantErr(t, "Get nil", s.Get("x", nil, 0), ddstore.ErrBuffer, "destination of 0 bytes")
				readAll(t, s, "x", errTotal, errRB)
			})
		}
	}
	// An empty batch into an empty destination is not an error.
	if err := c.stores[0].GetBatch("x", nil, nil); err != nil {
		t.Fatalf("empty GetBatch: %v", err)
	}
	// A receive buffer freed twice at once is freed once; the other call
	// is told it is not a buffer (and -race sees no race).
	buf, err := c.stores[0].AllocRecv(4 * errRB)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- c.stores[0].FreeRecv(buf) }()
	}
	e1, e2 := <-errs, <-errs
	if (e1 == nil) == (e2 == nil) || !errors.Is(errors.Join(e1, e2), ddstore.ErrBuffer) {
		t.Fatalf("FreeRecv twice at once: %v and %v; want one nil and one ErrBuffer", e1, e2)
	}
	readAllRanks(t, c, "x", errTotal, errRB)
}

// 4. Ranks that disagree on the row shape: every rank fails with
// ErrGeometry, nobody hangs, and the name can then be added correctly.
func TestClusterErrGeometryMismatch(t *testing.T) {
	c := errCluster(t)
	cases := []struct {
		name           string
		odd            int // the rank that disagrees
		disp, itemsize int64
		oddDisp        int64
		oddItem        int64
		parts          []string
	}{
		{"disp", 3, 3, 8, 4, 8, []string{"disp 3", "disp 4"}},
		{"itemsize", 1, 2, 4, 2, 8, []string{"itemsize 4", "itemsize 8"}},
		{"disp on rank 0", 0, 5, 2, 1, 2, []string{"disp 5", "disp 1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			name := "geom-" + tc.name
			for round := range 2 { // a second mismatch on the same name fails the same way
				errs := eachWithin(t, c, 8*time.Second, func(r int, s *ddstore.Store) error {
					disp, item := tc.disp, tc.itemsize
					if r == tc.odd {
						disp, item = tc.oddDisp, tc.oddItem
					}
					rows := make([]byte, errRows[r]*disp*item)
					for i := range rows {
						rows[i] = byte(i)
					}
					return s.Add(name, rows, disp, item)
				})
				for r, err := range errs {
					wantErr(t, fmt.Sprintf("round %d rank %d", round, r), err, ddstore.ErrGeometry, append([]string{`"` + name + `"`}, tc.parts...)...)
				}
			}
			for _, s := range c.stores {
				_, err := s.Info(name)
				wantErr(t, "Info of the failed variable", err, ddstore.ErrUnknown, name)
			}
			// Now all ranks agree: the same name is added and reads back.
			c.addPattern(t, name, errRows, tc.disp, tc.itemsize)
			readAllRanks(t, c, name, errTotal, int(tc.disp*tc.itemsize))
			readAllRanks(t, c, "x", errTotal, errRB)
		})
	}
}

// miniJob opens a job of its own, of size ranks all on node0, next to the
// cluster's (same namespace and agent), whose collectives time out fast.
func miniJob(t *testing.T, c *cluster, size int) []*ddstore.Store {
	t.Helper()
	var out []*ddstore.Store
	for r := range size {
		s, err := ddstore.Open(ddstore.Config{Namespace: c.ns, Rank: r, Size: size, LocalRank: r, LocalSize: size,
			Node: "node0", Socket: c.agents[0].Socket(), NoSpawn: true,
			PublishTimeout: 300 * time.Millisecond, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		out = append(out, s)
	}
	return out
}

// addOne adds name on every store of a mini job (rank r holds rows r*2 and
// r*2+1, rows of 8 bytes) and reads it back.
func addOne(t testing.TB, j []*ddstore.Store, name string) {
	t.Helper()
	errs := make([]error, len(j))
	var wg sync.WaitGroup
	for r, s := range j {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rows := make([]byte, 16)
			pattern(rows[:8], int64(2*r))
			pattern(rows[8:], int64(2*r+1))
			errs[r] = s.Add(name, rows, 1, 8)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("mini job rank %d: Add %q: %v", r, name, err)
		}
	}
	for _, s := range j {
		readAll(t, s, name, int64(2*len(j)), 8)
	}
}

// 4b. A rank whose shape is invalid (so it fails before it reaches the
// collective) disagrees with the others too: Add's contract is that ranks
// that disagree on disp or itemsize all get ErrGeometry.
func TestClusterErrGeometryInvalidOnOneRank(t *testing.T) {
	c := errCluster(t)
	cases := []struct {
		name           string
		disp, itemsize int64 // rank 1's; rank 0 adds disp 3, itemsize 8
		part           string
	}{
		{"disp 0", 0, 8, "disp 0"},
		{"itemsize 65", 3, 65, "itemsize 65"},
	}
	var bugs []string
	for _, tc := range cases {
		j := miniJob(t, c, 2)
		name := "inv-" + strings.ReplaceAll(tc.name, " ", "")
		errs := make([]error, 2)
		durs := make([]time.Duration, 2)
		var wg sync.WaitGroup
		for r, s := range j {
			wg.Add(1)
			go func() {
				defer wg.Done()
				disp, item := int64(3), int64(8)
				if r == 1 {
					disp, item = tc.disp, tc.itemsize
				}
				t0 := time.Now()
				errs[r] = s.Add(name, make([]byte, 2*max(disp*item, 1)), disp, item)
				durs[r] = time.Since(t0)
			}()
		}
		wg.Wait()
		wantErr(t, tc.name+": rank 1", errs[1], ddstore.ErrGeometry, `"`+name+`"`, tc.part)
		if errs[0] == nil {
			t.Fatalf("%s: rank 0's Add succeeded though rank 1's failed", tc.name)
		}
		if !errors.Is(errs[0], ddstore.ErrGeometry) {
			bugs = append(bugs, fmt.Sprintf("%s: rank 0 got %q after %v", tc.name, errs[0], durs[0].Round(time.Millisecond)))
		}
		// Nothing is stuck: the mini job adds another variable and the
		// cluster reads its own.
		addOne(t, j, name+"-ok")
		readAllRanks(t, c, "x", errTotal, errRB)
	}
	if len(bugs) > 0 {
		t.Fatal("a rank with an invalid shape must fail the round for every rank with ErrGeometry, not leave them to time out: " +
			strings.Join(bugs, "; "))
	}
}

// 4c. After a collective failed, a correct retry by every rank succeeds,
// whatever order the ranks arrive in.
func TestClusterErrRetryAfterFailedCollective(t *testing.T) {
	c := errCluster(t)
	j := miniJob(t, c, 2)
	// Round 1: rank 1 passes disp 0 and fails at once; rank 0 times out.
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r, s := range j {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = s.Add("retry", make([]byte, 8), int64(1-r), 8)
		}()
	}
	wg.Wait()
	wantErr(t, "round 1 rank 1", errs[1], ddstore.ErrGeometry, "disp 0")
	if errs[0] == nil {
		t.Fatal("round 1: rank 0 succeeded alone")
	}
	// Round 2: both ranks retry correctly, rank 1 first.
	rows := func(r int) []byte {
		b := make([]byte, 16)
		pattern(b[:8], int64(2*r))
		pattern(b[8:], int64(2*r+1))
		return b
	}
	res1 := make(chan error, 1)
	go func() { res1 <- j[1].Add("retry", rows(1), 1, 8) }()
	var err1 error
	got1 := false
	select {
	case err1 = <-res1: // only a failure comes back before rank 0 has called
		got1 = true
	case <-time.After(100 * time.Millisecond): // well within the 300 ms PublishTimeout
	}
	err0 := j[0].Add("retry", rows(0), 1, 8)
	if !got1 {
		select {
		case err1 = <-res1:
		case <-time.After(8 * time.Second):
			t.Fatal("round 2: rank 1 hangs")
		}
	}
	// Whatever happened, the agent still serves: a new name works.
	addOne(t, j, "retry-other")
	readAllRanks(t, c, "x", errTotal, errRB)
	if err0 == nil && err1 == nil {
		for _, s := range j {
			readAll(t, s, "retry", 4, 8)
		}
		return
	}
	t.Fatalf("round 2: rank 0: %v; rank 1: %v; want both to succeed", err0, err1)
}

// 5. A second Add or Init of an existing name.
func TestClusterErrExists(t *testing.T) {
	c := errCluster(t)
	errs := eachWithin(t, c, 8*time.Second, func(r int, s *ddstore.Store) error {
		rows := make([]byte, 2*errRB) // different content: must not overwrite
		return s.Add("x", rows, errDisp, errItem)
	})
	for r, err := range errs {
		wantErr(t, fmt.Sprintf("Add rank %d", r), err, ddstore.ErrExists, `"x"`)
	}
	errs = eachWithin(t, c, 8*time.Second, func(r int, s *ddstore.Store) error {
		return s.Init("x", 7, 1, 1) // another shape too
	})
	for r, err := range errs {
		wantErr(t, fmt.Sprintf("Init rank %d", r), err, ddstore.ErrExists, `"x"`)
	}
	readAllRanks(t, c, "x", errTotal, errRB)

	// A Store that never saw "x" (a restarted rank) is stopped by the agent
	// or the coordinator, not only by its own map.
	for i, r := range []int{2, 0} {
		s, err := ddstore.Open(ddstore.Config{Namespace: c.ns, Rank: r, Size: 4, LocalRank: 0, LocalSize: 2,
			Node: fmt.Sprintf("node%d", 1-i), Socket: c.agents[1-i].Socket(), NoSpawn: true,
			Timeout: 5 * time.Second, PublishTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		err = s.Add("x", make([]byte, errRB), errDisp, errItem)
		wantErr(t, fmt.Sprintf("fresh store of rank %d: Add", r), err, ddstore.ErrExists, `"x"`)
		readAll(t, s, "x", errTotal, errRB)
		s.Close()
	}
	readAllRanks(t, c, "x", errTotal, errRB)
}

// 6. Update outside the shard, or of a partial row.
func TestClusterBadUpdate(t *testing.T) {
	c := errCluster(t)
	s := c.stores[0] // 5 rows: global 0..4
	two := make([]byte, 2*errRB)
	cases := []struct {
		name   string
		rows   []byte
		offset int64
		want   error
		parts  []string
	}{
		{"past the end", two, 4, ddstore.ErrIndex, []string{"[4, 6)", "5 rows", "rank 0"}},
		{"offset at the end", two[:errRB], 5, ddstore.ErrIndex, []string{"[5, 6)", "5 rows"}},
		{"offset far out", two[:errRB], 1 << 50, ddstore.ErrIndex, []string{fmt.Sprint(int64(1 << 50))}},
		{"negative offset", two[:errRB], -1, ddstore.ErrIndex, []string{"[-1, 0)"}},
		{"too many rows", make([]byte, 6*errRB), 0, ddstore.ErrIndex, []string{"[0, 6)", "5 rows"}},
		{"partial row", two[:errRB+1], 0, ddstore.ErrBuffer, []string{fmt.Sprintf("%d bytes", errRB+1), fmt.Sprint(errRB)}},
		{"less than a row", two[:errRB-1], 1, ddstore.ErrBuffer, []string{fmt.Sprintf("%d bytes", errRB-1)}},
	}
	for i := range two {
		two[i] = 0xCD
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wantErr(t, "Update", s.Update("x", tc.rows, tc.offset), tc.want, append([]string{`"x"`}, tc.parts...)...)
			readAll(t, c.stores[3], "x", errTotal, errRB) // nothing was written
			readAll(t, s, "x", errTotal, errRB)
		})
	}
	// A rank with an empty shard can update nothing.
	err := c.stores[2].Update("x", make([]byte, errRB), 0)
	if !errors.Is(err, ddstore.ErrIndex) && !errors.Is(err, ddstore.ErrArgument) {
		t.Fatalf("Update of an empty shard: %v, want ErrIndex or ErrArgument", err)
	}
	if err := c.stores[2].Update("x", nil, 0); err != nil {
		t.Fatalf("empty Update of an empty shard: %v", err)
	}

	// A correct update: rows 3 and 4 of rank 0 now hold the pattern of rows
	// 103 and 104; the other node sees them, the rest is unchanged.
	pattern(two[:errRB], 103)
	pattern(two[errRB:], 104)
	if err := s.Update("x", two, 3); err != nil {
		t.Fatal(err)
	}
	for _, r := range []int{3, 2, 1, 0} {
		dst := make([]byte, errTotal*errRB)
		if err := c.stores[r].Get("x", dst, 0); err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		for g := range int64(errTotal) {
			want := g
			if g == 3 || g == 4 {
				want = g + 100
			}
			checkRow(t, dst[g*errRB:(g+1)*errRB], want)
		}
		b := make([]byte, 2*errRB)
		if err := c.stores[r].GetBatch("x", b, []int64{4, 3}); err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		checkRow(t, b[:errRB], 104)
		checkRow(t, b[errRB:], 103)
	}
	// A rank of node1 updates its shard; node0 reads it.
	row := make([]byte, errRB)
	pattern(row, 500)
	if err := c.stores[3].Update("x", row, 3); err != nil { // global row 11
		t.Fatal(err)
	}
	b := make([]byte, errRB)
	if err := c.stores[0].GetBatch("x", b, []int64{11}); err != nil {
		t.Fatal(err)
	}
	checkRow(t, b, 500)
}

// 7. Use after Free and after Close.
func TestClusterErrFreedAndClosed(t *testing.T) {
	c := errCluster(t)
	c.addPattern(t, "y", []int64{1, 2, 3, 4}, 1, 8)
	s0 := c.stores[0]
	if err := s0.Free("x"); err != nil {
		t.Fatal(err)
	}
	dst := filled(errRB)
	wantErr(t, "GetBatch after Free", s0.GetBatch("x", dst, []int64{0}), ddstore.ErrFreed, `"x"`)
	untouched(t, "GetBatch after Free", dst)
	wantErr(t, "GetBatch of a remote row after Free", s0.GetBatch("x", dst, []int64{10}), ddstore.ErrFreed, `"x"`)
	wantErr(t, "Get after Free", s0.Get("x", dst, 0), ddstore.ErrFreed, `"x"`)
	wantErr(t, "Update after Free", s0.Update("x", make([]byte, errRB), 0), ddstore.ErrFreed, `"x"`)
	_, err := s0.Info("x")
	wantErr(t, "Info after Free", err, ddstore.ErrFreed, `"x"`)
	err = s0.Free("x")
	if !errors.Is(err, ddstore.ErrUnknown) && !errors.Is(err, ddstore.ErrFreed) {
		t.Fatalf("second Free: %v, want ErrUnknown or ErrFreed", err)
	}
	wantErr(t, "Free of an unknown name", s0.Free("nope"), ddstore.ErrUnknown, `"nope"`)
	// The other ranks still hold "x": rank 0 cannot make it anew alone.
	wantErr(t, "Add after Free", s0.Add("x", make([]byte, errRB), errDisp, errItem), ddstore.ErrExists, `"x"`)
	wantErr(t, "GetBatch after Free and Add", s0.GetBatch("x", dst, []int64{0}), ddstore.ErrFreed, `"x"`)
	untouched(t, "after Free", dst)
	// The other ranks, on this node too, still read all of "x"; rank 0
	// still reads "y".
	for _, r := range []int{1, 2, 3} {
		readAll(t, c.stores[r], "x", errTotal, errRB)
	}
	readAll(t, s0, "y", 10, 8)

	// Close rank 3: every method fails with ErrClosed; Close again is fine.
	s3 := c.stores[3]
	if err := s3.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s3.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	calls := map[string]func() error{
		"GetBatch":    func() error { return s3.GetBatch("x", make([]byte, errRB), []int64{0}) },
		"GetBatch y":  func() error { return s3.GetBatch("y", make([]byte, 8), []int64{9}) },
		"Get":         func() error { return s3.Get("x", make([]byte, errRB), 11) },
		"Update":      func() error { return s3.Update("x", make([]byte, errRB), 0) },
		"Add":         func() error { return s3.Add("z", make([]byte, 8), 1, 8) },
		"Init":        func() error { return s3.Init("z", 1, 1, 8) },
		"Free":        func() error { return s3.Free("x") },
		"EpochBegin":  func() error { return s3.EpochBegin() },
		"EpochEnd":    func() error { return s3.EpochEnd() },
		"Info":        func() error { _, err := s3.Info("x"); return err },
		"Profile":     func() error { _, err := s3.Profile("x"); return err },
		"AllocRecv":   func() error { _, err := s3.AllocRecv(64); return err },
		"unknown var": func() error { return s3.GetBatch("nope", nil, nil) },
	}
	for name, f := range calls {
		wantErr(t, name+" after Close", f(), ddstore.ErrClosed, "closed")
	}
	if err := s3.Close(); err != nil {
		t.Fatalf("third Close: %v", err)
	}
	// Rank 2 shares node1 with the closed rank 3 and still reads its rows.
	for _, r := range []int{1, 2} {
		readAll(t, c.stores[r], "x", errTotal, errRB)
		readAll(t, c.stores[r], "y", 10, 8)
	}
	readAll(t, s0, "y", 10, 8)
}

// 7b. Once every rank has freed a variable its name can be added again,
// with another shape, and reads see only the new rows.
func TestClusterErrFreeAllThenAddAgain(t *testing.T) {
	c := errCluster(t)
	errs := eachWithin(t, c, 8*time.Second, func(r int, s *ddstore.Store) error { return s.Free("x") })
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: Free: %v", r, err)
		}
	}
	for _, s := range c.stores {
		wantErr(t, "GetBatch after Free", s.GetBatch("x", make([]byte, errRB), []int64{0}), ddstore.ErrFreed, `"x"`)
	}
	c.addPattern(t, "x", []int64{1, 2, 3, 4}, 2, 8)
	readAllRanks(t, c, "x", 10, 16)
}

// 7c. Close while other goroutines of the same Store read, locally and
// across nodes: each read either succeeds with the right rows or fails with
// ErrClosed (or ErrFreed); nothing crashes, races or hangs.
func TestClusterErrCloseDuringReads(t *testing.T) {
	c := errCluster(t)
	for _, r := range []int{0, 3} {
		s := c.stores[r]
		var wg sync.WaitGroup
		errc := make(chan error, 8)
		var reads sync.WaitGroup // each worker has read once before Close
		for w := range 8 {
			wg.Add(1)
			reads.Add(1)
			go func() {
				defer wg.Done()
				first := true
				for {
					idx := []int64{11, int64(w % errTotal), 9, 0}
					dst := make([]byte, len(idx)*errRB)
					err := s.GetBatch("x", dst, idx)
					if err == nil {
						err = rowsOK(dst, idx, errRB)
					}
					if first {
						reads.Done()
						first = false
					}
					if err != nil {
						if !errors.Is(err, ddstore.ErrClosed) && !errors.Is(err, ddstore.ErrFreed) {
							errc <- fmt.Errorf("rank %d worker %d: %w", r, w, err)
						}
						return
					}
				}
			}()
		}
		reads.Wait()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(8 * time.Second):
			t.Fatal("readers did not stop after Close")
		}
		close(errc)
		for err := range errc {
			t.Error(err)
		}
		wantErr(t, "GetBatch after Close", s.GetBatch("x", make([]byte, errRB), []int64{0}), ddstore.ErrClosed, "closed")
	}
	for _, r := range []int{1, 2} {
		readAll(t, c.stores[r], "x", errTotal, errRB)
	}
}

// 8. Bad shapes and buffers on Add and Init, on one rank: no collective
// starts, nothing is left behind, and the name can then be added.
func TestClusterBadGeometryArgs(t *testing.T) {
	c := errCluster(t)
	// Add and Init are collective: each call, good or bad, is one round.
	// Rank 2 passes a bad shape or buffer, the others a good one: every
	// rank fails at once (no rank waits for its timeout), rank 2 with its
	// own precise error.
	cases := []struct {
		name  string
		call  func(s *ddstore.Store, bad bool) error
		want  error
		parts []string
	}{
		{"Add of 25 bytes", func(s *ddstore.Store, bad bool) error {
			if bad {
				return s.Add("g", make([]byte, 25), 3, 8)
			}
			return s.Add("g", make([]byte, 24), 3, 8)
		}, ddstore.ErrBuffer, []string{"25 bytes", "24"}},
		{"disp 0", func(s *ddstore.Store, bad bool) error {
			return s.Init("g", 4, map[bool]int64{true: 0, false: 3}[bad], 8)
		}, ddstore.ErrGeometry, []string{"disp 0"}},
		{"itemsize 0", func(s *ddstore.Store, bad bool) error {
			return s.Add("g", nil, 3, map[bool]int64{true: 0, false: 8}[bad])
		}, ddstore.ErrGeometry, []string{"itemsize 0"}},
		{"disp negative", func(s *ddstore.Store, bad bool) error {
			return s.Init("g", 4, map[bool]int64{true: -2, false: 3}[bad], 8)
		}, ddstore.ErrGeometry, []string{"disp -2"}},
		{"itemsize 65", func(s *ddstore.Store, bad bool) error {
			return s.Add("g", nil, 1, map[bool]int64{true: 65, false: 8}[bad])
		}, ddstore.ErrGeometry, []string{"itemsize 65"}},
		{"negative rows", func(s *ddstore.Store, bad bool) error {
			return s.Init("g", map[bool]int64{true: -1, false: 2}[bad], 2, 4)
		}, ddstore.ErrGeometry, []string{"-1 rows"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan []error, 1)
			go func() { done <- c.each(func(r int, s *ddstore.Store) error { return tc.call(s, r == 2) }) }()
			var errs []error
			select {
			case errs = <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("a bad shape on one rank left the others waiting (hang)")
			}
			wantErr(t, "rank 2", errs[2], tc.want, append([]string{`"g"`}, tc.parts...)...)
			for r, err := range errs {
				if r != 2 && !errors.Is(err, ddstore.ErrGeometry) {
					t.Errorf("rank %d: %v, want ErrGeometry naming rank 2", r, err)
				}
			}
		})
	}
	// Nothing was created: all ranks add "g" and read it back.
	c.addPattern(t, "g", []int64{2, 0, 3, 1}, 2, 4)
	readAllRanks(t, c, "g", 6, 8)
	// Init gives zero rows that read back as zeros.
	c.mustEach(t, func(r int, s *ddstore.Store) error { return s.Init("zeros", int64(r), 2, 2) })
	z := filled(6 * 4)
	if err := c.stores[0].Get("zeros", z, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(z, make([]byte, len(z))) {
		t.Fatalf("Init rows: %x, want zeros", z)
	}
	readAllRanks(t, c, "x", errTotal, errRB)
}

// 9. A collective that one rank never joins times out, naming the missing
// ranks, instead of hanging.
func TestClusterErrPublishTimeout(t *testing.T) {
	c := errCluster(t)
	const size = 5
	var extra []*ddstore.Store
	for r := range 2 {
		s, err := ddstore.Open(ddstore.Config{Namespace: c.ns, Rank: r, Size: size, LocalRank: r, LocalSize: 2,
			Node: "node0", Socket: c.agents[0].Socket(), NoSpawn: true,
			PublishTimeout: 300 * time.Millisecond, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		extra = append(extra, s)
	}
	for round := range 2 { // a retry by the same ranks times out the same way
		errs := make([]error, len(extra))
		var wg sync.WaitGroup
		for r, s := range extra {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rows := make([]byte, 2*8)
				pattern(rows[:8], int64(2*r))
				pattern(rows[8:], int64(2*r+1))
				errs[r] = s.Add("late", rows, 1, 8)
			}()
		}
		wg.Wait()
		for r, err := range errs {
			wantErr(t, fmt.Sprintf("round %d rank %d", round, r), err, ddstore.ErrTimeout, `"late"`, "2, 3, 4", "2 of 5")
		}
	}
	_, err := extra[0].Info("late")
	wantErr(t, "Info of the timed-out variable", err, ddstore.ErrUnknown, `"late"`)
	// The agent still serves the cluster and its variables.
	readAllRanks(t, c, "x", errTotal, errRB)
	readAll(t, extra[1], "x", errTotal, errRB)
	c.addPattern(t, "after", []int64{1, 2, 3, 4}, 2, 8)
	readAllRanks(t, c, "after", 10, 16)
}

// 10. A peer agent that went away: reads of its rows fail quickly with
// ErrPeer or ErrTimeout; rows of the nodes still up read fine, locally and
// across nodes (the client's lanes and the agent's pool are still sound).
func TestClusterErrPeerDown(t *testing.T) {
	// ranks 0, 1 on node0; rank 2 on node1 (rows 8, 9); rank 3 on node2
	// (rows 10..13), whose agent goes away.
	c := startCluster(t, []int{2, 1, 1}, viaRendezvous)
	rows := []int64{5, 3, 2, 4}
	const total = 14
	c.addPattern(t, "x", rows, errDisp, errItem)
	readAllRanks(t, c, "x", total, errRB) // connections between the agents exist now
	if err := c.agents[2].Close(); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		r   int
		idx []int64
	}{
		{0, []int64{10, 11, 12, 13}},
		{0, []int64{0, 11, 1}},
		{1, []int64{8, 13}},
		{2, []int64{12}},
		{0, []int64{10}}, // again: the dead peer is redialed and fails again
	} {
		dst := make([]byte, len(tc.idx)*errRB)
		err := c.stores[tc.r].GetBatch("x", dst, tc.idx)
		if err == nil || !(errors.Is(err, ddstore.ErrPeer) || errors.Is(err, ddstore.ErrTimeout)) {
			t.Fatalf("read %d of rows of a closed agent: %v, want ErrPeer or ErrTimeout", i, err)
		}
		if !strings.Contains(err.Error(), `"x"`) {
			t.Errorf("read %d: error %q does not name the variable", i, err)
		}
	}
	err := c.stores[1].Get("x", make([]byte, 4*errRB), 7)
	if err == nil || !(errors.Is(err, ddstore.ErrPeer) || errors.Is(err, ddstore.ErrTimeout)) {
		t.Fatalf("Get across into node2: %v, want ErrPeer or ErrTimeout", err)
	}
	// Rows 0..9 (node0 and node1) still read, from every rank still up,
	// several times over.
	for _, s := range c.stores[:3] {
		for range 3 {
			all := make([]byte, 10*errRB)
			if err := s.Get("x", all, 0); err != nil {
				t.Fatalf("rank %d: Get of the live rows: %v", s.Rank(), err)
			}
			for g := range int64(10) {
				checkRow(t, all[g*errRB:(g+1)*errRB], g)
			}
			idx := []int64{9, 0, 8, 5, 3, 3, 7}
			dst := make([]byte, len(idx)*errRB)
			if err := s.GetBatch("x", dst, idx); err != nil {
				t.Fatalf("rank %d: GetBatch of the live rows: %v", s.Rank(), err)
			}
			for i, g := range idx {
				checkRow(t, dst[i*errRB:(i+1)*errRB], g)
			}
		}
		if _, err := s.Info("x"); err != nil {
			t.Fatal(err)
		}
	}
}

// Many goroutines per rank read at once, locally and across nodes, with
// Get, GetBatch and receive buffers; every row is checked. Run with -race.
func TestClusterManyGoroutinesRead(t *testing.T) {
	c := startCluster(t, []int{2, 2}, viaRendezvous)
	rows := []int64{37, 0, 21, 50}
	const disp, item, rb = 5, 4, 20
	c.addPattern(t, "m", rows, disp, item)
	var total int64
	for _, n := range rows {
		total += n
	}
	const workers, iters = 16, 12
	var wg sync.WaitGroup
	errc := make(chan error, len(c.stores)*workers)
	for r, s := range c.stores {
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(r), uint64(w)))
				var recv []byte
				if w%4 == 0 {
					var err error
					if recv, err = s.AllocRecv(64 * rb); err != nil {
						errc <- fmt.Errorf("rank %d worker %d: AllocRecv: %w", r, w, err)
						return
					}
					defer s.FreeRecv(recv)
				}
				for it := range iters {
					n := 1 + rng.IntN(64)
					var dst []byte
					if recv != nil {
						dst = recv[:n*rb]
					} else {
						dst = make([]byte, n*rb)
					}
					var idx []int64
					var err error
					if rng.IntN(2) == 0 {
						idx = make([]int64, n)
						for i := range idx {
							idx[i] = rng.Int64N(total)
						}
						err = s.GetBatch("m", dst, idx)
					} else {
						start := rng.Int64N(total - int64(n) + 1)
						idx = make([]int64, n)
						for i := range idx {
							idx[i] = start + int64(i)
						}
						err = s.Get("m", dst, start)
					}
					if err == nil {
						err = rowsOK(dst, idx, rb)
					}
					if err == nil && it%5 == 0 { // a bad call in the middle changes nothing
						if berr := s.GetBatch("m", dst[:rb], []int64{total}); !errors.Is(berr, ddstore.ErrIndex) {
							err = fmt.Errorf("bad index: %v, want ErrIndex", berr)
						}
					}
					if err != nil {
						errc <- fmt.Errorf("rank %d worker %d iteration %d: %w", r, w, it, err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	for _, s := range c.stores {
		p, err := s.Profile("m")
		if err != nil {
			t.Fatal(err)
		}
		if p.Calls < workers*iters {
			t.Errorf("rank %d: profile counts %d calls, want >= %d", s.Rank(), p.Calls, workers*iters)
		}
	}
	readAllRanks(t, c, "m", total, rb)
}
