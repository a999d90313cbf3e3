/* The mlx5 direct verbs through the drop-ins (libibverbs.so.1 and
 * libmlx5.so.1), as code written for mlx5 uses them: mlx5dv_is_supported,
 * mlx5dv_create_qp with MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE (seed 001's
 * per-QP inline-receive switch), indirect mkeys configured by UMR through
 * mlx5dv_wr_mr_list / mlx5dv_wr_mr_interleaved / mlx5dv_wr_mkey_configure
 * and its setters, then used by RDMA READ/WRITE; and the unimplemented
 * exports failing cleanly. Exits non-zero on the first failed check. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>

#include "check.h"
#include "wait.h"
#include "connect.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *scq, *rcq;
static union ibv_gid gid;

#define ALL (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

/* An RC QP through mlx5dv_create_qp (dv may be NULL); NULL + errno on error. */
static struct ibv_qp *dv_qp(struct mlx5dv_qp_init_attr *dv, uint64_t ibv_ops)
{
	struct ibv_qp_init_attr_ex ia = { .send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_RC, .pd = pd,
					  .comp_mask = IBV_QP_INIT_ATTR_PD,
					  .cap = { .max_send_wr = 32, .max_recv_wr = 32, .max_send_sge = 4,
						   .max_recv_sge = 4 } };
	if (ibv_ops) {
		ia.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		ia.send_ops_flags = ibv_ops;
	}
	return mlx5dv_create_qp(ctx, &ia, dv);
}

static void post_recv(struct ibv_qp *q, void *buf, uint32_t len, uint32_t lkey)
{
	struct ibv_sge s = { .addr = (uintptr_t)buf, .length = len, .lkey = lkey };
	struct ibv_recv_wr w = { .wr_id = 9, .sg_list = &s, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(q, &w, &bad) == 0, "post_recv");
}

static void post(struct ibv_qp *q, enum ibv_wr_opcode op, void *buf, uint32_t len, uint32_t lkey, uint64_t raddr,
		 uint32_t rkey)
{
	struct ibv_sge s = { .addr = (uintptr_t)buf, .length = len, .lkey = lkey };
	struct ibv_send_wr w = { .wr_id = 1, .sg_list = &s, .num_sge = len ? 1 : 0, .opcode = op,
				 .send_flags = IBV_SEND_SIGNALED }, *bad;
	w.wr.rdma.remote_addr = raddr;
	w.wr.rdma.rkey = rkey;
	if (op == IBV_WR_LOCAL_INV)
		w.invalidate_rkey = rkey;
	CHECK(ibv_post_send(q, &w, &bad) == 0, "post_send");
}

/* Whether a 16-byte SEND into `b` is in the receive buffer before the
 * receive completion is polled (the sender's completion, an RC ACK, says
 * the responder has handled it): scattered to the CQE, the data reaches
 * the buffer only when the CQE is polled. */
static int lands_before_poll(struct ibv_qp *a, struct ibv_qp *b)
{
	char *msg = calloc(1, 64), *rbuf = calloc(1, 64);
	struct ibv_mr *mm = ibv_reg_mr(pd, msg, 64, ALL), *rm = ibv_reg_mr(pd, rbuf, 64, ALL);
	strcpy(msg, "inline-receive!");
	post_recv(b, rbuf, 64, rm->lkey);
	post(a, IBV_WR_SEND, msg, 16, mm->lkey, 0, 0);
	struct ibv_wc wc = wait_wc(scq);
	CHECK(wc.status == IBV_WC_SUCCESS, "send: %s", ibv_wc_status_str(wc.status));
	usleep(20000);
	int early = memcmp(rbuf, msg, 16) == 0;
	wc = wait_wc(rcq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.byte_len == 16, "recv");
	CHECK(memcmp(rbuf, msg, 16) == 0, "data after poll");
	ibv_dereg_mr(mm);
	ibv_dereg_mr(rm);
	free(msg);
	free(rbuf);
	return early;
}

