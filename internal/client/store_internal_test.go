package client

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore/internal/agent"
	"github.com/ddstore-go/ddstore/internal/naming"
	"github.com/ddstore-go/ddstore/internal/testutil"
)

// TestRecvSurvivesControlRedial: receive buffers are registered on the
// control session; when that session breaks and is redialed, they are
// registered again, so reads into them keep working: whether the client
// saw its control session break, or only the agent did (it dropped the
// session, and the buffers with it, while the client's end stays open).
func TestRecvSurvivesControlRedial(t *testing.T) {
	t.Run("client side", func(t *testing.T) {
		testRecvRedial(t, func(s *Store) {
			s.ctl.conn.Close() // the control session breaks: the agent drops its regions
			s.ctl.broken = true
		})
	})
	t.Run("agent side", func(t *testing.T) {
		testRecvRedial(t, func(s *Store) {
			s.ctl.conn.CloseWrite() // the agent reads the end, drops the session; the client's lane is not marked
		})
	})
}

func testRecvRedial(t *testing.T, breakCtl func(*Store)) {
	// Agents that meet through a rendezvous address need the job's secret.
	t.Setenv("DDSTORE_SECRET", "ddstore-test-secret-0123456789abcdef")
	dir, err := os.MkdirTemp("", "ddstore-redial-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	rdv := l.Addr().String()
	l.Close()
	ns := fmt.Sprintf("redial%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-"))
	var stores [2]*Store
	for r := range 2 {
		node := fmt.Sprintf("n%d", r)
		a, err := agent.Start(agent.Config{Namespace: ns, Node: node, Rendezvous: rdv, PeerListen: "127.0.0.1:0",
			Socket: naming.SocketPath(filepath.Join(dir, "run"), ns, node), Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		s, err := Open(Config{Namespace: ns, Rank: r, Size: 2, Node: node, Socket: a.Socket(), NoSpawn: true, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		stores[r] = s
	}
	var wg sync.WaitGroup
	for r, s := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			row := []byte{byte(r), 1, 2, 3, 4, 5, 6, 7}
			if err := s.Add("v", row, 8, 1); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	s := stores[0]
	buf, err := s.AllocRecv(8)
	if err != nil {
		t.Fatal(err)
	}
	s.ctlMu.Lock()
	breakCtl(s)
	s.ctlMu.Unlock()
	// The agent has dropped the buffer before the read below names it.
	testutil.WaitFor(t, 10*time.Second, func() error {
		in, err := QueryAgent(s.socket, ns, "n0")
		if err != nil {
			return err
		}
		if in.Regions != 0 {
			return fmt.Errorf("agent still holds %d receive regions after its control session ended", in.Regions)
		}
		return nil
	})
	if _, err := s.Info("v"); err != nil { // cached: no control op yet
		t.Fatal(err)
	}
	if err := s.GetBatch("v", buf, []int64{1}); err != nil {
		t.Fatalf("read into a receive buffer after the control session was redialed: %v", err)
	}
	if buf[0] != 1 || buf[7] != 7 {
		t.Fatalf("row 1 read as %v", buf)
	}
}
