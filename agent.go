package ddstore

import "github.com/ddstore-go/ddstore/internal/agent"

// AgentConfig configures a node agent; see StartAgent.
type AgentConfig = agent.Config

// Agent is a node agent running inside this process.
type Agent = agent.Agent

// StartAgent runs a node agent in this process (Go programs and tests);
// Stores of the node attach to it through cfg.Socket. Most jobs instead let
// the first rank of each node start `ddstore agent` on demand.
func StartAgent(cfg AgentConfig) (*Agent, error) { return agent.Start(cfg) }

// SocketPath is where the agent of a namespace on a node listens, under
// runDir ("" for the default, DDSTORE_RUN_DIR or /tmp/ddstore-UID).
func SocketPath(runDir, namespace, node string) string {
	if runDir == "" {
		runDir = agent.DefaultRunDir()
	}
	return agent.SocketPath(runDir, namespace, node)
}
