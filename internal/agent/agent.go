// Package agent is the per-node process of ddstore: it owns the node's
// shards in shared memory, serves the node's clients on a Unix socket and the
// other nodes' agents over a Transport, and one agent per job (the
// coordinator) turns the ranks' declarations into variables.
package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/coord"
	"github.com/ddstore-go/ddstore/internal/naming"
	"github.com/ddstore-go/ddstore/internal/rendezvous"
	"github.com/ddstore-go/ddstore/internal/shm"
	"github.com/ddstore-go/ddstore/internal/tier"
	"github.com/ddstore-go/ddstore/internal/transport"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// Config is what an agent needs to know.
type Config struct {
	Namespace string // the job's namespace; agents and clients of other namespaces never meet
	Node      string // this node's identity
	Socket    string // Unix socket for the node's clients
	// PeerListen is the TCP address to serve other agents on; empty means
	// 127.0.0.1:0 for a single-node job and :0 otherwise.
	PeerListen string
	// Advertise is the address other agents dial; empty derives it from the
	// listener.
	Advertise string
	// Rendezvous is a host:port served by the coordinator: the agent that
	// can listen there is it, the others dial it.
	Rendezvous string
	// HandshakeDir is a directory on a shared filesystem where agents leave
	// their addresses; the agent that serves rank 0 coordinates.
	HandshakeDir string
	// Timeout bounds a read from another node (never a hang); zero: 30 s.
	Timeout time.Duration
	// JoinTimeout bounds waiting for the coordinator to appear; zero: 5 min.
	JoinTimeout time.Duration
	// IdleExit stops the agent after that long without a client (agents
	// started on demand use it); zero: never.
	IdleExit     time.Duration
	ConnsPerPeer int
	// PeerIdle closes the connections to another agent unused that long
	// (zero: never); MaxPeers caps the agents it holds connections to
	// (zero: no cap). Both: transport.Options.
	PeerIdle time.Duration
	MaxPeers int
	// RelayFanout is how many nodes the coordinator sends a round's table
	// to, and each of them on to (docs/design.md, Publish rounds at
	// scale); zero: 8.
	RelayFanout int
	// MemoryBytes caps what the agent holds: the data of its shards plus
	// the receive regions its clients register. A Create or Register that
	// would go beyond it is refused before anything is allocated. Zero:
	// unlimited.
	MemoryBytes int64
	// StagingBytes is the memory each variable with a backing file may use
	// for rows read ahead of use (Prefetch), charged to MemoryBytes when
	// first used; zero: tier.DefaultStagingBytes.
	StagingBytes int64
	// Persist keeps the shards when the agent stops (SIGTERM, Close): its
	// manifest and segments stay, and the next agent of the namespace on
	// this node re-adopts them. Without it a clean stop removes them (an
	// agent killed outright leaves them too, and its successor re-adopts
	// them just the same).
	Persist bool
	// Transport moves rows between nodes: "tcp" (the default) or "mpi":
	// one-sided MPI gets, for agents started as the ranks of one MPI
	// launch, one per node (needs a build with the tag mpi; control
	// messages stay on TCP), or "fabric": libfabric RMA reads of the
	// owners' registered shards (build tag fabric; provider from
	// DDSTORE_FABRIC). See internal/transport.
	Transport string
	// MetricsAddr is a TCP HOST:PORT where the agent serves its counters
	// at /metrics in the Prometheus text format; empty: not served.
	MetricsAddr string
	Logger      *slog.Logger
	// Secret is the job's shared secret, from which agents and clients
	// derive the keys they prove (internal/auth); empty: DDSTORE_SECRET.
	// Without one the keys are generated (see docs/design.md, Security),
	// and agents that meet through a Rendezvous refuse to start.
	Secret string
}

