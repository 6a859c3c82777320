package wire

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/ddstore-go/ddstore/internal/base"
)

// msgPtr is a pointer to a message type T.
type msgPtr[T any] interface {
	*T
	Encode(*Encoder)
}

func encodeMsg[T any, P msgPtr[T]](m T) []byte {
	var e Encoder
	P(&m).Encode(&e)
	return e.Bytes()
}

// normalize returns a copy of the struct v with its empty slices set to nil,
// so that nil and empty lists compare equal.
func normalize(v any) any {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Struct {
		return v
	}
	c := reflect.New(rv.Type()).Elem()
	c.Set(rv)
	for i := 0; i < c.NumField(); i++ {
		switch f := c.Field(i); {
		case f.Kind() == reflect.Slice && f.Len() == 0 && f.CanSet():
			f.Set(reflect.Zero(f.Type()))
		case f.Kind() == reflect.Struct && f.CanSet(): // a message inside one (RoundReply's Table)
			f.Set(reflect.ValueOf(normalize(f.Interface())))
		}
	}
	return c.Interface()
}

func msgEqual(a, b any) bool { return reflect.DeepEqual(normalize(a), normalize(b)) }

func decodeRead(b []byte) (Read, error) {
	var m Read
	err := DecodeRead(b, &m)
	return m, err
}

func decodeFetch(b []byte) (Fetch, error) {
	var m Fetch
	err := DecodeFetch(b, &m)
	return m, err
}

var long = strings.Repeat("l", 0xFFFF) // the longest name

