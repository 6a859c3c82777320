package cli

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/naming"
	"github.com/ddstore-go/ddstore/internal/shm"
)

const gcSynopsis = `
Remove what dead agents left behind: their shared-memory segments
(/dev/shm/ddstore.NAMESPACE.NODE.VARIABLE.rRANK) and their socket, key, lock,
log and manifest files in the run directory. An agent killed with SIGKILL (or
a node's job ended without a clean shutdown) leaves all of them, and one
stopped with --persist leaves its segments and manifest on purpose: an agent
started again for that namespace and node re-adopts them, gc removes them.

An agent is alive while it holds the lock file RUN_DIR/NAMESPACE.NODE.sock.lock
(flock); gc tries that lock for each namespace and node it finds, and removes
nothing of an agent that holds it. While removing a dead agent's files it keeps
the lock itself, so no agent of that namespace and node starts meanwhile. A
segment that some process still maps (seen in /proc/PID/maps) is kept too, as
is every file that does not belong to this user, and a log written in the
last minute with nothing else beside it (an agent --daemon starting).

A segment whose whole name was hashed (ddstore.hHEX.rRANK: very long namespace
and node names) cannot be traced to its agent: gc lists it and leaves it, unless
--all-unattributed says to remove those as well (only do that when no agent of
such a namespace runs on this node).

Agents started with --socket elsewhere than the run directory keep their lock
there: give that directory as --run-dir.`

// gcFile is one file gc removed, would remove, or kept.
type gcFile struct {
	Path      string `json:"path"`
	Kind      string `json:"kind"` // segment, socket, key, lock, log, manifest
	Namespace string `json:"namespace,omitempty"`
	Node      string `json:"node,omitempty"`
	Bytes     int64  `json:"bytes"`  // apparent size
	Memory    int64  `json:"memory"` // allocated: what removing it frees
	Reason    string `json:"reason,omitempty"`
	mtime     time.Time
}

type gcError struct {
	Path  string `json:"path"`
	Error string `json:"error"`
}

type gcReport struct {
	DryRun       bool      `json:"dry_run"`
	ShmDir       string    `json:"shm_dir"`
	RunDir       string    `json:"run_dir"`
	Removed      []gcFile  `json:"removed"`
	Kept         []gcFile  `json:"kept"`
	Unattributed []gcFile  `json:"unattributed"`
	BytesFreed   int64     `json:"bytes_freed"`
	Errors       []gcError `json:"errors"`
}

// gcGroup is everything of one agent: its segments and run-directory files.
type gcGroup struct {
	socket          string // key: the agent's socket path
	namespace, node string // empty when not known (a hashed socket name)
	files           []gcFile
}

func runGC(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("gc", gcSynopsis, stderr)
	runDir := fs.String("run-dir", "", "directory of the agents' sockets and locks (DDSTORE_RUN_DIR, default /tmp/ddstore-UID)")
	dry := fs.Bool("dry-run", false, "only print what would be removed")
	ns := fs.String("namespace", "", "only this namespace (default: every namespace)")
	unattributed := fs.Bool("all-unattributed", false, "also remove segments with hashed names, whose agent cannot be known")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *runDir == "" {
		*runDir = naming.DefaultRunDir()
	}
	rep := gc(*runDir, *ns, *dry, *unattributed)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		printGC(stdout, rep)
	}
	if len(rep.Errors) > 0 {
		msgs := make([]string, len(rep.Errors))
		for i, e := range rep.Errors {
			msgs[i] = e.Error
		}
		return fmt.Errorf("ddstore gc: %d errors: %s", len(rep.Errors), strings.Join(msgs, "; "))
	}
	return nil
}

