package agent

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/layout"
	"github.com/ddstore-go/ddstore/internal/naming"
	"github.com/ddstore-go/ddstore/internal/shm"
	"github.com/ddstore-go/ddstore/internal/tier"
	"github.com/ddstore-go/ddstore/internal/transport"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// variable is one variable as this node holds it: the segments of the local
// ranks' shards and, once every rank has published, the job-wide table.
type variable struct {
	name string
	// mu is read-locked while rows are read out of the segments (served to
	// a peer or copied for a client) and write-locked to unmap them; taken
	// after Agent.mu (lock order: internal/LOCKS.md).
	mu     sync.RWMutex
	table  *wire.Table
	lay    *layout.Layout
	segs   map[int]*shm.Segment // local ranks' shards
	byRank []*shm.Segment       // after publish: segment per rank, nil off this node
	gone   bool
	// ready is closed once the table is set: a peer may ask for rows of a
	// variable whose round completed but whose reply has not reached this
	// agent yet (another rank's Add returned first).
	ready     chan struct{}
	readyShut bool // ready is closed (v.mu held to change)
	// published mirrors table != nil without v.mu, which a peer transfer
	// may hold for a while: a second Add of the name fails at once.
	published atomic.Bool
	// change is the number of the manifest change that set table
	// (manifestSaves.change): a rank's Add returns once a save covers it.
	change uint64
	// creators are the client processes of the local shards not yet
	// published (orphans.go).
	creators creators
	// tier reads the rows only the backing file holds; nil without one.
	tier *tier.Tier
	// exposed are the local shards exposed for one-sided reads (in this
	// agent's MPI window, or registered with libfabric), by rank, and rows
	// the engine that exposed them. Set with the table, withdrawn before
	// the segments are unmapped (release).
	exposed map[int]transport.Exposure
	rows    transport.Engine
	// rag is set with the table of a ragged variable; index is the node's
	// index of its rows (ragged.go), built once after publication under
	// indexMu, which is taken before v.mu and never under another lock.
	rag     *ragged
	index   *shm.Segment
	indexMu sync.Mutex
	// enc is the table as this node's clients get it (clientTable).
	enc atomic.Pointer[encodedTable]
	// frees gathers the node's ranks' frees so that they go to the
	// coordinator together (gatherFree): ranks are those that freed, g
	// the gathering under way and want how many it waits for.
	frees struct {
		mu    sync.Mutex // a leaf (lock order: internal/LOCKS.md)
		ranks map[int64]bool
		g     *gathering[wire.Name]
		want  int
	}
}

func newVariable(name string) *variable {
	return &variable{name: name, segs: make(map[int]*shm.Segment), ready: make(chan struct{})}
}

// setTable installs the published table; the caller holds v.mu.
func (v *variable) setTable(a *Agent, t *wire.Table) error {
	if v.table != nil {
		return nil
	}
	node := a.cfg.Node
	lay, err := layout.NewBacked(layout.Row{Disp: t.Disp, ItemSize: t.ItemSize}, t.ShardRows, t.Total)
	if err != nil {
		return err
	}
	byRank := make([]*shm.Segment, len(t.ShardRows))
	for r, n := range t.RankNode {
		if t.Nodes[n] != node {
			continue
		}
		seg := v.segs[r]
		if seg == nil {
			// Every local rank's shard exists before the round completes, so
			// a missing one was freed here while other nodes keep theirs.
			return base.Errorf(base.ErrFreed, "variable %q: rank %d's shard on node %q was freed", v.name, r, node)
		}
		byRank[r] = seg
	}
	if t.Ragged() {
		for r, seg := range byRank {
			if seg == nil {
				continue
			}
			if h := seg.Header; h.Kind != shm.KindRagged || h.Items != t.ShardItems[r] {
				return base.Errorf(base.ErrGeometry, "variable %q: rank %d's shard holds %s rows of %d units; the table says ragged rows of %d", v.name, r, h.Kind, h.Items, t.ShardItems[r])
			}
			if err := seg.CheckOffsets(0); err != nil {
				return fmt.Errorf("variable %q: rank %d's shard: %w", v.name, r, err)
			}
		}
		v.rag = newRagged(t)
	}
	v.table, v.lay, v.byRank = t, lay, byRank
	v.expose(a)
	if t.Backing != "" && !t.Ragged() {
		// A ragged variable's tier reads by the node's index: it is made
		// with the index (ensureIndex).
		v.tier = tier.New(tier.Config{Name: t.Name, Spec: t.Backing, Dtype: t.Dtype, RowBytes: t.Disp * t.ItemSize,
			Held: lay.Held(), Total: t.Total, StagingBytes: a.cfg.StagingBytes, Admit: a.admitStaging,
			Go: a.go_, Context: a.ctx, Timeout: a.cfg.Timeout, Counters: &a.stats.tier})
	}
	v.published.Store(true)
	v.change = a.saves.change()
	v.wake()
	return nil
}

