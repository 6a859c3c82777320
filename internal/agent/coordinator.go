package agent

// The coordinator's driver: coord.Coordinator is the deterministic core
// (rounds, tables, joins); here are the goroutines, the clock and the
// connections around it — a rank's Publish waiting for its round, finding
// the coordinator and joining it, and the coordinator's peer ops.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/coord"
	"github.com/ddstore-go/ddstore/internal/rendezvous"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// coordinator drives a coord.Coordinator: calls into it are serialized by
// mu, and the replies it returns reach the requests waiting for them.
type coordinator struct {
	// mu is a leaf: nothing blocks under it and it never calls the agent
	// (lock order: internal/LOCKS.md).
	mu struct {
		sync.Mutex
		core    *coord.Coordinator
		next    uint64                      // the last request id
		waiting map[uint64]chan coord.Reply // requests whose reply is due
	}
}

func newCoordinator() *coordinator {
	c := &coordinator{}
	c.mu.core = coord.New()
	c.mu.waiting = make(map[uint64]chan coord.Reply)
	return c
}

// deliverLocked hands replies to their requests; the caller holds c.mu.
func (c *coordinator) deliverLocked(replies []coord.Reply) {
	for _, r := range replies {
		if ch, ok := c.mu.waiting[r.Req]; ok {
			delete(c.mu.waiting, r.Req)
			ch <- r
		}
	}
}

// publish adds one rank's shard and waits until every rank's is there (the
// table), a rank disagrees (an error for all), or timeout has passed or ctx
// ended (the round fails with ErrTimeout for every rank).
func (c *coordinator) publish(ctx context.Context, sh wire.Shard, timeout time.Duration) (*wire.Table, error) {
	r := c.await(ctx, timeout, func(now time.Time, req uint64) []coord.Reply {
		return c.mu.core.Publish(now, req, sh, now.Add(timeout))
	})
	return r.Table, r.Err
}

// barrier adds one rank's arrival at a fence and waits until every rank of
// it has come, the ranks disagree (an error for all), or timeout has
// passed or ctx ended (the fence fails with ErrTimeout for every rank).
func (c *coordinator) barrier(ctx context.Context, m wire.Barrier, timeout time.Duration) error {
	return c.await(ctx, timeout, func(now time.Time, req uint64) []coord.Reply {
		return c.mu.core.Barrier(now, req, m, now.Add(timeout))
	}).Err
}

// await files one request with the core through enter (called under c.mu
// with the time and the request's id) and waits for its reply. When
// timeout passes or ctx ends first, the core expires the request, so its
// round fails for every rank rather than leaving the others waiting.
func (c *coordinator) await(ctx context.Context, timeout time.Duration, enter func(now time.Time, req uint64) []coord.Reply) coord.Reply {
	ch := make(chan coord.Reply, 1)
	now := time.Now()
	c.mu.Lock()
	c.mu.next++
	req := c.mu.next
	c.mu.waiting[req] = ch
	c.deliverLocked(enter(now, req))
	c.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case r := <-ch:
		return r
	case <-t.C:
	case <-ctx.Done():
	}
	c.mu.Lock()
	c.deliverLocked(c.mu.core.Expire(time.Now(), req))
	c.mu.Unlock()
	// Expire answered req, or its round had answered it already.
	return <-ch
}

func (c *coordinator) join(node, addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.core.Join(node, addr)
}

func (c *coordinator) lookup(name string) (*wire.Table, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.core.Lookup(name)
}

func (c *coordinator) free(name string, rank int64) *wire.Table {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.core.Free(name, rank)
}

func (c *coordinator) nodes() (ids, addrs []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.core.Nodes()
}

func (c *coordinator) addr(node string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.core.Addr(node)
}

// round is coord.Coordinator.Round.
func (c *coordinator) round(name string, attempt int64) (ranks int, failed, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.core.Round(name, attempt)
}

func (c *coordinator) snapshot() *coord.State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.core.Snapshot()
}

func (c *coordinator) restore(s *coord.State) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.core.Restore(s)
}

// newCoordinator makes this agent's coordinator, with the state a previous
// coordinator of the job left on this node, if any.
func (a *Agent) newCoordinator() *coordinator {
	c := newCoordinator()
	c.restore(a.restored)
	return c
}

