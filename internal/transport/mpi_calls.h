//go:build mpi && cgo

// The C side of the MPI transport (mpi.go): every MPI call the transport
// makes, each batch of gets in one call. The MPI it links is set in
// mpi_flags*.go.

#ifndef DDST_MPI_CALLS_H
#define DDST_MPI_CALLS_H

#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>

// DDST_STALE: a token no longer held the table id (the shard left the
// window while being read).
enum { DDST_STALE = -2 };

void ddst_library(char *buf, int *len);
int ddst_init(int *provided, int *rank, int *size, int *ours);
int ddst_bcast_u64(uint64_t *v);
int ddst_barrier(void);
int ddst_allgather_u64(uint64_t *mine, int n, uint64_t *all);
int ddst_win_create(void);
int ddst_attach(void *p, MPI_Aint n, MPI_Aint *addr);
int ddst_detach(void *p);
int ddst_fetch_batch(int ntarget, const int *target,
		const int *nget, uintptr_t *dst, MPI_Aint *src, int *len,
		const int *nshard, MPI_Aint *base, int *count, MPI_Aint *odisp, MPI_Aint *tdisp, int *glen,
		const int *ntok, MPI_Aint *tok, uint64_t *got, int *rcs);
void ddst_progress_loop(int64_t ns);
void ddst_progress_end(void);
int ddst_finalize(int ours);
int ddst_is_range_error(int code);
void ddst_error_string(int code, char *buf, int *len);
int ddst_thread_multiple(void);
int ddst_aint_size(void);

#endif
