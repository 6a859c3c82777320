package agent

import (
	"sync/atomic"

	"github.com/ddstore-go/ddstore/internal/base"
)

// errorKinds counts the client requests answered with an error, by the
// kind of error (the sentinel it wraps: index, geometry, unknown, ...).
type errorKinds [32]atomic.Int64

func (e *errorKinds) add(err error) {
	if c := int(base.Code(err)); c < len(e) {
		e[c].Add(1)
	}
}

// each calls f with every kind and its count, zero counts included.
func (e *errorKinds) each(f func(kind string, n func() int64)) {
	for c := 1; c < min(base.NumCodes, len(e)); c++ {
		if k := base.Kind(uint16(c)); k != "" {
			f(k, e[c].Load)
		}
	}
}

// counters adds the nonzero counts to an info's counters as errors_KIND.
func (e *errorKinds) counters(dst map[string]int) {
	e.each(func(kind string, n func() int64) {
		if v := n(); v > 0 {
			dst["errors_"+kind] = int(v)
		}
	})
}
