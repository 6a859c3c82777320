//go:build fabric && cgo

// The C side of the libfabric transport (fabric.go): opening an endpoint,
// registering memory, the progress loop, and a whole batch of reads in
// one call.

#ifndef DDSF_FABRIC_CALLS_H
#define DDSF_FABRIC_CALLS_H

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_errno.h>
#include <stdint.h>
#include <stdlib.h>

// DDSF_STALE: a token no longer held the table id (the shard was
// withdrawn while being read); DDSF_TIMEOUT: a batch had no completion by
// its deadline.
enum { DDSF_STALE = -100000, DDSF_TIMEOUT = -100001 };

// ddsf is one agent's endpoint and what it needs: fabric, domain, address
// vector, completion queue.
typedef struct ddsf ddsf;

uint32_t ddsf_version(void);
void ddsf_free(ddsf *f);
int ddsf_open(const char *prov, ddsf **out, const char **step);
const char *ddsf_prov(ddsf *f);
int ddsf_virt(ddsf *f);
int ddsf_provkey(ddsf *f);
int ddsf_manual(ddsf *f);
int ddsf_name(ddsf *f, void *buf, size_t *len);
int ddsf_insert(ddsf *f, void *name, fi_addr_t *addr);
int ddsf_reg(ddsf *f, void *p, size_t n, uint64_t key, struct fid_mr **mr, uint64_t *gotkey);
int ddsf_unreg(struct fid_mr *mr);
void ddsf_progress(ddsf *f, int usec);
int ddsf_fetch(ddsf *f, fi_addr_t peer, int64_t timeout_ns, int n, uintptr_t *dst, uint64_t *src, uint64_t *len, uint64_t *key,
		int ntok, uint64_t *tok, uint64_t tokkey, uint64_t *got, uint64_t id);

#endif
