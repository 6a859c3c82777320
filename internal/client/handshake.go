package client

// A store asked to meet its job in a handshake directory checks that the
// node's agent it attached to meets there: an agent already running in the
// namespace with another directory, or none, would never meet the agents the
// store means to.

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// handshakeArg is the directory of the last --handshake-dir of agent
// flags, "" for none.
func handshakeArg(args []string) string {
	hs := ""
	for k, a := range args {
		switch {
		case a == "--handshake-dir" && k+1 < len(args):
			hs = args[k+1]
		case strings.HasPrefix(a, "--handshake-dir="):
			hs = strings.TrimPrefix(a, "--handshake-dir=")
		}
	}
	return hs
}

// samePath reports whether two paths name one directory (made absolute,
// symbolic links followed where they resolve).
func samePath(a, b string) bool {
	canon := func(p string) string {
		if abs, err := filepath.Abs(p); err == nil {
			p = abs
		}
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		return filepath.Clean(p)
	}
	return canon(a) == canon(b)
}

// checkHandshake fails when the agent on ctl does not meet its job in want.
func (s *Store) checkHandshake(ctl *lane, want string) error {
	body, err := ctl.call(wire.OpInfo, nil, s.cfg.Timeout)
	if err != nil {
		return err
	}
	t, err := wire.DecodeText(body)
	if err != nil {
		return err
	}
	var in wire.AgentInfo
	if err := json.Unmarshal([]byte(t.Text), &in); err != nil {
		return fmt.Errorf("%w: agent info: %w", base.ErrProtocol, err)
	}
	if in.HandshakeDir != "" && samePath(in.HandshakeDir, want) {
		return nil
	}
	how := "without a handshake directory (it meets its job through a rendezvous address, or alone)"
	if in.HandshakeDir != "" {
		how = fmt.Sprintf("with handshake directory %q", in.HandshakeDir)
	}
	return base.Errorf(base.ErrArgument, "handshake directory %q: the agent of namespace %q on node %q (pid %d) already runs %s: it would not meet the agents of %q; give this store a namespace of its own, or open it once that agent has stopped",
		want, s.cfg.Namespace, s.id.Node, in.Pid, how, want)
}
