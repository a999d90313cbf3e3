/* The extended QP and CQ through the drop-in C ABI: ibv_create_qp_ex with the
 * ibv_wr_* builders (RDMA WRITE and WRITE_WITH_IMM, READ, SEND with inline
 * data and SGE lists, SEND_WITH_IMM, atomics, BIND_MW, LOCAL_INV, UD with
 * ibv_wr_set_ud_addr, batches, wr_abort, latched errors) and ibv_create_cq_ex
 * polled with ibv_start_poll / ibv_next_poll / ibv_wc_read_*, also through
 * ibv_poll_cq and a completion channel. Two RC QPs (and two UD QPs) of one
 * device, connected to each other. Exits non-zero with a message on the
 * first failed check; prints "all ok" at the end. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include "check.h"
#include "connect.h"

#define WC_FLAGS                                                                                   \
	(IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP | \
	 IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL | IBV_WC_EX_WITH_DLID_PATH_BITS)

#define RC_OPS                                                                                       \
	(IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |         \
	 IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | \
	 IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW |     \
	 IBV_QP_EX_WITH_SEND_WITH_INV)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_comp_channel *channel;
static struct ibv_cq_ex *cq[2]; /* cq[i]: send and receive CQ of qp[i] */
static struct ibv_qp *qp[2];
static struct ibv_qp_ex *qx[2];
static union ibv_gid gid;

struct comp {
	uint64_t wr_id;
	enum ibv_wc_status status;
	enum ibv_wc_opcode opcode;
	uint32_t byte_len, qp_num, src_qp, wc_flags, imm, slid;
	uint8_t sl, dlid_path_bits;
};

static void read_comp(struct ibv_cq_ex *c, struct comp *out)
{
	out->wr_id = c->wr_id;
	out->status = c->status;
	out->opcode = ibv_wc_read_opcode(c);
	out->byte_len = ibv_wc_read_byte_len(c);
	out->qp_num = ibv_wc_read_qp_num(c);
	out->src_qp = ibv_wc_read_src_qp(c);
	out->wc_flags = ibv_wc_read_wc_flags(c);
	out->imm = ibv_wc_read_imm_data(c);
	out->slid = ibv_wc_read_slid(c);
	out->sl = ibv_wc_read_sl(c);
	out->dlid_path_bits = ibv_wc_read_dlid_path_bits(c);
	(void)ibv_wc_read_vendor_err(c);
}

/* Waits for n completions on c, read with start_poll, next_poll, end_poll. */
static void wait_comps(struct ibv_cq_ex *c, struct comp *out, int n)
{
	struct ibv_poll_cq_attr attr = {};
	int ret, got = 0;
	for (long i = 0;; i++) {
		ret = ibv_start_poll(c, &attr);
		if (ret == 0)
			break;
		CHECK(ret == ENOENT, "start_poll: %d", ret);
		CHECK(i < 5000000, "no completion");
		if (i > 1000)
			usleep(10);
	}
	read_comp(c, &out[got++]);
	for (long i = 0; got < n; i++) {
		ret = ibv_next_poll(c);
		if (ret == 0) {
			read_comp(c, &out[got++]);
			continue;
		}
		CHECK(ret == ENOENT, "next_poll: %d", ret);
		CHECK(i < 5000000, "only %d of %d completions", got, n);
		if (i > 1000)
			usleep(10);
	}
	ibv_end_poll(c);
}

static struct comp wait_comp(struct ibv_cq_ex *c)
{
	struct comp x;
	wait_comps(c, &x, 1);
	return x;
}

static struct ibv_qp *create_qp_ex(enum ibv_qp_type t, struct ibv_cq_ex *c, uint64_t ops)
{
	struct ibv_qp_init_attr_ex ia = {
		.send_cq = ibv_cq_ex_to_cq(c), .recv_cq = ibv_cq_ex_to_cq(c), .qp_type = t,
		.cap = { .max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 4, .max_recv_sge = 4,
			 .max_inline_data = 64 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = pd, .send_ops_flags = ops };
	struct ibv_qp *q = ibv_create_qp_ex(ctx, &ia);
	CHECK(q, "create_qp_ex: %s", strerror(errno));
	return q;
}

static void post_recv(struct ibv_qp *q, uint64_t wr_id, void *buf, uint32_t len, uint32_t lkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = len, .lkey = lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(q, &wr, &bad) == 0, "post_recv");
}

