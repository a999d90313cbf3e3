/* XRC and RDMA ATOMIC WRITE through the drop-in C ABI, built against
 * Debian's verbs.h: ibv_open_xrcd (argument checks, file sharing, O_CREAT /
 * O_EXCL), ibv_create_srq_ex with IBV_SRQT_XRC and ibv_get_srq_num, XRC_RECV
 * QPs from ibv_create_qp_ex, XRC_SEND QPs from ibv_create_qp (old post-send
 * API, wr.qp_type.xrc.remote_srqn) and ibv_create_qp_ex (ibv_wr_set_xrc_srqn),
 * receives completing on each SRQ's CQ, an RDMA WRITE checked against the
 * SRQ's PD, ibv_close_xrcd's EBUSY; then ATOMIC WRITE with ibv_wr_atomic_write
 * and ibv_post_send, and the capability bits. One device, its QPs connected
 * to each other. Exits non-zero with a message on the first failed check;
 * prints "all ok" at the end. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "check.h"
#include "wait.h"
#include "connect.h"

/* IB_UVERBS_DEVICE_ATOMIC_WRITE: newer than Debian 12's kernel headers. */
#define DEVICE_ATOMIC_WRITE (1ULL << 40)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;

static struct ibv_srq *xrc_srq(struct ibv_xrcd *xrcd, struct ibv_cq *cq)
{
	struct ibv_srq_init_attr_ex a = {
		.attr = { .max_wr = 8, .max_sge = 1 },
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ,
		.srq_type = IBV_SRQT_XRC,
		.pd = pd,
		.xrcd = xrcd,
		.cq = cq,
	};
	struct ibv_srq *s = ibv_create_srq_ex(ctx, &a);
	CHECK(s, "create_srq_ex(XRC): %s", strerror(errno));
	return s;
}

static struct ibv_qp *xrc_recv_qp(struct ibv_xrcd *xrcd)
{
	struct ibv_qp_init_attr_ex a = { .qp_type = IBV_QPT_XRC_RECV, .comp_mask = IBV_QP_INIT_ATTR_XRCD, .xrcd = xrcd };
	struct ibv_qp *q = ibv_create_qp_ex(ctx, &a);
	CHECK(q, "create XRC_RECV: %s", strerror(errno));
	CHECK(q->qp_type == IBV_QPT_XRC_RECV && !q->pd && !q->send_cq && !q->recv_cq, "XRC_RECV has no PD or CQs");
	return q;
}

static void post_srq_recv(struct ibv_srq *s, struct ibv_mr *mr, size_t off, uint64_t id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)mr->addr + off, .length = 64, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK(ibv_post_srq_recv(s, &wr, &bad) == 0, "post_srq_recv");
}

static void xrcd_open_rules(void)
{
	struct ibv_xrcd_init_attr a = { .comp_mask = IBV_XRCD_INIT_ATTR_FD, .fd = -1 };
	errno = 0;
	CHECK(!ibv_open_xrcd(ctx, &a) && errno == EINVAL, "FD without OFLAGS: errno %d", errno);
	a.comp_mask = IBV_XRCD_INIT_ATTR_RESERVED;
	CHECK(!ibv_open_xrcd(ctx, &a) && errno == EOPNOTSUPP, "reserved mask bit: errno %d", errno);

	char path[] = "/tmp/uroce-xrc-test-XXXXXX";
	int fd = mkstemp(path);
	CHECK(fd >= 0, "mkstemp");
	unlink(path);
	a = (struct ibv_xrcd_init_attr){ .comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS, .fd = fd };
	CHECK(!ibv_open_xrcd(ctx, &a) && errno == EAGAIN, "no domain yet, no O_CREAT: errno %d", errno);
	a.oflags = O_CREAT;
	struct ibv_xrcd *x1 = ibv_open_xrcd(ctx, &a);
	CHECK(x1, "O_CREAT: %s", strerror(errno));
	struct ibv_xrcd *x2 = ibv_open_xrcd(ctx, &a);
	CHECK(x2, "second open of the file's domain: %s", strerror(errno));
	a.oflags = O_CREAT | O_EXCL;
	CHECK(!ibv_open_xrcd(ctx, &a) && errno == EINVAL, "O_EXCL on an existing domain: errno %d", errno);
	a.fd = 1000;
	CHECK(!ibv_open_xrcd(ctx, &a) && errno == EBADF, "closed fd: errno %d", errno);

	/* An SRQ made through one handle is reachable through the other's QP:
	 * one domain. Checked end to end by the traffic below for a private
	 * domain; here the handle rules. */
	struct ibv_cq *cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	struct ibv_srq *s = xrc_srq(x2, cq);
	CHECK(ibv_close_xrcd(x2) == EBUSY, "close with an SRQ");
	CHECK(ibv_close_xrcd(x1) == 0, "the other handle closes");
	CHECK(ibv_destroy_cq(cq) == EBUSY, "an XRC SRQ holds its CQ");
	CHECK(ibv_destroy_srq(s) == 0 && ibv_close_xrcd(x2) == 0 && ibv_destroy_cq(cq) == 0, "teardown");
	a.oflags = 0;
	a.fd = fd;
	CHECK(!ibv_open_xrcd(ctx, &a) && errno == EAGAIN, "the last close ended the domain: errno %d", errno);
	close(fd);
}

