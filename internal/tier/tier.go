// Package tier is the storage tier of a variable on one node: a variable
// may have a backing file that holds all its rows, of which the shards
// hold the first. The node's agent reads the others from the file for its
// clients — on demand, sorted and coalesced by position in the file so that
// rows of one chunk (or close together) cost one read; and ahead of use,
// into a bounded staging area, when a client says what its next steps will
// read (Prefetch, from the schedule). The agent gives a Tier what it needs
// of it through Config: its memory budget, its goroutines, its counters.
package tier

import (
	"cmp"
	"context"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/source"
)

// Tier tuning.
const (
	// gapBytes: two wanted rows at most this far apart in a file without
	// chunks of its own are read in one piece (reading the gap costs less
	// than another request), and such files' read unit.
	gapBytes = 16 << 10
	// staleAfter: a row read ahead and left unread this long is evicted
	// when staging is full. Younger rows are not: what was read ahead
	// first is needed first, so a full staging area drops new requests
	// rather than evict rows about to be read (Belady: evict what is
	// needed last).
	staleAfter = 10 * time.Second
	// lateWindow: a prefetch of a row read on demand less than this long
	// ago came too late and is dropped (an epoch reads each row once).
	lateWindow = time.Second
	// maxRunBytes bounds one read, and so its scratch buffer.
	maxRunBytes = 16 << 20
	// tierReaders is how many reads of one request run at once.
	tierReaders = 4
	// DefaultStagingBytes is the staging memory of a tiered variable when
	// Config.StagingBytes is zero.
	DefaultStagingBytes = 256 << 20
)

// Open opens the backing file of a variable with rows of rb bytes of
// dtype ("" for untyped) and total rows, checking that it holds them.
func Open(spec, dtype string, rb, total int64) (source.Source, error) {
	src, err := source.Open(spec, source.Options{RowBytes: rb, Dtype: dtype, ChunkBytes: gapBytes})
	if err != nil {
		return nil, err
	}
	if src.Rows() < total {
		src.Close()
		return nil, base.Errorf(base.ErrGeometry, "backing file %s has %d rows: the variable has %d", spec, src.Rows(), total)
	}
	return src, nil
}

// Counters are what the tiers of an agent count, for its info and
// metrics: rows read from backing files (on demand and ahead), the reads
// that moved them (fewer: coalesced), their bytes (wanted rows and what
// lay between), rows served from staging, rows read ahead, asked-for rows
// not read ahead for want of room, asked-for rows already read on demand,
// staged rows evicted unused, and failed reads.
type Counters struct {
	Rows, Reads, Bytes                atomic.Int64
	Staged, Prefetched, Dropped, Late atomic.Int64
	Evicted, Errors                   atomic.Int64
}

// Config is what a Tier needs of its agent.
type Config struct {
	Name     string // the variable's
	Spec     string // the backing file (FILE, FILE:DATASET; a ragged pair)
	Dtype    string
	RowBytes int64
	// Offsets, for a ragged variable, are the node's index: its N+1
	// offsets in units, row g being units [Offsets[g], Offsets[g+1]) of
	// the values dataset; RowBytes is then the bytes of a unit. Nil for
	// fixed rows.
	Offsets []int64
	// Held is how many rows the shards hold (the file's first), Total all.
	Held, Total int64
	// StagingBytes is the memory for rows read ahead; 0:
	// DefaultStagingBytes. It is charged through Admit at the first
	// Prefetch.
	StagingBytes int64
	// Admit charges n bytes of staging to the agent's memory budget (what
	// names them for its error); release gives them back.
	Admit func(n int64, what func(size string) string) (release func(), err error)
	// Go starts the prefetcher as a goroutine the agent owns; it returns
	// once Context ends or the tier closes. Timeout bounds one batch of it.
	Go      func(func())
	Context context.Context
	Timeout time.Duration
	// Counters are the agent's; shared by its tiers.
	Counters *Counters
}

