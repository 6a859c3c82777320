package ddstore_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/agent"
)

// writeNPY writes n patterned rows of rb bytes as a .npy array of uint8 of
// shape (n, rb).
func writeNPY(t testing.TB, path string, n, rb int64) {
	t.Helper()
	dict := fmt.Sprintf("{'descr': '|u1', 'fortran_order': False, 'shape': (%d, %d), }", n, rb)
	pad := 64 - (10+len(dict)+1)%64
	header := dict + strings.Repeat(" ", pad%64) + "\n"
	buf := []byte("\x93NUMPY\x01\x00")
	buf = append(buf, byte(len(header)), byte(len(header)>>8))
	buf = append(buf, header...)
	row := make([]byte, rb)
	for g := range n {
		pattern(row, g)
		buf = append(buf, row...)
	}
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeRaw writes n patterned rows of rb bytes, nothing else.
func writeRaw(t testing.TB, path string, n, rb int64) {
	t.Helper()
	buf := make([]byte, n*rb)
	for g := range n {
		pattern(buf[g*rb:(g+1)*rb], g)
	}
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Fatal(err)
	}
}

// addBacked adds a variable of n rows of rb bytes backed by file, whose
// first held rows are spread over the ranks in contiguous blocks.
func (c *cluster) addBacked(t testing.TB, name, file string, n, held, rb int64) {
	t.Helper()
	p := int64(len(c.stores))
	c.mustEach(t, func(r int, s *ddstore.Store) error {
		lo, hi := int64(r)*held/p, int64(r+1)*held/p
		buf := make([]byte, (hi-lo)*rb)
		for g := lo; g < hi; g++ {
			pattern(buf[(g-lo)*rb:(g-lo+1)*rb], g)
		}
		return s.AddBacked(name, buf, rb, ddstore.Uint8, ddstore.Backing{File: file, Rows: n})
	})
}

// TestClusterTierReadsEverySample reads a dataset 4x larger than the memory the
// job gives it, from every rank, in shuffled batches (with and without
// prefetch) and in ranges across the memory/file boundary, and checks
// every row against the file.
func TestClusterTierReadsEverySample(t *testing.T) {
	const n, rb = 480, 1 << 10
	const held = n / 4
	for _, format := range []string{"npy", "raw"} {
		t.Run(format, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "data."+format)
			if format == "npy" {
				writeNPY(t, file, n, rb)
			} else {
				writeRaw(t, file, n, rb)
			}
			c := startCluster(t, []int{2, 2}, viaRendezvous)
			c.addBacked(t, "x", file, n, held, rb)
			c.mustEach(t, func(r int, s *ddstore.Store) error {
				in, err := s.Info("x")
				if err != nil {
					return err
				}
				if in.TotalRows != n || in.HeldRows != held || in.Backing != file {
					return fmt.Errorf("info: %d rows, %d held, backing %q", in.TotalRows, in.HeldRows, in.Backing)
				}
				rng := rand.New(rand.NewPCG(uint64(r), 7))
				perm := rng.Perm(n)
				const batch = 16
				dst := make([]byte, batch*rb)
				idx := make([]int64, batch)
				for step := 0; step*batch < n; step++ {
					for i := range batch {
						idx[i] = int64(perm[step*batch+i])
					}
					if r%2 == 0 && (step+1)*batch < n {
						next := make([]int64, batch)
						for i := range batch {
							next[i] = int64(perm[(step+1)*batch+i])
						}
						if err := s.Prefetch("x", next); err != nil {
							return err
						}
					}
					if err := s.GetBatch("x", dst, idx); err != nil {
						return err
					}
					for i, g := range idx {
						if err := samePattern(dst[i*rb:(i+1)*rb], g); err != nil {
							return err
						}
					}
				}
				// A range across the boundary, and one entirely in the file.
				for _, span := range [][2]int64{{held - 3, 7}, {n - 40, 40}, {0, n}} {
					buf := make([]byte, span[1]*rb)
					if err := s.Get("x", buf, span[0]); err != nil {
						return err
					}
					for i := range span[1] {
						if err := samePattern(buf[i*rb:(i+1)*rb], span[0]+i); err != nil {
							return err
						}
					}
				}
				p, err := s.Profile("x")
				if err != nil {
					return err
				}
				if p.StorageRows < n-held {
					return fmt.Errorf("profile counts %d rows from storage, want at least %d", p.StorageRows, n-held)
				}
				return nil
			})
			var staged, storageRows, storageReads int
			for i, a := range c.agents {
				in, err := ddstore.QueryAgent(a.Socket(), c.ns, fmt.Sprintf("node%d", i))
				if err != nil {
					t.Fatal(err)
				}
				staged += in.Counters["staged_rows"]
				storageRows += in.Counters["storage_rows"]
				storageReads += in.Counters["storage_reads"]
				if in.Counters["storage_errors"] != 0 {
					t.Errorf("node%d: %d storage errors", i, in.Counters["storage_errors"])
				}
			}
			// Ranks 0 and 2 prefetched every step but their first.
			if staged == 0 {
				t.Errorf("no row was served from staging")
			}
			// The whole-range reads alone are coalesced into far fewer reads than rows.
			if storageReads >= storageRows {
				t.Errorf("%d reads for %d rows: nothing coalesced", storageReads, storageRows)
			}
			t.Logf("%d rows from the file in %d reads, %d rows from staging", storageRows, storageReads, staged)
		})
	}
}

