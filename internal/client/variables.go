package client

// Variables as a rank sees them: creating one (the collective), mapping
// its node-local shards, looking it up, writing its own shard, freeing it.

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/layout"
	"github.com/ddstore-go/ddstore/internal/naming"
	"github.com/ddstore-go/ddstore/internal/shm"
	"github.com/ddstore-go/ddstore/internal/transport"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// variable is a variable as this rank sees it.
type variable struct {
	mu    sync.RWMutex // read-locked by reads; write-locked by Free; lock order: internal/LOCKS.md
	name  string
	lay   *layout.Layout
	rb    int64
	local [][]byte // per rank: the shard's rows if on this node, else nil
	own   []byte   // this rank's shard, writable
	segs  []*shm.Segment
	// ownSeg maps own; exp is own in the MPI window (Method "mpi"), which
	// then unmaps it once no get can still read it; windowed: the ranks'
	// shards are in their windows, rows of other nodes read from there.
	ownSeg   *shm.Segment
	exp      transport.Exposure
	windowed bool
	nodes    []string // per rank: node id
	// addrs: per rank, its node's peer address as a table said, for
	// direct reads; replaced (never changed in place) when an owner moved
	// (direct.go, readdress), so a read loads it without a lock.
	addrs atomic.Pointer[owners]
	dtype string
	id    int64 // the table's id: reads name it, so a re-created variable is never mixed in
	// backing is the file holding every row, "" for none: rows from
	// lay.Held() on are read from it by the agent.
	backing string
	freed   bool
	// dropped: the agent dropped the variable and this store forgot it
	// (stale.go); a read that acquired it before then looks the name up
	// again.
	dropped bool
	prof    profile
	// rag is set for a ragged variable (ragged.go): its index, mapped
	// from the node's index segment.
	rag *ragged
}

type profile struct {
	calls, rows, bytes, localRows, remoteRows, storageRows, remoteCalls, waitNs, oneSidedRows, directRows atomic.Int64
}

// Init creates a variable whose shard on this rank is nrows zero-filled
// rows of disp items of itemsize bytes. Like Add, every rank calls it.
func (s *Store) Init(name string, nrows, disp, itemsize int64) error {
	return s.Create(name, nil, nrows, disp, itemsize, "", RowError(name, disp, itemsize), nil)
}

// RowError checks a row shape (one check for every way a variable is made:
// positive, itemsize at most 64, no overflow) and names the variable.
func RowError(name string, disp, itemsize int64) error {
	if err := (layout.Row{Disp: disp, ItemSize: itemsize}).Validate(); err != nil {
		return fmt.Errorf("variable %q: %w", name, err)
	}
	return nil
}

// Add creates a variable whose shard on this rank is rows: len(rows) must
// be a whole number of rows of disp items of itemsize bytes. Every rank of
// the job calls Add for the variable (with its own rows, possibly none);
// it returns once every rank has, so a row of any rank can be read right
// after. Ranks that disagree on disp or itemsize all get ErrGeometry.
func (s *Store) Add(name string, rows []byte, disp, itemsize int64) error {
	rb := disp * itemsize
	bad := RowError(name, disp, itemsize)
	switch {
	case bad != nil:
	case int64(len(rows))%rb != 0:
		bad = base.Errorf(base.ErrBuffer, "variable %q: %d bytes is not a whole number of %d-byte rows (disp %d x itemsize %d)", name, len(rows), rb, disp, itemsize)
	default:
		return s.Create(name, rows, int64(len(rows))/rb, disp, itemsize, "", nil, nil)
	}
	return s.Create(name, nil, 0, disp, itemsize, "", bad, nil)
}

// Backing is ddstore.Backing: the file holding every row of a variable
// (File, made absolute) and how many rows it has in all; for a ragged
// variable File names the values and Offsets the offsets.
type Backing struct {
	File    string
	Rows    int64
	Offsets string
}