var (
	helloSamples = []Hello{
		{},
		{Namespace: "train", Node: "node-0", Rank: 3, Size: 8, LocalRank: 1, LocalSize: 4, Pid: 12345},
		{Namespace: "名前空間", Node: "nœud-ü 🚀", Rank: -1, Size: 1},
		{Namespace: long, Node: "x", Rank: math.MinInt64, Size: math.MaxInt64, LocalRank: -7, LocalSize: math.MaxInt64, Pid: math.MinInt64},
	}
	helloReplySamples = []HelloReply{
		{},
		{Node: "node-3", AgentPid: 999},
		{Node: "узел-λ", AgentPid: -1},
		{Node: long, AgentPid: math.MaxInt64},
	}
	shardSamples = []Shard{
		{},
		{Name: "features", Node: "n0", Rank: 1, Size: 4, Rows: 1000, Disp: 3, ItemSize: 4, TimeoutMs: 30000},
		{Name: "変数", Node: "ノード", Rank: -1, Size: math.MaxInt64, Rows: math.MinInt64, Disp: -3, ItemSize: 1 << 40, TimeoutMs: -1},
		{Name: "tiered", Rank: 1, Size: 2, Rows: 10, Disp: 4, ItemSize: 4, Dtype: "float32", Backing: "/data/x.h5:/cubes", Total: 80},
		{Name: "positions", Rank: 0, Size: 2, Rows: 3, Disp: 3, ItemSize: 4, Dtype: "float32", Kind: KindRagged, Items: 41, Shape: []int64{3}},
		{Name: "x@r4", Node: "n1", Rank: 1, Size: 2, Rows: 5, Disp: 1, ItemSize: 8, Attempt: 2, Group: "@r4", Client: math.MaxUint64, ClientAgeMs: math.MinInt64},
	}
	pathSamples = []Path{
		{},
		{Path: "/dev/shm/ddstore-train-features-0"},
		{Path: "/tmp/データ/ü"},
		{Path: strings.Repeat("p", 70000)}, // longer than a name may be
	}
	nameSamples = []Name{
		{},
		{Name: "labels", Node: "node-1", Rank: 2},
		{Name: "名", Node: "ノ", Rank: -1},
		{Name: long, Node: long, Rank: math.MinInt64},
	}
	tableSamples = []Table{
		{},
		{Name: "empty lists", ShardRows: []int64{}, RankNode: []int64{}, Nodes: []string{}, Addrs: []string{}, Paths: []string{}},
		{
			Name: "features", Disp: 4, ItemSize: 8,
			ShardRows: []int64{10, 0, 5}, RankNode: []int64{0, 1, 1},
			Nodes: []string{"a", "b"}, Addrs: []string{"10.0.0.1:5000", "10.0.0.2:5000"},
			Paths: []string{"/dev/shm/features.0", "", ""},
		},
		{
			Name: "no paths", Disp: 1, ItemSize: 1,
			ShardRows: []int64{1, 2}, RankNode: []int64{1, 0},
			Nodes: []string{"a", "b"}, Addrs: []string{"", ""},
		},
		{
			Name: "変数 🚀", Disp: -1, ItemSize: math.MaxInt64,
			ShardRows: []int64{math.MaxInt64}, RankNode: []int64{0},
			Nodes: []string{"ノード"}, Addrs: []string{"[::1]:1"}, Paths: []string{""},
		},
		{Name: "nodes without ranks", Nodes: []string{"a"}, Addrs: []string{"b"}},
		{
			Name: "backed", Disp: 2, ItemSize: 4, ShardRows: []int64{3, 0}, RankNode: []int64{0, 0},
			Nodes: []string{"a"}, Addrs: []string{""}, Backing: "/data/x.npy", Total: 12, ID: 7,
		},
		{
			Name: "positions", Disp: 3, ItemSize: 4, Dtype: "float32", ShardRows: []int64{3, 2}, RankNode: []int64{0, 1},
			Nodes: []string{"a", "b"}, Addrs: []string{"x", "y"}, Paths: []string{"/dev/shm/p.r0", ""}, ID: 9,
			Kind: KindRagged, ShardItems: []int64{17, 0}, Shape: []int64{3}, Index: "/dev/shm/p.index",
		},
	}
	peerOffsetsSamples = []PeerOffsets{
		{},
		{Name: "positions", ID: 9, Rank: 3, First: 0, Count: MaxOffsets},
		{Name: "ü", ID: math.MinInt64, Rank: -1, First: math.MaxInt64, Count: -1},
	}
	offsetsSamples = []Offsets{
		{},
		{Offsets: []int64{0}},
		{Offsets: []int64{0, 0, 3, 3, 1 << 40}},
	}
	readSamples = []Read{
		{},
		{Name: "empty", Region: 1, Globals: []int64{}, Offsets: []int64{}},
		{Name: "v", Region: 7, Globals: []int64{1, 2, 3}, Offsets: []int64{0, 8, 16}},
		{Name: "ü名", Region: math.MaxUint32, Globals: []int64{math.MinInt64, math.MaxInt64}, Offsets: []int64{-1, 0}},
	}
	regionSamples = []Region{
		{},
		{ID: 1, Size: 4096},
		{ID: math.MaxUint32, Size: math.MinInt64},
	}
	textSamples = []Text{
		{},
		{Text: `{"vars": {"features": {"rows": 10}}}`},
		{Text: "ünïcødé ✓ 名前 \x00 binary \xff"},
		{Text: strings.Repeat("t", 70000)},
	}
	joinSamples = []Join{
		{},
		{Node: "node-1", Addr: "10.0.0.1:4000"},
		{Node: "ノード", Addr: "[fe80::1%eth0]:1", Watch: true},
	}
	roundSamples = []Round{
		{},
		{Shard: Shard{Name: "features", Node: "n0", Rank: 1, Size: 4, Rows: 1000, Disp: 3, ItemSize: 4, TimeoutMs: 30000}, Want: RoundTable},
		{Shard: Shard{Name: "positions", Rank: 0, Size: 2, Rows: 3, Disp: 3, ItemSize: 4, Dtype: "float32", Kind: KindRagged, Items: 41, Shape: []int64{3}}, Want: RoundAck},
		{Shard: Shard{Name: "features", Node: "n1", Rank: 4, Size: 8, Rows: 10, Disp: 3, ItemSize: 4}, Want: RoundTable,
			Others: []Shard{{Name: "features", Node: "n1", Rank: 5, Size: 8, Rows: 10, Disp: 3, ItemSize: 4}, {Name: "features", Node: "n1", Rank: 7, Size: 8, Rows: 9, Disp: 3, ItemSize: 4, Failed: true, Why: "no memory"}}},
		{Shard: Shard{Name: "features", Node: "n2", Rank: 6, Size: 8, Rows: 10, Disp: 3, ItemSize: 4}, Want: RoundTable, From: "n1"},
		{Shard: Shard{Name: "features", Node: "n2", Rank: 6, Size: 8, Rows: 10, Disp: 3, ItemSize: 4}, Want: RoundTable, From: "n1",
			Others: []Shard{{Name: "features", Node: "n3", Rank: 7, Size: 8, Rows: 10, Disp: 3, ItemSize: 4}}},
	}
	roundReplySamples = []RoundReply{
		{},
		{Kind: RoundReplyTable, Table: tableSamples[1]},
		{Kind: RoundReplyRelay, Node: "n7", Addr: "10.0.0.7:4000", ID: 9},
		{Kind: RoundReplyDirect},
	}
	shardsSamples = []Shards{
		{},
		{Shards: []Shard{{Name: "features", Node: "n0", Rank: 1, Size: 4, Rows: 1000, Disp: 3, ItemSize: 4, TimeoutMs: 30000}}},
		{Shards: []Shard{{Name: "a", Node: "n1", Rank: 2, Size: 8, Rows: 1, Disp: 1, ItemSize: 1, Attempt: 1},
			{Name: "positions", Node: "n1", Rank: 3, Size: 8, Rows: 3, Disp: 3, ItemSize: 4, Dtype: "float32", Kind: KindRagged, Items: 41, Shape: []int64{3}}}},
	}
	namesSamples = []Names{
		{},
		{Names: []Name{{Name: "x", Node: "n1", Rank: 3}}},
		{Names: []Name{{Name: "a", Node: "n1", Rank: 2}, {Name: "変数", Node: "n1", Rank: math.MaxInt64}}},
	}
	resultsSamples = []Results{
		{},
		{Errs: []error{nil}},
		{Errs: []error{nil, base.FromCode(base.Code(base.ErrGeometry), `variable "a": rank 3 says disp 2, rank 0 says 1`), nil}},
	}
	dropSamples = []Drop{
		{},
		{Name: "x", ID: 7},
		{Name: "features/0", ID: -1},
	}
	dropTreeSamples = []DropTree{
		{},
		{Drop: Drop{Name: "x", ID: 7}, Nodes: []string{"n1"}, Addrs: []string{"127.0.0.1:9"}},
		{Drop: Drop{Name: "x", ID: 8}, Nodes: []string{"n1", "n2", "n3"}, Addrs: []string{"a:1", "b:2", "c:3"}},
	}
	peerWindowSamples = []PeerWindow{
		{},
		{Name: "x", ID: 7},
		{Name: "features/0", ID: -1},
	}
	readRangeSamples = []ReadRange{
		{},
		{Name: "recs", Region: 2, ID: 5, Start: 10240, Count: 4096, Offset: 64},
		{Name: "x@s0123456789ab@r4", Region: 1<<32 - 1, ID: -1, Start: -1, Count: -7, Offset: 1 << 40},
	}
	fetchRangeSamples = []FetchRange{
		{},
		{Name: "recs", ID: 5, Start: 10240, Count: 4096},
		{Name: "données", ID: 1 << 62, Start: -3, Count: 0},
	}
	barrierSamples = []Barrier{
		{},
		{Key: "@r4", Rank: 1, Size: 2, Seq: 7, TimeoutMs: 300000},
		{Key: "グループ", Rank: math.MaxInt64, Size: math.MinInt64, Seq: -1, TimeoutMs: -1},
		{Key: long, Rank: 3, Size: 4, Seq: 1 << 40},
		{Key: "@r2", Rank: 0, Size: 2, Seq: 3, Client: 0x0123456789abcdef, ClientAgeMs: 1500},
	}
	goneSamples = []Gone{
		{},
		{Node: "n1", Client: 0xfedcba9876543210, Pid: 4242, Rank: 1, Size: 2},
		{Node: long, Client: math.MaxUint64, Pid: -1, Rank: -1, Size: math.MinInt64},
	}
	peerNodesSamples = []PeerNodes{
		{},
		{Node: "node-1"},
		{Node: "ノード"},
	}
	windowSamples = []Window{
		{RowBytes: 1},
		{World: 0x0123456789abcdef, Rank: 3, RowBytes: 4096, Shards: []WindowShard{
			{First: 0, Rows: 5, Addr: 0x7f0000001000, Token: 0x55aa00000008},
			{First: 5, Rows: 1, Addr: 0x7f0000100000, Token: 0x55aa00000010},
			{First: 100, Rows: math.MaxInt64 - 100, Addr: math.MaxUint64, Token: math.MaxUint64},
		}},
	}
	fetchSamples = []Fetch{
		{},
		{Name: "empty", Globals: []int64{}},
		{Name: "v", Globals: []int64{5, 3, 5, 0}},
		{Name: "名前", Globals: []int64{math.MinInt64, -1, math.MaxInt64}},
		{Name: "many", Globals: seq(1000)},
	}
)

