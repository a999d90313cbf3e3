/* librdmacm's behaviour through the drop-ins, in one process with one
 * device (tests/rdmacm.rs): the channel fd polls and reads as the kernel's
 * (EAGAIN when non-blocking), bad arguments get librdmacm's errno, an RC
 * connection to this process's own listener carries private data both ways
 * and a message, rdma_init_qp_attr gives the attributes of the state asked
 * for, rdma_set_ack_timeout sets the QP's timeout, both sides see
 * DISCONNECTED; a synchronous connect to a closed port fails ECONNREFUSED;
 * unsupported calls (a raw rsocket too) fail EOPNOTSUPP. Prints "all ok". */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

static struct rdma_cm_event *next(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *e;
	CHECK(poll(&p, 1, 10000) == 1, "no event %s within 10 s", rdma_event_str(want));
	CHECK(rdma_get_cm_event(ch, &e) == 0, "get_cm_event: %m");
	CHECK(e->event == want, "got %s (status %d), want %s", rdma_event_str(e->event), e->status,
	      rdma_event_str(want));
	return e;
}

int main(int argc, char **argv)
{
	const char *ip = getenv("UROCE_ADDR");
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(7480) };
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *listen, *cli, *srv, *bad;
	struct rdma_cm_event *e;
	struct rdma_addrinfo *ai;
	struct ibv_qp_init_attr qa;
	struct ibv_qp_attr attr;
	struct rdma_conn_param cp;
	char buf[64];
	int mask;

	CHECK(ip && inet_pton(AF_INET, ip, &sa.sin_addr) == 1, "UROCE_ADDR");
	CHECK(ch, "create_event_channel: %m");
	CHECK(!strcmp(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED"), "event_str");
	CHECK(!strcmp(rdma_event_str(99), "UNKNOWN EVENT"), "event_str 99");
	errno = 0;
	CHECK(rdma_getaddrinfo(NULL, NULL, NULL, &ai) == -1 && errno == EINVAL, "getaddrinfo(NULL): %m");
	CHECK(rdma_create_id(ch, &bad, NULL, 0x999) == -1 && errno == EINVAL, "create_id bad ps");
	CHECK(rsocket(AF_INET, SOCK_RAW, 0) == -1 && errno == EOPNOTSUPP, "rsocket raw");

	/* Non-blocking: EAGAIN, and poll says not readable. */
	CHECK(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0, "fcntl");
	CHECK(rdma_get_cm_event(ch, &e) == -1 && errno == EAGAIN, "nonblocking get: %m");
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	CHECK(poll(&p, 1, 0) == 0, "empty channel polls readable");

	/* A listener and a client id on the same channel. */
	CHECK(rdma_create_id(ch, &listen, NULL, RDMA_PS_TCP) == 0, "create_id");
	CHECK(rdma_bind_addr(listen, (struct sockaddr *)&sa) == 0, "bind: %m");
	CHECK(listen->verbs && listen->pd, "bound id has verbs and pd");
	CHECK(rdma_listen(listen, 4) == 0, "listen: %m");
	CHECK(rdma_get_src_port(listen) == htons(7480), "src port");
	CHECK(rdma_join_multicast(listen, (struct sockaddr *)&sa, NULL) == -1 && errno == EOPNOTSUPP, "mcast");

	/* Binding to port 0 takes an ephemeral port, as the kernel does. */
	struct rdma_cm_id *eph;
	struct sockaddr_in any = sa;
	any.sin_port = 0;
	CHECK(rdma_create_id(ch, &eph, NULL, RDMA_PS_TCP) == 0, "create_id");
	CHECK(rdma_bind_addr(eph, (struct sockaddr *)&any) == 0 && rdma_get_src_port(eph) != 0, "ephemeral bind");
	CHECK(rdma_destroy_id(eph) == 0, "destroy ephemeral");

	CHECK(rdma_create_id(ch, &cli, NULL, RDMA_PS_TCP) == 0, "create_id");
	CHECK(rdma_resolve_addr(cli, NULL, (struct sockaddr *)&sa, 2000) == 0, "resolve_addr: %m");
	e = next(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(e->id == cli && e->status == 0, "addr event id");
	rdma_ack_cm_event(e);
	CHECK(rdma_resolve_route(cli, 2000) == 0, "resolve_route: %m");
	rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	CHECK(cli->verbs == listen->verbs, "one context per device");

	memset(&qa, 0, sizeof qa);
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qa.sq_sig_all = 1;
	CHECK(rdma_create_qp(cli, NULL, &qa) == 0, "create_qp: %m");
	CHECK(cli->qp && cli->send_cq && cli->recv_cq && cli->qp->state == IBV_QPS_INIT, "client QP in INIT");
	memset(&cp, 0, sizeof cp);
	cp.private_data = "hello";
	cp.private_data_len = 6;
	cp.retry_count = cp.rnr_retry_count = 7;
	/* Depths above the device's limit are EINVAL (librdmacm's ucma_valid_param);
	 * RDMA_MAX_RESP_RES / RDMA_MAX_INIT_DEPTH ask for the device's limit. */
	struct ibv_device_attr da;
	CHECK(ibv_query_device(cli->verbs, &da) == 0 && da.max_qp_rd_atom == 128 && da.max_qp_init_rd_atom == 128,
	      "device depths");
	cp.responder_resources = 200;
	cp.initiator_depth = 1;
	CHECK(rdma_connect(cli, &cp) == -1 && errno == EINVAL, "responder resources above the device's");
	cp.responder_resources = 1;
	cp.initiator_depth = 129;
	CHECK(rdma_connect(cli, &cp) == -1 && errno == EINVAL, "initiator depth above the device's");
	cp.responder_resources = RDMA_MAX_RESP_RES;
	cp.initiator_depth = RDMA_MAX_INIT_DEPTH;
	/* Not connected yet: the state asked for with port, P_Key index and no
	 * remote access (the kernel's cma_ib_init_qp_attr). */
	memset(&attr, 0x5a, sizeof attr);
	attr.qp_state = IBV_QPS_INIT;
	CHECK(rdma_init_qp_attr(cli, &attr, &mask) == 0 && attr.qp_state == IBV_QPS_INIT && attr.port_num == 1 &&
		      attr.qp_access_flags == 0 &&
		      mask == (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
	      "init_qp_attr before connect");
	/* rdma_set_ack_timeout: the QP's timeout at RTS (and in init_qp_attr). */
	uint8_t ack = 21;
	CHECK(rdma_set_option(cli, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &ack, 4) == -1 && errno == EINVAL,
	      "ack timeout of 4 bytes");
	CHECK(rdma_set_option(cli, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &ack, 1) == 0, "ack timeout: %m");
	/* An id with a QP says whether it has an SRQ from the QP: the parameter's
	 * srq is not read (libfabric leaves it uninitialised), as librdmacm. */
	cp.srq = 0xa5;
	CHECK(rdma_connect(cli, &cp) == 0, "connect: %m");

	e = next(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	srv = e->id;
	CHECK(e->listen_id == listen && srv != cli && srv->verbs == listen->verbs, "request ids");
	CHECK(e->param.conn.private_data_len == 56 && !strcmp(e->param.conn.private_data, "hello"), "REQ data");
	CHECK(e->param.conn.initiator_depth == 128 && e->param.conn.responder_resources == 128, "REQ depths %u %u",
	      e->param.conn.initiator_depth, e->param.conn.responder_resources);
	CHECK(e->param.conn.srq == 0, "REQ SRQ bit %u from a QP without an SRQ", e->param.conn.srq);
	CHECK(rdma_get_dst_port(srv) == rdma_get_src_port(cli), "ports");
	rdma_ack_cm_event(e);
	qa.send_cq = qa.recv_cq = NULL;
	CHECK(rdma_create_qp(srv, NULL, &qa) == 0, "server create_qp: %m");
	struct ibv_mr *mr = ibv_reg_mr(srv->pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "reg_mr");
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 32, .lkey = mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *brw;
	CHECK(ibv_post_recv(srv->qp, &rw, &brw) == 0, "post_recv");
	cp.private_data = "welcome";
	cp.private_data_len = 8;
	/* The passive side takes what was offered, up to the device's limit, for
	 * "the most"; a number is taken as it is. */
	cp.responder_resources = RDMA_MAX_RESP_RES;
	cp.initiator_depth = 3;
	CHECK(rdma_accept(srv, &cp) == 0, "accept: %m");
	struct ibv_qp_init_attr sia;
	CHECK(ibv_query_qp(srv->qp, &attr, IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MAX_QP_RD_ATOMIC, &sia) == 0 &&
		      attr.max_dest_rd_atomic == 128 && attr.max_rd_atomic == 3,
	      "passive depths %u %u", attr.max_dest_rd_atomic, attr.max_rd_atomic);
	CHECK(srv->qp->state == IBV_QPS_RTS, "passive QP RTS before the REP leaves");

	/* Both ESTABLISHED, in either order. */
	for (int i = 0; i < 2; i++) {
		e = next(ch, RDMA_CM_EVENT_ESTABLISHED);
		if (e->id == cli)
			CHECK(!strcmp(e->param.conn.private_data, "welcome") && e->param.conn.srq == 0,
			      "REP data, no SRQ bit (%u)", e->param.conn.srq);
		else
			CHECK(e->id == srv, "established id");
		rdma_ack_cm_event(e);
	}
	CHECK(cli->qp->state == IBV_QPS_RTS, "active QP RTS");
	struct ibv_qp_init_attr ia;
	CHECK(ibv_query_qp(cli->qp, &attr, IBV_QP_TIMEOUT, &ia) == 0 && attr.timeout == 21, "QP timeout %u",
	      attr.timeout);
	/* The active side: the REP's responder resources (128) bound its depth,
	 * its own responder resources the REP's initiator depth (3). */
	CHECK(ibv_query_qp(cli->qp, &attr, IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MAX_QP_RD_ATOMIC, &ia) == 0 &&
		      attr.max_rd_atomic == 128 && attr.max_dest_rd_atomic == 3,
	      "active depths %u %u", attr.max_rd_atomic, attr.max_dest_rd_atomic);
	/* rdma_init_qp_attr gives the attributes of the state asked for in
	 * attr.qp_state (an external QP is moved that way), EINVAL for others. */
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_RTS;
	CHECK(rdma_init_qp_attr(cli, &attr, &mask) == 0 && attr.qp_state == IBV_QPS_RTS &&
		      (mask & IBV_QP_SQ_PSN) && attr.retry_cnt == 7 && attr.timeout == 21, "init_qp_attr RTS");
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_RTR;
	CHECK(rdma_init_qp_attr(cli, &attr, &mask) == 0 && attr.qp_state == IBV_QPS_RTR && (mask & IBV_QP_DEST_QPN) &&
		      attr.dest_qp_num == srv->qp->qp_num && !(mask & IBV_QP_SQ_PSN),
	      "init_qp_attr RTR");
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_INIT;
	CHECK(rdma_init_qp_attr(cli, &attr, &mask) == 0 && attr.qp_state == IBV_QPS_INIT &&
		      (mask & IBV_QP_ACCESS_FLAGS) && (attr.qp_access_flags & IBV_ACCESS_REMOTE_READ),
	      "init_qp_attr INIT");
	attr.qp_state = IBV_QPS_SQD;
	CHECK(rdma_init_qp_attr(cli, &attr, &mask) == -1 && errno == EINVAL, "init_qp_attr SQD");

	/* A message over the connected QPs. */
	char msg[32] = "over rdma_cm";
	struct ibv_mr *smr = ibv_reg_mr(cli->pd, msg, sizeof msg, 0);
	struct ibv_sge ss = { .addr = (uintptr_t)msg, .length = 32, .lkey = smr->lkey };
	struct ibv_send_wr sw = { .wr_id = 2, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND }, *bsw;
	CHECK(ibv_post_send(cli->qp, &sw, &bsw) == 0, "post_send");
	struct ibv_wc wc;
	int n = 0;
	for (int t = 0; t < 10000 && n == 0; t++) {
		n = ibv_poll_cq(srv->recv_cq, 1, &wc);
		if (!n)
			usleep(1000);
	}
	CHECK(n == 1 && wc.status == IBV_WC_SUCCESS && !strcmp(buf, "over rdma_cm"), "message");

	/* A forked child that exits (exit(), atexit handlers run) leaves the
	 * connections alone: they are its parent's (the kernel's rdma_cm file
	 * stays open). No DREQ, so no event within 300 ms. */
	pid_t child = fork();
	CHECK(child >= 0, "fork: %m");
	if (child == 0)
		exit(0);
	int st = 0;
	CHECK(waitpid(child, &st, 0) == child && WIFEXITED(st), "child exit");
	struct pollfd quiet = { .fd = ch->fd, .events = POLLIN };
	CHECK(poll(&quiet, 1, 300) == 0, "an event after a forked child exited");

	/* Disconnect: both sides DISCONNECTED. */
	CHECK(rdma_disconnect(cli) == 0, "disconnect: %m");
	for (int i = 0; i < 2; i++) {
		e = next(ch, RDMA_CM_EVENT_DISCONNECTED);
		if (e->id == srv)
			CHECK(rdma_disconnect(srv) == 0, "server disconnect: %m");
		rdma_ack_cm_event(e);
	}
	ibv_dereg_mr(mr);
	ibv_dereg_mr(smr);
	rdma_destroy_qp(cli);
	rdma_destroy_qp(srv);
	CHECK(rdma_destroy_id(cli) == 0 && rdma_destroy_id(srv) == 0, "destroy");

	/* Synchronous mode: a connect to a closed port fails ECONNREFUSED. */
	struct sockaddr_in closed = sa;
	closed.sin_port = htons(7481);
	CHECK(rdma_create_id(NULL, &bad, NULL, RDMA_PS_TCP) == 0, "sync create_id");
	CHECK(rdma_resolve_addr(bad, NULL, (struct sockaddr *)&closed, 2000) == 0, "sync resolve: %m");
	CHECK(bad->event && bad->event->event == RDMA_CM_EVENT_ADDR_RESOLVED, "sync event kept in id->event");
	CHECK(rdma_resolve_route(bad, 2000) == 0, "sync route: %m");
	CHECK(rdma_create_qp(bad, NULL, &qa) == 0, "sync create_qp: %m");
	errno = 0;
	CHECK(rdma_connect(bad, NULL) == -1 && errno == ECONNREFUSED, "sync connect to a closed port: %m");
	CHECK(bad->event->event == RDMA_CM_EVENT_REJECTED && bad->event->status == 8, "REJ 8");
	rdma_destroy_qp(bad);
	CHECK(rdma_destroy_id(bad) == 0, "sync destroy");

	CHECK(rdma_destroy_id(listen) == 0, "destroy listener");
	rdma_destroy_event_channel(ch);
	(void)argc;
	(void)argv;
	printf("all ok\n");
	return 0;
}
