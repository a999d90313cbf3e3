/* A program written as seed 003 expects ("verbs: Introduce non-contiguous
 * memory registration"): it includes only <infiniband/verbs.h>, where the
 * seed declares ibv_rereg_mr_interleaved and ibv_rereg_mr_sg, and is
 * compiled with -I<dropin>/include alone (the drop-in's infiniband/verbs.h
 * adds them to the system header), never naming uroce.h. It reads a matrix
 * column and a composite region through the new keys, and checks the
 * entry limits (ENOMEM, also in errno): 4096 SGEs fit, 4097 do not; 4095
 * interleaved entries fit, 4096 do not. Exits non-zero with a message on
 * the first failed check; prints "all ok" at the end. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "check.h"
#include "wait.h"
#include "connect.h"

#ifdef UROCE_H
#error "uroce.h must not be included: the seed's declarations come from verbs.h"
#endif

#define ALL (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static struct ibv_cq *cq;
static struct ibv_qp *qp[2];

/* An RDMA READ by qp[0] of `len` bytes at offset `off` of `rkey` into `dst`. */
static void read_into(void *dst, uint32_t len, uint32_t lkey, uint64_t off, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)dst, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.rdma.remote_addr = off;
	wr.wr.rdma.rkey = rkey;
	CHECK(ibv_post_send(qp[0], &wr, &bad) == 0, "post_send");
	struct ibv_wc wc = wait_wc(cq);
	CHECK(wc.status == IBV_WC_SUCCESS, "RDMA READ: %s", ibv_wc_status_str(wc.status));
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(pd && cq, "pd/cq");
	rc_pair(pd, cq, 8, 1, qp);

	/* The seed's matrix: column COL of N rows of M 8-byte cells. */
	enum { N = 32, M = 100, COL = 7, C = 8 };
	uint64_t *mat = calloc((size_t)N * M, C);
	uint64_t *flat = calloc(N, C);
	char *scratch = calloc(1, 4096);
	CHECK(mat && flat && scratch, "alloc");
	for (size_t i = 0; i < (size_t)N * M; i++)
		mat[i] = i;
	struct ibv_mr *mmr = ibv_reg_mr(pd, mat, (size_t)N * M * C, ALL);
	struct ibv_mr *fmr = ibv_reg_mr(pd, flat, N * C, ALL);
	struct ibv_mr *col = ibv_reg_mr(pd, scratch, 4096, ALL);
	CHECK(mmr && fmr && col, "reg_mr: %s", strerror(errno));
	struct ibv_mr_interleaved e = { .addr = (uintptr_t)&mat[COL], .bytes_count = C, .stride = M * C,
					.lkey = mmr->lkey };
	CHECK(ibv_rereg_mr_interleaved(col, ALL, N, 1, &e) == 0, "rereg_mr_interleaved: %s", strerror(errno));
	CHECK(col->addr == NULL && col->length == N * C, "column MR: %p %zu", col->addr, col->length);
	read_into(flat, N * C, fmr->lkey, 0, col->rkey);
	for (int r = 0; r < N; r++)
		CHECK(flat[r] == (uint64_t)r * M + COL, "row %d: %lu", r, (unsigned long)flat[r]);

	/* A composite region: row 1 then row 0 of the matrix. */
	struct ibv_sge sg[2] = { { .addr = (uintptr_t)&mat[M], .length = 16, .lkey = mmr->lkey },
				 { .addr = (uintptr_t)&mat[0], .length = 16, .lkey = mmr->lkey } };
	CHECK(ibv_rereg_mr_sg(col, ALL, 2, sg) == 0, "rereg_mr_sg: %s", strerror(errno));
	CHECK(col->addr == NULL && col->length == 32, "composite MR: %zu", col->length);
	read_into(flat, 32, fmr->lkey, 0, col->rkey);
	CHECK(flat[0] == M && flat[1] == M + 1 && flat[2] == 0 && flat[3] == 1, "composite: %lu %lu %lu %lu",
	      (unsigned long)flat[0], (unsigned long)flat[1], (unsigned long)flat[2], (unsigned long)flat[3]);

	/* The limits: one byte of the matrix per entry. */
	enum { MAX = 4096 };
	struct ibv_sge *many = calloc(MAX + 1, sizeof(*many));
	struct ibv_mr_interleaved *ie = calloc(MAX, sizeof(*ie));
	CHECK(many && ie, "alloc");
	for (int i = 0; i <= MAX; i++)
		many[i] = (struct ibv_sge){ .addr = (uintptr_t)mat + i, .length = 1, .lkey = mmr->lkey };
	for (int i = 0; i < MAX; i++)
		ie[i] = (struct ibv_mr_interleaved){ .addr = (uintptr_t)mat + i, .bytes_count = 1, .stride = 1,
						     .lkey = mmr->lkey };
	errno = 0;
	int rc = ibv_rereg_mr_sg(col, ALL, MAX + 1, many);
	CHECK(rc == ENOMEM && errno == ENOMEM, "4097 SGEs: %d, errno %d", rc, errno);
	CHECK(col->length == 32, "unchanged after ENOMEM");
	CHECK(ibv_rereg_mr_sg(col, ALL, MAX, many) == 0, "4096 SGEs: %s", strerror(errno));
	CHECK(col->length == MAX, "4096 SGEs: length %zu", col->length);
	errno = 0;
	rc = ibv_rereg_mr_interleaved(col, ALL, 1, MAX, ie);
	CHECK(rc == ENOMEM && errno == ENOMEM, "4096 interleaved entries: %d, errno %d", rc, errno);
	CHECK(ibv_rereg_mr_interleaved(col, ALL, 1, MAX - 1, ie) == 0, "4095 interleaved entries: %s",
	      strerror(errno));
	CHECK(col->length == MAX - 1, "4095 entries: length %zu", col->length);

	CHECK(ibv_dereg_mr(col) == 0 && ibv_dereg_mr(fmr) == 0 && ibv_dereg_mr(mmr) == 0, "dereg");
	CHECK(ibv_destroy_qp(qp[0]) == 0 && ibv_destroy_qp(qp[1]) == 0 && ibv_destroy_cq(cq) == 0, "destroy");
	CHECK(ibv_dealloc_pd(pd) == 0 && ibv_close_device(ctx) == 0, "close");
	ibv_free_device_list(list);
	free(many);
	free(ie);
	free(mat);
	free(flat);
	free(scratch);
	printf("all ok\n");
	return 0;
}