// Agent is a running node agent.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	lock   int // flock'ed file: one agent per namespace and node (never waits; internal/LOCKS.md)
	ln     *net.UnixListener
	peer   *transport.Server
	pool   *transport.Pool
	addr   string // advertised peer address
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	done   chan struct{}
	closed sync.Once

	// rows reads rows of other nodes and exposes this node's shards to
	// them: tcp (over pool), mpi or fabric.
	rows transport.Engine
	// serving is set once start succeeded: only then is a collective
	// engine (mpi) closed at shutdown (an agent that failed to start exits
	// and its launcher ends the job).
	serving atomic.Bool

	// coord is set when this agent coordinates the job.
	coord atomic.Pointer[coordinator]
	// coordAddr is the coordinator's peer address when another agent is it
	// (rendezvous mode); in handshake mode it is read from the directory.
	coordAddr string
	joinMu    sync.Mutex // guards joined, held while finding and joining the coordinator; lock order: internal/LOCKS.md
	joined    string     // coordinator address this agent has joined

	// tree is this node's place in the gather tree of the rounds' requests
	// (from the last table it got; nil: none yet), gathers the rounds it
	// relays (gather.go).
	tree    atomic.Pointer[gatherView]
	gathers gathers

	// auth holds the keys clients and peers prove, and the count of
	// connections refused for not proving them (auth.go).
	auth agentAuth

	// mu guards vars, sessions and idleFrom; no network wait under it;
	// lock order: internal/LOCKS.md.
	mu struct {
		sync.Mutex
		vars     map[string]*variable
		sessions map[*session]struct{}
		procs    map[int32]*clientProc // the client processes of sessions, by pid (clients.go)
		idleFrom time.Time
		// createErrs are why a rank's Create failed here, until its
		// client's failed Publish carries the reason to the round
		// (Shard.Why); bounded by maxCreateErrs.
		createErrs map[createKey]string
	}
	regions regions
	stats   stats
	metrics *metrics

	// shardBytes is the data of the shards this agent holds (charged when a
	// shard is admitted, given back when it is removed; the receive regions
	// are counted by a.regions itself). admitMu makes checking the budget
	// and charging it one step; nothing is locked while holding it but
	// a.regions.mu.
	shardBytes atomic.Int64
	admitMu    sync.Mutex // lock order: internal/LOCKS.md
	// stagingBytes is the staging memory of the storage tiers.
	stagingBytes atomic.Int64

	// restored is the coordinator's part of the manifest a previous agent
	// left, for when this one becomes coordinator; manifestMu serializes
	// saving the manifest (reading the state, then writing the file).
	restored   *coord.State
	manifestMu sync.Mutex // first of the agent's; lock order: internal/LOCKS.md
	// saves batches the saves asked for at once (persist.go).
	saves manifestSaves
	// leads: the node's rank that brings each round's table; shardBatch:
	// the other ranks' shards on their way to the coordinator (coordRound);
	// freeBatch: the ranks' frees.
	leads      roundLeads
	shardBatch batcher[wire.Shard]
	freeBatch  batcher[wire.Name]

	// inflight counts client requests being served; once draining is set
	// (a stop), sessions take no new ones and the stop waits for these.
	inflight atomic.Int64
	draining atomic.Bool
}