// Tier is the storage tier of one variable on this node.
type Tier struct {
	cfg          Config
	c            *Counters
	name, spec   string
	dtype        string
	rb           int64
	held, total  int64
	stagingLimit int64
	off          []int64 // a ragged variable's offsets; nil: fixed rows

	// rw guards src: read-locked while the file is read, write-locked to
	// close it (a read of a freed variable fails, never crashes). Never
	// held with mu; lock order: internal/LOCKS.md.
	rw      sync.RWMutex
	src     source.Source
	openErr error
	closed  bool
	unit    int64 // rows read together: the file's chunk

	scratch sync.Pool // *[]byte of maxRunBytes at most

	// capBytes is the staging room in bytes; 0 until the first prefetch
	// (t.mu). Fixed rows take slots of one row out of one arena; ragged
	// rows take buffers of a power of two bytes, kept by size class for
	// the next rows of that class, while the buffers made add up to at
	// most capBytes (t.mu.made).
	capBytes int64
	// mu guards the staging area; Config.Admit is called under it (lock
	// order: internal/LOCKS.md).
	mu struct {
		sync.Mutex
		staged map[int64]*stagedRow // by row
		fifo   []*stagedRow         // in the order staged, for eviction
		free   [][]byte             // staging slots not in use (fixed rows)
		// classes are the free buffers of ragged rows, by size class
		// (a buffer of class c holds 1<<c bytes); made their bytes and
		// those in use.
		classes [][][]byte
		made    int64
		queue   []int64 // rows to prefetch, not yet started
		// queued holds the rows of queue still wanted: a demand read of a
		// queued row takes it out, so that the prefetcher does not read
		// it a second time.
		queued map[int64]struct{}
		// queuedBytes are the bytes of the queued rows, bounded by
		// capBytes.
		queuedBytes int64
		// recent holds the rows read on demand, unannounced, in the last
		// lateWindow, in order: a prefetch of one of them arrived after
		// its read (the loader ran ahead of the sampler's announcement)
		// and is ignored, not read a second time. Rows read after their
		// announcement are not in it: announced again, they are wanted
		// again (the next epoch).
		recent     map[int64]time.Time
		recentFIFO []int64
		stopped    bool
	}
	wake chan struct{}
}

// stagedRow is a row being read ahead, or read ahead and not yet used.
type stagedRow struct {
	row  int64
	buf  []byte
	done chan struct{} // closed once buf is filled (or err set)
	err  error
	// Under t.mu: ready once done is closed; claimed once out of the
	// staged map (a reader took it, or it was evicted); released once its
	// reader is done with buf. The slot goes back to the free list when
	// the row is ready and unclaimed-evicted, or ready and released.
	ready, claimed, released bool
	at                       time.Time // when it became ready
}

// New makes the tier of a variable; the file is opened at the first read.
func New(cfg Config) *Tier {
	limit := cfg.StagingBytes
	if limit == 0 {
		limit = DefaultStagingBytes
	}
	tr := &Tier{cfg: cfg, c: cfg.Counters, name: cfg.Name, spec: cfg.Spec, dtype: cfg.Dtype, rb: cfg.RowBytes,
		held: cfg.Held, total: cfg.Total, stagingLimit: limit, off: cfg.Offsets, wake: make(chan struct{}, 1)}
	tr.mu.staged = make(map[int64]*stagedRow)
	tr.mu.queued = make(map[int64]struct{})
	tr.mu.recent = make(map[int64]time.Time)
	return tr
}

// source opens the file on first use; the caller holds t.rw read-locked.
func (t *Tier) source() (source.Source, error) {
	if t.closed {
		return nil, base.Errorf(base.ErrFreed, "variable %q was freed", t.name)
	}
	if t.src != nil || t.openErr != nil {
		return t.src, t.openErr
	}
	t.rw.RUnlock()
	t.rw.Lock()
	if t.src == nil && t.openErr == nil && !t.closed {
		t.src, t.openErr = t.open()
		if t.openErr == nil {
			t.unit = max(1, t.src.ChunkRows())
		} else {
			t.openErr = fmt.Errorf("variable %q: %w", t.name, t.openErr)
		}
	}
	t.rw.Unlock()
	t.rw.RLock()
	if t.closed {
		return nil, base.Errorf(base.ErrFreed, "variable %q was freed", t.name)
	}
	return t.src, t.openErr
}

