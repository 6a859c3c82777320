package wire

import (
	"math"
	"strings"

	"github.com/ddstore-go/ddstore/internal/base"
)

// Messages are the bodies of frames. Each has Encode, appending its fields,
// and a Decode function that reads them and rejects anything else.

// Hello opens a client session: who the client is.
type Hello struct {
	Namespace string
	Node      string
	Rank      int64 // -1 for a client that holds no shard (info, split-mode reader)
	Size      int64
	LocalRank int64
	LocalSize int64
	Pid       int64
}

func (m *Hello) Encode(e *Encoder) {
	e.String(m.Namespace)
	e.String(m.Node)
	e.I64(m.Rank)
	e.I64(m.Size)
	e.I64(m.LocalRank)
	e.I64(m.LocalSize)
	e.I64(m.Pid)
}

func DecodeHello(b []byte) (m Hello, err error) {
	d := NewDecoder(b)
	m.Namespace, m.Node = d.String(), d.String()
	m.Rank, m.Size, m.LocalRank, m.LocalSize, m.Pid = d.I64(), d.I64(), d.I64(), d.I64(), d.I64()
	return m, d.Done()
}

// HelloReply tells the client which agent it reached.
type HelloReply struct {
	Node     string
	AgentPid int64
}

func (m *HelloReply) Encode(e *Encoder) { e.String(m.Node); e.I64(m.AgentPid) }

func DecodeHelloReply(b []byte) (m HelloReply, err error) {
	d := NewDecoder(b)
	m.Node, m.AgentPid = d.String(), d.I64()
	return m, d.Done()
}

// Shard describes one rank's shard of a variable: what a rank declares when
// it creates its part (Create, Publish, PeerPublish).
type Shard struct {
	Name      string
	Node      string // set by the agent on PeerPublish
	Rank      int64
	Size      int64 // world size the rank believes in
	Rows      int64
	Disp      int64
	ItemSize  int64
	TimeoutMs int64 // how long Publish waits for the other ranks
	// Attempt counts the rank's Add/Init calls of this name: all ranks'
	// n-th calls form one collective, so a late rank of a failed round
	// gets that round's error and a retry by all starts a fresh one.
	Attempt int64
	// Failed marks a rank that could not create its shard (bad shape,
	// no memory): the collective fails for every rank at once.
	Failed bool
	// Lost (with Failed) marks a rank whose part of the round was lost
	// after its shard was made: its agent's request to the coordinator
	// failed in the transport, or its client left while it waited; Why
	// says which. The round's error is then ErrPeer. Set by agents only
	// (encoded as failed = 2).
	Lost bool
	// Dtype names the items' type ("float32", "int64", ...; see
	// docs/protocol.md), or "" for untyped bytes; ranks must agree.
	Dtype string
	// Backing names the file holding every row of the variable (a source
	// spec: FILE, FILE:DATASET; for ragged rows a pair, the values' spec
	// and the offsets', joined by a NUL byte), "" for none; Total is then
	// the number of rows in all, of which the shards hold the first
	// (their sum) and the file the rest. Ranks must agree on both.
	Backing string
	Total   int64
	// Kind is KindRows (fixed rows of Disp items) or KindRagged (rows of a
	// length of their own: Items units of Disp items in this rank's shard,
	// Disp the product of Shape, the trailing dimensions). Ranks must
	// agree on Kind and Shape.
	Kind  Kind
	Items int64
	Shape []int64
	// Group names the ranks of the round, as a Barrier's Key: "" for the
	// whole job, the variable's replica suffix ("@r<F>") for a group.
	Group string
	// Client is the client process that sent the shard, as its agent
	// numbers it (set by the agent before PeerPublish; clients send 0):
	// the coordinator fails the round when that process goes (Gone).
	Client uint64
	// ClientAgeMs is how long the client process had run when the agent
	// sent the shard (set with Client; clients send 0): a process that
	// started before a dead job's failed round lost its last process is
	// of that job.
	ClientAgeMs int64
	// Why says why a Failed rank could not create its shard (the error
	// its agent met: no room in /dev/shm, above the memory budget), for
	// the other ranks' error; "" for none (always, unless Failed). Set by
	// an agent on PeerPublish; clients send "".
	Why string
}

// MaxWhy bounds Shard.Why.
const MaxWhy = 4096

// Kind is what a variable's rows are like.
type Kind uint8

const (
	// KindRows: every row is Disp items.
	KindRows Kind = 0
	// KindRagged: row i is n_i units of Disp items, n_i its own; the
	// shards hold offsets next to the values (docs/protocol.md, Segments).
	KindRagged Kind = 1
)