type stats struct {
	clientRequests atomic.Int64
	readRows       atomic.Int64
	servedRows     atomic.Int64
	servedBytes    atomic.Int64
	fetches        atomic.Int64
	errors         atomic.Int64
	badFrames      atomic.Int64
	// tier is what the storage tiers count.
	tier tier.Counters
	// peerFallbackRows counts rows read from the backing file because the
	// node holding them could not be reached.
	peerFallbackRows atomic.Int64
	// adopted counts variables re-adopted from a previous agent's manifest;
	// addrRefreshes, tables refreshed after a node's address went stale.
	adopted       atomic.Int64
	addrRefreshes atomic.Int64
	// tablesRelayed counts tables this agent gave other nodes (PeerTable).
	tablesRelayed atomic.Int64
	// dropsRelayed counts drops this agent passed on to other nodes
	// (PeerDrop with nodes) for the coordinator.
	dropsRelayed atomic.Int64
	// gathersRelayed counts the children's round requests this agent
	// carried up the gather tree and answered (PeerGather);
	// gathersDirect its own that its relay did not carry, sent to the
	// coordinator instead.
	gathersRelayed, gathersDirect atomic.Int64
	// roundsLost counts ranks of this node the agent told the
	// coordinator were out of their round (reportLost).
	roundsLost atomic.Int64
	// roundsKept counts ranks of this node whose answer from the
	// coordinator was lost after their round completed, which kept their
	// shard (reportLost).
	roundsKept atomic.Int64
	// nodesGone counts, on the coordinator, nodes whose agent it found
	// gone (holdWatch).
	nodesGone atomic.Int64
	// errorKinds counts errors answered to clients by kind.
	errorKinds errorKinds
	// coord counts what the coordinator receives and sends over the peer
	// protocol (zero on other agents).
	coord coordCounters
}

// coordCounters are the coordinator's messages and their bytes (frame
// headers included): requests from other agents in, their replies and the
// coordinator's own requests (PeerDrop) out. Ranks on the coordinator's
// own node reach it without a message and are not counted.
type coordCounters struct {
	in, inBytes, out, outBytes atomic.Int64
}