// open opens the file: a ragged variable's values (its offsets, checked
// when it was added, are in the node's index already).
func (t *Tier) open() (source.Source, error) {
	if t.off == nil {
		return Open(t.spec, t.dtype, t.rb, t.total)
	}
	values, offsets, err := OpenPair(t.spec, t.dtype, t.rb, t.total)
	if err != nil {
		return nil, err
	}
	offsets.Close()
	return values, nil
}

// span is where file row g lies in the source's rows: units [lo, hi) of a
// ragged variable's values, [g, g+1) for fixed rows.
func (t *Tier) span(g int64) (lo, hi int64) {
	if t.off == nil {
		return g, g + 1
	}
	return t.off[g], t.off[g+1]
}

// rowBytes is the size of file row g.
func (t *Tier) rowBytes(g int64) int64 {
	lo, hi := t.span(g)
	return (hi - lo) * t.rb
}

// Close stops the prefetcher and closes the file once no read is using it.
func (t *Tier) Close() {
	t.mu.Lock()
	t.mu.stopped = true
	t.mu.queue = nil
	clear(t.mu.queued)
	t.mu.queuedBytes = 0
	t.mu.Unlock()
	t.poke()
	t.rw.Lock()
	t.closed = true
	if t.src != nil {
		t.src.Close()
		t.src = nil
	}
	t.rw.Unlock()
}

func (t *Tier) poke() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// Read fills dst[i] with file row rows[i] (every one in [held, total)):
// from staging where a prefetch got there first (waiting for one in
// progress), else from the file.
func (t *Tier) Read(ctx context.Context, rows []int64, dst [][]byte) error {
	var waits []int
	var hits []*stagedRow
	miss := make([]int, 0, len(rows))
	now := time.Now()
	t.mu.Lock()
	for i, g := range rows {
		if e := t.mu.staged[g]; e != nil {
			delete(t.mu.staged, g)
			e.claimed = true
			waits = append(waits, i)
			hits = append(hits, e)
		} else {
			miss = append(miss, i)
			// Read now: not again ahead. A row neither staged nor queued
			// was read before its announcement came, if one comes: noted,
			// so that it is not read a second time then. A row that was
			// announced is not noted: its next announcement is of another
			// use (the next epoch's, read again soon on a short epoch).
			if !t.unqueueLocked(g) {
				t.noteReadLocked(g, now)
			}
		}
	}
	t.mu.Unlock()
	var waitErr error
	for k, i := range waits {
		e := hits[k]
		if waitErr == nil {
			select {
			case <-e.done:
			case <-ctx.Done():
				waitErr = ctx.Err()
			}
		}
		if waitErr == nil && e.err == nil {
			copy(dst[i], e.buf)
			t.c.Staged.Add(1)
		} else if waitErr == nil {
			miss = append(miss, i)
		}
		t.release(e)
	}
	if waitErr != nil {
		return base.Errorf(base.ErrTimeout, "variable %q: waiting for rows read ahead: %v", t.name, waitErr)
	}
	if len(miss) == 0 {
		return nil
	}
	return t.readPicked(ctx, rows, dst, miss)
}

// ReadAny reads rows of any owner (the node holding them is gone) from the
// file, in any order.
func (t *Tier) ReadAny(ctx context.Context, rows []int64, dst [][]byte) error {
	pick := make([]int, len(rows))
	for i := range pick {
		pick[i] = i
	}
	return t.readPicked(ctx, rows, dst, pick)
}

// readPicked reads rows[i] into dst[i] for each i of pick (which it
// reorders) from the file, sorted by row as readFile wants them.
func (t *Tier) readPicked(ctx context.Context, rows []int64, dst [][]byte, pick []int) error {
	slices.SortFunc(pick, func(x, y int) int { return cmp.Compare(rows[x], rows[y]) })
	sr := make([]int64, len(pick))
	sd := make([][]byte, len(pick))
	for k, i := range pick {
		sr[k], sd[k] = rows[i], dst[i]
	}
	return t.readFile(ctx, sr, sd)
}

