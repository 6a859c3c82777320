package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/agent"
	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/naming"
)

// The exit statuses the tests expect, written out as docs/protocol.md's
// table has them (64 + the wire status code), so that a change of the
// table fails here.
const (
	exitGeometry = 66
	exitExists   = 68
	exitNoAgent  = 75
	exitArgument = 76
	exitInternal = 77
)

// run calls Main and returns its exit code, stdout and stderr.
func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	type result struct{ code int }
	done := make(chan result, 1)
	go func() { done <- result{Main(args, &stdout, &stderr)} }()
	select {
	case r := <-done:
		return r.code, stdout.String(), stderr.String()
	case <-time.After(20 * time.Second):
		t.Fatalf("ddstore %s did not return", strings.Join(args, " "))
		return 0, "", ""
	}
}

func TestMainUsage(t *testing.T) {
	code, out, errOut := run(t)
	if code != 2 || out != "" || !strings.Contains(errOut, "Usage: ddstore COMMAND") {
		t.Fatalf("no args: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	for _, name := range []string{"agent", "info", "bench", "schedule", "version", "ingest", "gc"} {
		if !strings.Contains(errOut, "  "+name+" ") {
			t.Errorf("usage does not list %s:\n%s", name, errOut)
		}
	}
	for _, arg := range []string{"help", "--help", "-h"} {
		code, out, errOut := run(t, arg)
		if code != 0 || out != "" || !strings.Contains(errOut, "Usage: ddstore COMMAND") {
			t.Errorf("%s: exit %d, stdout %q, stderr %q", arg, code, out, errOut)
		}
	}
	code, _, errOut = run(t, "frobnicate", "--x")
	if code != 2 || !strings.Contains(errOut, `unknown command "frobnicate"`) || !strings.Contains(errOut, "Usage: ddstore COMMAND") {
		t.Errorf("unknown command: exit %d, stderr %q", code, errOut)
	}
}

func TestSubcommandFlags(t *testing.T) {
	for _, cmd := range []string{"agent", "info", "bench", "schedule", "version", "ingest", "gc"} {
		t.Run(cmd, func(t *testing.T) {
			for _, h := range []string{"--help", "-h"} {
				code, out, errOut := run(t, cmd, h)
				if code != 0 || out != "" || !strings.HasPrefix(errOut, "Usage: ddstore "+cmd+" [flags]") {
					t.Errorf("%s %s: exit %d, stdout %q, stderr %q", cmd, h, code, out, errOut)
				}
				if cmd != "version" && !strings.Contains(errOut, "Flags:\n  -") {
					t.Errorf("%s %s does not list flags:\n%s", cmd, h, errOut)
				}
			}
			code, out, errOut := run(t, cmd, "--no-such-flag")
			if code != 2 || out != "" || !strings.Contains(errOut, "no-such-flag") || !strings.Contains(errOut, "Usage: ddstore "+cmd) {
				t.Errorf("%s --no-such-flag: exit %d, stdout %q, stderr %q", cmd, code, out, errOut)
			}
			extra := []string{cmd, "extra"}
			if cmd == "ingest" { // its one argument is the file: "extra" is a second
				extra = []string{cmd, "data.npy", "--name", "x", "extra"}
			}
			code, out, errOut = run(t, extra...)
			if code != 2 || out != "" || !strings.Contains(errOut, `unexpected argument "extra"`) {
				t.Errorf("%s extra: exit %d, stdout %q, stderr %q", cmd, code, out, errOut)
			}
		})
	}
	// A flag value of the wrong type is a usage error too.
	if code, _, errOut := run(t, "agent", "--timeout", "soon"); code != 2 || !strings.Contains(errOut, "soon") {
		t.Errorf("agent --timeout soon: exit %d, stderr %q", code, errOut)
	}
	// Negative connection bounds are refused, naming the value.
	for _, args := range [][]string{{"--peer-idle", "-1s"}, {"--max-peers", "-3"}} {
		code, _, errOut := run(t, append([]string{"agent", "--namespace", "ns", "--node", "n1"}, args...)...)
		if code != 76 || !strings.Contains(errOut, args[0]+" "+args[1]) {
			t.Errorf("agent %s: exit %d, stderr %q; want 76 naming the value", strings.Join(args, " "), code, errOut)
		}
	}
}

// TestExitCode holds ExitCode to docs/protocol.md's table: the kinds of
// errors, wrapped or crossed from an agent, and the statuses kept apart.
func TestExitCode(t *testing.T) {
	wrapped := func(e error) error { return fmt.Errorf("ingest: %w", base.Errorf(e, "detail")) }
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{flag.ErrHelp, 0},
		{errUsage, 2},
		{fmt.Errorf("schedule: %w", errUsage), 2},
		{naming.ErrAgentRuns, 3},
		{agentRuns{errors.New("ddstore agent exited (exit status 3)")}, 3},
		{wrapped(base.ErrIndex), 65},
		{wrapped(base.ErrGeometry), 66},
		{wrapped(base.ErrUnknown), 67},
		{wrapped(base.ErrExists), 68},
		{wrapped(base.ErrBuffer), 69},
		{wrapped(base.ErrFreed), 70},
		{wrapped(base.ErrClosed), 71},
		{wrapped(base.ErrTimeout), 72},
		{wrapped(base.ErrPeer), 73},
		{wrapped(base.ErrProtocol), 74},
		{wrapped(base.ErrNoAgent), 75},
		{wrapped(base.ErrArgument), 76},
		{wrapped(base.ErrInternal), 77},
		{wrapped(base.ErrAuth), 78},
		{wrapped(base.ErrRegion), 79},
		{base.FromCode(12, "an agent's refusal"), 76},
		{errors.New("open x: no such file or directory"), 77}, // no kind: internal, as on the wire
	} {
		if got := ExitCode(tc.err); got != tc.want {
			t.Errorf("ExitCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
	if n := ExitKind + base.NumCodes - 1; n > 125 {
		t.Errorf("the largest kind's status %d is one a shell gives its own meaning", n)
	}
}

func TestVersion(t *testing.T) {
	code, out, errOut := run(t, "version")
	if code != 0 || errOut != "" || !strings.HasPrefix(out, "ddstore 0.1.0-dev (commit ") || !strings.HasSuffix(out, ")\n") {
		t.Fatalf("version: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if ddstore.Version != "0.1.0-dev" {
		t.Errorf("ddstore.Version = %q", ddstore.Version)
	}
}

func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"64", 64},
		{"4K", 4 << 10},
		{"4KiB", 4 << 10},
		{"4kib", 4 << 10},
		{"4KB", 4 << 10},
		{"64k", 64 << 10},
		{"1M", 1 << 20},
		{"1MiB", 1 << 20},
		{"2G", 2 << 30},
		{"2GB", 2 << 30},
		{" 8K ", 8 << 10},
		{"100B", 100},
		{"1", 1},
	} {
		got, err := parseBytes(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "x", "-1", "0", "0K", "K", "B", "1.5M", "4T", "4 K", "1e3", "0x10", "--1", "-4K"} {
		got, err := parseBytes(in)
		if err == nil {
			t.Errorf("parseBytes(%q) = %d, want an error", in, got)
			continue
		}
		if !strings.Contains(err.Error(), fmt.Sprintf("%q", in)) {
			t.Errorf("parseBytes(%q): error %q does not name the value", in, err)
		}
	}
	t.Run("overflow", func(t *testing.T) {
		// Each is more than an int64 holds once multiplied out.
		for _, in := range []string{"8589934592G", "9223372036854775807K", "17179869184G", "9007199254740993M"} {
			if got, err := parseBytes(in); err == nil {
				t.Fatalf("parseBytes(%q) = %d with no error: n*mul overflows int64 unchecked (bench --shard/--sizes then use a wrapped size)", in, got)
			}
		}
	})
}

func TestHumanBytes(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want string
	}{
		{0, "0 B"},
		{1, "1 B"},
		{1023, "1023 B"},
		{1024, "1.0 KiB"},
		{1536, "1.5 KiB"},
		{10 << 10, "10.0 KiB"},
		{1 << 20, "1.0 MiB"},
		{5 << 20, "5.0 MiB"},
		{3 << 30, "3.0 GiB"},
		{1 << 40, "1.0 TiB"},
		{1 << 50, "1.0 PiB"},
		{1 << 60, "1.0 EiB"},
		{1<<63 - 1, "8.0 EiB"},
	} {
		if got := humanBytes(tc.n); got != tc.want {
			t.Errorf("humanBytes(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

func TestOwnersSummary(t *testing.T) {
	for _, tc := range []struct {
		owners []string
		want   string
	}{
		{nil, ""},
		{[]string{}, ""},
		{[]string{"a"}, "a x1"},
		{[]string{"a", "a"}, "a x2"},
		{[]string{"a", "a", "b", "b", "b"}, "a x2, b x3"},
		{[]string{"a", "b", "a"}, "a x1, b x1, a x1"},
		{[]string{"n1", "n2", "n3"}, "n1 x1, n2 x1, n3 x1"},
		{[]string{"", ""}, " x2"},
	} {
		if got := ownersSummary(tc.owners); got != tc.want {
			t.Errorf("ownersSummary(%q) = %q, want %q", tc.owners, got, tc.want)
		}
	}
}

func TestDaemonHelpers(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/a/b/c.sock", "/a/b"},
		{"/c.sock", "."},
		{"c.sock", "."},
		{"a/c.sock", "a"},
	} {
		if got := dirOf(tc.in); got != tc.want {
			t.Errorf("dirOf(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if got := lastLines("1\n2\n3\n4\n", 2); got != "3\n4" {
		t.Errorf("lastLines = %q", got)
	}
	if got := lastLines("only", 5); got != "only" {
		t.Errorf("lastLines = %q", got)
	}
}

var nsSeq atomic.Int64

// privateDir is a temporary directory of mode 0700, as agents want.
func privateDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	if err := os.Chmod(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestInfo(t *testing.T) {
	ns := fmt.Sprintf("clitest-%d-%d", os.Getpid(), nsSeq.Add(1))
	sock := filepath.Join(privateDir(t), "s.sock")
	a, err := agent.Start(agent.Config{Namespace: ns, Node: "n1", Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	s, err := ddstore.Open(ddstore.Config{Namespace: ns, Node: "n1", Socket: sock, Rank: 0, Size: 1, LocalRank: 0, LocalSize: 1, NoSpawn: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	// 3 rows of 2 items of 4 bytes.
	if err := s.Add("feat", make([]byte, 24), 2, 4); err != nil {
		t.Fatal(err)
	}
	flags := []string{"--socket", sock, "--namespace", ns, "--node", "n1"}

	code, out, errOut := run(t, append([]string{"info"}, flags...)...)
	if code != 0 || errOut != "" {
		t.Fatalf("info: exit %d, stderr %q", code, errOut)
	}
	for _, want := range []string{
		fmt.Sprintf("namespace %q, node %q, coordinator true", ns, "n1"),
		"socket " + sock,
		"nodes: n1",
		"variable", "row bytes", "owners",
		"feat", "n1 x1", "[0]",
		"counters: map[",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("info output lacks %q:\n%s", want, out)
		}
	}
	var featLine string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "feat") {
			featLine = l
		}
	}
	if f := strings.Fields(featLine); len(f) < 5 || f[1] != "3" || f[2] != "2" || f[3] != "4" || f[4] != "8" {
		t.Errorf("variable row %q: want rows 3, disp 2, itemsize 4, row bytes 8", featLine)
	}

	code, out, errOut = run(t, append([]string{"info", "--json"}, flags...)...)
	if code != 0 || errOut != "" {
		t.Fatalf("info --json: exit %d, stderr %q", code, errOut)
	}
	var in agent.Info
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		t.Fatalf("info --json output does not parse: %v\n%s", err, out)
	}
	if in.Namespace != ns || in.Node != "n1" || in.Socket != sock || !in.Coordinator || in.Pid != os.Getpid() || in.PeerAddr != a.PeerAddr() {
		t.Errorf("info --json: %+v", in)
	}
	if len(in.Variables) != 1 {
		t.Fatalf("info --json variables: %+v", in.Variables)
	}
	v := in.Variables[0]
	if v.Name != "feat" || !v.Published || v.TotalRows != 3 || v.Disp != 2 || v.ItemSize != 4 || v.RowBytes != 8 ||
		len(v.Owners) != 1 || v.Owners[0] != "n1" || len(v.LocalRanks) != 1 || v.LocalRanks[0] != 0 || v.LocalBytes != 24 {
		t.Errorf("info --json variable: %+v", v)
	}
	if _, ok := in.Counters["bad_frames"]; !ok {
		t.Errorf("info --json counters: %v", in.Counters)
	}
	// The info command's own connection is open while the agent answers.
	if in.Clients < 1 {
		t.Errorf("info saw %d clients, want at least itself", in.Clients)
	}

	// Wrong node for this socket: the agent refuses the hello.
	code, _, errOut = run(t, "info", "--socket", sock, "--namespace", ns, "--node", "n2")
	if code != exitArgument || !strings.Contains(errOut, "bad argument") {
		t.Errorf("info with the wrong node: exit %d, stderr %q", code, errOut)
	}
}

func TestInfoNoAgent(t *testing.T) {
	sock := filepath.Join(privateDir(t), "none.sock")
	code, out, errOut := run(t, "info", "--socket", sock, "--namespace", "ns", "--node", "n1")
	if code != exitNoAgent || out != "" || !strings.Contains(errOut, "no agent") || !strings.Contains(errOut, sock) {
		t.Fatalf("info without an agent: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// The default socket is derived from --run-dir, namespace and node.
	dir := privateDir(t)
	code, _, errOut = run(t, "info", "--run-dir", dir, "--namespace", "ns", "--node", "n1")
	if code != exitNoAgent || !strings.Contains(errOut, "no agent") || !strings.Contains(errOut, filepath.Join(dir, "ns.n1.sock")) {
		t.Fatalf("info --run-dir without an agent: exit %d, stderr %q", code, errOut)
	}
}

func TestAgentCommand(t *testing.T) {
	t.Run("idle exit", func(t *testing.T) {
		dir := privateDir(t)
		sock := filepath.Join(dir, "a.sock")
		ns := fmt.Sprintf("clitest-%d-%d", os.Getpid(), nsSeq.Add(1))
		code, out, errOut := run(t, "agent", "--socket", sock, "--namespace", ns, "--node", "n1",
			"--peer-listen", "127.0.0.1:0", "--idle-exit", "150ms")
		if code != 0 {
			t.Fatalf("agent: exit %d, stderr %q", code, errOut)
		}
		if !strings.Contains(out, fmt.Sprintf("ddstore agent: namespace %q node %q socket %s peer 127.0.0.1:", ns, "n1", sock)) {
			t.Errorf("agent stdout %q", out)
		}
		if !strings.Contains(errOut, "agent started") || !strings.Contains(errOut, "agent stopped") {
			t.Errorf("agent log %q", errOut)
		}
		if _, err := os.Stat(sock); !os.IsNotExist(err) {
			t.Errorf("socket after the agent stopped: %v", err)
		}
	})
	t.Run("public socket directory", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "pub")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := run(t, "agent", "--socket", filepath.Join(dir, "a.sock"), "--namespace", "ns", "--node", "n1")
		if code != exitArgument || out != "" || !strings.Contains(errOut, "mode 755") {
			t.Fatalf("agent in a 0755 directory: exit %d, stdout %q, stderr %q", code, out, errOut)
		}
	})
}

func TestBenchBadSizes(t *testing.T) {
	// Sizes are checked before anything is started.
	for _, args := range [][]string{
		{"bench", "--sizes", "64,x"},
		{"bench", "--sizes", "0"},
		{"bench", "--shard", "-1"},
	} {
		code, out, errOut := run(t, args...)
		if code != exitArgument || out != "" || !strings.Contains(errOut, "want a positive number of bytes") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
}