// Start runs an agent until Close (or its idle exit).
func Start(cfg Config) (*Agent, error) {
	if cfg.Namespace == "" || cfg.Node == "" || cfg.Socket == "" {
		return nil, base.Errorf(base.ErrArgument, "agent needs a namespace, a node and a socket (got %q, %q, %q)", cfg.Namespace, cfg.Node, cfg.Socket)
	}
	if err := naming.CheckName("namespace", cfg.Namespace); err != nil {
		return nil, err
	}
	if err := naming.CheckName("node", cfg.Node); err != nil {
		return nil, err
	}
	switch cfg.Transport {
	case "", TransportTCP, TransportMPI, TransportFabric:
	default:
		return nil, base.Errorf(base.ErrArgument, "transport %q: want %s, %s or %s", cfg.Transport, TransportTCP, TransportMPI, TransportFabric)
	}
	if cfg.StagingBytes < 0 {
		return nil, base.Errorf(base.ErrArgument, "staging of %d bytes: want > 0, or 0 for the default", cfg.StagingBytes)
	}
	if cfg.MemoryBytes < 0 {
		return nil, base.Errorf(base.ErrArgument, "memory budget of %d bytes: want > 0, or 0 for none", cfg.MemoryBytes)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.JoinTimeout <= 0 {
		cfg.JoinTimeout = 5 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	a := &Agent{cfg: cfg, log: cfg.Logger.With("ns", cfg.Namespace, "node", cfg.Node), lock: -1, done: make(chan struct{})}
	a.mu.vars = make(map[string]*variable)
	a.mu.sessions = make(map[*session]struct{})
	a.mu.createErrs = make(map[createKey]string)
	a.mu.procs = make(map[int32]*clientProc)
	a.mu.idleFrom = time.Now()
	a.regions.m = make(map[uint32]*region)
	a.metrics = newMetrics(a)
	a.ctx, a.cancel = context.WithCancel(context.Background())
	if err := a.start(); err != nil {
		a.shutdown()
		return nil, err
	}
	return a, nil
}

func (a *Agent) start() error {
	cfg := a.cfg
	if err := os.MkdirAll(filepath.Dir(cfg.Socket), 0o700); err != nil {
		return fmt.Errorf("ddstore: socket directory: %w", err)
	}
	if err := checkPrivateDir(filepath.Dir(cfg.Socket)); err != nil {
		return err
	}
	lock, err := naming.LockFile(cfg.Socket + ".lock")
	if err != nil {
		return fmt.Errorf("%w: an agent for namespace %q node %q already runs (lock %s.lock held)", naming.ErrAgentRuns, cfg.Namespace, cfg.Node, cfg.Socket)
	}
	a.lock = lock
	// The key file goes before the socket: a client that reaches the
	// socket finds it.
	if err := a.initAuth(); err != nil {
		return err
	}
	// The peer pool and the transport go before re-adoption, which
	// exposes the adopted shards in the MPI window.
	a.pool = transport.NewPool(transport.Options{ConnsPerPeer: cfg.ConnsPerPeer, Timeout: cfg.Timeout,
		IdleClose: cfg.PeerIdle, MaxPeers: cfg.MaxPeers, Key: a.peerKey})
	a.initBatchers()
	if err := a.startTransport(); err != nil {
		return err
	}
	// What a previous agent of this namespace and node left: re-adopted
	// before anyone is served.
	restart := a.adopt()
	os.Remove(cfg.Socket) // a dead agent's socket: the lock says nobody serves it
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: cfg.Socket, Net: "unix"})
	if err != nil {
		return fmt.Errorf("ddstore: listen on %s: %w", cfg.Socket, err)
	}
	ln.SetUnlinkOnClose(true)
	a.ln = ln
	if err := os.Chmod(cfg.Socket, 0o600); err != nil {
		return err
	}

	var pln net.Listener
	switch {
	case cfg.Rendezvous != "":
		// Whoever can listen on the rendezvous address coordinates.
		if l, err := net.Listen("tcp", cfg.Rendezvous); err == nil {
			pln = l
			a.coord.Store(a.newCoordinator())
		} else {
			a.coordAddr = cfg.Rendezvous
		}
	case cfg.HandshakeDir == "":
		a.coord.Store(a.newCoordinator()) // a single-node job: this agent is the whole job
	}
	if pln == nil {
		listen := cfg.PeerListen
		if listen == "" {
			listen = ":0"
			if cfg.HandshakeDir == "" && (cfg.Rendezvous == "" || isLoopbackHost(cfg.Rendezvous)) {
				listen = "127.0.0.1:0"
			}
		}
		if pln, err = net.Listen("tcp", listen); err != nil {
			return fmt.Errorf("ddstore: peer listen on %s: %w", listen, err)
		}
	}
	a.addr = advertise(cfg, pln.Addr().(*net.TCPAddr))
	a.peer = transport.NewServer(pln, (*peerHandler)(a), a.log, cfg.Timeout, a.peerKey)
	if err := a.serveMetrics(); err != nil {
		return err
	}
	if c := a.coord.Load(); c != nil {
		c.join(cfg.Node, a.addr)
	}
	if cfg.HandshakeDir != "" {
		rec := nodeRecord{Node: cfg.Node, Addr: a.addr, Pid: os.Getpid()}
		if err := rendezvous.WriteRecord(cfg.HandshakeDir, a.recordName("node."+shm.Escape(cfg.Node)), rec); err != nil {
			return err
		}
	}
	a.go_(a.acceptLoop)
	if restart && a.coord.Load() == nil {
		// Other nodes still read this node's rows at its old address: tell
		// the coordinator the new one now, not at the first client's
		// request — also when nothing could be re-adopted, so that their
		// reads reach this agent and learn that its rows are gone.
		a.go_(func() {
			if _, err := a.coordinatorAddr(a.ctx); err != nil && a.ctx.Err() == nil {
				a.log.Warn("could not rejoin the coordinator after a restart", "err", err)
			}
		})
	}
	if cfg.IdleExit > 0 {
		a.go_(a.idleLoop)
	}
	a.serving.Store(true)
	a.log.Info("agent started", "socket", cfg.Socket, "peer", a.addr, "coordinator", a.coord.Load() != nil, "memory_budget", cfg.MemoryBytes, "transport", a.transportName())
	return nil
}

// nodeRecord is what an agent leaves in the handshake directory.
type nodeRecord struct {
	Node string `json:"node"`
	Addr string `json:"addr"`
	Pid  int    `json:"pid"`
	// Key is the job's key (hex), in the coordinator's record only, and
	// only when the agents have no secret of their own (DDSTORE_SECRET).
	Key string `json:"key,omitempty"`
}

