package schedule

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden.json and testdata/golden_bytes.json")

const goldenFile = "testdata/golden.json"

// TestGolden pins small schedules of every policy, so that any change to
// what a schedule decides shows up as a diff of testdata/golden.json.
// After a deliberate change: go test ./internal/schedule/ -run TestGolden -update
func TestGolden(t *testing.T) {
	var cs []Config
	for _, p := range Policies {
		cs = append(cs, Config{Seed: 42, Epochs: 3, N: 38, Ranks: 4, RanksPerNode: 2, Batch: 3, Capacity: 16, Policy: p, SwarmIterations: 100})
	}
	checkGolden(t, goldenFile, cs)
}

// TestGoldenBytes pins the same schedules under a byte budget (sizes of
// atomistic structures, memory for 40% of the bytes), both pins under
// locality, in testdata/golden_bytes.json.
func TestGoldenBytes(t *testing.T) {
	sizes := atomisticSizes(42, 38)
	var cs []Config
	for _, p := range Policies {
		c := Config{Seed: 42, Epochs: 3, N: 38, Ranks: 4, RanksPerNode: 2, Batch: 3, Sizes: sizes,
			CapacityBytes: sumSizes(sizes) * 2 / 5, Policy: p, SwarmIterations: 100}
		cs = append(cs, c)
		if p == Locality {
			c.Pin = PinSamples
			cs = append(cs, c)
		}
	}
	checkGolden(t, "testdata/golden_bytes.json", cs)
}

func checkGolden(t *testing.T, goldenFile string, cs []Config) {
	type rank struct {
		Samples []int32 `json:"samples"`
		Hits    string  `json:"hits"` // per sample: H memory on the reader's node, h another node's, . storage
	}
	type epoch struct {
		Perm  int      `json:"perm"`
		Steps [][]rank `json:"steps"`
	}
	type golden struct {
		Config Config  `json:"config"`
		Order  []int   `json:"order"`
		Epochs []epoch `json:"epochs"`
	}
	var all []golden
	for _, c := range cs {
		s := mustNew(t, c)
		g := golden{Config: s.Config(), Order: s.Order()}
		for e := range s.Epochs() {
			ep := epoch{Perm: e.Perm}
			for step := range e.Steps() {
				var ranks []rank
				for r := range c.Ranks {
					var h strings.Builder
					for i, hit := range e.Hits(step, r) {
						switch {
						case hit && e.NodeLocal(step, r)[i]:
							h.WriteByte('H')
						case hit:
							h.WriteByte('h')
						default:
							h.WriteByte('.')
						}
					}
					ranks = append(ranks, rank{Samples: e.Samples(step, r), Hits: h.String()})
				}
				ep.Steps = append(ep.Steps, ranks)
			}
			g.Epochs = append(g.Epochs, ep)
		}
		all = append(all, g)
	}
	got, err := json.MarshalIndent(all, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	if *update {
		if err := os.WriteFile(goldenFile, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(goldenFile)
	if err != nil {
		t.Fatalf("%v: run `go test ./internal/schedule/ -run TestGolden -update` to create it", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the schedules differ from %s: after a deliberate change run `go test ./internal/schedule/ -run TestGolden -update` and review the diff", goldenFile)
	}
}
