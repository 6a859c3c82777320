// Package client is the engine of the client library (the public package
// ddstore is its API): a rank's lanes to its node's agent, starting the
// agent when none runs, the variables it maps from shared memory, receive
// buffers the agent writes rows into, and one-sided MPI reads from the
// trainer's process. It links no server code: the rules it shares with the
// agent come from internal/naming, internal/layout and internal/wire.
package client

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/layout"
	"github.com/ddstore-go/ddstore/internal/naming"
	"github.com/ddstore-go/ddstore/internal/rendezvous"
	"github.com/ddstore-go/ddstore/internal/shm"
	"github.com/ddstore-go/ddstore/internal/transport"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// Config is ddstore.Config, which documents each field; the two are one
// struct type, converted from one to the other.
type Config struct {
	Namespace                        string
	Rank, Size, LocalRank, LocalSize int
	Node                             string
	Socket                           string
	RunDir                           string
	NoSpawn                          bool
	AgentBinary                      string
	AgentArgs                        []string
	AgentWait                        time.Duration
	Timeout                          time.Duration
	PublishTimeout                   time.Duration
	MaxLanes                         int
	Reader                           bool
	WaitPublished                    time.Duration
	Width                            int
	Method                           string
}

// Store is one rank's connection to its node's agent and its view of the
// job's variables: ddstore.Store's engine. Its methods are safe for
// concurrent use.
type Store struct {
	cfg Config
	id  rendezvous.Identity
	// grp is this rank's replica group: ranks [first, first+size), this
	// one its rank-th. Collectives and shards are the group's.
	grp    group
	hello  wire.Hello
	socket string

	mu struct {
		sync.RWMutex
		vars     map[string]*variable
		freed    map[string]bool
		attempts map[string]int64 // Add/Init calls per name (see wire.Shard.Attempt)
		closed   bool
	}
	ctl   *lane      // carries control ops (create, publish, lookup, register, free); guarded by ctlMu
	ctlMu sync.Mutex // lock order: ctlMu, then mu
	// slots bounds the lanes in use at once (MaxLanes); idle holds the
	// lanes not in use, reused last-in first-out so that a few warm lanes
	// (and their staging regions) serve most requests.
	slots chan struct{}
	idle  struct {
		sync.Mutex
		lanes []*lane
	}
	recv atomic.Pointer[[]*recvBuf]
	// one reads other ranks' rows from this process (Method "mpi"); nil
	// otherwise.
	one oneSided
}

// group is a replica group (Config.Width).
type group struct{ first, rank, size int }

// wireName is the name of a variable as the agents know it: the group's own
// copy when the job has several groups.
func (s *Store) wireName(name string) string {
	if s.grp.size == s.id.Size {
		return name
	}
	return fmt.Sprintf("%s@r%d", name, s.grp.first)
}

// Group returns this rank's replica group (Config.Width): its index, this
// rank's rank in it, and its size; (0, Rank(), Size()) without groups.
func (s *Store) Group() (index, rank, size int) {
	w := s.cfg.Width
	if w == 0 {
		return 0, s.grp.rank, s.grp.size
	}
	return s.grp.first / w, s.grp.rank, s.grp.size
}

// recvBuf is a receive buffer the agent can write into (AllocRecv).
type recvBuf struct {
	region *shm.Region
	id     atomic.Uint32 // the agent's id; changes if the control session is redialed
	base   uintptr
	size   uintptr // len(region.Mem), which Close clears: read this instead
}

// variable is a variable as this rank sees it.
type variable struct {
	mu    sync.RWMutex // read-locked by reads; write-locked by Free
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
	dtype    string
	id       int64 // the table's id: reads name it, so a re-created variable is never mixed in
	// backing is the file holding every row, "" for none: rows from
	// lay.Held() on are read from it by the agent.
	backing string
	freed   bool
	prof    profile
}

type profile struct {
	calls, rows, bytes, localRows, remoteRows, storageRows, remoteCalls, waitNs, oneSidedRows atomic.Int64
}

