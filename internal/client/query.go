package client

// What `ddstore info` asks an agent, on a session that holds no shard.

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// QueryAgent asks the agent at socket for its state (`ddstore info`), on a
// session of its own that holds no shard.
func QueryAgent(socket, namespace, node string) (wire.AgentInfo, error) {
	hello := wire.Hello{Namespace: namespace, Node: node, Rank: -1, LocalRank: -1, Pid: int64(os.Getpid())}
	l, _, err := dialLane(socket, &hello, 10*time.Second)
	if err != nil {
		return wire.AgentInfo{}, err
	}
	defer l.close()
	body, err := l.call(wire.OpInfo, nil, 10*time.Second)
	if err != nil {
		return wire.AgentInfo{}, err
	}
	t, err := wire.DecodeText(body)
	if err != nil {
		return wire.AgentInfo{}, err
	}
	var in wire.AgentInfo
	if err := json.Unmarshal([]byte(t.Text), &in); err != nil {
		return in, fmt.Errorf("%w: agent info: %w", base.ErrProtocol, err)
	}
	return in, nil
}