static void test_scatter_to_cqe(void)
{
	struct mlx5dv_qp_init_attr dv = { .comp_mask = MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS,
					  .create_flags = MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE };
	struct ibv_qp *a = dv_qp(NULL, 0), *b = dv_qp(NULL, 0);
	CHECK(a && b, "mlx5dv_create_qp (no dv attr): %s", strerror(errno));
	connect_qp(a, b->qp_num, &gid);
	connect_qp(b, a->qp_num, &gid);
	CHECK(!lands_before_poll(a, b), "default: a small SEND is scattered to the CQE");
	struct ibv_qp *c = dv_qp(NULL, 0), *d = dv_qp(&dv, 0);
	CHECK(c && d, "mlx5dv_create_qp DISABLE_SCATTER_TO_CQE: %s", strerror(errno));
	connect_qp(c, d->qp_num, &gid);
	connect_qp(d, c->qp_num, &gid);
	CHECK(lands_before_poll(c, d), "DISABLE_SCATTER_TO_CQE: the SEND lands in the buffer");

	dv.create_flags = MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE | MLX5DV_QP_CREATE_ALLOW_SCATTER_TO_CQE;
	CHECK(!dv_qp(&dv, 0) && errno == EINVAL, "both flags: %d", errno);
	dv.create_flags = MLX5DV_QP_CREATE_TUNNEL_OFFLOADS;
	CHECK(!dv_qp(&dv, 0) && errno == EOPNOTSUPP, "tunnel offloads: %d", errno);
	struct mlx5dv_qp_init_attr dc = { .comp_mask = MLX5DV_QP_INIT_ATTR_MASK_DC };
	CHECK(!dv_qp(&dc, 0) && errno == EOPNOTSUPP, "DC: %d", errno);
	struct mlx5dv_qp_init_attr raw = { .comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS,
					   .send_ops_flags = MLX5DV_QP_EX_WITH_RAW_WQE };
	CHECK(!dv_qp(&raw, IBV_QP_EX_WITH_SEND) && errno == EOPNOTSUPP, "raw WQE: %d", errno);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_destroy_qp(c);
	ibv_destroy_qp(d);
	printf("scatter to cqe ok\n");
}

static struct ibv_qp *uq, *peer;
static struct ibv_qp_ex *qx;
static struct mlx5dv_qp_ex *mqp;

/* Ends a UMR batch: wr_complete's result; on 0, the completion's status
 * (opcode MLX5DV_WC_UMR). */
static int umr_end(void)
{
	int rc = ibv_wr_complete(qx);
	if (rc)
		return -rc;
	struct ibv_wc wc = wait_wc(scq);
	if (wc.status == IBV_WC_SUCCESS)
		CHECK(wc.opcode == (enum ibv_wc_opcode)MLX5DV_WC_UMR, "UMR opcode %d", wc.opcode);
	return wc.status;
}

static void umr_start(uint64_t id, unsigned flags)
{
	ibv_wr_start(qx);
	qx->wr_id = id;
	qx->wr_flags = flags;
}

static int op(enum ibv_wr_opcode o, void *buf, uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey)
{
	post(uq, o, buf, len, lkey, raddr, rkey);
	return wait_wc(scq).status;
}

static void reconnect(void)
{
	if (uq)
		ibv_destroy_qp(uq);
	if (peer)
		ibv_destroy_qp(peer);
	struct mlx5dv_qp_init_attr dv = { .comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS,
					  .send_ops_flags = MLX5DV_QP_EX_WITH_MR_INTERLEAVED |
							    MLX5DV_QP_EX_WITH_MR_LIST |
							    MLX5DV_QP_EX_WITH_MKEY_CONFIGURE };
	uq = dv_qp(&dv, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ |
				IBV_QP_EX_WITH_LOCAL_INV);
	peer = dv_qp(NULL, 0);
	CHECK(uq && peer, "mlx5dv_create_qp with UMR ops: %s", strerror(errno));
	connect_qp(uq, peer->qp_num, &gid);
	connect_qp(peer, uq->qp_num, &gid);
	qx = ibv_qp_to_qp_ex(uq);
	mqp = mlx5dv_qp_ex_from_ibv_qp_ex(qx);
	CHECK(mqp && mqp->wr_mr_list && mqp->wr_mr_interleaved && mqp->wr_mkey_configure, "mlx5dv_qp_ex");
}

