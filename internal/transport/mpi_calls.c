//go:build mpi && cgo

// The C side of the MPI transport: see mpi_calls.h and mpi.go.

#include <time.h>

#include "mpi_calls.h"

static MPI_Win ddst_win;
static int ddst_windowed;

// ddst_library gives the MPI library's version (callable before MPI_Init).
void ddst_library(char *buf, int *len) {
	MPI_Get_library_version(buf, len);
}

// ddst_init starts MPI with MPI_THREAD_MULTIPLE, or takes the MPI the
// process already started (*ours = 0).
int ddst_init(int *provided, int *rank, int *size, int *ours) {
	int inited = 0, finalized = 0;
	MPI_Finalized(&finalized);
	if (finalized) return MPI_ERR_OTHER;
	MPI_Initialized(&inited);
	*ours = !inited;
	if (!inited) {
		// Open MPI catches SIGSEGV, SIGBUS, SIGFPE and SIGABRT to print a
		// backtrace; the Go runtime needs those signals itself. A user's
		// own setting wins (overwrite = 0).
		setenv("OMPI_MCA_opal_signal", "", 0);
		int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, provided);
		if (rc != MPI_SUCCESS) return rc;
	} else {
		MPI_Query_thread(provided);
	}
	MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
	MPI_Comm_rank(MPI_COMM_WORLD, rank);
	MPI_Comm_size(MPI_COMM_WORLD, size);
	return MPI_SUCCESS;
}

