// Package bench holds the measurement building blocks behind `ddstore bench`.
//
// A throughput number for the store means little on its own: the same code
// reads at very different speeds on different machines. So the bench command
// measures, in the same run and on the same machine, what the hardware and Go
// runtime can do without the store in the way — a plain single-threaded
// random-row gather from memory (GatherLimit) and raw loopback TCP
// (TCPLimit) — and reports the store next to those ceilings. The gap between
// the two, not the absolute figure, is what tells whether the store is the
// bottleneck.
//
// The helpers favour repeatable, robust numbers over peak ones: inputs are
// generated from fixed seeds outside the timed region, and results are medians
// over many short samples so that a noisy neighbour on a shared machine skews
// a few samples rather than the answer.
package bench