func samePattern(row []byte, g int64) error {
	want := make([]byte, len(row))
	pattern(want, g)
	if string(want) != string(row) {
		return fmt.Errorf("row %d: got %x..., want %x...", g, row[:min(16, len(row))], want[:min(16, len(want))])
	}
	return nil
}

// TestClusterTierErrors: bad backings fail the Add on every rank with an error that
// names the problem, and leave the name free for a corrected retry.
func TestClusterTierErrors(t *testing.T) {
	const n, rb = 64, 256
	dir := t.TempDir()
	file := filepath.Join(dir, "d.npy")
	writeNPY(t, file, n, rb)
	c := startCluster(t, []int{1, 1}, viaRendezvous)
	add := func(file string, rows, disp int64, dtype ddstore.Dtype) []error {
		return c.each(func(r int, s *ddstore.Store) error {
			return s.AddBacked("v", make([]byte, 4*disp), disp, dtype, ddstore.Backing{File: file, Rows: rows})
		})
	}
	for _, tc := range []struct {
		name  string
		errs  []error
		want  error
		words string
	}{
		{"missing file", add(filepath.Join(dir, "nope.npy"), n, rb, ddstore.Uint8), ddstore.ErrArgument, "nope.npy"},
		{"more rows than the file", add(file, n+1, rb, ddstore.Uint8), ddstore.ErrGeometry, "has 64 rows"},
		{"wrong row size", add(file, n, rb/2, ddstore.Uint8), ddstore.ErrArgument, "rows of 256 bytes"},
		{"wrong type", add(file, n, rb/4, ddstore.Float32), ddstore.ErrArgument, "holds items of uint8, not float32"},
		{"no rows", add(file, 0, rb, ddstore.Uint8), ddstore.ErrGeometry, "0 rows"},
		{"ranks disagree", c.each(func(r int, s *ddstore.Store) error {
			return s.AddBacked("v", make([]byte, 4*rb), rb, ddstore.Uint8, ddstore.Backing{File: file, Rows: n - int64(r)})
		}), ddstore.ErrGeometry, ""},
	} {
		for r, err := range tc.errs {
			if err == nil {
				t.Errorf("%s: rank %d: no error", tc.name, r)
				continue
			}
			if !errors.Is(err, ddstore.ErrGeometry) && !errors.Is(err, tc.want) {
				t.Errorf("%s: rank %d: %v, want %v", tc.name, r, err, tc.want)
			}
			if r == 0 && tc.words != "" && !strings.Contains(err.Error(), tc.words) {
				t.Errorf("%s: rank %d: %q does not say %q", tc.name, r, err, tc.words)
			}
		}
	}
	// After all that, the name is free and a correct Add works.
	c.addBacked(t, "v", file, n, 8, rb)
	c.mustEach(t, func(r int, s *ddstore.Store) error {
		row := make([]byte, rb)
		if err := s.Get("v", row, n-1); err != nil {
			return err
		}
		if err := samePattern(row, n-1); err != nil {
			return err
		}
		if err := s.Prefetch("v", []int64{n}); !errors.Is(err, ddstore.ErrIndex) {
			return fmt.Errorf("prefetch of row %d: %v, want ErrIndex", n, err)
		}
		return nil
	})
	c.addPattern(t, "plain", []int64{2, 2}, 4, 1)
	if err := c.stores[0].Prefetch("plain", []int64{0}); !errors.Is(err, ddstore.ErrArgument) || !strings.Contains(err.Error(), "no backing file") {
		t.Errorf("prefetch of a variable without a backing file: %v", err)
	}
	c.mustEach(t, func(r int, s *ddstore.Store) error { return s.Free("v") })
	if err := c.stores[0].Get("v", make([]byte, rb), n-1); !errors.Is(err, ddstore.ErrFreed) && !errors.Is(err, ddstore.ErrUnknown) {
		t.Errorf("read after free: %v", err)
	}
}

