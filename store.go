package ddstore

import (
	"time"

	"github.com/ddstore-go/ddstore/internal/client"
)

// Config says who this rank is and how to reach its node's agent. The zero
// value works for a job launched by torchrun, Slurm, Open MPI or MPICH, and
// for a single process: the identity comes from the environment and an
// agent is started on the node if none runs.
type Config struct {
	// Namespace separates jobs on the same nodes; default DDSTORE_NAMESPACE,
	// else the Slurm job id or torchrun run id, else "default".
	Namespace string
	// Rank, Size, LocalRank, LocalSize and Node give the identity
	// explicitly when Size > 0; otherwise it is read from the environment.
	// LocalRank -1 means unknown. Node defaults to DDSTORE_NODE_ID, then the
	// host name.
	Rank, Size, LocalRank, LocalSize int
	Node                             string

	// Socket is the agent's socket; default is derived from RunDir,
	// Namespace and Node.
	Socket string
	RunDir string
	// NoSpawn forbids starting an agent: the Store only attaches.
	NoSpawn bool
	// AgentBinary is the ddstore binary to start as agent; default
	// DDSTORE_BIN, then this executable if it is ddstore, then PATH.
	AgentBinary string
	// AgentArgs are extra flags for an agent started on demand (e.g.
	// --rendezvous host:port or --handshake-dir DIR on several nodes).
	AgentArgs []string
	// AgentWait bounds waiting for the agent's socket; default 60 s.
	AgentWait time.Duration
	// Timeout bounds one request to the agent; default 2 min.
	Timeout time.Duration
	// PublishTimeout bounds how long Add and Init wait for the other
	// ranks; default 5 min.
	PublishTimeout time.Duration
	// MaxLanes bounds the connections to the agent (one per goroutine
	// reading rows of other nodes at once); default 16.
	MaxLanes int
	// Reader makes a store that holds no shard (split mode: a job reading
	// variables another job published). It cannot Add or Init.
	Reader bool
	// WaitPublished makes a first read of a variable that is not published
	// yet wait up to that long for it, instead of failing with ErrUnknown
	// at once (split mode: the reading job may start before the publishing
	// one is done; DDStore's DDSTORE_HANDSHAKE_TIMEOUT_S).
	WaitPublished time.Duration
	// Width splits the job into replica groups (DDStore's ddstore_width):
	// ranks [k*Width, (k+1)*Width) form group k, which holds a whole copy
	// of each variable, its ranks sharing it as a job of Width ranks would
	// (the last group may be smaller); reads stay within the group,
	// node-local rows first. 0 means one group of the whole job.
	Width int
	// Method is how rows of other nodes are read: MethodAgent ("agent",
	// the default if empty) through this node's agent, or MethodMPI ("mpi",
	// a build with the tag mpi, the process a rank of an MPI launch whose
	// world ranks are the store's) with one-sided MPI gets from this
	// process, as DDStore's method 0. With MethodMPI, Add, Init, AddBacked,
	// InitBacked, Close and the Free of a variable this store created are
	// collective over MPI_COMM_WORLD (with Width, all groups at once);
	// rows of a backing file still come through the agent; one such store
	// per process.
	Method string
	// NoDirect sends every read of other nodes' rows through this node's
	// agent. By default a small read whose rows are all on one other node
	// goes straight to that node's agent over a pooled, authenticated TCP
	// connection (one network round trip, the rows read into the
	// destination; docs/design.md, Reading), and falls back to this
	// node's agent on any doubt. For processes that may not open TCP
	// connections.
	NoDirect bool
	// DirectIdle closes a direct connection unused that long; zero: 10 s.
	DirectIdle time.Duration
}

// Store is one rank's handle on the job's variables. Its methods are safe
// for concurrent use.
type Store struct {
	c *client.Store
}

// Open attaches this rank to its node's agent, starting one if none runs.
func Open(cfg Config) (*Store, error) {
	c, err := client.Open(client.Config(cfg))
	if err != nil {
		return nil, err
	}
	return &Store{c: c}, nil
}

// DefaultNamespace is the namespace a Store or agent uses when none is
// given: DDSTORE_NAMESPACE, else the Slurm job id or torchrun run id, else
// "default".
func DefaultNamespace() string { return client.DefaultNamespace() }

// DefaultNode is this node's identity: DDSTORE_NODE_ID, else Slurm's node
// name, else the host name.
func DefaultNode() string { return client.DefaultNode() }

// Rank is this store's rank; Size the world size; Node its node.
func (s *Store) Rank() int      { return s.c.Rank() }
func (s *Store) Size() int      { return s.c.Size() }
func (s *Store) Node() string   { return s.c.Node() }
func (s *Store) Socket() string { return s.c.Socket() }

// Group returns this rank's replica group (Config.Width): its index, this
// rank's rank in it, and its size; (0, Rank(), Size()) without groups.
func (s *Store) Group() (index, rank, size int) { return s.c.Group() }

