package cli

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/source"
	"github.com/ddstore-go/ddstore/internal/transport"
)

func runVersion(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("version", "Print ddstore's version, the commit it was built from and the Go version.", stderr)
	if err := parse(fs, args); err != nil {
		return err
	}
	commit, dirty := "unknown", ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision":
				commit = s.Value
			case s.Key == "vcs.modified" && s.Value == "true":
				dirty = "+dirty"
			}
		}
	}
	hdf5 := "without HDF5"
	if source.HDF5 {
		hdf5 = "with HDF5"
	}
	libs := []string{hdf5}
	if l := transport.MPILibrary(); l != "" {
		libs = append(libs, "MPI: "+l)
	}
	if l := transport.FabricLibrary(); l != "" {
		libs = append(libs, l)
	}
	fmt.Fprintf(stdout, "ddstore %s (commit %s%s, %s, %s/%s, %s)\n", ddstore.Version, commit, dirty, runtime.Version(), runtime.GOOS, runtime.GOARCH, strings.Join(libs, ", "))
	return nil
}