// TestClusterTierStagingUnderPressure: ranks prefetch far more than a tiny staging
// area holds, several steps ahead, while they read — rows are evicted,
// dropped, waited for and read on demand, concurrently; every row must
// still be right.
func TestClusterTierStagingUnderPressure(t *testing.T) {
	const n, rb = 600, 512
	file := filepath.Join(t.TempDir(), "d.raw")
	writeRaw(t, file, n, rb)
	c := startCluster(t, []int{2, 1}, viaRendezvous, func(cfg *agent.Config) { cfg.StagingBytes = 12 * rb })
	c.addBacked(t, "x", file, n, 30, rb)
	c.mustEach(t, func(r int, s *ddstore.Store) error {
		rng := rand.New(rand.NewPCG(uint64(r), 9))
		for range 3 {
			perm := rng.Perm(n)
			const batch, ahead = 8, 3
			dst := make([]byte, batch*rb)
			idx := make([]int64, batch)
			for step := 0; (step+1)*batch <= n; step++ {
				if lo := (step + ahead) * batch; lo+batch <= n {
					next := make([]int64, batch)
					for i := range batch {
						next[i] = int64(perm[lo+i])
					}
					if err := s.Prefetch("x", next); err != nil {
						return err
					}
				}
				for i := range batch {
					idx[i] = int64(perm[step*batch+i])
				}
				if err := s.GetBatch("x", dst, idx); err != nil {
					return err
				}
				for i, g := range idx {
					if err := samePattern(dst[i*rb:(i+1)*rb], g); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
	for i, a := range c.agents {
		in, err := ddstore.QueryAgent(a.Socket(), c.ns, fmt.Sprintf("node%d", i))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("node%d: %v", i, in.Counters)
	}
}

// TestClusterPeerLossFallsBackToTheFile: once the agent of a node is gone, rows it
// held are read from the backing file — no error at all — while reads of a
// variable without one fail, naming the node, instead of hanging.
func TestClusterPeerLossFallsBackToTheFile(t *testing.T) {
	const n, rb = 200, 256
	file := filepath.Join(t.TempDir(), "d.npy")
	writeNPY(t, file, n, rb)
	c := startCluster(t, []int{1, 1}, viaRendezvous)
	c.addBacked(t, "x", file, n, n, rb) // every row in memory, rank 1 holding [100, 200)
	c.addPattern(t, "plain", []int64{100, 100}, rb, 1)
	s := c.stores[0]
	idx := []int64{5, 150, 199, 0, 120}
	dst := make([]byte, len(idx)*rb)
	for _, name := range []string{"x", "plain"} {
		if err := s.GetBatch(name, dst, idx); err != nil {
			t.Fatal(err)
		}
	}
	c.agents[1].Close()
	if err := s.GetBatch("x", dst, idx); err != nil {
		t.Fatalf("backed rows of a lost node: %v", err)
	}
	for i, g := range idx {
		if err := samePattern(dst[i*rb:(i+1)*rb], g); err != nil {
			t.Fatal(err)
		}
	}
	err := s.GetBatch("plain", dst, idx)
	if !errors.Is(err, ddstore.ErrPeer) || !strings.Contains(err.Error(), `node "node1"`) {
		t.Fatalf("rows of a lost node without a backing file: %v, want ErrPeer naming node1", err)
	}
	// Rows of the living node still read.
	if err := s.GetBatch("plain", dst[:2*rb], []int64{3, 99}); err != nil {
		t.Fatal(err)
	}
	in, err := ddstore.QueryAgent(c.agents[0].Socket(), c.ns, "node0")
	if err != nil {
		t.Fatal(err)
	}
	if in.Counters["peer_fallback_rows"] != 3 {
		t.Errorf("peer_fallback_rows = %d, want 3", in.Counters["peer_fallback_rows"])
	}
}
