//go:build fabric && cgo

// The C side of the libfabric transport: see fabric_calls.h and fabric.go.

#include <string.h>
#include <time.h>

#include "fabric_calls.h"

struct ddsf {
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_av *av;
	struct fid_cq *cq;
	struct fid_ep *ep;
};

// ddsf_batch is the context of every read of one batch: whoever polls the
// completion queue (the reader, or the progress loop) counts it down.
typedef struct {
	int64_t left;
	int err;
	int64_t deadline; // CLOCK_MONOTONIC ns
	fi_addr_t peer;
} ddsf_batch;

// The libfabric this process runs with: major << 16 | minor.
uint32_t ddsf_version(void) {
	uint32_t v = fi_version();
	return FI_MAJOR(v) << 16 | FI_MINOR(v);
}

static int64_t ddsf_now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

void ddsf_free(ddsf *f) {
	if (f->ep) fi_close(&f->ep->fid);
	if (f->av) fi_close(&f->av->fid);
	if (f->cq) fi_close(&f->cq->fid);
	if (f->domain) fi_close(&f->domain->fid);
	if (f->fabric) fi_close(&f->fabric->fid);
	if (f->info) fi_freeinfo(f->info);
	free(f);
}

// ddsf_open opens an RDM endpoint of provider prov (NULL: any) that can
// serve and issue RMA reads, with the memory-registration modes this
// transport handles (no FI_MR_LOCAL: reads land in unregistered memory).
int ddsf_open(const char *prov, ddsf **out, const char **step) {
	struct fi_info *hints = fi_allocinfo();
	if (!hints) return -FI_ENOMEM;
	hints->caps = FI_RMA | FI_READ | FI_REMOTE_READ;
	hints->ep_attr->type = FI_EP_RDM;
	hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	hints->domain_attr->threading = FI_THREAD_SAFE;
	if (prov && *prov) hints->fabric_attr->prov_name = strdup(prov);
	ddsf *f = calloc(1, sizeof *f);
	*step = "fi_getinfo";
	int rc = fi_getinfo(FI_VERSION(1, 9), NULL, NULL, 0, hints, &f->info);
	fi_freeinfo(hints);
	if (rc) { free(f); return rc; }
	*step = "fi_fabric";
	if ((rc = fi_fabric(f->info->fabric_attr, &f->fabric, NULL))) goto fail;
	*step = "fi_domain";
	if ((rc = fi_domain(f->fabric, f->info, &f->domain, NULL))) goto fail;
	struct fi_cq_attr cq = {0};
	cq.format = FI_CQ_FORMAT_CONTEXT;
	cq.wait_obj = FI_WAIT_UNSPEC; // the progress loop sleeps in fi_cq_sread
	cq.wait_cond = FI_CQ_COND_NONE;
	cq.size = 4096;
	*step = "fi_cq_open";
	if ((rc = fi_cq_open(f->domain, &cq, &f->cq, NULL))) goto fail;
	struct fi_av_attr av = {0};
	av.type = FI_AV_TABLE;
	*step = "fi_av_open";
	if ((rc = fi_av_open(f->domain, &av, &f->av, NULL))) goto fail;
	*step = "fi_endpoint";
	if ((rc = fi_endpoint(f->domain, f->info, &f->ep, NULL))) goto fail;
	*step = "fi_ep_bind";
	if ((rc = fi_ep_bind(f->ep, &f->av->fid, 0))) goto fail;
	if ((rc = fi_ep_bind(f->ep, &f->cq->fid, FI_TRANSMIT | FI_RECV))) goto fail;
	*step = "fi_enable";
	if ((rc = fi_enable(f->ep))) goto fail;
	*out = f;
	return 0;
fail:
	ddsf_free(f);
	return rc;
}

