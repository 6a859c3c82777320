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

	"github.com/ddstore-go/ddstore/internal/base"
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

// Exit statuses of the ddstore command (docs/protocol.md, "Exit statuses"):
// a program that runs it (the Python sampler, the clients' spawn, a job
// script) tells what failed from the status, as a client tells it from a
// reply's status code, never from the text on stderr.
const (
	// ExitUsage: a command, flag or argument the command does not take
	// (the usage was printed). A program that passes a flag an older
	// binary lacks sees this status.
	ExitUsage = 2
	// ExitKind is added to the wire status code (internal/base) of the
	// error a command failed with: ExitKind+12 is a bad argument, ExitKind+11
	// no agent, ExitKind+13 an internal error or one of no ddstore kind.
	ExitKind = 64
)

// ExitCode is the exit status for the error a command returned: 0 for nil
// or --help, ExitUsage, naming.ExitAgentRuns for an agent that lost the
// race to another (kept apart from ErrExists, whose alias it is, because
// the rank that started the agent is content with it), else ExitKind plus
// the error's wire status code.
func ExitCode(err error) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return ExitUsage
	case errors.Is(err, naming.ErrAgentRuns):
		return naming.ExitAgentRuns
	}
	return ExitKind + int(base.Code(err))
}

// Main runs the command line and returns the process exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return ExitUsage
		}
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "ddstore: unknown command %q\n\n", args[0])
		usage(stderr)
		return ExitUsage
	}
	err := c.run(args[1:], stdout, stderr)
	code := ExitCode(err)
	if code != 0 && code != ExitUsage {
		fmt.Fprintln(stderr, err)
	}
	return code
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
