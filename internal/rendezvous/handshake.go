// Handshake records: processes that share no connection yet (an agent and
// the trainer ranks of its node, or the agents of a job) publish small JSON
// records, such as an address to dial, in a directory that all of them can
// see, often on NFS or Lustre. Records appear whole or not at all, so a
// reader never has to guess whether it caught a writer halfway.

package rendezvous

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
)

// ErrTimeout is returned by WaitRecord when its own timeout passes.
var ErrTimeout = base.Alias("ddstore: rendezvous timed out", base.ErrTimeout)

// ErrBadName is returned for a record name that could escape the handshake
// directory or collide with WriteRecord's hidden temporary files.
var ErrBadName = base.Alias("ddstore: bad record name", base.ErrArgument)

// maxNameLen leaves room, within the usual 255-byte file name limit, for the
// dot and random suffix of the temporary file a record is written through.
const maxNameLen = 200

const (
	firstPoll = 2 * time.Millisecond
	maxPoll   = 100 * time.Millisecond
)

func checkName(name string) error {
	var why string
	switch {
	case name == "":
		why = "must not be empty"
	case strings.ContainsAny(name, `/\`):
		why = "must not contain a path separator"
	case strings.Contains(name, ".."):
		why = `must not contain ".."`
	case strings.HasPrefix(name, "."):
		why = `must not start with "."`
	case strings.ContainsRune(name, 0):
		why = "must not contain a NUL byte"
	case len(name) > maxNameLen:
		why = fmt.Sprintf("must be at most %d bytes", maxNameLen)
	default:
		return nil
	}
	return fmt.Errorf("%w %q: %s", ErrBadName, name, why)
}

// WriteRecord writes v as JSON to dir/name atomically: a temporary file in
// dir, fsync, rename, fsync of the directory. It creates dir with mode 0700
// if missing; the file gets mode 0600, since records may carry addresses or
// tokens meant only for the job's own user. An existing record is replaced.
func WriteRecord(dir, name string, v any) (err error) {
	if err := checkName(name); err != nil {
		return err
	}
	path := filepath.Join(dir, name)
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("ddstore: encode record %s: %w", path, err)
	}
	data = append(data, '\n')
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("ddstore: write record: %w", err)
	}
	// The temporary name starts with "." so that no valid record name can
	// match it, and readers of a half-written file are impossible.
	f, err := os.CreateTemp(dir, "."+name+".tmp")
	if err != nil {
		return fmt.Errorf("ddstore: write record %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	// CreateTemp already asks for 0600, but say it outright rather than
	// depend on that detail.
	if err := f.Chmod(0o600); err != nil {
		return fmt.Errorf("ddstore: write record %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("ddstore: write record %s: %w", path, err)
	}
	// Without the fsync a crash after the rename could leave a record that
	// exists but is empty, which readers would report as corrupt.
	if err := f.Sync(); err != nil {
		return fmt.Errorf("ddstore: write record %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("ddstore: write record %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("ddstore: write record %s: %w", path, err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("ddstore: write record %s: sync directory: %w", path, err)
	}
	return nil
}

// syncDir makes the rename durable. Some filesystems (several FUSE ones,
// some network filesystems) cannot fsync a directory at all; that is not a
// reason to fail a write that already is visible.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if errors.Is(err, syscall.EINVAL) || errors.Is(err, errors.ErrUnsupported) {
		err = nil
	}
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// ReadRecord reads dir/name into v. An absent record gives an error that
// matches os.ErrNotExist; one that is not valid JSON for v gives an error
// naming the path.
func ReadRecord(dir, name string, v any) error {
	if err := checkName(name); err != nil {
		return err
	}
	path := filepath.Join(dir, name)
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("ddstore: read record: %w", err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("ddstore: decode record %s: %w", path, err)
	}
	return nil
}

// WaitRecord polls dir/name until it exists and decodes into v, ctx ends
// (ctx's error is wrapped), or timeout passes (ErrTimeout is wrapped); a
// timeout <= 0 leaves the limit to ctx alone. A missing directory counts as
// a missing record, since the writer creates it. Any other failure, such as a
// record that is not valid JSON, is returned at once: the rename in
// WriteRecord means a reader never sees a partial file, so waiting longer
// would not fix it. A record left over from an earlier run is found at once
// too; callers that reuse a directory should RemoveRecord first.
func WaitRecord(ctx context.Context, dir, name string, timeout time.Duration, v any) error {
	if err := checkName(name); err != nil {
		return err
	}
	path := filepath.Join(dir, name)
	// Catch a non-pointer v now rather than after a possibly long wait.
	if rv := reflect.ValueOf(v); rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("ddstore: wait for record %s: want a non-nil pointer to decode into, got %T", path, v)
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	// The short first polls keep a rendezvous on one node fast; the cap
	// keeps hundreds of ranks polling a shared filesystem from loading its
	// metadata server.
	interval := firstPoll
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("ddstore: wait for record %s: %w", path, err)
		}
		err := ReadRecord(dir, name, v)
		if err == nil {
			return nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		wait := interval
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return fmt.Errorf("%w: %s did not appear within %v", ErrTimeout, path, timeout)
			}
			// The read after this sleep happens at the deadline at the
			// latest, so a record written just in time is still seen.
			wait = min(wait, left)
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("ddstore: wait for record %s: %w", path, ctx.Err())
		case <-timer.C:
		}
		interval = min(2*interval, maxPoll)
	}
}

// RemoveRecord removes dir/name; a record that is already gone is not an
// error, so that cleanup can run from several processes or twice.
func RemoveRecord(dir, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("ddstore: remove record: %w", err)
	}
	return nil
}