func seq(n int) []int64 {
	s := make([]int64, n)
	for i := range s {
		s[i] = int64(i * i)
	}
	return s
}

// decodeSafe calls dec and turns a panic into an error naming it.
func decodeSafe[T any](dec func([]byte) (T, error), b []byte) (m T, err error, panicked any) {
	defer func() { panicked = recover() }()
	m, err = dec(b)
	return m, err, nil
}

func testCodec[T any, P msgPtr[T]](t *testing.T, samples []T, dec func([]byte) (T, error)) {
	for i, want := range samples {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			enc := encodeMsg[T, P](want)

			got, err := dec(enc)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !msgEqual(got, want) {
				t.Fatalf("round trip:\n got %+v\nwant %+v", trunc(fmt.Sprint(got)), trunc(fmt.Sprint(want)))
			}
			if again := encodeMsg[T, P](got); !bytes.Equal(again, enc) {
				t.Fatalf("re-encoding differs")
			}
			// The decoded value owns its memory.
			for j := range enc {
				enc[j] = 0xA5
			}
			if !msgEqual(got, want) {
				t.Fatalf("decoded value aliases the input")
			}
			enc = encodeMsg[T, P](want)

			// Trailing bytes.
			for _, extra := range [][]byte{{0}, {1, 2, 3, 4, 5, 6, 7, 8, 9}} {
				_, err := dec(append(bytes.Clone(enc), extra...))
				if !errors.Is(err, base.ErrProtocol) {
					t.Errorf("%d trailing bytes: err = %v, want ErrProtocol", len(extra), err)
				} else if want := fmt.Sprintf("%d bytes left over", len(extra)); !strings.Contains(err.Error(), want) {
					t.Errorf("%d trailing bytes: err %q does not say %q", len(extra), err, want)
				}
			}

			// Every truncation. Long encodings are sampled, not walked.
			for n := 0; n < len(enc); n++ {
				if len(enc) > 4096 && n > 1024 && n < len(enc)-1024 && n%997 != 0 {
					continue
				}
				_, err, p := decodeSafe(dec, bytes.Clone(enc[:n]))
				if p != nil {
					t.Fatalf("prefix of %d/%d bytes: panic: %v", n, len(enc), p)
				}
				if !errors.Is(err, base.ErrProtocol) {
					t.Fatalf("prefix of %d/%d bytes: err = %v, want ErrProtocol", n, len(enc), err)
				}
			}
		})
	}
}