// Create runs this rank's part of the collective that makes a variable:
// nrows rows of disp items of itemsize bytes (of type dtype, "" for
// untyped), copied from rows unless nil, with a backing file unless b is
// nil. A rank that cannot take part (bad, its local error) still tells the
// coordinator, so that the other ranks fail at once instead of waiting.
func (s *Store) Create(name string, rows []byte, nrows, disp, itemsize int64, dtype string, bad error, b *Backing) error {
	return s.create(name, nrows, disp, itemsize, dtype, bad, b, nil, func(seg *shm.Segment) error { copy(seg.Data, rows); return nil }, len(rows) > 0)
}

// create is Create of either kind: rg declares a ragged shard (nil: fixed
// rows), fill writes the shard's contents into its segment when write.
func (s *Store) create(name string, nrows, disp, itemsize int64, dtype string, bad error, b *Backing, rg *raggedShard, fill func(*shm.Segment) error, write bool) error {
	if err := naming.CheckVariable(name); err != nil {
		return err
	}
	if s.cfg.Reader {
		return base.Errorf(base.ErrArgument, "variable %q: a reader store holds no shard (it reads what another job published)", name)
	}
	if err := s.checkOpen(); err != nil {
		return err
	}
	if bad == nil && nrows < 0 {
		bad = base.Errorf(base.ErrGeometry, "variable %q: %d rows: want >= 0", name, nrows)
	}
	s.mu.Lock()
	_, have := s.mu.vars[name]
	s.mu.attempts[name]++
	attempt := s.mu.attempts[name]
	s.mu.Unlock()
	if have && bad == nil {
		// As any local failure: the other ranks hear of it at once.
		bad = base.Errorf(base.ErrExists, "variable %q already exists", name)
	}
	sh := wire.Shard{Name: s.wireName(name), Rank: int64(s.grp.rank), Size: int64(s.grp.size), Rows: nrows, Disp: disp, ItemSize: itemsize,
		TimeoutMs: s.cfg.PublishTimeout.Milliseconds(), Attempt: attempt, Dtype: dtype, Group: s.wireName("")}
	if b != nil {
		sh.Backing, sh.Total = b.File, b.Rows
	}
	if rg != nil {
		sh.Kind, sh.Items, sh.Shape = wire.KindRagged, rg.items, rg.shape
	}
	fail := func(err error) error {
		sh.Failed = true
		s.request(wire.OpPublish, sh.Encode, s.cfg.PublishTimeout+s.cfg.Timeout)
		return err
	}
	if bad != nil {
		return fail(bad)
	}
	body, err := s.request(wire.OpCreate, sh.Encode, s.cfg.Timeout)
	if err != nil {
		return fail(err)
	}
	p, err := wire.DecodePath(body)
	if err != nil {
		return fail(err)
	}
	if write {
		seg, err := shm.Open(p.Path, true)
		if err != nil {
			return fail(err)
		}
		err = fill(seg)
		seg.Close()
		if err != nil {
			return fail(err)
		}
	}
	body, err = s.request(wire.OpPublish, sh.Encode, s.cfg.PublishTimeout+s.cfg.Timeout)
	if err != nil {
		return err
	}
	t, err := wire.DecodeTable(body)
	if err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.mu.freed, name)
	s.mu.Unlock()
	v, err := s.install(&t, name)
	if err != nil || s.one == nil || v.rag != nil {
		// Ragged rows are read through the agents on every method: MPI
		// gets address rows as row x row bytes (docs/design.md).
		return err
	}
	if err := s.one.expose(v); err != nil {
		s.Free(name)
		return fmt.Errorf("variable %q: method %q: %w", name, MethodMPI, err)
	}
	return nil
}

