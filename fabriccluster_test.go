package ddstore_test

// The cluster tests over the libfabric transport. With
// DDSTORE_TEST_TRANSPORT=fabric (and a test binary built with -tags
// fabric), startCluster starts its agents in this process as over tcp, each
// with --transport fabric: its own endpoint of the provider DDSTORE_FABRIC
// names (tcp when unset), on loopback; the test bodies are the same, those
// of the tests named TestCluster... (cluster_test.go):
//
//	DDSTORE_TEST_TRANSPORT=fabric go test -tags fabric -run '^TestCluster' .
//
// (.ci/gotest.sh runs them so when libfabric is installed.)

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore/internal/transport"
)

func init() {
	if clusterTransport == "fabric" && os.Getenv("DDSTORE_FABRIC") == "" {
		os.Setenv("DDSTORE_FABRIC", "tcp")
	}
}

func skipUnlessFabric(t *testing.T) {
	t.Helper()
	if clusterTransport != "fabric" {
		t.Skip("DDSTORE_TEST_TRANSPORT=fabric runs it")
	}
	if !transport.FabricBuilt {
		t.Fatal("DDSTORE_TEST_TRANSPORT=fabric needs the tests built with -tags fabric")
	}
}

// TestClusterFabricOneSided: over libfabric, from 1 to 4 nodes, every rank
// reads every row, and the rows of other nodes come by RMA reads: the
// owners' agents serve none of them over TCP (served_rows stays 0).
func TestClusterFabricOneSided(t *testing.T) {
	skipUnlessFabric(t)
	testOneSided(t, false)
}

// TestClusterFabricIdleTarget is DDStore's libfabric deadlock on loopback: a read
// completes only while the target is inside libfabric, and DDStore's
// target is only there when it reads itself. Here node 1's clients publish
// and then do nothing at all while node 0 reads its rows, batch after
// batch: every read must complete, within a bounded time, because node 1's
// agent polls its own completion queue.
func TestClusterFabricIdleTarget(t *testing.T) {
	skipUnlessFabric(t)
	c := startCluster(t, []int{1, 1}, viaRendezvous)
	const rb = 1024
	c.addPattern(t, "x", []int64{64, 4096}, rb/8, 8)
	reader := c.stores[0]
	done := make(chan error, 1)
	go func() {
		dst := make([]byte, 512*rb)
		idx := make([]int64, 512)
		for round := range 50 {
			for i := range idx {
				idx[i] = 64 + (int64(i)*131+int64(round)*17)%4096 // rows of node 1 only
			}
			if err := reader.GetBatch("x", dst, idx); err != nil {
				done <- err
				return
			}
			if err := rowsOK(dst, idx, rb); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("reads of an idle node's rows did not complete within 30 s (the target made no progress)")
	}
	if read, served := agentRowCounters(t, c); read == 0 || served != 0 {
		t.Errorf("agents read %d rows of other nodes and served %d over TCP; want some and none", read, served)
	}
}

// TestFabricTransportFlag: a binary built without libfabric refuses
// --transport fabric, saying how to get one.
func TestFabricTransportFlag(t *testing.T) {
	if clusterTransport == "fabric" {
		t.Skip("the agent binary of this run has libfabric")
	}
	dir := t.TempDir()
	out, err := exec.Command(ddstoreBin, "agent", "--transport", "fabric", "--namespace", "tf", "--node", "n0",
		"--socket", filepath.Join(dir, "run", "s.sock")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "rebuild with -tags fabric") {
		t.Fatalf("agent --transport fabric without libfabric: %v\n%s", err, out)
	}
}