func TestMessageRoundTrip(t *testing.T) {
	t.Run("Hello", func(t *testing.T) { testCodec(t, helloSamples, DecodeHello) })
	t.Run("HelloReply", func(t *testing.T) { testCodec(t, helloReplySamples, DecodeHelloReply) })
	t.Run("Shard", func(t *testing.T) { testCodec(t, shardSamples, DecodeShard) })
	t.Run("Path", func(t *testing.T) { testCodec(t, pathSamples, DecodePath) })
	t.Run("Name", func(t *testing.T) { testCodec(t, nameSamples, DecodeName) })
	t.Run("Table", func(t *testing.T) { testCodec(t, tableSamples, DecodeTable) })
	t.Run("Read", func(t *testing.T) { testCodec(t, readSamples, decodeRead) })
	t.Run("Region", func(t *testing.T) { testCodec(t, regionSamples, DecodeRegion) })
	t.Run("Text", func(t *testing.T) { testCodec(t, textSamples, DecodeText) })
	t.Run("Join", func(t *testing.T) { testCodec(t, joinSamples, DecodeJoin) })
	t.Run("Gone", func(t *testing.T) { testCodec(t, goneSamples, DecodeGone) })
	t.Run("Drop", func(t *testing.T) { testCodec(t, dropSamples, DecodeDrop) })
	t.Run("DropTree", func(t *testing.T) { testCodec(t, dropTreeSamples, DecodeDropTree) })
	t.Run("Round", func(t *testing.T) { testCodec(t, roundSamples, DecodeRound) })
	t.Run("Shards", func(t *testing.T) { testCodec(t, shardsSamples, DecodeShards) })
	t.Run("Results", func(t *testing.T) { testCodec(t, resultsSamples, DecodeResults) })
	t.Run("Names", func(t *testing.T) { testCodec(t, namesSamples, DecodeNames) })
	t.Run("RoundReply", func(t *testing.T) { testCodec(t, roundReplySamples, DecodeRoundReply) })
	t.Run("Fetch", func(t *testing.T) { testCodec(t, fetchSamples, decodeFetch) })
	t.Run("Window", func(t *testing.T) { testCodec(t, windowSamples, DecodeWindow) })
	t.Run("PeerWindow", func(t *testing.T) { testCodec(t, peerWindowSamples, DecodePeerWindow) })
	t.Run("PeerNodes", func(t *testing.T) { testCodec(t, peerNodesSamples, DecodePeerNodes) })
	t.Run("Barrier", func(t *testing.T) { testCodec(t, barrierSamples, DecodeBarrier) })
	t.Run("ReadRange", func(t *testing.T) { testCodec(t, readRangeSamples, DecodeReadRange) })
	t.Run("FetchRange", func(t *testing.T) { testCodec(t, fetchRangeSamples, DecodeFetchRange) })
	t.Run("PeerOffsets", func(t *testing.T) { testCodec(t, peerOffsetsSamples, DecodePeerOffsets) })
	t.Run("Offsets", func(t *testing.T) { testCodec(t, offsetsSamples, DecodeOffsets) })
}

