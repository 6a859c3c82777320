package rendezvous

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

type agentRecord struct {
	Node string `json:"node"`
	Addr string `json:"addr"`
	Port int    `json:"port"`
}

func TestWriteReadRoundTrip(t *testing.T) {
	dir := t.TempDir()
	want := agentRecord{Node: "gpu01", Addr: "10.0.0.1", Port: 7070}
	if err := WriteRecord(dir, "agent-gpu01.json", want); err != nil {
		t.Fatal(err)
	}
	var got agentRecord
	if err := ReadRecord(dir, "agent-gpu01.json", &got); err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("ReadRecord = %+v, want %+v", got, want)
	}

	// A rewrite replaces the record whole.
	want.Port = 7071
	if err := WriteRecord(dir, "agent-gpu01.json", want); err != nil {
		t.Fatal(err)
	}
	got = agentRecord{}
	if err := ReadRecord(dir, "agent-gpu01.json", &got); err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("after rewrite ReadRecord = %+v, want %+v", got, want)
	}

	// No temporary files may be left behind.
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "agent-gpu01.json" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("directory holds %q, want only the record", names)
	}
}

func TestWriteRecordPermissions(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "job", "handshake")
	if err := WriteRecord(dir, "r", 1); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		want os.FileMode
	}{
		{filepath.Dir(dir), 0o700},
		{dir, 0o700},
		{filepath.Join(dir, "r"), 0o600},
	} {
		fi, err := os.Stat(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != c.want {
			t.Errorf("%s has mode %v, want %v", c.path, got, c.want)
		}
	}
}

func TestWriteRecordUnencodable(t *testing.T) {
	dir := t.TempDir()
	err := WriteRecord(dir, "r", make(chan int))
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "r")) {
		t.Fatalf("WriteRecord(chan) error = %v, want one naming the path", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("failed write left %d files", len(entries))
	}
}

func TestReadRecordAbsent(t *testing.T) {
	var v agentRecord
	err := ReadRecord(t.TempDir(), "missing", &v)
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ReadRecord error = %v, want os.ErrNotExist", err)
	}
}

func TestCorruptRecord(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(path, []byte(`{"node": "gpu01",`), 0o600); err != nil {
		t.Fatal(err)
	}
	var v agentRecord
	err := ReadRecord(dir, "bad.json", &v)
	if err == nil || errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), path) {
		t.Fatalf("ReadRecord error = %v, want a decode error naming %s", err, path)
	}

	// WaitRecord must give up on it at once, not poll until the timeout.
	err = WaitRecord(context.Background(), dir, "bad.json", time.Minute, &v)
	if err == nil || errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), path) {
		t.Fatalf("WaitRecord error = %v, want a decode error naming %s", err, path)
	}
}

func TestWaitRecordAppears(t *testing.T) {
	// The directory itself does not exist yet: the writer creates it.
	dir := filepath.Join(t.TempDir(), "later")
	want := agentRecord{Node: "gpu02", Addr: "10.0.0.2", Port: 7070}
	werr := make(chan error, 1)
	go func() {
		// A slow peer: its record appears (and its directory) only after
		// WaitRecord has begun to poll. Not a wait for anything.
		time.Sleep(50 * time.Millisecond)
		werr <- WriteRecord(dir, "agent", want)
	}()
	var got agentRecord
	if err := WaitRecord(context.Background(), dir, "agent", 10*time.Second, &got); err != nil {
		t.Fatal(err)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("WaitRecord = %+v, want %+v", got, want)
	}
}

func TestWaitRecordAlreadyThere(t *testing.T) {
	dir := t.TempDir()
	if err := WriteRecord(dir, "r", 42); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := WaitRecord(context.Background(), dir, "r", 0, &n); err != nil || n != 42 {
		t.Fatalf("WaitRecord = %d, %v; want 42, nil", n, err)
	}
}

func TestWaitRecordTimeout(t *testing.T) {
	dir := t.TempDir()
	const timeout = 100 * time.Millisecond
	start := time.Now()
	var v agentRecord
	err := WaitRecord(context.Background(), dir, "never", timeout, &v)
	elapsed := time.Since(start)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("WaitRecord error = %v, want ErrTimeout", err)
	}
	if path := filepath.Join(dir, "never"); !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), timeout.String()) {
		t.Errorf("error %q does not name %s and %v", err, path, timeout)
	}
	if elapsed < timeout {
		t.Errorf("WaitRecord gave up after %v, before its %v timeout", elapsed, timeout)
	}
}

func TestWaitRecordCancel(t *testing.T) {
	dir := t.TempDir()
	var v agentRecord

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := WaitRecord(ctx, dir, "never", time.Minute, &v); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitRecord with a cancelled ctx: error = %v, want context.Canceled", err)
	}

	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go func() {
		// The job gives up while WaitRecord polls: a cancel that comes
		// later, not a wait for anything.
		time.Sleep(30 * time.Millisecond)
		cancel()
	}()
	err := WaitRecord(ctx, dir, "never", time.Minute, &v)
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrTimeout) {
		t.Fatalf("WaitRecord error = %v, want context.Canceled", err)
	}

	// A ctx deadline is the caller's, so it reports as the ctx's error.
	ctx, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	if err := WaitRecord(ctx, dir, "never", 0, &v); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitRecord past the ctx deadline: error = %v, want context.DeadlineExceeded", err)
	}
}

func TestWaitRecordNotAPointer(t *testing.T) {
	var v agentRecord
	for _, target := range []any{v, nil, (*agentRecord)(nil)} {
		if err := WaitRecord(context.Background(), t.TempDir(), "r", time.Minute, target); err == nil || errors.Is(err, ErrTimeout) {
			t.Errorf("WaitRecord(%T) error = %v, want an immediate error", target, err)
		}
	}
}

func TestBadNames(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"", "a/b", "/abs", "..", "a..b", "../x", ".hidden", ".", `a\b`, "a\x00b", strings.Repeat("n", maxNameLen+1)} {
		var v int
		errs := map[string]error{
			"WriteRecord":  WriteRecord(dir, name, 1),
			"ReadRecord":   ReadRecord(dir, name, &v),
			"WaitRecord":   WaitRecord(context.Background(), dir, name, time.Minute, &v),
			"RemoveRecord": RemoveRecord(dir, name),
		}
		for fn, err := range errs {
			if !errors.Is(err, ErrBadName) {
				t.Errorf("%s(%q) error = %v, want ErrBadName", fn, name, err)
				continue
			}
			if !strings.Contains(err.Error(), strconv.Quote(name)) {
				t.Errorf("%s(%q) error %q does not name the value", fn, name, err)
			}
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("bad names wrote %d files", len(entries))
	}
}

func TestRemoveRecord(t *testing.T) {
	dir := t.TempDir()
	if err := RemoveRecord(dir, "absent"); err != nil {
		t.Fatalf("RemoveRecord of an absent record: %v", err)
	}
	if err := RemoveRecord(filepath.Join(dir, "no-such-dir"), "absent"); err != nil {
		t.Fatalf("RemoveRecord in an absent directory: %v", err)
	}
	if err := WriteRecord(dir, "r", "x"); err != nil {
		t.Fatal(err)
	}
	if err := RemoveRecord(dir, "r"); err != nil {
		t.Fatal(err)
	}
	var s string
	if err := ReadRecord(dir, "r", &s); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after RemoveRecord, ReadRecord error = %v, want os.ErrNotExist", err)
	}
}
