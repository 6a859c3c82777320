package shm

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ddstore-go/ddstore/internal/base"
)

// TestNoSegmentOfOthers: a segment is only opened, and a segment's name
// only used, when it is this user's own regular file that no one else may
// touch; a file of another user is never adopted.
func TestNoSegmentOfOthers(t *testing.T) {
	dir := useTempDir(t)
	h := Header{Rank: 0, Rows: 2, Disp: 1, ItemSize: 8}
	mk := func(name string) string {
		p := filepath.Join(dir, name)
		seg, err := Create(p, h)
		if err != nil {
			t.Fatal(err)
		}
		seg.Close()
		return p
	}
	cases := []struct {
		name    string
		setup   func(p string) error
		root    bool // needs root (chown)
		says    string
		created string // Create's error at that path, if it is checked
	}{
		{"another user's", func(p string) error { return os.Chown(p, 65534, 65534) }, true,
			"belongs to uid 65534, not 0: another user's file, which ddstore does not adopt", "and belongs to uid 65534"},
		{"readable by others", func(p string) error { return os.Chmod(p, 0o644) }, false, "has mode 644: want 0600", ""},
		{"writable by the group", func(p string) error { return os.Chmod(p, 0o620) }, false, "has mode 620: want 0600", ""},
		{"a symlink", func(p string) error {
			target := mk("target")
			os.Remove(p)
			return os.Symlink(target, p)
		}, false, "too many levels of symbolic links", "already exists"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.root && os.Geteuid() != 0 {
				t.Skip("needs root to chown")
			}
			p := mk("seg")
			defer os.Remove(p)
			if err := c.setup(p); err != nil {
				t.Fatal(err)
			}
			for _, writable := range []bool{false, true} {
				s, err := Open(p, writable)
				if err == nil {
					s.Close()
				}
				if err == nil || !strings.Contains(err.Error(), c.says) {
					t.Fatalf("Open(writable %v) = %v, want an error saying %q", writable, err, c.says)
				}
			}
			if c.created != "" {
				_, err := Create(p, h)
				if !errors.Is(err, base.ErrExists) || !strings.Contains(err.Error(), c.created) {
					t.Fatalf("Create over it = %v, want ErrExists saying %q", err, c.created)
				}
			}
		})
	}
}
