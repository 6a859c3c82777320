package ddstore

import (
	"github.com/ddstore-go/ddstore/internal/client"
	"github.com/ddstore-go/ddstore/internal/naming"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// SocketPath is where the agent of a namespace on a node listens, under
// runDir ("" for the default, DDSTORE_RUN_DIR or /tmp/ddstore-UID).
func SocketPath(runDir, namespace, node string) string {
	if runDir == "" {
		runDir = naming.DefaultRunDir()
	}
	return naming.SocketPath(runDir, namespace, node)
}

// AgentInfo is what an agent reports about itself and its variables.
type AgentInfo = wire.AgentInfo

// QueryAgent asks the agent at socket for its state (`ddstore info`).
func QueryAgent(socket, namespace, node string) (AgentInfo, error) {
	return client.QueryAgent(socket, namespace, node)
}

// AgentBinary finds the ddstore binary to run as an agent: DDSTORE_BIN,
// then this executable if it is ddstore, then ddstore on PATH.
func AgentBinary() (string, error) { return client.AgentBinary() }
