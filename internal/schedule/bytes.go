package schedule

import (
	"cmp"
	"math/bits"
	"slices"
)

// Schedules in bytes (Config.Sizes set): rows differ in size and memory is a
// budget of M bytes, CapacityBytes, over a dataset of S bytes in N samples.
//
// Bounds. Every epoch reads every sample once, so, as for a budget in
// samples (locality.go), a hit in epoch e+1 is a sample memory held at the
// boundary between epochs e and e+1, where it holds at most M bytes. The
// hits of an epoch are thus a set of at most M bytes:
//
//   - byte hit rate (bytes read from memory over bytes read) ≤ M/S;
//   - sample hit rate ≤ k(M)/N, k(M) the most samples whose sizes add up to
//     at most M: the k smallest (any other set of k samples is at least as
//     large).
//
// Filling the budget is a subset sum; a greedy fill gets within the size of
// one sample left out, per node when each of K nodes fills its own share of
// M. So the byte hit rate of a pinned set that fills the budget is M/S less
// at most K samples' bytes, and it is the same for every set that fills it:
// what differs between such sets is how many samples they hold.
//
// What locality pins (Config.Pin):
//
//   - PinBytes (the default): the samples in index order, node after node,
//     each node its share: byte hit rate M/S within a sample per node, and
//     a sample hit rate of about the same, M/S (the sizes of a prefix are
//     those of the dataset). The pinned set is a prefix of the rows, split
//     over the nodes in order: how the store holds a dataset larger than
//     its memory (the held rows are the first, the rest come from the
//     backing file), as under a budget in samples (rows 0..C-1).
//   - PinSamples: the smallest samples first (the knapsack's greedy for the
//     count): sample hit rate k(M)/N within a sample per node, and the byte
//     hit rate within one sample of M/S too, since the smallest samples
//     fill the budget as well. Both bounds at once; storage then reads as
//     many bytes as under PinBytes but far fewer samples (the largest),
//     which only pays where a storage read costs per sample (small files,
//     latency-bound reads), and its pinned set is scattered over the rows:
//     the store holds it only if rows are placed by size.
//
// Storage traffic is bytes, the same under both; PinBytes keeps the layout
// the store has and balances better (its storage reads are of every size),
// so it is the default. docs/benchmarks.md has both on atomistic
// structures and token lengths.
//
// Balance. Every rank still reads exactly B samples a step under locality,
// but storage reads are dealt by bytes, not ±1 in number: the step's
// misses, largest first, each to the rank with the fewest bytes from
// storage so far that has room under B (longest processing time first, so
// a step's busiest rank reads at most the mean plus its largest read); each
// rank's memory hits are what fills it to B, dealt node-local first (a
// node's ranks read min(its pinned samples in the batch, their hits) of its
// own memory). Random reads DistributedSampler's positions
// and cannot move a read; Solar's re-dealt steps split their storage reads
// over the ranks the same way, without the count (its local batches differ
// anyway). Random's and Solar's FIFO buffers hold M/P bytes each: a store
// evicts the oldest samples until the new one fits, and a sample larger
// than the whole buffer is read and not kept.

// byteBounds returns k(M), the most samples whose sizes add up to at most
// capa bytes, and the bytes of all samples.
func byteBounds(sizes []int64, capa int64) (k int, total int64) {
	sorted := slices.Clone(sizes)
	slices.Sort(sorted)
	var sum int64
	for _, s := range sorted {
		total += s
		if sum+s <= capa {
			sum += s
			k++
		}
	}
	return k, total
}

// nodeShares splits capa bytes over nodes: ⌊capa/K⌋ each, one more for the
// first capa mod K.
func nodeShares(capa int64, nodes int) []int64 {
	share := make([]int64, nodes)
	for k := range share {
		share[k] = capa / int64(nodes)
		if int64(k) < capa%int64(nodes) {
			share[k]++
		}
	}
	return share
}

// pinBytes returns, for every sample, the node whose memory pins it (-1:
// none), each node holding at most its share of capa bytes. PinBytes: the
// samples in index order fill node 0's share until the next does not fit,
// then node 1's, ...: each node pins one range of indices (the store's
// layout, contiguous shards in rank order, whose held rows are the first;
// a sample larger than a whole share is left out of it), and leaves less
// than one sample of its share unfilled. PinSamples: the samples from the smallest (ties by index), each to the
// node with the most room, until the next fits nowhere.
func pinBytes(sizes []int64, capa int64, nodes int, pin Pin) (node []int32, count int, bytes int64) {
	node = make([]int32, len(sizes))
	for i := range node {
		node[i] = -1
	}
	share := nodeShares(capa, nodes)
	used := make([]int64, nodes)
	put := func(x int32, k int32) {
		node[x] = k
		used[k] += sizes[x]
		count++
		bytes += sizes[x]
	}
	switch pin {
	case PinSamples:
		order := make([]int32, len(sizes))
		for i := range order {
			order[i] = int32(i)
		}
		slices.SortFunc(order, func(a, b int32) int {
			return cmp.Or(cmp.Compare(sizes[a], sizes[b]), cmp.Compare(a, b))
		})
		// room is a heap of the nodes, the most room first, ties by node.
		room := newMinHeap(nodes, func(a, b int32) bool {
			ra, rb := used[a]-share[a], used[b]-share[b]
			return ra < rb || (ra == rb && a < b)
		})
		room.fill()
		for _, x := range order {
			k := room.top()
			if used[k]+sizes[x] > share[k] {
				break // every later sample is at least as large
			}
			put(x, k)
			room.fix()
		}
	default:
		k := 0
		for x := 0; x < len(sizes) && k < nodes; x++ {
			if sizes[x] > share[0] {
				continue // fits in no node
			}
			for k < nodes && used[k]+sizes[x] > share[k] {
				k++
			}
			if k < nodes {
				put(int32(x), int32(k))
			}
		}
	}
	return node, count, bytes
}

