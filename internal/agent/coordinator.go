package agent

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/layout"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// coordinator is the job-wide part one agent plays: it learns every node's
// address and turns the ranks' shard declarations into a variable's table.
// A variable exists once every rank has published; until then nobody can
// read it, and a geometry that ranks disagree on fails every rank.
type coordinator struct {
	mu struct {
		sync.Mutex
		nodes   map[string]string // node id → peer address
		pending map[collKey]*collective
		tables  map[string]*wire.Table
		freed   map[string]map[int64]bool // variable → ranks done with it
		lastID  int64
	}
}

// lateGrace is how long after a round timed out its late ranks still get
// its error at once, rather than starting a round of their own.
var lateGrace = 10 * time.Second

// collKey names one round of a collective: the ranks' n-th Add of a name.
type collKey struct {
	name    string
	attempt int64
}

// collective gathers one variable's shards from all ranks.
type collective struct {
	size int64
	// seen and want decide when a failed round can be forgotten: once
	// every rank of the largest world any of them believes in has come.
	seen   map[int64]bool
	want   int64
	first  wire.Shard // the first shard to arrive sets the geometry
	shards map[int64]wire.Shard
	done   chan struct{} // closed when table or err is set
	table  *wire.Table
	err    error
	// timedOut is when the round failed for missing ranks; see lateGrace.
	timedOut time.Time
}

func newCoordinator() *coordinator {
	c := &coordinator{}
	c.mu.nodes = make(map[string]string)
	c.mu.pending = make(map[collKey]*collective)
	c.mu.tables = make(map[string]*wire.Table)
	c.mu.freed = make(map[string]map[int64]bool)
	return c
}

func (c *coordinator) join(node, addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.mu.nodes[node]; ok && old != addr {
		// The node's agent restarted: its variables' tables get its new
		// address (other agents fetch them again when its old one fails).
		c.mu.nodes[node] = addr
		c.refreshAddrsLocked()
		return
	}
	c.mu.nodes[node] = addr
}

func (col *collective) fail(err error) {
	if col.err == nil && col.table == nil {
		col.err = err
		close(col.done)
	}
}

// publish adds one rank's shard and waits until every rank's is there (the
// table), a rank disagrees (an error for all), or ctx ends.
func (c *coordinator) publish(ctx context.Context, sh wire.Shard) (*wire.Table, error) {
	c.mu.Lock()
	if _, ok := c.mu.tables[sh.Name]; ok {
		c.mu.Unlock()
		return nil, base.Errorf(base.ErrExists, "variable %q already exists", sh.Name)
	}
	// Ranks that never came may never come (a crashed job, a killed
	// client): a round that timed out long ago is forgotten, so that a
	// later job's first Add is not refused with its error and rounds of
	// names never used again do not pile up for the agent's life.
	for k, p := range c.mu.pending {
		if !p.timedOut.IsZero() && time.Since(p.timedOut) > lateGrace {
			delete(c.mu.pending, k)
		}
	}
	key := collKey{sh.Name, sh.Attempt}
	col := c.mu.pending[key]
	if col == nil {
		col = &collective{size: sh.Size, first: sh, shards: make(map[int64]wire.Shard), seen: make(map[int64]bool), done: make(chan struct{})}
		c.mu.pending[key] = col
	}
	col.want = max(col.want, sh.Size, col.size)
	if sh.Rank >= 0 {
		col.seen[sh.Rank] = true
	}
	err := col.check(sh)
	if _, dup := col.shards[sh.Rank]; dup && err == nil {
		err = base.Errorf(base.ErrExists, "variable %q: rank %d published twice", sh.Name, sh.Rank)
	}
	if err != nil {
		col.fail(err)
	}
	if sh.Rank >= 0 && sh.Rank < col.size {
		col.shards[sh.Rank] = sh
	}
	if col.err != nil {
		err = col.err
		if col.allSeen() {
			delete(c.mu.pending, key)
		}
		c.mu.Unlock()
		return nil, err
	}
	if int64(len(col.shards)) == col.size {
		t, err := c.tableLocked(col)
		if err != nil {
			col.fail(err)
		} else {
			col.table = t
			c.mu.tables[sh.Name] = t
			close(col.done)
		}
		delete(c.mu.pending, key)
	}
	c.mu.Unlock()

	select {
	case <-col.done:
	case <-ctx.Done():
		c.mu.Lock()
		col.fail(base.Errorf(base.ErrTimeout, "variable %q: %s", sh.Name, col.missing()))
		col.timedOut = time.Now()
		c.mu.Unlock()
	}
	if col.err != nil {
		return nil, col.err
	}
	return col.table, nil
}