func (k Kind) String() string {
	switch k {
	case KindRows:
		return "fixed"
	case KindRagged:
		return "ragged"
	}
	return "kind" + itoa(int(k))
}

// MaxShape bounds the trailing dimensions of a ragged variable.
const MaxShape = 32

func (m *Shard) Encode(e *Encoder) {
	e.String(m.Name)
	e.String(m.Node)
	e.I64(m.Rank)
	e.I64(m.Size)
	e.I64(m.Rows)
	e.I64(m.Disp)
	e.I64(m.ItemSize)
	e.I64(m.TimeoutMs)
	e.I64(m.Attempt)
	switch {
	case m.Failed && m.Lost:
		e.U8(2)
	case m.Failed:
		e.U8(1)
	default:
		e.U8(0)
	}
	e.String(m.Dtype)
	e.String32(m.Backing)
	e.I64(m.Total)
	e.U8(uint8(m.Kind))
	e.I64(m.Items)
	e.I64s(m.Shape)
	e.String(m.Group)
	e.U64(m.Client)
	e.I64(m.ClientAgeMs)
	why := m.Why
	if !m.Failed {
		why = ""
	} else if len(why) > MaxWhy {
		why = why[:MaxWhy]
	}
	e.String32(why)
}

func DecodeShard(b []byte) (m Shard, err error) {
	d := NewDecoder(b)
	if m, err = decodeShard(d); err != nil {
		return m, err
	}
	return m, d.Done()
}

// decodeShard reads one Shard from d; the caller checks what follows.
func decodeShard(d *Decoder) (m Shard, err error) {
	m.Name, m.Node = d.String(), d.String()
	m.Rank, m.Size, m.Rows, m.Disp, m.ItemSize, m.TimeoutMs = d.I64(), d.I64(), d.I64(), d.I64(), d.I64(), d.I64()
	m.Attempt = d.I64()
	switch f := d.U8(); f {
	case 0, 1, 2:
		m.Failed, m.Lost = f != 0, f == 2
	default:
		return m, protoErr("shard of %q: failed flag %d, want 0, 1 or 2", m.Name, f)
	}
	m.Dtype = d.String()
	m.Backing = d.String32()
	m.Total = d.I64()
	m.Kind, m.Items = Kind(d.U8()), d.I64()
	m.Shape = d.I64s(nil)
	m.Group, m.Client, m.ClientAgeMs = d.String(), d.U64(), d.I64()
	if d.err == nil && (m.Kind > KindRagged || len(m.Shape) > MaxShape) {
		return m, protoErr("shard of %q: kind %d with %d trailing dimensions", m.Name, m.Kind, len(m.Shape))
	}
	m.Why = d.String32()
	if d.err == nil && (len(m.Why) > MaxWhy || (!m.Failed && m.Why != "")) {
		return m, protoErr("shard of %q: a reason of %d bytes with failed %v: want at most %d, and none unless failed", m.Name, len(m.Why), m.Failed, MaxWhy)
	}
	return m, d.Err()
}

// What a Round asks back.
const (
	// RoundAck: the round's outcome only (no error: the variable exists);
	// another request of the same node gets the table.
	RoundAck uint8 = 0
	// RoundTable: the table, or the node to fetch it from.
	RoundTable uint8 = 1
)

// Round is a PeerRound request: what the reply is to carry (RoundAck,
// RoundTable) and one rank's shard (node set), as in PeerPublish.
type Round struct {
	Shard Shard
	Want  uint8
	// Others are the shards of the sending node's other ranks of the
	// round, recorded with Shard, so that a node's ranks of a round take
	// one request: the round's outcome answers them all.
	Others []Shard
	// From names the sending node when none of the shards is its own (a
	// relay of the gather tree carrying its children's): the node whose
	// leaving the coordinator names when the request's connection closes.
	// "": the node of Shard.
	From string
}

// roundOthers, in a Round's want byte, says that Others follow its Shard;
// roundFrom that From comes last.
const (
	roundOthers = 0x80
	roundFrom   = 0x40
)

func (m *Round) Encode(e *Encoder) {
	want := m.Want
	if len(m.Others) > 0 {
		want |= roundOthers
	}
	if m.From != "" {
		want |= roundFrom
	}
	e.U8(want)
	m.Shard.Encode(e)
	if len(m.Others) > 0 {
		e.U32(uint32(len(m.Others)))
		for i := range m.Others {
			m.Others[i].Encode(e)
		}
	}
	if m.From != "" {
		e.String(m.From)
	}
}

