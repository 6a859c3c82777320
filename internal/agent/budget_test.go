package agent

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/shm"
	"github.com/ddstore-go/ddstore/internal/wire"
)

const kib = 1 << 10

// segmentsOf lists the segment files of an agent's namespace and node in
// /dev/shm.
func segmentsOf(t *testing.T, a *Agent) []string {
	t.Helper()
	m, err := filepath.Glob(shm.SegmentPrefix(a.cfg.Namespace, a.cfg.Node) + "*")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// shardOf is a 1-rank shard of n KiB (rows of 64 bytes).
func shardOf(name string, n int64) wire.Shard {
	return wire.Shard{Name: name, Rank: 0, Size: 1, Rows: n * kib / 64, Disp: 8, ItemSize: 8, TimeoutMs: 5000, Attempt: 1}
}

// addShard creates and publishes a 1-rank shard, as Add does.
func addShard(t *testing.T, r *rawConn, sh wire.Shard) {
	t.Helper()
	p, err := wire.DecodePath(r.must(wire.OpCreate, sh.Encode))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shm.Remove(p.Path) })
	r.must(wire.OpPublish, sh.Encode)
}

func checkUse(t *testing.T, r *rawConn, a *Agent, want int64) {
	t.Helper()
	in := r.info()
	if in.MemoryBudget != a.cfg.MemoryBytes || in.MemoryBytes != want {
		t.Fatalf("info: memory %d of budget %d, want %d of %d", in.MemoryBytes, in.MemoryBudget, want, a.cfg.MemoryBytes)
	}
	if got := a.shardBytes.Load() + a.regions.bytes(); got != want {
		t.Fatalf("charged %d bytes (shards %d), want %d", got, a.shardBytes.Load(), want)
	}
}