// Init creates a variable whose shard on this rank is nrows zero-filled
// rows of disp items of itemsize bytes. Like Add, every rank calls it.
func (s *Store) Init(name string, nrows, disp, itemsize int64) error {
	return s.c.Init(name, nrows, disp, itemsize)
}

// Add creates a variable whose shard on this rank is rows: len(rows) must
// be a whole number of rows of disp items of itemsize bytes. Every rank of
// the job calls Add for the variable (with its own rows, possibly none);
// it returns once every rank has, so a row of any rank can be read right
// after. Ranks that disagree on disp or itemsize all get ErrGeometry.
func (s *Store) Add(name string, rows []byte, disp, itemsize int64) error {
	return s.c.Add(name, rows, disp, itemsize)
}

// Update overwrites rows of this rank's own shard from row offset on.
func (s *Store) Update(name string, rows []byte, offset int64) error {
	return s.c.Update(name, rows, offset)
}

// Shard returns this rank's own shard of a variable, mapped writable: the
// rows written into it are what every rank reads (Update without a copy;
// ingest writes files straight into it). It stays valid until Free or Close.
func (s *Store) Shard(name string) ([]byte, error) { return s.c.Shard(name) }

// Get reads len(dst)/rowBytes consecutive rows from global row start; the
// range may span several ranks' shards.
func (s *Store) Get(name string, dst []byte, start int64) error {
	return s.c.Get(name, dst, start)
}

// GetBatch reads rows indices[i] into dst[i*rowBytes:]; indices may come in
// any order, repeat, and belong to any rank. Every index is checked before
// any row is read, so a bad one leaves dst as it was; after any other error
// (a node lost, a timeout) dst may hold some of the rows, or parts of them.
func (s *Store) GetBatch(name string, dst []byte, indices []int64) error {
	return s.c.GetBatch(name, dst, indices)
}

// AllocRecv returns a buffer of n bytes in shared memory that the agent
// writes rows of other nodes into directly: reads into it, or into any
// slice of it, skip a copy (DDStore's register_recv). Release it with
// FreeRecv; Close releases the rest.
func (s *Store) AllocRecv(n int) ([]byte, error) { return s.c.AllocRecv(n) }

// FreeRecv releases a buffer from AllocRecv.
func (s *Store) FreeRecv(buf []byte) error { return s.c.FreeRecv(buf) }

// VarInfo is a variable's geometry (DDStore's info(): total rows, disp,
// itemsize) and where its shards are.
type VarInfo struct {
	Name      string
	TotalRows int64
	Disp      int64
	ItemSize  int64
	Dtype     string   // the items' type as the creating client named it ("" for untyped bytes)
	ShardRows []int64  // per rank
	Nodes     []string // per rank: the node holding the shard
	// Backing is the file holding every row ("" for none); the shards
	// hold the first HeldRows of TotalRows, the file the rest. For a
	// ragged variable it is the values, BackingOffsets the offsets.
	Backing        string
	BackingOffsets string
	HeldRows       int64
	// Ragged variables (AddRagged): Ragged is set, Shape is the rows'
	// trailing dimensions (Disp their product), ShardItems per rank the
	// units of Disp items its shard holds, TotalItems all of them.
	Ragged     bool
	Shape      []int64
	ShardItems []int64
	TotalItems int64
	// Bytes is the values of every row (TotalRows × row bytes for fixed
	// rows).
	Bytes int64
}

// Info describes a variable.
func (s *Store) Info(name string) (VarInfo, error) {
	in, err := s.c.Info(name)
	return VarInfo(in), err
}

// Profile counts what this rank read of a variable.
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
	p, err := s.c.Profile(name)
	return Profile(p), err
}

// Fence is collective over this rank's replica group (the whole job
// without Width): it returns once every rank of the group has called it,
// each rank's n-th call meeting the others' n-th. Every Update a rank made
// before its Fence is then seen by every read of the group's ranks after
// theirs, rows of this node and of others. A rank that does not come within
// PublishTimeout fails the fence for every rank with ErrTimeout, naming the
// missing ranks. A Reader takes part in no fence (it returns at once).
func (s *Store) Fence() error { return s.c.Fence() }

// EpochBegin and EpochEnd are DDStore's names of Fence (an MPI window fence
// there), so that code written for DDStore runs unchanged: a rank's
// updates before EpochBegin are read by every rank after it, and no rank
// updates again before every rank has reached EpochEnd.
func (s *Store) EpochBegin() error { return s.c.Fence() }
func (s *Store) EpochEnd() error   { return s.c.Fence() }

// Free releases a variable on this rank: its reads fail with ErrFreed from
// now on. The shards stay until every rank of the job has freed it (a rank
// that finishes early never takes rows from under the others); then they go
// on every node and the name can be created again. With Method "mpi" it is
// collective over MPI_COMM_WORLD for a variable this store created.
func (s *Store) Free(name string) error { return s.c.Free(name) }

// Close releases this rank's mappings and connections. The data stay with
// the agent; Close is idempotent.
func (s *Store) Close() error { return s.c.Close() }
