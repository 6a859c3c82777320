package agent

import "testing"

// Info reports the directory an agent meets its job in, so that a client
// asked to meet in another one can tell the agent it found will not.
func TestInfoReportsTheHandshakeDir(t *testing.T) {
	hs := privateTempDir(t)
	a := startAgent(t, Config{HandshakeDir: hs})
	if got := a.info().HandshakeDir; got != hs {
		t.Fatalf("Info handshake_dir = %q, want %q", got, hs)
	}
	if got := startAgent(t, Config{}).info().HandshakeDir; got != "" {
		t.Fatalf("a single-node agent's Info handshake_dir = %q, want none", got)
	}
}
