package client

// The fence (DDStore's epoch_begin/epoch_end, an MPI window fence there): a
// barrier of the rank's replica group, through the agents. Rows are written
// straight into shared memory (Update) and read from it, by this node's
// ranks or by the owners' agents for other nodes, so the only ordering a
// reader needs is that every writer finished before it reads: a barrier
// gives that; the requests to the agent (system calls on both sides)
// order the memory accesses around it.

import (
	"sync"

	"github.com/ddstore-go/ddstore/internal/wire"
)

// fenceID names one sequence of fences: a rank of a group in a namespace.
type fenceID struct {
	namespace, socket, key string
	rank, size             int
}

// fenceSeqs counts each sequence's fences in this process. The count is
// per rank, not per Store: two stores of one rank and group fence as one
// sequence (each fence is a barrier of the same ranks, so one can stand for
// the other), where counts of their own would meet the other store's
// under one number.
var fenceSeqs struct {
	sync.Mutex
	m map[fenceID]int64
}

func nextFence(id fenceID) int64 {
	fenceSeqs.Lock()
	defer fenceSeqs.Unlock()
	if fenceSeqs.m == nil {
		fenceSeqs.m = make(map[fenceID]int64)
	}
	fenceSeqs.m[id]++
	return fenceSeqs.m[id]
}

// Fence returns once every rank of this rank's replica group has called
// it (the n-th call of each rank meets the others' n-th): every Update a
// rank made before its Fence is then seen by every read of the group's
// ranks after theirs, on this node and others. A rank that does not come
// within PublishTimeout fails the fence for every rank with ErrTimeout,
// naming the missing ranks. A reader, which holds no shard, takes part in
// no fence; a group of one rank returns at once.
func (s *Store) Fence() error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	if s.cfg.Reader || s.grp.size <= 1 {
		return nil
	}
	key := s.wireName("") // the group's suffix as variables carry it: "" for the whole job
	m := wire.Barrier{Key: key, Rank: int64(s.grp.rank), Size: int64(s.grp.size),
		Seq:       nextFence(fenceID{s.cfg.Namespace, s.socket, key, s.grp.rank, s.grp.size}),
		TimeoutMs: s.cfg.PublishTimeout.Milliseconds()}
	_, err := s.request(wire.OpBarrier, m.Encode, s.cfg.PublishTimeout+s.cfg.Timeout)
	return err
}

// EpochBegin and EpochEnd are DDStore's names of the fence.
func (s *Store) EpochBegin() error { return s.Fence() }
func (s *Store) EpochEnd() error   { return s.Fence() }
