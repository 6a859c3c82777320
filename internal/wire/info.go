package wire

// The JSON an agent answers OpInfo with.

// AgentInfo is an agent's reply to OpInfo, as JSON in a Text: what
// `ddstore info` shows of the agent and its variables.
type AgentInfo struct {
	Namespace   string `json:"namespace"`
	Node        string `json:"node"`
	Pid         int    `json:"pid"`
	Socket      string `json:"socket"`
	PeerAddr    string `json:"peer_addr"`
	Coordinator bool   `json:"coordinator"`
	Clients     int    `json:"clients"`
	Regions     int    `json:"recv_regions"`
	MemoryBytes int64  `json:"memory_bytes"`
	// MemoryBudget is the --memory cap on MemoryBytes; 0: none.
	MemoryBudget int64           `json:"memory_budget_bytes"`
	Variables    []AgentVariable `json:"variables"`
	Counters     map[string]int  `json:"counters"`
	Nodes        []string        `json:"nodes,omitempty"`
	// Collectives are, on the coordinator, the publish rounds and fences
	// it holds: waiting for ranks, or failed and answering late ones.
	Collectives []AgentCollective `json:"collectives,omitempty"`
	// Auth says where the keys come from (never the keys).
	Auth string `json:"auth"`
	// Transport is how this agent reads rows of other nodes: tcp, mpi or
	// fabric.
	Transport string `json:"transport"`
	// HandshakeDir is the directory the agent meets the job's other agents
	// in ("": a rendezvous address, or a single node), so that a client
	// asked to meet in another one can tell it will not.
	HandshakeDir string `json:"handshake_dir,omitempty"`
}

// AgentCollective is a collective the coordinator holds.
type AgentCollective struct {
	Kind  string  `json:"kind"`  // "publish" or "fence"
	Name  string  `json:"name"`  // the variable (publish), the group's key (fence)
	Seq   int64   `json:"seq"`   // the round's attempt, the fence's seq
	Size  int64   `json:"size"`  // ranks it waits for
	Ranks []int64 `json:"ranks"` // the ranks that came
	Error string  `json:"error,omitempty"`
}

// AgentVariable describes one variable as the agent's node sees it.
type AgentVariable struct {
	Name       string   `json:"name"`
	Published  bool     `json:"published"`
	TotalRows  int64    `json:"total_rows"`
	Disp       int64    `json:"disp"`
	ItemSize   int64    `json:"itemsize"`
	Dtype      string   `json:"dtype,omitempty"`
	RowBytes   int64    `json:"row_bytes"`
	ShardRows  []int64  `json:"shard_rows,omitempty"`
	Owners     []string `json:"owners,omitempty"` // node of each rank
	LocalRanks []int    `json:"local_ranks"`
	LocalBytes int64    `json:"local_bytes"`
	// Backing is the file holding every row, HeldRows how many of them
	// the shards hold (the rest are read from the file); "" and TotalRows
	// without one. A ragged variable's backing file is a pair: Backing
	// names its values, BackingOffsets its offsets.
	Backing        string `json:"backing,omitempty"`
	BackingOffsets string `json:"backing_offsets,omitempty"`
	HeldRows       int64  `json:"held_rows"`
	// Kind is "fixed" (every row RowBytes) or "ragged" (rows of a length
	// of their own: RowBytes 0, Shape the trailing dimensions, ShardItems
	// per rank the units of Disp items); "" before publication.
	// TotalBytes is the values of every row; IndexBytes the node's index
	// of a ragged variable (counted in memory_bytes, like LocalBytes).
	Kind       string  `json:"kind,omitempty"`
	Shape      []int64 `json:"shape,omitempty"`
	ShardItems []int64 `json:"shard_items,omitempty"`
	TotalBytes int64   `json:"total_bytes"`
	IndexBytes int64   `json:"index_bytes,omitempty"`
	// TableBytes is the memory the variable's table takes on this node
	// (per-rank and per-node entries, prefix sums): what grows with the
	// job's ranks and nodes.
	TableBytes int64 `json:"table_bytes,omitempty"`
}
