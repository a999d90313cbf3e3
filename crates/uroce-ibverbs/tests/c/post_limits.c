/* Work requests checked before they are read (issue 16 §3), and CQ overrun
 * through the drop-in: a cyclic WR list (wr.next = &wr) on ibv_post_send,
 * ibv_post_recv and ibv_post_srq_recv stops at the queue's free slots with
 * ENOMEM; num_sge = INT_MAX or -1 is EINVAL without reading the SGE array
 * (which points at unmapped memory here, so reading it would crash); an
 * inline SGE of 0xFFFFFFFF bytes is EINVAL before anything is copied; an
 * opcode the QP type lacks is EINVAL before its SGEs are read; bad_wr names
 * the refused WR and the ones before it are posted. A CQ that overflows
 * raises IBV_EVENT_CQ_ERR (element.cq set) and ibv_poll_cq (and
 * ibv_start_poll) fails once its stored completions are taken
 * (docs/reliability.md). An ibv_wr_* batch larger than the free slots is
 * refused whole with ENOSPC. Prints "all ok". */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "check.h"
#include "connect.h"

#define RC(call, want)                                                                      \
	do {                                                                                \
		int r_ = (call);                                                            \
		CHECK(r_ == (want), "%s: got %d (%s), want %d", #call, r_, strerror(r_ < 0 ? -r_ : r_), (want)); \
	} while (0)

/* An address nothing is mapped at: an SGE array or buffer there crashes
 * whoever reads it. */
#define UNMAPPED ((void *)(uintptr_t)0x10)

static int poll_n(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	int got = 0;
	for (long spins = 0; got < n && spins < 50000000; spins++) {
		int k = ibv_poll_cq(cq, n - got, wc + got);
		CHECK(k >= 0, "poll_cq %d", k);
		got += k;
	}
	return got;
}

static struct ibv_qp *qp_of(struct ibv_pd *pd, struct ibv_cq *cq, struct ibv_srq *srq, enum ibv_qp_type t)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq, .recv_cq = cq, .srq = srq,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 2, .max_recv_sge = 2,
			 .max_inline_data = 64 },
		.qp_type = t,
	};
	struct ibv_qp *q = ibv_create_qp(pd, &a);
	CHECK(q, "create_qp type %d: %s", t, strerror(errno));
	return q;
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0, "no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device: %s", strerror(errno));
	ibv_free_device_list(list);
	union ibv_gid gid;
	RC(ibv_query_gid(ctx, 1, 0, &gid), 0);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd, "alloc_pd");
	static char buf[1 << 16];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					       IBV_ACCESS_REMOTE_READ);
	CHECK(mr, "reg_mr: %s", strerror(errno));
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(cq, "create_cq: %s", strerror(errno));
	struct ibv_qp *a = qp_of(pd, cq, NULL, IBV_QPT_RC), *b = qp_of(pd, cq, NULL, IBV_QPT_RC);
	connect_qp(a, b->qp_num, &gid);
	connect_qp(b, a->qp_num, &gid);
	struct ibv_wc wc[16];

	/* Receives: a cyclic list stops at the 4 free slots. */
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 };
	rwr.next = &rwr;
	struct ibv_recv_wr *rbad = NULL;
	RC(ibv_post_recv(b, &rwr, &rbad), ENOMEM);
	CHECK(rbad == &rwr, "post_recv cyclic: bad_wr %p", (void *)rbad);
	/* The queue is full now: even a one-WR list is refused. */
	rwr.next = NULL;
	RC(ibv_post_recv(b, &rwr, &rbad), ENOMEM);
	/* num_sge out of range: refused before the (unmapped) array is read. */
	struct ibv_recv_wr rbig = { .wr_id = 8, .sg_list = UNMAPPED, .num_sge = INT_MAX };
	RC(ibv_post_recv(a, &rbig, &rbad), EINVAL);
	CHECK(rbad == &rbig, "post_recv num_sge INT_MAX: bad_wr");
	rbig.num_sge = -1;
	RC(ibv_post_recv(a, &rbig, &rbad), EINVAL);
	rbig.num_sge = 3; /* max_recv_sge is 2 */
	RC(ibv_post_recv(a, &rbig, &rbad), EINVAL);

	/* Sends: a cyclic list of SENDs stops at the 4 free slots; the four
	 * posted ones meet b's four receives. */
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED };
	wr.next = &wr;
	struct ibv_send_wr *bad = NULL;
	RC(ibv_post_send(a, &wr, &bad), ENOMEM);
	CHECK(bad == &wr, "post_send cyclic: bad_wr %p", (void *)bad);
	int got = poll_n(cq, 8, wc);
	CHECK(got == 8, "4 sends and 4 receives complete, got %d", got);
	for (int i = 0; i < 8; i++)
		CHECK(wc[i].status == IBV_WC_SUCCESS, "completion %d: %s", i, ibv_wc_status_str(wc[i].status));
	wr.next = NULL;

	/* num_sge out of range, SGE array unmapped: EINVAL, nothing read. */
	struct ibv_send_wr big = wr;
	big.sg_list = UNMAPPED;
	big.num_sge = INT_MAX;
	RC(ibv_post_send(a, &big, &bad), EINVAL);
	CHECK(bad == &big, "post_send num_sge INT_MAX: bad_wr");
	big.num_sge = -5;
	RC(ibv_post_send(a, &big, &bad), EINVAL);
	big.num_sge = 3;
	RC(ibv_post_send(a, &big, &bad), EINVAL);

	/* Inline: an SGE of 0xFFFFFFFF bytes over a 64-byte buffer, and two SGEs
	 * whose total (80) is above max_inline_data (64): EINVAL, nothing copied. */
	struct ibv_sge huge = { .addr = (uintptr_t)buf, .length = 0xFFFFFFFFu, .lkey = 0 };
	struct ibv_send_wr inl = { .wr_id = 2, .sg_list = &huge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				   .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE };
	inl.wr.rdma.remote_addr = (uintptr_t)buf + 4096;
	inl.wr.rdma.rkey = mr->rkey;
	RC(ibv_post_send(a, &inl, &bad), EINVAL);
	struct ibv_sge two[2] = { { .addr = (uintptr_t)buf, .length = 40 }, { .addr = (uintptr_t)buf, .length = 40 } };
	inl.sg_list = two;
	inl.num_sge = 2;
	RC(ibv_post_send(a, &inl, &bad), EINVAL);
	two[1].length = 24; /* 64: fits */
	RC(ibv_post_send(a, &inl, &bad), 0);
	CHECK(poll_n(cq, 1, wc) == 1 && wc[0].status == IBV_WC_SUCCESS, "inline WRITE of 64 bytes");

	/* A list with a bad WR in the middle: the first is posted, the second
	 * named, the third not posted. */
	struct ibv_send_wr chain[3];
	for (int i = 0; i < 3; i++) {
		chain[i] = wr;
		chain[i].opcode = IBV_WR_RDMA_WRITE;
		chain[i].wr.rdma.remote_addr = (uintptr_t)buf + 8192;
		chain[i].wr.rdma.rkey = mr->rkey;
		chain[i].wr_id = 100 + i;
		chain[i].next = i < 2 ? &chain[i + 1] : NULL;
	}
	chain[1].sg_list = UNMAPPED;
	chain[1].num_sge = INT_MAX;
	RC(ibv_post_send(a, chain, &bad), EINVAL);
	CHECK(bad == &chain[1], "chain: bad_wr names the second WR");
	got = poll_n(cq, 1, wc);
	CHECK(got == 1 && wc[0].wr_id == 100 && wc[0].status == IBV_WC_SUCCESS, "the first WR of the chain ran");
	CHECK(ibv_poll_cq(cq, 16, wc) == 0, "nothing after it");

	/* An opcode the QP type lacks (RDMA WRITE on UD), or none at all: EINVAL
	 * before its SGE array is read. */
	struct ibv_qp *ud = qp_of(pd, cq, NULL, IBV_QPT_UD);
	struct ibv_qp_attr ua = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11111111 };
	RC(ibv_modify_qp(ud, &ua, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
	ua.qp_state = IBV_QPS_RTR;
	RC(ibv_modify_qp(ud, &ua, IBV_QP_STATE), 0);
	ua.qp_state = IBV_QPS_RTS;
	RC(ibv_modify_qp(ud, &ua, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
	struct ibv_send_wr uw = { .wr_id = 3, .sg_list = UNMAPPED, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE };
	RC(ibv_post_send(ud, &uw, &bad), EINVAL);
	uw.opcode = (enum ibv_wr_opcode)99;
	RC(ibv_post_send(ud, &uw, &bad), EINVAL);
	CHECK(bad == &uw, "bad opcode: bad_wr");
	RC(ibv_destroy_qp(ud), 0);

	/* SRQ: a cyclic list stops at its 4 free slots; num_sge INT_MAX is EINVAL. */
	struct ibv_srq_init_attr si = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &si);
	CHECK(srq, "create_srq: %s", strerror(errno));
	rbig.num_sge = INT_MAX;
	RC(ibv_post_srq_recv(srq, &rbig, &rbad), EINVAL);
	CHECK(rbad == &rbig, "post_srq_recv num_sge: bad_wr");
	struct ibv_recv_wr swr = { .wr_id = 9, .sg_list = &sge, .num_sge = 1 };
	swr.next = &swr;
	RC(ibv_post_srq_recv(srq, &swr, &rbad), ENOMEM);
	CHECK(rbad == &swr, "post_srq_recv cyclic: bad_wr");
	/* Full: the room is checked first (as rxe and mlx5's post_recv). */
	RC(ibv_post_srq_recv(srq, &rbig, &rbad), ENOMEM);

	/* CQ overrun: a 2-entry CQ gets 3 completions. Its stored ones are
	 * polled, then polls fail; IBV_EVENT_CQ_ERR names the CQ. */
	struct ibv_cq_init_attr_ex cia = { .cqe = 2, .wc_flags = IBV_WC_STANDARD_FLAGS };
	struct ibv_cq_ex *smallx = ibv_create_cq_ex(ctx, &cia);
	CHECK(smallx, "create_cq_ex 2");
	struct ibv_cq *small = ibv_cq_ex_to_cq(smallx);
	struct ibv_qp_init_attr ci = { .send_cq = small, .recv_cq = cq,
				       .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
						.max_recv_sge = 1 },
				       .qp_type = IBV_QPT_RC };
	struct ibv_qp *c = ibv_create_qp(pd, &ci), *d = qp_of(pd, cq, NULL, IBV_QPT_RC);
	CHECK(c, "create_qp on the small CQ");
	connect_qp(c, d->qp_num, &gid);
	connect_qp(d, c->qp_num, &gid);
	struct ibv_send_wr w3[3];
	for (int i = 0; i < 3; i++) {
		w3[i] = chain[0];
		w3[i].wr_id = 200 + i;
		w3[i].next = i < 2 ? &w3[i + 1] : NULL;
	}
	RC(ibv_post_send(c, w3, &bad), 0);
	/* Nothing polled until CQ_ERR: the third completion overruns however
	 * the ACKs come (a poll between them would make room for it). */
	int seen_err = 0, polled = 0, failed = 0;
	struct pollfd pfd = { .fd = ctx->async_fd, .events = POLLIN };
	while (!seen_err && poll(&pfd, 1, 5000) == 1) {
		struct ibv_async_event ev;
		RC(ibv_get_async_event(ctx, &ev), 0);
		if (ev.event_type == IBV_EVENT_CQ_ERR) {
			CHECK(ev.element.cq == small, "CQ_ERR names the CQ: %p", (void *)ev.element.cq);
			seen_err = 1;
		}
		ibv_ack_async_event(&ev);
	}
	for (long spins = 0; !failed && spins < 50000000; spins++) {
		int k = ibv_poll_cq(small, 4, wc);
		if (k > 0)
			polled += k;
		else if (k < 0)
			failed = 1;
	}
	CHECK(seen_err, "no IBV_EVENT_CQ_ERR");
	CHECK(polled == 2, "the 2 stored completions are polled, got %d", polled);
	CHECK(failed, "ibv_poll_cq on the overrun CQ never failed");
	CHECK(ibv_poll_cq(small, 4, wc) < 0, "poll keeps failing");
	struct ibv_poll_cq_attr pca = { 0 };
	RC(ibv_start_poll(smallx, &pca), EIO); /* the extended poll too */

	/* The ibv_wr_* API: a batch larger than the free slots is refused whole
	 * (ENOSPC, as rxe) and nothing of it is posted. q's peer does not exist,
	 * so its three SENDs stay in its 4-slot queue while it retries. */
	struct ibv_qp *q = qp_of(pd, cq, NULL, IBV_QPT_RC);
	connect_qp(q, 0xabcd, &gid);
	struct ibv_send_wr s3[3];
	for (int i = 0; i < 3; i++) {
		s3[i] = wr;
		s3[i].wr_id = 300 + i;
		s3[i].next = i < 2 ? &s3[i + 1] : NULL;
	}
	RC(ibv_post_send(q, s3, &bad), 0);
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(q);
	CHECK(qx, "qp_to_qp_ex");
	ibv_wr_start(qx);
	for (int i = 0; i < 2; i++) {
		qx->wr_id = 400 + i;
		qx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send(qx);
		ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)buf, 8);
	}
	RC(ibv_wr_complete(qx), ENOSPC);
	/* One slot is still free: the batch took none. */
	wr.next = NULL;
	RC(ibv_post_send(q, &wr, &bad), 0);
	RC(ibv_post_send(q, &wr, &bad), ENOMEM);
	RC(ibv_destroy_qp(q), 0);
	while (ibv_poll_cq(cq, 16, wc) > 0)
		;

	RC(ibv_destroy_qp(c), 0);
	RC(ibv_destroy_qp(d), 0);
	RC(ibv_destroy_cq(small), 0);
	RC(ibv_destroy_qp(a), 0);
	RC(ibv_destroy_qp(b), 0);
	RC(ibv_destroy_srq(srq), 0);
	RC(ibv_destroy_cq(cq), 0);
	RC(ibv_dereg_mr(mr), 0);
	RC(ibv_dealloc_pd(pd), 0);
	RC(ibv_close_device(ctx), 0);
	printf("all ok\n");
	return 0;
}
