//go:build mpi && cgo

package bench

// The MPI probe: DDStore's method 0 reduced to its data path, measured in
// the same run as the store so that the comparison does not hang on how
// busy the machine was when DDStore's figures were taken. Two ranks of an
// mpirun launch of this binary each put a shard in a window
// (MPI_Win_create, as DDStore does with its arrays, locked once for all
// targets); rank 0 reads batches of random rows of rank 1 with a get per
// row and one flush per batch (DDStore's get_batch), then single rows with
// a get and a flush each (its get()). Rank 1 waits outside MPI, as the idle
// agent does.

/*
// (the MPI to link: mpi_flags*.go)
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static MPI_Win probe_win;
static char *probe_mem;

static int probe_init(int64_t bytes, int *rank, int *size) {
	int provided;
	setenv("OMPI_MCA_opal_signal", "", 0);
	int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
	if (rc != MPI_SUCCESS) return rc;
	MPI_Comm_rank(MPI_COMM_WORLD, rank);
	MPI_Comm_size(MPI_COMM_WORLD, size);
	probe_mem = malloc(bytes);
	if (probe_mem == NULL) return MPI_ERR_NO_MEM;
	// Every word holds its own offset: real pages (untouched memory would
	// all be the zero page, which reads faster than any real shard), and
	// rows that say where they came from.
	for (int64_t i = 0; i + 8 <= bytes; i += 8) *(int64_t *)(probe_mem + i) = i;
	rc = MPI_Win_create(probe_mem, bytes, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &probe_win);
	if (rc != MPI_SUCCESS) return rc;
	return MPI_Win_lock_all(0, probe_win);
}

// probe_batch: DDStore's get_batch, a get per row then one flush.
static int probe_batch(int n, const int64_t *disp, int rb, char *dst) {
	int rc = MPI_SUCCESS;
	for (int i = 0; i < n && rc == MPI_SUCCESS; i++)
		rc = MPI_Get(dst + (int64_t)i * rb, rb, MPI_BYTE, 1, disp[i], rb, MPI_BYTE, probe_win);
	int frc = MPI_Win_flush(1, probe_win);
	return rc != MPI_SUCCESS ? rc : frc;
}

static void probe_done(void) {
	int rank, v = 1;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	if (rank == 0) {
		MPI_Send(&v, 1, MPI_INT, 1, 0, MPI_COMM_WORLD);
	} else {
		MPI_Request rq;
		int flag = 0;
		MPI_Irecv(&v, 1, MPI_INT, 0, 0, MPI_COMM_WORLD, &rq);
		while (!flag) {
			usleep(1000);
			MPI_Test(&rq, &flag, MPI_STATUS_IGNORE);
		}
	}
	MPI_Win_unlock_all(probe_win);
	MPI_Win_free(&probe_win);
	MPI_Finalize();
}
*/
import "C"

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"time"
	"unsafe"
)

// MPIProbeRank runs one rank of the probe when this process is one (the
// environment says so) and reports true; rank 0 prints its figures as
// JSON lines on stdout.
func MPIProbeRank() (bool, error) {
	arg := os.Getenv(probeEnv)
	if arg == "" {
		return false, nil
	}
	var opts Options
	if err := json.Unmarshal([]byte(arg), &opts); err != nil {
		return true, err
	}
	var rank, size C.int
	if rc := C.probe_init(C.int64_t(opts.ShardBytes), &rank, &size); rc != C.MPI_SUCCESS {
		return true, fmt.Errorf("bench: MPI probe: MPI error %d", int(rc))
	}
	defer C.probe_done()
	if size != 2 {
		return true, fmt.Errorf("bench: MPI probe: %d ranks, want 2", size)
	}
	if rank != 0 {
		return true, nil
	}
	enc := json.NewEncoder(os.Stdout)
	for _, rb := range opts.RowSizes {
		r, err := probeRows(opts, rb)
		if err != nil {
			return true, err
		}
		enc.Encode(r)
	}
	return true, nil
}

func probeRows(opts Options, rb int) (MPIProbeResult, error) {
	n := opts.ShardBytes / int64(rb)
	res := MPIProbeResult{RowBytes: rb}
	dst := C.malloc(C.size_t(opts.Batch * rb))
	defer C.free(dst)
	rng := rand.New(rand.NewPCG(2, uint64(rb)))
	batches := make([][]int64, 64)
	for b := range batches {
		batches[b] = make([]int64, opts.Batch)
		for i := range batches[b] {
			batches[b][i] = rng.Int64N(n) * int64(rb)
		}
	}
	k := 0
	rate, err := Throughput(opts.Duration, opts.Batch*rb, rb, func() error {
		k = (k + 1) % len(batches)
		if rc := C.probe_batch(C.int(opts.Batch), (*C.int64_t)(unsafe.Pointer(&batches[k][0])), C.int(rb), (*C.char)(dst)); rc != C.MPI_SUCCESS {
			return fmt.Errorf("MPI error %d", int(rc))
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	out := unsafe.Slice((*byte)(dst), opts.Batch*rb)
	for i, off := range batches[k] {
		if rb >= 8 && int64(binary.LittleEndian.Uint64(out[i*rb:])) != off {
			return res, fmt.Errorf("row at offset %d read as offset %d", off, binary.LittleEndian.Uint64(out[i*rb:]))
		}
	}
	res.GBps = rate.GBps
	iters := max(opts.Latency/10, 100)
	ds := make([]time.Duration, iters)
	one := []int64{0}
	for i := range ds {
		one[0] = rng.Int64N(n) * int64(rb)
		t0 := time.Now()
		if rc := C.probe_batch(1, (*C.int64_t)(unsafe.Pointer(&one[0])), C.int(rb), (*C.char)(dst)); rc != C.MPI_SUCCESS {
			return res, fmt.Errorf("MPI error %d", int(rc))
		}
		ds[i] = time.Since(t0)
	}
	res.GetP50us = Percentile(DurationsToMicros(ds), 50)
	return res, nil
}
