package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/coord"
	"github.com/ddstore-go/ddstore/internal/shm"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// Restart and persistence. An agent keeps a manifest next to its socket
// (SOCKET.manifest.json, 0600 in the 0700 run directory): the published
// variables it holds shards of, with their tables and segment files, and,
// on the coordinator, every table of the job. An agent that starts where a
// manifest is left — its predecessor was killed, or stopped with --persist
// — re-adopts the segments the manifest names (each one's header checked
// against its table) instead of having the data loaded again: its clients
// reconnect by themselves and read on, and other nodes learn its new
// address from the coordinator when a read of its rows fails.

// manifestVersion changes when the manifest's layout does.
const manifestVersion = 1

type manifest struct {
	Version     int           `json:"version"`
	Namespace   string        `json:"namespace"`
	Node        string        `json:"node"`
	Vars        []manifestVar `json:"vars"`
	Coordinator *coord.State  `json:"coordinator,omitempty"`
}

type manifestVar struct {
	Table    *wire.Table    `json:"table"`
	Segments map[int]string `json:"segments"` // local rank → segment file
	// Index is the node's index of a ragged variable, "" if not built.
	Index string `json:"index,omitempty"`
}

func (a *Agent) manifestPath() string { return a.cfg.Socket + ".manifest.json" }

// manifestSaves batches saves of the manifest. Each change of what it
// holds that a save must cover has a number (change), taken after the
// change is made; a save reads the last number before it reads the state,
// so its snapshot holds every change numbered up to it. A round's ranks all
// ask for a save of the round's change as it ends (the coordinator once per
// node of the job, and its own node's ranks), and the first save serves
// them all: one write per round, not one per rank nor a second one for the
// requests that came while the first was written. mu is a leaf (never held
// while another lock is taken; lock order: internal/LOCKS.md).
type manifestSaves struct {
	mu      sync.Mutex
	cond    sync.Cond     // on mu: a save ended
	changes atomic.Uint64 // the last change's number
	done    uint64        // the manifest on disk holds the changes up to done
	running bool          // a save is being written
	// written counts the manifests written (tests, ddstore info).
	written atomic.Int64
}

// change numbers a change of what the manifest holds, made before the
// call (saveManifestOf).
func (s *manifestSaves) change() uint64 { return s.changes.Add(1) }

// saveManifest returns once the manifest on disk holds what the agent held
// when it was called: the caller's change is numbered now.
func (a *Agent) saveManifest() { a.saveManifestOf(a.saves.change()) }

// saveManifestOf returns once the manifest on disk holds change n (and
// every change numbered before it). Callers hold no lock of the agent's.
// Whoever finds no save running and n not on disk writes one, which covers
// every change numbered before it started; the others wait for it, and
// return if it covered theirs.
func (a *Agent) saveManifestOf(n uint64) {
	s := &a.saves
	s.mu.Lock()
	if s.cond.L == nil {
		s.cond.L = &s.mu
	}
	for s.done < n {
		if s.running {
			s.cond.Wait()
			continue
		}
		s.running = true
		upTo := s.changes.Load() // before the state is read
		s.mu.Unlock()
		a.writeManifest()
		s.mu.Lock()
		s.running = false
		s.done = max(s.done, upTo)
		s.cond.Broadcast()
	}
	s.mu.Unlock()
}

// writeManifest writes the manifest of what the agent holds now. The state
// is read and written under manifestMu, so that of two saves at once the
// later state is the one left on disk, never an earlier snapshot written
// last.
func (a *Agent) writeManifest() {
	a.saves.written.Add(1)
	a.manifestMu.Lock()
	defer a.manifestMu.Unlock()
	m := manifest{Version: manifestVersion, Namespace: a.cfg.Namespace, Node: a.cfg.Node}
	a.mu.Lock()
	vars := make([]*variable, 0, len(a.mu.vars))
	for _, v := range a.mu.vars {
		vars = append(vars, v)
	}
	a.mu.Unlock()
	for _, v := range vars {
		v.mu.RLock()
		if v.table != nil && !v.gone && len(v.segs) > 0 {
			mv := manifestVar{Table: v.table, Segments: make(map[int]string, len(v.segs))}
			for r, seg := range v.segs {
				mv.Segments[r] = seg.Path
			}
			if v.index != nil {
				mv.Index = v.index.Path
			}
			m.Vars = append(m.Vars, mv)
		}
		v.mu.RUnlock()
	}
	slices.SortFunc(m.Vars, func(x, y manifestVar) int { return int(x.Table.ID - y.Table.ID) })
	if c := a.coord.Load(); c != nil {
		m.Coordinator = c.snapshot()
	}
	b, err := json.Marshal(m)
	if err == nil {
		err = writeFileAtomic(a.manifestPath(), b)
	}
	if err != nil {
		a.log.Warn("could not write the manifest; a restarted agent will not re-adopt the segments", "err", err)
	}
}

