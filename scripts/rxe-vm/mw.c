/* uroce-mw: memory windows over RC between two hosts, for the kernel-rxe
 * test (crates/uroce-ibverbs/tests/kernel_rxe.rs). The same program runs in
 * the VM against kernel rxe and on the host through uroce's drop-in.
 *
 * Usage: uroce-mw -g GID_INDEX [-p PORT] [SERVER]   (no SERVER: the server)
 *
 * The server registers a buffer with MW_BIND, binds a type 2 window (by a
 * BIND_MW work request) on its first half and a type 1 window
 * (ibv_bind_mw) on its second half, and gives the client their rkeys over
 * TCP. The client WRITEs through each and READs back through the type 2,
 * then sends SEND_WITH_INV naming the type 2 rkey: the server's receive
 * completion must carry IBV_WC_WITH_INV and that rkey, the bytes must be
 * where the windows put them, and a WRITE through the invalidated rkey must
 * then fail with IBV_WC_REM_ACCESS_ERR. Prints "mw ok" and exits 0. */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define DIE(...) do { fprintf(stderr, "uroce-mw: " __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)
#define CHECK(c, ...) do { if (!(c)) DIE(__VA_ARGS__); } while (0)

struct info {
	uint32_t qpn, psn;
	union ibv_gid gid;
	uint32_t rkey2, rkey1;
	uint64_t addr2, addr1;
};

static struct ibv_cq *cq;

/* The next completion (10 s at most). */
static struct ibv_wc next_wc(void)
{
	struct ibv_wc wc;
	time_t end = time(NULL) + 10;
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0, "poll_cq");
		if (n == 1)
			return wc;
		CHECK(time(NULL) < end, "no completion in 10 s");
		usleep(100);
	}
}

static int tcp(const char *server, const char *port)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE }, *res;
	CHECK(getaddrinfo(server, port, &hints, &res) == 0, "getaddrinfo");
	int s = socket(res->ai_family, res->ai_socktype, 0);
	CHECK(s >= 0, "socket");
	if (server) {
		for (int i = 0; connect(s, res->ai_addr, res->ai_addrlen); i++) {
			CHECK(i < 100, "couldn't connect to %s:%s", server, port);
			usleep(100000);
		}
		freeaddrinfo(res);
		return s;
	}
	int one = 1;
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	CHECK(bind(s, res->ai_addr, res->ai_addrlen) == 0 && listen(s, 1) == 0, "bind/listen");
	int c = accept(s, NULL, NULL);
	CHECK(c >= 0, "accept");
	close(s);
	freeaddrinfo(res);
	return c;
}

static void xfer(int s, void *out, void *in, size_t n)
{
	CHECK(write(s, out, n) == (ssize_t)n, "tcp write");
	for (size_t got = 0; got < n;) {
		ssize_t r = read(s, (char *)in + got, n - got);
		CHECK(r > 0, "tcp read");
		got += r;
	}
}

static void post(struct ibv_qp *qp, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	wr->send_flags |= IBV_SEND_SIGNALED;
	CHECK(ibv_post_send(qp, wr, &bad) == 0, "post_send opcode %d: %m", wr->opcode);
}

/* One RDMA WRITE or READ of `len` bytes at `buf` to or from `addr`/`rkey`;
 * its completion's status. */
static enum ibv_wc_status one_op(struct ibv_qp *qp, enum ibv_wr_opcode op, char *buf, uint32_t len,
				 struct ibv_mr *mr, uint64_t addr, uint32_t rkey)
{
	struct ibv_sge sg = { (uintptr_t)buf, len, mr->lkey };
	struct ibv_send_wr w = { .wr_id = 3, .sg_list = &sg, .num_sge = 1, .opcode = op };
	w.wr.rdma.remote_addr = addr;
	w.wr.rdma.rkey = rkey;
	post(qp, &w);
	return next_wc().status;
}