// minHeap is a binary heap of the ids 0..n-1 under less, which reads keys
// the caller keeps; fix restores it after the top's key grew.
type minHeap struct {
	ids  []int32
	less func(a, b int32) bool
}

func newMinHeap(n int, less func(a, b int32) bool) *minHeap {
	return &minHeap{ids: make([]int32, 0, n), less: less}
}

// fill puts every id 0..cap-1 in the heap (all keys equal or not: it
// heapifies).
func (h *minHeap) fill() {
	h.ids = h.ids[:cap(h.ids)]
	for i := range h.ids {
		h.ids[i] = int32(i)
	}
	for i := len(h.ids)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *minHeap) top() int32 { return h.ids[0] }
func (h *minHeap) fix()       { h.down(0) }

func (h *minHeap) down(i int) {
	n := len(h.ids)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h.less(h.ids[r], h.ids[l]) {
			m = r
		}
		if !h.less(h.ids[m], h.ids[i]) {
			return
		}
		h.ids[i], h.ids[m] = h.ids[m], h.ids[i]
		i = m
	}
}

// byteDealer deals a step's storage reads over the ranks by bytes: the
// largest first, each to the rank with the fewest bytes so far among those
// with room left (room nil: no limit).
type byteDealer struct {
	load  []int64
	heap  []int32     // ranks with room, the least load first (ties: the lower rank)
	keys  []uint64    // the reads, largest first: ^size above, position below
	order []sizedRead // the same, when sizes and positions do not fit in 64 bits
}

type sizedRead struct {
	size int64
	pos  int32
}

func newByteDealer(ranks int) *byteDealer {
	return &byteDealer{load: make([]int64, ranks), heap: make([]int32, 0, ranks)}
}

// deal sets rankOf[i] for each i of reads (positions of samples whose
// sizes size tells), room[r] the reads rank r takes at most.
func (d *byteDealer) deal(reads []int32, size func(int32) int64, room []int, rankOf []int32) {
	clear(d.load)
	d.heap = d.heap[:0]
	for r := range d.load {
		if room == nil || room[r] > 0 {
			d.heap = append(d.heap, int32(r)) // all loads 0: in rank order, a heap
		}
	}
	var biggest int64
	var last int32
	for _, i := range reads {
		biggest, last = max(biggest, size(i)), max(last, i)
	}
	posBits := bits.Len32(uint32(last))
	if bits.Len64(uint64(biggest))+posBits <= 64 {
		// One key per read, sorted as integers: size descending, then
		// position ascending.
		d.keys = d.keys[:0]
		top := uint64(1)<<(64-posBits) - 1
		for _, i := range reads {
			d.keys = append(d.keys, (top-uint64(size(i)))<<posBits|uint64(i))
		}
		slices.Sort(d.keys)
		mask := uint64(1)<<posBits - 1
		for _, k := range d.keys {
			d.give(int32(k&mask), int64(top-k>>posBits), room, rankOf)
		}
		return
	}
	d.order = d.order[:0]
	for _, i := range reads {
		d.order = append(d.order, sizedRead{size(i), i})
	}
	slices.SortFunc(d.order, func(a, b sizedRead) int {
		return cmp.Or(cmp.Compare(b.size, a.size), cmp.Compare(a.pos, b.pos))
	})
	for _, rd := range d.order {
		d.give(rd.pos, rd.size, room, rankOf)
	}
}

// give deals the read at pos, of size bytes, to the rank on top.
func (d *byteDealer) give(pos int32, size int64, room []int, rankOf []int32) {
	r := d.heap[0]
	rankOf[pos] = r
	d.load[r] += size
	if room != nil {
		if room[r]--; room[r] == 0 {
			n := len(d.heap) - 1
			d.heap[0] = d.heap[n]
			d.heap = d.heap[:n]
		}
	}
	d.down()
}

// down restores the heap after its top's load grew or the top was replaced.
func (d *byteDealer) down() {
	h, load := d.heap, d.load
	less := func(a, b int32) bool { return load[a] < load[b] || (load[a] == load[b] && a < b) }
	for i := 0; ; {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && less(h[r], h[l]) {
			m = r
		}
		if !less(h[m], h[i]) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}