// unqueueLocked takes row g out of the rows queued to be read ahead, if
// it is there (and says whether it was); the caller holds t.mu.
func (t *Tier) unqueueLocked(g int64) bool {
	_, ok := t.mu.queued[g]
	if ok {
		delete(t.mu.queued, g)
		t.mu.queuedBytes -= t.rowBytes(g)
	}
	return ok
}

// noteReadLocked records that row g was read at now, and forgets the reads
// older than lateWindow; the caller holds t.mu.
func (t *Tier) noteReadLocked(g int64, now time.Time) {
	f := t.mu.recentFIFO
	for len(f) > 0 && now.Sub(t.mu.recent[f[0]]) > lateWindow {
		delete(t.mu.recent, f[0])
		f = f[1:]
	}
	if _, ok := t.mu.recent[g]; !ok {
		f = append(f, g)
	}
	t.mu.recent[g] = now
	t.mu.recentFIFO = f
}

// release gives back the slot of a staged row a reader claimed, once the
// reader is done with it: now if the prefetch is over, else when the
// prefetcher finishes it.
func (t *Tier) release(e *stagedRow) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e.released = true
	if e.ready {
		t.freeLocked(e)
	}
}

// run is a stretch of wanted rows read with one request: rows[lo:hi] of a
// sorted list, covering file rows [first, last].
type run struct{ lo, hi int }

// readFile reads sorted rows (repeats allowed) from the file into dst,
// coalescing rows of one chunk, or close together, into one read, several
// reads at once.
func (t *Tier) readFile(ctx context.Context, rows []int64, dst [][]byte) error {
	t.rw.RLock()
	defer t.rw.RUnlock()
	src, err := t.source()
	if err != nil {
		return err
	}
	runs := t.plan(rows)
	var wg sync.WaitGroup
	errs := make([]error, len(runs))
	next := make(chan int, len(runs))
	for i := range runs {
		next <- i
	}
	close(next)
	for range min(tierReaders, len(runs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if ctx.Err() != nil {
					errs[i] = ctx.Err()
					continue
				}
				errs[i] = t.readRun(src, rows[runs[i].lo:runs[i].hi], dst[runs[i].lo:runs[i].hi])
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.c.Errors.Add(1)
			return fmt.Errorf("variable %q: reading backing file %s: %w", t.name, t.spec, err)
		}
	}
	return nil
}

// plan cuts sorted rows into runs: a run goes on while the next row
// starts in the same chunk as the last ends or within gapBytes of it, up
// to maxRunBytes (a ragged row larger than that is a run of its own). It
// works in the source's rows: a fixed row is one, a ragged row its units.
func (t *Tier) plan(rows []int64) []run {
	gap := max(1, gapBytes/t.rb)
	maxUnits := max(1, maxRunBytes/t.rb)
	var runs []run
	lo := 0
	start, _ := t.span(rows[0])
	for i := 1; i <= len(rows); i++ {
		if i < len(rows) {
			_, pe := t.span(rows[i-1])
			s, e := t.span(rows[i])
			near := s/t.unit == max(pe-1, 0)/t.unit || s-pe < gap
			if near && e-start <= maxUnits {
				continue
			}
			start = s
		}
		runs = append(runs, run{lo, i})
		lo = i
	}
	return runs
}

// readRun reads file rows [rows[0], rows[len-1]] in one request and copies
// out the wanted ones.
func (t *Tier) readRun(src source.Source, rows []int64, dst [][]byte) error {
	first, _ := t.span(rows[0])
	_, end := t.span(rows[len(rows)-1])
	n := end - first
	if rows[0] == rows[len(rows)-1] {
		// One row (maybe asked for more than once): straight into dst.
		if err := src.ReadRows(first, n, dst[0]); err != nil {
			return err
		}
		for k := 1; k < len(rows); k++ {
			copy(dst[k], dst[0])
		}
	} else {
		size := int(n * t.rb)
		bp, _ := t.scratch.Get().(*[]byte)
		if bp == nil || cap(*bp) < size {
			b := make([]byte, size)
			bp = &b
		}
		buf := (*bp)[:size]
		err := src.ReadRows(first, n, buf)
		if err == nil {
			for k, g := range rows {
				lo, hi := t.span(g)
				copy(dst[k], buf[(lo-first)*t.rb:(hi-first)*t.rb])
			}
		}
		t.scratch.Put(bp)
		if err != nil {
			return err
		}
	}
	t.c.Reads.Add(1)
	t.c.Rows.Add(int64(len(rows)))
	t.c.Bytes.Add(n * t.rb)
	return nil
}

