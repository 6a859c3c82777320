//go:build hdf5 && cgo

package ddstore_test

// Ragged variables backed by two datasets of one HDF5 file, written by
// h5py: the agents of these tests run in the test binary, built with
// -tags hdf5.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ddstore-go/ddstore"
)

const debianPython = "/usr/bin/python3"

// writeH5Pair writes f into an HDF5 file with h5py: its values as
// float32 of shape (units, 3) in /grp/values, stored with the given
// create_dataset keywords (a Python dict literal), its offsets as int64
// in /grp/offsets and as int32 in /grp/offsets32, and a float offsets
// dataset /grp/badoffsets.
func (f *raggedFile) writeH5Pair(t testing.TB, file, kwargs string) {
	t.Helper()
	if out, err := exec.Command(debianPython, "-c", "import h5py, numpy").CombinedOutput(); err != nil {
		t.Skipf("%s cannot import h5py and numpy (Debian: python3-h5py): %v: %s", debianPython, err, bytes.TrimSpace(out))
	}
	dir := t.TempDir()
	v, _ := f.span(0, f.rows())
	if err := os.WriteFile(filepath.Join(dir, "values.bin"), v, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "offsets.bin"), offsetsBytes(f.off), 0o644); err != nil {
		t.Fatal(err)
	}
	code := `
import sys, numpy as np, h5py
d, path = sys.argv[1], sys.argv[2]
values = np.fromfile(d + '/values.bin', dtype='<f4').reshape(-1, 3)
offsets = np.fromfile(d + '/offsets.bin', dtype='<i8')
with h5py.File(path, 'w') as f:
    g = f.create_group('grp')
    g.create_dataset('values', data=values, **` + kwargs + `)
    g.create_dataset('offsets', data=offsets)
    g.create_dataset('offsets32', data=offsets.astype('<i4'), chunks=(64,))
    g.create_dataset('badoffsets', data=offsets.astype('<f8'))
`
	if out, err := exec.Command(debianPython, "-c", code, dir, file).CombinedOutput(); err != nil {
		t.Fatalf("h5py: %v\n%s", err, out)
	}
}

// TestClusterRaggedBackedHDF5: a ragged variable backed by datasets of an
// HDF5 file (contiguous, chunked, gzip-compressed; offsets of int64 and of
// int32) reads the same as the file from every rank of two nodes; a
// dataset that is not there, or offsets that are not integers, fail the
// add on every rank, naming them.
func TestClusterRaggedBackedHDF5(t *testing.T) {
	f := newRaggedFile(4, 300, 12, 30)
	for _, tc := range []struct{ name, kwargs, offsets string }{
		{"contiguous", "{}", "offsets"},
		{"chunked", "{'chunks': (50, 3)}", "offsets32"},
		{"gzip", "{'chunks': (40, 3), 'compression': 'gzip', 'shuffle': True}", "offsets"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "data.h5")
			f.writeH5Pair(t, file, tc.kwargs)
			c := startCluster(t, []int{2, 1}, viaRendezvous)
			f.addBacked(t, c, "pos", file+":/grp/values", file+":/grp/"+tc.offsets, 60)
			if tc.name == "contiguous" {
				f.checkCoalesced(t, c, "pos", 200, 210, 20)
			}
			f.readAll(t, c, "pos")
			if tc.name != "gzip" {
				return
			}
			for _, bad := range []struct{ values, offsets, words string }{
				{"/grp/values", "/grp/nothing", "/grp/nothing"},
				{"/grp/nothing", "/grp/offsets", "/grp/nothing"},
				{"/grp/values", "/grp/badoffsets", "hold items of float64: want integers"},
			} {
				errs := c.each(func(r int, s *ddstore.Store) error {
					return f.add(c, r, s, "bad", file+":"+bad.values, file+":"+bad.offsets, 60)
				})
				for r, err := range errs {
					if !errors.Is(err, ddstore.ErrArgument) && !(r > 0 && errors.Is(err, ddstore.ErrGeometry)) {
						t.Errorf("values %s, offsets %s: rank %d: %v, want ErrArgument", bad.values, bad.offsets, r, err)
					} else if r == 0 && !strings.Contains(err.Error(), bad.words) {
						t.Errorf("values %s, offsets %s: rank %d: %q does not say %q", bad.values, bad.offsets, r, err, bad.words)
					}
				}
			}
			// The store keeps working.
			c.mustEach(t, func(r int, s *ddstore.Store) error { return s.Free("pos") })
			f.addBacked(t, c, "pos", file+":/grp/values", file+":/grp/offsets", 30)
			c.mustEach(t, func(r int, s *ddstore.Store) error {
				row := make([]byte, (f.off[f.rows()]-f.off[f.rows()-1])*12)
				_, err := s.GetRaggedRow("pos", row, f.rows()-1)
				if err == nil {
					err = samePattern(row, f.rows()-1)
				}
				if err != nil {
					return fmt.Errorf("after the errors: %w", err)
				}
				return nil
			})
		})
	}
}