// DecodeRound reads a Round: the byte Want (its bit 0x80 set: Others
// follow; 0x40: From ends it), a Shard, then with 0x80 a count (u32, at
// least 1) and that many Shards (Others), then with 0x40 a string (From,
// not empty).
func DecodeRound(b []byte) (m Round, err error) {
	if len(b) < 1 {
		return m, protoErr("round request of %d bytes", len(b))
	}
	m.Want = b[0] &^ (roundOthers | roundFrom)
	if m.Want > RoundTable {
		return m, protoErr("round request wants %d, want 0 or 1", m.Want)
	}
	d := NewDecoder(b[1:])
	if m.Shard, err = decodeShard(d); err != nil {
		return m, err
	}
	if b[0]&roundOthers != 0 {
		if m.Others, err = decodeOthers(d); err != nil {
			return m, err
		}
	}
	if b[0]&roundFrom != 0 {
		if m.From = d.String(); d.err == nil && m.From == "" {
			return m, protoErr("round request with an empty sending node")
		}
	}
	return m, d.Done()
}

// decodeOthers reads a Round's Others: a count (u32, at least 1) and that
// many Shards.
func decodeOthers(d *Decoder) ([]Shard, error) {
	n := d.U32()
	if d.err == nil && (n == 0 || int64(n) > int64(len(d.b))/minShardBytes) {
		return nil, protoErr("round request with %d other shards in %d bytes", n, len(d.b))
	}
	if d.err != nil {
		return nil, d.err
	}
	others := make([]Shard, 0, n)
	for range n {
		sh, err := decodeShard(d)
		if err != nil {
			return nil, err
		}
		others = append(others, sh)
	}
	return others, nil
}

// Shards is a PeerShards request: shards of several ranks of one node,
// each as in PeerPublish (node set), possibly of several rounds.
type Shards struct{ Shards []Shard }

// minShardBytes is the least a Shard takes on the wire: a bound on the
// count a decoder believes.
const minShardBytes = 2 + 2 + 7*8 + 1 + 2 + 4 + 8 + 1 + 8 + 4 + 2 + 8 + 8 + 4

func (m *Shards) Encode(e *Encoder) {
	e.U32(uint32(len(m.Shards)))
	for i := range m.Shards {
		m.Shards[i].Encode(e)
	}
}

func DecodeShards(b []byte) (m Shards, err error) {
	d := NewDecoder(b)
	n := d.U32()
	if d.err == nil && int64(n) > int64(len(b))/minShardBytes {
		return m, protoErr("%d shards in %d bytes", n, len(b))
	}
	m.Shards = make([]Shard, 0, n)
	for range n {
		sh, err := decodeShard(d)
		if err != nil {
			return m, err
		}
		m.Shards = append(m.Shards, sh)
	}
	return m, d.Done()
}

// Results answers a batch (PeerShards, PeerFrees): per item, in order,
// nil or the error it failed with.
type Results struct{ Errs []error }

// Names is a PeerFrees request: the frees of several ranks of one node,
// each as in PeerFree (name, node, rank).
type Names struct{ Names []Name }

func (m *Names) Encode(e *Encoder) {
	e.U32(uint32(len(m.Names)))
	for i := range m.Names {
		m.Names[i].Encode(e)
	}
}

func DecodeNames(b []byte) (m Names, err error) {
	d := NewDecoder(b)
	n := d.U32()
	if d.err == nil && int64(n) > int64(len(b))/12 { // a Name: two Strings and an i64
		return m, protoErr("%d names in %d bytes", n, len(b))
	}
	m.Names = make([]Name, 0, n)
	for range n {
		x := Name{Name: d.String(), Node: d.String(), Rank: d.I64()}
		if d.err != nil {
			break
		}
		m.Names = append(m.Names, x)
	}
	return m, d.Done()
}

func (m *Results) Encode(e *Encoder) {
	e.U32(uint32(len(m.Errs)))
	for _, err := range m.Errs {
		if err == nil {
			e.U16(0)
			e.String32("")
			continue
		}
		e.U16(base.Code(err))
		e.String32(err.Error())
	}
}

func DecodeResults(b []byte) (m Results, err error) {
	d := NewDecoder(b)
	n := d.U32()
	if d.err == nil && int64(n) > int64(len(b))/6 {
		return m, protoErr("%d results in %d bytes", n, len(b))
	}
	m.Errs = make([]error, 0, n)
	for range n {
		code, text := d.U16(), d.String32()
		if d.err != nil {
			break
		}
		var err error
		switch {
		case code == 0 && text != "":
			return m, protoErr("result of status 0 with a message")
		case code != 0:
			if err = base.FromCode(code, text); base.Code(err) != code {
				return m, protoErr("result of unknown status %d", code)
			}
		}
		m.Errs = append(m.Errs, err)
	}
	return m, d.Done()
}

