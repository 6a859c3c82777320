package client

// Prefetch: rows of a backing file read ahead into the agent's staging.

import (
	"fmt"

	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// Prefetch asks the node's agent to read rows of a variable with a backing
// file into staging now (ddstore.Store.Prefetch): the rows the shards hold
// are left out, and it returns without waiting for the reads.
func (s *Store) Prefetch(name string, indices []int64) error {
	v, err := s.acquire(name)
	if err != nil {
		return err
	}
	defer v.mu.RUnlock()
	if v.backing == "" {
		return base.Errorf(base.ErrArgument, "variable %q has no backing file: its rows are all in memory, there is nothing to prefetch", name)
	}
	if err := v.lay.CheckAll(indices); err != nil {
		return fmt.Errorf("variable %q: %w", name, err)
	}
	held := v.lay.Held()
	m := wire.Fetch{Name: v.name, ID: v.id}
	for _, g := range indices {
		if g >= held {
			m.Globals = append(m.Globals, g)
		}
	}
	if len(m.Globals) == 0 {
		return nil
	}
	_, err = s.request(wire.OpPrefetch, m.Encode, s.cfg.Timeout)
	if err != nil {
		return fmt.Errorf("variable %q: %w", name, err)
	}
	return nil
}
