package ddstore_test

// A node whose /dev/shm is full: a variable that does not fit fails its Add
// on every rank, naming the bytes wanted and free, and the agent, the
// clients and the segments are as they were. The test runs in a private
// mount namespace over whose /dev/shm it mounts a small tmpfs: this test
// binary re-executed as the one test, as root.

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/testutil"
)

// smallShmEnv tells the re-executed test binary that it runs in its own
// mount namespace, where it may mount over /dev/shm.
const smallShmEnv = "DDSTORE_TEST_SMALL_SHM"

// inSmallShm runs test (the caller) again in a private mount namespace
// where /dev/shm is a tmpfs of size bytes, and reports its outcome; false:
// this process is that copy, which goes on with the test. It skips where
// that cannot be done (not root, no mount namespaces).
func inSmallShm(t *testing.T, test string, size int) bool {
	t.Helper()
	if os.Getenv(smallShmEnv) != "" {
		if err := unix.Mount("ddstore-small-shm", "/dev/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777,size="+strconv.Itoa(size)); err != nil {
			t.Fatalf("mount a tmpfs of %d bytes over /dev/shm: %v", size, err)
		}
		return false
	}
	if os.Geteuid() != 0 {
		t.Skip("a private /dev/shm needs root (a mount namespace and a tmpfs mount)")
	}
	args := testutil.SelfTestArgs(t, test)
	cmd := exec.Command(args[0], args[1:]...)
	// Go's runtime makes / private (MS_REC|MS_PRIVATE) in a child with a
	// new mount namespace, so the tmpfs stays the child's.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	cmd.Env = append(os.Environ(), smallShmEnv+"=1", reuseBinEnv+"="+ddstoreBin, testutil.NoRaceExitPause)
	out, err := cmd.CombinedOutput()
	if errors.Is(err, syscall.EPERM) {
		t.Skipf("no mount namespace for this process: %v", err)
	}
	if err != nil || !bytes.Contains(out, []byte("--- PASS: "+test)) {
		t.Fatalf("%s in a private /dev/shm of %d bytes: %v\n%s", test, size, err, out)
	}
	t.Logf("%s", out)
	return true
}

// TestClusterShmFull: a full /dev/shm fails an Add cleanly. Sized and
// then written through a mapping, a segment on a full tmpfs is a SIGBUS:
// the agent's header write killed the agent, and a client's rows the
// client.
func TestClusterShmFull(t *testing.T) {
	const shmSize = 64 << 20
	if inSmallShm(t, "TestClusterShmFull", shmSize) {
		return
	}
	ns, runDir, agents := startAgentProcs(t, "shmfull", "a")
	stores := make([]*ddstore.Store, 2)
	for r := range stores {
		s, err := ddstore.Open(ddstore.Config{Namespace: ns, Rank: r, Size: 2, LocalRank: r, LocalSize: 2,
			Node: "a", RunDir: runDir, NoSpawn: true, Timeout: 20 * time.Second, PublishTimeout: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		stores[r] = s
	}
	// add runs Add on both ranks at once, rank r with rows[r] bytes of
	// 1024-byte rows, and returns their errors.
	add := func(name string, rows ...int) []error {
		errs := make([]error, len(stores))
		var wg sync.WaitGroup
		for r, s := range stores {
			wg.Go(func() {
				b := make([]byte, rows[r])
				for i := range b {
					b[i] = byte(r + i)
				}
				errs[r] = s.Add(name, b, 1024, 1)
			})
		}
		wg.Wait()
		return errs
	}
	alive := func(when string) {
		t.Helper()
		if _, err := ddstore.QueryAgent(agents[0].socket, ns, "a"); err != nil {
			t.Fatalf("%s: the agent does not answer: %v\nagent log:\n%s", when, err, agents[0].log.String())
		}
		testutil.WaitFor(t, 10*time.Second, func() error {
			if e := shmEntries(ns); len(e) != 0 {
				return errors.New("segments left in /dev/shm: " + strings.Join(e, " "))
			}
			return nil
		})
	}
	free := func() int64 {
		var st unix.Statfs_t
		if err := unix.Statfs("/dev/shm", &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Bavail) * st.Bsize
	}

	// Full: not one page left, not even for a segment's header.
	filler := filepath.Join("/dev/shm", "filler")
	if err := os.WriteFile(filler, make([]byte, shmSize+1<<20), 0o600); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("filling /dev/shm: %v, want ENOSPC", err)
	}
	for r, err := range add("tiny", 4096, 4096) {
		if !errors.Is(err, ddstore.ErrArgument) || !strings.Contains(err.Error(), "8192 bytes") || !strings.Contains(err.Error(), "has 0 bytes") {
			t.Errorf("rank %d: Add on a full /dev/shm: %v; want ErrArgument naming the bytes wanted and free", r, err)
		}
	}
	alive("after an Add on a full /dev/shm")

	// Room for rank 0's shard, not for rank 1's: rank 1's reason reaches
	// rank 0, which had made its shard, and the shard is taken back.
	if err := os.Truncate(filler, shmSize-8<<20); err != nil {
		t.Fatal(err)
	}
	wantBytes := strconv.Itoa(4096 + 16<<20) // header page and rows
	// Rank 0's shard made first or not: what was free either way.
	before := free()
	frees := []string{strconv.FormatInt(before, 10), strconv.FormatInt(before-(4096+1<<20), 10)}
	errs := add("big", 1<<20, 16<<20)
	for r, err := range errs {
		if !errors.Is(err, ddstore.ErrArgument) && !errors.Is(err, ddstore.ErrGeometry) || !strings.Contains(err.Error(), wantBytes+" bytes") {
			t.Errorf("rank %d: Add of a shard larger than /dev/shm has free: %v; want an error naming the %s bytes wanted", r, err, wantBytes)
		}
	}
	if err := errs[1]; err != nil && !strings.Contains(err.Error(), "has "+frees[0]+" bytes") && !strings.Contains(err.Error(), "has "+frees[1]+" bytes") {
		t.Errorf("rank 1: %v; want it to name the bytes free (%s or %s)", err, frees[0], frees[1])
	}
	if err := errs[0]; err != nil && !strings.Contains(err.Error(), "rank 1 could not create its shard") {
		t.Errorf("rank 0: %v; want rank 1's reason", err)
	}
	alive("after an Add larger than /dev/shm has free")

	// Everything keeps working: a variable that fits, read across ranks.
	for r, err := range add("big", 1<<20, 2<<20) {
		if err != nil {
			t.Fatalf("rank %d: Add that fits: %v", r, err)
		}
	}
	row := make([]byte, 1024)
	for _, g := range []int64{0, 1023, 1024, 3071} {
		if err := stores[0].Get("big", row, g); err != nil {
			t.Fatal(err)
		}
		r, l := 0, g
		if g >= 1024 {
			r, l = 1, g-1024
		}
		if want := byte(r + int(l*1024)); row[0] != want {
			t.Fatalf("row %d begins with %d, want %d", g, row[0], want)
		}
	}
}