// Open attaches this rank to its node's agent, starting one if none runs.
func Open(cfg Config) (*Store, error) {
	if cfg.Size > 0 {
		if cfg.Rank < 0 || cfg.Rank >= cfg.Size {
			return nil, base.Errorf(base.ErrArgument, "rank %d of %d: want 0 <= rank < size", cfg.Rank, cfg.Size)
		}
	}
	id, err := identity(cfg)
	if err != nil {
		return nil, err
	}
	cfg.Namespace = namespace(cfg.Namespace)
	if err := naming.CheckName("namespace", cfg.Namespace); err != nil {
		return nil, err
	}
	if err := naming.CheckName("node", id.Node); err != nil {
		return nil, err
	}
	if cfg.RunDir == "" {
		cfg.RunDir = naming.DefaultRunDir()
	}
	if cfg.Socket == "" {
		cfg.Socket = naming.SocketPath(cfg.RunDir, cfg.Namespace, id.Node)
	}
	if cfg.AgentWait <= 0 {
		cfg.AgentWait = 60 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Minute
	}
	if cfg.PublishTimeout <= 0 {
		cfg.PublishTimeout = 5 * time.Minute
	}
	if cfg.MaxLanes <= 0 {
		cfg.MaxLanes = 16
	}
	if cfg.Width < 0 {
		return nil, base.Errorf(base.ErrArgument, "replica group width %d: want >= 1, or 0 for one group of the whole job", cfg.Width)
	}
	if err := checkMethod(cfg); err != nil {
		return nil, err
	}
	grp := group{first: 0, rank: id.Rank, size: id.Size}
	if w := cfg.Width; w > 0 && w < id.Size {
		grp.first = id.Rank / w * w
		grp.rank, grp.size = id.Rank-grp.first, min(w, id.Size-grp.first)
	}
	s := &Store{cfg: cfg, id: id, grp: grp, socket: cfg.Socket, slots: make(chan struct{}, cfg.MaxLanes)}
	helloRank := int64(id.Rank)
	if cfg.Reader {
		helloRank = -1
	}
	s.hello = wire.Hello{Namespace: cfg.Namespace, Node: id.Node, Rank: helloRank, Size: int64(id.Size),
		LocalRank: int64(id.LocalRank), LocalSize: int64(id.LocalSize), Pid: int64(os.Getpid())}
	s.mu.vars = make(map[string]*variable)
	s.mu.freed = make(map[string]bool)
	s.mu.attempts = make(map[string]int64)
	s.recv.Store(&[]*recvBuf{})
	ctl, err := s.connect()
	if err != nil {
		return nil, err
	}
	s.ctl = ctl
	if cfg.Method == MethodMPI {
		if s.one, err = newOneSided(s); err != nil {
			ctl.close()
			return nil, err
		}
	}
	return s, nil
}

func identity(cfg Config) (rendezvous.Identity, error) {
	if cfg.Size > 0 {
		id := rendezvous.Identity{Rank: cfg.Rank, Size: cfg.Size, LocalRank: cfg.LocalRank, LocalSize: cfg.LocalSize, Node: cfg.Node, Launcher: "explicit"}
		if id.Node == "" {
			id.Node = os.Getenv("DDSTORE_NODE_ID")
		}
		if id.Node == "" {
			h, err := os.Hostname()
			if err != nil {
				return id, fmt.Errorf("%w: %w", base.ErrArgument, err)
			}
			id.Node = h
		}
		return id, nil
	}
	id, err := rendezvous.FromEnv(nil)
	if err != nil {
		return id, err
	}
	if cfg.Node != "" {
		id.Node = cfg.Node
	}
	return id, nil
}

// DefaultNamespace is the namespace a Store or agent uses when none is
// given: DDSTORE_NAMESPACE, else the Slurm job id or torchrun run id, else
// "default".
func DefaultNamespace() string { return namespace("") }