const char *ddsf_prov(ddsf *f) { return f->info->fabric_attr->prov_name; }
int ddsf_virt(ddsf *f) { return (f->info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0; }
int ddsf_provkey(ddsf *f) { return (f->info->domain_attr->mr_mode & FI_MR_PROV_KEY) != 0; }
int ddsf_manual(ddsf *f) { return f->info->domain_attr->data_progress == FI_PROGRESS_MANUAL; }

int ddsf_name(ddsf *f, void *buf, size_t *len) { return fi_getname(&f->ep->fid, buf, len); }

int ddsf_insert(ddsf *f, void *name, fi_addr_t *addr) {
	int n = fi_av_insert(f->av, name, 1, addr, 0, NULL);
	return n == 1 ? 0 : (n < 0 ? n : -FI_EINVAL);
}

int ddsf_reg(ddsf *f, void *p, size_t n, uint64_t key, struct fid_mr **mr, uint64_t *gotkey) {
	int rc = fi_mr_reg(f->domain, p, n, FI_REMOTE_READ, 0, key, 0, mr, NULL);
	if (rc) return rc;
	*gotkey = fi_mr_key(*mr);
	return 0;
}

int ddsf_unreg(struct fid_mr *mr) { return fi_close(&mr->fid); }

// ddsf_count counts down the batches of n completions.
static void ddsf_count(struct fi_cq_entry *e, ssize_t n) {
	for (ssize_t i = 0; i < n; i++) {
		ddsf_batch *b = e[i].op_context;
		if (b) __atomic_sub_fetch(&b->left, 1, __ATOMIC_SEQ_CST);
	}
}

// ddsf_poll reads what the completion queue holds (which also makes a
// provider with manual progress serve the reads other agents asked for):
// how many completions it read, 0 if none, or an error.
static int ddsf_poll(ddsf *f) {
	struct fi_cq_entry e[32];
	ssize_t n = fi_cq_read(f->cq, e, 32);
	if (n > 0) {
		for (ssize_t i = 0; i < n; i++) {
			ddsf_batch *b = e[i].op_context;
			if (b) __atomic_sub_fetch(&b->left, 1, __ATOMIC_SEQ_CST);
		}
		return (int)n;
	}
	if (n == -FI_EAVAIL) {
		struct fi_cq_err_entry ee;
		memset(&ee, 0, sizeof ee);
		if (fi_cq_readerr(f->cq, &ee, 0) <= 0) return 0;
		ddsf_batch *b = ee.op_context;
		if (b) {
			__atomic_store_n(&b->err, ee.err ? ee.err : FI_EIO, __ATOMIC_SEQ_CST);
			__atomic_sub_fetch(&b->left, 1, __ATOMIC_SEQ_CST);
		}
		return 1;
	}
	return n == -FI_EAGAIN ? 0 : (int)n;
}

// ddsf_progress polls for about usec microseconds (the progress loop: one
// cgo call per period, not per poll).
void ddsf_progress(ddsf *f, int usec) {
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		// Sleep in the provider's wait object (its sockets, for tcp):
		// woken by a peer's request, which the call then serves.
		struct fi_cq_entry e[32];
		ssize_t n = fi_cq_sread(f->cq, e, 32, NULL, 1);
		if (n > 0) {
			ddsf_count(e, n);
		} else if (n == -FI_EAVAIL) {
			ddsf_poll(f);
		} else if (n != -FI_EAGAIN && n != -FI_ETIMEDOUT) {
			struct timespec nap = {0, 20000};
			ddsf_poll(f);
			nanosleep(&nap, NULL);
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((t.tv_sec - t0.tv_sec) * 1000000 + (t.tv_nsec - t0.tv_nsec) / 1000 >= usec) return;
	}
}

// ddsf_late says whether b should give up: past its deadline (a peer
// gone: tcp;ofi_rxm retries a lost connection without end, and taking the
// peer out of the address vector with reads queued crashes it). The batch
// then returns DDSF_TIMEOUT and b is left allocated: its queued reads may
// still complete and count it down.
static int ddsf_late(ddsf *f, ddsf_batch *b) {
	(void)f;
	return ddsf_now() >= b->deadline;
}

// ddsf_issue reads n pieces into b's count, retrying while the provider's
// queues are full; every issued read completes on the CQ (b->left).
static int ddsf_issue(ddsf *f, fi_addr_t peer, ddsf_batch *b, int n, uintptr_t *dst, uint64_t *src, uint64_t *len, uint64_t *key) {
	for (int i = 0; i < n; i++) {
		__atomic_add_fetch(&b->left, 1, __ATOMIC_SEQ_CST);
		for (;;) {
			ssize_t rc = fi_read(f->ep, (void *)dst[i], len[i], NULL, peer, src[i], key[i], b);
			if (rc == 0) break;
			if (rc != -FI_EAGAIN) {
				__atomic_sub_fetch(&b->left, 1, __ATOMIC_SEQ_CST);
				return (int)rc;
			}
			ddsf_poll(f);
			if (ddsf_late(f, b)) {
				__atomic_sub_fetch(&b->left, 1, __ATOMIC_SEQ_CST);
				return DDSF_TIMEOUT;
			}
		}
	}
	return 0;
}

// ddsf_wait waits until every read of b completed, or b is late.
static int ddsf_wait(ddsf *f, ddsf_batch *b) {
	int spins = 0;
	while (__atomic_load_n(&b->left, __ATOMIC_SEQ_CST) > 0) {
		int rc = ddsf_poll(f);
		if (rc < 0) return rc;
		if (rc > 0 || ++spins < 256) continue;
		spins = 0;
		if (ddsf_late(f, b)) return DDSF_TIMEOUT;
	}
	int err = __atomic_load_n(&b->err, __ATOMIC_SEQ_CST);
	return err ? -err : 0;
}

// ddsf_tokens reads the ntok token words into got and checks that each
// still holds id.
static int ddsf_tokens(ddsf *f, fi_addr_t peer, ddsf_batch *b, int ntok, uint64_t *tok, uint64_t tokkey, uint64_t *got, uint64_t id) {
	int rc = 0;
	for (int i = 0; i < ntok && rc == 0; i++) {
		got[i] = 0;
		__atomic_add_fetch(&b->left, 1, __ATOMIC_SEQ_CST);
		for (;;) {
			ssize_t r = fi_read(f->ep, &got[i], 8, NULL, peer, tok[i], tokkey, b);
			if (r == 0) break;
			if (r != -FI_EAGAIN) {
				__atomic_sub_fetch(&b->left, 1, __ATOMIC_SEQ_CST);
				rc = (int)r;
				break;
			}
			ddsf_poll(f);
			if (ddsf_late(f, b)) {
				__atomic_sub_fetch(&b->left, 1, __ATOMIC_SEQ_CST);
				rc = DDSF_TIMEOUT;
				break;
			}
		}
	}
	int wrc = ddsf_wait(f, b);
	if (wrc == DDSF_TIMEOUT || rc == DDSF_TIMEOUT) return DDSF_TIMEOUT;
	if (rc) return rc;
	if (wrc) return wrc;
	for (int i = 0; i < ntok; i++)
		if (got[i] != id) return DDSF_STALE;
	return 0;
}

// ddsf_fetch moves one batch from peer: the tokens (a shard withdrawn
// already is not read: its region closes a grace period later, and a read
// of a closed region breaks the connection on some providers), n reads of
// rows, then the tokens again, which must still hold id.
static int ddsf_fetch1(ddsf *f, ddsf_batch *b, int n, uintptr_t *dst, uint64_t *src, uint64_t *len, uint64_t *key,
		int ntok, uint64_t *tok, uint64_t tokkey, uint64_t *got, uint64_t id) {
	int rc = ddsf_tokens(f, b->peer, b, ntok, tok, tokkey, got, id);
	if (rc) return rc;
	rc = ddsf_issue(f, b->peer, b, n, dst, src, len, key);
	int wrc = ddsf_wait(f, b);
	if (wrc == DDSF_TIMEOUT || rc == DDSF_TIMEOUT) return DDSF_TIMEOUT;
	if (rc) return rc;
	if (wrc) return wrc;
	return ddsf_tokens(f, b->peer, b, ntok, tok, tokkey, got, id);
}

// ddsf_fetch runs ddsf_fetch1 with a batch that outlives a timeout; got
// must be C memory (a late token read lands there). The rows land in a
// bounce buffer of C memory first and are copied to dst only when every
// read completed and the tokens still hold id: after a timeout, reads still
// queued in the provider may complete later, and they must never write
// into dst (the client's receive region, reused for other rows or unmapped
// by then). On a timeout the batch, the bounce buffer and its address list
// are left allocated for those late completions.
int ddsf_fetch(ddsf *f, fi_addr_t peer, int64_t timeout_ns, int n, uintptr_t *dst, uint64_t *src, uint64_t *len, uint64_t *key,
		int ntok, uint64_t *tok, uint64_t tokkey, uint64_t *got, uint64_t id) {
	ddsf_batch *b = calloc(1, sizeof *b);
	if (!b) return -FI_ENOMEM;
	size_t total = 0;
	for (int i = 0; i < n; i++) total += len[i];
	char *bounce = malloc(total ? total : 1);
	uintptr_t *bdst = malloc((n ? n : 1) * sizeof *bdst);
	if (!bounce || !bdst) {
		free(b); free(bounce); free(bdst);
		return -FI_ENOMEM;
	}
	size_t off = 0;
	for (int i = 0; i < n; i++) {
		bdst[i] = (uintptr_t)(bounce + off);
		off += len[i];
	}
	b->peer = peer;
	b->deadline = ddsf_now() + timeout_ns;
	int rc = ddsf_fetch1(f, b, n, bdst, src, len, key, ntok, tok, tokkey, got, id);
	if (rc == 0)
		for (int i = 0; i < n; i++) memcpy((void *)dst[i], (void *)bdst[i], len[i]);
	if (rc != DDSF_TIMEOUT) {
		free(b); free(bounce); free(bdst);
	}
	return rc;
}