// Prefetch queues rows in [held, total) to be read ahead into staging, as
// many as it has room for; the others are left to be read on demand.
func (t *Tier) Prefetch(rows []int64) error {
	t.mu.Lock()
	if t.mu.stopped {
		t.mu.Unlock()
		return base.Errorf(base.ErrFreed, "variable %q was freed", t.name)
	}
	if t.capBytes == 0 {
		if err := t.startLocked(); err != nil {
			t.mu.Unlock()
			return err
		}
	}
	n := 0
	now := time.Now()
	for _, g := range rows {
		if _, ok := t.mu.queued[g]; ok || g < t.held || t.mu.staged[g] != nil {
			continue
		}
		size := t.rowBytes(g)
		if size == 0 {
			continue // an empty ragged row: nothing to read
		}
		if at, ok := t.mu.recent[g]; ok && now.Sub(at) <= lateWindow {
			t.c.Late.Add(1) // it was read already
			continue
		}
		if t.mu.queuedBytes+size > t.capBytes {
			t.c.Dropped.Add(1)
			continue
		}
		t.mu.queue = append(t.mu.queue, g)
		t.mu.queued[g] = struct{}{}
		t.mu.queuedBytes += size
		n++
	}
	t.mu.Unlock()
	if n > 0 {
		t.poke()
	}
	return nil
}

// startLocked allocates the staging slots, within the agent's memory
// budget (Config.Admit), and starts the prefetcher; the caller holds t.mu.
func (t *Tier) startLocked() error {
	var n int64
	if t.off == nil {
		slots := min(t.stagingLimit/t.rb, t.total-t.held)
		if slots < 1 {
			return base.Errorf(base.ErrArgument, "variable %q: a staging area of %d bytes holds no row of %d bytes", t.name, t.stagingLimit, t.rb)
		}
		n = slots * t.rb
	} else {
		// As many bytes as the rows only the file holds, at most.
		n = min(t.stagingLimit, max(1, (t.off[t.total]-t.off[t.held])*t.rb))
	}
	unbudget, err := t.cfg.Admit(n, func(size string) string {
		return fmt.Sprintf("staging of %s for rows of %q read ahead", size, t.name)
	})
	if err != nil {
		return err
	}
	if t.off == nil {
		arena := make([]byte, n)
		slots := n / t.rb
		t.mu.free = make([][]byte, 0, slots)
		for i := range slots {
			t.mu.free = append(t.mu.free, arena[i*t.rb:(i+1)*t.rb:(i+1)*t.rb])
		}
	} else {
		t.mu.classes = make([][][]byte, 64)
	}
	t.capBytes = n
	t.cfg.Go(func() {
		defer unbudget()
		t.prefetcher()
	})
	return nil
}

// prefetcher reads queued rows into staging slots until the tier closes or
// the agent stops.
func (t *Tier) prefetcher() {
	for {
		select {
		case <-t.wake:
		case <-t.cfg.Context.Done():
			return
		}
		for {
			batch := t.takeQueued()
			if batch == nil {
				break
			}
			rows := make([]int64, len(batch))
			dst := make([][]byte, len(batch))
			for i, e := range batch {
				rows[i], dst[i] = e.row, e.buf
			}
			ctx, cancel := context.WithTimeout(t.cfg.Context, t.cfg.Timeout)
			err := t.readFile(ctx, rows, dst)
			cancel()
			t.mu.Lock()
			now := time.Now()
			for _, e := range batch {
				e.err, e.ready, e.at = err, true, now
				close(e.done)
				if e.released || (err != nil && !e.claimed) {
					// Its reader gave up waiting, or there is nothing to
					// serve: the slot is free again.
					if !e.claimed {
						delete(t.mu.staged, e.row)
						e.claimed = true
					}
					t.freeLocked(e)
				}
			}
			t.mu.Unlock()
			if err == nil {
				t.c.Prefetched.Add(int64(len(batch)))
			}
		}
		t.mu.Lock()
		stopped := t.mu.stopped
		t.mu.Unlock()
		if stopped {
			return
		}
	}
}