func TestAgentMemoryBudget(t *testing.T) {
	a := startAgent(t, Config{MemoryBytes: 1 << 20})
	r := dialRaw(t, a)
	r.hello(a, 0, 1)
	checkUse(t, r, a, 0)

	// A shard beyond the budget is refused up front, with the sizes named,
	// and nothing is left of it.
	big := shardOf("big", 1536)
	_, err := r.call(wire.OpCreate, big.Encode)
	if !errors.Is(err, base.ErrArgument) {
		t.Fatalf("create of 1.5 MiB under a 1 MiB budget: %v, want ErrArgument", err)
	}
	for _, want := range []string{`variable "big"`, "rank 0's shard of 1.5 MiB", `node "n1" to 1.5 MiB`, "memory budget of 1 MiB", "--memory"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if segs := segmentsOf(t, a); len(segs) != 0 {
		t.Errorf("segments left by a refused create: %v", segs)
	}
	if in := r.info(); len(in.Variables) != 0 {
		t.Errorf("variables left by a refused create: %+v", in.Variables)
	}
	checkUse(t, r, a, 0)
	// The client then fails the round (store.go createTyped).
	big.Failed = true
	if _, err := r.call(wire.OpPublish, big.Encode); err == nil {
		t.Fatal("publish of a failed shard succeeded")
	}

	// The agent goes on: a smaller shard fits.
	addShard(t, r, shardOf("a", 512))
	checkUse(t, r, a, 512*kib)
	// Another that would go past the budget does not.
	b := shardOf("b", 768)
	if _, err := r.call(wire.OpCreate, b.Encode); !errors.Is(err, base.ErrArgument) ||
		!strings.Contains(err.Error(), "shard of 768 KiB would take node") {
		t.Fatalf("create of 768 KiB with 512 KiB of 1 MiB held: %v, want ErrArgument", err)
	}
	checkUse(t, r, a, 512*kib)
	// Freeing gives the bytes back: with "a" dropped, "b" fits.
	r.must(wire.OpFree, (&wire.Name{Name: "a", Rank: 0}).Encode)
	checkUse(t, r, a, 0)
	b.Attempt = 2
	addShard(t, r, b)
	checkUse(t, r, a, 768*kib)

	// Receive regions count too: one beyond the budget is refused.
	reg, err := shm.NewRegion("budget-test", 512*kib)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	if _, err := r.call(wire.OpRegister, (&wire.Region{Size: 512 * kib}).Encode, reg.Fd); !errors.Is(err, base.ErrArgument) ||
		!strings.Contains(err.Error(), "receive region of 512 KiB would take node \"n1\" to 1.2 MiB, above its memory budget of 1 MiB") {
		t.Fatalf("register of 512 KiB with 768 KiB of 1 MiB held: %v, want ErrArgument naming the sizes", err)
	}
	if n := a.regions.count(); n != 0 {
		t.Fatalf("%d regions after a refused register", n)
	}
	rm, err := wire.DecodeRegion(r.must(wire.OpRegister, (&wire.Region{Size: 128 * kib}).Encode, reg.Fd))
	if err != nil {
		t.Fatal(err)
	}
	checkUse(t, r, a, 896*kib)
	// ... and a shard that fits alone does not fit beside the region.
	c := shardOf("c", 256)
	if _, err := r.call(wire.OpCreate, c.Encode); !errors.Is(err, base.ErrArgument) {
		t.Fatalf("create of 256 KiB with 896 KiB of 1 MiB held: %v, want ErrArgument", err)
	}
	// Unregistering gives the region's bytes back; the budget can be filled
	// exactly.
	r.must(wire.OpUnregister, (&wire.Region{ID: rm.ID}).Encode)
	checkUse(t, r, a, 768*kib)
	c.Attempt = 2
	addShard(t, r, c)
	checkUse(t, r, a, 1<<20)
	d := shardOf("d", 0)
	if _, err := r.call(wire.OpCreate, d.Encode); err != nil {
		t.Fatalf("create of an empty shard with the budget full: %v", err)
	}

	// Close gives everything back.
	a.Close()
	if got := a.shardBytes.Load(); got != 0 {
		t.Errorf("%d shard bytes charged after Close", got)
	}
	if segs := segmentsOf(t, a); len(segs) != 0 {
		t.Errorf("segments after Close: %v", segs)
	}
}

func TestAgentMemoryBudgetFailsRound(t *testing.T) {
	// Rank 0's shard fits, rank 1's does not: the round fails for both,
	// rank 0's shard is taken back and its bytes given back.
	a := startAgent(t, Config{MemoryBytes: 1 << 20})
	r0, r1 := dialRaw(t, a), dialRaw(t, a)
	r0.hello(a, 0, 2)
	r1.hello(a, 1, 2)
	s0 := wire.Shard{Name: "v", Rank: 0, Size: 2, Rows: 512 * kib / 64, Disp: 8, ItemSize: 8, TimeoutMs: 10_000, Attempt: 1}
	p, err := wire.DecodePath(r0.must(wire.OpCreate, s0.Encode))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shm.Remove(p.Path) })
	done := publishPending(t, a, r0, s0)
	s1 := s0
	s1.Rank, s1.Rows = 1, 768*kib/64
	if _, err := r1.call(wire.OpCreate, s1.Encode); !errors.Is(err, base.ErrArgument) || !strings.Contains(err.Error(), "rank 1's shard of 768 KiB") {
		t.Fatalf("rank 1's create: %v, want ErrArgument over the budget", err)
	}
	s1.Failed = true
	if _, err := r1.call(wire.OpPublish, s1.Encode); err == nil {
		t.Fatal("rank 1's failed publish succeeded")
	}
	if err := <-done; err == nil || !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("rank 0: %v, want the round failed naming rank 1", err)
	}
	if segs := segmentsOf(t, a); len(segs) != 0 {
		t.Errorf("segments after the failed round: %v", segs)
	}
	checkUse(t, r0, a, 0)
}

func TestAgentMemoryBudgetArgument(t *testing.T) {
	_, err := Start(Config{Namespace: testNamespace(), Node: "n1", Socket: filepath.Join(privateTempDir(t), "s.sock"), MemoryBytes: -1})
	if !errors.Is(err, base.ErrArgument) {
		t.Fatalf("Start with a negative budget: %v, want ErrArgument", err)
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1 KiB", 1536 * kib: "1.5 MiB", 8 << 30: "8 GiB", 9*(1<<30) + 200<<20: "9.2 GiB"} {
		if got := formatBytes(n); got != want {
			t.Errorf("formatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
