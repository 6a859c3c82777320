// Package schedule decides, before a job starts, which samples every rank
// reads at every step of every epoch, which of them the job's memory holds
// and which it reads from storage, and so what to prefetch. When a dataset
// is larger than the memory a job gives it (capacity C < N samples), the
// shuffled order of every epoch, fixed in advance by a seed, is the future a
// loader can plan for.
//
// A schedule is a pure function of its Config: no I/O, no goroutines, no
// clock. The same Config gives the same schedule in every process, so each
// rank computes it alone; epochs are simulated one at a time, on demand.
// One epoch alone (Schedule.Epoch) costs one epoch under Locality; Random
// and Solar replay their buffers through the epochs before it, except that
// Random's samples without their hits (Schedule.EpochSamples) cost one.
//
// The order of epoch e is Permutation(seed, e, N), which the Python client
// computes identically (ddstore.schedule.permutation). Three policies turn
// those orders into steps:
//
//   - Random: PyTorch's DistributedSampler and DataLoader, with a FIFO
//     buffer of C/P samples per rank. The baseline.
//   - Solar: SOLAR's artifact (arXiv 2211.00224): epochs reordered by a
//     particle swarm over its epoch-to-epoch cost matrix, the first ⌊C/G⌋
//     global batches of each later epoch re-dealt to the ranks that buffer
//     their samples, storage reads of those steps split over the ranks.
//     Local batch sizes then differ between ranks.
//   - Locality (the default): a fixed subset of C samples pinned across the
//     nodes, every rank exactly B samples a step, the same storage reads on
//     every rank (±1), memory hits dealt to the node holding them. Its hit
//     rate C/N is the most any policy gets when every epoch reads every
//     sample once (see locality.go).
//
// Usage:
//
//	s, err := schedule.New(schedule.Config{
//		Seed: 7, Epochs: 10, N: 2048, Ranks: 4, RanksPerNode: 2,
//		Batch: 16, Capacity: 1024, Policy: schedule.Locality,
//	})
//	if err != nil {
//		return err // wraps base.ErrArgument, naming the bad value
//	}
//	for st := range s.Steps(2) { // look ahead two steps
//		mine := st.Samples(rank)      // this rank's batch
//		fromDisk := st.StorageReads(rank)
//		next := st.Prefetch(rank)     // start reading these now
//		_, _, _ = mine, fromDisk, next
//	}
//	sum := s.Summarize() // hit rate per epoch, storage reads per step, ...
//
// A job stopped after step k of epoch e resumes on any number of ranks,
// nodes and local batch from the position its steps reached in the epoch's
// global order (the permutation, padded), the same for every policy:
//
//	pos := s.Epoch(e).Position(k)
//	r, err := schedule.New(schedule.Config{ /* the new geometry */
//		ResumeEpoch: e, ResumePosition: pos, OrderRanks: oldRanks /* solar */})
//	rest := r.Epoch(e) // the positions pos.. dealt over the new ranks, each once
//
// A hit is a read served from the job's memory: under Random and Solar the
// reading rank's own buffer, under Locality any node's memory (NodeLocal
// tells whether it was the reader's node).
//
// Rows of different sizes (ragged variables): with Config.Sizes (every
// sample's bytes) memory is a budget of CapacityBytes M bytes instead of
// Capacity samples. The bounds become two, M/S for the byte hit rate (S the
// dataset's bytes) and k(M)/N for the sample hit rate (k(M) the most
// samples that fit in M, the smallest); Locality pins a prefix of the rows
// filling M (PinBytes, the default; PinSamples pins the smallest and
// reaches both) and deals each step's storage reads by bytes, so that the
// ranks of a step read about as many bytes from storage; Random and Solar
// buffer M/P bytes per rank. Summary and EpochStats carry both hit rates,
// their bounds, and storage bytes per rank per step with their imbalance.
// The derivation and the choice are in bytes.go. Without Sizes every
// schedule is the one of a budget in samples, unchanged.
package schedule