// becomeCoordinator is called when rank 0 says hello in handshake mode.
func (a *Agent) becomeCoordinator() error {
	// With a rendezvous address too, the rendezvous decides (whoever could
	// listen there coordinates): never two coordinators.
	if a.cfg.HandshakeDir == "" || a.cfg.Rendezvous != "" || a.coord.Load() != nil {
		return nil
	}
	c := a.newCoordinator()
	if !a.coord.CompareAndSwap(nil, c) {
		return nil
	}
	c.join(a.cfg.Node, a.addr)
	rec := nodeRecord{Node: a.cfg.Node, Addr: a.addr, Pid: os.Getpid(), Key: a.coordinatorKey()}
	return rendezvous.WriteRecord(a.cfg.HandshakeDir, a.recordName("coordinator"), rec)
}

// coordinatorAddr finds the coordinator and joins it once; "" means this
// agent is the coordinator.
func (a *Agent) coordinatorAddr(ctx context.Context) (string, error) {
	if a.coord.Load() != nil {
		return "", nil
	}
	a.joinMu.Lock()
	defer a.joinMu.Unlock()
	if a.joined != "" {
		return a.joined, nil
	}
	addr := a.coordAddr
	if addr == "" {
		var rec nodeRecord
		err := rendezvous.WaitRecord(ctx, a.cfg.HandshakeDir, a.recordName("coordinator"), a.cfg.JoinTimeout, &rec)
		if err != nil {
			return "", fmt.Errorf("%w: waiting for the coordinator (the agent of rank 0) in %s: %w", base.ErrTimeout, a.cfg.HandshakeDir, err)
		}
		if a.coord.Load() != nil { // rank 0 said hello here meanwhile
			return "", nil
		}
		if err := a.takeRecordKey(rec); err != nil {
			return "", err
		}
		addr = rec.Addr
	}
	j := wire.Join{Node: a.cfg.Node, Addr: a.addr, Namespace: a.cfg.Namespace}
	if _, err := a.callUntil(ctx, addr, wire.OpJoin, j.Encode); err != nil {
		return "", err
	}
	a.joined = addr
	return addr, nil
}

