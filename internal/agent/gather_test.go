package agent

import (
	"fmt"
	"testing"
)

// TestGatherPlace: each node's place in the gather tree is the one the
// drops' recursion (dropAlong) gives it, computed naively here: the
// parent of every node, and how many children each has.
func TestGatherPlace(t *testing.T) {
	var naive func(nodes []int, parent, f int, parents, children map[int]int)
	naive = func(nodes []int, parent, f int, parents, children map[int]int) {
		if len(nodes) == 0 {
			return
		}
		size := (len(nodes) + f - 1) / f
		for s := 0; s < len(nodes); s += size {
			e := min(s+size, len(nodes))
			parents[nodes[s]] = parent
			children[parent]++
			naive(nodes[s+1:e], nodes[s], f, parents, children)
		}
	}
	for _, f := range []int{1, 2, 3, 8} {
		for _, k := range []int{1, 2, 5, 8, 9, 17, 64, 127, 200} {
			names := make([]string, k)
			nodes := make([]int, k)
			for i := range k {
				names[i], nodes[i] = fmt.Sprintf("n%03d", i), i
			}
			parents, children := map[int]int{}, map[int]int{}
			naive(nodes, -1, f, parents, children)
			if children[-1] > f {
				t.Fatalf("f=%d k=%d: the root has %d children", f, k, children[-1])
			}
			for i := range k {
				p, c, ok := gatherPlace(names, names[i], f)
				if !ok || p != parents[i] || c != children[i] {
					t.Fatalf("f=%d k=%d node %d: parent %d, %d children (%v), want %d, %d", f, k, i, p, c, ok, parents[i], children[i])
				}
			}
		}
	}
	if _, _, ok := gatherPlace([]string{"a", "b"}, "c", 8); ok {
		t.Error("a node not in the tree has a place in it")
	}
}
