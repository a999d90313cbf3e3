/* Misuse through the drop-in C ABI: every non-inline verbs call with NULL or
 * invalid handles, calls in wrong QP states, out-of-range sizes, queue
 * overflows, and destroying objects still in use. Each case checks the
 * documented result (docs/reliability.md, "Misuse"): NULL + errno, or the
 * returned error code, and that the object stays usable afterwards. Run
 * under valgrind by crates/uroce-ibverbs/tests/misuse_c.rs to show that
 * none of it reads or writes out of bounds or leaks.
 *
 * The inline functions of verbs.h (ibv_post_send, ibv_post_recv,
 * ibv_poll_cq, ibv_req_notify_cq, ibv_query_port, ibv_alloc_mw,
 * ibv_bind_mw, ibv_dealloc_mw, the _ex calls) dereference the handle in the
 * caller's own code before the library is reached, as with rdma-core: a
 * NULL handle there is undefined behaviour for any libibverbs, so it is not
 * tested.
 *
 * Exits non-zero with a message on the first failed check; prints
 * "all ok" at the end. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "check.h"

/* A call that returns NULL and sets errno. */
#define NULL_ERRNO(call, want)                                                          \
	do {                                                                            \
		errno = 0;                                                              \
		void *r_ = (void *)(call);                                              \
		CHECK(r_ == NULL && errno == (want), "%s: got %p errno %d (%s), want NULL errno %d", \
		      #call, r_, errno, strerror(errno), (want));                       \
	} while (0)

/* A call that returns an error code (errno value). */
#define RC(call, want)                                                                       \
	do {                                                                                 \
		int r_ = (call);                                                             \
		CHECK(r_ == (want), "%s: got %d (%s), want %d", #call, r_, strerror(r_ < 0 ? -r_ : r_), (want)); \
	} while (0)

/* A call that returns an errno value and sets errno to it too, as
 * rdma-core's verbs that pass the kernel's ioctl result through. */
#define RC_ERRNO(call, want)                                                                  \
	do {                                                                                  \
		errno = 0;                                                                    \
		int r_ = (call), e_ = errno;                                                  \
		CHECK(r_ == (want) && e_ == (want), "%s: got %d, errno %d, want %d", #call, r_, e_, (want)); \
	} while (0)

static struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *cq, struct ibv_srq *srq, uint32_t wr)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq,
		.recv_cq = cq,
		.srq = srq,
		.cap = { .max_send_wr = wr, .max_recv_wr = wr, .max_send_sge = 2, .max_recv_sge = 2,
			 .max_inline_data = 64 },
		.qp_type = IBV_QPT_RC,
	};
	return ibv_create_qp(pd, &a);
}

static int to_state(struct ibv_qp *qp, enum ibv_qp_state s, uint32_t dest_qpn, union ibv_gid *gid)
{
	struct ibv_qp_attr a = { .qp_state = s };
	int mask = IBV_QP_STATE;
	if (s == IBV_QPS_INIT) {
		a.pkey_index = 0;
		a.port_num = 1;
		a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
		mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	} else if (s == IBV_QPS_RTR) {
		a.path_mtu = IBV_MTU_1024;
		a.dest_qp_num = dest_qpn;
		a.rq_psn = 0;
		a.max_dest_rd_atomic = 1;
		a.min_rnr_timer = 12;
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = *gid;
		a.ah_attr.grh.hop_limit = 1;
		a.ah_attr.port_num = 1;
		mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			IBV_QP_MIN_RNR_TIMER;
	} else if (s == IBV_QPS_RTS) {
		a.timeout = 14;
		a.retry_cnt = 7;
		a.rnr_retry = 7;
		a.sq_psn = 0;
		a.max_rd_atomic = 1;
		mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
	}
	return ibv_modify_qp(qp, &a, mask);
}

