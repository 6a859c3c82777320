package layout

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"testing/quick"
)

func TestOwnerTable(t *testing.T) {
	l, err := New(Row{Disp: 3, ItemSize: 4}, []int64{2, 0, 3, 1})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		g     int64
		rank  int
		local int64
	}{
		{0, 0, 0}, {1, 0, 1}, {2, 2, 0}, {3, 2, 1}, {4, 2, 2}, {5, 3, 0},
	}
	for _, c := range cases {
		r, loc := l.Owner(c.g)
		if r != c.rank || loc != c.local {
			t.Errorf("Owner(%d) = (%d, %d), want (%d, %d)", c.g, r, loc, c.rank, c.local)
		}
	}
	if l.Total() != 6 || l.Ranks() != 4 || l.Bytes() != 12 || l.First(3) != 5 || l.ShardRows(1) != 0 {
		t.Errorf("geometry: total %d ranks %d bytes %d", l.Total(), l.Ranks(), l.Bytes())
	}
}

func TestCheck(t *testing.T) {
	l, _ := New(Row{Disp: 1, ItemSize: 1}, []int64{4, 4})
	for _, g := range []int64{-1, 8, 1 << 40} {
		err := l.Check(g)
		if !errors.Is(err, ErrIndex) || !strings.Contains(err.Error(), "[0, 8)") {
			t.Errorf("Check(%d) = %v", g, err)
		}
	}
	err := l.CheckAll([]int64{0, 7, -3, 2})
	if !errors.Is(err, ErrIndex) || !strings.Contains(err.Error(), "indices[2] = -3") {
		t.Errorf("CheckAll: %v", err)
	}
	if err := l.CheckAll([]int64{7, 0, 7}); err != nil {
		t.Error(err)
	}
}

func TestNewErrors(t *testing.T) {
	cases := []struct {
		row    Row
		shards []int64
		want   string
	}{
		{Row{0, 4}, []int64{1}, "disp 0"},
		{Row{1, 0}, []int64{1}, "itemsize 0"},
		{Row{1, 65}, []int64{1}, "itemsize 65"},
		{Row{1 << 40, 8}, []int64{1}, "exceeds"},
		{Row{1, 1}, nil, "no shards"},
		{Row{1, 1}, []int64{1, -2}, "rank 1 has -2 rows"},
		{Row{1, 1}, []int64{1 << 62, 1 << 62}, "overflow"},
	}
	for _, c := range cases {
		_, err := New(c.row, c.shards)
		if !errors.Is(err, ErrGeometry) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%v, %v) = %v, want %q", c.row, c.shards, err, c.want)
		}
	}
}

func TestSpans(t *testing.T) {
	l, _ := New(Row{Disp: 1, ItemSize: 1}, []int64{3, 0, 2, 4})
	spans, err := l.Spans(1, 7)
	if err != nil {
		t.Fatal(err)
	}
	want := []Span{{0, 1, 2}, {2, 0, 2}, {3, 0, 3}}
	if len(spans) != len(want) {
		t.Fatalf("Spans = %v, want %v", spans, want)
	}
	for i := range want {
		if spans[i] != want[i] {
			t.Fatalf("Spans = %v, want %v", spans, want)
		}
	}
	if _, err := l.Spans(5, 5); !errors.Is(err, ErrIndex) || !strings.Contains(err.Error(), "[5, 10)") {
		t.Errorf("Spans past end: %v", err)
	}
	if s, err := l.Spans(9, 0); err != nil || s != nil {
		t.Errorf("empty span: %v %v", s, err)
	}
	if _, err := l.Spans(0, -1); !errors.Is(err, ErrIndex) {
		t.Errorf("negative count: %v", err)
	}
}

// naiveOwner walks the shards one by one: the reference Owner must agree with.
func naiveOwner(shards []int64, g int64) (int, int64) {
	for r, n := range shards {
		if g < n {
			return r, g
		}
		g -= n
	}
	return -1, -1
}

