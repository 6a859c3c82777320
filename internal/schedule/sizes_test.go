package schedule

import (
	"math"
	"math/rand/v2"
)

// Size distributions of datasets whose rows differ in size.

// atomisticSizes are the bytes of n atomistic structures of 8 to 256 atoms,
// log-uniform (many small molecules, fewer large cells): per atom 3 float32
// positions, 3 float32 forces and an int64 species, 32 bytes, plus a 64-byte
// header (energy, cell, counts).
func atomisticSizes(seed uint64, n int) []int64 {
	rng := rand.New(rand.NewPCG(seed, 0x61746f6d))
	out := make([]int64, n)
	for i := range out {
		atoms := int64(math.Round(8 * math.Exp(rng.Float64()*math.Log(256.0/8))))
		out[i] = 64 + 32*atoms
	}
	return out
}

// tokenSizes are the bytes of n tokenized documents: lengths log-normal
// (median 512 tokens, σ 1), a long tail cut at 32768 tokens, at least 16;
// 4 bytes a token.
func tokenSizes(seed uint64, n int) []int64 {
	rng := rand.New(rand.NewPCG(seed, 0x746f6b))
	out := make([]int64, n)
	for i := range out {
		t := math.Exp(math.Log(512) + rng.NormFloat64())
		out[i] = 4 * int64(min(32768, max(16, math.Round(t))))
	}
	return out
}

func sumSizes(s []int64) int64 {
	var t int64
	for _, x := range s {
		t += x
	}
	return t
}
