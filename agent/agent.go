// Package agent runs a ddstore node agent inside this Go process, for Go
// programs and tests that embed one instead of running `ddstore agent`.
// The agent holds the node's shards in shared memory and serves the
// node's Stores on a Unix socket (Config.Socket) and other nodes' agents
// over TCP. Most jobs need none of this: the first rank of each node
// starts `ddstore agent` on demand. A program that imports only package
// ddstore links no agent.
package agent

import server "github.com/ddstore-go/ddstore/internal/agent"

// Config configures a node agent; see Start.
type Config = server.Config

// Agent is a node agent running inside this process.
type Agent = server.Agent

// Start runs a node agent in this process; Stores of the node attach to
// it through cfg.Socket (ddstore.SocketPath gives the default one). Close
// stops it.
func Start(cfg Config) (*Agent, error) { return server.Start(cfg) }