// takeQueued moves up to 1024 queued rows into staging slots (evicting the
// oldest unused staged rows when none is free) and returns them sorted by
// row, or nil when nothing is queued or the tier is stopping.
func (t *Tier) takeQueued() []*stagedRow {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mu.stopped || len(t.mu.queue) == 0 {
		return nil
	}
	take := t.mu.queue[:min(1024, len(t.mu.queue))]
	var batch []*stagedRow
	for _, g := range take {
		if _, ok := t.mu.queued[g]; !ok || t.mu.staged[g] != nil {
			continue // read on demand meanwhile, or already staged
		}
		t.unqueueLocked(g)
		buf := t.slotLocked(t.rowBytes(g))
		if buf == nil {
			t.c.Dropped.Add(1)
			continue
		}
		e := &stagedRow{row: g, buf: buf, done: make(chan struct{})}
		t.mu.staged[g] = e
		t.mu.fifo = append(t.mu.fifo, e)
		batch = append(batch, e)
	}
	t.mu.queue = t.mu.queue[len(take):]
	if len(t.mu.queue) == 0 {
		t.mu.queue = nil
	}
	slices.SortFunc(batch, func(x, y *stagedRow) int { return cmp.Compare(x.row, y.row) })
	return batch
}

// slotLocked returns a free staging buffer of size bytes, evicting the
// oldest staged rows while they have waited unread for staleAfter; nil
// when there is none.
func (t *Tier) slotLocked(size int64) []byte {
	for {
		if b := t.takeLocked(size); b != nil {
			return b
		}
		f := t.mu.fifo
		for len(f) > 0 && f[0].claimed {
			f = f[1:]
		}
		t.mu.fifo = f
		if len(f) == 0 || !f[0].ready || time.Since(f[0].at) < staleAfter {
			return nil
		}
		e := f[0]
		t.mu.fifo = f[1:]
		delete(t.mu.staged, e.row)
		e.claimed = true
		t.freeLocked(e)
		t.c.Evicted.Add(1)
	}
}

// takeLocked returns a free buffer of size bytes, or nil: a slot of the
// arena for fixed rows; for ragged rows one of the size's class, else a
// new one while the buffers made stay within capBytes (free buffers of
// other classes are let go to make room).
func (t *Tier) takeLocked(size int64) []byte {
	if t.off == nil {
		if len(t.mu.free) == 0 {
			return nil
		}
		b := t.mu.free[len(t.mu.free)-1]
		t.mu.free = t.mu.free[:len(t.mu.free)-1]
		return b
	}
	c := bits.Len64(uint64(size - 1))
	if fl := t.mu.classes[c]; len(fl) > 0 {
		t.mu.classes[c] = fl[:len(fl)-1]
		return fl[len(fl)-1][:size]
	}
	for t.mu.made+int64(1)<<c > t.capBytes {
		k := slices.IndexFunc(t.mu.classes, func(fl [][]byte) bool { return len(fl) > 0 })
		if k < 0 {
			return nil
		}
		fl := t.mu.classes[k]
		t.mu.made -= int64(cap(fl[len(fl)-1]))
		fl[len(fl)-1] = nil
		t.mu.classes[k] = fl[:len(fl)-1]
	}
	t.mu.made += int64(1) << c
	return make([]byte, size, int64(1)<<c)
}

// freeLocked puts e's buffer back on its free list.
func (t *Tier) freeLocked(e *stagedRow) {
	if e.buf == nil {
		return
	}
	if t.off == nil {
		t.mu.free = append(t.mu.free, e.buf)
	} else {
		c := bits.Len64(uint64(cap(e.buf) - 1))
		t.mu.classes[c] = append(t.mu.classes[c], e.buf)
	}
	e.buf = nil
}
