package wire

import (
	"fmt"
	"testing"
)

// benchTable is a variable's table as a client of node 0 gets it: R ranks,
// 8 a node, the node's own 8 ranks with segment paths.
func benchTable(ranks int) Table {
	t := Table{Name: "data", Disp: 4096, ItemSize: 1, ID: 7, ShardRows: make([]int64, ranks), RankNode: make([]int64, ranks), Paths: make([]string, ranks)}
	for r := range ranks {
		t.ShardRows[r], t.RankNode[r] = 256, int64(r/8)
		if r < 8 {
			t.Paths[r] = fmt.Sprintf("/dev/shm/ddstore-ns.data.%d.0123456789abcdef", r)
		}
	}
	for n := range ranks / 8 {
		t.Nodes = append(t.Nodes, fmt.Sprintf("n%03d", n))
		t.Addrs = append(t.Addrs, fmt.Sprintf("127.0.0.1:%d", 40000+n))
	}
	return t
}

// BenchmarkTable is what a rank's Publish reply costs its agent (Encode)
// and its client (DecodeTable), by the job's ranks.
func BenchmarkTable(b *testing.B) {
	for _, ranks := range []int{64, 1024, 8192} {
		t := benchTable(ranks)
		var e Encoder
		t.Encode(&e)
		body := e.Bytes()
		b.Run(fmt.Sprintf("encode/R=%d", ranks), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				var e Encoder
				t.Encode(&e)
			}
		})
		b.Run(fmt.Sprintf("decode/R=%d", ranks), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := DecodeTable(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
