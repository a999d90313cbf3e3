/* ibv_init_ah_from_wc / ibv_create_ah_from_wc (issue 17 §2), as rdma-core 44
 * does them for RoCE: QP b receives a UD message from QP a, builds an AH
 * from the completion and its GRH area, and answers a with it. Then the
 * attributes from hand-made GRH areas: an IPv6 header (RoCE v2 over IPv6,
 * next header UDP), RoCE v1 (no such GID: -1), a multicast destination
 * (EINVAL), and a completion without IBV_WC_GRH (not global).
 * Prints "all ok". */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "check.h"

#define QKEY 0x11111111u

static struct ibv_qp *ud_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				       .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
						.max_recv_sge = 1 } };
	struct ibv_qp *q = ibv_create_qp(pd, &ia);
	CHECK(q, "create UD QP: %s", strerror(errno));
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };
	CHECK(ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0, "INIT");
	a.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(q, &a, IBV_QP_STATE) == 0, "RTR");
	a.qp_state = IBV_QPS_RTS;
	CHECK(ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "RTS");
	return q;
}

static struct ibv_wc wait_wc(struct ibv_cq *cq, enum ibv_wc_opcode op)
{
	struct ibv_wc wc;
	for (long spins = 0; spins < 50000000; spins++) {
		if (ibv_poll_cq(cq, 1, &wc) == 1) {
			CHECK(wc.status == IBV_WC_SUCCESS, "completion: %s", ibv_wc_status_str(wc.status));
			if (wc.opcode == op)
				return wc;
		}
	}
	CHECK(0, "no completion of opcode %d", op);
	return wc;
}

static void send_to(struct ibv_qp *q, struct ibv_ah *ah, uint32_t qpn, void *buf, uint32_t len, uint32_t lkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = qpn;
	wr.wr.ud.remote_qkey = QKEY;
	CHECK(ibv_post_send(q, &wr, &bad) == 0, "post_send");
}

static void recv_into(struct ibv_qp *q, void *buf, uint32_t len, uint32_t lkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = len, .lkey = lkey };
	struct ibv_recv_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(q, &wr, &bad) == 0, "post_recv");
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
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "query_gid");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	static char buf[4096];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(pd && cq && mr, "pd/cq/mr");
	struct ibv_qp *a = ud_qp(pd, cq), *b = ud_qp(pd, cq);

	/* a → b, with an AH to b's GID. */
	struct ibv_ah_attr to_b = { .is_global = 1, .port_num = 1,
				    .grh = { .dgid = gid, .sgid_index = 0, .hop_limit = 64 } };
	struct ibv_ah *ah_b = ibv_create_ah(pd, &to_b);
	CHECK(ah_b, "create_ah: %s", strerror(errno));
	recv_into(b, buf + 1024, 40 + 64, mr->lkey);
	recv_into(a, buf + 2048, 40 + 64, mr->lkey);
	strcpy(buf, "ping");
	send_to(a, ah_b, b->qp_num, buf, 5, mr->lkey);
	struct ibv_wc wc = wait_wc(cq, IBV_WC_RECV);
	CHECK(wc.qp_num == b->qp_num && wc.src_qp == a->qp_num && (wc.wc_flags & IBV_WC_GRH), "b's receive");
	CHECK(strcmp(buf + 1024 + 40, "ping") == 0, "payload after the GRH area");

	/* The attributes: the sender's address as destination GID, our GID's
	 * index as source, the IPv4 header's TTL as hop limit. */
	struct ibv_ah_attr attr;
	CHECK(ibv_init_ah_from_wc(ctx, 1, &wc, (struct ibv_grh *)(buf + 1024), &attr) == 0,
	      "init_ah_from_wc: %s", strerror(errno));
	CHECK(attr.is_global == 1 && attr.port_num == 1 && attr.grh.sgid_index == 0, "is_global/port/sgid_index");
	CHECK(memcmp(&attr.grh.dgid, &gid, 16) == 0, "dgid is the sender's address");
	CHECK(attr.grh.hop_limit == 64, "hop_limit %u", attr.grh.hop_limit);
	CHECK(attr.sl == wc.sl && attr.dlid == wc.slid, "sl/dlid from the completion");

	/* b answers a with an AH from the completion. */
	struct ibv_ah *back = ibv_create_ah_from_wc(pd, &wc, (struct ibv_grh *)(buf + 1024), 1);
	CHECK(back, "create_ah_from_wc: %s", strerror(errno));
	strcpy(buf + 512, "pong");
	send_to(b, back, wc.src_qp, buf + 512, 5, mr->lkey);
	struct ibv_wc wc2;
	for (;;) {
		wc2 = wait_wc(cq, IBV_WC_RECV);
		if (wc2.qp_num == a->qp_num)
			break;
	}
	CHECK(wc2.src_qp == b->qp_num && strcmp(buf + 2048 + 40, "pong") == 0, "a got b's answer");

	/* Hand-made GRH areas. IPv6 (RoCE v2): from 2001:db8::1 to our GID. */
	struct ibv_grh g6;
	memset(&g6, 0, sizeof(g6));
	g6.version_tclass_flow = htonl((6u << 28) | (0x2eu << 20) | 0x12345);
	g6.next_hdr = 17;
	g6.hop_limit = 7;
	inet_pton(AF_INET6, "2001:db8::1", g6.sgid.raw);
	g6.dgid = gid;
	struct ibv_wc w6 = { .wc_flags = IBV_WC_GRH, .sl = 3, .slid = 0 };
	CHECK(ibv_init_ah_from_wc(ctx, 1, &w6, &g6, &attr) == 0, "IPv6 GRH: %s", strerror(errno));
	CHECK(memcmp(attr.grh.dgid.raw, g6.sgid.raw, 16) == 0 && attr.grh.hop_limit == 7 &&
		      attr.grh.traffic_class == 0x2e && attr.grh.flow_label == 0x12345 && attr.sl == 3 &&
		      attr.is_global == 1,
	      "IPv6 GRH attributes");
	/* RoCE v1 (next header 0x1b): uroce has no v1 GID. */
	g6.next_hdr = 0x1b;
	errno = 0;
	CHECK(ibv_init_ah_from_wc(ctx, 1, &w6, &g6, &attr) != 0 && errno == ENODATA, "RoCE v1: errno %d", errno);
	CHECK(ibv_create_ah_from_wc(pd, &w6, &g6, 1) == NULL, "no AH for RoCE v1");
	/* A multicast destination. */
	g6.next_hdr = 17;
	g6.dgid.raw[0] = 0xff;
	errno = 0;
	CHECK(ibv_init_ah_from_wc(ctx, 1, &w6, &g6, &attr) != 0 && errno == EINVAL, "multicast: errno %d", errno);
	/* No GRH in the completion: a local (non-global) address. */
	struct ibv_wc w0 = { .wc_flags = 0, .slid = 5 };
	CHECK(ibv_init_ah_from_wc(ctx, 1, &w0, &g6, &attr) == 0 && attr.is_global == 0 && attr.dlid == 5,
	      "no GRH");

	CHECK(ibv_destroy_ah(back) == 0 && ibv_destroy_ah(ah_b) == 0, "destroy_ah");
	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0, "destroy_qp");
	CHECK(ibv_destroy_cq(cq) == 0 && ibv_dereg_mr(mr) == 0 && ibv_dealloc_pd(pd) == 0, "teardown");
	CHECK(ibv_close_device(ctx) == 0, "close_device");
	printf("all ok\n");
	return 0;
}
