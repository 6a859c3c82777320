package naming

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ddstore-go/ddstore/internal/base"
)

func TestSocketPath(t *testing.T) {
	run := "/tmp/ddstore-1000"
	long := strings.Repeat("L", 300)
	cases := [][2]string{
		{"ns", "node"},
		{"ns.x", "node"},
		{"ns", "x.node"},
		{"ns/x", "node"},
		{"a.b", "c"},
		{"a", "b.c"},
		{long, "node"},
		{long, "node2"},
		{"ns", long},
		{long + "x", "node"},
		{strings.Repeat("é", 100), strings.Repeat("/", 100)},
	}
	seen := map[string][2]string{}
	for _, c := range cases {
		p := SocketPath(run, c[0], c[1])
		if len(p) > 107 {
			t.Errorf("SocketPath(%.20q, %.20q) = %s: %d bytes, want <= 107", c[0], c[1], p, len(p))
		}
		if filepath.Dir(p) != run || !strings.HasSuffix(p, ".sock") {
			t.Errorf("SocketPath(%.20q, %.20q) = %s: not RUN/*.sock", c[0], c[1], p)
		}
		if prev, dup := seen[p]; dup {
			t.Errorf("SocketPath gives %s for both %.20q/%.20q and %.20q/%.20q", p, prev[0], prev[1], c[0], c[1])
		}
		seen[p] = c
		if p != SocketPath(run, c[0], c[1]) {
			t.Errorf("SocketPath is not stable")
		}
	}
	if got := SocketPath(run, "ns", "n1"); got != run+"/ns.n1.sock" {
		t.Errorf("short path %s", got)
	}
	if got := SocketPath(run, "ns.1", "n"); got != run+"/ns%2E1.n.sock" {
		t.Errorf("escaped path %s", got)
	}
	t.Run("names with NUL are refused", func(t *testing.T) {
		// Hashed paths join namespace and node with a NUL, so names holding
		// one must never reach SocketPath: Start and Open refuse them.
		for _, name := range []string{"a\x00b", "", strings.Repeat("n", 256)} {
			if err := CheckName("node", name); !errors.Is(err, base.ErrArgument) {
				t.Errorf("CheckName(%q) = %v, want ErrArgument", name, err)
			}
		}
	})
}

func TestDefaultRunDir(t *testing.T) {
	t.Setenv("DDSTORE_RUN_DIR", "/some/where")
	if d := DefaultRunDir(); d != "/some/where" {
		t.Errorf("DefaultRunDir with DDSTORE_RUN_DIR = %s", d)
	}
	t.Setenv("DDSTORE_RUN_DIR", "")
	if d := DefaultRunDir(); d != filepath.Join(os.TempDir(), fmt.Sprintf("ddstore-%d", os.Geteuid())) {
		t.Errorf("DefaultRunDir = %s", d)
	}
}

func TestCheckVariable(t *testing.T) {
	for _, name := range []string{"v", strings.Repeat("n", MaxVariableName)} {
		if err := CheckVariable(name); err != nil {
			t.Errorf("CheckVariable of %d bytes: %v", len(name), err)
		}
	}
	for _, name := range []string{"", strings.Repeat("n", MaxVariableName+1)} {
		if err := CheckVariable(name); !errors.Is(err, base.ErrArgument) {
			t.Errorf("CheckVariable of %d bytes: %v, want ErrArgument", len(name), err)
		}
	}
}
