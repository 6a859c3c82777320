package agent

import (
	"fmt"
	"testing"
)

// TestGatherPlace: each node's place in the gather tree is the one the
// drops' recursion (dropAlong) gives it, computed naively here: the
// parent of every node, how many children each has and how many nodes
// are below it.
func TestGatherPlace(t *testing.T) {
	var naive func(nodes []int, parent, f int, parents, children, subtree map[int]int)
	naive = func(nodes []int, parent, f int, parents, children, subtree map[int]int) {
		if len(nodes) == 0 {
			return
		}
		size := (len(nodes) + f - 1) / f
		for s := 0; s < len(nodes); s += size {
			e := min(s+size, len(nodes))
			parents[nodes[s]] = parent
			children[parent]++
			subtree[nodes[s]] = e - s - 1
			naive(nodes[s+1:e], nodes[s], f, parents, children, subtree)
		}
	}
	for _, f := range []int{1, 2, 3, 8} {
		for _, k := range []int{1, 2, 5, 8, 9, 17, 64, 127, 200} {
			names := make([]string, k)
			nodes := make([]int, k)
			for i := range k {
				names[i], nodes[i] = fmt.Sprintf("n%03d", i), i
			}
			parents, children, subtree := map[int]int{}, map[int]int{}, map[int]int{}
			naive(nodes, -1, f, parents, children, subtree)
			if children[-1] > f {
				t.Fatalf("f=%d k=%d: the root has %d children", f, k, children[-1])
			}
			for i := range k {
				p, c, below, ok := gatherPlace(names, names[i], f)
				if !ok || p != parents[i] || c != children[i] || len(below) != subtree[i] {
					t.Fatalf("f=%d k=%d node %d: parent %d, %d children, %d below (%v), want %d, %d, %d", f, k, i, p, c, len(below), ok, parents[i], children[i], subtree[i])
				}
			}
		}
	}
	if _, _, _, ok := gatherPlace([]string{"a", "b"}, "c", 8); ok {
		t.Error("a node not in the tree has a place in it")
	}
}
