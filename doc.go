// Package ddstore keeps a training dataset sharded in the memory of a job's
// nodes: every rank holds a part (its shard), and any rank reads any row by
// its global index, singly or a batch at a time, without the owning rank
// taking part.
//
// One agent per node and job namespace (`ddstore agent`, started by the
// first rank of the node if none runs) holds the node's shards in POSIX
// shared memory. A Store maps them: rows of the node are copied straight out
// of shared memory; rows of other nodes cost one request per batch to the
// node's agent, which fetches them from the owners' agents over TCP and
// writes them into the caller's buffer.
//
// A variable is a name plus one shard per rank; a row is disp items of
// itemsize bytes; global rows are the shards in rank order:
//
//	s, err := ddstore.Open(ddstore.Config{}) // rank and size from torchrun, Slurm, Open MPI or MPICH
//	if err != nil { ... }
//	defer s.Close()
//	// Every rank adds its rows (collective): here 1000 rows of 3 float32.
//	err = s.Add("coords", rowsAsBytes, 3, 4)
//	// Any rank reads any rows, in any order, repeats allowed.
//	dst := make([]byte, 4*3*4)
//	err = s.GetBatch("coords", dst, []int64{17, 4020, 3, 17})
//
// A ragged variable's rows each have a length of their own (n_i units of
// an optional fixed trailing shape: graphs, token sequences); its index of
// every row's extent lies in shared memory on every node, so a batch is
// sized (RaggedSizes) and read packed (GetRagged) with no extra request:
//
//	// rows of positions [n_i, 3] float32, packed, and their n_i
//	err = s.AddRagged("pos", packed, lengths, ddstore.Float32, 3)
//	n, err := s.RaggedSizes("pos", batch, lens)
//	dst := make([]byte, n)
//	_, err = s.GetRagged("pos", dst, batch, lens)
//
// A Go program may instead run the agent itself, with package
// github.com/ddstore-go/ddstore/agent; one that imports only this package
// links no agent.
//
// Errors wrap the sentinels of this package (ErrIndex, ErrGeometry, ...);
// match them with errors.Is.
package ddstore