// install maps the node-local shards of a table and records the variable
// under name (the table's, less its replica group).
func (s *Store) install(t *wire.Table, name string) (*variable, error) {
	lay, err := layout.NewBacked(layout.Row{Disp: t.Disp, ItemSize: t.ItemSize}, t.ShardRows, t.Total)
	if err != nil {
		return nil, err
	}
	v := &variable{name: t.Name, lay: lay, rb: lay.Bytes(), local: make([][]byte, len(t.ShardRows)), nodes: make([]string, len(t.ShardRows)), dtype: t.Dtype, id: t.ID, backing: t.Backing}
	if t.Ragged() {
		if v.rag, err = openRagged(t, lay); err != nil {
			return nil, fmt.Errorf("variable %q: %w", name, err)
		}
		v.segs = append(v.segs, v.rag.index)
	}
	v.addrs.Store(&owners{addrs: tableAddrs(t), at: time.Now()})
	for r := range t.ShardRows {
		v.nodes[r] = t.Nodes[t.RankNode[r]]
		if r >= len(t.Paths) || t.Paths[r] == "" {
			continue
		}
		// A ragged shard is mapped read-only by its rank too: it is never
		// updated, and the agent serves it by the offsets it checked.
		own := s.grp.rank == r && s.hello.Rank >= 0 && v.rag == nil
		seg, err := shm.Open(t.Paths[r], own)
		if err != nil {
			v.unmap()
			return nil, err
		}
		v.segs = append(v.segs, seg)
		if h := seg.Header; seg.Dropped() || h.Rank != int64(r) || h.Rows != t.ShardRows[r] || h.Disp != t.Disp || h.ItemSize != t.ItemSize {
			// The variable was freed since the agent answered, and the
			// path may be a newer variable's segment by now.
			v.unmap()
			return nil, &staleTable{base.Errorf(base.ErrFreed, "variable %q: segment %s is not of the table looked up (freed since)", name, t.Paths[r])}
		}
		v.local[r] = seg.Data
		if own {
			v.own, v.ownSeg = seg.Data, seg
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		v.unmap()
		return nil, base.Errorf(base.ErrClosed, "store closed")
	}
	if old, ok := s.mu.vars[name]; ok {
		v.unmap()
		return old, nil
	}
	s.mu.vars[name] = v
	return v, nil
}

func (v *variable) unmap() {
	for _, seg := range v.segs {
		seg.Close()
	}
	v.segs, v.local, v.own, v.ownSeg = nil, nil, nil, nil
}

// release unmaps v; its own shard, if in an MPI window, once it is out of
// it. The caller holds v.mu.
func (s *Store) release(v *variable) {
	if s.one != nil && v.exp.Exposed() && v.ownSeg != nil {
		own := v.ownSeg
		v.segs = slices.DeleteFunc(v.segs, func(seg *shm.Segment) bool { return seg == own })
		s.one.withdraw(v, func() { own.Close() })
		v.exp = transport.Exposure{}
	}
	v.unmap()
}

// acquire returns a variable read-locked (the caller RUnlocks it), asking
// the agent for its table the first time this rank uses it, and again
// after a read found it dropped (stale.go).
func (s *Store) acquire(name string) (*variable, error) {
	if err := naming.CheckVariable(name); err != nil {
		return nil, err
	}
	for try := 1; ; try++ {
		v, err := s.acquireOnce(name)
		if try < staleTries && (err == nil && v == nil || isStaleTable(err)) {
			continue
		}
		if err == nil && v == nil {
			err = base.Errorf(base.ErrFreed, "variable %q was freed and added again while it was looked up, %d times", name, staleTries)
		}
		return v, err
	}
}

// staleTable is install's refusal of a table whose segments were dropped
// since the agent answered (ErrFreed): acquire asks again.
type staleTable struct{ err error }

func (e *staleTable) Error() string { return e.err.Error() }
func (e *staleTable) Unwrap() error { return e.err }

// isStaleTable is on every read's path: a nil error returns before
// errors.As, whose target would otherwise be allocated each call.
func isStaleTable(err error) bool {
	if err == nil {
		return false
	}
	var st *staleTable
	return errors.As(err, &st)
}

// acquireOnce is one try of acquire: nil and no error for a variable that
// was forgotten as it was acquired.
func (s *Store) acquireOnce(name string) (*variable, error) {
	s.mu.RLock()
	v, ok := s.mu.vars[name]
	closed, freed := s.mu.closed, s.mu.freed[name]
	s.mu.RUnlock()
	switch {
	case closed:
		return nil, base.Errorf(base.ErrClosed, "store of rank %d closed", s.id.Rank)
	case freed && !ok:
		return nil, base.Errorf(base.ErrFreed, "variable %q was freed", name)
	case !ok:
		m := wire.Name{Name: s.wireName(name)}
		body, err := s.request(wire.OpLookup, m.Encode, s.cfg.Timeout)
		if err != nil && errors.Is(err, base.ErrUnknown) && s.cfg.WaitPublished > 0 {
			body, err = s.waitPublished(&m)
		}
		if err != nil {
			return nil, err
		}
		t, err := wire.DecodeTable(body)
		if err != nil {
			return nil, err
		}
		if v, err = s.install(&t, name); err != nil {
			return nil, err
		}
	}
	v.mu.RLock()
	if v.freed {
		v.mu.RUnlock()
		return nil, base.Errorf(base.ErrFreed, "variable %q was freed", name)
	}
	if v.dropped {
		v.mu.RUnlock()
		return nil, nil
	}
	return v, nil
}

// waitPublished looks a variable up until it is published or
// WaitPublished has passed.
func (s *Store) waitPublished(m *wire.Name) ([]byte, error) {
	deadline := time.Now().Add(s.cfg.WaitPublished)
	wait := 10 * time.Millisecond
	for {
		time.Sleep(min(wait, time.Until(deadline)))
		body, err := s.request(wire.OpLookup, m.Encode, s.cfg.Timeout)
		if err == nil || !errors.Is(err, base.ErrUnknown) {
			return body, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("after waiting %v for it to be published: %w", s.cfg.WaitPublished, err)
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

// Update overwrites rows of this rank's own shard from row offset on.
func (s *Store) Update(name string, rows []byte, offset int64) error {
	v, err := s.acquire(name)
	if err != nil {
		return err
	}
	defer v.mu.RUnlock()
	if err := notRagged(v, "Update"); err != nil {
		return err
	}
	if v.own == nil {
		return base.Errorf(base.ErrArgument, "variable %q: rank %d holds no shard to update", name, s.id.Rank)
	}
	if int64(len(rows))%v.rb != 0 {
		return base.Errorf(base.ErrBuffer, "variable %q: %d bytes is not a whole number of %d-byte rows", name, len(rows), v.rb)
	}
	n, have := int64(len(rows))/v.rb, int64(len(v.own))/v.rb
	if offset < 0 || offset > have-n {
		return base.Errorf(base.ErrIndex, "variable %q: update of rows [%d, %d) is outside rank %d's shard of %d rows", name, offset, offset+n, s.id.Rank, have)
	}
	copy(v.own[offset*v.rb:], rows)
	return nil
}

// Shard returns this rank's own shard of a variable, mapped writable: the
// rows written into it are what every rank reads (Update without a copy;
// ingest writes files straight into it). It stays valid until Free or Close.
func (s *Store) Shard(name string) ([]byte, error) {
	v, err := s.acquire(name)
	if err != nil {
		return nil, err
	}
	defer v.mu.RUnlock()
	if err := notRagged(v, "Shard"); err != nil {
		return nil, err
	}
	if v.own == nil {
		return nil, base.Errorf(base.ErrArgument, "variable %q: rank %d holds no shard", name, s.id.Rank)
	}
	return v.own, nil
}

// VarInfo is ddstore.VarInfo, which documents each field; the two are one
// struct type, converted from one to the other.
type VarInfo struct {
	Name      string
	TotalRows int64
	Disp      int64
	ItemSize  int64
	Dtype     string
	ShardRows []int64
	Nodes     []string
	Backing   string
	// BackingOffsets is a ragged variable's offsets dataset.
	BackingOffsets string
	HeldRows       int64
	Ragged         bool
	Shape          []int64
	ShardItems     []int64
	TotalItems     int64
	Bytes          int64
}

// Info describes a variable.
func (s *Store) Info(name string) (VarInfo, error) {
	var in VarInfo
	err := s.read(name, func(v *variable) error {
		in = v.info(name)
		return nil
	})
	return in, err
}

// info describes v, read-locked.
func (v *variable) info(name string) VarInfo {
	in := VarInfo{Name: name, TotalRows: v.lay.Total(), Disp: v.lay.Disp, ItemSize: v.lay.ItemSize, Dtype: v.dtype, Nodes: slices.Clone(v.nodes),
		Backing: v.backing, HeldRows: v.lay.Held()}
	for r := range v.lay.Ranks() {
		in.ShardRows = append(in.ShardRows, v.lay.ShardRows(r))
	}
	in.Bytes = in.TotalRows * v.rb
	if vs, ofs, ok := strings.Cut(v.backing, naming.PairSep); ok {
		in.Backing, in.BackingOffsets = vs, ofs
	}
	if g := v.rag; g != nil {
		// The index holds every row, the backing file's too.
		in.Ragged, in.Shape, in.TotalItems = true, slices.Clone(g.shape), g.off[len(g.off)-1]
		for r := range v.lay.Ranks() {
			in.ShardItems = append(in.ShardItems, g.first[r+1]-g.first[r])
		}
		in.Bytes = in.TotalItems * g.ub
	}
	return in
}

// Profile is ddstore.Profile, which documents it.
type Profile struct {
	Calls       int64         // Get and GetBatch calls
	Rows        int64         // rows read
	Bytes       int64         // bytes read
	LocalRows   int64         // rows read straight from this node's shared memory
	RemoteRows  int64         // rows fetched from other nodes
	StorageRows int64         // rows read from the backing file (by the agent: read ahead, or on demand)
	RemoteCalls int64         // calls that needed other nodes or the backing file
	OneSided    int64         // rows of other nodes read with MPI gets from this process (Method "mpi")
	Direct      int64         // rows of other nodes read straight from their agents (a direct connection)
	Wait        time.Duration // time spent in calls that needed other nodes or the backing file
}

// Profile returns the counters of a variable.
func (s *Store) Profile(name string) (Profile, error) {
	v, err := s.acquire(name)
	if err != nil {
		return Profile{}, err
	}
	defer v.mu.RUnlock()
	p := &v.prof
	return Profile{Calls: p.calls.Load(), Rows: p.rows.Load(), Bytes: p.bytes.Load(), LocalRows: p.localRows.Load(),
		RemoteRows: p.remoteRows.Load(), StorageRows: p.storageRows.Load(), RemoteCalls: p.remoteCalls.Load(), OneSided: p.oneSidedRows.Load(), Direct: p.directRows.Load(), Wait: time.Duration(p.waitNs.Load())}, nil
}

// Free releases a variable on this rank: its reads fail with ErrFreed from
// now on. The shards stay until every rank of the job has freed it (a rank
// that finishes early never takes rows from under the others); then they go
// on every node and the name can be created again. With Method "mpi" it is
// collective over MPI_COMM_WORLD for a variable this store created.
func (s *Store) Free(name string) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	s.mu.Lock()
	v := s.mu.vars[name]
	delete(s.mu.vars, name)
	if v != nil {
		s.mu.freed[name] = true
	}
	s.mu.Unlock()
	if v == nil {
		return base.Errorf(base.ErrUnknown, "variable %q is not in use by rank %d", name, s.id.Rank)
	}
	var berr error
	if v.windowed {
		// Collective (Method "mpi"): this rank's shard leaves the window
		// once every rank is done reading it.
		berr = s.one.barrier()
	}
	v.mu.Lock()
	v.freed = true
	s.release(v)
	v.mu.Unlock()
	if berr != nil {
		return fmt.Errorf("variable %q: %w", name, berr)
	}
	if s.cfg.Reader {
		return nil // a reader holds no share of the variable to give back
	}
	m := wire.Name{Name: s.wireName(name), Rank: int64(s.grp.rank)}
	_, err := s.request(wire.OpFree, m.Encode, 3*s.cfg.Timeout)
	return err
}