// DefaultNode is this node's identity: DDSTORE_NODE_ID, else Slurm's node
// name, else the host name.
func DefaultNode() string {
	id, err := rendezvous.FromEnv(nil)
	if err != nil {
		h, _ := os.Hostname()
		return h
	}
	return id.Node
}

func namespace(ns string) string {
	for _, v := range []string{ns, os.Getenv("DDSTORE_NAMESPACE")} {
		if v != "" {
			return v
		}
	}
	if j := os.Getenv("SLURM_JOB_ID"); j != "" {
		return "slurm-" + j
	}
	if r := os.Getenv("TORCHELASTIC_RUN_ID"); r != "" && r != "none" {
		return "torch-" + r
	}
	return "default"
}

// Rank is this store's rank; Size the world size; Node its node.
func (s *Store) Rank() int      { return s.id.Rank }
func (s *Store) Size() int      { return s.id.Size }
func (s *Store) Node() string   { return s.id.Node }
func (s *Store) Socket() string { return s.socket }

// getLane takes a slot (waiting at most the request timeout), then the most
// recently used idle lane, or dials one.
func (s *Store) getLane() (*lane, error) {
	select {
	case s.slots <- struct{}{}:
	default:
		t := time.NewTimer(s.cfg.Timeout)
		defer t.Stop()
		select {
		case s.slots <- struct{}{}:
		case <-t.C:
			return nil, base.Errorf(base.ErrTimeout, "all %d connections to the agent stayed busy for %v", s.cfg.MaxLanes, s.cfg.Timeout)
		}
	}
	s.idle.Lock()
	if n := len(s.idle.lanes); n > 0 {
		l := s.idle.lanes[n-1]
		s.idle.lanes = s.idle.lanes[:n-1]
		s.idle.Unlock()
		return l, nil
	}
	s.idle.Unlock()
	l, _, err := dialLane(s.socket, &s.hello, s.cfg.Timeout)
	if err != nil {
		<-s.slots
		return nil, err
	}
	return l, nil
}

// putLane returns a lane and its slot; a broken lane, or one of a closed
// store, is closed instead of kept.
func (s *Store) putLane(l *lane) {
	s.mu.RLock()
	closed := s.mu.closed
	s.mu.RUnlock()
	if l.broken || closed {
		l.close()
	} else {
		s.idle.Lock()
		s.idle.lanes = append(s.idle.lanes, l)
		s.idle.Unlock()
	}
	<-s.slots
}

// request runs a request on a lane of the pool: a collective that waits
// minutes for other ranks holds one lane, not the whole store.
func (s *Store) request(op wire.Op, fill func(*wire.Encoder), timeout time.Duration) ([]byte, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	var body []byte
	err := s.withLane(func(l *lane) error {
		b, err := l.call(op, fill, timeout)
		body = append(body[:0], b...)
		return err
	})
	return body, err
}

// withLane runs f on a lane of the pool. When the lane turns out dead
// before its request left (the agent was restarted: every pooled lane is
// then dead), the idle lanes are dropped and f runs once more on a new one.
func (s *Store) withLane(f func(l *lane) error) error {
	for attempt := 0; ; attempt++ {
		l, err := s.getLane()
		if err != nil {
			return err
		}
		err = f(l)
		unsent := l.unsent
		s.putLane(l)
		if err == nil || !unsent || attempt > 0 {
			return err
		}
		s.dropIdle()
	}
}

// dropIdle closes every idle lane.
func (s *Store) dropIdle() {
	s.idle.Lock()
	lanes := s.idle.lanes
	s.idle.lanes = nil
	s.idle.Unlock()
	for _, l := range lanes {
		l.close()
	}
}

