package agent

import (
	"bytes"
	"context"
	"errors"
	"net"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ddstore-go/ddstore/internal/auth"
	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/shm"
	"github.com/ddstore-go/ddstore/internal/transport"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// TestAgentReadRange: two agents; ranks 0 and 1 on node n1, rank 2 on n2,
// a variable of one-byte rows. A ReadRange from n2 of rows of all three
// ranks copies rank 2's run and fetches ranks 0 and 1's runs, one after the
// other on n1, in one FetchRange; bad ranges and offsets fail, naming them,
// with nothing written.
func TestAgentReadRange(t *testing.T) {
	t.Setenv(auth.SecretEnv, "agent-test-secret-0123456789")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rdv := l.Addr().String()
	l.Close()
	ns := testNamespace()
	a := startAgent(t, Config{Namespace: ns, Node: "n1", Rendezvous: rdv, PeerListen: "127.0.0.1:0"})
	b := startAgent(t, Config{Namespace: ns, Node: "n2", Rendezvous: rdv, PeerListen: "127.0.0.1:0",
		Socket: filepath.Join(privateTempDir(t), "b.sock")})

	shardRows := []int64{5000, 3000, 4000}
	value := func(g int64) byte { return byte(g*7 + g>>8) }
	agents := []*Agent{a, a, b}
	conns := make([]*rawConn, 3)
	for r := range conns {
		conns[r] = dialRaw(t, agents[r])
		conns[r].hello(agents[r], int64(r), 3)
	}
	tables := make([]wire.Table, 3)
	var wg sync.WaitGroup
	var first int64
	for r, n := range shardRows {
		sh := wire.Shard{Name: "recs", Rank: int64(r), Size: 3, Rows: n, Disp: 1, ItemSize: 1, TimeoutMs: 20000, Attempt: 1, Dtype: "uint8"}
		p, err := wire.DecodePath(conns[r].must(wire.OpCreate, sh.Encode))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { shm.Remove(p.Path) })
		seg, err := shm.Open(p.Path, true)
		if err != nil {
			t.Fatal(err)
		}
		for i := range seg.Data {
			seg.Data[i] = value(first + int64(i))
		}
		seg.Close()
		first += n
		wg.Add(1)
		go func() {
			defer wg.Done()
			body, err := conns[r].call(wire.OpPublish, sh.Encode)
			if err == nil {
				tables[r], err = wire.DecodeTable(body)
			}
			if err != nil {
				t.Errorf("publish of rank %d: %v", r, err)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	r := conns[2]
	const size = 12000 + 16
	reg, err := shm.NewRegion("agent-test", size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	rm, err := wire.DecodeRegion(r.must(wire.OpRegister, (&wire.Region{Size: size}).Encode, reg.Fd))
	if err != nil {
		t.Fatal(err)
	}
	id := tables[2].ID
	readRange := func(start, count, offset int64) error {
		m := wire.ReadRange{Name: "recs", Region: rm.ID, ID: id, Start: start, Count: count, Offset: offset}
		_, err := r.call(wire.OpReadRange, m.Encode)
		return err
	}
	fill := func() {
		for i := range reg.Mem {
			reg.Mem[i] = 0xEE
		}
	}
	fetches := a.info().Counters["fetches"] + b.info().Counters["fetches"]
	for _, c := range []struct{ start, count, offset int64 }{
		{1000, 10500, 8}, // ranks 0, 1 (n1: one FetchRange) and 2 (copied)
		{5000, 3000, 0},  // rank 1 alone
		{11999, 1, 100},  // the last row, of this node
		{0, 12000, 16},   // everything, to the region's end
		{700, 0, size},   // no row, at the end
	} {
		fill()
		if err := readRange(c.start, c.count, c.offset); err != nil {
			t.Fatalf("ReadRange %+v: %v", c, err)
		}
		want := bytes.Repeat([]byte{0xEE}, size)
		for i := int64(0); i < c.count; i++ {
			want[c.offset+i] = value(c.start + i)
		}
		if !bytes.Equal(reg.Mem, want) {
			t.Fatalf("region after ReadRange %+v differs", c)
		}
	}
	// One FetchRange per read with rows on n1: ranks 0 and 1's runs are one.
	if got := a.info().Counters["fetches"] + b.info().Counters["fetches"] - fetches; got != 3 {
		t.Errorf("%d fetches for 3 ranges with rows of the other node, want 3", got)
	}
	if got := a.info().Counters["served_rows"]; got != 7000+3000+8000 {
		t.Errorf("n1 served %d rows, want %d", got, 7000+3000+8000)
	}
	fill()
	for _, c := range []struct {
		start, count, offset int64
		sentinel             error
		text                 string
	}{
		{11990, 11, 0, base.ErrIndex, "rows [11990, 12001) not in [0, 12000)"},
		{-1, 2, 0, base.ErrIndex, "global index -1 not in [0, 12000)"},
		{0, -1, 0, base.ErrIndex, "count -1"},
		{0, 100, size - 99, base.ErrBuffer, "rows [0, 100) of 1 bytes go to offset 11917"},
		{0, 10, -1, base.ErrBuffer, "offset -1"},
	} {
		err := readRange(c.start, c.count, c.offset)
		if !errors.Is(err, c.sentinel) || !bytes.Contains([]byte(err.Error()), []byte(c.text)) {
			t.Errorf("ReadRange [%d, +%d) at %d: %v, want %v naming %q", c.start, c.count, c.offset, err, c.sentinel, c.text)
		}
	}
	if !bytes.Equal(reg.Mem, bytes.Repeat([]byte{0xEE}, size)) {
		t.Error("a failed ReadRange wrote into the region")
	}
	if _, err := r.call(wire.OpReadRange, (&wire.ReadRange{Name: "recs", Region: rm.ID, ID: id + 1, Count: 1}).Encode); !errors.Is(err, base.ErrFreed) {
		t.Errorf("ReadRange naming another table id: %v, want ErrFreed", err)
	}
	if err := readRange(0, 1, 0); err != nil {
		t.Fatalf("ReadRange after errors: %v", err)
	}
}

// rowEngine is an engine without range reads (as mpi and fabric): it
// serves each Fetch from data, row by row.
type rowEngine struct {
	transport.Engine
	data    []byte
	rb      int64
	fetches int
}

func (e *rowEngine) Fetch(_ context.Context, _, _ string, _ int64, globals []int64, dst [][]byte) error {
	e.fetches++
	for i, g := range globals {
		copy(dst[i], e.data[g*e.rb:(g+1)*e.rb])
	}
	return nil
}

// TestFetchRangeRowByRow: with an engine that has no range read, a run is
// fetched as a Fetch of its rows, each into its place.
func TestFetchRangeRowByRow(t *testing.T) {
	data := make([]byte, 300)
	for i := range data {
		data[i] = byte(i * 3)
	}
	e := &rowEngine{data: data, rb: 3}
	a := &Agent{rows: e}
	dst := make([]byte, 3*40)
	if err := a.fetchRange(context.Background(), "peer", "v", 1, 50, 40, dst); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst, data[150:270]) || e.fetches != 1 {
		t.Errorf("rows [50, 90) fetched row by row: %d fetches, bytes equal: %v", e.fetches, bytes.Equal(dst, data[150:270]))
	}
	if err := a.fetchRange(context.Background(), "peer", "v", 1, 0, 0, nil); err != nil || e.fetches != 1 {
		t.Errorf("an empty run: %v, %d fetches", err, e.fetches)
	}
}
