package shm

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// TestMarkDropped: the agent's mark reaches a read-only mapping of another
// opener at once, the mapped rows stay readable after the unlink (which is
// why the mark is needed), and the mark sits outside the checksummed
// header, so a marked segment of either version still opens.
func TestMarkDropped(t *testing.T) {
	dir := useTempDir(t)
	for _, h := range []Header{{Rank: 1, Rows: 3, Disp: 2, ItemSize: 8}, {Rank: 0, Rows: 2, Disp: 1, ItemSize: 4, Kind: KindRagged, Items: 5}} {
		path := filepath.Join(dir, h.Kind.String())
		agent, err := Create(path, h)
		if err != nil {
			t.Fatal(err)
		}
		fill(agent.Data, 7)
		client, err := Open(path, false)
		if err != nil {
			t.Fatal(err)
		}
		if agent.Dropped() || client.Dropped() {
			t.Fatalf("%s: a new segment reads dropped", h.Kind)
		}
		agent.MarkDropped()
		if !client.Dropped() {
			t.Fatalf("%s: the client's mapping does not see the mark", h.Kind)
		}
		again, err := Open(path, false)
		if err != nil {
			t.Fatalf("%s: a marked segment does not open: %v", h.Kind, err)
		}
		if !again.Dropped() || again.Header != client.Header {
			t.Fatalf("%s: reopened: dropped %v, header %+v, want %+v", h.Kind, again.Dropped(), again.Header, client.Header)
		}
		again.Close()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if w := binary.LittleEndian.Uint32(b[droppedAt:]); w != 1 {
			t.Fatalf("%s: word at %d = %d, want 1", h.Kind, droppedAt, w)
		}
		agent.Close()
		if err := Remove(path); err != nil {
			t.Fatal(err)
		}
		// The unlinked file's rows are still there for the client: only
		// the mark says they are gone.
		want := make([]byte, len(client.Data))
		fill(want, 7)
		if string(client.Data) != string(want) || !client.Dropped() {
			t.Fatalf("%s: after the unlink the client's mapping changed", h.Kind)
		}
		client.Close()
		if client.Dropped() {
			t.Fatalf("%s: a closed segment reads dropped", h.Kind)
		}
	}
}

// TestDiscard: a segment an earlier agent left is marked for whoever still
// maps it, then removed; a file that is no segment is removed all the same.
func TestDiscard(t *testing.T) {
	dir := useTempDir(t)
	path := filepath.Join(dir, "left")
	left, err := Create(path, Header{Rows: 1, Disp: 1, ItemSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer left.Close()
	if err := Discard(path); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) || !left.Dropped() {
		t.Fatalf("after Discard: stat %v, dropped %v", err, left.Dropped())
	}
	junk := filepath.Join(dir, "junk")
	if err := os.WriteFile(junk, []byte("not a segment"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Discard(junk); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(junk); !os.IsNotExist(err) {
		t.Fatalf("junk after Discard: %v", err)
	}
	if err := Discard(junk); err != nil {
		t.Fatalf("Discard of a missing file: %v", err)
	}
}
