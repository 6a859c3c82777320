// Package layout is the geometry of a variable: how its rows are split into
// one shard per rank, where each global row lives, and how batches of global
// indices are grouped by owner. It is pure arithmetic: no I/O, no locks.
package layout

import (
	"fmt"

	"github.com/ddstore-go/ddstore/internal/base"
)

// The errors of this package are the shared sentinels.
var (
	ErrIndex    = base.ErrIndex
	ErrGeometry = base.ErrGeometry
)

// MaxRowBytes bounds one row so that offsets never overflow and a typo
// (disp and itemsize swapped with nrows) fails early.
const MaxRowBytes = 1 << 40

// Row is the shape of one row: disp items of itemsize bytes.
type Row struct {
	Disp     int64
	ItemSize int64
}

// Bytes is the size of one row.
func (r Row) Bytes() int64 { return r.Disp * r.ItemSize }

// Validate checks that the shape is positive and bounded.
func (r Row) Validate() error {
	if r.Disp < 1 {
		return fmt.Errorf("%w: disp %d: want >= 1", ErrGeometry, r.Disp)
	}
	if r.ItemSize < 1 || r.ItemSize > 64 {
		return fmt.Errorf("%w: itemsize %d: want 1..64", ErrGeometry, r.ItemSize)
	}
	if r.Disp > MaxRowBytes/r.ItemSize {
		return fmt.Errorf("%w: row of %d items of %d bytes exceeds %d bytes", ErrGeometry, r.Disp, r.ItemSize, int64(MaxRowBytes))
	}
	return nil
}

// Layout maps global row indices to (rank, local row) for one variable. The
// global index space is the shards concatenated in rank order, then, for a
// variable with a backing file, the rows only that file holds: the shards
// hold the file's first Held rows, the file all Total of them.
type Layout struct {
	Row
	prefix []int64 // prefix[r] = first global row of rank r; prefix[P] = rows held
	total  int64   // rows in all: prefix[P], or more with a backing file
}

// Backed is the owner Owner names for a row that only the backing file
// holds.
const Backed = -1

// New builds a layout from the number of rows of each rank's shard.
func New(row Row, shardRows []int64) (*Layout, error) {
	if err := row.Validate(); err != nil {
		return nil, err
	}
	if len(shardRows) == 0 {
		return nil, fmt.Errorf("%w: no shards", ErrGeometry)
	}
	prefix := make([]int64, len(shardRows)+1)
	for r, n := range shardRows {
		if n < 0 {
			return nil, fmt.Errorf("%w: rank %d has %d rows: want >= 0", ErrGeometry, r, n)
		}
		if prefix[r] > (1<<62)-n {
			return nil, fmt.Errorf("%w: total rows overflow at rank %d", ErrGeometry, r)
		}
		prefix[r+1] = prefix[r] + n
	}
	return &Layout{Row: row, prefix: prefix, total: prefix[len(shardRows)]}, nil
}

// NewBacked builds the layout of a variable whose backing file holds total
// rows, of which the shards hold the first (their sum, at most total);
// total 0 means no backing file (New).
func NewBacked(row Row, shardRows []int64, total int64) (*Layout, error) {
	l, err := New(row, shardRows)
	if err != nil || total == 0 {
		return l, err
	}
	if total < l.Held() || total > 1<<62 {
		return nil, fmt.Errorf("%w: backing file of %d rows for shards of %d rows: want at least as many", ErrGeometry, total, l.Held())
	}
	l.total = total
	return l, nil
}

// Ranks is the number of shards.
func (l *Layout) Ranks() int { return len(l.prefix) - 1 }

// Total is the number of global rows, those of the backing file included.
func (l *Layout) Total() int64 { return l.total }

// Held is the number of rows the shards hold: rows [Held, Total) are read
// from the backing file.
func (l *Layout) Held() int64 { return l.prefix[len(l.prefix)-1] }

// ShardRows is the number of rows of rank r's shard.
func (l *Layout) ShardRows(r int) int64 { return l.prefix[r+1] - l.prefix[r] }

// First is the first global row of rank r.
func (l *Layout) First(r int) int64 { return l.prefix[r] }

// Check returns ErrIndex, naming the index and the valid range, unless g is a
// global row.
func (l *Layout) Check(g int64) error {
	if g < 0 || g >= l.Total() {
		return fmt.Errorf("%w: global index %d not in [0, %d)", ErrIndex, g, l.Total())
	}
	return nil
}

// Owner returns the rank that holds global row g and its row inside that
// shard, or Backed and g (its row in the file) for a row only the backing
// file holds. g must have passed Check. Ranks with empty shards never own a
// row.
func (l *Layout) Owner(g int64) (rank int, local int64) {
	p := l.prefix
	if g >= p[len(p)-1] {
		return Backed, g
	}
	// The last r with prefix[r] <= g; binary search over P+1 prefix sums.
	lo, hi := 0, len(p)-1
	for hi-lo > 1 {
		mid := int(uint(lo+hi) >> 1)
		if p[mid] <= g {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, g - p[lo]
}

// Span is a run of consecutive global rows that one rank owns (Rank is
// Backed, and Local the first row in the file, for rows of the backing file).
type Span struct {
	Rank  int
	Local int64 // first row inside the rank's shard
	Count int64
}

// Spans splits the contiguous range [start, start+count) into per-owner runs,
// in order. It checks the range first.
func (l *Layout) Spans(start, count int64) ([]Span, error) {
	if count < 0 {
		return nil, fmt.Errorf("%w: count %d: want >= 0", ErrIndex, count)
	}
	if count == 0 {
		return nil, nil
	}
	if err := l.Check(start); err != nil {
		return nil, err
	}
	if count > l.Total()-start {
		return nil, fmt.Errorf("%w: rows [%d, %d) not in [0, %d)", ErrIndex, start, start+count, l.Total())
	}
	var spans []Span
	g, end := start, start+count
	for g < end {
		r, local := l.Owner(g)
		n := end - g
		if r != Backed {
			n = min(end, l.prefix[r+1]) - g
		}
		spans = append(spans, Span{Rank: r, Local: local, Count: n})
		g += n
	}
	return spans, nil
}

// CheckAll validates every index of a batch before any is read, so a bad
// index leaves nothing half-done. It names the first bad index and its
// position.
func (l *Layout) CheckAll(indices []int64) error {
	total := l.Total()
	for i, g := range indices {
		if uint64(g) >= uint64(total) {
			return fmt.Errorf("%w: indices[%d] = %d not in [0, %d)", ErrIndex, i, g, total)
		}
	}
	return nil
}