func gc(runDir, namespace string, dry, unattributed bool) *gcReport {
	rep := &gcReport{DryRun: dry, ShmDir: shm.Dir, RunDir: runDir,
		Removed: []gcFile{}, Kept: []gcFile{}, Unattributed: []gcFile{}, Errors: []gcError{}}
	fail := func(path string, err error) {
		msg := err.Error()
		if !strings.Contains(msg, path) {
			msg = path + ": " + msg
		}
		rep.Errors = append(rep.Errors, gcError{Path: path, Error: msg})
	}
	groups := map[string]*gcGroup{}
	group := func(socket, ns, node string) *gcGroup {
		g := groups[socket]
		if g == nil {
			g = &gcGroup{socket: socket}
			groups[socket] = g
		}
		if ns != "" {
			g.namespace, g.node = ns, node
		}
		return g
	}

	// Segments, grouped by the agent they belong to.
	var unattr []gcFile
	if ents, err := os.ReadDir(shm.Dir); err != nil {
		fail(shm.Dir, err)
	} else {
		for _, e := range ents {
			ns, node, hashed, ok := shm.ParseSegmentName(e.Name())
			if !ok || namespace != "" && (hashed || ns != namespace) {
				continue
			}
			f, ok := ownFile(filepath.Join(shm.Dir, e.Name()), "segment", fail)
			if !ok {
				continue
			}
			if hashed {
				unattr = append(unattr, f)
				continue
			}
			f.Namespace, f.Node = ns, node
			g := group(naming.SocketPath(runDir, ns, node), ns, node)
			g.files = append(g.files, f)
		}
	}

	// Sockets, locks and logs in the run directory, also those of agents
	// that had no segment.
	if ents, err := os.ReadDir(runDir); err != nil && !errors.Is(err, os.ErrNotExist) {
		fail(runDir, err)
	} else {
		for _, e := range ents {
			base, kind := splitRunFile(e.Name())
			if kind == "" {
				continue
			}
			socket := filepath.Join(runDir, base+".sock")
			ns, node := parseSocketBase(base)
			if g := groups[socket]; g != nil && g.namespace != "" {
				ns, node = g.namespace, g.node
			}
			if namespace != "" && ns != namespace {
				continue
			}
			f, ok := ownFile(filepath.Join(runDir, e.Name()), kind, fail)
			if !ok {
				continue
			}
			f.Namespace, f.Node = ns, node
			g := group(socket, ns, node)
			g.files = append(g.files, f)
		}
	}

	mapped := mappedFiles(shm.Dir)
	keys := make([]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		g := groups[k]
		sort.Slice(g.files, func(i, j int) bool { return g.files[i].Path < g.files[j].Path })
		keep := func(reason string) {
			for _, f := range g.files {
				f.Reason = reason
				rep.Kept = append(rep.Kept, f)
			}
		}
		if onlyFreshLog(g.files) {
			// ddstore agent --daemon opens its log before the agent takes
			// its lock: this may be an agent starting.
			keep("log written in the last minute; its agent may be starting")
			continue
		}
		held, release, err := naming.ProbeLock(k+".lock", !dry)
		if err != nil {
			fail(k+".lock", err)
			keep("lock could not be tried")
			continue
		}
		if held {
			keep("agent alive (holds " + k + ".lock)")
			continue
		}
		if pid, ok := anyMapped(g.files, mapped); ok {
			hadLock := false
			for _, f := range g.files {
				hadLock = hadLock || f.Kind == "lock"
			}
			release(!hadLock) // a lock file gc made to probe goes again
			keep(fmt.Sprintf("mapped by pid %d", pid))
			continue
		}
		removeFiles(rep, g.files, dry, "agent gone", fail)
		release(!dry)
	}

	sort.Slice(unattr, func(i, j int) bool { return unattr[i].Path < unattr[j].Path })
	for _, f := range unattr {
		if _, ok := mapped[f.Path]; ok || !unattributed {
			rep.Unattributed = append(rep.Unattributed, f)
		}
	}
	if unattributed {
		var rm []gcFile
		for _, f := range unattr {
			if _, ok := mapped[f.Path]; !ok {
				rm = append(rm, f)
			}
		}
		removeFiles(rep, rm, dry, "hashed name, --all-unattributed", fail)
	}
	return rep
}

func removeFiles(rep *gcReport, files []gcFile, dry bool, reason string, fail func(string, error)) {
	for _, f := range files {
		f.Reason = reason
		if !dry && f.Kind != "lock" { // the lock goes last, in release
			if err := os.Remove(f.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
				fail(f.Path, err)
				continue
			}
		}
		rep.Removed = append(rep.Removed, f)
		rep.BytesFreed += f.Memory
	}
}

