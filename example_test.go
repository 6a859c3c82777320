package ddstore_test

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/agent"
)

// A one-rank job with an agent inside the process: add rows, read a batch.
func Example() {
	dir, _ := os.MkdirTemp("", "ddstore-example-")
	defer os.RemoveAll(dir)
	socket := ddstore.SocketPath(filepath.Join(dir, "run"), "example", "node0")
	a, err := agent.Start(agent.Config{Namespace: "example", Node: "node0", Socket: socket})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()
	s, err := ddstore.Open(ddstore.Config{Namespace: "example", Rank: 0, Size: 1, Node: "node0", Socket: socket})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()

	// 5 rows of 2 int32: row i is (i, 10*i).
	rows := make([]byte, 5*2*4)
	for i := range 5 {
		binary.LittleEndian.PutUint32(rows[i*8:], uint32(i))
		binary.LittleEndian.PutUint32(rows[i*8+4:], uint32(10*i))
	}
	if err := s.Add("pairs", rows, 2, 4); err != nil {
		fmt.Println(err)
		return
	}
	dst := make([]byte, 3*8)
	if err := s.GetBatch("pairs", dst, []int64{4, 1, 4}); err != nil {
		fmt.Println(err)
		return
	}
	for i := range 3 {
		fmt.Println(binary.LittleEndian.Uint32(dst[i*8:]), binary.LittleEndian.Uint32(dst[i*8+4:]))
	}
	info, _ := s.Info("pairs")
	fmt.Println(info.TotalRows, info.Disp, info.ItemSize)
	fmt.Println(s.GetBatch("pairs", dst[:8], []int64{5}))
	// Output:
	// 4 40
	// 1 10
	// 4 40
	// 5 2 4
	// variable "pairs": ddstore: index out of range: indices[0] = 5 not in [0, 5)
}
