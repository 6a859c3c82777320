package client

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/naming"
)

// connect reaches the node's agent. When none answers, the first local rank
// starts one (`ddstore agent --daemon`, which returns once the socket
// serves) and the other ranks wait for the socket: the embedded default,
// with nothing to start by hand on one machine.
func (s *Store) connect() (*lane, error) {
	l, _, err := dialLane(s.socket, &s.hello, s.cfg.Timeout)
	if err == nil || !errors.Is(err, base.ErrNoAgent) {
		return l, err
	}
	spawned := false
	if !s.cfg.NoSpawn && s.id.LocalRank <= 0 {
		if serr := s.spawn(); serr != nil {
			return nil, serr
		}
		spawned = true
	}
	// The other ranks give local rank 0 a head start, then start the agent
	// themselves (the agent's lock keeps it one per node): local ranks
	// need not match node ids, e.g. several simulated nodes on one machine.
	grace := time.Now().Add(spawnGraceFor(s.cfg.AgentWait))
	deadline := time.Now().Add(s.cfg.AgentWait)
	wait := dialFirstWait
	for {
		l, _, err = dialLane(s.socket, &s.hello, s.cfg.Timeout)
		if err == nil || !errors.Is(err, base.ErrNoAgent) {
			return l, err
		}
		if !spawned && !s.cfg.NoSpawn && time.Now().After(grace) {
			if serr := s.spawn(); serr != nil {
				return nil, serr
			}
			spawned = true
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: no agent for namespace %q on node %q answered at %s within %v (start one with `ddstore agent`, or let local rank 0 start it): %w",
				base.ErrNoAgent, s.cfg.Namespace, s.id.Node, s.socket, s.cfg.AgentWait, err)
		}
		time.Sleep(wait)
		wait = nextDialWait(wait)
	}
}

// spawnGrace is how long ranks other than local rank 0 wait for its agent
// before starting one themselves.
const spawnGrace = 3 * time.Second

// spawnGraceFor is the head start of local rank 0 when the ranks wait
// agentWait in all: spawnGrace, or half the wait when that is shorter.
func spawnGraceFor(agentWait time.Duration) time.Duration { return min(spawnGrace, agentWait/2) }

// A rank dials the agent's socket again after dialFirstWait, then after
// twice as long each time, up to dialMaxWait: quick when the agent is a
// moment away, light on the machine when it is not.
const (
	dialFirstWait = 2 * time.Millisecond
	dialMaxWait   = 100 * time.Millisecond
)

// nextDialWait is the pause after one of wait.
func nextDialWait(wait time.Duration) time.Duration { return min(2*wait, dialMaxWait) }

// spawnArgs are the arguments of the `ddstore agent` a rank starts; the
// Python client starts the same one (python/ddstore/_agent.py).
func spawnArgs(namespace, node, socket string, extra []string) []string {
	args := []string{"agent", "--daemon", "--namespace", namespace, "--node", node,
		"--socket", socket, "--idle-exit", "30s"}
	return append(args, extra...)
}

// AgentBinary finds the ddstore binary to run as an agent: DDSTORE_BIN,
// then this executable if it is ddstore, then ddstore on PATH.
func AgentBinary() (string, error) {
	if b := os.Getenv("DDSTORE_BIN"); b != "" {
		return b, nil
	}
	if exe, err := os.Executable(); err == nil && filepath.Base(exe) == "ddstore" {
		return exe, nil
	}
	if p, err := exec.LookPath("ddstore"); err == nil {
		return p, nil
	}
	return "", base.Errorf(base.ErrNoAgent, "no ddstore binary to start an agent with: set DDSTORE_BIN or put ddstore on PATH")
}

func (s *Store) spawn() error {
	bin := s.cfg.AgentBinary
	if bin == "" {
		var err error
		if bin, err = AgentBinary(); err != nil {
			return err
		}
	}
	args := spawnArgs(s.cfg.Namespace, s.id.Node, s.socket, s.cfg.AgentArgs)
	cmd := exec.Command(bin, args...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == naming.ExitAgentRuns {
		return nil // another rank won the race: its agent serves us
	}
	if err != nil {
		return fmt.Errorf("%w: starting `%s %s`: %w: %s", base.ErrNoAgent, bin, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
