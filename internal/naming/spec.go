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
