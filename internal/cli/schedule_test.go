package cli

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
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
		{[]string{"--capacity", "5000"}, 1, "capacity 5000 above n 2048"},
		{[]string{"--batch", "0"}, 1, "batch 0: want a positive number"},
		{[]string{"--ranks", "6", "--ranks-per-node", "4"}, 1, "ranks per node 4 does not divide ranks 6"},
		{[]string{"--policy", "fifo"}, 1, `policy "fifo"`},
		{[]string{"--n", "ten"}, 2, "ten"},
		{[]string{"--help"}, 0, "Usage: ddstore schedule [flags]"},
	} {
		code, _, errOut := run(t, append([]string{"schedule"}, tc.args...)...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("schedule %v: exit %d, stderr %q; want exit %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}