// wake releases peers waiting for the table: it is set, or will never be
// (the variable was dropped or taken back). The caller holds v.mu.
func (v *variable) wake() {
	if !v.readyShut {
		close(v.ready)
		v.readyShut = true
	}
}

// clientTable is localTable encoded, as every client of this node gets
// it (Publish, Lookup): encoded once per table and index and shared by the
// node's ranks, rather than copied and encoded again, O(R) each, for each
// of them. The caller holds v.mu (read or write).
func (v *variable) clientTable() []byte {
	if c := v.enc.Load(); c != nil && c.table == v.table && c.index == v.index {
		return c.b
	}
	var e wire.Encoder
	v.localTable().Encode(&e)
	v.enc.Store(&encodedTable{table: v.table, index: v.index, b: e.Bytes()})
	return e.Bytes()
}

// encodedTable is a variable's clientTable, of the table and index it was
// made from.
type encodedTable struct {
	table *wire.Table
	index *shm.Segment
	b     []byte
}

// localTable is the table with the segment paths of this node's ranks, as
// a client of this node needs it.
func (v *variable) localTable() *wire.Table {
	t := *v.table
	t.Paths = make([]string, len(t.ShardRows))
	for r, seg := range v.byRank {
		if seg != nil {
			t.Paths[r] = seg.Path
		}
	}
	if v.index != nil {
		t.Index = v.index.Path
	}
	return &t
}

// unmap unmaps every local segment and leaves the files (an agent stopping
// with Persist); the caller holds no lock on v.
func (v *variable) unmap() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.tier != nil {
		v.tier.Close()
	}
	for r, seg := range v.segs {
		v.release(r, seg)
	}
	if v.index != nil {
		v.index.Close()
		v.index = nil
	}
	v.segs, v.byRank, v.gone = map[int]*shm.Segment{}, nil, true
	v.wake()
}

// drop unmaps and removes every local segment; the caller holds no lock on
// v (it takes the write lock, so it waits for rows being served). Each
// segment is marked dropped first: a client (a reader of another job
// above all) still maps it, and its rows stay readable there after the
// unlink; the mark tells the client they are a freed variable's, before
// the Free that dropped them returns and so before the name can be added
// again.
func (v *variable) drop() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.tier != nil {
		// First: a ragged variable's tier reads by the index unmapped
		// below; Close waits for its reads in flight.
		v.tier.Close()
	}
	for _, seg := range v.segs {
		seg.MarkDropped()
	}
	if v.index != nil {
		v.index.MarkDropped()
	}
	for r, seg := range v.segs {
		v.release(r, seg)
		shm.Remove(seg.Path)
	}
	if v.index != nil {
		v.index.Close()
		shm.Remove(v.index.Path)
		v.index = nil
	}
	v.segs, v.byRank, v.gone = map[int]*shm.Segment{}, nil, true
	v.wake()
}

func (v *variable) info() VarInfo {
	v.mu.RLock()
	defer v.mu.RUnlock()
	vi := VarInfo{Name: v.name, Published: v.table != nil}
	for r, seg := range v.segs {
		vi.LocalRanks = append(vi.LocalRanks, r)
		vi.LocalBytes += seg.Bytes()
		vi.Disp, vi.ItemSize = seg.Header.Disp, seg.Header.ItemSize
	}
	if v.index != nil {
		vi.IndexBytes = v.index.Bytes()
	}
	slices.Sort(vi.LocalRanks)
	if t := v.table; t != nil {
		vi.Disp, vi.ItemSize, vi.TotalRows, vi.Dtype = t.Disp, t.ItemSize, v.lay.Total(), t.Dtype
		vi.ShardRows, vi.Backing, vi.HeldRows = t.ShardRows, t.Backing, v.lay.Held()
		if vs, ofs, ok := strings.Cut(t.Backing, naming.PairSep); ok {
			vi.Backing, vi.BackingOffsets = vs, ofs
		}
		for _, n := range t.RankNode {
			vi.Owners = append(vi.Owners, t.Nodes[n])
		}
		vi.Kind = t.Kind.String()
		vi.TableBytes = tableBytes(t, len(v.byRank))
		if t.Ragged() {
			vi.Shape, vi.ShardItems = t.Shape, t.ShardItems
			for _, n := range t.ShardItems {
				vi.TotalBytes += n * t.Disp * t.ItemSize
			}
			if v.index != nil && t.Backing != "" {
				// The index holds every row, the backing file's too.
				vi.TotalBytes = v.index.Header.Items * t.Disp * t.ItemSize
			}
		} else {
			vi.TotalBytes = v.lay.Total() * v.lay.Bytes()
		}
	}
	vi.RowBytes = vi.Disp * vi.ItemSize
	if vi.Kind == "ragged" {
		vi.RowBytes = 0 // rows have sizes of their own
	}
	return vi
}