// RoundReply kinds.
const (
	RoundReplyAck   uint8 = 0 // the round succeeded; nothing else
	RoundReplyTable uint8 = 1 // the table follows
	RoundReplyRelay uint8 = 2 // fetch table ID from Node at Addr (PeerTable)
	// RoundReplyDirect answers a PeerGather whose shards the relay does
	// not carry up (it sent its own request already, or its node is not
	// in the round): send them to the coordinator.
	RoundReplyDirect uint8 = 3
)

// RoundReply answers a PeerRound: an acknowledgement, the table (without
// paths), or the node that has it or soon will (its own round's reply).
type RoundReply struct {
	Kind       uint8
	Table      Table
	Node, Addr string
	ID         int64
}

func (m *RoundReply) Encode(e *Encoder) {
	e.U8(m.Kind)
	switch m.Kind {
	case RoundReplyTable:
		m.Table.Encode(e)
	case RoundReplyRelay:
		e.String(m.Node)
		e.String(m.Addr)
		e.I64(m.ID)
	}
}

func DecodeRoundReply(b []byte) (m RoundReply, err error) {
	if len(b) < 1 {
		return m, protoErr("round reply of %d bytes", len(b))
	}
	m.Kind = b[0]
	switch m.Kind {
	case RoundReplyAck, RoundReplyDirect:
		d := NewDecoder(b[1:])
		return m, d.Done()
	case RoundReplyTable:
		m.Table, err = DecodeTable(b[1:])
		return m, err
	case RoundReplyRelay:
		d := NewDecoder(b[1:])
		m.Node, m.Addr, m.ID = d.String(), d.String(), d.I64()
		return m, d.Done()
	}
	return m, protoErr("round reply of kind %d, want 0, 1, 2 or 3", m.Kind)
}

// Path is a reply holding one file path (Create).
type Path struct{ Path string }

func (m *Path) Encode(e *Encoder) { e.String32(m.Path) }

func DecodePath(b []byte) (m Path, err error) {
	d := NewDecoder(b)
	m.Path = d.String32()
	return m, d.Done()
}

// Name is a request naming a variable (Lookup, Free, PeerLookup, PeerFree);
// Rank says which rank frees, Node which node.
type Name struct {
	Name string
	Node string
	Rank int64
}

func (m *Name) Encode(e *Encoder) { e.String(m.Name); e.String(m.Node); e.I64(m.Rank) }

func DecodeName(b []byte) (m Name, err error) {
	d := NewDecoder(b)
	m.Name, m.Node, m.Rank = d.String(), d.String(), d.I64()
	return m, d.Done()
}

// Table is a variable's complete geometry once every rank has published:
// rows per rank, where each rank lives, how to reach each node, and, for the
// ranks on the asking client's node, the segment files to map.
type Table struct {
	Name      string
	Disp      int64
	ItemSize  int64
	ShardRows []int64  // per rank
	RankNode  []int64  // per rank: index into Nodes
	Nodes     []string // node ids
	Addrs     []string // per node: peer address
	Paths     []string // per rank: segment path on the asking node, "" elsewhere
	Dtype     string   // the items' type, "" for untyped bytes
	// ID tells apart variables of the same name made one after the other
	// (created, freed by every rank, created again): a Fetch names it, so
	// a stale table never reads rows of another variable.
	ID int64
	// Backing is the file that holds every row (Shard.Backing), "" for
	// none; rows from the sum of ShardRows up to Total are read from it.
	Backing string
	Total   int64
	// Kind is the rows' kind (Shard.Kind). A ragged variable's table also
	// has ShardItems (per rank, the units of Disp items its shard holds)
	// and Shape (the trailing dimensions, as every rank declared them);
	// Index is, in a client's reply, the node's index segment: the
	// job-wide offsets of every row, which the client maps read-only.
	Kind       Kind
	ShardItems []int64
	Shape      []int64
	Index      string
}

// Ragged tells whether the table is of a ragged variable.
func (m *Table) Ragged() bool { return m.Kind == KindRagged }

func (m *Table) Encode(e *Encoder) {
	e.String(m.Name)
	e.I64(m.Disp)
	e.I64(m.ItemSize)
	e.I64s(m.ShardRows)
	e.I64s(m.RankNode)
	e.Strings(m.Nodes)
	e.Strings(m.Addrs)
	e.Strings(m.Paths)
	e.String(m.Dtype)
	e.I64(m.ID)
	e.String32(m.Backing)
	e.I64(m.Total)
	e.U8(uint8(m.Kind))
	e.I64s(m.ShardItems)
	e.I64s(m.Shape)
	e.String32(m.Index)
}