// TestWindowCheck: a window whose shards a reader could not search is
// refused when decoded.
func TestWindowCheck(t *testing.T) {
	for _, w := range []Window{
		{RowBytes: 0},
		{RowBytes: 8, Shards: []WindowShard{{First: -1, Rows: 1}}},
		{RowBytes: 8, Shards: []WindowShard{{First: 0, Rows: 0}}},
		{RowBytes: 8, Shards: []WindowShard{{First: 4, Rows: 2}, {First: 5, Rows: 1}}},
		{RowBytes: 8, Shards: []WindowShard{{First: 1, Rows: math.MaxInt64}}},
	} {
		if _, err := DecodeWindow(encodeMsg(w)); !errors.Is(err, base.ErrProtocol) {
			t.Errorf("%+v: err = %v, want ErrProtocol", w, err)
		}
	}
	b := encodeMsg(Window{RowBytes: 8})
	b = append(b[:len(b)-4], 0xff, 0xff, 0xff, 0x0f) // a count far beyond the bytes
	if _, err := DecodeWindow(b); !errors.Is(err, base.ErrProtocol) {
		t.Errorf("huge count: err = %v, want ErrProtocol", err)
	}
}

// TestMessageBytes pins the byte layout of a few messages: it is the
// protocol, shared with the Python client.
func TestMessageBytes(t *testing.T) {
	for _, c := range []struct {
		name string
		got  []byte
		want []byte
	}{
		{"HelloReply", encodeMsg(HelloReply{Node: "ab", AgentPid: 0x0102}),
			[]byte{2, 0, 'a', 'b', 2, 1, 0, 0, 0, 0, 0, 0}},
		{"Region", encodeMsg(Region{ID: 0x01020304, Size: -1}),
			[]byte{4, 3, 2, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
		{"Text", encodeMsg(Text{Text: "hi"}),
			[]byte{2, 0, 0, 0, 'h', 'i'}},
		{"Fetch", encodeMsg(Fetch{Name: "v", ID: 3, Globals: []int64{1, -2}}),
			[]byte{1, 0, 'v', 3, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
		{"Join", encodeMsg(Join{Node: "", Addr: "é", Namespace: "j"}),
			[]byte{0, 0, 2, 0, 0xc3, 0xa9, 1, 0, 'j', 0}},
		{"Join watching", encodeMsg(Join{Node: "n", Namespace: "j", Watch: true}),
			[]byte{1, 0, 'n', 0, 0, 1, 0, 'j', 1}},
		{"Table", encodeMsg(Table{Name: "t", Disp: 1, ItemSize: 2, ShardRows: []int64{3}, RankNode: []int64{0}, Nodes: []string{"n"}, Addrs: []string{"a"}}),
			[]byte{
				1, 0, 't',
				1, 0, 0, 0, 0, 0, 0, 0,
				2, 0, 0, 0, 0, 0, 0, 0,
				1, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0,
				1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
				1, 0, 0, 0, 1, 0, 'n',
				1, 0, 0, 0, 1, 0, 'a',
				0, 0, 0, 0,
				0, 0,
				0, 0, 0, 0, 0, 0, 0, 0,
				0, 0, 0, 0,
				0, 0, 0, 0, 0, 0, 0, 0,
				0,
				0, 0, 0, 0,
				0, 0, 0, 0,
				0, 0, 0, 0,
			}},
		{"PeerOffsets", encodeMsg(PeerOffsets{Name: "v", ID: 2, Rank: 1, First: 3, Count: 4}),
			[]byte{1, 0, 'v', 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0}},
		{"Offsets", encodeMsg(Offsets{Offsets: []int64{0, 5}}),
			[]byte{2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0}},
	} {
		if !bytes.Equal(c.got, c.want) {
			t.Errorf("%s encodes as\n% x\nwant\n% x", c.name, c.got, c.want)
		}
	}
}

func TestTableCheck(t *testing.T) {
	valid := Table{
		Name: "v", ShardRows: []int64{1, 2}, RankNode: []int64{0, 1},
		Nodes: []string{"a", "b"}, Addrs: []string{"x", "y"}, Paths: []string{"p", ""},
	}
	mod := func(f func(m *Table)) Table {
		m := valid
		m.ShardRows = append([]int64(nil), valid.ShardRows...)
		m.RankNode = append([]int64(nil), valid.RankNode...)
		m.Nodes = append([]string(nil), valid.Nodes...)
		m.Addrs = append([]string(nil), valid.Addrs...)
		m.Paths = append([]string(nil), valid.Paths...)
		f(&m)
		return m
	}
	if err := valid.Check(); err != nil {
		t.Fatalf("valid table: %v", err)
	}
	if m := mod(func(m *Table) { m.Paths = nil }); m.Check() != nil {
		t.Fatalf("table without paths: %v", m.Check())
	}
	for _, c := range []struct {
		name string
		m    Table
		want string
	}{
		{"fewer rank nodes", mod(func(m *Table) { m.RankNode = m.RankNode[:1] }), "2 shards, 1 rank nodes"},
		{"more rank nodes", mod(func(m *Table) { m.RankNode = append(m.RankNode, 0) }), "2 shards, 3 rank nodes"},
		{"no rank nodes", mod(func(m *Table) { m.RankNode = nil }), "2 shards, 0 rank nodes"},
		{"fewer paths", mod(func(m *Table) { m.Paths = m.Paths[:1] }), "1 paths"},
		{"more paths", mod(func(m *Table) { m.Paths = append(m.Paths, "") }), "3 paths"},
		{"fewer addresses", mod(func(m *Table) { m.Addrs = m.Addrs[:1] }), "2 nodes, 1 addresses"},
		{"negative shard", mod(func(m *Table) { m.ShardRows[0] = -1 }), "a shard of -1 rows"},
		{"total without backing", mod(func(m *Table) { m.Total = 5 }), "5 rows in all, 3 in shards"},
		{"total below shards", mod(func(m *Table) { m.Backing, m.Total = "f.npy", 2 }), "2 rows in all, 3 in shards"},
		{"more addresses", mod(func(m *Table) { m.Addrs = append(m.Addrs, "z") }), "2 nodes, 3 addresses"},
		{"fewer nodes", mod(func(m *Table) { m.Nodes = m.Nodes[:1] }), "1 nodes, 2 addresses"},
		{"negative node", mod(func(m *Table) { m.RankNode[1] = -1 }), "rank 1 on node -1 of 2"},
		{"node == len(Nodes)", mod(func(m *Table) { m.RankNode[0] = 2 }), "rank 0 on node 2 of 2"},
		{"huge node", mod(func(m *Table) { m.RankNode[1] = math.MaxInt64 }), fmt.Sprintf("rank 1 on node %d of 2", int64(math.MaxInt64))},
		{"min node", mod(func(m *Table) { m.RankNode[0] = math.MinInt64 }), fmt.Sprintf("rank 0 on node %d of 2", int64(math.MinInt64))},
		{"ranks without nodes", Table{Name: "v", ShardRows: []int64{1}, RankNode: []int64{0}}, "rank 0 on node 0 of 0"},
		{"unknown kind", mod(func(m *Table) { m.Kind = 2 }), "kind 2"},
		{"fixed rows with items", mod(func(m *Table) { m.ShardItems = []int64{1, 2} }), "fixed rows with 2 shard item counts"},
		{"fixed rows with an index", mod(func(m *Table) { m.Index = "/dev/shm/i" }), "index"},
		{"ragged without items", mod(func(m *Table) { m.Kind, m.Disp = KindRagged, 1 }), "ragged rows with 0 shard item counts for 2 shards"},
		{"ragged with negative items", mod(func(m *Table) { m.Kind, m.Disp, m.ShardItems = KindRagged, 1, []int64{1, -3} }), "rank 1 holds -3 items"},
		{"ragged with one backing file, not a pair", mod(func(m *Table) {
			m.Kind, m.Disp, m.ShardItems, m.Backing, m.Total = KindRagged, 1, []int64{1, 3}, "f.npy", 3
		}), "backing"},
		{"ragged shape and disp differ", mod(func(m *Table) { m.Kind, m.Disp, m.ShardItems, m.Shape = KindRagged, 4, []int64{1, 3}, []int64{2, 3} }), "trailing shape [2 3] of 6 items per unit, disp 4"},
		{"ragged shape of zero", mod(func(m *Table) { m.Kind, m.Disp, m.ShardItems, m.Shape = KindRagged, 0, []int64{1, 3}, []int64{0} }), "trailing shape [0]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			check := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, base.ErrProtocol) {
					t.Fatalf("%s = %v, want ErrProtocol", what, err)
				}
				if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), `"v"`) {
					t.Fatalf("%s error %q does not say %q and name the table", what, err, c.want)
				}
			}
			check("Check", c.m.Check())
			// Encode does not check; the decoder must.
			_, err := DecodeTable(encodeMsg(c.m))
			check("DecodeTable", err)
		})
	}
}