// tableBytes is the memory a variable's table takes on this node, the
// part that grows with the job: its per-rank and per-node slices with
// their strings, the layout's prefix sums and the segment per rank.
func tableBytes(t *wire.Table, byRank int) int64 {
	const word, str = 8, 16 // an int64; a string header
	n := word * int64(len(t.ShardRows)+len(t.RankNode)+len(t.ShardItems)+len(t.Shape))
	for _, ss := range [][]string{t.Nodes, t.Addrs, t.Paths} {
		for _, s := range ss {
			n += str + int64(len(s))
		}
	}
	n += word * int64(len(t.ShardRows)+1) // layout prefix sums
	return n + word*int64(byRank)
}

func sortVarInfos(vs []VarInfo) {
	sort.Slice(vs, func(i, j int) bool { return vs[i].Name < vs[j].Name })
}

// regions are the receive buffers clients registered: memfd regions this
// agent has mapped, where rows fetched from other nodes are written.
type regions struct {
	mu   sync.RWMutex // guards next and m; never held while a region's mu is taken (internal/LOCKS.md)
	next uint32
	m    map[uint32]*region
}

type region struct {
	mu    sync.RWMutex // read-locked while rows are written in; write-locked to unmap; lock order: internal/LOCKS.md
	mem   []byte
	owner *session
}

func (rs *regions) add(mem []byte, owner *session) uint32 {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.next++
	rs.m[rs.next] = &region{mem: mem, owner: owner}
	return rs.next
}

// use returns a region read-locked; the caller RUnlocks it.
func (rs *regions) use(id uint32) (*region, error) {
	rs.mu.RLock()
	r := rs.m[id]
	rs.mu.RUnlock()
	if r == nil {
		return nil, base.Errorf(base.ErrRegion, "region %d (unregistered, or its client disconnected)", id)
	}
	r.mu.RLock()
	if r.mem == nil {
		r.mu.RUnlock()
		return nil, base.Errorf(base.ErrRegion, "region %d was unregistered", id)
	}
	return r, nil
}

func (rs *regions) remove(id uint32, owner *session) error {
	rs.mu.Lock()
	r := rs.m[id]
	if r == nil || (owner != nil && r.owner != owner) {
		rs.mu.Unlock()
		return base.Errorf(base.ErrArgument, "no receive region %d of this client", id)
	}
	delete(rs.m, id)
	rs.mu.Unlock()
	r.mu.Lock()
	shm.Unmap(r.mem)
	r.mem = nil
	r.mu.Unlock()
	return nil
}

// removeOwned drops every region of a session that ended.
func (rs *regions) removeOwned(owner *session) {
	rs.mu.RLock()
	var ids []uint32
	for id, r := range rs.m {
		if r.owner == owner {
			ids = append(ids, id)
		}
	}
	rs.mu.RUnlock()
	for _, id := range ids {
		rs.remove(id, owner)
	}
}

func (rs *regions) closeAll() {
	rs.mu.RLock()
	var ids []uint32
	for id := range rs.m {
		ids = append(ids, id)
	}
	rs.mu.RUnlock()
	for _, id := range ids {
		rs.remove(id, nil)
	}
}

func (rs *regions) count() int {
	rs.mu.RLock()
	defer rs.mu.RUnlock()
	return len(rs.m)
}

func (rs *regions) bytes() int64 {
	rs.mu.RLock()
	defer rs.mu.RUnlock()
	var n int64
	for _, r := range rs.m {
		n += int64(len(r.mem))
	}
	return n
}
