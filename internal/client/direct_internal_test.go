package client

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
)

// TestDirectPieces: the rule that cuts a direct read into pieces, one per
// split bytes, at most maxPieces and never more than rows, uncut while
// another read of the same owner is in flight, and never cut when split
// is 0.
func TestDirectPieces(t *testing.T) {
	const split = 512 << 10
	for _, tc := range []struct {
		name  string
		split int64
		busy  int
		rows  int
		size  int64
		want  int
	}{
		{"small", split, 0, 1, 64, 1},
		{"under two pieces", split, 0, 255, 2*split - 1, 1},
		{"two pieces", split, 0, 256, 2 * split, 2},
		{"three", split, 0, 768, 3*split + split/2, 3},
		{"capped", split, 0, 4096, 64 * split, maxPieces},
		{"fewer rows than pieces", split, 0, 3, 64 * split, 3},
		{"another read in flight", split, 1, 4096, 64 * split, 1},
		{"never cut", 0, 0, 4096, 64 * split, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &directPool{split: tc.split}
			if tc.busy > 0 {
				p.busy = map[string]int{"a:1": tc.busy}
			}
			if got := p.pieces("a:1", tc.rows, tc.size); got != tc.want {
				t.Fatalf("pieces(%d rows, %d bytes) with split %d, %d reads in flight = %d, want %d", tc.rows, tc.size, tc.split, tc.busy, got, tc.want)
			}
			// Another owner's reads in flight leave this one's rule alone.
			if tc.busy > 0 {
				if got := p.pieces("b:2", tc.rows, tc.size); got != maxPieces {
					t.Fatalf("pieces from b:2 while a:1 is busy = %d, want %d", got, maxPieces)
				}
			}
		})
	}
}

// TestDirectSplitEnv: DirectSplitEnv sets the split, and a value that is
// not a number of bytes >= 0 is refused, naming the variable and value.
func TestDirectSplitEnv(t *testing.T) {
	t.Setenv(DirectSplitEnv, "")
	if n, err := directSplit(); err != nil || n != DirectSplitBytes {
		t.Fatalf("unset: %d, %v; want %d", n, err, DirectSplitBytes)
	}
	t.Setenv(DirectSplitEnv, "0")
	if n, err := directSplit(); err != nil || n != 0 {
		t.Fatalf("0: %d, %v; want 0", n, err)
	}
	t.Setenv(DirectSplitEnv, "-5")
	if _, err := directSplit(); !errors.Is(err, base.ErrArgument) {
		t.Fatalf("-5: %v, want ErrArgument", err)
	} else if want := DirectSplitEnv + `="-5"`; !strings.Contains(err.Error(), want) {
		t.Fatalf("-5: %q does not name %s", err, want)
	}
}

// TestDirectMoved: a failed connection to an owner counts as a move of
// that owner's address only for addresses taken before the failure (so a
// refresh happens once per failure), and a dial failure both leaves the
// address alone and counts.
func TestDirectMoved(t *testing.T) {
	p := &directPool{}
	taken := time.Now().Add(-time.Second) // addresses taken before the failures below
	if p.anyMoved.Load() || p.movedSince([]string{"a:1"}, taken) {
		t.Fatal("a pool without failures says an owner moved")
	}
	p.noteMoved("a:1")
	switch {
	case !p.anyMoved.Load():
		t.Fatal("anyMoved unset after a failure")
	case !p.movedSince([]string{"", "b:2", "a:1"}, taken):
		t.Fatal("a:1 failed after its addresses were taken: not moved")
	case p.movedSince([]string{"b:2"}, taken):
		t.Fatal("b:2 moved without a failure")
	case p.movedSince([]string{"a:1"}, p.moved["a:1"]):
		t.Fatal("addresses taken at the failure still count it")
	}
	p.markBad("b:2")
	if !p.movedSince([]string{"b:2"}, taken) || !time.Now().Before(p.bad["b:2"]) {
		t.Fatalf("a dial failure: moved %v, left alone until %v", p.movedSince([]string{"b:2"}, taken), p.bad["b:2"])
	}
}