func TestDecodeReadMismatch(t *testing.T) {
	for _, c := range []struct {
		g, o []int64
		want string
	}{
		{[]int64{1, 2}, []int64{0}, "2 indices but 1 offsets"},
		{[]int64{1}, nil, "1 indices but 0 offsets"},
		{nil, []int64{1, 2, 3}, "0 indices but 3 offsets"},
	} {
		b := encodeMsg(Read{Name: "v", Globals: c.g, Offsets: c.o})
		var m Read
		err := DecodeRead(b, &m)
		if !errors.Is(err, base.ErrProtocol) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), `"v"`) {
			t.Errorf("DecodeRead(%v, %v) = %v, want ErrProtocol saying %q", c.g, c.o, err, c.want)
		}
	}
}

func TestDecodeReadReuse(t *testing.T) {
	want := Read{Name: "v", Region: 3, Globals: []int64{7, 8, 9}, Offsets: []int64{0, 16, 32}}
	b := encodeMsg(want)

	t.Run("capacity suffices", func(t *testing.T) {
		g := []int64{-1, -1, -1, -1, -1} // longer than needed, junk inside
		o := make([]int64, 0, 3)         // exactly the capacity needed
		m := Read{Name: "old", Region: 99, Globals: g, Offsets: o}
		if err := DecodeRead(b, &m); err != nil {
			t.Fatal(err)
		}
		if !msgEqual(m, want) {
			t.Fatalf("decoded %+v, want %+v", m, want)
		}
		if dataPtr(m.Globals) != dataPtr(g) || dataPtr(m.Offsets) != dataPtr(o) {
			t.Fatalf("DecodeRead did not reuse the slices it was given")
		}
	})

	t.Run("capacity short", func(t *testing.T) {
		g, o := make([]int64, 0, 2), make([]int64, 1)
		m := Read{Globals: g, Offsets: o}
		if err := DecodeRead(b, &m); err != nil {
			t.Fatal(err)
		}
		if !msgEqual(m, want) {
			t.Fatalf("decoded %+v, want %+v", m, want)
		}
	})

	t.Run("repeated", func(t *testing.T) {
		var m Read
		big := encodeMsg(Read{Globals: seq(100), Offsets: seq(100)})
		if err := DecodeRead(big, &m); err != nil {
			t.Fatal(err)
		}
		pg, po := dataPtr(m.Globals), dataPtr(m.Offsets)
		for _, enc := range [][]byte{b, encodeMsg(Read{}), big} {
			if err := DecodeRead(enc, &m); err != nil {
				t.Fatal(err)
			}
			if len(m.Globals) > 0 && (dataPtr(m.Globals) != pg || dataPtr(m.Offsets) != po) {
				t.Fatalf("repeated DecodeRead allocated new slices")
			}
		}
		if !msgEqual(m, Read{Globals: seq(100), Offsets: seq(100)}) {
			t.Fatalf("final decode wrong")
		}
	})

	t.Run("empty lists keep storage", func(t *testing.T) {
		g, o := make([]int64, 4), make([]int64, 4)
		m := Read{Globals: g, Offsets: o}
		if err := DecodeRead(encodeMsg(Read{Name: "e"}), &m); err != nil {
			t.Fatal(err)
		}
		if len(m.Globals) != 0 || len(m.Offsets) != 0 {
			t.Fatalf("empty read decoded to %d globals, %d offsets", len(m.Globals), len(m.Offsets))
		}
		if cap(m.Globals) != 4 || cap(m.Offsets) != 4 {
			t.Fatalf("empty read dropped the storage (caps %d, %d)", cap(m.Globals), cap(m.Offsets))
		}
	})
}

