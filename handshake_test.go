package ddstore_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/agent"
)

// A store asked to meet its job in a handshake directory refuses an agent of
// its namespace that runs with another directory, or with none, naming it;
// the same directory, named another way, is fine.
func TestOpenRefusesAnAgentOfAnotherHandshakeDir(t *testing.T) {
	dir := t.TempDir()
	hsA, hsB := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, tc := range []struct {
		name, agentDir string
	}{{"other dir", hsA}, {"no dir", ""}} {
		t.Run(tc.name, func(t *testing.T) {
			ns := "hscheck-" + strings.ReplaceAll(tc.name, " ", "-")
			socket := ddstore.SocketPath(filepath.Join(dir, "run"), ns, "n0")
			a, err := agent.Start(agent.Config{Namespace: ns, Node: "n0", Socket: socket, HandshakeDir: tc.agentDir})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			open := func(hs string) (*ddstore.Store, error) {
				return ddstore.Open(ddstore.Config{Namespace: ns, Rank: 0, Size: 1, Node: "n0", Socket: socket,
					NoSpawn: true, AgentArgs: []string{"--handshake-dir", hs}})
			}
			_, err = open(hsB)
			if !errors.Is(err, ddstore.ErrArgument) || !strings.Contains(err.Error(), hsB) {
				t.Fatalf("Open with handshake dir %s against an agent with %q: %v, want ErrArgument naming it", hsB, tc.agentDir, err)
			}
			if tc.agentDir == "" {
				if !strings.Contains(err.Error(), "without a handshake directory") {
					t.Fatalf("error %q does not say the agent has no directory", err)
				}
				return
			}
			if !strings.Contains(err.Error(), tc.agentDir) {
				t.Fatalf("error %q does not name the agent's directory %s", err, tc.agentDir)
			}
			s, err := open(hsA + "/./")
			if err != nil {
				t.Fatalf("Open with the agent's own directory: %v", err)
			}
			s.Close()
		})
	}
}