// check compares a shard with the collective's first: every rank must agree
// on the world size and the row shape.
func (col *collective) check(sh wire.Shard) error {
	f := col.first
	switch {
	case sh.Failed:
		return base.Errorf(base.ErrGeometry, "variable %q: rank %d could not create its shard (%d rows of disp %d, itemsize %d)", sh.Name, sh.Rank, sh.Rows, sh.Disp, sh.ItemSize)
	case f.Failed:
		return base.Errorf(base.ErrGeometry, "variable %q: rank %d could not create its shard (%d rows of disp %d, itemsize %d)", f.Name, f.Rank, f.Rows, f.Disp, f.ItemSize)
	case sh.Rank < 0 || sh.Rank >= col.size:
		return base.Errorf(base.ErrArgument, "variable %q: rank %d not in [0, %d)", sh.Name, sh.Rank, col.size)
	case sh.Size != f.Size:
		return base.Errorf(base.ErrGeometry, "variable %q: rank %d says the world has %d ranks, rank %d says %d", sh.Name, sh.Rank, sh.Size, f.Rank, f.Size)
	case sh.Dtype != f.Dtype:
		return base.Errorf(base.ErrGeometry, "variable %q: rank %d has items of type %q but rank %d has %q", sh.Name, sh.Rank, sh.Dtype, f.Rank, f.Dtype)
	case sh.Backing != f.Backing || sh.Total != f.Total:
		return base.Errorf(base.ErrGeometry, "variable %q: rank %d has backing file %q of %d rows but rank %d has %q of %d rows",
			sh.Name, sh.Rank, sh.Backing, sh.Total, f.Rank, f.Backing, f.Total)
	case sh.Disp != f.Disp || sh.ItemSize != f.ItemSize:
		return base.Errorf(base.ErrGeometry, "variable %q: rank %d has rows of disp %d, itemsize %d but rank %d has disp %d, itemsize %d",
			sh.Name, sh.Rank, sh.Disp, sh.ItemSize, f.Rank, f.Disp, f.ItemSize)
	}
	return nil
}

func (col *collective) allSeen() bool {
	for r := range col.want {
		if !col.seen[r] {
			return false
		}
	}
	return true
}

func (col *collective) missing() string {
	var miss []string
	for r := int64(0); r < col.size && len(miss) < 16; r++ {
		if _, ok := col.shards[r]; !ok {
			miss = append(miss, fmt.Sprint(r))
		}
	}
	return fmt.Sprintf("%d of %d ranks published before the timeout; missing ranks %s (on several nodes, set a handshake directory or a rendezvous address so that agents meet)",
		len(col.shards), col.size, strings.Join(miss, ", "))
}

func (c *coordinator) tableLocked(col *collective) (*wire.Table, error) {
	f := col.first
	c.mu.lastID++
	t := &wire.Table{Name: f.Name, Disp: f.Disp, ItemSize: f.ItemSize, Dtype: f.Dtype, ID: c.mu.lastID, Backing: f.Backing, Total: f.Total,
		ShardRows: make([]int64, col.size), RankNode: make([]int64, col.size)}
	nodeIndex := map[string]int64{}
	for r := int64(0); r < col.size; r++ {
		sh := col.shards[r]
		t.ShardRows[r] = sh.Rows
		i, ok := nodeIndex[sh.Node]
		if !ok {
			i = int64(len(t.Nodes))
			nodeIndex[sh.Node] = i
			addr, known := c.mu.nodes[sh.Node]
			if !known {
				return nil, base.Errorf(base.ErrInternal, "variable %q: node %q of rank %d never joined", f.Name, sh.Node, r)
			}
			t.Nodes = append(t.Nodes, sh.Node)
			t.Addrs = append(t.Addrs, addr)
		}
		t.RankNode[r] = i
	}
	if _, err := layout.NewBacked(layout.Row{Disp: t.Disp, ItemSize: t.ItemSize}, t.ShardRows, t.Total); err != nil {
		return nil, fmt.Errorf("variable %q: %w", f.Name, err)
	}
	return t, nil
}

func (c *coordinator) lookup(name string) (*wire.Table, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t, ok := c.mu.tables[name]; ok {
		return t, nil
	}
	names := make([]string, 0, len(c.mu.tables))
	for n := range c.mu.tables {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(names) > 20 {
		names = append(names[:20], "...")
	}
	return nil, base.Errorf(base.ErrUnknown, "no variable %q (variables: %s)", name, strings.Join(names, ", "))
}

// free notes that a rank is done with a variable. Once every rank is, the
// variable is gone: free returns its table, whose nodes must drop their
// shards, and the name can be used again. Until then every shard stays, so
// a rank that frees early never takes rows from under the others.
func (c *coordinator) free(name string, rank int64) *wire.Table {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.mu.tables[name]
	if !ok || rank < 0 || rank >= int64(len(t.ShardRows)) {
		return nil
	}
	f := c.mu.freed[name]
	if f == nil {
		f = map[int64]bool{}
		c.mu.freed[name] = f
	}
	f[rank] = true
	if len(f) < len(t.ShardRows) {
		return nil
	}
	delete(c.mu.tables, name)
	delete(c.mu.freed, name)
	return t
}

func (c *coordinator) nodes() (ids, addrs []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range c.mu.nodes {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		addrs = append(addrs, c.mu.nodes[id])
	}
	return ids, addrs
}