func TestOwnerProperty(t *testing.T) {
	f := func(seed uint64, nshards uint8) bool {
		rng := rand.New(rand.NewPCG(seed, 1))
		shards := make([]int64, int(nshards)%16+1)
		for i := range shards {
			if rng.IntN(4) > 0 {
				shards[i] = rng.Int64N(50)
			}
		}
		l, err := New(Row{Disp: 1, ItemSize: 1}, shards)
		if err != nil {
			return false
		}
		for g := int64(0); g < l.Total(); g++ {
			r, loc := l.Owner(g)
			nr, nloc := naiveOwner(shards, g)
			if r != nr || loc != nloc {
				t.Logf("shards %v g %d: got (%d,%d) want (%d,%d)", shards, g, r, loc, nr, nloc)
				return false
			}
		}
		// Spans of any range cover it exactly, in order.
		if l.Total() > 0 {
			start := rng.Int64N(l.Total())
			count := rng.Int64N(l.Total() - start + 1)
			spans, err := l.Spans(start, count)
			if err != nil {
				return false
			}
			g := start
			for _, s := range spans {
				r, loc := l.Owner(g)
				if s.Rank != r || s.Local != loc || s.Count <= 0 || s.Local+s.Count > l.ShardRows(r) {
					return false
				}
				g += s.Count
			}
			if g != start+count {
				return false
			}
		}
		return true
	}
	if err := quick.Check(f, nil); err != nil {
		t.Error(err)
	}
}

func BenchmarkOwner(b *testing.B) {
	l, _ := New(Row{Disp: 1, ItemSize: 1}, []int64{1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000})
	var sink int
	for i := 0; b.Loop(); i++ {
		r, _ := l.Owner(int64(i % 8000))
		sink += r
	}
	_ = sink
}

func TestBacked(t *testing.T) {
	row := Row{Disp: 2, ItemSize: 4}
	l, err := NewBacked(row, []int64{2, 0, 3}, 9)
	if err != nil {
		t.Fatal(err)
	}
	if l.Held() != 5 || l.Total() != 9 {
		t.Fatalf("Held, Total = %d, %d; want 5, 9", l.Held(), l.Total())
	}
	for _, c := range []struct {
		g     int64
		rank  int
		local int64
	}{
		{0, 0, 0}, {1, 0, 1}, {2, 2, 0}, {4, 2, 2}, {5, Backed, 5}, {8, Backed, 8},
	} {
		r, loc := l.Owner(c.g)
		if r != c.rank || loc != c.local {
			t.Errorf("Owner(%d) = %d, %d; want %d, %d", c.g, r, loc, c.rank, c.local)
		}
	}
	if err := l.Check(9); !errors.Is(err, ErrIndex) {
		t.Errorf("Check(9) = %v, want ErrIndex", err)
	}
	if err := l.CheckAll([]int64{0, 8, 9}); err == nil || !strings.Contains(err.Error(), "indices[2] = 9 not in [0, 9)") {
		t.Errorf("CheckAll = %v", err)
	}
	spans, err := l.Spans(3, 5)
	if err != nil {
		t.Fatal(err)
	}
	want := []Span{{Rank: 2, Local: 1, Count: 2}, {Rank: Backed, Local: 5, Count: 3}}
	if !slices.Equal(spans, want) {
		t.Errorf("Spans(3, 5) = %v, want %v", spans, want)
	}
	// All rows in the file, none in memory.
	l, err = NewBacked(row, []int64{0, 0}, 4)
	if err != nil {
		t.Fatal(err)
	}
	if r, loc := l.Owner(0); r != Backed || loc != 0 {
		t.Errorf("Owner(0) of an all-file layout = %d, %d", r, loc)
	}
	if _, err := NewBacked(row, []int64{2, 3}, 4); !errors.Is(err, ErrGeometry) || !strings.Contains(err.Error(), "backing file of 4 rows for shards of 5 rows") {
		t.Errorf("a file shorter than the shards: %v", err)
	}
}
