package agent

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ddstore-go/ddstore/internal/testutil"
)

// TestManifestSavesBatched: saves asked for while one is being written are
// served by one more save, not one each (a round's ranks all ask at once;
// the coordinator's are every rank of the job), and each caller returns
// only once a save that started after it asked is on disk.
func TestManifestSavesBatched(t *testing.T) {
	a := startAgent(t, Config{})
	base := a.saves.written.Load()
	a.saves.mu.Lock()
	asked := a.saves.asked
	a.saves.mu.Unlock()
	// Hold the manifest's lock so that the first save blocks in its write
	// while the others ask.
	a.manifestMu.Lock()
	const n = 64
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.saveManifest()
		}()
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		a.saves.mu.Lock()
		defer a.saves.mu.Unlock()
		if got := a.saves.asked - asked; got < n {
			return fmt.Errorf("%d saves asked for, want %d", got, n)
		}
		return nil
	})
	a.manifestMu.Unlock()
	wg.Wait()
	if got := a.saves.written.Load() - base; got != 2 {
		t.Errorf("%d saves asked for at once wrote the manifest %d times, want 2 (the one running, then one for the rest)", n, got)
	}
	if _, err := os.Stat(a.manifestPath()); err != nil {
		t.Errorf("no manifest after the saves: %v", err)
	}
	// A save asked for alone writes at once.
	a.saveManifest()
	if got := a.saves.written.Load() - base; got != 3 {
		t.Errorf("manifest written %d times after one more save, want 3", got)
	}
}