func (a *Agent) recordName(what string) string {
	return shm.Escape(a.cfg.Namespace) + "." + what + ".json"
}

// go_ starts a goroutine the agent owns: Close waits for it.
func (a *Agent) go_(f func()) {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		f()
	}()
}

// Socket is the client socket's path.
func (a *Agent) Socket() string { return a.cfg.Socket }

// PeerAddr is the address other agents reach this one at.
func (a *Agent) PeerAddr() string { return a.addr }

// Done is closed once the agent has stopped.
func (a *Agent) Done() <-chan struct{} { return a.done }

// Close stops the agent: no new clients, connections closed, every
// goroutine ended, segments unmapped and removed.
func (a *Agent) Close() error {
	a.shutdown()
	<-a.done
	return nil
}

func (a *Agent) shutdown() {
	a.closed.Do(func() {
		// Stop accepting, let the requests in flight finish (bounded), then
		// end everything.
		a.draining.Store(true)
		if a.ln != nil {
			a.ln.Close()
		}
		a.drain(min(a.cfg.Timeout, drainTimeout))
		a.cancel()
		a.mu.Lock()
		for s := range a.mu.sessions {
			s.conn.Close()
		}
		a.mu.Unlock()
		if a.peer != nil {
			a.peer.Close()
		}
		if a.pool != nil {
			a.pool.Close()
		}
		a.closeMetrics()
		a.wg.Wait()
		a.regions.closeAll()
		if a.cfg.Persist && a.lock >= 0 {
			a.saveManifest()
		}
		a.mu.Lock()
		for _, v := range a.mu.vars {
			n := v.heldBytes()
			if a.cfg.Persist {
				v.unmap() // the segments and the manifest stay for the next agent
			} else {
				v.drop()
			}
			a.shardBytes.Add(-n)
		}
		a.mu.vars = nil
		a.mu.Unlock()
		if a.rows != nil && (a.serving.Load() || !a.rows.Collective()) {
			// After the shards were withdrawn above; a collective Close
			// returns once every agent of the MPI world stops.
			if err := a.rows.Close(); err != nil {
				a.log.Warn("closing the transport", "transport", a.rows.Kind(), "err", err)
			}
		}
		if !a.cfg.Persist && a.lock >= 0 {
			a.removeManifest()
		}
		if a.cfg.HandshakeDir != "" {
			rendezvous.RemoveRecord(a.cfg.HandshakeDir, a.recordName("node."+shm.Escape(a.cfg.Node)))
			if a.coord.Load() != nil {
				rendezvous.RemoveRecord(a.cfg.HandshakeDir, a.recordName("coordinator"))
			}
		}
		if a.lock >= 0 {
			// Unlink while still holding the lock: naming.LockFile checks that the
			// file it locked is still the one at the path.
			os.Remove(a.cfg.Socket + ".lock")
			a.removeKeyFile()
			unix.Close(a.lock)
		}
		a.log.Info("agent stopped")
		close(a.done)
	})
}

func (a *Agent) idleLoop() {
	t := time.NewTicker(min(a.cfg.IdleExit/4+time.Millisecond, time.Second))
	defer t.Stop()
	for {
		select {
		case <-a.ctx.Done():
			return
		case <-t.C:
		}
		a.mu.Lock()
		idle := len(a.mu.sessions) == 0 && time.Since(a.mu.idleFrom) >= a.cfg.IdleExit
		a.mu.Unlock()
		if idle {
			a.log.Info("no client for a while; stopping", "idle", a.cfg.IdleExit)
			go a.shutdown() // shutdown waits for this goroutine
			return
		}
	}
}

// drainTimeout bounds how long a stopping agent waits for the requests in
// flight (a Publish may wait for other ranks far longer).
const drainTimeout = 10 * time.Second