func TestDecodeFetchReuse(t *testing.T) {
	want := Fetch{Name: "v", Globals: []int64{4, 5, 6, 7}}
	b := encodeMsg(want)

	g := make([]int64, 1, 8)
	m := Fetch{Name: "old", Globals: g}
	if err := DecodeFetch(b, &m); err != nil {
		t.Fatal(err)
	}
	if !msgEqual(m, want) {
		t.Fatalf("decoded %+v, want %+v", m, want)
	}
	if dataPtr(m.Globals) != dataPtr(g) {
		t.Fatalf("DecodeFetch did not reuse the slice it was given")
	}

	small := make([]int64, 0, 3)
	m = Fetch{Globals: small}
	if err := DecodeFetch(b, &m); err != nil {
		t.Fatal(err)
	}
	if !msgEqual(m, want) {
		t.Fatalf("decoded %+v into a short slice, want %+v", m, want)
	}
	if &small[:1][0] == &m.Globals[0] {
		t.Fatalf("DecodeFetch wrote past the capacity it was given")
	}
}

// A list count far beyond the bytes present must fail before allocating
// for it.
func TestDecodeHugeCounts(t *testing.T) {
	var e Encoder
	e.String("v")
	e.U32(math.MaxUint32) // Globals count
	b := e.Bytes()
	var m Fetch
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 10 {
		if err := DecodeFetch(b, &m); !errors.Is(err, base.ErrProtocol) {
			t.Fatalf("huge list count: %v", err)
		}
	}
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Errorf("huge list count: %d bytes allocated", n)
	}

	e = Encoder{}
	e.String("t")
	e.I64(0)
	e.I64(0)
	e.I64s(nil)
	e.I64s(nil)
	e.U32(math.MaxUint32) // Nodes count
	if _, err := DecodeTable(e.Bytes()); !errors.Is(err, base.ErrProtocol) {
		t.Fatalf("huge names count: %v", err)
	}
}

