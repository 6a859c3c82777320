package naming

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ddstore-go/ddstore/internal/base"
)

func TestParseSpec(t *testing.T) {
	dir := t.TempDir()
	h5 := filepath.Join(dir, "odd:name")
	if err := os.WriteFile(h5, append([]byte(HDF5Magic), make([]byte, 100)...), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		spec string
		raw  bool
		want Spec
		err  string
	}{
		{"a.npy", false, Spec{Kind: KindNPY, File: "a.npy"}, ""},
		{"A.NPY", false, Spec{Kind: KindNPY, File: "A.NPY"}, ""},
		{"a.h5:/data", false, Spec{Kind: KindHDF5, File: "a.h5", Dataset: "/data"}, ""},
		{"dir:x/a.hdf5:g/data", false, Spec{Kind: KindHDF5, File: "dir:x/a.hdf5", Dataset: "g/data"}, ""},
		{"a.h5:/a:b", false, Spec{Kind: KindHDF5, File: "a.h5", Dataset: "/a:b"}, ""},
		{"a.h5", false, Spec{Kind: KindHDF5, File: "a.h5"}, ""},
		{h5 + ":/x", false, Spec{Kind: KindHDF5, File: h5, Dataset: "/x"}, ""},
		{h5, false, Spec{Kind: KindHDF5, File: h5}, ""},
		{"rows.bin", true, Spec{Kind: KindRaw, File: "rows.bin"}, ""},
		{"a.h5:", false, Spec{}, "empty dataset name"},
		{"", false, Spec{}, "empty file name"},
		{filepath.Join(dir, "nothing"), false, Spec{}, "no such file"},
	} {
		got, err := ParseSpec(tc.spec, tc.raw)
		if tc.err != "" {
			if !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseSpec(%q): %v, want an error saying %q", tc.spec, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseSpec(%q) = %+v, %v; want %+v", tc.spec, got, err, tc.want)
		}
	}
}

func TestParsePair(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want Pair
		err  string
	}{
		{"/d/g.h5:/v" + PairSep + "/d/g.h5:/o", Pair{Spec{KindHDF5, "/d/g.h5", "/v"}, Spec{KindHDF5, "/d/g.h5", "/o"}}, ""},
		{"/d/v.npy" + PairSep + "/d/o.NPY", Pair{Spec{KindNPY, "/d/v.npy", ""}, Spec{KindNPY, "/d/o.NPY", ""}}, ""},
		{"/d/v.npy", Pair{}, "want a values and an offsets dataset"},
		{"/d/v.npy" + PairSep + "/d/o.npy" + PairSep + "/d/x.npy", Pair{}, "want a values and an offsets dataset"},
		{"/d/g.h5" + PairSep + "/d/o.npy", Pair{}, "an HDF5 file without a dataset"},
		{"/d/raw.bin" + PairSep + "/d/o.npy", Pair{}, "want a .npy file or an HDF5 dataset"},
		{"/d/v.npy" + PairSep + "/d/v.npy", Pair{}, "values and offsets are both"},
		{PairSep + "/d/o.npy", Pair{}, "empty values file name"},
	} {
		got, err := ParsePair(tc.spec)
		if tc.err != "" {
			if !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParsePair(%q): %v, want an error saying %q", tc.spec, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParsePair(%q) = %+v, %v; want %+v", tc.spec, got, err, tc.want)
		}
		if !IsPair(tc.spec) || got.Values.String()+PairSep+got.Offsets.String() != tc.spec {
			t.Errorf("ParsePair(%q): the specs do not join back: %q", tc.spec, got.Values.String()+PairSep+got.Offsets.String())
		}
	}
}
