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
	asked := a.saves.changes.Load()
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
		if got := a.saves.changes.Load() - asked; got < n {
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

// TestManifestSavesOfOneChange: saves of a change that the save being
// written already holds (a round's requests, asking once it completed)
// wait for that save and write nothing more; a save of a later change
// writes again.
func TestManifestSavesOfOneChange(t *testing.T) {
	a := startAgent(t, Config{})
	base := a.saves.written.Load()
	change := a.saves.change()
	a.manifestMu.Lock() // the first save blocks in its write
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.saveManifestOf(change)
	}()
	testutil.WaitFor(t, 10*time.Second, func() error {
		if got := a.saves.written.Load() - base; got != 1 {
			return fmt.Errorf("%d saves started, want 1", got)
		}
		return nil
	})
	const n = 64
	var waiting sync.WaitGroup
	for range n {
		wg.Add(1)
		waiting.Add(1)
		go func() {
			defer wg.Done()
			waiting.Done()
			a.saveManifestOf(change)
		}()
	}
	waiting.Wait()
	a.manifestMu.Unlock()
	wg.Wait()
	if got := a.saves.written.Load() - base; got != 1 {
		t.Errorf("%d saves of a change the running save holds wrote the manifest %d times, want 1", n+1, got)
	}
	a.saveManifestOf(change)
	if got := a.saves.written.Load() - base; got != 1 {
		t.Errorf("a save of a change on disk wrote the manifest: %d writes, want 1", got)
	}
	a.saveManifestOf(a.saves.change())
	if got := a.saves.written.Load() - base; got != 2 {
		t.Errorf("a save of a new change: %d writes, want 2", got)
	}
}