// TestShardWhy: a failed shard carries its agent's reason as an optional
// last field; a shard that did not fail encodes as it did without one.
func TestShardWhy(t *testing.T) {
	sh := Shard{Name: "big", Rank: 1, Size: 2, Rows: 10, Disp: 4, ItemSize: 4}
	plain := encodeMsg[Shard, *Shard](sh)
	ok := sh
	ok.Why = "ignored: not failed"
	if got := encodeMsg[Shard, *Shard](ok); !bytes.Equal(got, plain) {
		t.Fatalf("a shard that did not fail encodes its reason: %d bytes, want %d", len(got), len(plain))
	}
	failed := sh
	failed.Failed, failed.Why = true, "no room in /dev/shm"
	got, err := DecodeShard(encodeMsg[Shard, *Shard](failed))
	if err != nil || got.Why != failed.Why || !got.Failed {
		t.Fatalf("DecodeShard = %+v, %v; want the reason %q back", got, err, failed.Why)
	}
	lost := failed
	lost.Lost = true
	if got, err := DecodeShard(encodeMsg[Shard, *Shard](lost)); err != nil || !got.Failed || !got.Lost || got.Why != failed.Why {
		t.Fatalf("DecodeShard of a lost shard = %+v, %v; want it failed and lost, with its reason", got, err)
	}
	if got, err := DecodeShard(encodeMsg[Shard, *Shard](failed)); err != nil || got.Lost {
		t.Fatalf("DecodeShard of a failed shard = %+v, %v; want it not lost", got, err)
	}
	b := encodeMsg[Shard, *Shard](sh)
	flag := 2 + len(sh.Name) + 2 + len(sh.Node) + 7*8 // after the name, the node and 7 i64
	b[flag] = 2
	if got, err := DecodeShard(b); err != nil || !got.Lost {
		t.Fatalf("failed flag 2: %+v, %v; want a lost shard", got, err)
	}
	b[flag] = 3
	if _, err := DecodeShard(b); !errors.Is(err, base.ErrProtocol) {
		t.Fatalf("failed flag 3: err = %v, want ErrProtocol", err)
	}
	failed.Why = strings.Repeat("x", MaxWhy+100)
	if got, err := DecodeShard(encodeMsg[Shard, *Shard](failed)); err != nil || len(got.Why) != MaxWhy {
		t.Fatalf("a long reason decodes as %d bytes, %v: want it cut to %d", len(got.Why), err, MaxWhy)
	}
	e := Encoder{}
	failed.Why = ""
	failed.Encode(&e)
	e.String32(strings.Repeat("y", MaxWhy+1))
	if _, err := DecodeShard(e.b); !errors.Is(err, base.ErrProtocol) {
		t.Fatalf("a reason over %d bytes: err = %v, want ErrProtocol", MaxWhy, err)
	}
}

// A Join's watch flag is 0 or 1; any other value is refused.
func TestJoinWatchFlag(t *testing.T) {
	b := encodeMsg[Join, *Join](Join{Node: "n", Addr: "a:1", Namespace: "j", Watch: true})
	if got, err := DecodeJoin(b); err != nil || !got.Watch {
		t.Fatalf("DecodeJoin of a watching join = %+v, %v", got, err)
	}
	b[len(b)-1] = 2
	if _, err := DecodeJoin(b); !errors.Is(err, base.ErrProtocol) || !strings.Contains(err.Error(), "watch flag 2") {
		t.Fatalf("watch flag 2: err = %v, want ErrProtocol naming it", err)
	}
}

// TestDecodeRoundRefuses: a Round whose flags promise what does not
// follow, or follows empty, is a protocol error naming it.
func TestDecodeRoundRefuses(t *testing.T) {
	sh := Shard{Name: "features", Node: "n2", Rank: 6, Size: 8, Rows: 10, Disp: 3, ItemSize: 4}
	for _, c := range []struct {
		name string
		make func(e *Encoder)
		want string
	}{
		{"want out of range", func(e *Encoder) { e.U8(RoundTable + 1); sh.Encode(e) }, "wants 2"},
		{"no other shards", func(e *Encoder) { e.U8(RoundTable | roundOthers); sh.Encode(e); e.U32(0) }, "0 other shards"},
		{"an empty sending node", func(e *Encoder) { e.U8(RoundTable | roundFrom); sh.Encode(e); e.String("") }, "empty sending node"},
		{"a sending node missing", func(e *Encoder) { e.U8(RoundTable | roundFrom); sh.Encode(e) }, "truncated"},
	} {
		var e Encoder
		c.make(&e)
		_, err := DecodeRound(e.Bytes())
		if !errors.Is(err, base.ErrProtocol) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want ErrProtocol saying %q", c.name, err, c.want)
		}
	}
}
