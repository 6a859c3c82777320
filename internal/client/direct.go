package client

// Direct reads: a small read whose rows are all on one other node goes
// straight to that node's agent, on its peer port, over a pooled TCP
// connection that proved the job's direct key (docs/design.md, Reading;
// docs/protocol.md, Authentication): one network round trip, the rows
// read with readv into the caller's buffer. The owner checks the variable's
// name and table id as it does for its peers' Fetch; on any failure (no
// key, no address, a refused or broken connection, an error reply) the
// read goes through this node's agent instead, which gives the answer that
// path gives (ErrFreed for a re-created variable, the backing file for a
// lost node, a refreshed address for a restarted one). When a connection
// to an owner failed and the read through this node's agent then worked,
// the owner may have moved (its agent restarted on another port): the
// variable is looked up again for its owners' addresses (readdress, at
// most once per failure), so that direct reads resume at the new one.

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/auth"
	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/layout"
	"github.com/ddstore-go/ddstore/internal/transport"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// DirectMaxBytes is the largest read (its rows of other nodes) sent
// straight to the owner's agent; a larger one goes through this node's
// agent. Cut into pieces (DirectSplitBytes), larger direct reads alone
// were about as fast as through the agent, but a client streaming them
// made other clients' small reads of the same owner wait 8x longer at
// p99 than a stream through the agent did (`ddstore bench`,
// docs/benchmarks.md, One hop). DirectMaxEnv overrides it (bytes; 0:
// never direct), to measure the rule again.
const DirectMaxBytes = 1 << 20

// DirectMaxEnv names the variable that overrides DirectMaxBytes.
const DirectMaxEnv = "DDSTORE_DIRECT_MAX_BYTES"

// DirectSplitBytes is the size from which a direct read is cut into
// pieces, one per DirectSplitBytes and at most maxPieces, each on a
// pooled connection of its own and read concurrently: the owner's agent
// answers each connection on its own goroutine, so that its copies of the
// rows into the socket (the dearest part of a read: they come from rows
// scattered over its shared memory) run on several cores, and this end
// receives one piece while the owner still sends the next, as the agent
// cuts its fetches. Measured with `ddstore bench` (docs/benchmarks.md,
// Direct reads in pieces: 1.07x over 29 alternations on a loaded 2-core
// machine, within its noise). DirectSplitEnv overrides it (bytes; 0:
// never cut).
const DirectSplitBytes = 512 << 10

// DirectSplitEnv names the variable that overrides DirectSplitBytes.
const DirectSplitEnv = "DDSTORE_DIRECT_SPLIT_BYTES"

// directMax is DirectMaxBytes, or DirectMaxEnv's value.
func directMax() (int64, error) { return bytesEnv(DirectMaxEnv, DirectMaxBytes) }

// directSplit is DirectSplitBytes, or DirectSplitEnv's value.
func directSplit() (int64, error) { return bytesEnv(DirectSplitEnv, DirectSplitBytes) }

// bytesEnv is the number of bytes >= 0 in variable env, or def when unset.
func bytesEnv(env string, def int64) (int64, error) {
	v := os.Getenv(env)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, base.Errorf(base.ErrArgument, "%s=%q: want a number of bytes >= 0", env, v)
	}
	return n, nil
}

// maxPieces bounds the pieces of one direct read.
const maxPieces = 4

// pieces is how many pieces a direct read of n rows, size bytes in all,
// from addr is cut into: one while another read of addr is in flight
// (that one's pieces keep the owner's cores busy already, and the pool's
// connections are not multiplied by the reads in flight).
func (p *directPool) pieces(addr string, n int, size int64) int {
	if p.split <= 0 || size < 2*p.split {
		return 1
	}
	p.mu.Lock()
	busy := p.busy[addr]
	p.mu.Unlock()
	if busy > 0 {
		return 1
	}
	return int(max(1, min(maxPieces, int64(n), size/p.split)))
}

// DirectIdle is how long an unused direct connection stays open.
const DirectIdle = 10 * time.Second

// directRetry is how long an owner address whose dial failed, or a key the
// agent could not give, is left alone before being tried again.
const directRetry = 5 * time.Second

// maxIov is the kernel's IOV_MAX: the most buffers one readv fills.
const maxIov = 1024

// maxIdleDirect bounds the idle connections kept per owner node: one
// read's pieces and a few reads in flight beside it.
const maxIdleDirect = 2 * maxPieces

// directConn is one connection to another node's agent: a blocking
// socket of its own, outside the runtime's network poller. A read writes
// its request and blocks in readv until the reply is there, so that the
// reply wakes this thread alone. On a connection in the poller (a
// net.Conn), every reply's arrival also wakes the thread waiting in
// epoll, whether or not a goroutine waits for it, and a deadline set per
// call arms a runtime timer: each a wake-up of a thread, and on an idle
// virtual machine the wake-up of an idle vCPU (docs/benchmarks.md, One
// hop: where a direct Get's time went).
type directConn struct {
	addr string
	fd   int // blocking, close-on-exec; SO_RCVTIMEO rcvTimeo and SO_SNDTIMEO the Store's Timeout
	id   uint64
	// rcvTimeo is the receive timeout set on fd.
	rcvTimeo time.Duration
	timeout  time.Duration // the Store's Timeout, the usual rcvTimeo
	out      []byte
	iovs     [][]byte
	all      [][]byte // the header, then iovs
	hdr      []byte
	used     time.Time
	// reused: taken from the pool, not dialed for this read.
	reused bool
}

// directPool is a Store's direct connections, by owner address.
type directPool struct {
	// mu guards everything below; a leaf (lock order: internal/LOCKS.md).
	mu       sync.Mutex
	key      *auth.Key
	keyRetry time.Time // no key before then (the agent had none to give)
	idle     map[string][]*directConn
	busy     map[string]int       // addr: its connections taken and not yet put back or closed
	bad      map[string]time.Time // addr: its dial failed; not tried before then
	moved    map[string]time.Time // addr: when a connection to it last failed (a dial, a broken reply), for readdress
	timer    *time.Timer          // closes idle connections; nil when none is idle
	closed   bool
	idleFor  time.Duration
	max      int64 // the largest read sent direct (directMax)
	split    int64 // a read is cut into pieces of about that many bytes (directSplit; 0: never)
	// anyMoved: moved has an entry (set once, never cleared), so that a
	// read through the agent looks at moved only after a failure.
	anyMoved atomic.Bool
}

// owners is a variable's owners' peer addresses, per rank, as a table gave
// them, and when they were taken (a connection failure since then may mean
// an owner moved).
type owners struct {
	addrs []string
	at    time.Time
}

// tableAddrs is, per rank of t, its node's peer address ("" for none).
func tableAddrs(t *wire.Table) []string {
	addrs := make([]string, len(t.RankNode))
	for r, n := range t.RankNode {
		if n < int64(len(t.Addrs)) {
			addrs[r] = t.Addrs[n]
		}
	}
	return addrs
}

// tryDirect reads the rows at positions pos of dst (global index at(i))
// straight from their owner's agent when the rule says so; false: they
// were not (all) read, and the caller reads them through the agent.
func (s *Store) tryDirect(v *variable, dst []byte, pos []int64, at func(int) int64) bool {
	if s.cfg.NoDirect || v.rag != nil || len(pos) == 0 || int64(len(pos))*v.rb > s.direct.max {
		return false
	}
	addr := s.directAddr(v, len(pos), func(k int) int64 { return at(int(pos[k])) })
	if addr == "" {
		return false
	}
	k := s.direct.pieces(addr, len(pos), int64(len(pos))*v.rb)
	if k == 1 {
		if !s.runDirect(addr, func(c *directConn) error { return c.read(v, dst, pos, at, s.cfg.Timeout) }) {
			return false
		}
		v.prof.directRows.Add(int64(len(pos)))
		return true
	}
	// Pieces of consecutive positions, the first read on this goroutine;
	// every piece is done (nothing more written into dst) before this
	// returns, and should one fail, the whole read goes through the agent.
	var ok [maxPieces]bool
	var wg sync.WaitGroup
	per := (len(pos) + k - 1) / k
	for i := 1; i < k; i++ {
		piece := pos[min(i*per, len(pos)):min((i+1)*per, len(pos))]
		wg.Go(func() {
			ok[i] = len(piece) == 0 || s.runDirect(addr, func(c *directConn) error { return c.read(v, dst, piece, at, s.cfg.Timeout) })
		})
	}
	ok[0] = s.runDirect(addr, func(c *directConn) error { return c.read(v, dst, pos[:per], at, s.cfg.Timeout) })
	wg.Wait()
	for _, o := range ok[:k] {
		if !o {
			return false
		}
	}
	v.prof.directRows.Add(int64(len(pos)))
	return true
}

// tryDirectRagged reads ragged rows globals (none empty) into
// dst[at[k]:at[k]+size[k]] straight from their owner's agent when the
// rule says so (one Fetch, each row its own size); false: not read.
func (s *Store) tryDirectRagged(v *variable, dst []byte, globals, at, size []int64) bool {
	var total int64
	for _, n := range size {
		total += n
	}
	if s.cfg.NoDirect || len(globals) == 0 || total > s.direct.max {
		return false
	}
	addr := s.directAddr(v, len(globals), func(k int) int64 { return globals[k] })
	if addr == "" {
		return false
	}
	ok := s.runDirect(addr, func(c *directConn) error {
		c.id++
		c.out = wire.AppendFrame(c.out[:0], wire.OpFetch, 0, c.id, 0, func(e *wire.Encoder) {
			e.String(v.name)
			e.I64(v.id)
			e.U32(uint32(len(globals)))
			for _, g := range globals {
				e.I64(g)
			}
		})
		c.iovs = c.iovs[:0]
		for k := 0; k < len(globals); {
			j := k + 1
			for j < len(globals) && at[j] == at[j-1]+size[j-1] {
				j++
			}
			c.iovs = append(c.iovs, dst[at[k]:at[j-1]+size[j-1]])
			k = j
		}
		return c.exchange(wire.OpFetch, total, s.cfg.Timeout)
	})
	if ok {
		v.prof.directRows.Add(int64(len(globals)))
	}
	return ok
}

// directAddr is the one address of the owners of rows global(0..n-1), or
// "" (several nodes, a node without an address, a row only in the backing
// file).
func (s *Store) directAddr(v *variable, n int, global func(int) int64) string {
	addr := ""
	addrs := v.addrs.Load().addrs
	for k := 0; k < n; k++ {
		r, _ := v.lay.Owner(global(k))
		if r == layout.Backed || addrs[r] == "" {
			return ""
		}
		if addr == "" {
			addr = addrs[r]
		} else if addrs[r] != addr {
			return ""
		}
	}
	return addr
}

// runDirect runs read on a connection to addr; false: it failed (the
// caller reads through the agent), the connection kept, dropped or the
// address left alone a while as the failure says.
func (s *Store) runDirect(addr string, read func(c *directConn) error) bool {
	c := s.direct.take(s, addr)
	if c == nil {
		return false
	}
	if err := read(c); err != nil {
		switch {
		case errors.Is(err, errReply): // the owner answered: the connection is sound
			s.direct.put(c)
		case c.reused:
			// A pooled connection may have died with its agent (a
			// restart): the next read dials afresh.
			s.direct.drop(c)
			s.direct.dropIdle(addr)
			s.direct.noteMoved(addr)
		default:
			// A new one that fails leaves the address alone a while.
			s.direct.drop(c)
			s.direct.markBad(addr)
		}
		return false
	}
	s.direct.put(c)
	return true
}

// errReply marks an error the owner answered (the connection is sound).
var errReply = errors.New("owner's error reply")

// read is one Fetch (or, for consecutive rows into consecutive bytes, one
// FetchRange) on c, the rows read straight into dst.
func (c *directConn) read(v *variable, dst []byte, pos []int64, at func(int) int64, timeout time.Duration) error {
	rb := v.rb
	run := true // pos and their globals consecutive
	for k := 1; k < len(pos) && run; k++ {
		run = pos[k] == pos[k-1]+1 && at(int(pos[k])) == at(int(pos[k-1]))+1
	}
	c.id++
	op := wire.OpFetchRange
	if run {
		m := wire.FetchRange{Name: v.name, ID: v.id, Start: at(int(pos[0])), Count: int64(len(pos))}
		c.out = wire.AppendFrame(c.out[:0], op, 0, c.id, 0, m.Encode)
		c.iovs = append(c.iovs[:0], dst[pos[0]*rb:(pos[0]+int64(len(pos)))*rb])
	} else {
		op = wire.OpFetch
		c.out = wire.AppendFrame(c.out[:0], op, 0, c.id, 0, func(e *wire.Encoder) {
			e.String(v.name)
			e.I64(v.id)
			e.U32(uint32(len(pos)))
			for _, p := range pos {
				e.I64(at(int(p)))
			}
		})
		c.iovs = c.iovs[:0]
		for k := 0; k < len(pos); {
			j := k + 1
			for j < len(pos) && pos[j] == pos[j-1]+1 {
				j++
			}
			c.iovs = append(c.iovs, dst[pos[k]*rb:(pos[j-1]+1)*rb])
			k = j
		}
	}
	return c.exchange(op, int64(len(pos))*rb, timeout)
}

// exchange sends c.out and reads the reply: want row bytes into c.iovs.
func (c *directConn) exchange(op wire.Op, want int64, timeout time.Duration) error {
	by := time.Now().Add(timeout)
	if err := c.write(c.out); err != nil {
		return err
	}
	// The header and the rows in one readv when they come together: the
	// rows land in dst, or, for an error reply, its body's first bytes,
	// which are copied out.
	c.hdr = c.hdr[:wire.HeaderSize]
	c.all = append(append(c.all[:0], c.hdr), c.iovs...)
	left := c.all
	n, err := c.fill(&left, wire.HeaderSize, by)
	if err != nil {
		return err
	}
	h, err := wire.ParseHeader(c.hdr)
	if err != nil {
		return err
	}
	if h.ID != c.id || h.Op != op {
		return base.Errorf(base.ErrProtocol, "reply %s #%d to %s #%d from %s", h.Op, h.ID, op, c.id, c.addr)
	}
	got := n - wire.HeaderSize // bytes past the header, in dst
	if h.Status != 0 {
		if h.Payload != 0 || h.BodyLen > 1<<16 {
			return base.Errorf(base.ErrProtocol, "error reply from %s with a body of %d bytes and %d payload bytes", c.addr, h.BodyLen, h.Payload)
		}
		body := make([]byte, h.BodyLen)
		k := 0
		for _, b := range c.iovs {
			if k >= got || k >= len(body) {
				break
			}
			k += copy(body[k:min(got, len(body))], b)
		}
		if k < len(body) {
			rest := [][]byte{body[k:]}
			if _, err := c.fill(&rest, len(body)-k, by); err != nil {
				return err
			}
		}
		return fmt.Errorf("%w: %w", errReply, wire.StatusError(h, body))
	}
	if h.BodyLen != 0 || h.Payload != uint64(want) {
		return base.Errorf(base.ErrProtocol, "%s sent a body of %d bytes and %d row bytes, want none and %d", c.addr, h.BodyLen, h.Payload, want)
	}
	if int64(got) < want {
		_, err = c.fill(&left, int(want)-got, by)
	}
	clear(c.all)
	clear(c.iovs)
	return err
}

// write sends b on c (a blocking write, bounded by SO_SNDTIMEO).
func (c *directConn) write(b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(c.fd, b)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return base.Errorf(base.ErrTimeout, "%s did not take a request in time", c.addr)
		case err != nil:
			return fmt.Errorf("write to %s: %w", c.addr, err)
		}
		b = b[n:]
	}
	return nil
}

// rcvSlack is how far past its deadline a read may wait for its reply
// before failing, so that the receive timeout is set again only on a read
// that has waited long already, not on every one.
const rcvSlack = 100 * time.Millisecond

// fill reads into *iovs (advancing it past what was filled) until at
// least min bytes came, by then (within rcvSlack): a blocking readv, which
// the kernel ends as bytes arrive.
func (c *directConn) fill(left *[][]byte, min int, by time.Time) (int, error) {
	iovs := *left
	defer func() { *left = iovs }()
	total := 0
	for total < min {
		if err := c.waitBy(by); err != nil {
			return total, err
		}
		batch := iovs
		if len(batch) > maxIov {
			batch = batch[:maxIov]
		}
		n, err := unix.Readv(c.fd, batch)
		switch {
		case err == unix.EINTR, err == unix.EAGAIN:
			// A signal, or SO_RCVTIMEO ran out: waitBy says whether the
			// read has time left.
			continue
		case err != nil:
			return total, fmt.Errorf("read from %s: %w", c.addr, err)
		case n == 0:
			return total, io.ErrUnexpectedEOF
		}
		total += n
		iovs = transport.Advance(iovs, n)
	}
	return total, nil
}

// waitBy fails once by has passed, and otherwise makes sure that the next
// blocking read returns by then (within rcvSlack): the receive timeout
// stays the Store's Timeout unless less than that is left.
func (c *directConn) waitBy(by time.Time) error {
	left := time.Until(by)
	if left <= 0 {
		return base.Errorf(base.ErrTimeout, "%s did not answer in time", c.addr)
	}
	want := c.timeout
	if left+rcvSlack < want {
		want = left
	}
	if want+rcvSlack < c.rcvTimeo || want > c.rcvTimeo {
		if err := setTimeo(c.fd, unix.SO_RCVTIMEO, want); err != nil {
			return err
		}
		c.rcvTimeo = want
	}
	return nil
}

// setTimeo sets the socket timeout opt (SO_RCVTIMEO, SO_SNDTIMEO) of fd.
func setTimeo(fd, opt int, d time.Duration) error {
	tv := unix.NsecToTimeval(max(d, time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, opt, &tv); err != nil {
		return fmt.Errorf("socket timeout: %w", err)
	}
	return nil
}

// close closes c's socket.
func (c *directConn) close() { unix.Close(c.fd) }

// take returns an idle connection to addr, or dials one; nil: none (no
// key, an address that failed lately, a refused dial). The caller gives
// it back with put or drop.
func (p *directPool) take(s *Store, addr string) *directConn {
	c := p.takeConn(s, addr)
	if c != nil {
		p.mu.Lock()
		if p.busy == nil {
			p.busy = make(map[string]int)
		}
		p.busy[addr]++
		p.mu.Unlock()
	}
	return c
}

// unbusy counts c as no longer taken; p.mu is held.
func (p *directPool) unbusy(c *directConn) {
	if p.busy[c.addr]--; p.busy[c.addr] <= 0 {
		delete(p.busy, c.addr)
	}
}

// drop closes c, a connection taken, instead of putting it back.
func (p *directPool) drop(c *directConn) {
	c.close()
	p.mu.Lock()
	p.unbusy(c)
	p.mu.Unlock()
}

func (p *directPool) takeConn(s *Store, addr string) *directConn {
	p.mu.Lock()
	if p.closed || time.Now().Before(p.bad[addr]) {
		p.mu.Unlock()
		return nil
	}
	if cs := p.idle[addr]; len(cs) > 0 {
		c := cs[len(cs)-1]
		p.idle[addr] = cs[:len(cs)-1]
		p.mu.Unlock()
		c.reused = true
		return c
	}
	key := p.key
	if key == nil && time.Now().Before(p.keyRetry) {
		p.mu.Unlock()
		return nil
	}
	p.mu.Unlock()
	if key == nil {
		k, err := s.directKey()
		p.mu.Lock()
		if err != nil {
			p.keyRetry = time.Now().Add(directRetry)
			if errors.Is(err, base.ErrArgument) {
				// The agent gives no key in this job (rows move over
				// another transport): never ask again.
				p.keyRetry = time.Now().Add(100 * 365 * 24 * time.Hour)
			}
			p.mu.Unlock()
			return nil
		}
		p.key, key = &k, &k
		p.mu.Unlock()
	}
	c, err := dialDirect(addr, *key, min(s.cfg.Timeout, 5*time.Second), s.cfg.Timeout)
	if err != nil {
		p.markBad(addr)
		return nil
	}
	return c
}

// directKey asks this node's agent for the job's direct key.
func (s *Store) directKey() (auth.Key, error) {
	body, err := s.request(wire.OpDirectKey, nil, s.cfg.Timeout)
	if err != nil {
		return auth.Key{}, err
	}
	m, err := wire.DecodeDirectKey(body)
	if err != nil {
		return auth.Key{}, err
	}
	return auth.FromBytes(m.Key), nil
}

// dialDirect connects to addr and proves key, within dial; the
// connection's reads and writes are then bounded by timeout.
func dialDirect(addr string, key auth.Key, dial, timeout time.Duration) (*directConn, error) {
	d := net.Dialer{Timeout: dial}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	tc := nc.(*net.TCPConn)
	defer tc.Close()
	tc.SetNoDelay(true)
	tc.SetDeadline(time.Now().Add(dial))
	if err := auth.Initiate(tc, key, auth.Direct); err != nil {
		return nil, err
	}
	// The socket leaves the network poller: a copy of its descriptor is
	// kept, made blocking, and the net.Conn closed (which takes the socket
	// out of epoll; the copy keeps it open).
	raw, err := tc.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd := -1
	var derr error
	if err := raw.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, fmt.Errorf("direct connection to %s: dup: %w", addr, derr)
	}
	c := &directConn{addr: addr, fd: fd, id: auth.FirstID - 1, hdr: make([]byte, wire.HeaderSize), timeout: timeout, rcvTimeo: timeout}
	if err := tc.Close(); err != nil {
		c.close()
		return nil, err
	}
	err = unix.SetNonblock(fd, false)
	if err == nil {
		err = setTimeo(fd, unix.SO_RCVTIMEO, timeout)
	}
	if err == nil {
		err = setTimeo(fd, unix.SO_SNDTIMEO, timeout)
	}
	if err != nil {
		c.close()
		return nil, fmt.Errorf("direct connection to %s: %w", addr, err)
	}
	return c, nil
}

// put keeps c for the next read of its node, and arms the idle timer.
func (p *directPool) put(c *directConn) {
	c.used = time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.unbusy(c)
	if p.closed || len(p.idle[c.addr]) >= maxIdleDirect {
		c.close()
		return
	}
	if p.idle == nil {
		p.idle = make(map[string][]*directConn)
	}
	p.idle[c.addr] = append(p.idle[c.addr], c)
	if p.timer == nil {
		p.timer = time.AfterFunc(p.idleFor, p.sweep)
	}
}

// sweep closes the connections idle for idleFor, and comes back while
// some remain.
func (p *directPool) sweep() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.timer = nil
	if p.closed {
		return
	}
	now, next := time.Now(), time.Duration(0)
	for addr, cs := range p.idle {
		kept := cs[:0]
		for _, c := range cs {
			if left := p.idleFor - now.Sub(c.used); left > 0 {
				kept = append(kept, c)
				if next == 0 || left < next {
					next = left
				}
			} else {
				c.close()
			}
		}
		clear(cs[len(kept):])
		if len(kept) == 0 {
			delete(p.idle, addr)
		} else {
			p.idle[addr] = kept
		}
	}
	if next > 0 {
		p.timer = time.AfterFunc(next, p.sweep)
	}
}

// dropIdle closes the idle connections to addr.
func (p *directPool) dropIdle(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.idle[addr] {
		c.close()
	}
	delete(p.idle, addr)
}

// markBad leaves addr alone for a while (its agent is gone or moved: reads
// go through this node's agent, which finds the new address) and notes it
// moved.
func (p *directPool) markBad(addr string) {
	p.mu.Lock()
	if p.bad == nil {
		p.bad = make(map[string]time.Time)
	}
	p.bad[addr] = time.Now().Add(directRetry)
	p.mu.Unlock()
	p.dropIdle(addr)
	p.noteMoved(addr)
}

// noteMoved records that a connection to addr failed now (its agent may
// have moved), for readdress.
func (p *directPool) noteMoved(addr string) {
	p.mu.Lock()
	if p.moved == nil {
		p.moved = make(map[string]time.Time)
	}
	p.moved[addr] = time.Now()
	p.mu.Unlock()
	p.anyMoved.Store(true)
}

// movedSince reports whether a connection to one of addrs failed after t.
func (p *directPool) movedSince(addrs []string, t time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range addrs {
		if m, ok := p.moved[a]; ok && m.After(t) {
			return true
		}
	}
	return false
}

// readdress runs after a read of v through this node's agent worked: when
// a direct connection to one of v's owners failed since v's addresses were
// taken, the owner may have moved (its agent restarted on another port,
// which this node's agent learnt on that read), and v's addresses are
// taken from its table looked up anew, so that direct reads go to the new
// one. Once per failure (the failed address is then left alone a while:
// directRetry), and only from the same table (a variable added again is
// the stale reads' to look up, stale.go). The caller holds v.mu (R).
func (s *Store) readdress(v *variable) {
	if !s.direct.anyMoved.Load() {
		return
	}
	o := v.addrs.Load()
	if !s.direct.movedSince(o.addrs, o.at) {
		return
	}
	now := &owners{addrs: o.addrs, at: time.Now()}
	if !v.addrs.CompareAndSwap(o, now) {
		return // another read of v is on it
	}
	m := wire.Name{Name: v.name}
	body, err := s.request(wire.OpLookup, m.Encode, s.cfg.Timeout)
	if err != nil {
		return // the read stands; the next failure tries again
	}
	t, err := wire.DecodeTable(body)
	if err != nil || t.ID != v.id || len(t.RankNode) != len(o.addrs) {
		return
	}
	if addrs := tableAddrs(&t); !slices.Equal(addrs, o.addrs) {
		v.addrs.CompareAndSwap(now, &owners{addrs: addrs, at: now.at})
	}
}

// close closes every idle connection; connections in use are closed when
// they come back.
func (p *directPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	for _, cs := range p.idle {
		for _, c := range cs {
			c.close()
		}
	}
	p.idle = nil
}