static void xrc_traffic(void)
{
	struct ibv_xrcd_init_attr xa = { .comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS, .fd = -1 };
	struct ibv_xrcd *xrcd = ibv_open_xrcd(ctx, &xa);
	CHECK(xrcd && xrcd->context == ctx, "open_xrcd: %s", strerror(errno));
	struct ibv_cq *scq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_cq *rcq1 = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_cq *rcq2 = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(scq && rcq1 && rcq2, "create_cq");

	/* SRQ checks: an XRC SRQ needs its CQ; tag matching is not there; a
	 * basic SRQ has no SRQ number. */
	struct ibv_srq_init_attr_ex bad = { .attr = { .max_wr = 4, .max_sge = 1 },
					    .comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD,
					    .srq_type = IBV_SRQT_XRC, .pd = pd, .xrcd = xrcd };
	CHECK(!ibv_create_srq_ex(ctx, &bad) && errno == EINVAL, "XRC SRQ without CQ: errno %d", errno);
	bad.srq_type = IBV_SRQT_TM;
	CHECK(!ibv_create_srq_ex(ctx, &bad) && errno == EOPNOTSUPP, "TM SRQ: errno %d", errno);
	struct ibv_srq_init_attr_ex basic_a = { .attr = { .max_wr = 4, .max_sge = 1 },
						.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ,
						.srq_type = IBV_SRQT_BASIC, .pd = pd, .cq = scq };
	struct ibv_srq *basic = ibv_create_srq_ex(ctx, &basic_a);
	uint32_t n;
	CHECK(basic && ibv_get_srq_num(basic, &n) == EOPNOTSUPP, "basic SRQ number");
	CHECK(ibv_destroy_srq(basic) == 0, "destroy basic");

	struct ibv_srq *srq1 = xrc_srq(xrcd, rcq1), *srq2 = xrc_srq(xrcd, rcq2);
	uint32_t n1, n2;
	CHECK(ibv_get_srq_num(srq1, &n1) == 0 && ibv_get_srq_num(srq2, &n2) == 0 && n1 != n2, "srq numbers");

	/* An RC QP cannot use an XRC SRQ; XRC_RECV needs the XRCD. */
	struct ibv_qp_init_attr ra = { .send_cq = scq, .recv_cq = scq, .srq = srq1, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 4, .max_send_sge = 1 } };
	CHECK(!ibv_create_qp(pd, &ra) && errno == EINVAL, "RC QP with an XRC SRQ: errno %d", errno);
	struct ibv_qp_init_attr_ex noxrcd = { .qp_type = IBV_QPT_XRC_RECV, .comp_mask = IBV_QP_INIT_ATTR_PD, .pd = pd };
	CHECK(!ibv_create_qp_ex(ctx, &noxrcd) && errno == EINVAL, "XRC_RECV without XRCD: errno %d", errno);

	/* Initiator 1: ibv_create_qp, no receive CQ; initiator 2: ibv_create_qp_ex. */
	struct ibv_qp_init_attr ia = { .send_cq = scq, .qp_type = IBV_QPT_XRC_SEND, .sq_sig_all = 1,
				       .cap = { .max_send_wr = 8, .max_send_sge = 1 } };
	struct ibv_qp *ini1 = ibv_create_qp(pd, &ia);
	CHECK(ini1 && !ini1->recv_cq && ia.cap.max_recv_wr == 0, "create XRC_SEND: %s", strerror(errno));
	struct ibv_qp_init_attr_ex iax = { .send_cq = scq, .qp_type = IBV_QPT_XRC_SEND, .sq_sig_all = 1,
					   .cap = { .max_send_wr = 8, .max_send_sge = 1 },
					   .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = pd,
					   .send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE };
	struct ibv_qp *ini2 = ibv_create_qp_ex(ctx, &iax);
	CHECK(ini2, "create_qp_ex XRC_SEND: %s", strerror(errno));
	struct ibv_qp_ex *qx2 = ibv_qp_to_qp_ex(ini2);
	CHECK(qx2->wr_set_xrc_srqn && !qx2->wr_atomic_write, "XRC_SEND builders");
	iax.send_ops_flags = IBV_QP_EX_WITH_ATOMIC_WRITE;
	CHECK(!ibv_create_qp_ex(ctx, &iax) && errno == EOPNOTSUPP, "ATOMIC WRITE on XRC: errno %d", errno);
	struct ibv_qp *tgt1 = xrc_recv_qp(xrcd), *tgt2 = xrc_recv_qp(xrcd);
	connect_qp(ini1, tgt1->qp_num, &gid);
	connect_qp(tgt1, ini1->qp_num, &gid);
	connect_qp(ini2, tgt2->qp_num, &gid);
	connect_qp(tgt2, ini2->qp_num, &gid);

	char *buf = calloc(1, 4096);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(mr, "reg_mr");
	post_srq_recv(srq1, mr, 1024, 11);
	post_srq_recv(srq2, mr, 2048, 22);
	struct ibv_recv_wr rwr = { .wr_id = 1 }, *rbad;
	CHECK(ibv_post_recv(tgt1, &rwr, &rbad) == EINVAL, "an XRC QP has no receive queue");

	/* Old API: wr.qp_type.xrc.remote_srqn. */
	strcpy(buf, "to srq1");
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
	struct ibv_send_wr sw = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND }, *sbad;
	sw.qp_type.xrc.remote_srqn = n1;
	CHECK(ibv_post_send(ini1, &sw, &sbad) == 0, "post_send XRC");
	struct ibv_wc wc = wait_wc(scq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND && wc.wr_id == 1, "send status %d", wc.status);
	wc = wait_wc(rcq1);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 11 && wc.byte_len == 8 && wc.src_qp == ini1->qp_num,
	      "srq1 receive: status %d id %lu", wc.status, (unsigned long)wc.wr_id);
	CHECK(!strcmp(buf + 1024, "to srq1"), "srq1 data");

	/* New API: ibv_wr_set_xrc_srqn; then an RDMA WRITE through srq2's PD. */
	strcpy(buf + 8, "to srq2");
	ibv_wr_start(qx2);
	qx2->wr_id = 2;
	ibv_wr_send(qx2);
	ibv_wr_set_xrc_srqn(qx2, n2);
	ibv_wr_set_sge(qx2, mr->lkey, (uintptr_t)buf + 8, 8);
	qx2->wr_id = 3;
	ibv_wr_rdma_write(qx2, mr->rkey, (uintptr_t)buf + 3000);
	ibv_wr_set_xrc_srqn(qx2, n2);
	ibv_wr_set_sge(qx2, mr->lkey, (uintptr_t)buf + 8, 8);
	CHECK(ibv_wr_complete(qx2) == 0, "wr_complete");
	CHECK(wait_wc(scq).wr_id == 2 && wait_wc(scq).wr_id == 3, "new-API completions in order");
	wc = wait_wc(rcq2);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 22, "srq2 receive");
	CHECK(!strcmp(buf + 2048, "to srq2") && !strcmp(buf + 3000, "to srq2"), "srq2 data and WRITE");
	struct ibv_wc none;
	CHECK(ibv_poll_cq(rcq1, 1, &none) == 0 && ibv_poll_cq(rcq2, 1, &none) == 0, "nothing else");

	CHECK(ibv_close_xrcd(xrcd) == EBUSY, "close_xrcd with SRQs and QPs");
	CHECK(ibv_destroy_qp(ini1) == 0 && ibv_destroy_qp(ini2) == 0 && ibv_destroy_qp(tgt1) == 0 &&
	      ibv_destroy_qp(tgt2) == 0, "destroy QPs");
	CHECK(ibv_destroy_srq(srq1) == 0 && ibv_destroy_srq(srq2) == 0, "destroy SRQs");
	CHECK(ibv_close_xrcd(xrcd) == 0, "close_xrcd");
	CHECK(ibv_dereg_mr(mr) == 0, "dereg");
	CHECK(!ibv_destroy_cq(scq) && !ibv_destroy_cq(rcq1) && !ibv_destroy_cq(rcq2), "destroy CQs");
	free(buf);
}

