// Package client is the engine of the client library (the public package
// ddstore is its API): a rank's lanes to its node's agent, starting the
// agent when none runs, the variables it maps from shared memory, receive
// buffers the agent writes rows into, and one-sided MPI reads from the
// trainer's process. It links no server code: the rules it shares with the
// agent come from internal/naming, internal/layout and internal/wire.
package client

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/naming"
	"github.com/ddstore-go/ddstore/internal/rendezvous"
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
	NoDirect                         bool
	DirectIdle                       time.Duration
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

	// mu guards vars, freed, attempts and closed; taken under a variable's
	// mu and under ctlMu, never the other way (lock order:
	// internal/LOCKS.md).
	mu struct {
		sync.RWMutex
		vars     map[string]*variable
		freed    map[string]bool
		attempts map[string]int64 // Add/Init calls per name (see wire.Shard.Attempt)
		closed   bool
	}
	ctl   *lane      // carries control ops (create, publish, lookup, register, free); guarded by ctlMu
	ctlMu sync.Mutex // also guards changes of recv; lock order: internal/LOCKS.md
	// slots bounds the lanes in use at once (MaxLanes); idle holds the
	// lanes not in use, reused last-in first-out so that a few warm lanes
	// (and their staging regions) serve most requests. idle's lock is a
	// leaf (lock order: internal/LOCKS.md).
	slots chan struct{}
	idle  struct {
		sync.Mutex
		lanes []*lane
	}
	recv atomic.Pointer[[]*recvBuf]
	// one reads other ranks' rows from this process (Method "mpi"); nil
	// otherwise.
	one oneSided
	// direct holds the connections to other nodes' agents (direct.go).
	direct directPool
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
	if cfg.DirectIdle <= 0 {
		cfg.DirectIdle = DirectIdle
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
	s.direct.idleFor = cfg.DirectIdle
	if s.direct.max, err = directMax(); err != nil {
		return nil, err
	}
	if s.direct.split, err = directSplit(); err != nil {
		return nil, err
	}
	s.mu.vars = make(map[string]*variable)
	s.mu.freed = make(map[string]bool)
	s.mu.attempts = make(map[string]int64)
	s.recv.Store(&[]*recvBuf{})
	ctl, err := s.connect()
	if err != nil {
		return nil, err
	}
	if hs := handshakeArg(cfg.AgentArgs); hs != "" {
		if err := s.checkHandshake(ctl, hs); err != nil {
			ctl.close()
			return nil, err
		}
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
	s.direct.close()
	if s.one != nil {
		// Collective: MPI_Win_free and MPI_Finalize wait for every rank.
		return s.one.close()
	}
	return nil
}
