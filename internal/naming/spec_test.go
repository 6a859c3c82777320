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