// drain waits until no client request is in flight, or d has passed.
func (a *Agent) drain(d time.Duration) {
	deadline := time.Now().Add(d)
	for a.inflight.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	if n := a.inflight.Load(); n > 0 {
		a.log.Warn("stopping with requests still in flight", "requests", n)
	}
}

// Info is what `ddstore info` shows; VarInfo one variable in it. The
// types are the protocol's (the JSON of an Info reply), which clients
// decode without linking the agent.
type (
	Info    = wire.AgentInfo
	VarInfo = wire.AgentVariable
)

func (a *Agent) info() Info {
	in := Info{Namespace: a.cfg.Namespace, Node: a.cfg.Node, Pid: os.Getpid(), Socket: a.cfg.Socket,
		PeerAddr: a.addr, Coordinator: a.coord.Load() != nil, Regions: a.regions.count(), MemoryBudget: a.cfg.MemoryBytes,
		HandshakeDir: a.cfg.HandshakeDir}
	a.mu.Lock()
	in.Clients = len(a.mu.sessions)
	vars := make([]*variable, 0, len(a.mu.vars))
	for _, v := range a.mu.vars {
		vars = append(vars, v)
	}
	a.mu.Unlock()
	// Outside a.mu: a variable's lock may wait on rows being sent.
	for _, v := range vars {
		vi := v.info()
		in.MemoryBytes += vi.LocalBytes + vi.IndexBytes
		in.Variables = append(in.Variables, vi)
	}
	sortVarInfos(in.Variables)
	in.MemoryBytes += a.regions.bytes()
	s := &a.stats
	in.Counters = map[string]int{
		"client_requests": int(s.clientRequests.Load()), "read_rows": int(s.readRows.Load()),
		"served_rows": int(s.servedRows.Load()), "served_bytes": int(s.servedBytes.Load()),
		"fetches": int(s.fetches.Load()), "errors": int(s.errors.Load()),
		"bad_frames":   int(s.badFrames.Load() + a.peer.BadFrames.Load()),
		"storage_rows": int(s.tier.Rows.Load()), "storage_reads": int(s.tier.Reads.Load()),
		"storage_bytes": int(s.tier.Bytes.Load()), "storage_errors": int(s.tier.Errors.Load()),
		"staged_rows": int(s.tier.Staged.Load()), "prefetch_rows": int(s.tier.Prefetched.Load()),
		"prefetch_dropped": int(s.tier.Dropped.Load()), "prefetch_evicted": int(s.tier.Evicted.Load()),
		"prefetch_late":      int(s.tier.Late.Load()),
		"peer_fallback_rows": int(s.peerFallbackRows.Load()), "adopted_variables": int(s.adopted.Load()),
		"addr_refreshes":    int(s.addrRefreshes.Load()),
		"coord_messages_in": int(s.coord.in.Load()), "coord_bytes_in": int(s.coord.inBytes.Load()),
		"coord_messages_out": int(s.coord.out.Load()), "coord_bytes_out": int(s.coord.outBytes.Load()),
		"manifest_writes": int(a.saves.written.Load()), "tables_relayed": int(s.tablesRelayed.Load()),
		"drops_relayed": int(s.dropsRelayed.Load()), "gathers_relayed": int(s.gathersRelayed.Load()), "gathers_direct": int(s.gathersDirect.Load()),
		"rounds_lost": int(s.roundsLost.Load()), "rounds_kept": int(s.roundsKept.Load()), "nodes_gone": int(s.nodesGone.Load()), "goroutines": runtime.NumGoroutine(), "peer_conns_out": a.pool.Conns(), "peer_conns_in": a.peer.Conns(),
		"peer_conns_idle_closed": int(a.pool.IdleClosed()),
	}
	s.errorKinds.counters(in.Counters)
	in.MemoryBytes += a.stagingBytes.Load()
	if c := a.coord.Load(); c != nil {
		in.Nodes, _ = c.nodes()
		in.Collectives = c.collectives()
	}
	in.Auth = a.authSource()
	in.Transport = a.transportName()
	in.Counters["refused_connections"] = int(a.auth.refusedClients.Load() + a.peer.Refused.Load())
	in.Counters["peer_shed_connections"] = int(a.peer.Shed.Load())
	in.Counters["direct_connections"] = int(a.peer.Direct.Load())
	in.Counters["peer_throttled"] = int(a.peer.Throttled.Load())
	return in
}

