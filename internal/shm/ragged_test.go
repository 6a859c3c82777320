package shm

// The segments of a ragged variable: a shard's offsets and values, a
// node's index, their headers (version 2) and file names.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ddstore-go/ddstore/internal/base"
)

func TestRaggedSegmentRoundTrip(t *testing.T) {
	dir := useTempDir(t)
	for _, h := range []Header{
		{Rank: 1, Rows: 3, Disp: 3, ItemSize: 4, Kind: KindRagged, Items: 7},
		{Rank: 0, Rows: 0, Disp: 1, ItemSize: 8, Kind: KindRagged, Items: 0},
		{Rank: 2, Rows: 600, Disp: 1, ItemSize: 1, Kind: KindRagged, Items: 0}, // rows of no items; offsets past a page
		{Rank: -1, Rows: 5, Disp: 2, ItemSize: 2, Kind: KindIndex, Items: 9},
	} {
		path := filepath.Join(dir, fmt.Sprintf("seg.%s.%d", h.Kind, h.Rank))
		seg, err := Create(path, h)
		if err != nil {
			t.Fatalf("Create(%+v): %v", h, err)
		}
		if int64(len(seg.Offsets)) != h.Rows+1 {
			t.Fatalf("%+v: %d offsets, want %d", h, len(seg.Offsets), h.Rows+1)
		}
		// A ragged shard's values start on a page, after its offsets.
		want := h.Items * h.Disp * h.ItemSize
		if h.Kind == KindIndex {
			want = (h.Rows + 1) * 8
		}
		if int64(len(seg.Data)) != want {
			t.Fatalf("%+v: %d data bytes, want %d", h, len(seg.Data), want)
		}
		if h.Kind == KindRagged { // an index's Data is its offsets
			for i := range seg.Data {
				seg.Data[i] = byte(i*7 + 1)
			}
		}
		for i := range seg.Offsets {
			seg.Offsets[i] = min(int64(i), h.Items)
		}
		seg.Offsets[h.Rows] = h.Items
		seg.Close()
		st, err := os.Stat(path)
		if err != nil || st.Size() != HeaderBytes+DataBytes(h) {
			t.Fatalf("%+v: file of %v bytes (%v), want %d", h, st.Size(), err, HeaderBytes+DataBytes(h))
		}
		seg, err = Open(path, false)
		if err != nil {
			t.Fatalf("Open(%+v): %v", h, err)
		}
		if seg.Header != h {
			t.Fatalf("header %+v, want %+v", seg.Header, h)
		}
		if err := seg.CheckOffsets(0); err != nil {
			t.Fatalf("%+v: CheckOffsets: %v", h, err)
		}
		if h.Kind == KindRagged {
			for i := range seg.Data {
				if seg.Data[i] != byte(i*7+1) {
					t.Fatalf("%+v: value byte %d = %d", h, i, seg.Data[i])
				}
			}
		}
		seg.Close()
	}
}

func TestCheckOffsets(t *testing.T) {
	useTempDir(t)
	seg, err := Create(filepath.Join(Dir, "r"), Header{Rows: 3, Disp: 1, ItemSize: 1, Kind: KindRagged, Items: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	for _, c := range []struct {
		off  []int64
		want string
	}{
		{[]int64{0, 2, 2, 5}, ""},
		{[]int64{1, 2, 2, 5}, "offsets[0] = 1: want 0"},
		{[]int64{0, 3, 2, 5}, "offsets[2] = 2 after offsets[1] = 3"},
		{[]int64{0, 1, 2, 4}, "offsets[3] = 4: want 5"},
	} {
		copy(seg.Offsets, c.off)
		err := seg.CheckOffsets(0)
		if c.want == "" {
			if err != nil {
				t.Fatalf("%v: %v", c.off, err)
			}
			continue
		}
		if !errors.Is(err, base.ErrGeometry) || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%v: %v, want ErrGeometry saying %q", c.off, err, c.want)
		}
	}
}

func TestRaggedHeaderCorrupt(t *testing.T) {
	dir := useTempDir(t)
	path := filepath.Join(dir, "seg")
	seg, err := Create(path, Header{Rank: 2, Rows: 5, Disp: 4, ItemSize: 2, Kind: KindRagged, Items: 3})
	if err != nil {
		t.Fatal(err)
	}
	seg.Close()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// kind, items, checksum: every byte counts.
	for _, off := range []int64{12, 15, 48, 55, 56, 59} {
		one := make([]byte, 1)
		f.ReadAt(one, off)
		f.WriteAt([]byte{one[0] ^ 0x10}, off)
		if s, err := Open(path, false); !errors.Is(err, base.ErrProtocol) {
			if err == nil {
				s.Close()
			}
			t.Fatalf("Open with byte %d flipped = %v, want ErrProtocol", off, err)
		}
		f.WriteAt(one, off)
	}
}

func TestIndexPath(t *testing.T) {
	p := IndexPath("ns", "n1", "pos", "")
	if filepath.Base(p) != "ddstore.ns.n1.pos.index" {
		t.Fatalf("IndexPath = %s", p)
	}
	ns, node, hashed, ok := ParseSegmentName(filepath.Base(p))
	if !ok || hashed || ns != "ns" || node != "n1" {
		t.Fatalf("ParseSegmentName(%s) = %q %q %v %v", p, ns, node, hashed, ok)
	}
	long := IndexPath("ns", "n1", string(make([]byte, 300)), "")
	if len(filepath.Base(long)) > 255 {
		t.Fatalf("IndexPath of a long name: %d bytes", len(filepath.Base(long)))
	}
	if _, _, _, ok := ParseSegmentName(filepath.Base(long)); !ok {
		t.Fatalf("ParseSegmentName(%s) refused", long)
	}
}