// ctlLocked returns the control lane, the session receive buffers are
// registered on. A broken one (or, with renew, any) is replaced and the
// buffers registered again on the new session: the agent dropped them with
// the old. The caller holds ctlMu.
func (s *Store) ctlLocked(renew bool) (*lane, error) {
	if s.ctl == nil {
		return nil, base.Errorf(base.ErrClosed, "store of rank %d closed", s.id.Rank)
	}
	if !s.ctl.broken && !renew {
		return s.ctl, nil
	}
	l, _, err := dialLane(s.socket, &s.hello, s.cfg.Timeout)
	if err != nil {
		return nil, err
	}
	s.ctl.close()
	s.ctl = l
	for _, r := range *s.recv.Load() {
		id, err := l.register(r.region, s.cfg.Timeout)
		if err != nil {
			return nil, err
		}
		r.id.Store(id)
	}
	return l, nil
}

func (s *Store) checkOpen() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.closed {
		return base.Errorf(base.ErrClosed, "store of rank %d closed", s.id.Rank)
	}
	return nil
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
// (File, made absolute) and how many rows it has in all.
type Backing struct {
	File string
	Rows int64
}

// Create runs this rank's part of the collective that makes a variable:
// nrows rows of disp items of itemsize bytes (of type dtype, "" for
// untyped), copied from rows unless nil, with a backing file unless b is
// nil. A rank that cannot take part (bad, its local error) still tells the
// coordinator, so that the other ranks fail at once instead of waiting.
func (s *Store) Create(name string, rows []byte, nrows, disp, itemsize int64, dtype string, bad error, b *Backing) error {
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
	if have {
		return base.Errorf(base.ErrExists, "variable %q already exists", name)
	}
	sh := wire.Shard{Name: s.wireName(name), Rank: int64(s.grp.rank), Size: int64(s.grp.size), Rows: nrows, Disp: disp, ItemSize: itemsize,
		TimeoutMs: s.cfg.PublishTimeout.Milliseconds(), Attempt: attempt, Dtype: dtype}
	if b != nil {
		sh.Backing, sh.Total = b.File, b.Rows
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
	if len(rows) > 0 {
		seg, err := shm.Open(p.Path, true)
		if err != nil {
			return fail(err)
		}
		copy(seg.Data, rows)
		seg.Close()
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
	if err != nil || s.one == nil {
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
	for r := range t.ShardRows {
		v.nodes[r] = t.Nodes[t.RankNode[r]]
		if r >= len(t.Paths) || t.Paths[r] == "" {
			continue
		}
		own := s.grp.rank == r && s.hello.Rank >= 0
		seg, err := shm.Open(t.Paths[r], own)
		if err != nil {
			v.unmap()
			return nil, err
		}
		v.segs = append(v.segs, seg)
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
// the agent for its table the first time this rank uses it.
func (s *Store) acquire(name string) (*variable, error) {
	if err := naming.CheckVariable(name); err != nil {
		return nil, err
	}
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
	if v.own == nil {
		return nil, base.Errorf(base.ErrArgument, "variable %q: rank %d holds no shard", name, s.id.Rank)
	}
	return v.own, nil
}

// Get reads len(dst)/rowBytes consecutive rows from global row start; the
// range may span several ranks' shards.
func (s *Store) Get(name string, dst []byte, start int64) error {
	v, err := s.acquire(name)
	if err != nil {
		return err
	}
	defer v.mu.RUnlock()
	if int64(len(dst))%v.rb != 0 || len(dst) == 0 {
		return base.Errorf(base.ErrBuffer, "variable %q: destination of %d bytes: want a whole, nonzero number of %d-byte rows (disp %d x itemsize %d)",
			name, len(dst), v.rb, v.lay.Disp, v.lay.ItemSize)
	}
	n := int64(len(dst)) / v.rb
	spans, err := v.lay.Spans(start, n)
	if err != nil {
		return fmt.Errorf("variable %q: %w", name, err)
	}
	t0 := time.Now()
	var remote []int64
	var pos, stored int64
	for _, sp := range spans {
		if sp.Rank == layout.Backed {
			for k := int64(0); k < sp.Count; k++ {
				remote = append(remote, pos+k)
			}
			stored += sp.Count
		} else if src := v.local[sp.Rank]; src != nil {
			copy(dst[pos*v.rb:(pos+sp.Count)*v.rb], src[sp.Local*v.rb:])
		} else {
			for k := int64(0); k < sp.Count; k++ {
				remote = append(remote, pos+k)
			}
		}
		pos += sp.Count
	}
	at := func(i int) int64 { return start + int64(i) }
	err = s.fetchRemote(v, dst, remote, at)
	v.count(n, int64(len(remote)), stored, t0)
	return err
}

// GetBatch reads rows indices[i] into dst[i*rowBytes:]; indices may come in
// any order, repeat, and belong to any rank. Every index is checked before
// any row is read.
func (s *Store) GetBatch(name string, dst []byte, indices []int64) error {
	v, err := s.acquire(name)
	if err != nil {
		return err
	}
	defer v.mu.RUnlock()
	rb := v.rb
	if int64(len(dst)) != int64(len(indices))*rb {
		return base.Errorf(base.ErrBuffer, "variable %q: destination of %d bytes for %d rows of %d bytes (disp %d x itemsize %d): want %d bytes",
			name, len(dst), len(indices), rb, v.lay.Disp, v.lay.ItemSize, int64(len(indices))*rb)
	}
	if err := v.lay.CheckAll(indices); err != nil {
		return fmt.Errorf("variable %q: %w", name, err)
	}
	t0 := time.Now()
	var remote []int64
	var stored int64
	for i, g := range indices {
		r, loc := v.lay.Owner(g)
		if r == layout.Backed {
			stored++
		} else if src := v.local[r]; src != nil {
			o := int64(i) * rb
			copy(dst[o:o+rb], src[loc*rb:(loc+1)*rb])
			continue
		}
		remote = append(remote, int64(i))
	}
	err = s.fetchRemote(v, dst, remote, func(i int) int64 { return indices[i] })
	v.count(int64(len(indices)), int64(len(remote)), stored, t0)
	return err
}

// fetchRemote reads the rows at positions pos of dst that this node does
// not hold: from this process with MPI gets where the variable is in the
// window (Method "mpi"), the rest through the agent.
func (s *Store) fetchRemote(v *variable, dst []byte, pos []int64, at func(int) int64) error {
	if v.windowed && len(pos) > 0 {
		var err error
		if pos, err = s.readOneSided(v, dst, pos, at); err != nil {
			return err
		}
	}
	return s.fetch(v, dst, pos, at)
}

// count records a read of rows, remote of them through the agent, stored
// of those from the backing file.
func (v *variable) count(rows, remote, stored int64, t0 time.Time) {
	p := &v.prof
	p.calls.Add(1)
	p.rows.Add(rows)
	p.bytes.Add(rows * v.rb)
	p.localRows.Add(rows - remote)
	p.storageRows.Add(stored)
	if remote > 0 {
		p.remoteRows.Add(remote - stored)
		p.remoteCalls.Add(1)
		p.waitNs.Add(int64(time.Since(t0)))
	}
}

// fetch reads the rows at positions pos of dst (global index at(i)) from
// other nodes through the agent: one request, rows written by the agent
// straight into dst when dst lies in a receive buffer from AllocRecv, else
// into the lane's staging region and copied.
func (s *Store) fetch(v *variable, dst []byte, pos []int64, at func(int) int64) error {
	// A request carries 16 bytes per row and frames are bounded: very
	// large batches go in several requests.
	const maxRows = 1 << 20
	for len(pos) > maxRows {
		if err := s.fetch(v, dst, pos[:maxRows], at); err != nil {
			return err
		}
		pos = pos[maxRows:]
	}
	if len(pos) == 0 {
		return nil
	}
	return s.withLane(func(l *lane) error { return s.fetchOn(l, v, dst, pos, at) })
}

// fetchOn is one attempt of fetch, on lane l.
func (s *Store) fetchOn(l *lane, v *variable, dst []byte, pos []int64, at func(int) int64) error {
	rb := v.rb
	m := &l.read
	m.Name, m.ID = v.name, v.id
	m.Globals, m.Offsets = m.Globals[:0], m.Offsets[:0]
	rbuf, off := s.recvOf(dst)
	var stage []byte
	var err error
	if rbuf != nil {
		m.Region = rbuf.id.Load()
		for _, p := range pos {
			m.Globals = append(m.Globals, at(int(p)))
			m.Offsets = append(m.Offsets, off+p*rb)
		}
	} else {
		stage, m.Region, err = l.staging(len(pos)*int(rb), s.cfg.Timeout)
		if err != nil {
			return err
		}
		for k, p := range pos {
			m.Globals = append(m.Globals, at(int(p)))
			m.Offsets = append(m.Offsets, int64(k)*rb)
		}
	}
	_, err = l.call(wire.OpRead, m.Encode, s.cfg.Timeout)
	if err != nil && rbuf != nil && errors.Is(err, base.ErrArgument) {
		// The agent refused the read's arguments. If that is because it no
		// longer knows the buffer (the control session it was registered
		// on ended, or was replaced meanwhile), register the buffers again
		// on a new session and read once more: the cause is checked on the
		// session itself, not read from the error's text.
		if id, ok := s.regionAgain(rbuf, m.Region); ok {
			m.Region = id
			_, err = l.call(wire.OpRead, m.Encode, s.cfg.Timeout)
		}
	}
	if err != nil {
		return fmt.Errorf("variable %q: %w", v.name, err)
	}
	if stage != nil {
		for k, p := range pos {
			copy(dst[p*rb:(p+1)*rb], stage[int64(k)*rb:])
		}
	}
	return nil
}

// regionAgain is the id under which rbuf is registered now, if a read
// that named it used is worth trying again: the control session was
// replaced since (the buffers were registered again under new ids), or it
// has ended, in which case a new one is made here.
func (s *Store) regionAgain(rbuf *recvBuf, used uint32) (uint32, bool) {
	s.ctlMu.Lock()
	defer s.ctlMu.Unlock()
	if id := rbuf.id.Load(); id != used {
		return id, true
	}
	if s.ctl == nil || !s.ctl.gone() {
		return 0, false
	}
	if _, err := s.ctlLocked(true); err != nil {
		return 0, false
	}
	return rbuf.id.Load(), true
}

// recvOf finds the receive buffer dst lies in, and dst's offset there.
func (s *Store) recvOf(dst []byte) (*recvBuf, int64) {
	if len(dst) == 0 {
		return nil, 0
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(dst)))
	for _, r := range *s.recv.Load() {
		if p >= r.base && p+uintptr(len(dst)) <= r.base+r.size {
			return r, int64(p - r.base)
		}
	}
	return nil, 0
}

// AllocRecv returns a buffer of n bytes in shared memory that the agent
// writes rows of other nodes into directly: reads into it, or into any
// slice of it, skip a copy (DDStore's register_recv). Release it with
// FreeRecv; Close releases the rest.
func (s *Store) AllocRecv(n int) ([]byte, error) {
	if n <= 0 {
		return nil, base.Errorf(base.ErrArgument, "receive buffer of %d bytes: want > 0", n)
	}
	r, err := shm.NewRegion(fmt.Sprintf("ddstore-recv-%d", os.Getpid()), n)
	if err != nil {
		return nil, err
	}
	s.ctlMu.Lock()
	defer s.ctlMu.Unlock()
	ctl, err := s.ctlLocked(false)
	if err != nil {
		r.Close()
		return nil, err
	}
	id, err := ctl.register(r, s.cfg.Timeout)
	if err != nil && ctl.unsent {
		// The agent was restarted: a new control session, with the other
		// buffers registered again, then this one.
		if ctl, err = s.ctlLocked(true); err == nil {
			id, err = ctl.register(r, s.cfg.Timeout)
		}
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	rb := &recvBuf{region: r, base: uintptr(unsafe.Pointer(unsafe.SliceData(r.Mem))), size: uintptr(len(r.Mem))}
	rb.id.Store(id)
	old := *s.recv.Load()
	next := append(append([]*recvBuf(nil), old...), rb)
	s.recv.Store(&next)
	return r.Mem[:n:n], nil
}

// FreeRecv releases a buffer from AllocRecv.
func (s *Store) FreeRecv(buf []byte) error {
	// Under ctlMu, which every change of the list takes: a buffer freed
	// twice at once is freed once, the other call told it is not one.
	s.ctlMu.Lock()
	defer s.ctlMu.Unlock()
	r, off := s.recvOf(buf)
	if r == nil || off != 0 {
		return base.Errorf(base.ErrBuffer, "buffer of %d bytes was not returned by AllocRecv", len(buf))
	}
	old := *s.recv.Load()
	next := make([]*recvBuf, 0, len(old))
	for _, x := range old {
		if x != r {
			next = append(next, x)
		}
	}
	s.recv.Store(&next)
	if ctl, err := s.ctlLocked(false); err == nil {
		m := wire.Region{ID: r.id.Load()}
		ctl.call(wire.OpUnregister, m.Encode, s.cfg.Timeout)
	}
	return r.region.Close()
}

// VarInfo is ddstore.VarInfo, which documents it.
type VarInfo struct {
	Name      string
	TotalRows int64
	Disp      int64
	ItemSize  int64
	Dtype     string   // the items' type as the creating client named it ("" for untyped bytes)
	ShardRows []int64  // per rank
	Nodes     []string // per rank: the node holding the shard
	// Backing is the file holding every row ("" for none); the shards
	// hold the first HeldRows of TotalRows, the file the rest.
	Backing  string
	HeldRows int64
}

// Info describes a variable.
func (s *Store) Info(name string) (VarInfo, error) {
	v, err := s.acquire(name)
	if err != nil {
		return VarInfo{}, err
	}
	defer v.mu.RUnlock()
	in := VarInfo{Name: name, TotalRows: v.lay.Total(), Disp: v.lay.Disp, ItemSize: v.lay.ItemSize, Dtype: v.dtype, Nodes: slices.Clone(v.nodes),
		Backing: v.backing, HeldRows: v.lay.Held()}
	for r := range v.lay.Ranks() {
		in.ShardRows = append(in.ShardRows, v.lay.ShardRows(r))
	}
	return in, nil
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
		RemoteRows: p.remoteRows.Load(), StorageRows: p.storageRows.Load(), RemoteCalls: p.remoteCalls.Load(), OneSided: p.oneSidedRows.Load(), Wait: time.Duration(p.waitNs.Load())}, nil
}

// EpochBegin and EpochEnd mark epochs. Reads here are one-sided through the
// agents, so no fence is needed (DDStore's MPI backend needs one); they are
// accepted so that code written for DDStore runs unchanged.
func (s *Store) EpochBegin() error { return s.checkOpen() }
func (s *Store) EpochEnd() error   { return s.checkOpen() }

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

// Close releases this rank's mappings and connections. The data stay with
// the agent; Close is idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return nil
	}
	s.mu.closed = true
	vars := s.mu.vars
	s.mu.vars = nil
	s.mu.Unlock()
	if s.one != nil {
		// Collective (Method "mpi"): no shard leaves its window while
		// another rank may still read it.
		s.one.barrier()
	}
	for _, v := range vars {
		v.mu.Lock()
		v.freed = true
		s.release(v)
		v.mu.Unlock()
	}
	s.ctlMu.Lock()
	if s.ctl != nil {
		s.ctl.close()
		s.ctl = nil
	}
	for _, r := range *s.recv.Load() {
		r.region.Close()
	}
	s.recv.Store(&[]*recvBuf{})
	s.ctlMu.Unlock()
	// Close the idle lanes (lanes in use are closed when they come back:
	// putLane sees the store closed).
	s.idle.Lock()
	for _, l := range s.idle.lanes {
		l.close()
	}
	s.idle.lanes = nil
	s.idle.Unlock()
	if s.one != nil {
		// Collective: MPI_Win_free and MPI_Finalize wait for every rank.
		return s.one.close()
	}
	return nil
}