static void atomic_write(void)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr_ex a = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
					 .cap = { .max_send_wr = 8, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
					 .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = pd,
					 .send_ops_flags = IBV_QP_EX_WITH_ATOMIC_WRITE };
	struct ibv_qp *q[2] = { ibv_create_qp_ex(ctx, &a), ibv_create_qp_ex(ctx, &a) };
	CHECK(q[0] && q[1], "create RC with ATOMIC WRITE: %s", strerror(errno));
	a.qp_type = IBV_QPT_UC;
	CHECK(!ibv_create_qp_ex(ctx, &a) && errno == EOPNOTSUPP, "ATOMIC WRITE on UC: errno %d", errno);
	connect_qp(q[0], q[1]->qp_num, &gid);
	connect_qp(q[1], q[0]->qp_num, &gid);
	uint64_t *mem = aligned_alloc(64, 64);
	memset(mem, 0, 64);
	struct ibv_mr *mr = ibv_reg_mr(pd, mem, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(mr, "reg_mr");

	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(q[0]);
	CHECK(qx->wr_atomic_write && !qx->wr_send, "only the builders asked for");
	const char value[8] = "atomic!";
	ibv_wr_start(qx);
	qx->wr_id = 7;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_write(qx, mr->rkey, (uintptr_t)&mem[2], value);
	CHECK(ibv_wr_complete(qx) == 0, "wr_complete");
	struct ibv_wc wc = wait_wc(cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_ATOMIC_WRITE && wc.wr_id == 7 && wc.byte_len == 8,
	      "atomic write: status %d opcode %d", wc.status, wc.opcode);
	CHECK(!memcmp(&mem[2], value, 8), "the bytes as given");

	/* The old API: the 8 bytes from the SGE; other lengths are EINVAL. */
	mem[7] = 0x0102030405060708ULL;
	struct ibv_sge sge = { .addr = (uintptr_t)&mem[7], .length = 8, .lkey = mr->lkey };
	struct ibv_send_wr sw = { .wr_id = 8, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_ATOMIC_WRITE,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	sw.wr.rdma.remote_addr = (uintptr_t)&mem[4];
	sw.wr.rdma.rkey = mr->rkey;
	CHECK(ibv_post_send(q[0], &sw, &bad) == 0, "post ATOMIC WRITE");
	wc = wait_wc(cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_ATOMIC_WRITE, "old-API atomic write");
	CHECK(mem[4] == 0x0102030405060708ULL, "value written");
	sge.length = 4;
	CHECK(ibv_post_send(q[0], &sw, &bad) == EINVAL && bad == &sw, "4-byte ATOMIC WRITE");

	/* Misaligned: the responder refuses it (NAK invalid request). */
	sge.length = 8;
	sw.wr.rdma.remote_addr = (uintptr_t)&mem[1] + 4;
	CHECK(ibv_post_send(q[0], &sw, &bad) == 0, "post misaligned");
	wc = wait_wc(cq);
	CHECK(wc.status == IBV_WC_REM_INV_REQ_ERR, "misaligned: status %d", wc.status);

	CHECK(!ibv_destroy_qp(q[0]) && !ibv_destroy_qp(q[1]) && !ibv_dereg_mr(mr) && !ibv_destroy_cq(cq), "teardown");
	free(mem);
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "no device");
	ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device");
	ibv_free_device_list(list);
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "query_gid");
	pd = ibv_alloc_pd(ctx);
	CHECK(pd, "alloc_pd");

	struct ibv_device_attr_ex dx;
	CHECK(ibv_query_device_ex(ctx, NULL, &dx) == 0, "query_device_ex");
	CHECK(dx.orig_attr.device_cap_flags & IBV_DEVICE_XRC, "IBV_DEVICE_XRC");
	CHECK(dx.device_cap_flags_ex & DEVICE_ATOMIC_WRITE, "IB_UVERBS_DEVICE_ATOMIC_WRITE");
	CHECK((dx.xrc_odp_caps & (IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_SRQ_RECV)) ==
		      (IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_SRQ_RECV),
	      "xrc_odp_caps");

	xrcd_open_rules();
	xrc_traffic();
	atomic_write();

	CHECK(ibv_dealloc_pd(pd) == 0, "dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "close_device");
	printf("all ok\n");
	return 0;
}
