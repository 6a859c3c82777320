package schedule

import "math/rand/v2"

// swarmPath orders epochs the way SOLAR's artifact does: a discrete particle
// swarm over open paths (it adapts a swap-sequence PSO for the travelling
// salesman). Every particle starts at one vertex drawn at random, which no
// swap ever moves; the rest of each path is a random shuffle, duplicates
// dropped. Each iteration takes the particle of least best cost as the
// swarm's best, then moves every particle by the swaps that turn its own best
// into it, each applied with probability pBest (α), followed by the swaps
// that turn the swarm's best into it, each with probability gBest (β); a
// particle keeps its new path as its best when it costs strictly less. As in
// the artifact, the swarm's best is read live, so a particle moved earlier in
// an iteration steers the later ones. Unlike the artifact, which returns the
// best of the last iteration's start, the result is the best path found.
func swarmPath(cost [][]int64, population, iterations int, pBest, gBest float64, rng *rand.Rand) ([]int, int64) {
	n := len(cost)
	start := rng.IntN(n)
	rest := make([]int, 0, n-1)
	for v := range n {
		if v != start {
			rest = append(rest, v)
		}
	}
	type particle struct {
		path, best []int
		bestCost   int64
	}
	var swarm []*particle
	seen := map[string]bool{}
	for range population {
		path := append([]int{start}, rest...)
		rng.Shuffle(len(path)-1, func(i, j int) { path[i+1], path[j+1] = path[j+1], path[i+1] })
		key := string(intsKey(path))
		if seen[key] {
			continue
		}
		seen[key] = true
		c := pathCost(cost, path)
		swarm = append(swarm, &particle{path: path, best: append([]int(nil), path...), bestCost: c})
	}
	leader := func() *particle {
		best := swarm[0]
		for _, p := range swarm[1:] {
			if p.bestCost < best.bestCost {
				best = p
			}
		}
		return best
	}

	type swap struct {
		i, j int
		prob float64
	}
	var ops []swap
	into := make([]int, n)
	pos := make([]int, n)
	// swapsFrom appends the swaps that turn a copy of from into path.
	swapsFrom := func(from, path []int, prob float64) {
		copy(into, from)
		for i, v := range into {
			pos[v] = i
		}
		for i := range n {
			if path[i] != into[i] {
				j := pos[path[i]]
				ops = append(ops, swap{i, j, prob})
				into[i], into[j] = into[j], into[i]
				pos[into[i]], pos[into[j]] = i, j
			}
		}
	}
	for range iterations {
		g := leader()
		for _, p := range swarm {
			ops = ops[:0]
			swapsFrom(p.best, p.path, pBest)
			swapsFrom(g.best, p.path, gBest)
			path := append([]int(nil), p.path...)
			for _, op := range ops {
				if rng.Float64() <= op.prob {
					path[op.i], path[op.j] = path[op.j], path[op.i]
				}
			}
			p.path = path
			if c := pathCost(cost, path); c < p.bestCost {
				p.best, p.bestCost = append([]int(nil), path...), c
			}
		}
	}
	g := leader()
	return append([]int(nil), g.best...), g.bestCost
}

func intsKey(p []int) []byte {
	b := make([]byte, 0, 4*len(p))
	for _, v := range p {
		b = append(b, byte(v), byte(v>>8), byte(v>>16), byte(v>>24))
	}
	return b
}