func DecodeTable(b []byte) (m Table, err error) {
	d := NewDecoder(b)
	m.Name, m.Disp, m.ItemSize = d.String(), d.I64(), d.I64()
	m.ShardRows = d.I64s(nil)
	m.RankNode = d.I64s(nil)
	m.Nodes, m.Addrs, m.Paths = d.Strings(), d.Strings(), d.Strings()
	m.Dtype = d.String()
	m.ID = d.I64()
	m.Backing = d.String32()
	m.Total = d.I64()
	m.Kind = Kind(d.U8())
	m.ShardItems = d.I64s(nil)
	m.Shape = d.I64s(nil)
	m.Index = d.String32()
	if err := d.Done(); err != nil {
		return m, err
	}
	return m, m.Check()
}

// Check rejects a table whose lists disagree, so a decoded table can be
// indexed without further tests.
func (m *Table) Check() error {
	p := len(m.ShardRows)
	if len(m.RankNode) != p || (len(m.Paths) != 0 && len(m.Paths) != p) || len(m.Addrs) != len(m.Nodes) {
		return protoErr("table of %q: %d shards, %d rank nodes, %d paths, %d nodes, %d addresses",
			m.Name, p, len(m.RankNode), len(m.Paths), len(m.Nodes), len(m.Addrs))
	}
	var held int64
	for _, n := range m.ShardRows {
		if n < 0 {
			return protoErr("table of %q: a shard of %d rows", m.Name, n)
		}
		held += n
	}
	if m.Backing == "" && m.Total != 0 && m.Total != held || m.Total != 0 && m.Total < held {
		return protoErr("table of %q: %d rows in all, %d in shards, backing %q", m.Name, m.Total, held, m.Backing)
	}
	for r, n := range m.RankNode {
		if n < 0 || n >= int64(len(m.Nodes)) {
			return protoErr("table of %q: rank %d on node %d of %d", m.Name, r, n, len(m.Nodes))
		}
	}
	switch m.Kind {
	case KindRows:
		if len(m.ShardItems) != 0 || len(m.Shape) != 0 || m.Index != "" {
			return protoErr("table of %q: fixed rows with %d shard item counts, %d trailing dimensions, index %q", m.Name, len(m.ShardItems), len(m.Shape), m.Index)
		}
	case KindRagged:
		if len(m.ShardItems) != p || len(m.Shape) > MaxShape || m.Backing != "" && !strings.Contains(m.Backing, "\x00") {
			return protoErr("table of %q: ragged rows with %d shard item counts for %d shards, %d trailing dimensions, backing %q",
				m.Name, len(m.ShardItems), p, len(m.Shape), m.Backing)
		}
		var items int64
		for r, n := range m.ShardItems {
			if n < 0 || n > 1<<62-items {
				return protoErr("table of %q: rank %d holds %d items", m.Name, r, n)
			}
			items += n
		}
		disp := int64(1)
		for _, d := range m.Shape {
			if d < 1 || d > 1<<40/disp {
				return protoErr("table of %q: trailing shape %v", m.Name, m.Shape)
			}
			disp *= d
		}
		if disp != m.Disp {
			return protoErr("table of %q: trailing shape %v of %d items per unit, disp %d", m.Name, m.Shape, disp, m.Disp)
		}
	default:
		return protoErr("table of %q: kind %d", m.Name, m.Kind)
	}
	return nil
}

// Read asks the agent to fetch rows from other nodes into a registered
// region: row Globals[i] goes to Offsets[i] in region Region.
type Read struct {
	Name    string
	Region  uint32
	ID      int64 // the table id the client read its geometry from
	Globals []int64
	Offsets []int64
}

func (m *Read) Encode(e *Encoder) {
	e.String(m.Name)
	e.U32(m.Region)
	e.I64(m.ID)
	e.I64s(m.Globals)
	e.I64s(m.Offsets)
}

// DecodeRead decodes into m, reusing its slices.
func DecodeRead(b []byte, m *Read) error {
	d := NewDecoder(b)
	m.Name, m.Region, m.ID = d.String(), d.U32(), d.I64()
	m.Globals = d.I64s(m.Globals)
	m.Offsets = d.I64s(m.Offsets)
	if err := d.Done(); err != nil {
		return err
	}
	if len(m.Globals) != len(m.Offsets) {
		return protoErr("read of %q: %d indices but %d offsets", m.Name, len(m.Globals), len(m.Offsets))
	}
	return nil
}