// ownFile stats path and says whether gc may remove it: a regular file (or,
// for a socket, a socket) of this user.
func ownFile(path, kind string, fail func(string, error)) (gcFile, bool) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		if err != unix.ENOENT {
			fail(path, err)
		}
		return gcFile{}, false
	}
	want := uint32(unix.S_IFREG)
	if kind == "socket" {
		want = unix.S_IFSOCK
	}
	if st.Mode&unix.S_IFMT != want || int(st.Uid) != os.Geteuid() {
		return gcFile{}, false
	}
	return gcFile{Path: path, Kind: kind, Bytes: st.Size, Memory: st.Blocks * 512, mtime: time.Unix(st.Mtim.Unix())}, true
}

// splitRunFile recognizes the files an agent leaves in the run directory:
// BASE.sock, BASE.sock.key, BASE.sock.lock, BASE.sock.log and
// BASE.sock.manifest.json.
func splitRunFile(name string) (base, kind string) {
	for _, s := range []struct{ suffix, kind string }{{".sock", "socket"}, {".sock.key", "key"}, {".sock.lock", "lock"},
		{".sock.log", "log"}, {".sock.manifest.json", "manifest"}} {
		if b, ok := strings.CutSuffix(name, s.suffix); ok && b != "" {
			return b, s.kind
		}
	}
	return "", ""
}

// parseSocketBase reads the namespace and node back from a socket's name
// (NAMESPACE.NODE escaped); a hashed name gives nothing.
func parseSocketBase(base string) (ns, node string) {
	parts := strings.Split(base, ".")
	if len(parts) != 2 {
		return "", ""
	}
	ns, err1 := shm.Unescape(parts[0])
	node, err2 := shm.Unescape(parts[1])
	if err1 != nil || err2 != nil {
		return "", ""
	}
	return ns, node
}

// mappedFiles lists the files under dir that a process this user can see
// maps, with one such process for each.
func mappedFiles(dir string) map[string]int {
	m := map[string]int{}
	procs, _ := os.ReadDir("/proc")
	prefix := strings.TrimSuffix(dir, "/") + "/"
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		f, err := os.Open("/proc/" + p.Name() + "/maps")
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := sc.Text()
			i := strings.Index(line, " "+prefix)
			if i < 0 {
				continue
			}
			m[strings.TrimSuffix(line[i+1:], " (deleted)")] = pid
		}
		f.Close()
	}
	return m
}

func onlyFreshLog(files []gcFile) bool {
	for _, f := range files {
		if f.Kind != "log" || time.Since(f.mtime) > time.Minute {
			return false
		}
	}
	return len(files) > 0
}

func anyMapped(files []gcFile, mapped map[string]int) (int, bool) {
	for _, f := range files {
		if pid, ok := mapped[f.Path]; ok {
			return pid, true
		}
	}
	return 0, false
}

func printGC(w io.Writer, rep *gcReport) {
	verb, freed := "removed", "freed"
	if rep.DryRun {
		verb, freed = "would remove", "would free"
	}
	for _, f := range rep.Removed {
		fmt.Fprintf(w, "%s %s %s (%s)%s\n", verb, f.Kind, f.Path, humanBytes(f.Memory), owner(f))
	}
	for _, f := range rep.Kept {
		fmt.Fprintf(w, "kept %s %s: %s%s\n", f.Kind, f.Path, f.Reason, owner(f))
	}
	if len(rep.Unattributed) > 0 {
		fmt.Fprintf(w, "left %d segments with hashed names, whose agent cannot be known (--all-unattributed removes those not mapped):\n", len(rep.Unattributed))
		for _, f := range rep.Unattributed {
			fmt.Fprintf(w, "  %s (%s)\n", f.Path, humanBytes(f.Memory))
		}
	}
	if len(rep.Removed)+len(rep.Kept)+len(rep.Unattributed) == 0 {
		fmt.Fprintf(w, "nothing to remove in %s or %s\n", rep.ShmDir, rep.RunDir)
	}
	fmt.Fprintf(w, "%s %s in %d files\n", freed, humanBytes(rep.BytesFreed), len(rep.Removed))
}

func owner(f gcFile) string {
	if f.Namespace == "" {
		return ""
	}
	return fmt.Sprintf(" [namespace %q node %q]", f.Namespace, f.Node)
}
