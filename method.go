package ddstore

// Read methods (Config.Method): how a Store reads rows of other nodes. The
// engine (internal/client) names them the same; TestMethodNames holds the
// two together.
const (
	// MethodAgent reads them through this node's agent, which fetches them
	// from the owners' agents (the default).
	MethodAgent = "agent"
	// MethodMPI reads them from this process with passive-target MPI gets
	// out of the owners' shards (DDStore's method 0): the store's ranks are
	// the ranks of MPI_COMM_WORLD of the launch that started this process,
	// each exposing its shard of every variable it creates in an MPI
	// window. Needs a build with the tag mpi.
	MethodMPI = "mpi"
)