// Region names a registered receive region (Register reply, Unregister), or
// its size (Register request, whose descriptor travels beside the frame).
type Region struct {
	ID   uint32
	Size int64
}

func (m *Region) Encode(e *Encoder) { e.U32(m.ID); e.I64(m.Size) }

func DecodeRegion(b []byte) (m Region, err error) {
	d := NewDecoder(b)
	m.ID, m.Size = d.U32(), d.I64()
	return m, d.Done()
}

// Text is a body of one long string: JSON for Info, messages.
type Text struct{ Text string }

func (m *Text) Encode(e *Encoder) { e.String32(m.Text) }

func DecodeText(b []byte) (m Text, err error) {
	d := NewDecoder(b)
	m.Text = d.String32()
	return m, d.Done()
}

// Join announces an agent to the coordinator.
type Join struct {
	Node      string
	Addr      string
	Namespace string // the coordinator refuses agents of another job
	// Watch: the coordinator answers only when it stops; until then the
	// request's connection staying open says the node's agent lives, and
	// its closing that the agent went (a U8, 0 or 1).
	Watch bool
}

func (m *Join) Encode(e *Encoder) {
	e.String(m.Node)
	e.String(m.Addr)
	e.String(m.Namespace)
	var w uint8
	if m.Watch {
		w = 1
	}
	e.U8(w)
}

func DecodeJoin(b []byte) (m Join, err error) {
	d := NewDecoder(b)
	m.Node, m.Addr, m.Namespace = d.String(), d.String(), d.String()
	switch w := d.U8(); {
	case d.Err() != nil:
	case w > 1:
		return m, base.Errorf(base.ErrProtocol, "join: watch flag %d, want 0 or 1", w)
	default:
		m.Watch = w == 1
	}
	return m, d.Done()
}

// Fetch asks an owner node for rows by global index; the reply's payload is
// the rows in the order asked. A client's Prefetch has the same body: rows
// of the backing file its agent is to read ahead into staging memory.
type Fetch struct {
	Name    string
	ID      int64 // the variable's Table.ID
	Globals []int64
}

func (m *Fetch) Encode(e *Encoder) { e.String(m.Name); e.I64(m.ID); e.I64s(m.Globals) }

// DecodeFetch decodes into m, reusing its slice.
func DecodeFetch(b []byte, m *Fetch) error {
	d := NewDecoder(b)
	m.Name = d.String()
	m.ID = d.I64()
	m.Globals = d.I64s(m.Globals)
	return d.Done()
}

// ReadRange asks the client's agent for the contiguous rows [Start,
// Start+Count) of a variable of fixed-size rows, written one after another
// into the receive region from byte Offset on: one request whatever the
// rows' size (a record of bytes of a uint8 variable is as many rows).
type ReadRange struct {
	Name   string
	Region uint32
	ID     int64 // the table id the client read its geometry from
	Start  int64
	Count  int64
	Offset int64
}

func (m *ReadRange) Encode(e *Encoder) {
	e.String(m.Name)
	e.U32(m.Region)
	e.I64(m.ID)
	e.I64(m.Start)
	e.I64(m.Count)
	e.I64(m.Offset)
}

func DecodeReadRange(b []byte) (m ReadRange, err error) {
	d := NewDecoder(b)
	m.Name, m.Region, m.ID = d.String(), d.U32(), d.I64()
	m.Start, m.Count, m.Offset = d.I64(), d.I64(), d.I64()
	return m, d.Done()
}

// FetchRange asks an owner node for the contiguous rows [Start,
// Start+Count), all of them its own; the reply's payload is the rows in
// order.
type FetchRange struct {
	Name  string
	ID    int64 // the variable's Table.ID
	Start int64
	Count int64
}

func (m *FetchRange) Encode(e *Encoder) {
	e.String(m.Name)
	e.I64(m.ID)
	e.I64(m.Start)
	e.I64(m.Count)
}

func DecodeFetchRange(b []byte) (m FetchRange, err error) {
	d := NewDecoder(b)
	m.Name, m.ID, m.Start, m.Count = d.String(), d.I64(), d.I64(), d.I64()
	return m, d.Done()
}

// PeerOffsets asks the agent holding a rank's ragged shard for its local
// offsets (PeerOffsets request), from which the asker builds its node's
// index: offsets First to First+Count of the rank's shard, Count+1 values
// (row l of the shard is units offsets[l] to offsets[l+1]).
type PeerOffsets struct {
	Name  string
	ID    int64 // the variable's Table.ID
	Rank  int64
	First int64
	Count int64
}