// writeFileAtomic writes path through a temporary file and a rename, mode
// 0600, so a reader never sees half of it.
func writeFileAtomic(path string, b []byte) error {
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// adopt re-adopts what the manifest a previous agent left names, before the
// agent serves anyone. A variable whose segments are missing or do not
// match its table is left out (its files stay for `ddstore gc`); the
// coordinator's part is kept for when this agent becomes coordinator. It
// reports whether a manifest was there at all — this agent is then a
// restart, whether or not anything could be re-adopted.
func (a *Agent) adopt() (restart bool) {
	b, err := os.ReadFile(a.manifestPath())
	if errors.Is(err, os.ErrNotExist) {
		return false
	}
	var m manifest
	if err == nil {
		err = json.Unmarshal(b, &m)
	}
	if err == nil && (m.Version != manifestVersion || m.Namespace != a.cfg.Namespace || m.Node != a.cfg.Node) {
		err = fmt.Errorf("manifest of version %d, namespace %q, node %q", m.Version, m.Namespace, m.Node)
	}
	if err != nil {
		a.log.Warn("ignoring a manifest left by a previous agent", "path", a.manifestPath(), "err", err)
		return true
	}
	a.restored = m.Coordinator
	for _, mv := range m.Vars {
		v, n, err := a.adoptVar(mv)
		if err != nil {
			a.log.Warn("not re-adopting a variable", "err", err)
			continue
		}
		a.mu.vars[v.name] = v
		a.shardBytes.Add(n)
		a.stats.adopted.Add(1)
		a.log.Info("re-adopted a variable", "variable", v.name, "id", v.table.ID, "bytes", n)
	}
	return true
}

// adoptVar opens the segments of one variable and checks each against its
// table: rank, rows, row shape.
func (a *Agent) adoptVar(mv manifestVar) (*variable, int64, error) {
	t := mv.Table
	if t == nil || t.Check() != nil || len(mv.Segments) == 0 {
		return nil, 0, base.Errorf(base.ErrProtocol, "manifest entry without a sound table")
	}
	v := newVariable(t.Name)
	var n int64
	fail := func(err error) (*variable, int64, error) {
		for _, seg := range v.segs {
			seg.Close()
		}
		return nil, 0, fmt.Errorf("variable %q: %w", t.Name, err)
	}
	for _, r := range slices.Sorted(maps.Keys(mv.Segments)) {
		path := mv.Segments[r]
		if r < 0 || r >= len(t.ShardRows) || t.Nodes[t.RankNode[r]] != a.cfg.Node {
			return fail(base.Errorf(base.ErrProtocol, "segment %s of rank %d, which is not on node %q", path, r, a.cfg.Node))
		}
		seg, err := shm.Open(path, true)
		if err != nil {
			return fail(err)
		}
		v.segs[r] = seg
		if seg.Dropped() {
			// The previous agent stopped while dropping it: its readers
			// have been told the variable is gone.
			return fail(base.Errorf(base.ErrFreed, "segment %s was being dropped", path))
		}
		if h := seg.Header; h.Rank != int64(r) || h.Rows != t.ShardRows[r] || h.Disp != t.Disp || h.ItemSize != t.ItemSize || (h.Kind == shm.KindRagged) != t.Ragged() {
			return fail(base.Errorf(base.ErrGeometry, "segment %s holds rank %d's %d %s rows of disp %d, itemsize %d; the table says rank %d's %d %s rows of disp %d, itemsize %d",
				path, h.Rank, h.Rows, h.Kind, h.Disp, h.ItemSize, r, t.ShardRows[r], t.Kind, t.Disp, t.ItemSize))
		}
		n += seg.Bytes()
	}
	v.mu.Lock()
	err := v.setTable(a, t)
	if err == nil && t.Ragged() && mv.Index != "" {
		// The index is the agent's own file; one that does not match the
		// table is removed (marked dropped first, for a client that may
		// still map it) and built again, under a name of its own, on first
		// use. Writable, as a made one is, so that its drop can mark it.
		if idx, ierr := shm.Open(mv.Index, true); ierr == nil {
			// With a backing file it holds every row, the file's too.
			held := v.rag.first[len(v.rag.first)-1]
			items := idx.Header.Items == held || t.Backing != "" && idx.Header.Items >= held
			if h := idx.Header; h.Kind == shm.KindIndex && h.Rows == v.lay.Total() && items && idx.CheckOffsets(0) == nil && !idx.Dropped() {
				v.setIndex(a, idx)
				n += idx.Bytes()
			} else {
				idx.Close()
				shm.Discard(mv.Index)
			}
		}
	}
	v.mu.Unlock()
	if err != nil {
		return fail(err)
	}
	return v, n, nil
}

// removeManifest forgets the manifest (a clean stop without --persist).
func (a *Agent) removeManifest() { os.Remove(a.manifestPath()) }