int ddst_bcast_u64(uint64_t *v) {
	return MPI_Bcast(v, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
}

int ddst_barrier(void) {
	return MPI_Barrier(MPI_COMM_WORLD);
}

int ddst_allgather_u64(uint64_t *mine, int n, uint64_t *all) {
	return MPI_Allgather(mine, n, MPI_UINT64_T, all, n, MPI_UINT64_T, MPI_COMM_WORLD);
}

// ddst_win_create makes the dynamic window of this agent, collectively,
// and opens one passive-target epoch to every rank for its lifetime.
int ddst_win_create(void) {
	int rc = MPI_Win_create_dynamic(MPI_INFO_NULL, MPI_COMM_WORLD, &ddst_win);
	if (rc != MPI_SUCCESS) return rc;
	MPI_Win_set_errhandler(ddst_win, MPI_ERRORS_RETURN);
	rc = MPI_Win_lock_all(MPI_MODE_NOCHECK, ddst_win);
	if (rc != MPI_SUCCESS) {
		MPI_Win_free(&ddst_win);
		return rc;
	}
	ddst_windowed = 1;
	return MPI_SUCCESS;
}

int ddst_attach(void *p, MPI_Aint n, MPI_Aint *addr) {
	int rc = MPI_Win_attach(ddst_win, p, n);
	if (rc != MPI_SUCCESS) return rc;
	return MPI_Get_address(p, addr);
}

int ddst_detach(void *p) { return MPI_Win_detach(ddst_win, p); }

// ddst_finish ends a batch of gets from target, rc saying how issuing them
// went: a flush, then the ntok token words into got and another flush.
static int ddst_finish(int target, int rc, int ntok, MPI_Aint *tok, uint64_t *got) {
	int frc = MPI_Win_flush(target, ddst_win);
	if (rc != MPI_SUCCESS) return rc;
	if (frc != MPI_SUCCESS) return frc;
	for (int i = 0; i < ntok && rc == MPI_SUCCESS; i++)
		rc = MPI_Get(&got[i], 8, MPI_BYTE, target, tok[i], 8, MPI_BYTE, ddst_win);
	frc = MPI_Win_flush(target, ddst_win);
	if (rc != MPI_SUCCESS) return rc;
	return frc;
}

// ddst_fetch moves one batch from target: n gets, one flush, then the
// ntok token words into got, another flush. The caller compares got.
int ddst_fetch(int target, int n, uintptr_t *dst, MPI_Aint *src, int *len,
		int ntok, MPI_Aint *tok, uint64_t *got) {
	int rc = MPI_SUCCESS, i;
	for (i = 0; i < n && rc == MPI_SUCCESS; i++)
		rc = MPI_Get((void *)dst[i], len[i], MPI_BYTE, target, src[i], len[i], MPI_BYTE, ddst_win);
	return ddst_finish(target, rc, ntok, tok, got);
}

// ddst_fetch_shards moves one batch from target with one get per shard:
// shard s (base[s]) gives count[s] pieces, piece i being len[i] bytes from
// base[s] + tdisp[i] to local address odisp[i], described by two hindexed
// datatypes; then one flush, and the tokens as in ddst_fetch.
int ddst_fetch_shards(int target, int nshard, MPI_Aint *base, int *count,
		MPI_Aint *odisp, MPI_Aint *tdisp, int *len, int ntok, MPI_Aint *tok, uint64_t *got) {
	int rc = MPI_SUCCESS, s, off = 0;
	for (s = 0; s < nshard && rc == MPI_SUCCESS; off += count[s], s++) {
		if (count[s] == 1) {
			rc = MPI_Get((void *)odisp[off], len[off], MPI_BYTE, target, base[s] + tdisp[off], len[off], MPI_BYTE, ddst_win);
			continue;
		}
		MPI_Datatype ot, tt;
		rc = MPI_Type_create_hindexed(count[s], len + off, odisp + off, MPI_BYTE, &ot);
		if (rc != MPI_SUCCESS) break;
		rc = MPI_Type_create_hindexed(count[s], len + off, tdisp + off, MPI_BYTE, &tt);
		if (rc != MPI_SUCCESS) {
			MPI_Type_free(&ot);
			break;
		}
		MPI_Type_commit(&ot);
		MPI_Type_commit(&tt);
		rc = MPI_Get(MPI_BOTTOM, 1, ot, target, base[s], 1, tt, ddst_win);
		// MPI keeps what the get needs until it completes.
		MPI_Type_free(&ot);
		MPI_Type_free(&tt);
	}
	return ddst_finish(target, rc, ntok, tok, got);
}

// ddst_progress_loop enters MPI every ns nanoseconds until
// ddst_progress_end, so that implementations whose passive target moves
// only inside the library (MPICH over UCX: gets of dynamic windows are
// active messages the target answers) serve other agents' gets while this
// one is idle. It sleeps in nanosleep, whose precision a Go timer lacks
// (an idle Go program wakes its timers at millisecond granularity).
static int ddst_progress_stop;

void ddst_progress_loop(int64_t ns) {
	struct timespec every = { ns / 1000000000, ns % 1000000000 };
	int flag;
	while (!__atomic_load_n(&ddst_progress_stop, __ATOMIC_ACQUIRE)) {
		MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
		nanosleep(&every, NULL);
	}
}

void ddst_progress_end(void) {
	__atomic_store_n(&ddst_progress_stop, 1, __ATOMIC_RELEASE);
}

// ddst_finalize frees the window and, if this transport started MPI,
// ends it. Both are collective: every agent of the world must get here.
int ddst_finalize(int ours) {
	int rc = MPI_SUCCESS;
	if (ddst_windowed) {
		MPI_Win_unlock_all(ddst_win);
		rc = MPI_Win_free(&ddst_win);
		ddst_windowed = 0;
	}
	if (ours) {
		int frc = MPI_Finalize();
		if (rc == MPI_SUCCESS) rc = frc;
	}
	return rc;
}

int ddst_is_range_error(int code) {
	int class = 0;
	MPI_Error_class(code, &class);
	return class == MPI_ERR_RMA_RANGE;
}

void ddst_error_string(int code, char *buf, int *len) {
	if (MPI_Error_string(code, buf, len) != MPI_SUCCESS) *len = 0;
}

int ddst_thread_multiple(void) { return MPI_THREAD_MULTIPLE; }
int ddst_aint_size(void) { return (int)sizeof(MPI_Aint); }
