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

// ddst_get_shard gets count pieces of one shard of target at base: piece
// i is len[i] bytes from base + tdisp[i] to local address odisp[i]. One
// piece is a plain get; more are one get of two hindexed datatypes (MPI
// looks the dynamic window's attachment up once for it, not once a piece).
static int ddst_get_shard(int target, MPI_Aint base, int count, int *len, MPI_Aint *odisp, MPI_Aint *tdisp) {
	if (count == 1)
		return MPI_Get((void *)odisp[0], len[0], MPI_BYTE, target, base + tdisp[0], len[0], MPI_BYTE, ddst_win);
	MPI_Datatype ot, tt;
	int rc = MPI_Type_create_hindexed(count, len, odisp, MPI_BYTE, &ot);
	if (rc != MPI_SUCCESS) return rc;
	rc = MPI_Type_create_hindexed(count, len, tdisp, MPI_BYTE, &tt);
	if (rc != MPI_SUCCESS) {
		MPI_Type_free(&ot);
		return rc;
	}
	MPI_Type_commit(&ot);
	MPI_Type_commit(&tt);
	rc = MPI_Get(MPI_BOTTOM, 1, ot, target, base, 1, tt, ddst_win);
	// MPI keeps what the get needs until it completes.
	MPI_Type_free(&ot);
	MPI_Type_free(&tt);
	return rc;
}

// ddst_flush completes every get issued to the ntarget targets: one
// MPI_Win_flush for one target, else one MPI_Win_flush_all.
static int ddst_flush(int ntarget, const int *target) {
	if (ntarget == 1) return MPI_Win_flush(target[0], ddst_win);
	return MPI_Win_flush_all(ddst_win);
}

// ddst_fetch_batch moves one batch from ntarget targets in the window's
// one epoch: every target's row gets, one flush for all of them, then
// every target's token words into got, and one more flush. Target t
// (target[t]) is read either by nget[t] plain gets (dst, src, len: a
// piece each) or, where nshard[t] > 0, by a get per shard (shard s at
// base[s] gives count[s] pieces of odisp, tdisp and glen: ddst_get_shard);
// its ntok[t] tokens follow. rcs[t] says how target t's gets went (a
// failed one stops that target's, not the others'); the return value is
// the flushes'. The caller compares got.
int ddst_fetch_batch(int ntarget, const int *target,
		const int *nget, uintptr_t *dst, MPI_Aint *src, int *len,
		const int *nshard, MPI_Aint *base, int *count, MPI_Aint *odisp, MPI_Aint *tdisp, int *glen,
		const int *ntok, MPI_Aint *tok, uint64_t *got, int *rcs) {
	int g = 0, s = 0, piece = 0, k = 0, t, i, rc;
	for (t = 0; t < ntarget; t++) {
		rc = MPI_SUCCESS;
		for (i = 0; i < nget[t]; i++, g++)
			if (rc == MPI_SUCCESS)
				rc = MPI_Get((void *)dst[g], len[g], MPI_BYTE, target[t], src[g], len[g], MPI_BYTE, ddst_win);
		for (i = 0; i < nshard[t]; piece += count[s], i++, s++)
			if (rc == MPI_SUCCESS)
				rc = ddst_get_shard(target[t], base[s], count[s], glen + piece, odisp + piece, tdisp + piece);
		rcs[t] = rc;
	}
	rc = ddst_flush(ntarget, target);
	if (rc != MPI_SUCCESS) return rc;
	for (t = 0; t < ntarget; k += ntok[t], t++)
		for (i = 0; i < ntok[t] && rcs[t] == MPI_SUCCESS; i++)
			rcs[t] = MPI_Get(&got[k + i], 8, MPI_BYTE, target[t], tok[k + i], 8, MPI_BYTE, ddst_win);
	return ddst_flush(ntarget, target);
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
