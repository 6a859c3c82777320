package testutil

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// RegenerateVectors is the command that rewrites the test vectors the Go
// code generates for the Python client (testdata/vectors.json and
// testdata/rules.json).
const RegenerateVectors = "go test -run TestVectors . ./internal/client -args -update"

// Vectors encodes doc as the vectors file at path (indented JSON, keys
// sorted, so the file is deterministic) and, with update, writes it;
// otherwise it fails the test unless the file holds exactly those bytes,
// naming the first line that differs and pytest, the Python tests that
// check the file. A test that failed before writes nothing.
func Vectors(t *testing.T, path string, doc any, update bool, pytest string) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		t.Fatal(err)
	}
	got := buf.Bytes()
	if t.Failed() {
		t.FailNow() // never write vectors that failed their own checks
	}
	if update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s (%d bytes)", path, len(got))
		return got
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v: run `%s` to create it", err, RegenerateVectors)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is out of date (%s): run `%s` and commit the result (then run the Python tests: cd python && python3 -m pytest %s)",
			path, firstDiff(want, got), RegenerateVectors, pytest)
	}
	return got
}

// firstDiff names the first line where want and got differ.
func firstDiff(want, got []byte) string {
	wl, gl := strings.Split(string(want), "\n"), strings.Split(string(got), "\n")
	for i := 0; i < len(wl) || i < len(gl); i++ {
		var w, g string
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if w != g || i >= len(wl) || i >= len(gl) {
			return fmt.Sprintf("line %d: file has %q, the code gives %q", i+1, w, g)
		}
	}
	return "same lines"
}
