/* The C clients' QP connection: INIT, RTR, RTS to `dest` at `gid` with
 * exactly the attributes the QP type requires (the kernel's qp_state_table,
 * as pyverbs' to_rts sends them), every remote access allowed, 4 reads or
 * atomics in flight each way, PSNs 0, seven retries. */
#ifndef UROCE_TEST_CONNECT_H
#define UROCE_TEST_CONNECT_H
#include <errno.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "check.h"

static void connect_qp(struct ibv_qp *q, uint32_t dest, const union ibv_gid *gid)
{
	int rc_like = q->qp_type == IBV_QPT_RC || q->qp_type == IBV_QPT_XRC_RECV;
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
						    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC };
	CHECK(ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0, "INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	int rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	if (rc_like)
		rtr |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	CHECK(ibv_modify_qp(q, &a, rtr) == 0, "RTR of type %d", q->qp_type);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 4;
	int rts = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN;
	if (q->qp_type != IBV_QPT_XRC_RECV)
		rts |= IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	CHECK(ibv_modify_qp(q, &a, rts) == 0, "RTS of type %d", q->qp_type);
}

/* Two RC QPs of `pd` on `cq`, connected to each other on the same device,
 * each with `depth` work requests and `sges` SGEs both ways; a QP already
 * in `qp` is destroyed first. */
static inline void rc_pair(struct ibv_pd *pd, struct ibv_cq *cq, uint32_t depth, uint32_t sges, struct ibv_qp *qp[2])
{
	for (int i = 0; i < 2; i++) {
		if (qp[i])
			ibv_destroy_qp(qp[i]);
		struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
					       .cap = { .max_send_wr = depth, .max_recv_wr = depth,
							.max_send_sge = sges, .max_recv_sge = sges } };
		qp[i] = ibv_create_qp(pd, &ia);
		CHECK(qp[i], "create_qp: %s", strerror(errno));
	}
	union ibv_gid gid;
	CHECK(ibv_query_gid(pd->context, 1, 0, &gid) == 0, "query_gid");
	connect_qp(qp[0], qp[1]->qp_num, &gid);
	connect_qp(qp[1], qp[0]->qp_num, &gid);
}

#endif