static void test_creation_errors(void)
{
	struct ibv_cq_init_attr_ex ca = { .cqe = 16, .wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP };
	errno = 0;
	CHECK(!ibv_create_cq_ex(ctx, &ca), "timestamp CQ created");
	CHECK(errno == EOPNOTSUPP, "timestamp CQ: errno %d", errno);

	struct ibv_qp_init_attr_ex ia = {
		.send_cq = ibv_cq_ex_to_cq(cq[0]), .recv_cq = ibv_cq_ex_to_cq(cq[0]), .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_TSO };
	errno = 0;
	CHECK(!ibv_create_qp_ex(ctx, &ia), "TSO QP created");
	CHECK(errno == EOPNOTSUPP, "TSO QP: errno %d", errno);
	ia.qp_type = IBV_QPT_UD;
	ia.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE;
	errno = 0;
	CHECK(!ibv_create_qp_ex(ctx, &ia), "UD QP with RDMA WRITE created");
	CHECK(errno == EOPNOTSUPP, "UD RDMA WRITE QP: errno %d", errno);
	ia.qp_type = IBV_QPT_RC;
	ia.send_ops_flags = IBV_QP_EX_WITH_SEND;
	ia.comp_mask |= IBV_QP_INIT_ATTR_MAX_TSO_HEADER;
	errno = 0;
	CHECK(!ibv_create_qp_ex(ctx, &ia), "QP with max_tso_header created");
	CHECK(errno == EOPNOTSUPP, "max_tso_header: errno %d", errno);

	/* Only the builders asked for. */
	ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	struct ibv_qp *q = ibv_create_qp_ex(ctx, &ia);
	CHECK(q, "SEND-only QP: %s", strerror(errno));
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(q);
	CHECK(x == (struct ibv_qp_ex *)q, "qp_to_qp_ex");
	CHECK(x->wr_send && !x->wr_rdma_write && !x->wr_send_tso && x->wr_start && x->wr_complete, "builders");
	CHECK(ibv_destroy_qp(q) == 0, "destroy");

	/* A plain QP carries every builder of its type. */
	struct ibv_qp_init_attr pa = { .send_cq = ibv_cq_ex_to_cq(cq[0]), .recv_cq = ibv_cq_ex_to_cq(cq[0]),
				       .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
						.max_recv_sge = 1 } };
	q = ibv_create_qp(pd, &pa);
	CHECK(q, "create_qp");
	x = ibv_qp_to_qp_ex(q);
	CHECK(x->wr_send && x->wr_rdma_write && x->wr_atomic_fetch_add && x->wr_bind_mw, "plain QP builders");
	CHECK(ibv_destroy_qp(q) == 0, "destroy");
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0, "no device");
	ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device");
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "query_gid");
	pd = ibv_alloc_pd(ctx);
	CHECK(pd, "alloc_pd");
	channel = ibv_create_comp_channel(ctx);
	CHECK(channel, "create_comp_channel");
	for (int i = 0; i < 2; i++) {
		struct ibv_cq_init_attr_ex ca = { .cqe = 64, .cq_context = &cq[i], .channel = i == 0 ? channel : NULL,
						  .wc_flags = WC_FLAGS, .comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS,
						  .flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED };
		cq[i] = ibv_create_cq_ex(ctx, &ca);
		CHECK(cq[i], "create_cq_ex: %s", strerror(errno));
		CHECK(ibv_cq_ex_to_cq(cq[i])->cqe >= 64 && ibv_cq_ex_to_cq(cq[i])->context == ctx, "cq fields");
	}
	struct ibv_poll_cq_attr pattr = {};
	CHECK(ibv_start_poll(cq[0], &pattr) == ENOENT, "empty CQ");
	test_creation_errors();

	for (int i = 0; i < 2; i++) {
		qp[i] = create_qp_ex(IBV_QPT_RC, cq[i], RC_OPS);
		qx[i] = ibv_qp_to_qp_ex(qp[i]);
		CHECK(qx[i] && &qx[i]->qp_base == qp[i], "qp_to_qp_ex");
	}
	connect_qp(qp[0], qp[1]->qp_num, &gid);
	connect_qp(qp[1], qp[0]->qp_num, &gid);

	enum { LEN = 4096 };
	static uint8_t a[LEN] __attribute__((aligned(64))), b[LEN] __attribute__((aligned(64)));
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
		  IBV_ACCESS_MW_BIND;
	struct ibv_mr *ma = ibv_reg_mr(pd, a, LEN, acc), *mb = ibv_reg_mr(pd, b, LEN, acc);
	CHECK(ma && mb, "reg_mr");
	struct comp c[4];

	/* RDMA WRITE then WRITE_WITH_IMM, one batch, the first unsignaled. */
	for (int i = 0; i < LEN; i++)
		a[i] = (uint8_t)(i * 7);
	post_recv(qp[1], 500, NULL, 0, 0);
	ibv_wr_start(qx[0]);
	qx[0]->wr_id = 1;
	qx[0]->wr_flags = 0;
	ibv_wr_rdma_write(qx[0], mb->rkey, (uintptr_t)b);
	ibv_wr_set_sge(qx[0], ma->lkey, (uintptr_t)a, 2048);
	qx[0]->wr_id = 2;
	qx[0]->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write_imm(qx[0], mb->rkey, (uintptr_t)b + 2048, htonl(0x12345678));
	struct ibv_sge two[2] = { { (uintptr_t)a + 2048, 1000, ma->lkey }, { (uintptr_t)a + 3048, 1048, ma->lkey } };
	ibv_wr_set_sge_list(qx[0], 2, two);
	CHECK(ibv_wr_complete(qx[0]) == 0, "wr_complete write");
	c[0] = wait_comp(cq[0]);
	CHECK(c[0].wr_id == 2 && c[0].status == IBV_WC_SUCCESS && c[0].opcode == IBV_WC_RDMA_WRITE &&
		      c[0].qp_num == qp[0]->qp_num,
	      "write completion: id %lu status %d opcode %d qpn %u", (unsigned long)c[0].wr_id, c[0].status,
	      c[0].opcode, c[0].qp_num);
	c[1] = wait_comp(cq[1]);
	CHECK(c[1].wr_id == 500 && c[1].status == IBV_WC_SUCCESS && c[1].opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
		      (c[1].wc_flags & IBV_WC_WITH_IMM) && ntohl(c[1].imm) == 0x12345678 && c[1].byte_len == 2048 &&
		      c[1].qp_num == qp[1]->qp_num && c[1].src_qp == qp[0]->qp_num,
	      "write-imm receive: id %lu opcode %d flags %x imm %x len %u src %u", (unsigned long)c[1].wr_id,
	      c[1].opcode, c[1].wc_flags, ntohl(c[1].imm), c[1].byte_len, c[1].src_qp);
	CHECK(memcmp(a, b, LEN) == 0, "written data differs");

	/* RDMA READ back into a. */
	memset(a, 0, LEN);
	ibv_wr_start(qx[0]);
	qx[0]->wr_id = 3;
	qx[0]->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(qx[0], mb->rkey, (uintptr_t)b);
	ibv_wr_set_sge(qx[0], ma->lkey, (uintptr_t)a, LEN);
	CHECK(ibv_wr_complete(qx[0]) == 0, "wr_complete read");
	c[0] = wait_comp(cq[0]);
	CHECK(c[0].wr_id == 3 && c[0].status == IBV_WC_SUCCESS && c[0].opcode == IBV_WC_RDMA_READ &&
		      c[0].byte_len == LEN,
	      "read completion: status %d opcode %d len %u", c[0].status, c[0].opcode, c[0].byte_len);
	CHECK(memcmp(a, b, LEN) == 0, "read data differs");

	/* SEND with inline data (buffer reused at once), SEND_WITH_IMM with an
	 * inline list; completions read with start_poll + next_poll. */
	memset(b, 0, LEN);
	post_recv(qp[1], 600, b, 256, mb->lkey);
	post_recv(qp[1], 601, b + 256, 256, mb->lkey);
	char msg[32];
	ibv_wr_start(qx[0]);
	qx[0]->wr_id = 4;
	qx[0]->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(qx[0]);
	strcpy(msg, "inline hello");
	ibv_wr_set_inline_data(qx[0], msg, strlen(msg) + 1);
	memset(msg, 'x', sizeof(msg));
	qx[0]->wr_id = 5;
	ibv_wr_send_imm(qx[0], htonl(77));
	struct ibv_data_buf bufs[2] = { { "abc", 3 }, { "defgh", 6 } };
	ibv_wr_set_inline_data_list(qx[0], 2, bufs);
	CHECK(ibv_wr_complete(qx[0]) == 0, "wr_complete send");
	wait_comps(cq[0], c, 2);
	CHECK(c[0].wr_id == 4 && c[1].wr_id == 5 && c[0].opcode == IBV_WC_SEND && c[1].opcode == IBV_WC_SEND &&
		      c[0].status == IBV_WC_SUCCESS && c[1].status == IBV_WC_SUCCESS,
	      "send completions %lu %lu", (unsigned long)c[0].wr_id, (unsigned long)c[1].wr_id);
	wait_comps(cq[1], c, 2);
	CHECK(c[0].wr_id == 600 && c[0].opcode == IBV_WC_RECV && c[0].byte_len == 13 &&
		      !(c[0].wc_flags & IBV_WC_WITH_IMM),
	      "recv 600: opcode %d len %u", c[0].opcode, c[0].byte_len);
	CHECK(c[1].wr_id == 601 && c[1].byte_len == 9 && (c[1].wc_flags & IBV_WC_WITH_IMM) && ntohl(c[1].imm) == 77,
	      "recv 601: len %u flags %x imm %u", c[1].byte_len, c[1].wc_flags, ntohl(c[1].imm));
	CHECK(strcmp((char *)b, "inline hello") == 0 && memcmp(b + 256, "abcdefgh", 9) == 0, "sent data");

	/* Atomics: fetch-and-add then compare-and-swap on b[0..8]. */
	uint64_t *target = (uint64_t *)b, *result = (uint64_t *)a;
	*target = 10;
	ibv_wr_start(qx[0]);
	qx[0]->wr_id = 6;
	qx[0]->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_fetch_add(qx[0], mb->rkey, (uintptr_t)target, 5);
	ibv_wr_set_sge(qx[0], ma->lkey, (uintptr_t)result, 8);
	qx[0]->wr_id = 7;
	ibv_wr_atomic_cmp_swp(qx[0], mb->rkey, (uintptr_t)target, 15, 99);
	ibv_wr_set_sge(qx[0], ma->lkey, (uintptr_t)(result + 1), 8);
	CHECK(ibv_wr_complete(qx[0]) == 0, "wr_complete atomics");
	wait_comps(cq[0], c, 2);
	CHECK(c[0].wr_id == 6 && c[0].opcode == IBV_WC_FETCH_ADD && c[0].status == IBV_WC_SUCCESS && c[1].wr_id == 7 &&
		      c[1].opcode == IBV_WC_COMP_SWAP && c[1].status == IBV_WC_SUCCESS,
	      "atomic completions: %d %d / %d %d", c[0].opcode, c[0].status, c[1].opcode, c[1].status);
	CHECK(result[0] == 10 && result[1] == 15 && *target == 99, "atomics: %lu %lu %lu", (unsigned long)result[0],
	      (unsigned long)result[1], (unsigned long)*target);

	/* A type 2 window bound by qp[1] over b, written through by qp[0],
	 * then invalidated by LOCAL_INV. */
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(mw, "alloc_mw: %s", strerror(errno));
	uint32_t mw_rkey = ibv_inc_rkey(mw->rkey);
	struct ibv_mw_bind_info bi = { .mr = mb, .addr = (uintptr_t)b, .length = LEN,
				       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	ibv_wr_start(qx[1]);
	qx[1]->wr_id = 8;
	qx[1]->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(qx[1], mw, mw_rkey, &bi);
	CHECK(ibv_wr_complete(qx[1]) == 0, "wr_complete bind");
	c[0] = wait_comp(cq[1]);
	CHECK(c[0].wr_id == 8 && c[0].status == IBV_WC_SUCCESS && c[0].opcode == IBV_WC_BIND_MW,
	      "bind completion: status %d opcode %d", c[0].status, c[0].opcode);
	CHECK(mw->rkey == mw_rkey, "mw rkey %x, want %x", mw->rkey, mw_rkey);
	memset(a, 0x5a, 64);
	ibv_wr_start(qx[0]);
	qx[0]->wr_id = 9;
	qx[0]->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qx[0], mw_rkey, (uintptr_t)b + 100);
	ibv_wr_set_sge(qx[0], ma->lkey, (uintptr_t)a, 64);
	CHECK(ibv_wr_complete(qx[0]) == 0, "wr_complete write through window");
	c[0] = wait_comp(cq[0]);
	CHECK(c[0].wr_id == 9 && c[0].status == IBV_WC_SUCCESS, "write through window: %d", c[0].status);
	CHECK(b[100] == 0x5a && b[163] == 0x5a, "window write data");
	ibv_wr_start(qx[1]);
	qx[1]->wr_id = 10;
	qx[1]->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(qx[1], mw_rkey);
	CHECK(ibv_wr_complete(qx[1]) == 0, "wr_complete local_inv");
	c[0] = wait_comp(cq[1]);
	CHECK(c[0].wr_id == 10 && c[0].status == IBV_WC_SUCCESS && c[0].opcode == IBV_WC_LOCAL_INV,
	      "local_inv completion: status %d opcode %d", c[0].status, c[0].opcode);

	/* wr_abort posts nothing; errors are latched until wr_complete. */
	ibv_wr_start(qx[0]);
	qx[0]->wr_id = 11;
	ibv_wr_rdma_write(qx[0], mb->rkey, (uintptr_t)b);
	ibv_wr_set_sge(qx[0], ma->lkey, (uintptr_t)a, 8);
	ibv_wr_abort(qx[0]);
	ibv_wr_start(qx[0]);
	ibv_wr_set_sge(qx[0], ma->lkey, (uintptr_t)a, 8); /* no WR to set */
	CHECK(ibv_wr_complete(qx[0]) == EINVAL, "setter without a WR");
	static char big[1024];
	ibv_wr_start(qx[0]);
	qx[0]->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(qx[0]);
	ibv_wr_set_inline_data(qx[0], big, sizeof(big));
	CHECK(ibv_wr_complete(qx[0]) == ENOSPC, "inline data above max_inline_data");
	ibv_wr_start(qx[0]);
	CHECK(ibv_wr_complete(qx[0]) == 0, "empty batch");
	CHECK(ibv_start_poll(cq[0], &pattr) == ENOENT, "aborted or failed batches completed");

	/* The extended CQ through ibv_poll_cq and its completion channel. */
	CHECK(ibv_req_notify_cq(ibv_cq_ex_to_cq(cq[0]), 0) == 0, "req_notify_cq");
	ibv_wr_start(qx[0]);
	qx[0]->wr_id = 12;
	qx[0]->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qx[0], mb->rkey, (uintptr_t)b);
	ibv_wr_set_sge(qx[0], ma->lkey, (uintptr_t)a, 8);
	CHECK(ibv_wr_complete(qx[0]) == 0, "wr_complete");
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	CHECK(ibv_get_cq_event(channel, &ev_cq, &ev_ctx) == 0, "get_cq_event");
	CHECK(ev_cq == ibv_cq_ex_to_cq(cq[0]) && ev_ctx == &cq[0], "event names the CQ");
	ibv_ack_cq_events(ev_cq, 1);
	struct ibv_wc wc;
	for (long i = 0; (n = ibv_poll_cq(ev_cq, 1, &wc)) == 0; i++) {
		CHECK(i < 5000000, "no completion for poll_cq");
		if (i > 1000)
			usleep(10);
	}
	CHECK(n == 1 && wc.wr_id == 12 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE,
	      "poll_cq on a cq_ex: %d %lu %d", n, (unsigned long)wc.wr_id, wc.status);

	/* UD: SEND with wr_set_ud_addr. */
	struct ibv_qp *ud[2];
	struct ibv_qp_ex *udx;
	for (int i = 0; i < 2; i++) {
		ud[i] = create_qp_ex(IBV_QPT_UD, cq[i], IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM);
		struct ibv_qp_attr qa = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1, .qkey = 0x1111 };
		CHECK(ibv_modify_qp(ud[i], &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0,
		      "UD INIT");
		qa.qp_state = IBV_QPS_RTR;
		CHECK(ibv_modify_qp(ud[i], &qa, IBV_QP_STATE) == 0, "UD RTR");
		qa.qp_state = IBV_QPS_RTS;
		qa.sq_psn = 0;
		CHECK(ibv_modify_qp(ud[i], &qa, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "UD RTS");
	}
	udx = ibv_qp_to_qp_ex(ud[0]);
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .hop_limit = 64 } };
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	CHECK(ah, "create_ah");
	memset(b, 0, 200);
	post_recv(ud[1], 700, b, 40 + 100, mb->lkey);
	memset(a, 0x33, 100);
	ibv_wr_start(udx);
	udx->wr_id = 13;
	udx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(udx, htonl(4242));
	ibv_wr_set_ud_addr(udx, ah, ud[1]->qp_num, 0x1111);
	ibv_wr_set_sge(udx, ma->lkey, (uintptr_t)a, 100);
	CHECK(ibv_wr_complete(udx) == 0, "wr_complete UD");
	c[0] = wait_comp(cq[0]);
	CHECK(c[0].wr_id == 13 && c[0].status == IBV_WC_SUCCESS, "UD send: %d", c[0].status);
	c[1] = wait_comp(cq[1]);
	CHECK(c[1].wr_id == 700 && c[1].status == IBV_WC_SUCCESS && c[1].byte_len == 140 &&
		      c[1].src_qp == ud[0]->qp_num && c[1].qp_num == ud[1]->qp_num && ntohl(c[1].imm) == 4242 &&
		      (c[1].wc_flags & IBV_WC_GRH),
	      "UD receive: status %d len %u src %u flags %x", c[1].status, c[1].byte_len, c[1].src_qp,
	      c[1].wc_flags);
	CHECK(b[40] == 0x33 && b[139] == 0x33, "UD data");

	CHECK(ibv_destroy_ah(ah) == 0, "destroy_ah");
	for (int i = 0; i < 2; i++)
		CHECK(ibv_destroy_qp(ud[i]) == 0 && ibv_destroy_qp(qp[i]) == 0, "destroy_qp");
	CHECK(ibv_dealloc_mw(mw) == 0, "dealloc_mw");
	CHECK(ibv_dereg_mr(ma) == 0 && ibv_dereg_mr(mb) == 0, "dereg_mr");
	for (int i = 0; i < 2; i++)
		CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq[i])) == 0, "destroy_cq");
	CHECK(ibv_destroy_comp_channel(channel) == 0, "destroy_comp_channel");
	CHECK(ibv_dealloc_pd(pd) == 0, "dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "close_device");
	ibv_free_device_list(list);
	printf("all ok\n");
	return 0;
}
