/* fork and uroce (README, "fork and uroce"; pyverbs' test_fork):
 * ibv_fork_init() succeeds and ibv_is_fork_initialized() answers
 * IBV_FORK_UNNEEDED, as rdma-core on a current kernel; a child forked while
 * a device is open and a receive is posted exits without touching it, and
 * the parent's device works on: the receive posted before the fork gets
 * the message sent after it, into memory the child got a copy of.
 * Prints "all ok". */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "check.h"

int main(void)
{
	CHECK(ibv_fork_init() == 0, "ibv_fork_init");
	CHECK(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED, "ibv_is_fork_initialized: %d",
	      (int)ibv_is_fork_initialized());
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0, "no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device: %s", strerror(errno));
	ibv_free_device_list(list);
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "query_gid");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	static char buf[4096];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				       .cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1,
						.max_recv_sge = 1 } };
	struct ibv_qp *q = ibv_create_qp(pd, &ia);
	CHECK(pd && cq && mr && q, "objects: %s", strerror(errno));
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 7 };
	CHECK(ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0, "INIT");
	a.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(q, &a, IBV_QP_STATE) == 0, "RTR");
	a.qp_state = IBV_QPS_RTS;
	CHECK(ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "RTS");
	struct ibv_sge rs = { .addr = (uintptr_t)buf + 1024, .length = 128, .lkey = mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 2, .sg_list = &rs, .num_sge = 1 }, *rbad;
	CHECK(ibv_post_recv(q, &rw, &rbad) == 0, "post_recv");

	pid_t child = fork();
	CHECK(child >= 0, "fork: %s", strerror(errno));
	if (child == 0) {
		/* The child leaves the inherited objects alone. */
		buf[1024 + 40] = 'x';
		_exit(0);
	}
	int st;
	CHECK(waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child");

	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .hop_limit = 64 } };
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	CHECK(ah, "create_ah");
	strcpy(buf, "after fork");
	struct ibv_sge ss = { .addr = (uintptr_t)buf, .length = 11, .lkey = mr->lkey };
	struct ibv_send_wr sw = { .wr_id = 1, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *sbad;
	sw.wr.ud.ah = ah;
	sw.wr.ud.remote_qpn = q->qp_num;
	sw.wr.ud.remote_qkey = 7;
	CHECK(ibv_post_send(q, &sw, &sbad) == 0, "post_send");
	int got = 0, recv_ok = 0;
	struct ibv_wc wc;
	for (long spins = 0; got < 2 && spins < 50000000; spins++) {
		if (ibv_poll_cq(cq, 1, &wc) != 1)
			continue;
		got++;
		CHECK(wc.status == IBV_WC_SUCCESS, "completion %s", ibv_wc_status_str(wc.status));
		if (wc.opcode == IBV_WC_RECV)
			recv_ok = strcmp(buf + 1024 + 40, "after fork") == 0;
	}
	CHECK(got == 2 && recv_ok, "the parent's send and receive after the fork (got %d)", got);
	CHECK(ibv_destroy_ah(ah) == 0 && ibv_destroy_qp(q) == 0 && ibv_destroy_cq(cq) == 0 &&
		      ibv_dereg_mr(mr) == 0 && ibv_dealloc_pd(pd) == 0 && ibv_close_device(ctx) == 0,
	      "teardown");
	printf("all ok\n");
	return 0;
}
