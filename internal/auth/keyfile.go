package auth

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/base"
)

// KeyFile is where the agent listening on socket keeps the key its clients
// prove: beside the socket, in the same private directory.
func KeyFile(socket string) string { return socket + ".key" }

// WriteKeyFile writes k to path, mode 0600, whole or not at all (a
// temporary file in the same directory, renamed over path).
func WriteKeyFile(path string, k Key) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err != nil {
		return fmt.Errorf("ddstore: write key file: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := f.Chmod(0o600); err != nil {
		return fmt.Errorf("ddstore: write key file %s: %w", path, err)
	}
	if _, err := f.WriteString(k.Hex() + "\n"); err != nil {
		return fmt.Errorf("ddstore: write key file %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("ddstore: write key file %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("ddstore: write key file %s: %w", path, err)
	}
	return nil
}

// ReadKeyFile reads the key at path. It refuses anything but a regular file
// that belongs to this user (root may read anyone's) and that no other user
// may read or write: such a key may be known to others.
func ReadKeyFile(path string) (Key, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return Key{}, base.Errorf(base.ErrAuth, "key file %s: %v", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Key{}, base.Errorf(base.ErrAuth, "key file %s: %v", path, err)
	}
	euid := os.Geteuid()
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return Key{}, base.Errorf(base.ErrAuth, "key file %s is not a regular file", path)
	case int(st.Uid) != euid && euid != 0:
		return Key{}, base.Errorf(base.ErrAuth, "key file %s belongs to uid %d, not %d", path, st.Uid, euid)
	case st.Mode&0o077 != 0:
		return Key{}, base.Errorf(base.ErrAuth, "key file %s has mode %o: want 0600 (no access for others)", path, st.Mode&0o777)
	}
	b := make([]byte, 2*KeySize+2)
	n, err := f.Read(b)
	if err != nil {
		return Key{}, base.Errorf(base.ErrAuth, "key file %s: %v", path, err)
	}
	k, err := ParseHex(string(b[:n]))
	if err != nil {
		return Key{}, fmt.Errorf("%w (key file %s)", err, path)
	}
	return k, nil
}

// ClientKey is the key a client proves to the agent at socket:
// DDSTORE_SECRET's when it is set (so that an agent of another job, or a
// stale one, is found out), else the one in the agent's key file. from says
// which, for messages.
func ClientKey(socket string) (k Key, from string, err error) {
	ks, ok, err := SecretFromEnv()
	if err != nil {
		return Key{}, SecretEnv, err
	}
	if ok {
		return ks.Client, SecretEnv, nil
	}
	path := KeyFile(socket)
	k, err = ReadKeyFile(path)
	if err != nil {
		return Key{}, path, fmt.Errorf("%w (%s is unset, so the key comes from the agent's key file)", err, SecretEnv)
	}
	return k, path, nil
}
