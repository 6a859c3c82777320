package cli

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
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
		{[]string{"--epoch", "2"}, exitArgument, "--epoch and --emit-hits go with --emit-rank"},
		{[]string{"--emit-hits"}, exitArgument, "--epoch and --emit-hits go with --emit-rank"},
		{[]string{"--emit-rank", "0", "--capacity", "5000"}, exitArgument, "capacity 5000 above n 2048"},
		{[]string{"--emit-rank", "0", "--policy", "fifo"}, exitArgument, `policy "fifo"`},
		{[]string{"--help"}, 0, "--emit-rank"},
	} {
		code, out, errOut := run(t, append([]string{"schedule"}, tc.args...)...)
		if code != tc.code || !strings.Contains(errOut, tc.want) || (code != 0 && out != "") {
			t.Errorf("schedule %v: exit %d, stdout %q, stderr %q; want exit %d and %q", tc.args, code, out, errOut, tc.code, tc.want)
		}
	}
}