int main(int argc, char **argv)
{
	int gidx = 0, opt;
	const char *port = "18600";
	while ((opt = getopt(argc, argv, "g:p:")) != -1) {
		if (opt == 'g')
			gidx = atoi(optarg);
		else if (opt == 'p')
			port = optarg;
		else
			DIE("usage: uroce-mw -g GID_INDEX [-p PORT] [SERVER]");
	}
	const char *server = optind < argc ? argv[optind] : NULL;

	struct ibv_device **devs = ibv_get_device_list(NULL);
	CHECK(devs && devs[0], "no RDMA device");
	struct ibv_context *ctx = ibv_open_device(devs[0]);
	CHECK(ctx, "open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(pd && cq, "pd/cq");
	struct ibv_qp_init_attr qia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
					.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &qia);
	CHECK(qp, "create_qp: %m");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), "INIT");

	static char buf[4096] __attribute__((aligned(4096))), rbuf[64];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
					       IBV_ACCESS_MW_BIND);
	struct ibv_mr *rmr = ibv_reg_mr(pd, rbuf, sizeof rbuf, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr && rmr, "reg_mr: %m");
	if (!server) {
		struct ibv_sge sge = { (uintptr_t)rbuf, sizeof rbuf, rmr->lkey };
		struct ibv_recv_wr rw = { .wr_id = 9, .sg_list = &sge, .num_sge = 1 }, *bad;
		CHECK(!ibv_post_recv(qp, &rw, &bad), "post_recv");
	}

	struct info me = { .qpn = qp->qp_num, .psn = lrand48() & 0xffffff }, peer;
	CHECK(!ibv_query_gid(ctx, 1, gidx, &me.gid), "query_gid %d", gidx);
	int s = tcp(server, port);
	xfer(s, &me, &peer, sizeof me);

	a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = peer.qpn,
				  .rq_psn = peer.psn, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
				  .ah_attr = { .is_global = 1, .port_num = 1,
					       .grh = { .dgid = peer.gid, .sgid_index = gidx, .hop_limit = 1 } } };
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER), "RTR: %m");
	a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .timeout = 18, .retry_cnt = 7, .rnr_retry = 7,
				  .sq_psn = me.psn, .max_rd_atomic = 1 };
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				       IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC), "RTS: %m");

	char go = 'g', ack;
	struct ibv_wc wc;
	if (!server) {
		/* Bind the windows. */
		struct ibv_mw *mw2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2), *mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
		CHECK(mw2 && mw1, "alloc_mw: %m");
		uint32_t rkey2 = ibv_inc_rkey(mw2->rkey);
		struct ibv_send_wr bw = { .wr_id = 2, .opcode = IBV_WR_BIND_MW };
		bw.bind_mw.mw = mw2;
		bw.bind_mw.rkey = rkey2;
		bw.bind_mw.bind_info = (struct ibv_mw_bind_info){ mr, (uintptr_t)buf, 2048,
								  IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
		post(qp, &bw);
		wc = next_wc();
		CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW, "type 2 bind: %s",
		      ibv_wc_status_str(wc.status));
		struct ibv_mw_bind b1 = { .wr_id = 1, .send_flags = IBV_SEND_SIGNALED,
					  .bind_info = { mr, (uintptr_t)buf + 2048, 2048, IBV_ACCESS_REMOTE_WRITE } };
		CHECK(!ibv_bind_mw(qp, mw1, &b1), "bind_mw (type 1): %m");
		wc = next_wc();
		CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW, "type 1 bind: %s",
		      ibv_wc_status_str(wc.status));
		me.rkey2 = rkey2;
		me.addr2 = (uintptr_t)buf;
		me.rkey1 = mw1->rkey;
		me.addr1 = (uintptr_t)buf + 2048;
		xfer(s, &me, &peer, sizeof me);
		/* The client's SEND_WITH_INV. Linux rxe (6.1) puts the kernel's
		 * IB_WC_WITH_INVALIDATE (1 << 2) in wc_flags, which is libibverbs'
		 * IBV_WC_IP_CSUM_OK; IBV_WC_WITH_INV is 1 << 3. */
		int rxe = !strncmp(ibv_get_device_name(devs[0]), "rxe", 3);
		unsigned inv = IBV_WC_WITH_INV | (rxe ? IBV_WC_IP_CSUM_OK : 0);
		wc = next_wc();
		CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 9 && (wc.wc_flags & inv) &&
			      wc.invalidated_rkey == rkey2,
		      "receive of SEND_WITH_INV: %s, flags %#x, rkey %#x (want %#x)", ibv_wc_status_str(wc.status),
		      wc.wc_flags, wc.invalidated_rkey, rkey2);
		CHECK(!strcmp(buf, "through window two") && !strcmp(buf + 2048, "through window one") &&
			      !strcmp(rbuf, "invalidate"),
		      "bytes: '%s' '%s' '%s'", buf, buf + 2048, rbuf);
		xfer(s, &go, &ack, 1); /* invalidated: the client may try */
		xfer(s, &go, &ack, 1); /* the client is done */
	} else {
		static char lbuf[256];
		struct ibv_mr *lmr = ibv_reg_mr(pd, lbuf, sizeof lbuf, IBV_ACCESS_LOCAL_WRITE);
		CHECK(lmr, "reg_mr");
		xfer(s, &me, &peer, sizeof me);
		strcpy(lbuf, "through window two");
		strcpy(lbuf + 32, "through window one");
		strcpy(lbuf + 64, "invalidate");
		enum ibv_wc_status st = one_op(qp, IBV_WR_RDMA_WRITE, lbuf, 32, lmr, peer.addr2, peer.rkey2);
		CHECK(st == IBV_WC_SUCCESS, "WRITE through the type 2 window: %s", ibv_wc_status_str(st));
		st = one_op(qp, IBV_WR_RDMA_WRITE, lbuf + 32, 32, lmr, peer.addr1, peer.rkey1);
		CHECK(st == IBV_WC_SUCCESS, "WRITE through the type 1 window: %s", ibv_wc_status_str(st));
		st = one_op(qp, IBV_WR_RDMA_READ, lbuf + 128, 32, lmr, peer.addr2, peer.rkey2);
		CHECK(st == IBV_WC_SUCCESS && !strcmp(lbuf + 128, "through window two"),
		      "READ through the type 2 window: %s, '%s'", ibv_wc_status_str(st), lbuf + 128);
		struct ibv_sge sg = { (uintptr_t)lbuf + 64, 16, lmr->lkey };
		struct ibv_send_wr inv = { .wr_id = 4, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_INV,
					   .invalidate_rkey = peer.rkey2 };
		post(qp, &inv);
		wc = next_wc();
		CHECK(wc.status == IBV_WC_SUCCESS, "SEND_WITH_INV: %s", ibv_wc_status_str(wc.status));
		xfer(s, &go, &ack, 1);
		st = one_op(qp, IBV_WR_RDMA_WRITE, lbuf, 32, lmr, peer.addr2, peer.rkey2);
		CHECK(st == IBV_WC_REM_ACCESS_ERR, "WRITE through the invalidated window: %s (want %s)",
		      ibv_wc_status_str(st), ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR));
		xfer(s, &go, &ack, 1);
	}
	printf("mw ok\n");
	return 0;
}
