// Package cli is the ddstore command: it parses flags and calls into the
// library, one file per subcommand.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/ddstore-go/ddstore/internal/naming"
)

type command struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) error
}

var commands = map[string]command{
	"agent":    {"run the node agent of a namespace", runAgent},
	"ingest":   {"load a .npy, HDF5 or raw file into a variable, each node its share", runIngest},
	"info":     {"show an agent's variables, rows, owners and memory", runInfo},
	"gc":       {"remove the segments and sockets that dead agents left behind", runGC},
	"bench":    {"measure reads against the machine's limits", runBench},
	"schedule": {"plan which samples each rank reads from memory and storage", runSchedule},
	"version":  {"print the version", runVersion},
}

// errUsage is returned after the usage text has been printed.
var errUsage = errors.New("usage")

// Main runs the command line and returns the process exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "ddstore: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	if err := c.run(args[1:], stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		if errors.Is(err, errUsage) {
			return 2
		}
		fmt.Fprintln(stderr, err)
		if errors.Is(err, naming.ErrAgentRuns) {
			// The rank that started this agent learns from the status,
			// not the text, that another agent serves its namespace.
			return naming.ExitAgentRuns
		}
		return 1
	}
	return 0
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "ddstore keeps a training dataset sharded in the memory of a job's nodes.")
	fmt.Fprintln(w, "\nUsage: ddstore COMMAND [flags]   (ddstore COMMAND --help for its flags)\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
}

// newFlags makes a flag set whose --help prints the command's synopsis.
func newFlags(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: ddstore %s [flags]\n\n%s\n\nFlags:\n", name, strings.TrimSpace(synopsis))
		fs.PrintDefaults()
	}
	return fs
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "ddstore %s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		fs.Usage()
		return errUsage
	}
	return nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
