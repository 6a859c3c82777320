package bench

// The node helper of the scale driver: one process per simulated node,
// holding that node's ranks as Stores, doing what the driver asks on its
// stdin, one JSON line at a time, and answering on its stdout.

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/ddstore-go/ddstore"
)

// ScaleNodeEnv carries a node helper's arguments (JSON); a ddstore process
// started with it plays that node (ScaleNodeRole).
const ScaleNodeEnv = "DDSTORE_SCALE_NODE"

// scaleNodeArgs are what a node helper is started with.
type scaleNodeArgs struct {
	Namespace    string `json:"namespace"`
	Node         string `json:"node"`
	NodeIndex    int    `json:"node_index"`
	Nodes        int    `json:"nodes"`
	RanksPerNode int    `json:"ranks_per_node"`
	RunDir       string `json:"run_dir"`
	RowsPerNode  int64  `json:"rows_per_node"`
	RowBytes     int    `json:"row_bytes"`
	Batch        int    `json:"batch"`
}

// scaleCmd is one request of the driver to a node helper.
type scaleCmd struct {
	Op       string        `json:"op"` // add, free, read, quit
	Name     string        `json:"name"`
	Duration time.Duration `json:"duration"`
	Seed     uint64        `json:"seed"`
}

// scaleReply is a node helper's answer: one per request, and one "open"
// line once every rank has opened its store.
type scaleReply struct {
	Op      string  `json:"op"`
	Err     string  `json:"err,omitempty"`
	Seconds float64 `json:"seconds"`
	// read: the batches read, the rows, and each batch's time.
	Batches  int    `json:"batches,omitempty"`
	Rows     int64  `json:"rows,omitempty"`
	Errors   int    `json:"errors,omitempty"`
	FirstErr string `json:"first_err,omitempty"`
	// FailedSeconds is from the first failed batch to the end of the
	// last one.
	FailedSeconds float64   `json:"failed_s,omitempty"`
	BatchesUs     []float64 `json:"batches_us,omitempty"`
}

// ScaleNodeRole plays the node helper when ScaleNodeEnv is set (the
// driver's child) and reports true; otherwise it returns false at once.
func ScaleNodeRole() (bool, error) {
	v := os.Getenv(ScaleNodeEnv)
	if v == "" {
		return false, nil
	}
	var a scaleNodeArgs
	if err := json.Unmarshal([]byte(v), &a); err != nil {
		return true, fmt.Errorf("bench: %s: %w", ScaleNodeEnv, err)
	}
	return true, runScaleNode(a, os.Stdin, os.Stdout)
}

func runScaleNode(a scaleNodeArgs, in io.Reader, out io.Writer) error {
	enc := json.NewEncoder(out)
	say := func(r scaleReply) error { return enc.Encode(r) }
	rpn := a.RanksPerNode
	size := a.Nodes * rpn
	stores := make([]*ddstore.Store, rpn)
	defer func() {
		for _, s := range stores {
			if s != nil {
				s.Close()
			}
		}
	}()
	t0 := time.Now()
	err := each(rpn, func(l int) error {
		s, err := ddstore.Open(ddstore.Config{Namespace: a.Namespace, Rank: a.NodeIndex*rpn + l, Size: size,
			LocalRank: l, LocalSize: rpn, Node: a.Node, RunDir: a.RunDir, NoSpawn: true,
			AgentWait: 5 * time.Minute, PublishTimeout: 5 * time.Minute})
		stores[l] = s
		return err
	})
	if serr := say(scaleReply{Op: "open", Seconds: time.Since(t0).Seconds(), Err: errText(err)}); serr != nil || err != nil {
		return errors.Join(err, serr)
	}
	perRank := a.RowsPerNode / int64(rpn)
	shards := make([][]byte, rpn)
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		var c scaleCmd
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			return err
		}
		t := time.Now()
		var r scaleReply
		switch c.Op {
		case "add":
			err = each(rpn, func(l int) error {
				if shards[l] == nil {
					shards[l] = make([]byte, perRank*int64(a.RowBytes))
				}
				first := int64(a.NodeIndex*rpn+l) * perRank
				for i := range perRank {
					binary.LittleEndian.PutUint64(shards[l][i*int64(a.RowBytes):], uint64(first+i))
				}
				return stores[l].Add(c.Name, shards[l], int64(a.RowBytes), 1)
			})
		case "free":
			err = each(rpn, func(l int) error { return stores[l].Free(c.Name) })
		case "read":
			r = scaleRead(a, stores[0], c)
		case "quit":
			return say(scaleReply{Op: "quit"})
		default:
			err = fmt.Errorf("bench: node helper: unknown op %q", c.Op)
		}
		r.Op, r.Seconds = c.Op, time.Since(t).Seconds()
		if err != nil {
			r.Err = err.Error()
		}
		if err := say(r); err != nil {
			return err
		}
	}
	return sc.Err()
}

// scaleRead reads batches of random rows of the other nodes for
// c.Duration from local rank 0's store, checking every row, and goes on
// after a failed batch (a node's agent may be restarting).
func scaleRead(a scaleNodeArgs, s *ddstore.Store, c scaleCmd) scaleReply {
	var r scaleReply
	rng := rand.New(rand.NewPCG(c.Seed, uint64(a.NodeIndex)))
	others := int64(a.Nodes-1) * a.RowsPerNode
	if others <= 0 {
		r.Err = "bench: a read needs another node"
		return r
	}
	recv, err := s.AllocRecv(a.Batch * a.RowBytes)
	if err != nil {
		r.Err = err.Error()
		return r
	}
	defer s.FreeRecv(recv)
	idx := make([]int64, a.Batch)
	mine := int64(a.NodeIndex) * a.RowsPerNode
	end := time.Now().Add(c.Duration)
	var firstErr time.Time
	for time.Now().Before(end) {
		for i := range idx {
			g := rng.Int64N(others)
			if g >= mine {
				g += a.RowsPerNode // skip this node's rows
			}
			idx[i] = g
		}
		t := time.Now()
		err := s.GetBatch(c.Name, recv, idx)
		d := time.Since(t)
		if err == nil {
			for i, g := range idx {
				if got := int64(binary.LittleEndian.Uint64(recv[i*a.RowBytes:])); got != g {
					err = fmt.Errorf("bench: row %d read as row %d", g, got)
					break
				}
			}
		}
		if err != nil {
			if r.Errors == 0 {
				r.FirstErr = err.Error()
				firstErr = t
			}
			r.Errors++
			r.FailedSeconds = time.Since(firstErr).Seconds()
			continue
		}
		r.Batches++
		r.Rows += int64(len(idx))
		r.BatchesUs = append(r.BatchesUs, float64(d.Nanoseconds())/1e3)
	}
	return r
}

// each runs f(0..n-1) at once and joins their errors.
func each(n int, f func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
