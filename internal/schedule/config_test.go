package schedule

import (
	"errors"
	"strings"
	"testing"

	"github.com/ddstore-go/ddstore/internal/base"
)

func okConfig() Config {
	return Config{Seed: 1, Epochs: 3, N: 2048, Ranks: 4, RanksPerNode: 2, Batch: 16, Capacity: 1024}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		name string
		edit func(*Config)
		want string // in the error; "" means valid
	}{
		{"ok", func(c *Config) {}, ""},
		{"default policy is locality", func(c *Config) { c.Policy = "" }, ""},
		{"capacity = n", func(c *Config) { c.Capacity = c.N }, ""},
		{"one global batch", func(c *Config) { c.N, c.Capacity = 64, 64 }, ""},
		{"one rank", func(c *Config) { c.Ranks, c.RanksPerNode, c.Capacity = 1, 1, 1 }, ""},
		{"zero epochs", func(c *Config) { c.Epochs = 0 }, "epochs 0: want a positive number"},
		{"negative n", func(c *Config) { c.N = -5 }, "n -5: want a positive number"},
		{"zero ranks", func(c *Config) { c.Ranks = 0 }, "ranks 0: want a positive number"},
		{"zero ranks per node", func(c *Config) { c.RanksPerNode = 0 }, "ranks per node 0: want a positive number"},
		{"zero batch", func(c *Config) { c.Batch = 0 }, "batch 0: want a positive number"},
		{"negative capacity", func(c *Config) { c.Capacity = -1 }, "capacity -1: want a positive number"},
		{"zero capacity", func(c *Config) { c.Capacity = 0 }, "capacity 0: want a positive number"},
		{"capacity above n", func(c *Config) { c.Capacity = 4096 }, "capacity 4096 above n 2048"},
		{"global batch above n", func(c *Config) { c.Batch = 1000 }, "batch 1000 × ranks 4 = 4000 above n 2048"},
		{"ranks per node does not divide", func(c *Config) { c.RanksPerNode = 3 }, "ranks per node 3 does not divide ranks 4"},
		{"unknown policy", func(c *Config) { c.Policy = "lru" }, `policy "lru": want one of "random", "solar", "locality"`},
		{"random buffer under one sample", func(c *Config) { c.Policy, c.Capacity = Random, 3 }, "capacity 3 below ranks 4"},
		{"solar buffer under one sample", func(c *Config) { c.Policy, c.Capacity = Solar, 2 }, "capacity 2 below ranks 4"},
		{"locality with less memory than ranks", func(c *Config) { c.Capacity = 2 }, ""},
		{"swarm population", func(c *Config) { c.Policy, c.SwarmPopulation = Solar, -1 }, "swarm population -1"},
		{"swarm iterations", func(c *Config) { c.Policy, c.SwarmIterations = Solar, -2 }, "swarm iterations -2"},
		{"swarm alpha", func(c *Config) { c.Policy, c.SwarmPBest = Solar, 1.5 }, "swarm α 1.5"},
		{"swarm beta", func(c *Config) { c.Policy, c.SwarmGBest = Solar, -0.1 }, "swarm β -0.1"},
		{"swarm ignored elsewhere", func(c *Config) { c.SwarmIterations = -2 }, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := okConfig()
			tc.edit(&c)
			err := c.Validate()
			_, newErr := New(c)
			if tc.want == "" {
				if err != nil || newErr != nil {
					t.Fatalf("Validate: %v, New: %v", err, newErr)
				}
				return
			}
			if err == nil || newErr == nil {
				t.Fatalf("Validate: %v, New: %v; want an error with %q", err, newErr, tc.want)
			}
			if !errors.Is(err, base.ErrArgument) {
				t.Errorf("%v does not wrap base.ErrArgument", err)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "ddstore: bad argument: schedule: ") {
				t.Errorf("error %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	s, err := New(Config{Epochs: 4, N: 100, Ranks: 2, RanksPerNode: 1, Batch: 5, Capacity: 10, Policy: Solar})
	if err != nil {
		t.Fatal(err)
	}
	c := s.Config()
	if c.SwarmPopulation != 4 || c.SwarmIterations != 1000 || c.SwarmPBest != 0.9 || c.SwarmGBest != 1 {
		t.Errorf("swarm defaults: %+v, want population = epochs, 1000 iterations, α 0.9, β 1 (SOLAR's artifact)", c)
	}
	if s, _ := New(okConfig()); s.Config().Policy != Locality {
		t.Errorf("default policy %q, want locality", s.Config().Policy)
	}
}
