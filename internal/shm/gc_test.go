package shm

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestUnescape(t *testing.T) {
	for _, s := range []string{"", "plain-_09AZaz", "ns.1", "node/a b", "x%y", "\x00\xff.é"} {
		got, err := Unescape(Escape(s))
		if err != nil || got != s {
			t.Errorf("Unescape(Escape(%q)) = %q, %v", s, got, err)
		}
	}
	for _, bad := range []string{"a.b", "%2", "%zz", "%2e", "%41", "a b", "%"} {
		if got, err := Unescape(bad); err == nil {
			t.Errorf("Unescape(%q) = %q, want an error", bad, got)
		}
	}
}

func TestParseSegmentName(t *testing.T) {
	long := strings.Repeat("v", 300)
	for _, c := range []struct {
		ns, node, variable string
		hashed             bool
	}{
		{"ns.1", "node/a", "x.y z", false},
		{"job-7", "n1", "h" + strings.Repeat("0", 32), false},
		{"job", "n1", long, false}, // variable hashed, namespace and node kept
		{strings.Repeat("n", 120), strings.Repeat("m", 120), long, true},
	} {
		for _, nonce := range []string{"", NewNonce()} {
			for _, p := range []string{SegmentPath(c.ns, c.node, c.variable, 12, nonce), IndexPath(c.ns, c.node, c.variable, nonce)} {
				name := filepath.Base(p)
				ns, node, hashed, ok := ParseSegmentName(name)
				if !ok || hashed != c.hashed || !hashed && (ns != c.ns || node != c.node) {
					t.Errorf("ParseSegmentName(%q) = %q, %q, %v, %v; want %q, %q, hashed %v", name, ns, node, hashed, ok, c.ns, c.node, c.hashed)
				}
			}
		}
	}
	for _, name := range []string{
		"ddstore-test.1.x", "ddstore.a.b", "ddstore.a.b.c.rx", "ddstore.a.b.c.r", "ddstore.a.b.c.d.r1",
		"ddstore.a..c.r1", "ddstore.a.b..r1", "ddstore.%zz.b.c.r1", "other.a.b.c.r1", "ddstore.hxyz.r1",
		"ddstore.h" + strings.Repeat("A", 40) + ".r1", "ddstore.a.b.c.r1.tmp",
		"ddstore.a.b.c.0123456789ABCDEF.r1", "ddstore.a.b.c.0123456789abcde.r1", "ddstore.a.0123456789abcdef.r1",
		"ddstore.a.b.c.0123456789abcdef.0123456789abcdef.r1",
	} {
		if ns, node, hashed, ok := ParseSegmentName(name); ok {
			t.Errorf("ParseSegmentName(%q) = %q, %q, %v, true; want not a segment", name, ns, node, hashed)
		}
	}
}