// callUntil retries a control call while the coordinator is not up yet, so
// that agents may start in any order.
func (a *Agent) callUntil(ctx context.Context, addr string, op wire.Op, fill func(*wire.Encoder)) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.JoinTimeout)
	defer cancel()
	wait := 5 * time.Millisecond
	for {
		body, err := a.pool.Call(ctx, addr, op, fill)
		if err == nil || !errors.Is(err, base.ErrPeer) || !isConnectError(err) {
			return body, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: coordinator %s unreachable: %w", base.ErrTimeout, addr, err)
		case <-time.After(wait):
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

func isConnectError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// roundTimeout is how long the coordinator waits for a round's ranks: the
// shard's own timeout, bounded by the agent's join timeout.
func (a *Agent) roundTimeout(m wire.Shard) time.Duration {
	if m.TimeoutMs > 0 {
		return min(a.cfg.JoinTimeout, msDuration(m.TimeoutMs))
	}
	return a.cfg.JoinTimeout
}

// coordPublish hands a rank's shard to the coordinator, here or over the
// peer protocol, and waits for its round.
func (a *Agent) coordPublish(ctx context.Context, m wire.Shard) (*wire.Table, error) {
	addr, err := a.coordinatorAddr(ctx)
	if err != nil {
		return nil, err
	}
	if addr == "" {
		// Here the round's own timeout, as the coordinator applies it to
		// shards arriving from other agents (coordinatorOp).
		return a.coord.Load().publish(ctx, m, a.roundTimeout(m))
	}
	body, err := a.pool.Call(ctx, addr, wire.OpPeerPublish, m.Encode)
	if err != nil {
		return nil, err
	}
	t, err := wire.DecodeTable(body)
	return &t, err
}

// barrierTimeout is how long the coordinator waits for a fence's ranks: the
// rank's own timeout, bounded by the agent's join timeout.
func (a *Agent) barrierTimeout(m wire.Barrier) time.Duration {
	if m.TimeoutMs > 0 {
		return min(a.cfg.JoinTimeout, msDuration(m.TimeoutMs))
	}
	return a.cfg.JoinTimeout
}

// coordBarrier hands a rank's arrival at a fence to the coordinator, here
// or over the peer protocol, and waits for the fence's other ranks.
func (a *Agent) coordBarrier(ctx context.Context, m wire.Barrier) error {
	addr, err := a.coordinatorAddr(ctx)
	if err != nil {
		return err
	}
	if addr == "" {
		return a.coord.Load().barrier(ctx, m, a.barrierTimeout(m))
	}
	_, err = a.pool.Call(ctx, addr, wire.OpPeerBarrier, m.Encode)
	return err
}

// isCoordinatorOp says whether only the coordinator answers op.
func isCoordinatorOp(op wire.Op) bool {
	switch op {
	case wire.OpJoin, wire.OpPeerPublish, wire.OpPeerLookup, wire.OpPeerFree, wire.OpPeerNodes, wire.OpPeerBarrier:
		return true
	}
	return false
}

// coordinatorOp answers the peer ops only the coordinator answers
// (isCoordinatorOp), from other agents.
func (a *Agent) coordinatorOp(ctx context.Context, op wire.Op, body []byte) (func(*wire.Encoder), error) {
	c := a.coord.Load()
	if c == nil {
		return nil, base.Errorf(base.ErrArgument, "node %q is not the coordinator of namespace %q", a.cfg.Node, a.cfg.Namespace)
	}
	switch op {
	case wire.OpJoin:
		m, err := wire.DecodeJoin(body)
		if err != nil {
			return nil, err
		}
		if m.Namespace != a.cfg.Namespace {
			return nil, base.Errorf(base.ErrArgument, "agent of node %q in namespace %q reached the coordinator of namespace %q: give each job its own rendezvous address or handshake directory",
				m.Node, m.Namespace, a.cfg.Namespace)
		}
		c.join(m.Node, m.Addr)
		return nil, nil
	case wire.OpPeerPublish:
		m, err := wire.DecodeShard(body)
		if err != nil {
			return nil, err
		}
		t, err := c.publish(ctx, m, a.roundTimeout(m))
		if err != nil {
			return nil, err
		}
		a.saveManifest()
		return t.Encode, nil
	case wire.OpPeerBarrier:
		m, err := wire.DecodeBarrier(body)
		if err != nil {
			return nil, err
		}
		return nil, c.barrier(ctx, m, a.barrierTimeout(m))
	case wire.OpPeerLookup:
		m, err := wire.DecodeName(body)
		if err != nil {
			return nil, err
		}
		t, err := c.lookup(m.Name)
		if err != nil {
			return nil, err
		}
		return t.Encode, nil
	case wire.OpPeerFree:
		m, err := wire.DecodeName(body)
		if err != nil {
			return nil, err
		}
		if t := c.free(m.Name, m.Rank); t != nil {
			a.dropEverywhere(t)
		}
		a.saveManifest()
		return nil, nil
	case wire.OpPeerNodes:
		m, err := wire.DecodePeerNodes(body)
		if err != nil {
			return nil, err
		}
		ids, addrs := c.nodes()
		t := wire.Table{Nodes: ids, Addrs: addrs}
		if m.Node != "" {
			t.Nodes, t.Addrs = nil, nil
			if addr := c.addr(m.Node); addr != "" {
				t.Nodes, t.Addrs = []string{m.Node}, []string{addr}
			}
		}
		return t.Encode, nil
	}
	return nil, base.Errorf(base.ErrProtocol, "peer op %s is not the coordinator's", op)
}

// countCoordinatorOp is coordinatorOp, with the request and its reply
// counted in the coordinator's counters (a.stats.coord).
func (a *Agent) countCoordinatorOp(ctx context.Context, op wire.Op, body []byte) (func(*wire.Encoder), error) {
	cc := &a.stats.coord
	cc.in.Add(1)
	cc.inBytes.Add(int64(wire.HeaderSize + len(body)))
	cc.out.Add(1)
	fill, err := a.coordinatorOp(ctx, op, body)
	if err != nil {
		cc.outBytes.Add(int64(len(wire.AppendError(nil, op, 0, err))))
		return nil, err
	}
	if fill == nil {
		cc.outBytes.Add(wire.HeaderSize)
		return nil, nil
	}
	return func(e *wire.Encoder) {
		n := len(e.Bytes())
		fill(e)
		cc.outBytes.Add(int64(wire.HeaderSize + len(e.Bytes()) - n))
	}, nil
}
