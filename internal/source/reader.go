package source

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ddstore-go/ddstore/internal/base"
)

// Piece is a run of rows read with one ReadRows call.
type Piece struct{ Start, Count int64 }

// DefaultPieceBytes is the size of one read: large, so that a read costs
// far more than the call and the rows of a few readers still interleave.
const DefaultPieceBytes = 16 << 20

// Plan splits rows [start, start+count) into pieces of whole chunks of
// chunkRows rows, about pieceBytes each (at least one chunk): every piece
// begins and ends on a multiple of chunkRows except where the range itself
// begins and ends, so no chunk is read by two pieces. It is a function of
// its arguments alone.
func Plan(start, count, chunkRows, rowBytes, pieceBytes int64) []Piece {
	if count <= 0 {
		return nil
	}
	chunkRows = max(chunkRows, 1)
	rowBytes = max(rowBytes, 1)
	if pieceBytes <= 0 {
		pieceBytes = DefaultPieceBytes
	}
	chunks := max(1, pieceBytes/rowBytes/chunkRows)
	step := chunkRows * chunks
	if step/chunks != chunkRows { // overflow: one piece
		return []Piece{{start, count}}
	}
	end := start + count
	var pieces []Piece
	for at := start; at < end; {
		next := (at/step + 1) * step // the next boundary after at
		if next <= at || next > end {
			next = end
		}
		pieces = append(pieces, Piece{at, next - at})
		at = next
	}
	return pieces
}

// ReadOptions tune Read.
type ReadOptions struct {
	// Workers is the number of goroutines reading at once; default 4.
	Workers int
	// PieceBytes is the size of one read, rounded to whole chunks;
	// default DefaultPieceBytes.
	PieceBytes int64
	// Progress, when set, is called with the rows of each piece read, from
	// the reading goroutines (it must be safe for concurrent use).
	Progress func(rows int64)
}

// Read reads rows [start, start+count) of src into dst (exactly count
// rows) with several goroutines, each reading whole pieces of Plan. It
// returns once every goroutine has stopped: at the first error the others
// stop after their current piece, and so they do when ctx ends.
func Read(ctx context.Context, src Source, start, count int64, dst []byte, o ReadOptions) error {
	rb := RowBytes(src)
	if start < 0 || count < 0 || start > src.Rows() || count > src.Rows()-start {
		return base.Errorf(base.ErrIndex, "read of rows [%d, %d) outside [0, %d)", start, start+count, src.Rows())
	}
	if int64(len(dst)) != count*rb {
		return base.Errorf(base.ErrBuffer, "destination of %d bytes for %d rows of %d bytes: want %d", len(dst), count, rb, count*rb)
	}
	pieces := Plan(start, count, src.ChunkRows(), rb, o.PieceBytes)
	workers := o.Workers
	if workers <= 0 {
		workers = 4
	}
	workers = min(workers, len(pieces))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next  atomic.Int64
		done  atomic.Int64
		once  sync.Once
		first error
		wg    sync.WaitGroup
	)
	fail := func(err error) {
		once.Do(func() { first = err })
		cancel()
	}
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(len(pieces)) || ctx.Err() != nil {
					return
				}
				p := pieces[i]
				off := (p.Start - start) * rb
				if err := src.ReadRows(p.Start, p.Count, dst[off:off+p.Count*rb]); err != nil {
					fail(err)
					return
				}
				done.Add(1)
				if o.Progress != nil {
					o.Progress(p.Count)
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		return first
	}
	if done.Load() < int64(len(pieces)) {
		err := context.Cause(ctx)
		sentinel := base.ErrClosed
		if errors.Is(err, context.DeadlineExceeded) {
			sentinel = base.ErrTimeout
		}
		return fmt.Errorf("%w: read of rows [%d, %d) stopped after %d of %d pieces: %w", sentinel, start, start+count, done.Load(), len(pieces), err)
	}
	return nil
}