// MaxOffsets bounds the rows one PeerOffsets asks for, so that its reply
// (Count+1 offsets) fits in a frame's body.
const MaxOffsets = 1 << 20

func (m *PeerOffsets) Encode(e *Encoder) {
	e.String(m.Name)
	e.I64(m.ID)
	e.I64(m.Rank)
	e.I64(m.First)
	e.I64(m.Count)
}

func DecodePeerOffsets(b []byte) (m PeerOffsets, err error) {
	d := NewDecoder(b)
	m.Name, m.ID, m.Rank, m.First, m.Count = d.String(), d.I64(), d.I64(), d.I64(), d.I64()
	return m, d.Done()
}

// Offsets is the reply to PeerOffsets: Count+1 offsets, in units from the
// start of the rank's shard, never decreasing.
type Offsets struct {
	Offsets []int64
}

func (m *Offsets) Encode(e *Encoder) { e.I64s(m.Offsets) }

func DecodeOffsets(b []byte) (m Offsets, err error) {
	d := NewDecoder(b)
	m.Offsets = d.I64s(nil)
	if err := d.Done(); err != nil {
		return m, err
	}
	for i := 1; i < len(m.Offsets); i++ {
		if m.Offsets[i] < m.Offsets[i-1] {
			return m, protoErr("offsets: offsets[%d] = %d after %d", i, m.Offsets[i], m.Offsets[i-1])
		}
	}
	return m, nil
}

// Drop tells an agent that every rank has freed a variable: its shards on
// that node go.
type Drop struct {
	Name string
	ID   int64
}

func (m *Drop) Encode(e *Encoder) { e.String(m.Name); e.I64(m.ID) }

func DecodeDrop(b []byte) (m Drop, err error) {
	d := NewDecoder(b)
	m.Name, m.ID = d.String(), d.I64()
	return m, d.Done()
}

// DropTree is a Drop (PeerDropTree) that the agent also passes on to
// Nodes, by their addresses Addrs (the drops' tree, docs/protocol.md).
type DropTree struct {
	Drop
	Nodes []string
	Addrs []string
}

func (m *DropTree) Encode(e *Encoder) {
	m.Drop.Encode(e)
	e.Strings(m.Nodes)
	e.Strings(m.Addrs)
}

func DecodeDropTree(b []byte) (m DropTree, err error) {
	d := NewDecoder(b)
	m.Name, m.ID = d.String(), d.I64()
	m.Nodes, m.Addrs = d.Strings(), d.Strings()
	if d.Err() == nil && len(m.Nodes) != len(m.Addrs) {
		return m, protoErr("drop of %q: %d nodes to pass it on to and %d addresses, want as many of each", m.Name, len(m.Nodes), len(m.Addrs))
	}
	return m, d.Done()
}

// PeerWindow asks an agent of a one-sided transport (mpi, fabric) where
// its shards of a variable lie (PeerWindow request): the variable's name
// and the id of the table the asker reads it by.
type PeerWindow struct {
	Name string
	ID   int64
}

func (m *PeerWindow) Encode(e *Encoder) { e.String(m.Name); e.I64(m.ID) }

func DecodePeerWindow(b []byte) (m PeerWindow, err error) {
	d := NewDecoder(b)
	m.Name, m.ID = d.String(), d.I64()
	return m, d.Done()
}

// PeerNodes asks the coordinator for the nodes that have joined and their
// agents' addresses (PeerNodes request): those of Node only, or of every
// node when Node is "". An agent asks it when a node's address it read
// rows at failed (that node's agent may have restarted elsewhere).
type PeerNodes struct {
	Node string
}

func (m *PeerNodes) Encode(e *Encoder) { e.String(m.Node) }

func DecodePeerNodes(b []byte) (m PeerNodes, err error) {
	d := NewDecoder(b)
	m.Node = d.String()
	return m, d.Done()
}

// Barrier is one rank's arrival at a fence (Barrier, PeerBarrier): the
// ranks that send the same Key and Seq meet, Size of them, each once.
type Barrier struct {
	// Key names the ranks that meet: the client's replica group and world
	// (see docs/protocol.md), opaque to the agents.
	Key  string
	Rank int64
	Size int64
	// Seq counts the rank's fences under Key, from 1: all ranks' n-th
	// fences form one round, so a late rank of a failed round gets its
	// error and the next fence starts a fresh one.
	Seq       int64
	TimeoutMs int64 // how long to wait for the other ranks; <= 0: the agent's join timeout
	// Client and ClientAgeMs: as Shard's (set by the agent before
	// PeerBarrier; clients send 0).
	Client      uint64
	ClientAgeMs int64
}

