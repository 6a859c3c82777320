package cli

// `ddstore ingest --offsets`: a ragged pair (the flat values and their
// offsets, as HDF5 datasets or .npy files) into a ragged variable.

import (
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/naming"
	"github.com/ddstore-go/ddstore/internal/source"
	"github.com/ddstore-go/ddstore/internal/tier"
)

// ingestRagged loads this rank's share of the ragged rows of the pair
// (file the values, offsets their offsets) into a new ragged variable,
// read from the file straight into the shard before it is published.
func ingestRagged(cfg ddstore.Config, file, offsets, name string, opt source.Options, capBytes int64, o source.ReadOptions, stdout io.Writer) error {
	values, off, err := openRaggedPair(name, file, offsets, opt)
	if err != nil {
		failRound(cfg, name)
		return err
	}
	defer values.Close()
	ub := source.RowBytes(values)
	held, err := heldRagged(file, off, ub, capBytes)
	if err != nil {
		failRound(cfg, name)
		return err
	}
	total := int64(len(off)) - 1
	s, err := ddstore.Open(cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	ctx, stop := interruptible()
	defer stop()
	lo, hi := shareUnits(off[:held+1], s.Rank(), s.Size())
	units := off[hi] - off[lo]
	fmt.Fprintf(stdout, "ingest %s (offsets %s): %d ragged rows, %d units of shape %v %s (%s); rank %d of %d on node %s loads rows [%d, %d) (%d units) into %q\n",
		file, offsets, total, off[total], values.RowShape(), values.Dtype(), humanBytes(off[total]*ub), s.Rank(), s.Size(), s.Node(), lo, hi, units, name)
	var b *ddstore.Backing
	if held < total {
		b = &ddstore.Backing{File: file, Offsets: offsets, Rows: total}
		fmt.Fprintf(stdout, "capacity %s holds rows [0, %d) of %d: the other %d stay in the file, read from it on demand (and ahead, with Prefetch)\n",
			humanBytes(capBytes), held, total, total-held)
	}
	lengths := make([]int64, hi-lo)
	for i := range lengths {
		lengths[i] = off[lo+int64(i)+1] - off[lo+int64(i)]
	}
	prog := startProgress(stdout, units, ub)
	o.Progress = prog.add
	t0 := time.Now()
	err = s.AddRaggedFrom(name, units*ub, func(dst []byte) error {
		return source.Read(ctx, values, off[lo], units, dst, o)
	}, lengths, ddstore.Dtype(values.Dtype()), b, values.RowShape()...)
	prog.finish()
	if err != nil {
		return err // the add failed on every rank: nothing was made
	}
	if err := commit(s, name, total, nil); err != nil {
		return err
	}
	secs := time.Since(t0).Seconds()
	fmt.Fprintf(stdout, "ingested %q: rows [%d, %d) of %d, %s, in %.2f s: %.2f GB/s\n",
		name, lo, hi, total, humanBytes(units*ub), secs, float64(units*ub)/secs/1e9)
	return nil
}

// openRaggedPair opens and checks the pair as the storage tier takes it
// (values and offsets, neither raw; offsets 1-D integers from 0, never
// decreasing, ending at the values' units) and reads every offset.
func openRaggedPair(name, file, offsets string, opt source.Options) (source.Source, []int64, error) {
	sent, err := naming.CheckRaggedBacking(name, file, offsets, 1, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("ingest: %w", err)
	}
	p, err := naming.ParsePair(sent)
	if err != nil {
		return nil, nil, fmt.Errorf("ingest: %w", err)
	}
	v, err := source.Open(p.Values.String(), opt)
	if err != nil {
		return nil, nil, fmt.Errorf("ingest: ragged values: %w", err)
	}
	ub, dtype := source.RowBytes(v), v.Dtype()
	err = checkIngestItems(file, v)
	v.Close()
	if err != nil {
		return nil, nil, err
	}
	ofs, err := source.Open(p.Offsets.String(), source.Options{})
	if err != nil {
		return nil, nil, fmt.Errorf("ingest: ragged offsets: %w", err)
	}
	n := ofs.Rows()
	ofs.Close()
	if n < 2 {
		return nil, nil, base.Errorf(base.ErrArgument, "ingest: ragged offsets %s: %d offsets: want rows + 1, at least 2 (a file of one row or more)", offsets, n)
	}
	values, ofs, err := tier.OpenRagged(sent, dtype, ub, n-1)
	if err != nil {
		return nil, nil, fmt.Errorf("ingest: %w", err)
	}
	defer ofs.Close()
	off := make([]int64, n)
	if err := tier.ReadOffsets(ofs, 0, off); err != nil {
		values.Close()
		return nil, nil, fmt.Errorf("ingest: ragged offsets %s: %w", offsets, err)
	}
	return values, off, nil
}

// checkIngestItems refuses items the store cannot hold.
func checkIngestItems(file string, src source.Source) error {
	if src.ItemSize() > 64 {
		return base.Errorf(base.ErrGeometry, "ingest: %s has %d-byte items: the store takes items of 1 to 64 bytes", file, src.ItemSize())
	}
	return nil
}

// heldRagged is how many of the ragged rows (offsets off, units of ub
// bytes) the job keeps in memory: all of them, or the first rows whose
// bytes capBytes holds.
func heldRagged(file string, off []int64, ub, capBytes int64) (int64, error) {
	n := int64(len(off)) - 1
	if capBytes == 0 {
		return n, nil
	}
	h := int64(sort.Search(int(n+1), func(g int) bool { return off[g] > capBytes/ub })) - 1
	if capBytes < 0 || h < 1 {
		return 0, base.Errorf(base.ErrArgument, "ingest: --capacity %d bytes holds no row of %s (its first row is %d bytes): want at least one row, or leave --capacity out for all of them",
			capBytes, file, (off[1]-off[0])*ub)
	}
	return h, nil
}

// shareUnits is rank r's rows of the ragged rows of offsets off split over
// p ranks by their units: the rows starting in [r*U/p, (r+1)*U/p) of the
// U units, so that every rank holds about as many bytes.
func shareUnits(off []int64, r, p int) (lo, hi int64) {
	n := len(off) - 1
	at := func(r int) int64 {
		if r == p {
			return int64(n)
		}
		t, _ := share(off[n], r, p)
		return int64(sort.Search(n, func(g int) bool { return off[g] >= t }))
	}
	return at(r), at(r + 1)
}
