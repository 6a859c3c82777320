package cli

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ddstore-go/ddstore/internal/schedule"
)

func TestScheduleJSON(t *testing.T) {
	for _, policy := range []string{"random", "solar", "locality"} {
		code, out, errOut := run(t, "schedule", "--n", "2048", "--ranks", "4", "--ranks-per-node", "2", "--batch", "16",
			"--epochs", "10", "--capacity", "1024", "--policy", policy, "--seed", "3", "--json")
		if code != 0 {
			t.Fatalf("%s: exit %d, stderr %q", policy, code, errOut)
		}
		var got map[string]any
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("%s: %v in %q", policy, err, out)
		}
		for _, k := range []string{"policy", "hit_rate_per_epoch", "hit_rate", "storage_reads_min", "storage_reads_max", "seconds",
			"node_local_fraction", "bound"} {
			if _, ok := got[k]; !ok {
				t.Errorf("%s: no key %q in %s", policy, k, out)
			}
		}
		if got["policy"] != policy || len(got["hit_rate_per_epoch"].([]any)) != 10 {
			t.Errorf("%s: %s", policy, out)
		}
		want := map[string]float64{"random": 0.035, "solar": 0.274, "locality": 0.5}[policy]
		if h := got["hit_rate"].(float64); math.Abs(h-want) > 0.03 {
			t.Errorf("%s: hit rate %v, want about %v", policy, h, want)
		}
	}
}

func TestScheduleTable(t *testing.T) {
	code, out, errOut := run(t, "schedule", "--policy", "solar", "--epochs", "3")
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	for _, s := range []string{"policy solar", "hit rate", "storage reads per rank per step", "node-local", "epoch order cost", "planned in"} {
		if !strings.Contains(out, s) {
			t.Errorf("no %q in\n%s", s, out)
		}
	}
}

func TestScheduleBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--capacity", "5000"}, exitArgument, "capacity 5000 above n 2048"},
		{[]string{"--batch", "0"}, exitArgument, "batch 0: want a positive number"},
		{[]string{"--ranks", "6", "--ranks-per-node", "4"}, exitArgument, "ranks per node 4 does not divide ranks 6"},
		{[]string{"--policy", "fifo"}, exitArgument, `policy "fifo"`},
		{[]string{"--n", "ten"}, 2, "ten"},
		{[]string{"--help"}, 0, "Usage: ddstore schedule [flags]"},
	} {
		code, _, errOut := run(t, append([]string{"schedule"}, tc.args...)...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("schedule %v: exit %d, stderr %q; want exit %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}

// readNPY1D reads one 1-d .npy array of int64 ('<i8') or bool ('|b1') from
// the front of b and returns its items as int64 and the rest of b.
func readNPY1D(t *testing.T, b []byte) (descr string, items []int64, rest []byte) {
	t.Helper()
	if len(b) < 10 || string(b[:8]) != "\x93NUMPY\x01\x00" {
		t.Fatalf("not an .npy 1.0 header: %q", b[:min(len(b), 10)])
	}
	hl := int(binary.LittleEndian.Uint16(b[8:10]))
	if (10+hl)%64 != 0 {
		t.Errorf("header of %d bytes: not padded to 64", 10+hl)
	}
	dict := string(b[10 : 10+hl])
	m := regexp.MustCompile(`^\{'descr': '(<i8|\|b1)', 'fortran_order': False, 'shape': \((\d+),\), \} *\n$`).FindStringSubmatch(dict)
	if m == nil {
		t.Fatalf("header %q", dict)
	}
	n, _ := strconv.Atoi(m[2])
	b = b[10+hl:]
	size := map[string]int{"<i8": 8, "|b1": 1}[m[1]]
	if len(b) < n*size {
		t.Fatalf("%d items of %s in %d bytes", n, m[1], len(b))
	}
	for i := range n {
		if size == 8 {
			items = append(items, int64(binary.LittleEndian.Uint64(b[8*i:])))
		} else {
			items = append(items, int64(b[i]))
		}
	}
	return m[1], items, b[n*size:]
}

// TestScheduleEmit: --emit-rank writes each rank's samples and hits of one
// epoch as the schedule package plans them, as .npy arrays and as JSON; the
// ranks of a step together read the global batch.
func TestScheduleEmit(t *testing.T) {
	for _, tc := range []struct {
		policy   schedule.Policy
		n        int
		dropLast bool
	}{
		{schedule.Locality, 38, false}, {schedule.Locality, 38, true}, {schedule.Random, 38, false},
		{schedule.Random, 39, true}, {schedule.Solar, 38, false}, {schedule.Locality, 48, false},
	} {
		c := schedule.Config{Seed: 42, Epochs: 3, N: tc.n, Ranks: 4, RanksPerNode: 2, Batch: 3, Capacity: 16,
			Policy: tc.policy, DropLast: tc.dropLast, SwarmIterations: 100}
		s, err := schedule.New(c)
		if err != nil {
			t.Fatal(err)
		}
		var epochs []*schedule.Epoch
		for e := range s.Epochs() {
			epochs = append(epochs, e)
		}
		for ei, ep := range epochs {
			for r := range c.Ranks {
				args := []string{"schedule", "--n", strconv.Itoa(c.N), "--ranks", "4", "--ranks-per-node", "2",
					"--batch", "3", "--epochs", "3", "--capacity", "16", "--seed", "42", "--policy", string(c.Policy),
					"--iterations", "100", "--emit-rank", strconv.Itoa(r), "--epoch", strconv.Itoa(ei)}
				if c.DropLast {
					args = append(args, "--drop-last")
				}
				where := fmt.Sprintf("%s n=%d drop-last=%v epoch %d rank %d", c.Policy, c.N, c.DropLast, ei, r)
				code, out, errOut := run(t, append(slices.Clone(args), "--emit-hits")...)
				if code != 0 {
					t.Fatalf("%s: exit %d, stderr %q", where, code, errOut)
				}
				d1, samples, rest := readNPY1D(t, []byte(out))
				d2, sizes, rest := readNPY1D(t, rest)
				d3, hits, rest := readNPY1D(t, rest)
				if d1 != "<i8" || d2 != "<i8" || d3 != "|b1" || len(rest) != 0 {
					t.Fatalf("%s: arrays %s %s %s and %d bytes more", where, d1, d2, d3, len(rest))
				}
				if len(sizes) != ep.Steps() || len(hits) != len(samples) {
					t.Fatalf("%s: %d sizes, %d samples, %d hits; want %d steps", where, len(sizes), len(samples), len(hits), ep.Steps())
				}
				k := 0
				for st := range ep.Steps() {
					want, wantHits := ep.Samples(st, r), ep.Hits(st, r)
					if int(sizes[st]) != len(want) {
						t.Fatalf("%s step %d: size %d, want %d", where, st, sizes[st], len(want))
					}
					if c.Policy == schedule.Locality && sizes[st] != 3 {
						t.Errorf("%s step %d: %d samples under locality, want B=3", where, st, sizes[st])
					}
					for i, x := range want {
						if samples[k] != int64(x) || (hits[k] == 1) != wantHits[i] {
							t.Fatalf("%s step %d: sample %d hit %d, want %d %v", where, st, samples[k], hits[k], x, wantHits[i])
						}
						k++
					}
				}
				// Without --emit-hits (planned without replaying under
				// random): the same two arrays, byte for byte, and no hits.
				code, bare, errOut := run(t, args...)
				if code != 0 {
					t.Fatalf("%s without hits: exit %d, stderr %q", where, code, errOut)
				}
				_, _, afterSamples := readNPY1D(t, []byte(out))
				_, _, afterSizes := readNPY1D(t, afterSamples)
				if bare != out[:len(out)-len(afterSizes)] {
					t.Fatalf("%s: without --emit-hits the samples and sizes differ from those with it", where)
				}
				// JSON: the same, and without --emit-hits no hits.
				code, js, errOut := run(t, append(args, "--json")...)
				if code != 0 {
					t.Fatalf("%s --json: exit %d, stderr %q", where, code, errOut)
				}
				var got struct {
					Rank, Epoch, Perm, Steps int
					Samples                  [][]int32
					Hits                     [][]bool
				}
				if err := json.Unmarshal([]byte(js), &got); err != nil {
					t.Fatal(err)
				}
				if got.Rank != r || got.Epoch != ei || got.Perm != ep.Perm || got.Steps != ep.Steps() || got.Hits != nil {
					t.Errorf("%s --json: %s", where, js)
				}
				for st := range ep.Steps() {
					if !slices.Equal(got.Samples[st], ep.Samples(st, r)) {
						t.Errorf("%s --json step %d: %v, want %v", where, st, got.Samples[st], ep.Samples(st, r))
					}
				}
			}
		}
	}
}

// TestScheduleEmitStepsAddUp: the ranks' emitted batches of a step are
// disjoint and make the global batch (n a multiple of the ranks and no
// padding inside a step, so no sample repeats).
func TestScheduleEmitStepsAddUp(t *testing.T) {
	for _, policy := range []string{"random", "solar", "locality"} {
		const ranks, n = 4, 96
		var per [ranks][]int64
		var sizes [ranks][]int64
		for r := range ranks {
			code, out, errOut := run(t, "schedule", "--n", strconv.Itoa(n), "--ranks", strconv.Itoa(ranks), "--ranks-per-node", "2",
				"--batch", "4", "--epochs", "4", "--capacity", "40", "--policy", policy, "--seed", "5",
				"--emit-rank", strconv.Itoa(r), "--epoch", "2")
			if code != 0 {
				t.Fatalf("%s: exit %d, stderr %q", policy, code, errOut)
			}
			var rest []byte
			_, per[r], rest = readNPY1D(t, []byte(out))
			_, sizes[r], rest = readNPY1D(t, rest)
			if len(rest) != 0 {
				t.Fatalf("%s: %d bytes after the arrays without --emit-hits", policy, len(rest))
			}
		}
		s, err := schedule.New(schedule.Config{Seed: 5, Epochs: 4, N: n, Ranks: ranks, RanksPerNode: 2, Batch: 4, Capacity: 40,
			Policy: schedule.Policy(policy)})
		if err != nil {
			t.Fatal(err)
		}
		var ep *schedule.Epoch
		for e := range s.Epochs() {
			if e.Index == 2 {
				ep = e
			}
		}
		var off [ranks]int
		for st := range ep.Steps() {
			var union []int
			for r := range ranks {
				k := int(sizes[r][st])
				for _, x := range per[r][off[r] : off[r]+k] {
					union = append(union, int(x))
				}
				off[r] += k
			}
			var want []int
			for _, x := range ep.Global(st) {
				want = append(want, int(x))
			}
			slices.Sort(union)
			slices.Sort(want)
			if !slices.Equal(union, want) || len(slices.Compact(slices.Clone(union))) != len(union) {
				t.Errorf("%s step %d: ranks read %v, the global batch is %v", policy, st, union, want)
			}
		}
	}
}

func TestScheduleEmitBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--emit-rank", "4"}, exitArgument, "emit-rank 4 not in [0, 4)"},
		{[]string{"--emit-rank", "-1"}, exitArgument, "emit-rank -1 not in [0, 4)"},
		{[]string{"--emit-rank", "0", "--epoch", "10"}, exitArgument, "epoch 10 not in [0, 10)"},
		{[]string{"--emit-rank", "0", "--epoch", "-1"}, exitArgument, "epoch -1 not in [0, 10)"},
		{[]string{"--epoch", "2"}, exitArgument, "--epoch, --emit-hits and --emit-positions go with --emit-rank"},
		{[]string{"--emit-hits"}, exitArgument, "--epoch, --emit-hits and --emit-positions go with --emit-rank"},
		{[]string{"--emit-rank", "0", "--capacity", "5000"}, exitArgument, "capacity 5000 above n 2048"},
		{[]string{"--emit-rank", "0", "--policy", "fifo"}, exitArgument, `policy "fifo"`},
		{[]string{"--emit-positions"}, exitArgument, "--epoch, --emit-hits and --emit-positions go with --emit-rank"},
		{[]string{"--emit-rank", "0", "--resume-epoch", "3", "--epoch", "2"}, exitArgument,
			"epoch 2 not in [3, 10): the run resumes at epoch 3 of 10"},
		{[]string{"--emit-rank", "0", "--resume-position", "2049"}, exitArgument, "resume position 2049 not in [0, 2048]"},
		{[]string{"--emit-rank", "0", "--order-ranks", "2"}, exitArgument, "order ranks 2 with policy locality"},
		{[]string{"--help"}, 0, "--emit-rank"},
		{[]string{"--help"}, 0, "--resume-position"},
	} {
		code, out, errOut := run(t, append([]string{"schedule"}, tc.args...)...)
		if code != tc.code || !strings.Contains(errOut, tc.want) || (code != 0 && out != "") {
			t.Errorf("schedule %v: exit %d, stdout %q, stderr %q; want exit %d and %q", tc.args, code, out, errOut, tc.code, tc.want)
		}
	}
}

// writeNPY1D writes a 1-d .npy array of int64 (descr "<i8") or of another
// integer type's bytes to a file in dir.
func writeNPY1D(t *testing.T, dir, name, descr string, n int, data []byte) string {
	t.Helper()
	var b bytes.Buffer
	w := bufio.NewWriter(&b)
	npyWrite1D(w, descr, n, data)
	w.Flush()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func int64Bytes(xs []int64) []byte {
	var b []byte
	for _, x := range xs {
		b = binary.LittleEndian.AppendUint64(b, uint64(x))
	}
	return b
}

// tokenLengths are n lengths of documents, log-normal with a long tail.
func tokenLengths(n int) []int64 {
	rng := rand.New(rand.NewPCG(1, 2))
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(min(32768, max(16, math.Round(math.Exp(math.Log(512)+rng.NormFloat64())))))
	}
	return out
}

// TestScheduleBytes: --sizes, --offsets and --sizes - (stdin) give the
// summary of the schedule package's byte budget, with its byte figures.
func TestScheduleBytes(t *testing.T) {
	dir := t.TempDir()
	lengths := tokenLengths(3000)
	offsets := make([]int64, len(lengths)+1)
	sizes := make([]int64, len(lengths))
	var total int64
	for i, l := range lengths {
		offsets[i+1] = offsets[i] + l
		sizes[i] = 4 * l
		total += 4 * l
	}
	sizesFile := writeNPY1D(t, dir, "lengths.npy", "<i8", len(lengths), int64Bytes(lengths))
	offsetsFile := writeNPY1D(t, dir, "offsets.npy", "<i8", len(offsets), int64Bytes(offsets))
	var u32 []byte
	for _, l := range lengths {
		u32 = binary.LittleEndian.AppendUint32(u32, uint32(l))
	}
	u32File := writeNPY1D(t, dir, "lengths32.npy", "<u4", len(lengths), u32)
	capa := total / 3
	for _, policy := range []string{"random", "solar", "locality"} {
		for _, pin := range []string{"bytes", "samples"} {
			if policy != "locality" && pin == "samples" {
				continue
			}
			common := []string{"schedule", "--ranks", "8", "--ranks-per-node", "2", "--batch", "8", "--epochs", "3",
				"--policy", policy, "--seed", "4", "--iterations", "50", "--unit-bytes", "4", "--capacity-bytes",
				strconv.FormatInt(capa, 10), "--pin", pin, "--json"}
			outs := map[string]map[string]any{}
			for name, args := range map[string][]string{
				"sizes": {"--sizes", sizesFile}, "offsets": {"--offsets", offsetsFile}, "uint32": {"--sizes", u32File},
				"stdin": {"--sizes", "-"},
			} {
				if name == "stdin" {
					b, err := os.ReadFile(sizesFile)
					if err != nil {
						t.Fatal(err)
					}
					scheduleStdin = bytes.NewReader(b)
				}
				code, out, errOut := run(t, append(slices.Clone(common), args...)...)
				scheduleStdin = os.Stdin
				if code != 0 {
					t.Fatalf("%s %s %s: exit %d, stderr %q", policy, pin, name, code, errOut)
				}
				var got map[string]any
				if err := json.Unmarshal([]byte(out), &got); err != nil {
					t.Fatal(err)
				}
				delete(got, "seconds")
				outs[name] = got
			}
			for _, name := range []string{"offsets", "uint32", "stdin"} {
				if fmt.Sprint(outs[name]) != fmt.Sprint(outs["sizes"]) {
					t.Errorf("%s %s: --%s gives\n%v\n--sizes gives\n%v", policy, pin, name, outs[name], outs["sizes"])
				}
			}
			s, err := schedule.New(schedule.Config{Seed: 4, Epochs: 3, N: len(sizes), Ranks: 8, RanksPerNode: 2, Batch: 8,
				Policy: schedule.Policy(policy), SwarmIterations: 50, Sizes: sizes, CapacityBytes: capa, Pin: schedule.Pin(pin)})
			if err != nil {
				t.Fatal(err)
			}
			sum, got := s.Summarize(), outs["sizes"]
			for k, want := range map[string]float64{
				"n": float64(len(sizes)), "capacity_bytes": float64(capa), "total_bytes": float64(total),
				"hit_rate": sum.HitRate, "sample_bound": sum.Bound, "byte_hit_rate": sum.ByteHitRate, "byte_bound": sum.ByteBound,
				"storage_bytes_min": float64(sum.StorageBytesMin), "storage_bytes_max": float64(sum.StorageBytesMax),
				"storage_bytes_imbalance": sum.StorageBytesImbalance, "imbalance_floor": sum.ImbalanceFloor,
			} {
				if v, ok := got[k].(float64); !ok || v != want {
					t.Errorf("%s %s: %s %v, want %v", policy, pin, k, got[k], want)
				}
			}
			if _, ok := got["capacity"]; ok {
				t.Errorf("%s: a capacity in samples in the summary of a byte budget", policy)
			}
			if policy == "locality" && (got["pinned_bytes"].(float64) > float64(capa) || got["pin"] != pin) {
				t.Errorf("locality %s: pinned %v bytes of %d", pin, got["pinned_bytes"], capa)
			}
		}
	}
	// The summary table names both hit rates and their bounds.
	code, out, errOut := run(t, "schedule", "--sizes", sizesFile, "--capacity-bytes", strconv.FormatInt(capa/4, 10), "--epochs", "2")
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	for _, s := range []string{"sample hit rate", "bound k(M)/N", "byte hit rate", "bound M/S", "pinned:", "imbalance"} {
		if !strings.Contains(out, s) {
			t.Errorf("no %q in\n%s", s, out)
		}
	}
	// Without sizes, no byte figures.
	code, out, _ = run(t, "schedule", "--epochs", "2", "--json")
	if code != 0 || strings.Contains(out, "byte") {
		t.Errorf("exit %d; a budget in samples prints byte figures: %s", code, out)
	}
}

// TestScheduleBytesEmit: under a byte budget --emit-rank adds each step's
// bytes and, with --emit-hits, its bytes from storage, as the schedule
// package plans them.
func TestScheduleBytesEmit(t *testing.T) {
	dir := t.TempDir()
	lengths := tokenLengths(200)
	sizesFile := writeNPY1D(t, dir, "lengths.npy", "<i8", len(lengths), int64Bytes(lengths))
	var total int64
	for _, l := range lengths {
		total += l
	}
	for _, policy := range []schedule.Policy{schedule.Random, schedule.Solar, schedule.Locality} {
		c := schedule.Config{Seed: 42, Epochs: 3, N: len(lengths), Ranks: 4, RanksPerNode: 2, Batch: 5,
			Sizes: lengths, CapacityBytes: total / 2, Policy: policy, SwarmIterations: 100}
		s, err := schedule.New(c)
		if err != nil {
			t.Fatal(err)
		}
		for ei := range c.Epochs {
			ep := s.Epoch(ei)
			for r := range c.Ranks {
				where := fmt.Sprintf("%s epoch %d rank %d", policy, ei, r)
				args := []string{"schedule", "--sizes", sizesFile, "--capacity-bytes", strconv.FormatInt(total/2, 10),
					"--ranks", "4", "--ranks-per-node", "2", "--batch", "5", "--epochs", "3", "--seed", "42",
					"--policy", string(policy), "--iterations", "100", "--emit-rank", strconv.Itoa(r), "--epoch", strconv.Itoa(ei)}
				code, out, errOut := run(t, append(slices.Clone(args), "--emit-hits")...)
				if code != 0 {
					t.Fatalf("%s: exit %d, stderr %q", where, code, errOut)
				}
				_, samples, rest := readNPY1D(t, []byte(out))
				_, counts, rest := readNPY1D(t, rest)
				_, hits, rest := readNPY1D(t, rest)
				d4, stepBytes, rest := readNPY1D(t, rest)
				d5, storage, rest := readNPY1D(t, rest)
				if d4 != "<i8" || d5 != "<i8" || len(rest) != 0 || len(stepBytes) != ep.Steps() || len(storage) != ep.Steps() {
					t.Fatalf("%s: arrays %s %s of %d, %d steps, %d bytes more", where, d4, d5, len(stepBytes), ep.Steps(), len(rest))
				}
				k := 0
				for st := range ep.Steps() {
					var b, sb int64
					for range counts[st] {
						b += lengths[samples[k]]
						if hits[k] == 0 {
							sb += lengths[samples[k]]
						}
						k++
					}
					if stepBytes[st] != ep.Bytes(st, r) || storage[st] != ep.StorageBytes(st, r) || b != stepBytes[st] || sb != storage[st] {
						t.Fatalf("%s step %d: bytes %d, storage %d; the plan's %d, %d; its samples' %d, %d", where, st,
							stepBytes[st], storage[st], ep.Bytes(st, r), ep.StorageBytes(st, r), b, sb)
					}
				}
				// Without --emit-hits: samples, sizes, bytes.
				code, bare, errOut := run(t, args...)
				if code != 0 {
					t.Fatalf("%s: exit %d, stderr %q", where, code, errOut)
				}
				_, bs, rest := readNPY1D(t, []byte(bare))
				_, _, rest = readNPY1D(t, rest)
				_, bb, rest := readNPY1D(t, rest)
				if len(rest) != 0 || !slices.Equal(bs, samples) || !slices.Equal(bb, stepBytes) {
					t.Fatalf("%s: without --emit-hits, other samples or bytes", where)
				}
				code, js, _ := run(t, append(slices.Clone(args), "--emit-hits", "--json")...)
				var got struct{ Bytes, StorageBytes []int64 }
				var raw map[string]json.RawMessage
				if code != 0 || json.Unmarshal([]byte(js), &raw) != nil || json.Unmarshal(raw["bytes"], &got.Bytes) != nil ||
					json.Unmarshal(raw["storage_bytes"], &got.StorageBytes) != nil {
					t.Fatalf("%s --json: exit %d, %s", where, code, js)
				}
				if !slices.Equal(got.Bytes, stepBytes) || !slices.Equal(got.StorageBytes, storage) {
					t.Fatalf("%s --json: bytes %v storage %v, want %v %v", where, got.Bytes, got.StorageBytes, stepBytes, storage)
				}
			}
		}
	}
}

func TestScheduleBytesBadInput(t *testing.T) {
	dir := t.TempDir()
	sizes := writeNPY1D(t, dir, "sizes.npy", "<i8", 4, int64Bytes([]int64{5, 6, 7, 8}))
	down := writeNPY1D(t, dir, "down.npy", "<i8", 4, int64Bytes([]int64{0, 6, 5, 8}))
	from1 := writeNPY1D(t, dir, "from1.npy", "<i8", 3, int64Bytes([]int64{1, 6, 8}))
	neg := writeNPY1D(t, dir, "neg.npy", "<i8", 4, int64Bytes([]int64{5, -6, 7, 8}))
	floats := writeNPY1D(t, dir, "floats.npy", "<f8", 4, int64Bytes([]int64{5, 6, 7, 8}))
	short := filepath.Join(dir, "short.npy")
	b, _ := os.ReadFile(sizes)
	os.WriteFile(short, b[:len(b)-3], 0o644)
	notNPY := filepath.Join(dir, "text.npy")
	os.WriteFile(notNPY, []byte("5 6 7 8\n"), 0o644)
	base := []string{"--ranks", "2", "--batch", "1", "--epochs", "2"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--capacity-bytes", "10"}, "--capacity-bytes goes with --sizes or --offsets"},
		{[]string{"--pin", "samples"}, "--pin goes with --sizes or --offsets"},
		{[]string{"--sizes", sizes}, "--sizes and --offsets go with --capacity-bytes"},
		{[]string{"--sizes", sizes, "--capacity-bytes", "10", "--capacity", "2"}, "--capacity counts samples"},
		{[]string{"--sizes", sizes, "--offsets", sizes, "--capacity-bytes", "10"}, "give one of them"},
		{[]string{"--sizes", sizes, "--capacity-bytes", "10", "--n", "5"}, "holds 4 rows, --n is 5"},
		{[]string{"--sizes", sizes, "--capacity-bytes", "27"}, "capacity bytes 27 above the dataset's 26"},
		{[]string{"--sizes", sizes, "--capacity-bytes", "10", "--unit-bytes", "0"}, "unit bytes 0"},
		{[]string{"--sizes", sizes, "--capacity-bytes", "10", "--pin", "big"}, `pin "big"`},
		{[]string{"--sizes", neg, "--capacity-bytes", "10"}, "size -6 of sample 1"},
		{[]string{"--offsets", down, "--capacity-bytes", "2"}, "offset 5 of row 1 is below the one before, 6"},
		{[]string{"--offsets", from1, "--capacity-bytes", "2"}, "want n+1 offsets from 0"},
		{[]string{"--sizes", floats, "--capacity-bytes", "10"}, "dtype float64: want integers"},
		{[]string{"--sizes", short, "--capacity-bytes", "10"}, "is truncated"},
		{[]string{"--sizes", notNPY, "--capacity-bytes", "10"}, "not a .npy file"},
		{[]string{"--sizes", filepath.Join(dir, "none.npy"), "--capacity-bytes", "10"}, "no such file"},
		{[]string{"--sizes", sizes, "--capacity-bytes", "10", "--emit-rank", "2"}, "emit-rank 2 not in [0, 2)"},
	} {
		code, out, errOut := run(t, append(append([]string{"schedule"}, base...), tc.args...)...)
		if code != exitArgument || !strings.Contains(errOut, tc.want) || out != "" {
			t.Errorf("schedule %v: exit %d, stdout %q, stderr %q; want exit %d and %q", tc.args, code, out, errOut, exitArgument, tc.want)
		}
	}
}

// TestScheduleEmitResume: --emit-positions tells where each step leaves
// the epoch; a run resumed there on other ranks (--resume-epoch,
// --resume-position) deals the positions left, as the package plans it.
func TestScheduleEmitResume(t *testing.T) {
	base := []string{"schedule", "--n", "60", "--batch", "3", "--epochs", "3", "--capacity", "30", "--seed", "5",
		"--emit-rank", "1", "--json"}
	code, out, errOut := run(t, append(slices.Clone(base), "--ranks", "4", "--epoch", "1", "--emit-positions")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var first struct {
		Positions []int `json:"positions"`
	}
	if err := json.Unmarshal([]byte(out), &first); err != nil {
		t.Fatal(err)
	}
	if want := []int{0, 12, 24, 36, 48, 60}; !slices.Equal(first.Positions, want) {
		t.Fatalf("positions %v, want %v", first.Positions, want)
	}
	code, out, errOut = run(t, append(slices.Clone(base), "--ranks", "3", "--epoch", "1", "--resume-epoch", "1",
		"--resume-position", "24", "--emit-positions")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var got struct {
		Samples   [][]int32 `json:"samples"`
		Positions []int     `json:"positions"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	s, err := schedule.New(schedule.Config{Seed: 5, Epochs: 3, N: 60, Ranks: 3, RanksPerNode: 1, Batch: 3, Capacity: 30,
		ResumeEpoch: 1, ResumePosition: 24})
	if err != nil {
		t.Fatal(err)
	}
	ep := s.Epoch(1)
	if len(got.Samples) != ep.Steps() || ep.Steps() != 4 || !slices.Equal(got.Positions, []int{24, 33, 42, 51, 60}) {
		t.Fatalf("resumed at 24 on 3 ranks: %d steps, positions %v; want 4 steps from 24 by 9", len(got.Samples), got.Positions)
	}
	for st := range ep.Steps() {
		if !slices.Equal(got.Samples[st], ep.Samples(st, 1)) {
			t.Fatalf("step %d: %v, the package plans %v", st, got.Samples[st], ep.Samples(st, 1))
		}
	}
}