func (m *Barrier) Encode(e *Encoder) {
	e.String(m.Key)
	e.I64(m.Rank)
	e.I64(m.Size)
	e.I64(m.Seq)
	e.I64(m.TimeoutMs)
	e.U64(m.Client)
	e.I64(m.ClientAgeMs)
}

func DecodeBarrier(b []byte) (m Barrier, err error) {
	d := NewDecoder(b)
	m.Key = d.String()
	m.Rank, m.Size, m.Seq, m.TimeoutMs = d.I64(), d.I64(), d.I64(), d.I64()
	m.Client, m.ClientAgeMs = d.U64(), d.I64()
	return m, d.Done()
}

// Gone tells the coordinator that a client process of a node went away
// (PeerGone): its last connection to its agent closed, or it closed one
// while it waited in a collective. Every collective it took part in, or
// whose group it is a rank of, fails for the other ranks at once.
type Gone struct {
	Node   string
	Client uint64 // the agent's number of the process (Shard.Client)
	Pid    int64  // the process id, for the error (0 if unknown)
	// Rank and Size are the world rank and size the process said hello
	// with (-1 and 0 for none): a process gone before it reached the
	// collective it was a rank of fails that too.
	Rank int64
	Size int64
}

func (m *Gone) Encode(e *Encoder) {
	e.String(m.Node)
	e.U64(m.Client)
	e.I64(m.Pid)
	e.I64(m.Rank)
	e.I64(m.Size)
}

func DecodeGone(b []byte) (m Gone, err error) {
	d := NewDecoder(b)
	m.Node = d.String()
	m.Client = d.U64()
	m.Pid, m.Rank, m.Size = d.I64(), d.I64(), d.I64()
	return m, d.Done()
}

// Window is where an agent of the MPI transport exposes its shards of a
// variable (PeerWindow reply): a reader in the same MPI world gets rows
// straight out of the owner's memory with one-sided gets, with no work on
// the owner's side.
type Window struct {
	// World identifies the MPI world (MPI_COMM_WORLD of one launch): a rank
	// means nothing to an agent of another world.
	World uint64
	// Rank is the owner agent's rank in that world.
	Rank     int64
	RowBytes int64
	Shards   []WindowShard // the node's shards, by First
}

// WindowShard is one shard as exposed in the owner's MPI window.
type WindowShard struct {
	First int64  // global index of the shard's first row
	Rows  int64  // rows in the shard
	Addr  uint64 // MPI address (MPI_Get_address) of the shard's row 0
	// Token is the MPI address of a word that holds the variable's table
	// id for as long as the shard is exposed (zero once it is withdrawn):
	// a reader checks it after its gets, so rows of a freed shard, or of
	// another shard mapped at the same address since, are never taken.
	Token uint64
}

// windowShardBytes is the encoded size of one WindowShard.
const windowShardBytes = 32

func (m *Window) Encode(e *Encoder) {
	e.U64(m.World)
	e.I64(m.Rank)
	e.I64(m.RowBytes)
	e.U32(uint32(len(m.Shards)))
	for _, s := range m.Shards {
		e.I64(s.First)
		e.I64(s.Rows)
		e.U64(s.Addr)
		e.U64(s.Token)
	}
}

func DecodeWindow(b []byte) (m Window, err error) {
	d := NewDecoder(b)
	m.World, m.Rank, m.RowBytes = d.U64(), d.I64(), d.I64()
	n := int(d.U32())
	if d.err == nil && n > len(d.b)/windowShardBytes {
		d.fail("window shards", windowShardBytes*n)
	}
	if d.err == nil && n > 0 {
		m.Shards = make([]WindowShard, n)
		for i := range m.Shards {
			s := &m.Shards[i]
			s.First, s.Rows, s.Addr, s.Token = d.I64(), d.I64(), d.U64(), d.U64()
		}
	}
	if err := d.Done(); err != nil {
		return m, err
	}
	return m, m.Check()
}

// Check rejects a window a reader could not use as is: rows of no size,
// shards empty, overlapping or out of order.
func (m *Window) Check() error {
	if m.RowBytes < 1 {
		return protoErr("window: rows of %d bytes", m.RowBytes)
	}
	next := int64(0)
	for i, s := range m.Shards {
		if s.First < next || s.Rows < 1 || s.Rows > math.MaxInt64-s.First {
			return protoErr("window: shard %d of rows [%d, +%d) after row %d", i, s.First, s.Rows, next)
		}
		next = s.First + s.Rows
	}
	return nil
}
