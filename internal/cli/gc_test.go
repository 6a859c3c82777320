package cli

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore/internal/agent"
	"github.com/ddstore-go/ddstore/internal/naming"
	"github.com/ddstore-go/ddstore/internal/shm"
	"github.com/ddstore-go/ddstore/internal/testutil"
)

// gcDirs points shm.Dir at a fresh directory for the test (gc must never
// touch the real /dev/shm, where other tests' agents keep segments) and
// returns it with a private run directory.
func gcDirs(t *testing.T) (shmDir, runDir string) {
	t.Helper()
	old := shm.Dir
	shm.Dir = t.TempDir()
	t.Cleanup(func() { shm.Dir = old })
	runDir = t.TempDir()
	if err := os.Chmod(runDir, 0o700); err != nil {
		t.Fatal(err)
	}
	return shm.Dir, runDir
}

// fakeSegment writes a segment file with some data in it.
func fakeSegment(t *testing.T, ns, node, variable string, rank int) string {
	t.Helper()
	p := shm.SegmentPath(ns, node, variable, rank, "")
	if err := os.WriteFile(p, make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// staleSocket leaves a socket file behind, as a killed agent does.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

func gcJSON(t *testing.T, args ...string) gcReport {
	t.Helper()
	code, out, errOut := run(t, append([]string{"gc", "--json"}, args...)...)
	if code != 0 {
		t.Fatalf("gc %v: exit %d, stderr %q", args, code, errOut)
	}
	var rep gcReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("gc --json: %v\n%s", err, out)
	}
	return rep
}

func slicesDelete(s []string, x string) []string {
	var out []string
	for _, v := range s {
		if v != x {
			out = append(out, v)
		}
	}
	return out
}

func paths(fs []gcFile) map[string]string {
	m := map[string]string{}
	for _, f := range fs {
		m[f.Path] = f.Kind
	}
	return m
}

func TestGC(t *testing.T) {
	shmDir, runDir := gcDirs(t)

	// A dead agent: segments, socket, lock and log left behind.
	deadSock := naming.SocketPath(runDir, "dead.ns", "n1")
	dead := []string{
		fakeSegment(t, "dead.ns", "n1", "x", 0),
		fakeSegment(t, "dead.ns", "n1", "x", 1),
		fakeSegment(t, "dead.ns", "n1", strings.Repeat("v", 300), 2), // hashed variable name
		deadSock + ".lock", deadSock + ".log", deadSock, deadSock + ".manifest.json",
	}
	for _, p := range append(dead[3:5], dead[6]) {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	staleSocket(t, deadSock)
	// A dead agent that had no segment: only its lock file is left.
	goneLock := naming.LockPath(runDir, "gone", "n2")
	if err := os.WriteFile(goneLock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	dead = append(dead, goneLock)

	// A log just written, nothing else: an agent --daemon may be starting.
	freshLog := naming.SocketPath(runDir, "starting", "n1") + ".log"
	if err := os.WriteFile(freshLog, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// An old one, left by an agent that stopped: removed.
	oldLog := naming.SocketPath(runDir, "stopped", "n1") + ".log"
	if err := os.WriteFile(oldLog, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(oldLog, time.Now().Add(-time.Hour), time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	dead = append(dead, oldLog)

	// A live agent, and segment files of its namespace (not mapped here:
	// only its lock says it is alive).
	live, err := agent.Start(agent.Config{Namespace: "live", Node: "n1", Socket: naming.SocketPath(runDir, "live", "n1")})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	keep := []string{fakeSegment(t, "live", "n1", "x", 0), fakeSegment(t, "live", "n1", "y", 3), live.Socket(), live.Socket() + ".lock"}

	// A dead agent's segment still mapped by a process (this one): kept.
	mappedSeg, err := shm.Create(shm.SegmentPath("mapped", "n1", "x", 0, ""), shm.Header{Rows: 4, Disp: 8, ItemSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer mappedSeg.Close()
	keep = append(keep, mappedSeg.Path)

	// A segment of a dead agent but another user's; a hashed name; a file
	// that is no segment.
	hashed := filepath.Join(shmDir, "ddstore.h"+strings.Repeat("ab", 20)+".r0")
	other := filepath.Join(shmDir, "ddstore-test.1.x")
	for _, p := range []string{hashed, other} {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	keep = append(keep, hashed, other, freshLog)
	if os.Geteuid() == 0 {
		foreign := fakeSegment(t, "dead.ns", "n1", "x", 7)
		if err := os.Chown(foreign, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		keep = append(keep, foreign)
	}
	check := func(stage string, removed bool) {
		t.Helper()
		for _, p := range dead {
			if exists(p) == removed {
				t.Errorf("%s: %s exists %v", stage, p, !removed)
			}
		}
		for _, p := range keep {
			if !exists(p) {
				t.Errorf("%s: %s was removed", stage, p)
			}
		}
	}

	// --dry-run removes nothing but says what it would.
	rep := gcJSON(t, "--run-dir", runDir, "--dry-run")
	check("dry run", false)
	got := paths(rep.Removed)
	if !rep.DryRun || len(got) != len(dead) {
		t.Errorf("dry run: would remove %v, want %v", got, dead)
	}
	for _, p := range dead {
		if _, ok := got[p]; !ok {
			t.Errorf("dry run: %s not listed", p)
		}
	}
	if kinds := strings.Join([]string{got[dead[0]], got[deadSock], got[deadSock+".lock"], got[deadSock+".log"]}, " "); kinds != "segment socket lock log" {
		t.Errorf("kinds %s", kinds)
	}
	if rep.BytesFreed < 3*8192 {
		t.Errorf("dry run: would free %d bytes, want at least %d", rep.BytesFreed, 3*8192)
	}
	if u := paths(rep.Unattributed); len(u) != 1 || u[hashed] != "segment" {
		t.Errorf("unattributed %v, want %s", u, hashed)
	}
	kept := map[string]string{}
	for _, f := range rep.Kept {
		kept[f.Path] = f.Reason
	}
	if r := kept[keep[0]]; !strings.Contains(r, "alive") {
		t.Errorf("live segment kept for %q", r)
	}
	if r := kept[mappedSeg.Path]; !strings.Contains(r, fmt.Sprintf("mapped by pid %d", os.Getpid())) {
		t.Errorf("mapped segment kept for %q", r)
	}

	// Another namespace: nothing of these.
	if rep := gcJSON(t, "--run-dir", runDir, "--namespace", "nope"); len(rep.Removed)+len(rep.Kept)+len(rep.Unattributed) != 0 {
		t.Errorf("--namespace nope: %+v", rep)
	}
	check("other namespace", false)

	code, out, errOut := run(t, "gc", "--run-dir", runDir)
	if code != 0 {
		t.Fatalf("gc: exit %d, stderr %q", code, errOut)
	}
	check("gc", true)
	for _, want := range []string{"removed segment " + dead[0], "removed lock " + goneLock, `[namespace "dead.ns" node "n1"]`,
		"kept segment " + keep[0] + ": agent alive", "left 1 segments with hashed names", "--all-unattributed", "freed "} {
		if !strings.Contains(out, want) {
			t.Errorf("gc output lacks %q:\n%s", want, out)
		}
	}
	// The live agent still serves.
	if c, err := net.Dial("unix", live.Socket()); err != nil {
		t.Errorf("live agent after gc: %v", err)
	} else {
		c.Close()
	}

	rep = gcJSON(t, "--run-dir", runDir, "--all-unattributed")
	if len(rep.Removed) != 1 || rep.Removed[0].Path != hashed || exists(hashed) {
		t.Errorf("--all-unattributed removed %+v", rep.Removed)
	}
	dead, keep = append(dead, hashed), slicesDelete(keep, hashed)
	check("all unattributed", true)
}

func TestGCHelp(t *testing.T) {
	code, _, errOut := run(t, "gc", "--help")
	for _, want := range []string{"dead agents", "-dry-run", "-all-unattributed", "-namespace", "-json", "lock"} {
		if code != 0 || !strings.Contains(errOut, want) {
			t.Errorf("gc --help (exit %d) lacks %q", code, want)
		}
	}
}

func TestGCErrorNamesPath(t *testing.T) {
	gcDirs(t)
	shm.Dir = filepath.Join(shm.Dir, "missing")
	code, _, errOut := run(t, "gc", "--run-dir", t.TempDir())
	if code != exitInternal || !strings.Contains(errOut, shm.Dir) { // an error of no kind: the OS's
		t.Errorf("missing shm dir: exit %d, stderr %q", code, errOut)
	}
}

// gcAgentArgs are the arguments of the "gc-agent" helper process.
type gcAgentArgs struct{ RunDir, ShmDir string }

// gcAgent is the helper process of TestGCKilledAgent: an agent holding a
// segment, killed with SIGKILL so that it leaves its files behind.
func gcAgent(a gcAgentArgs) int {
	shm.Dir = a.ShmDir
	ag, err := agent.Start(agent.Config{Namespace: "killed", Node: "n1", Socket: naming.SocketPath(a.RunDir, "killed", "n1")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := shm.Create(shm.SegmentPath("killed", "n1", "x", 0, ""), shm.Header{Rows: 16, Disp: 1, ItemSize: 8}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ready")
	<-ag.Done()
	return 0
}

var _ = testutil.Helper("gc-agent", gcAgent)

func init() { testutil.RunHelper() }

func TestGCKilledAgent(t *testing.T) {
	shmDir, runDir := gcDirs(t)
	cmd := testutil.HelperCmd(t, "gc-agent", gcAgentArgs{RunDir: runDir, ShmDir: shmDir})
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "ready" {
				ready <- true
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		t.Fatal("helper agent did not start")
	}
	seg := shm.SegmentPath("killed", "n1", "x", 0, "")
	sock := naming.SocketPath(runDir, "killed", "n1")
	rep := gcJSON(t, "--run-dir", runDir)
	if len(rep.Removed) != 0 || !exists(seg) || !exists(sock) {
		t.Fatalf("gc removed files of a running agent: %+v", rep.Removed)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if !exists(seg) || !exists(sock) || !exists(sock+".lock") || !exists(sock+".key") {
		t.Fatal("SIGKILL left nothing behind: nothing to test")
	}
	rep = gcJSON(t, "--run-dir", runDir)
	if got := paths(rep.Removed); len(got) != 4 || got[seg] != "segment" || got[sock] != "socket" || got[sock+".lock"] != "lock" ||
		got[sock+".key"] != "key" {
		t.Errorf("gc after SIGKILL removed %v", got)
	}
	for _, p := range []string{seg, sock, sock + ".lock", sock + ".key"} {
		if exists(p) {
			t.Errorf("%s still there", p)
		}
	}
	if rep.BytesFreed <= 0 {
		t.Errorf("freed %d bytes", rep.BytesFreed)
	}
}
