/* Seed 003's non-contiguous registration verbs through the drop-in C ABI
 * (uroce.h: ibv_rereg_mr_interleaved, ibv_rereg_mr_sg), the seed's two
 * examples: a column of a matrix whose rows exceed 64 KiB, and a composite
 * region over N MRs; each used as the key of SEND, RECV, RDMA WRITE/READ and
 * atomics. Two RC QPs of one device, connected to each other. Exits
 * non-zero with a message on the first failed check. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include "uroce.h"

#include "check.h"
#include "wait.h"
#include "connect.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qp[2];

static void fresh_qps(void)
{
	rc_pair(pd, cq, 64, 4, qp);
}

/* One one-sided op from qp[0]; returns the completion status (the QPs are
 * reconnected after an error). */
static int rdma(enum ibv_wr_opcode op, uint64_t laddr, uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey,
		uint64_t add)
{
	struct ibv_sge sge = { .addr = laddr, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = add;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	int rc = ibv_post_send(qp[0], &wr, &bad);
	CHECK(rc == 0, "post_send op %d len %u: %s", op, len, strerror(rc));
	int st = wait_wc(cq).status;
	if (st != IBV_WC_SUCCESS)
		fresh_qps();
	return st;
}

/* A SEND from qp[0] (laddr/len/lkey) into a receive on qp[1] (raddr/rlen/rkey). */
static void send_recv(uint64_t laddr, uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rlen, uint32_t rkey)
{
	struct ibv_sge rs = { .addr = raddr, .length = rlen, .lkey = rkey };
	struct ibv_recv_wr rw = { .wr_id = 2, .sg_list = &rs, .num_sge = 1 }, *rbad;
	CHECK(ibv_post_recv(qp[1], &rw, &rbad) == 0, "post_recv");
	struct ibv_sge ss = { .addr = laddr, .length = len, .lkey = lkey };
	struct ibv_send_wr sw = { .wr_id = 1, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *sbad;
	CHECK(ibv_post_send(qp[0], &sw, &sbad) == 0, "post_send");
	for (int i = 0; i < 2; i++) {
		struct ibv_wc wc = wait_wc(cq);
		CHECK(wc.status == IBV_WC_SUCCESS, "send/recv wr %lu: %s", (unsigned long)wc.wr_id,
		      ibv_wc_status_str(wc.status));
		if (wc.wr_id == 2)
			CHECK(wc.byte_len == len, "byte_len %u", wc.byte_len);
	}
}

#define ALL (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

/* The seed's first example: column COL of an N x M matrix of 8-byte cells
 * whose rows are 100 KiB long (past any 16-bit stride). */
static void test_matrix_column(void)
{
	enum { N = 64, M = 12800, COL = 3, C = 8 };
	uint64_t *mat = aligned_alloc(4096, (size_t)N * M * C);
	CHECK(mat, "alloc");
	for (size_t i = 0; i < (size_t)N * M; i++)
		mat[i] = i;
	struct ibv_mr *mmr = ibv_reg_mr(pd, mat, (size_t)N * M * C, ALL);
	uint64_t *flat = calloc(N, C);
	struct ibv_mr *fmr = ibv_reg_mr(pd, flat, N * C, ALL);
	/* Any MR becomes the column: here one over a scratch page. */
	char *scratch = malloc(4096);
	struct ibv_mr *col = ibv_reg_mr(pd, scratch, 4096, ALL);
	CHECK(mmr && fmr && col, "reg_mr: %s", strerror(errno));
	uint32_t old_rkey = col->rkey;

	struct ibv_mr_interleaved e = { .addr = (uintptr_t)&mat[COL], .bytes_count = C, .stride = M * C,
					.lkey = mmr->lkey };
	/* Checked completely before anything changes. */
	struct ibv_mr_interleaved shortstride = e;
	shortstride.stride = C - 1;
	CHECK(ibv_rereg_mr_interleaved(col, ALL, N, 1, &shortstride) == EINVAL && errno == EINVAL, "stride < cell");
	struct ibv_mr_interleaved huge = e;
	huge.stride = (1ull << 33);
	CHECK(ibv_rereg_mr_interleaved(col, ALL, N, 1, &huge) == EINVAL, "stride beyond 32 bits");
	CHECK(ibv_rereg_mr_interleaved(col, IBV_ACCESS_MW_BIND, N, 1, &e) == EINVAL, "bad access");
	CHECK(ibv_rereg_mr_interleaved(col, ALL, 0, 1, &e) == EINVAL, "repeat 0");
	CHECK(ibv_rereg_mr_interleaved(col, ALL, N, 0, &e) == EINVAL, "no entries");
	struct ibv_mr_interleaved self = { .addr = 0, .bytes_count = 8, .stride = 8, .lkey = col->lkey };
	CHECK(ibv_rereg_mr_interleaved(col, ALL, 1, 1, &self) == EINVAL, "names itself");
	CHECK(col->addr == scratch && col->length == 4096 && col->rkey == old_rkey, "unchanged after errors");

	CHECK(ibv_rereg_mr_interleaved(col, ALL, N, 1, &e) == 0, "rereg_mr_interleaved: %s", strerror(errno));
	CHECK(col->addr == NULL && col->length == N * C, "column MR fields: %p %zu", col->addr, col->length);
	CHECK(col->lkey == col->rkey && col->rkey != old_rkey, "new key");

	/* RDMA READ of the column into a contiguous buffer. */
	CHECK(rdma(IBV_WR_RDMA_READ, (uintptr_t)flat, N * C, fmr->lkey, 0, col->rkey, 0) == IBV_WC_SUCCESS, "read");
	for (int r = 0; r < N; r++)
		CHECK(flat[r] == (uint64_t)r * M + COL, "read row %d: %lu", r, (unsigned long)flat[r]);
	/* RDMA WRITE into the column (from offset 8: rows 1..N-1). */
	for (int r = 0; r < N; r++)
		flat[r] = 1000000 + r;
	CHECK(rdma(IBV_WR_RDMA_WRITE, (uintptr_t)flat, (N - 1) * C, fmr->lkey, C, col->rkey, 0) == IBV_WC_SUCCESS,
	      "write");
	CHECK(mat[COL] == COL, "row 0 untouched");
	for (int r = 1; r < N; r++) {
		CHECK(mat[(size_t)r * M + COL] == 1000000 + (uint64_t)r - 1, "write row %d", r);
		CHECK(mat[(size_t)r * M + COL + 1] == (uint64_t)r * M + COL + 1, "neighbour of row %d", r);
	}
	/* An atomic on the cell of row 5. */
	uint64_t *old = &flat[0];
	uint64_t before = mat[5 * M + COL];
	CHECK(rdma(IBV_WR_ATOMIC_FETCH_AND_ADD, (uintptr_t)old, 8, fmr->lkey, 5 * C, col->rkey, 7) == IBV_WC_SUCCESS,
	      "fetch-add");
	CHECK(*old == before && mat[5 * M + COL] == before + 7, "atomic %lu", (unsigned long)*old);
	/* SEND gathering the column (local key); RECV scattering into it. */
	memset(flat, 0, N * C);
	send_recv(0, N * C, col->lkey, (uintptr_t)flat, N * C, fmr->lkey);
	for (int r = 0; r < N; r++)
		CHECK(flat[r] == mat[(size_t)r * M + COL], "send row %d", r);
	for (int r = 0; r < N; r++)
		flat[r] = 7000 + r;
	send_recv((uintptr_t)flat, N * C, fmr->lkey, 0, N * C, col->lkey);
	for (int r = 0; r < N; r++)
		CHECK(mat[(size_t)r * M + COL] == 7000 + (uint64_t)r, "recv row %d", r);
	/* Bounds and the old key. */
	CHECK(rdma(IBV_WR_RDMA_READ, (uintptr_t)flat, 16, fmr->lkey, (N - 1) * C, col->rkey, 0) ==
		      IBV_WC_REM_ACCESS_ERR,
	      "read past the column");
	CHECK(rdma(IBV_WR_RDMA_READ, (uintptr_t)flat, 8, fmr->lkey, (uintptr_t)scratch, old_rkey, 0) ==
		      IBV_WC_REM_ACCESS_ERR,
	      "old key");
	/* The same MR again: column 4 of the first N/2 rows, read-only. */
	e.addr = (uintptr_t)&mat[COL + 1];
	CHECK(ibv_rereg_mr_interleaved(col, IBV_ACCESS_REMOTE_READ, N / 2, 1, &e) == 0, "again");
	CHECK(col->length == N / 2 * C, "length again");
	CHECK(rdma(IBV_WR_RDMA_READ, (uintptr_t)flat, N / 2 * C, fmr->lkey, 0, col->rkey, 0) == IBV_WC_SUCCESS,
	      "read again");
	CHECK(flat[N / 2 - 1] == (uint64_t)(N / 2 - 1) * M + COL + 1, "column 4");
	CHECK(rdma(IBV_WR_RDMA_WRITE, (uintptr_t)flat, 8, fmr->lkey, 0, col->rkey, 0) == IBV_WC_REM_ACCESS_ERR,
	      "read-only layout");
	CHECK(ibv_dereg_mr(col) == 0 && ibv_dereg_mr(fmr) == 0 && ibv_dereg_mr(mmr) == 0, "dereg");
	free(scratch);
	free(flat);
	free(mat);
	printf("matrix column ok\n");
}

/* The seed's second example: a composite region over N MRs. */
static void test_composite(void)
{
	enum { NMR = 5 };
	static const uint32_t size[NMR] = { 100, 4096, 4, 70000, 333 };
	char *buf[NMR];
	struct ibv_mr *mr[NMR];
	struct ibv_sge sg[NMR];
	uint32_t total = 0;
	for (int i = 0; i < NMR; i++) {
		buf[i] = calloc(1, size[i] + 16);
		mr[i] = ibv_reg_mr(pd, buf[i], size[i] + 16, ALL);
		CHECK(mr[i], "reg_mr %d", i);
		/* each piece starts 8 bytes into its MR */
		sg[i] = (struct ibv_sge){ .addr = (uintptr_t)buf[i] + 8, .length = size[i], .lkey = mr[i]->lkey };
		total += size[i];
	}
	char *src = malloc(total), *dst = calloc(1, total);
	for (uint32_t i = 0; i < total; i++)
		src[i] = (char)(i * 7 + 1);
	struct ibv_mr *smr = ibv_reg_mr(pd, src, total, ALL), *dmr = ibv_reg_mr(pd, dst, total, ALL);
	char *scratch = malloc(64);
	struct ibv_mr *comp = ibv_reg_mr(pd, scratch, 64, ALL);
	CHECK(smr && dmr && comp, "reg_mr");
	CHECK(ibv_rereg_mr_sg(comp, ALL, 0, sg) == EINVAL, "no SGEs");
	CHECK(ibv_rereg_mr_sg(comp, ALL, 5000, sg) == ENOMEM, "too many SGEs");
	CHECK(ibv_rereg_mr_sg(comp, ALL, NMR, sg) == 0, "rereg_mr_sg: %s", strerror(errno));
	CHECK(comp->addr == NULL && comp->length == total, "composite fields");

	/* One RDMA WRITE across all N regions, with one key and a base + length. */
	CHECK(rdma(IBV_WR_RDMA_WRITE, (uintptr_t)src, total, smr->lkey, 0, comp->rkey, 0) == IBV_WC_SUCCESS, "write");
	uint32_t off = 0;
	for (int i = 0; i < NMR; i++) {
		CHECK(memcmp(buf[i] + 8, src + off, size[i]) == 0, "piece %d", i);
		CHECK(buf[i][7] == 0 && buf[i][8 + size[i]] == 0, "piece %d bounds", i);
		off += size[i];
	}
	/* READ a range straddling pieces 1..3. */
	CHECK(rdma(IBV_WR_RDMA_READ, (uintptr_t)dst, 5000, dmr->lkey, 50, comp->rkey, 0) == IBV_WC_SUCCESS, "read");
	CHECK(memcmp(dst, src + 50, 5000) == 0, "read data");
	/* An atomic at the start of piece 3 (offset 4200, 8-byte aligned, as
	 * is buf[3] + 8). */
	uint32_t at = size[0] + size[1] + size[2];
	uint64_t *cell = (uint64_t *)(buf[3] + 8), prev = *cell;
	CHECK(rdma(IBV_WR_ATOMIC_FETCH_AND_ADD, (uintptr_t)dst, 8, dmr->lkey, at, comp->rkey, 1) == IBV_WC_SUCCESS,
	      "atomic");
	CHECK(*cell == prev + 1 && memcmp(dst, &prev, 8) == 0, "atomic data");
	/* SEND from and RECV into the composite. */
	send_recv(0, total, comp->lkey, (uintptr_t)dst, total, dmr->lkey);
	CHECK(memcmp(dst, buf[0] + 8, size[0]) == 0 && memcmp(dst + total - size[4], buf[4] + 8, size[4]) == 0,
	      "send data");
	send_recv((uintptr_t)src, total, smr->lkey, 0, total, comp->lkey);
	CHECK(memcmp(buf[3] + 8, src + size[0] + size[1] + size[2], size[3]) == 0, "recv data");
	/* A constituent deregistered: accesses through it fail, others work. */
	CHECK(ibv_dereg_mr(mr[4]) == 0, "dereg piece");
	CHECK(rdma(IBV_WR_RDMA_READ, (uintptr_t)dst, 100, dmr->lkey, 0, comp->rkey, 0) == IBV_WC_SUCCESS, "piece 0");
	CHECK(rdma(IBV_WR_RDMA_READ, (uintptr_t)dst, 10, dmr->lkey, total - 10, comp->rkey, 0) ==
		      IBV_WC_REM_ACCESS_ERR,
	      "deregistered piece");
	CHECK(ibv_dereg_mr(comp) == 0, "dereg composite");
	for (int i = 0; i < NMR - 1; i++)
		ibv_dereg_mr(mr[i]);
	ibv_dereg_mr(smr);
	ibv_dereg_mr(dmr);
	for (int i = 0; i < NMR; i++)
		free(buf[i]);
	free(src);
	free(dst);
	free(scratch);
	printf("composite ok\n");
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "no device");
	ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device");
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	CHECK(pd && cq, "pd/cq");
	fresh_qps();
	test_matrix_column();
	test_composite();
	ibv_destroy_qp(qp[0]);
	ibv_destroy_qp(qp[1]);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("all ok\n");
	return 0;
}