func (a *Agent) infoJSON() string {
	b, _ := json.Marshal(a.info())
	return string(b)
}

func checkPrivateDir(dir string) error {
	st, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return base.Errorf(base.ErrArgument, "socket directory %s has mode %o: want 0700 (it must be private to the job's user)", dir, st.Mode().Perm())
	}
	if sys, ok := st.Sys().(*unix.Stat_t); ok && int(sys.Uid) != os.Geteuid() {
		return base.Errorf(base.ErrArgument, "socket directory %s belongs to uid %d, not %d", dir, sys.Uid, os.Geteuid())
	}
	return nil
}

func isLoopbackHost(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// advertise picks the address peers dial: the configured one, the
// listener's own if it is specific, else this host's outbound address.
func advertise(cfg Config, l *net.TCPAddr) string {
	if cfg.Advertise != "" {
		return cfg.Advertise
	}
	if !l.IP.IsUnspecified() {
		return l.String()
	}
	port := fmt.Sprint(l.Port)
	if cfg.Rendezvous != "" {
		if c, err := net.Dial("udp", cfg.Rendezvous); err == nil {
			ip := c.LocalAddr().(*net.UDPAddr).IP
			c.Close()
			return net.JoinHostPort(ip.String(), port)
		}
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, x := range addrs {
			if n, ok := x.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
				return net.JoinHostPort(n.IP.String(), port)
			}
		}
	}
	return net.JoinHostPort("127.0.0.1", port)
}

func (a *Agent) connsPerPeer() int {
	if a.cfg.ConnsPerPeer > 0 {
		return a.cfg.ConnsPerPeer
	}
	return 4
}

// admit checks that n more bytes fit in the memory budget and, for a shard,
// charges them (a region is counted once a.regions holds it: register
// calls add while admitMu is held). It returns a function that ends the
// admission; the caller calls it once the region is added or refused. what
// names the memory asked for, as the error says it.
func (a *Agent) admit(n int64, shard bool, what func(size string) string) (done func(), err error) {
	if a.cfg.MemoryBytes <= 0 {
		if shard {
			a.shardBytes.Add(n)
		}
		return func() {}, nil
	}
	a.admitMu.Lock()
	used := a.shardBytes.Load() + a.regions.bytes() + a.stagingBytes.Load()
	if n > a.cfg.MemoryBytes-used {
		a.admitMu.Unlock()
		return nil, base.Errorf(base.ErrArgument, "%s would take node %q to %s, above its memory budget of %s (--memory)",
			what(formatBytes(n)), a.cfg.Node, formatBytes(used+n), formatBytes(a.cfg.MemoryBytes))
	}
	if shard {
		a.shardBytes.Add(n)
	}
	return a.admitMu.Unlock, nil
}

// admitStaging charges n bytes of staging memory to the budget; release
// gives them back.
func (a *Agent) admitStaging(n int64, what func(size string) string) (release func(), err error) {
	done, err := a.admit(n, false, what)
	if err != nil {
		return nil, err
	}
	a.stagingBytes.Add(n)
	done()
	return func() { a.stagingBytes.Add(-n) }, nil
}

// formatBytes writes n as 512 B, 1.5 GiB, 8 GiB.
func formatBytes(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	f, unit := float64(n)/1024, 0
	for f >= 1024 && unit < 5 {
		f /= 1024
		unit++
	}
	s := strconv.FormatFloat(f, 'f', 1, 64)
	s = strings.TrimSuffix(s, ".0")
	return s + " " + string("KMGTPE"[unit]) + "iB"
}

func msDuration(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }
