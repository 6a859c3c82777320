package transport

// The owner node of the conformance suite (conformance_test.go): what an
// agent is to its engine. It maps and exposes the shards of the variables
// the suite asks it to hold, answers Fetch (tcp) and PeerWindow (the
// one-sided engines) from them as the agent does, withdraws them when a
// variable is freed, and takes the suite's own control ops, so that the
// suite drives an owner in another process (an MPI rank) as it does one in
// this.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/testutil"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// The suite's control ops, beyond the peer protocol's (the server hands
// every op but Fetch to its handler's Control).
const (
	opConfPublish  wire.Op = 200 + iota // confVar → nothing: expose a variable's shards
	opConfFree                          // confName → confWithdrawn: withdraw every shard, forget the variable
	opConfWithdraw                      // confWithdraw → confWithdrawn: withdraw one shard
	opConfRelease                       // confName → nothing: a silent variable answers again
	opConfState                         // nothing → confState
	opConfClose                         // nothing → nothing: the owner node stops
)

// confShard is a shard of a variable: rows [First, First+Rows).
type confShard struct{ First, Rows int64 }

// confVar is a variable as one owner node holds it.
type confVar struct {
	Name     string
	ID       int64 // the table id
	RowBytes int64
	Shards   []confShard
	// Silent: the owner answers nothing about the variable (neither its
	// rows nor its window) until released.
	Silent bool
}

type confName struct{ Name string }

// confWithdraw asks an owner to withdraw shard Shard of a variable;
// Described: the owner's PeerWindow answers still list it (they were
// written just before the withdraw).
type confWithdraw struct {
	Name      string
	Shard     int
	Described bool
}

// confWithdrawn is what a withdraw did: how many shards it withdrew, how
// many of them were exposed, and how many were unmapped by the time
// Withdraw returned.
type confWithdrawn struct{ Withdrawn, Exposed, UnmappedAtOnce int }

// confState is an owner's count of withdrawn shards not unmapped yet, and
// of the requests about silent variables it answered once released.
type confState struct{ Pending, Answered int }

// confSeed makes a variable's bytes depend on its name.
func confSeed(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64()
}

// confFill writes row g of variable (name, id): every 8 bytes mix the
// variable, table id, row and position, so that a row read from the wrong
// place, variable or table shows.
func confFill(row []byte, name string, id, g int64) {
	seed := confSeed(name)
	for w := 0; w*8 < len(row); w++ {
		x := seed ^ uint64(id)*0x9E3779B97F4A7C15 ^ uint64(g)*0xBF58476D1CE4E5B9 ^ uint64(w)*0x94D049BB133111EB
		x ^= x >> 31
		x *= 0xD6E8FEB86659FD93
		x ^= x >> 32
		for j := 0; j < 8 && w*8+j < len(row); j++ {
			row[w*8+j] = byte(x >> (8 * j))
		}
	}
}

// ownedVar is a variable of an owner node.
type ownedVar struct {
	confVar
	// mu is read-held while rows of it are sent (tcp) and write-held to
	// withdraw a shard, as the agent holds a variable's.
	mu     sync.RWMutex
	shards []*ownedShard
	gone   bool
	silent chan struct{} // closed when released; nil: never silent
}

type ownedShard struct {
	confShard
	mem       []byte
	exp       Exposure
	withdrawn bool
	described bool // still in the PeerWindow answer once withdrawn
}

// confOwner is an owner node: an engine, the server that answers the peer
// protocol for it, and the variables it holds.
type confOwner struct {
	eng  Engine
	pool *Pool
	srv  *Server
	stop chan struct{} // closed by opConfClose
	once sync.Once
	mu   struct {
		sync.Mutex
		vars     map[string]*ownedVar
		pending  int // withdrawn shards not unmapped yet
		answered int
	}
}

// startConfOwner serves the peer protocol for eng on a loopback port;
// serve runs it until the suite's close op. pool is the owner's (its
// engine's); the owner closes both.
func startConfOwner(eng Engine, pool *Pool) (*confOwner, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	o := &confOwner{eng: eng, pool: pool, stop: make(chan struct{})}
	o.mu.vars = make(map[string]*ownedVar)
	o.srv = NewServer(ln, o, discardLog(), 30*time.Second, nil)
	return o, nil
}

func (o *confOwner) Addr() string { return o.srv.Addr() }

// serve waits for the close op, then closes the engine (with the reader,
// where Close is collective), stops the server once the reader has hung
// up, unmaps what is left and closes the pool.
func (o *confOwner) serve() error {
	<-o.stop
	o.mu.Lock()
	for _, v := range o.mu.vars {
		if v.silent != nil {
			select {
			case <-v.silent:
			default:
				close(v.silent)
			}
		}
	}
	o.mu.Unlock()
	errs := []error{o.eng.Close()}
	// Stopping the server cuts its connections, and with them a reply
	// being written (the close op's own): wait for the reader to hang up.
	errs = append(errs, testutil.Poll(time.Minute, func() error {
		o.srv.mu.Lock()
		defer o.srv.mu.Unlock()
		if n := len(o.srv.mu.conns); n > 0 {
			return fmt.Errorf("the reader has not hung up: %d connections to the owner node", n)
		}
		return nil
	}))
	errs = append(errs, o.srv.Close())
	o.mu.Lock()
	vars := o.mu.vars
	o.mu.vars = nil
	o.mu.Unlock()
	for _, v := range vars {
		for _, s := range v.shards {
			if !s.withdrawn {
				o.withdraw(s)
			}
		}
	}
	return errors.Join(append(errs, o.pool.Close())...)
}

// served is a variable asked for by name and table id, read-locked; like
// the agent, an owner that does not hold it says ErrUnknown, and one that
// holds another table of that name ErrFreed. A silent variable first waits
// to be released (or the owner to stop).
func (o *confOwner) served(ctx context.Context, name string, id int64) (*ownedVar, error) {
	o.mu.Lock()
	v := o.mu.vars[name]
	o.mu.Unlock()
	if v == nil {
		return nil, base.Errorf(base.ErrUnknown, "this node holds no variable %q", name)
	}
	if v.silent != nil {
		select {
		case <-v.silent:
		case <-ctx.Done():
		case <-o.stop:
		}
		o.mu.Lock()
		o.mu.answered++
		o.mu.Unlock()
	}
	v.mu.RLock()
	if v.gone {
		v.mu.RUnlock()
		return nil, base.Errorf(base.ErrUnknown, "this node holds no variable %q", name)
	}
	if v.ID != id {
		v.mu.RUnlock()
		return nil, base.Errorf(base.ErrFreed, "variable %q was freed and created again", name)
	}
	return v, nil
}

// RowsRange serves a tcp FetchRange row by row, as Rows.
func (o *confOwner) RowsRange(name string, id, start, count int64, rows [][]byte) ([][]byte, func(), error) {
	globals := make([]int64, count)
	for i := range globals {
		globals[i] = start + int64(i)
	}
	return o.Rows(name, id, globals, rows)
}

// Rows serves a tcp Fetch from the shards not withdrawn.
func (o *confOwner) Rows(name string, id int64, globals []int64, rows [][]byte) ([][]byte, func(), error) {
	v, err := o.served(context.Background(), name, id)
	if err != nil {
		return rows, nil, err
	}
	rb := v.RowBytes
	for _, g := range globals {
		var s *ownedShard
		for _, c := range v.shards {
			if !c.withdrawn && c.First <= g && g < c.First+c.Rows {
				s = c
			}
		}
		if s == nil {
			v.mu.RUnlock()
			return rows[:0], nil, base.Errorf(base.ErrArgument, "row %d of %q is on no shard of this node", g, name)
		}
		rows = append(rows, s.mem[(g-s.First)*rb:(g-s.First+1)*rb])
	}
	return rows, v.mu.RUnlock, nil
}

func (o *confOwner) Control(ctx context.Context, op wire.Op, body []byte) (func(*wire.Encoder), error) {
	if op == wire.OpPeerWindow {
		m, err := wire.DecodePeerWindow(body)
		if err != nil {
			return nil, err
		}
		v, err := o.served(ctx, m.Name, m.ID)
		if err != nil {
			return nil, err
		}
		defer v.mu.RUnlock()
		var shards []ExposedShard
		for _, s := range v.shards {
			if s.exp.Exposed() && (!s.withdrawn || s.described) {
				shards = append(shards, ExposedShard{First: s.First, Rows: s.Rows, Exposure: s.exp})
			}
		}
		return o.eng.Window(v.RowBytes, shards)
	}
	m, err := wire.DecodeText(body)
	if err != nil {
		return nil, err
	}
	var reply any
	switch op {
	case opConfPublish:
		var c confVar
		if err = json.Unmarshal([]byte(m.Text), &c); err == nil {
			err = o.publish(c)
		}
	case opConfFree:
		var c confName
		if err = json.Unmarshal([]byte(m.Text), &c); err == nil {
			reply, err = o.free(c.Name)
		}
	case opConfWithdraw:
		var c confWithdraw
		if err = json.Unmarshal([]byte(m.Text), &c); err == nil {
			reply, err = o.withdrawShard(c)
		}
	case opConfRelease:
		var c confName
		if err = json.Unmarshal([]byte(m.Text), &c); err == nil {
			err = o.release(c.Name)
		}
	case opConfState:
		o.mu.Lock()
		reply = confState{Pending: o.mu.pending, Answered: o.mu.answered}
		o.mu.Unlock()
	case opConfClose:
		o.once.Do(func() { close(o.stop) })
	default:
		return nil, base.Errorf(base.ErrProtocol, "conformance owner: unknown op %v", op)
	}
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(reply)
	if err != nil {
		return nil, err
	}
	t := wire.Text{Text: string(b)}
	return t.Encode, nil
}

// publish maps a variable's shards outside Go's heap (as segments are),
// fills them and exposes them.
func (o *confOwner) publish(c confVar) error {
	v := &ownedVar{confVar: c}
	if c.Silent {
		v.silent = make(chan struct{})
	}
	fail := func(err error) error {
		for _, s := range v.shards {
			o.withdraw(s)
		}
		return err
	}
	for _, sh := range c.Shards {
		mem, err := unix.Mmap(-1, 0, int(sh.Rows*c.RowBytes), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
		if err != nil {
			return fail(err)
		}
		for r := range sh.Rows {
			confFill(mem[r*c.RowBytes:(r+1)*c.RowBytes], c.Name, c.ID, sh.First+r)
		}
		e, err := o.eng.Expose(mem, c.ID)
		if err != nil {
			unix.Munmap(mem)
			return fail(err)
		}
		v.shards = append(v.shards, &ownedShard{confShard: sh, mem: mem, exp: e})
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if old := o.mu.vars[c.Name]; old != nil {
		return fail(base.Errorf(base.ErrExists, "variable %q is held already", c.Name))
	}
	o.mu.vars[c.Name] = v
	return nil
}

// withdraw takes a shard out of reach through the engine, which unmaps it
// once no read can touch it; it reports whether that happened at once.
func (o *confOwner) withdraw(s *ownedShard) (unmappedAtOnce bool) {
	s.withdrawn = true
	o.mu.Lock()
	o.mu.pending++
	o.mu.Unlock()
	var done sync.Mutex
	unmapped := false
	o.eng.Withdraw(s.exp, func() {
		unix.Munmap(s.mem)
		done.Lock()
		unmapped = true
		done.Unlock()
		o.mu.Lock()
		o.mu.pending--
		o.mu.Unlock()
	})
	done.Lock()
	defer done.Unlock()
	return unmapped
}

// free withdraws every shard of a variable and forgets it.
func (o *confOwner) free(name string) (confWithdrawn, error) {
	o.mu.Lock()
	v := o.mu.vars[name]
	delete(o.mu.vars, name)
	o.mu.Unlock()
	if v == nil {
		return confWithdrawn{}, base.Errorf(base.ErrUnknown, "this node holds no variable %q", name)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.gone = true
	var w confWithdrawn
	for _, s := range v.shards {
		if s.withdrawn {
			continue
		}
		w.Withdrawn++
		if s.exp.Exposed() {
			w.Exposed++
		}
		if o.withdraw(s) {
			w.UnmappedAtOnce++
		}
	}
	return w, nil
}

func (o *confOwner) withdrawShard(c confWithdraw) (confWithdrawn, error) {
	o.mu.Lock()
	v := o.mu.vars[c.Name]
	o.mu.Unlock()
	if v == nil || c.Shard < 0 || c.Shard >= len(v.shards) {
		return confWithdrawn{}, base.Errorf(base.ErrArgument, "no shard %d of %q here", c.Shard, c.Name)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	s := v.shards[c.Shard]
	w := confWithdrawn{Withdrawn: 1}
	if s.exp.Exposed() {
		w.Exposed = 1
	}
	s.described = c.Described
	if o.withdraw(s) {
		w.UnmappedAtOnce = 1
	}
	return w, nil
}

func (o *confOwner) release(name string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	v := o.mu.vars[name]
	if v == nil || v.silent == nil {
		return base.Errorf(base.ErrArgument, "no silent variable %q here", name)
	}
	select {
	case <-v.silent:
	default:
		close(v.silent)
	}
	return nil
}
