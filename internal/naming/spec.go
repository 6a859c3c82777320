package naming

// How a backing or ingest file names its dataset: FILE.npy, FILE:DATASET
// for HDF5, or raw rows.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/ddstore-go/ddstore/internal/base"
)

// Kind is a dataset file's format.
type Kind int

const (
	KindNPY Kind = iota + 1
	KindRaw
	KindHDF5
)

func (k Kind) String() string {
	switch k {
	case KindNPY:
		return "npy"
	case KindRaw:
		return "raw"
	case KindHDF5:
		return "hdf5"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Spec is a parsed dataset specification.
type Spec struct {
	Kind    Kind
	File    string
	Dataset string // HDF5: the dataset's path inside the file
}

// HDF5Magic opens every HDF5 file that has no user block.
var HDF5Magic = []byte("\x89HDF\r\n\x1a\n")

var hdf5Exts = []string{".h5", ".hdf5", ".hdf", ".he5"}

// ParseSpec says what spec names: FILE:DATASET for HDF5 (a file ending in
// .h5, .hdf5, .hdf or .he5, or one that starts with HDF5's signature),
// FILE.npy, or, when raw is set (the caller knows the row size), any other
// FILE as raw rows. File names may hold colons: the split is at the first
// colon whose left side is an HDF5 file name. It opens no dataset: at most
// it reads a file's first bytes.
func ParseSpec(spec string, raw bool) (Spec, error) {
	if spec == "" {
		return Spec{}, base.Errorf(base.ErrArgument, "source: empty file name")
	}
	for i := 0; i < len(spec); i++ {
		if spec[i] != ':' {
			continue
		}
		if file := spec[:i]; file != "" && isHDF5(file) {
			ds := spec[i+1:]
			if ds == "" {
				return Spec{}, base.Errorf(base.ErrArgument, "source %s: empty dataset name after the colon: want FILE:DATASET, e.g. %s:/data", spec, file)
			}
			return Spec{Kind: KindHDF5, File: file, Dataset: ds}, nil
		}
	}
	if isHDF5(spec) {
		return Spec{Kind: KindHDF5, File: spec}, nil
	}
	if strings.EqualFold(filepath.Ext(spec), ".npy") {
		return Spec{Kind: KindNPY, File: spec}, nil
	}
	if raw {
		return Spec{Kind: KindRaw, File: spec}, nil
	}
	if _, err := os.Stat(spec); err != nil {
		return Spec{}, FileError(spec, err)
	}
	return Spec{}, base.Errorf(base.ErrArgument,
		"source %s: unknown format: want a .npy file, an HDF5 dataset as FILE:DATASET (FILE ending in .h5 or .hdf5), or a raw file of fixed-size rows with a row size (--row-bytes)", spec)
}

// isHDF5 says whether name is an HDF5 file by its extension or, for a file
// that exists, by its first bytes.
func isHDF5(name string) bool {
	ext := strings.ToLower(filepath.Ext(name))
	for _, e := range hdf5Exts {
		if ext == e {
			return true
		}
	}
	f, err := os.Open(name)
	if err != nil {
		return false
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return false
	}
	head := make([]byte, len(HDF5Magic))
	if _, err := io.ReadFull(f, head); err != nil {
		return false
	}
	return bytes.Equal(head, HDF5Magic)
}

// FileError is a dataset file that cannot be used: ErrArgument, with the
// system's reason (which still matches fs.ErrNotExist and the like).
func FileError(name string, err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return fmt.Errorf("%w: source %s: %w", base.ErrArgument, name, err)
}

// CheckBacking checks the backing file of a variable as a client sends it
// to its agent: a spec ParseSpec accepts, of at least one row and at least
// the nrows of the caller's shard, with FILE made absolute (the agent runs
// in another working directory). It returns the spec to send.
func CheckBacking(variable, file string, rows, nrows int64) (string, error) {
	if file == "" {
		return "", base.Errorf(base.ErrArgument, "variable %q: backing file name is empty", variable)
	}
	if rows < 1 || rows < nrows {
		return "", base.Errorf(base.ErrGeometry, "variable %q: backing file %s of %d rows: want at least 1 and at least this rank's %d", variable, file, rows, nrows)
	}
	sp, err := ParseSpec(file, true)
	if err != nil {
		return "", fmt.Errorf("variable %q: %w", variable, err)
	}
	if filepath.IsAbs(sp.File) {
		return file, nil
	}
	abs, err := filepath.Abs(sp.File)
	if err != nil {
		return "", fmt.Errorf("variable %q: backing file %s: %w", variable, file, err)
	}
	if sp.Dataset != "" {
		abs += ":" + sp.Dataset
	}
	return abs, nil
}

// PairSep joins the two specs of a ragged variable's backing file on the
// wire: the values dataset, then the offsets dataset. A NUL byte occurs
// in no file name and no HDF5 dataset name, so the pair splits back
// without escaping.
const PairSep = "\x00"

// Pair is the backing file of a ragged variable: the flat values (rows
// of units one after another, shape (V, *trailing)) and the offsets (N+1
// integers from 0, never decreasing, ending at V), each a .npy file or an
// HDF5 dataset as FILE:DATASET — two datasets of one HDF5 file, or two
// .npy files, as h5py and numpy write them.
type Pair struct{ Values, Offsets Spec }

// IsPair says whether a backing spec as sent names a ragged pair.
func IsPair(spec string) bool { return strings.Contains(spec, PairSep) }

// ParsePair parses a pair as sent (VALUES PairSep OFFSETS): both specs as
// ParseSpec reads them, neither raw, and not the same dataset.
func ParsePair(spec string) (Pair, error) {
	vs, ofs, ok := strings.Cut(spec, PairSep)
	if !ok || strings.Contains(ofs, PairSep) {
		return Pair{}, base.Errorf(base.ErrArgument, "ragged backing %q: want a values and an offsets dataset", spec)
	}
	var p Pair
	var err error
	if p.Values, err = pairSpec("values", vs); err != nil {
		return Pair{}, err
	}
	if p.Offsets, err = pairSpec("offsets", ofs); err != nil {
		return Pair{}, err
	}
	if p.Values == p.Offsets {
		return Pair{}, base.Errorf(base.ErrArgument, "ragged backing: values and offsets are both %s: want two datasets", vs)
	}
	return p, nil
}

// pairSpec parses one side of a pair: a .npy file or an HDF5 dataset.
func pairSpec(what, spec string) (Spec, error) {
	if spec == "" {
		return Spec{}, base.Errorf(base.ErrArgument, "ragged backing: empty %s file name: want a .npy file or an HDF5 dataset as FILE:DATASET", what)
	}
	sp, err := ParseSpec(spec, true)
	if err != nil {
		return Spec{}, fmt.Errorf("ragged backing %s: %w", what, err)
	}
	switch {
	case sp.Kind == KindRaw:
		return Spec{}, base.Errorf(base.ErrArgument, "ragged backing %s %s: want a .npy file or an HDF5 dataset as FILE:DATASET (FILE ending in .h5 or .hdf5), which say their shape and type", what, spec)
	case sp.Kind == KindHDF5 && sp.Dataset == "":
		return Spec{}, base.Errorf(base.ErrArgument, "ragged backing %s %s: an HDF5 file without a dataset: want FILE:DATASET, e.g. %s:/%s", what, spec, spec, what)
	}
	return sp, nil
}

// CheckRaggedBacking is CheckBacking of a ragged variable: values and
// offsets as ParsePair reads them, each FILE made absolute, rows the rows
// in all (the offsets' count less one, or fewer). It returns the pair to
// send, joined by PairSep.
func CheckRaggedBacking(variable, values, offsets string, rows, nrows int64) (string, error) {
	if values == "" || offsets == "" {
		return "", base.Errorf(base.ErrArgument, "variable %q: ragged backing (values %q, offsets %q): want both files named", variable, values, offsets)
	}
	if rows < 1 || rows < nrows {
		return "", base.Errorf(base.ErrGeometry, "variable %q: ragged backing file %s of %d rows: want at least 1 and at least this rank's %d", variable, values, rows, nrows)
	}
	var out [2]string
	for i, s := range [2]string{values, offsets} {
		if strings.Contains(s, PairSep) {
			return "", base.Errorf(base.ErrArgument, "variable %q: backing file name %q holds a NUL byte", variable, s)
		}
		abs, err := CheckBacking(variable, s, rows, nrows)
		if err != nil {
			return "", err
		}
		out[i] = abs
	}
	sent := out[0] + PairSep + out[1]
	if _, err := ParsePair(sent); err != nil {
		return "", fmt.Errorf("variable %q: %w", variable, err)
	}
	return sent, nil
}

// String is the spec as ParseSpec reads it back: FILE, or FILE:DATASET.
func (s Spec) String() string {
	if s.Dataset != "" {
		return s.File + ":" + s.Dataset
	}
	return s.File
}