static void test_umr(void)
{
	reconnect();
	enum { ROWS = 16, ROWLEN = 256 };
	char *mat = calloc(ROWS, ROWLEN), *a = malloc(64), *b = malloc(64), *dst = calloc(1, 4096);
	memset(a, 'a', 64);
	memset(b, 'b', 64);
	for (int i = 0; i < ROWS * ROWLEN; i++)
		mat[i] = (char)i;
	struct ibv_mr *mm = ibv_reg_mr(pd, mat, ROWS * ROWLEN, ALL), *ma = ibv_reg_mr(pd, a, 64, ALL),
		      *mb = ibv_reg_mr(pd, b, 64, ALL), *md = ibv_reg_mr(pd, dst, 4096, ALL);
	struct mlx5dv_mkey_init_attr mia = { .pd = pd, .create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT,
					     .max_entries = 4 };
	struct mlx5dv_mkey *mk = mlx5dv_create_mkey(&mia);
	CHECK(mk && mk->lkey == mk->rkey, "mlx5dv_create_mkey: %s", strerror(errno));
	struct mlx5dv_mkey_init_attr sig = { .pd = pd, .create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT |
									   MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE,
					     .max_entries = 4 };
	CHECK(!mlx5dv_create_mkey(&sig) && errno == EOPNOTSUPP, "signature mkey");
	struct mlx5dv_mkey_init_attr none = { .pd = pd, .create_flags = 0, .max_entries = 4 };
	CHECK(!mlx5dv_create_mkey(&none) && errno == EINVAL, "mkey without INDIRECT");

	/* mlx5dv_wr_mr_list: b[0..10] then a[0..6]. */
	struct ibv_sge l[2] = { { (uintptr_t)b, 10, mb->lkey }, { (uintptr_t)a, 6, ma->lkey } };
	umr_start(11, IBV_SEND_SIGNALED);
	mlx5dv_wr_mr_list(mqp, mk, IBV_ACCESS_REMOTE_READ, 2, l);
	CHECK(umr_end() == -EOPNOTSUPP, "UMR without IBV_SEND_INLINE");
	umr_start(12, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
	mlx5dv_wr_mr_list(mqp, mk, IBV_ACCESS_REMOTE_READ, 2, l);
	CHECK(umr_end() == IBV_WC_SUCCESS, "mr_list");
	CHECK(op(IBV_WR_RDMA_READ, dst, 16, md->lkey, 0, mk->rkey) == IBV_WC_SUCCESS, "read via mkey");
	CHECK(memcmp(dst, "bbbbbbbbbbaaaaaa", 16) == 0, "mkey data %.16s", dst);
	/* A valid key is reconfigured only after LOCAL_INV. */
	umr_start(13, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
	mlx5dv_wr_mr_list(mqp, mk, IBV_ACCESS_REMOTE_READ, 2, l);
	CHECK(umr_end() == IBV_WC_MW_BIND_ERR, "UMR on a valid mkey");
	reconnect();
	CHECK(op(IBV_WR_LOCAL_INV, NULL, 0, 0, 0, mk->rkey) == IBV_WC_SUCCESS, "local inv");
	CHECK(op(IBV_WR_RDMA_READ, dst, 16, md->lkey, 0, mk->rkey) == IBV_WC_REM_ACCESS_ERR, "invalidated mkey");
	reconnect();

	/* mlx5dv_wr_mr_interleaved: column 5 of the matrix, writable. */
	struct mlx5dv_mr_interleaved col = { .addr = (uintptr_t)mat + 5, .bytes_count = 1,
					     .bytes_skip = ROWLEN - 1, .lkey = mm->lkey };
	umr_start(14, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
	mlx5dv_wr_mr_interleaved(mqp, mk, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, ROWS, 1, &col);
	CHECK(umr_end() == IBV_WC_SUCCESS, "mr_interleaved");
	memset(dst, 'Z', ROWS);
	CHECK(op(IBV_WR_RDMA_WRITE, dst, ROWS, md->lkey, 0, mk->rkey) == IBV_WC_SUCCESS, "write via mkey");
	for (int r = 0; r < ROWS; r++) {
		CHECK(mat[r * ROWLEN + 5] == 'Z', "column row %d", r);
		CHECK(mat[r * ROWLEN + 6] == (char)(r * ROWLEN + 6), "neighbour row %d", r);
	}
	CHECK(op(IBV_WR_LOCAL_INV, NULL, 0, 0, 0, mk->rkey) == IBV_WC_SUCCESS, "local inv 2");

	/* The WQE's 16-bit fields: refused, not truncated. */
	struct mlx5dv_mr_interleaved wide = col;
	wide.bytes_skip = 70000;
	umr_start(15, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
	mlx5dv_wr_mr_interleaved(mqp, mk, IBV_ACCESS_REMOTE_READ, 2, 1, &wide);
	CHECK(umr_end() == -EINVAL, "bytes_skip over 16 bits");
	/* Too many entries for the key / the WQE. */
	struct ibv_sge five[5] = { l[0], l[1], l[0], l[1], l[0] };
	umr_start(16, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
	mlx5dv_wr_mr_list(mqp, mk, IBV_ACCESS_REMOTE_READ, 5, five);
	CHECK(umr_end() == -ENOMEM, "too many entries");
	umr_start(17, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
	mlx5dv_wr_mr_list(mqp, mk, IBV_ACCESS_MW_BIND, 2, l);
	CHECK(umr_end() == -EINVAL, "bad access");

	/* Builders the QP was not created with, or uroce lacks: EOPNOTSUPP
	 * from wr_complete (no NULL pointer to call). */
	struct ibv_qp_ex *px = ibv_qp_to_qp_ex(peer);
	struct mlx5dv_qp_ex *pm = mlx5dv_qp_ex_from_ibv_qp_ex(px);
	CHECK(pm && pm->wr_mr_list && pm->wr_set_dc_addr && pm->wr_memcpy, "plain QP's mlx5dv_qp_ex");
	ibv_wr_start(px);
	px->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	mlx5dv_wr_mr_list(pm, mk, IBV_ACCESS_REMOTE_READ, 2, l);
	CHECK(ibv_wr_complete(px) == EOPNOTSUPP, "mr_list without MLX5DV_QP_EX_WITH_MR_LIST");
	umr_start(23, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
	mlx5dv_wr_set_dc_addr(mqp, NULL, 0, 0);
	CHECK(umr_end() == -EOPNOTSUPP, "DC address");

	/* mlx5dv_wr_mkey_configure + setters. */
	struct mlx5dv_mkey_conf_attr ca = { 0 };
	umr_start(18, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
	mlx5dv_wr_set_mkey_access_flags(mqp, IBV_ACCESS_REMOTE_READ);
	CHECK(umr_end() == -EINVAL, "setter without configure");
	umr_start(19, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
	mlx5dv_wr_mkey_configure(mqp, mk, 2, &ca);
	mlx5dv_wr_set_mkey_access_flags(mqp, IBV_ACCESS_REMOTE_READ);
	mlx5dv_wr_set_mkey_access_flags(mqp, IBV_ACCESS_REMOTE_READ);
	CHECK(umr_end() == -EINVAL, "setter twice");
	umr_start(20, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
	mlx5dv_wr_mkey_configure(mqp, mk, 2, &ca);
	mlx5dv_wr_set_mkey_access_flags(mqp, IBV_ACCESS_REMOTE_READ);
	mlx5dv_wr_set_mkey_layout_list(mqp, 2, l);
	CHECK(umr_end() == IBV_WC_SUCCESS, "mkey_configure list");
	memset(dst, 0, 16);
	CHECK(op(IBV_WR_RDMA_READ, dst, 16, md->lkey, 0, mk->rkey) == IBV_WC_SUCCESS, "read configured");
	CHECK(memcmp(dst, "bbbbbbbbbbaaaaaa", 16) == 0, "configured data %.16s", dst);
	CHECK(op(IBV_WR_RDMA_WRITE, dst, 4, md->lkey, 0, mk->rkey) == IBV_WC_REM_ACCESS_ERR, "read-only mkey");
	reconnect();
	CHECK(op(IBV_WR_LOCAL_INV, NULL, 0, 0, 0, mk->rkey) == IBV_WC_SUCCESS, "local inv 3");
	umr_start(21, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
	mlx5dv_wr_mkey_configure(mqp, mk, 2, &ca);
	mlx5dv_wr_set_mkey_layout_interleaved(mqp, ROWS, 1, &col);
	mlx5dv_wr_set_mkey_access_flags(mqp, IBV_ACCESS_REMOTE_READ);
	CHECK(umr_end() == IBV_WC_SUCCESS, "mkey_configure interleaved");
	CHECK(op(IBV_WR_RDMA_READ, dst, ROWS, md->lkey, 0, mk->rkey) == IBV_WC_SUCCESS, "read column");
	CHECK(memcmp(dst, "ZZZZZZZZZZZZZZZZ", ROWS) == 0, "column data");
	struct mlx5dv_mkey_conf_attr reset = { .conf_flags = MLX5DV_MKEY_CONF_FLAG_RESET_SIG_ATTR };
	umr_start(22, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
	mlx5dv_wr_mkey_configure(mqp, mk, 1, &reset);
	CHECK(umr_end() == -EOPNOTSUPP, "RESET_SIG_ATTR");

	CHECK(mlx5dv_destroy_mkey(mk) == 0, "destroy_mkey");
	ibv_destroy_qp(uq);
	ibv_destroy_qp(peer);
	ibv_dereg_mr(mm);
	ibv_dereg_mr(ma);
	ibv_dereg_mr(mb);
	ibv_dereg_mr(md);
	free(mat);
	free(a);
	free(b);
	free(dst);
	printf("umr ok\n");
}

static void test_unsupported(struct ibv_device *dev)
{
	struct mlx5dv_context attr = { 0 };
	CHECK(mlx5dv_query_device(ctx, &attr) == EOPNOTSUPP, "query_device");
	struct mlx5dv_context_attr da = { .flags = MLX5DV_CONTEXT_FLAGS_DEVX };
	CHECK(!mlx5dv_open_device(dev, &da) && errno == EOPNOTSUPP, "DEVX open");
	struct ibv_context *c2 = mlx5dv_open_device(dev, NULL);
	CHECK(c2 && ibv_close_device(c2) == 0, "plain mlx5dv_open_device");
	uint32_t in[4] = { 0 }, out[4];
	errno = 0;
	CHECK(!mlx5dv_devx_obj_create(ctx, in, sizeof(in), out, sizeof(out)) && errno == EOPNOTSUPP, "devx");
	printf("unsupported ok\n");
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "no device");
	CHECK(mlx5dv_is_supported(list[0]), "mlx5dv_is_supported");
	ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device");
	pd = ibv_alloc_pd(ctx);
	scq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	rcq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	CHECK(pd && scq && rcq, "pd/cq");
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "query_gid");
	test_scatter_to_cqe();
	test_umr();
	test_unsupported(list[0]);
	ibv_destroy_cq(scq);
	ibv_destroy_cq(rcq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("all ok\n");
	return 0;
}
