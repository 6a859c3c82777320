package ddstore

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/ddstore-go/ddstore/internal/agent"
	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/naming"
	"github.com/ddstore-go/ddstore/internal/wire"
)

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
		runDir = naming.DefaultRunDir()
	}
	return naming.SocketPath(runDir, namespace, node)
}

// AgentInfo is what an agent reports about itself and its variables.
type AgentInfo = agent.Info

// QueryAgent asks the agent at socket for its state (`ddstore info`).
func QueryAgent(socket, namespace, node string) (AgentInfo, error) {
	hello := wire.Hello{Namespace: namespace, Node: node, Rank: -1, LocalRank: -1, Pid: int64(os.Getpid())}
	l, _, err := dialLane(socket, &hello, 10*time.Second)
	if err != nil {
		return AgentInfo{}, err
	}
	defer l.close()
	body, err := l.call(wire.OpInfo, nil, 10*time.Second)
	if err != nil {
		return AgentInfo{}, err
	}
	t, err := wire.DecodeText(body)
	if err != nil {
		return AgentInfo{}, err
	}
	var in AgentInfo
	if err := json.Unmarshal([]byte(t.Text), &in); err != nil {
		return in, fmt.Errorf("%w: agent info: %w", base.ErrProtocol, err)
	}
	return in, nil
}