static void null_handles(void)
{
	struct ibv_device_attr da;
	union ibv_gid gid;
	uint16_t pkey;
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	struct ibv_srq_attr sa;
	struct ibv_ah_attr aa = { .port_num = 1 };
	struct ibv_qp_init_attr ci = { .qp_type = IBV_QPT_RC, .cap = { .max_send_wr = 1, .max_recv_wr = 1 } };
	struct ibv_srq_init_attr si = { .attr = { .max_wr = 1, .max_sge = 1 } };
	char buf[64];

	NULL_ERRNO(ibv_open_device(NULL), EINVAL);
	RC(ibv_close_device(NULL), EINVAL);
	RC(ibv_query_device(NULL, &da), EINVAL);
	RC(ibv_query_gid(NULL, 1, 0, &gid), -1);
	RC(ibv_query_pkey(NULL, 1, 0, &pkey), -1);
	NULL_ERRNO(ibv_alloc_pd(NULL), EINVAL);
	RC(ibv_dealloc_pd(NULL), EINVAL);
	NULL_ERRNO(ibv_reg_mr(NULL, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE), EINVAL);
	RC(ibv_dereg_mr(NULL), EINVAL);
	NULL_ERRNO(ibv_create_cq(NULL, 1, NULL, NULL, 0), EINVAL);
	RC(ibv_destroy_cq(NULL), EINVAL);
	NULL_ERRNO(ibv_create_comp_channel(NULL), EINVAL);
	RC(ibv_destroy_comp_channel(NULL), EINVAL);
	NULL_ERRNO(ibv_create_qp(NULL, &ci), EINVAL);
	RC(ibv_modify_qp(NULL, &qa, IBV_QP_STATE), EINVAL);
	RC(ibv_query_qp(NULL, &qa, IBV_QP_STATE, &qi), EINVAL);
	RC(ibv_destroy_qp(NULL), EINVAL);
	NULL_ERRNO(ibv_create_srq(NULL, &si), EINVAL);
	RC(ibv_modify_srq(NULL, &sa, IBV_SRQ_LIMIT), EINVAL);
	RC(ibv_query_srq(NULL, &sa), EINVAL);
	RC(ibv_destroy_srq(NULL), EINVAL);
	NULL_ERRNO(ibv_create_ah(NULL, &aa), EINVAL);
	RC(ibv_destroy_ah(NULL), EINVAL);
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0, "no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device: %s", strerror(errno));
	ibv_free_device_list(list);
	struct ibv_device_attr dev;
	RC(ibv_query_device(ctx, &dev), 0);
	union ibv_gid gid;
	RC(ibv_query_gid(ctx, 1, 0, &gid), 0);

	null_handles();

	/* Missing attribute pointers and out-of-range arguments. */
	RC(ibv_query_device(ctx, NULL), EINVAL);
	struct ibv_port_attr pa;
	RC(ibv_query_port(ctx, 0, &pa), EINVAL);
	RC(ibv_query_port(ctx, 2, &pa), EINVAL);
	RC(ibv_query_gid(ctx, 2, 0, &gid), -1);
	uint16_t pkey;
	RC(ibv_query_pkey(ctx, 1, 0x7fff, &pkey), -1);

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd, "alloc_pd");
	static char buf[1 << 16];
	NULL_ERRNO(ibv_reg_mr(pd, NULL, 64, IBV_ACCESS_LOCAL_WRITE), EINVAL);
	/* Remote write without local write: the spec's rule. */
	NULL_ERRNO(ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_REMOTE_WRITE), EINVAL);
	NULL_ERRNO(ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_REMOTE_ATOMIC), EINVAL);
	NULL_ERRNO(ibv_reg_mr(pd, buf, sizeof(buf), 1u << 30), EINVAL);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					       IBV_ACCESS_REMOTE_READ);
	CHECK(mr, "reg_mr: %s", strerror(errno));

	NULL_ERRNO(ibv_create_cq(ctx, 0, NULL, NULL, 0), EINVAL);
	NULL_ERRNO(ibv_create_cq(ctx, dev.max_cqe + 1, NULL, NULL, 0), EINVAL);
	NULL_ERRNO(ibv_create_cq(ctx, 16, NULL, NULL, 1 << 20), EINVAL);
	struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	CHECK(cq, "create_cq: %s", strerror(errno));

	/* QP creation: capacities beyond the device's, no CQ, unknown type. */
	struct ibv_qp_init_attr qi = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = dev.max_qp_wr + 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	NULL_ERRNO(ibv_create_qp(pd, &qi), EINVAL);
	qi.cap.max_send_wr = 1;
	qi.cap.max_send_sge = dev.max_sge + 1;
	NULL_ERRNO(ibv_create_qp(pd, &qi), EINVAL);
	qi.cap.max_send_sge = 1;
	qi.cap.max_inline_data = 1 << 20;
	NULL_ERRNO(ibv_create_qp(pd, &qi), EINVAL);
	qi.cap.max_inline_data = 0;
	qi.send_cq = NULL;
	NULL_ERRNO(ibv_create_qp(pd, &qi), EINVAL);
	qi.send_cq = cq;
	qi.qp_type = (enum ibv_qp_type)77; /* rxe: EOPNOTSUPP for a type it lacks */
	NULL_ERRNO(ibv_create_qp(pd, &qi), EOPNOTSUPP);

	/* Two RC QPs (send queue depth 4) connected to each other. */
	struct ibv_qp *a = rc_qp(pd, cq, NULL, 4), *b = rc_qp(pd, cq, NULL, 4);
	CHECK(a && b, "create_qp: %s", strerror(errno));

	/* Wrong states: posting before INIT/RTS, skipping states, missing
	 * required attributes. */
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED };
	struct ibv_recv_wr rwr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1 };
	struct ibv_send_wr *bad = NULL;
	struct ibv_recv_wr *rbad = NULL;
	RC(ibv_post_send(a, &wr, &bad), EINVAL);
	CHECK(bad == &wr, "bad_wr names the refused WR");
	RC(ibv_post_recv(a, &rwr, &rbad), EINVAL);
	RC(to_state(a, IBV_QPS_RTS, 0, &gid), EINVAL);
	struct ibv_qp_attr qa = { .qp_state = IBV_QPS_RTR };
	RC(ibv_modify_qp(a, &qa, IBV_QP_STATE), EINVAL);
	RC(to_state(a, IBV_QPS_INIT, 0, &gid), 0);
	RC(ibv_post_send(a, &wr, &bad), EINVAL);
	RC(ibv_modify_qp(a, &qa, IBV_QP_STATE), EINVAL); /* RTR needs AV, MTU, dest QPN … */
	RC(to_state(b, IBV_QPS_INIT, 0, &gid), 0);
	RC(to_state(a, IBV_QPS_RTR, b->qp_num, &gid), 0);
	RC(to_state(b, IBV_QPS_RTR, a->qp_num, &gid), 0);
	RC(to_state(a, IBV_QPS_RTS, 0, &gid), 0);
	RC(to_state(b, IBV_QPS_RTS, 0, &gid), 0);

	/* Out-of-range work requests, refused at post. */
	struct ibv_sge two[3] = { sge, sge, sge };
	wr.sg_list = two;
	wr.num_sge = 3; /* max_send_sge is 2 */
	RC(ibv_post_send(a, &wr, &bad), EINVAL);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	sge.length = 65;
	RC(ibv_post_send(a, &wr, &bad), EINVAL); /* max_inline_data 64 */
	sge.length = 4;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	wr.wr.atomic.remote_addr = (uintptr_t)buf;
	wr.wr.atomic.rkey = mr->rkey;
	RC(ibv_post_send(a, &wr, &bad), EINVAL); /* atomics move 8 bytes */
	sge.length = 8;
	wr.wr.atomic.remote_addr = (uintptr_t)buf + 4;
	RC(ibv_post_send(a, &wr, &bad), EINVAL); /* unaligned */
	wr.opcode = (enum ibv_wr_opcode)99;
	RC(ibv_post_send(a, &wr, &bad), EINVAL);
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.wr.rdma.remote_addr = (uintptr_t)buf;
	wr.wr.rdma.rkey = mr->rkey;
	sge.length = 0x80000001u; /* a message of more than 2^31 bytes */
	RC(ibv_post_send(a, &wr, &bad), EINVAL);
	sge.length = 8;

	/* UD: a send without an address handle. */
	struct ibv_qp_init_attr ui = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				       .cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1,
						.max_recv_sge = 1 } };
	struct ibv_qp *ud = ibv_create_qp(pd, &ui);
	CHECK(ud, "create UD QP: %s", strerror(errno));
	struct ibv_qp_attr ua = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11111111 };
	RC(ibv_modify_qp(ud, &ua, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
	ua.qp_state = IBV_QPS_RTR;
	RC(ibv_modify_qp(ud, &ua, IBV_QP_STATE), 0);
	ua.qp_state = IBV_QPS_RTS;
	ua.sq_psn = 0;
	RC(ibv_modify_qp(ud, &ua, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
	struct ibv_send_wr uw = { .wr_id = 3, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED };
	uw.wr.ud.ah = NULL;
	uw.wr.ud.remote_qpn = 1;
	uw.wr.ud.remote_qkey = 0x11111111;
	RC(ibv_post_send(ud, &uw, &bad), EINVAL);
	RC(ibv_destroy_qp(ud), 0);

	/* Send-queue overflow: four fit, the fifth is refused and reported. */
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.wr.rdma.remote_addr = (uintptr_t)buf + 1024;
	wr.wr.rdma.rkey = mr->rkey;
	struct ibv_send_wr chain[5];
	for (int i = 0; i < 5; i++) {
		chain[i] = wr;
		chain[i].wr_id = 10 + i;
		chain[i].next = i < 4 ? &chain[i + 1] : NULL;
	}
	bad = NULL;
	int rc = ibv_post_send(a, chain, &bad);
	CHECK(rc == ENOMEM && bad == &chain[4], "send queue overflow: rc %d bad %p (want ENOMEM, %p)", rc,
	      (void *)bad, (void *)&chain[4]);
	/* Receive-queue overflow likewise. */
	struct ibv_recv_wr rchain[5];
	for (int i = 0; i < 5; i++) {
		rchain[i] = rwr;
		rchain[i].wr_id = 20 + i;
		rchain[i].next = i < 4 ? &rchain[i + 1] : NULL;
	}
	rbad = NULL;
	rc = ibv_post_recv(b, rchain, &rbad);
	CHECK(rc == ENOMEM && rbad == &rchain[4], "receive queue overflow: rc %d", rc);

	/* The four WRITEs complete; the QP is still usable. */
	struct ibv_wc wc[8];
	int got = 0;
	for (int spins = 0; got < 4 && spins < 20000000; spins++) {
		int k = ibv_poll_cq(cq, 8, wc + got);
		CHECK(k >= 0, "poll_cq %d", k);
		got += k;
	}
	CHECK(got == 4, "4 completions after the overflow, got %d", got);
	for (int i = 0; i < 4; i++)
		CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)(10 + i), "WRITE %d: %s", i,
		      ibv_wc_status_str(wc[i].status));

	/* Destroying objects still in use: EBUSY, and they stay usable. */
	RC_ERRNO(ibv_dealloc_pd(pd), EBUSY);
	RC_ERRNO(ibv_destroy_cq(cq), EBUSY);
	struct ibv_srq_init_attr si = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &si);
	CHECK(srq, "create_srq: %s", strerror(errno));
	struct ibv_qp *c = rc_qp(pd, cq, srq, 4);
	CHECK(c, "QP on the SRQ: %s", strerror(errno));
	RC(ibv_destroy_srq(srq), EBUSY);
	struct ibv_srq_attr sa = { .max_wr = dev.max_srq_wr + 1 };
	RC(ibv_modify_srq(srq, &sa, IBV_SRQ_MAX_WR), EINVAL);
	sa.srq_limit = 8; /* above max_wr */
	RC(ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT), EINVAL);
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	CHECK(mw, "alloc_mw: %s", strerror(errno));
	struct ibv_mw_bind bind = { .wr_id = 30, .send_flags = IBV_SEND_SIGNALED,
				    .bind_info = { .mr = mr, .addr = (uintptr_t)buf, .length = 64,
						   .mw_access_flags = IBV_ACCESS_REMOTE_READ } };
	/* The MR lacks IBV_ACCESS_MW_BIND: as rxe, the post succeeds and the
	 * completion fails with MW_BIND_ERR (QP b goes to the error state). */
	RC(ibv_bind_mw(b, mw, &bind), 0);
	got = 0;
	for (int spins = 0; got < 1 && spins < 20000000; spins++)
		got += ibv_poll_cq(cq, 1, wc);
	CHECK(got == 1 && wc[0].status == IBV_WC_MW_BIND_ERR, "bind without MW_BIND: %s",
	      got ? ibv_wc_status_str(wc[0].status) : "no completion");
	struct ibv_mr *mr_mw = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	CHECK(mr_mw, "reg_mr MW_BIND: %s", strerror(errno));
	bind.bind_info.mr = mr_mw;
	RC(ibv_bind_mw(a, mw, &bind), 0);
	/* b's four receives were flushed when it failed: skip them. */
	int flushed = 0, bound = 0;
	for (int spins = 0; !bound && spins < 20000000; spins++) {
		if (ibv_poll_cq(cq, 1, wc) != 1)
			continue;
		if (wc[0].qp_num == b->qp_num && wc[0].status == IBV_WC_WR_FLUSH_ERR) {
			flushed++;
			continue;
		}
		CHECK(wc[0].wr_id == 30 && wc[0].status == IBV_WC_SUCCESS && wc[0].opcode == IBV_WC_BIND_MW,
		      "bind completion: wr_id %llu %s", (unsigned long long)wc[0].wr_id, ibv_wc_status_str(wc[0].status));
		bound = 1;
	}
	CHECK(bound, "no bind completion");
	while (flushed < 4 && ibv_poll_cq(cq, 1, wc) == 1)
		flushed += wc[0].status == IBV_WC_WR_FLUSH_ERR;
	CHECK(flushed == 4, "b's receives flushed: %d", flushed);
	RC_ERRNO(ibv_dereg_mr(mr_mw), EBUSY); /* a window is bound to it; errno as rdma-core */
	RC(ibv_dealloc_mw(mw), 0);
	RC(ibv_dereg_mr(mr_mw), 0);

	/* Everything torn down in order: no leak (valgrind checks). */
	RC(ibv_destroy_qp(c), 0);
	RC(ibv_destroy_srq(srq), 0);
	RC(ibv_destroy_qp(a), 0);
	RC(ibv_destroy_qp(b), 0);
	RC(ibv_destroy_cq(cq), 0);
	RC(ibv_dereg_mr(mr), 0);
	RC(ibv_dealloc_pd(pd), 0);
	RC(ibv_close_device(ctx), 0);
	printf("all ok\n");
	return 0;
}
