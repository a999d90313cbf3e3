/* Asynchronous events and destruction (issue 17 §2), as the kernel with
 * rdma-core: ibv_destroy_qp / _cq / _srq wait until the events
 * delivered about the object are acknowledged (events_completed), and no
 * event is delivered about an object already destroyed. Events come from
 * a QP on an SRQ moved to ERR (IBV_EVENT_QP_LAST_WQE_REACHED), an overrun
 * CQ (IBV_EVENT_CQ_ERR, with the QP's IBV_EVENT_QP_FATAL) and an SRQ below
 * its limit (IBV_EVENT_SRQ_LIMIT_REACHED). Completion events likewise: one
 * not taken goes with its CQ, and destroy_cq waits for ibv_ack_cq_events.
 * Prints "all ok". */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "check.h"
#include "connect.h"

static struct ibv_context *ctx;

static void sleep_ms(int ms)
{
	struct timespec t = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000 };
	nanosleep(&t, NULL);
}

/* Whether an event is pending within `ms`. */
static int event_pending(int ms)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	return poll(&p, 1, ms) == 1;
}

static struct ibv_qp *srq_qp(struct ibv_pd *pd, struct ibv_cq *cq, struct ibv_srq *srq)
{
	struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq, .srq = srq,
				      .cap = { .max_send_wr = 4, .max_send_sge = 1 }, .qp_type = IBV_QPT_RC };
	struct ibv_qp *q = ibv_create_qp(pd, &a);
	CHECK(q, "create_qp: %s", strerror(errno));
	return q;
}

static void to_err(struct ibv_qp *q)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	CHECK(ibv_modify_qp(q, &a, IBV_QP_STATE) == 0, "modify to ERR");
}

struct destroyer {
	void *obj;
	int is_cq; /* 0 QP, 1 CQ, 2 SRQ */
	volatile int done;
	int rc;
};

static void *destroy_thread(void *arg)
{
	struct destroyer *d = arg;
	d->rc = d->is_cq == 2 ? ibv_destroy_srq(d->obj) : d->is_cq ? ibv_destroy_cq(d->obj) : ibv_destroy_qp(d->obj);
	__atomic_store_n(&d->done, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

/* Destroying `obj` (whose event `ev` was delivered and not acknowledged)
 * waits for the acknowledgement. */
static void destroy_waits_for_ack(void *obj, int is_cq, struct ibv_async_event *ev)
{
	struct destroyer d = { .obj = obj, .is_cq = is_cq };
	pthread_t t;
	CHECK(pthread_create(&t, NULL, destroy_thread, &d) == 0, "pthread_create");
	sleep_ms(300);
	CHECK(!__atomic_load_n(&d.done, __ATOMIC_SEQ_CST), "destroy_%s returned (%d) with an event not acknowledged",
	      is_cq ? "cq" : "qp", d.rc);
	ibv_ack_async_event(ev);
	for (int i = 0; i < 500 && !__atomic_load_n(&d.done, __ATOMIC_SEQ_CST); i++)
		sleep_ms(10);
	CHECK(__atomic_load_n(&d.done, __ATOMIC_SEQ_CST), "destroy_%s still waiting after the acknowledgement",
	      is_cq ? "cq" : "qp");
	pthread_join(t, NULL);
	CHECK(d.rc == 0, "destroy rc %d", d.rc);
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0, "no device");
	ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device: %s", strerror(errno));
	ibv_free_device_list(list);
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "query_gid");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_srq_init_attr si = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &si);
	CHECK(pd && cq && srq, "pd/cq/srq");

	/* 1. A delivered, unacknowledged LAST_WQE_REACHED: destroy_qp waits. */
	struct ibv_qp *q = srq_qp(pd, cq, srq);
	to_err(q);
	CHECK(event_pending(2000), "no event after ERR");
	struct ibv_async_event ev;
	CHECK(ibv_get_async_event(ctx, &ev) == 0, "get_async_event");
	CHECK(ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED && ev.element.qp == q,
	      "want LAST_WQE_REACHED of the QP, got %d qp %p", ev.event_type, (void *)ev.element.qp);
	destroy_waits_for_ack(q, 0, &ev);

	/* 2. An event queued for a QP that is then destroyed: never delivered. */
	for (int round = 0; round < 20; round++) {
		struct ibv_qp *q2 = srq_qp(pd, cq, srq);
		to_err(q2);
		CHECK(ibv_destroy_qp(q2) == 0, "destroy_qp with a queued event");
		if (event_pending(round == 0 ? 200 : 0)) {
			CHECK(ibv_get_async_event(ctx, &ev) == 0, "get_async_event");
			CHECK(0, "event %d for a destroyed QP delivered (element %p)", ev.event_type,
			      (void *)ev.element.qp);
		}
	}
	int fl = fcntl(ctx->async_fd, F_GETFL);
	fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
	errno = 0;
	CHECK(ibv_get_async_event(ctx, &ev) == -1 && errno == EAGAIN, "no event left: errno %d", errno);
	fcntl(ctx->async_fd, F_SETFL, fl);

	/* 3. CQ_ERR of an overrun CQ, delivered and not acknowledged:
	 * destroy_cq waits; an undelivered one goes with its CQ. */
	for (int pass = 0; pass < 2; pass++) {
		struct ibv_cq *small = ibv_create_cq(ctx, 1, NULL, NULL, 0);
		CHECK(small, "create_cq 1");
		struct ibv_qp_init_attr ci = { .send_cq = small, .recv_cq = cq,
					       .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
							.max_recv_sge = 1 },
					       .qp_type = IBV_QPT_RC };
		struct ibv_qp *c = ibv_create_qp(pd, &ci), *d = ibv_create_qp(pd, &ci);
		CHECK(c && d, "create_qp");
		connect_qp(c, d->qp_num, &gid);
		connect_qp(d, c->qp_num, &gid);
		static char buf[64];
		struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		CHECK(mr, "reg_mr");
		struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
		struct ibv_send_wr w[2], *bad;
		for (int i = 0; i < 2; i++) {
			memset(&w[i], 0, sizeof(w[i]));
			w[i].wr_id = i;
			w[i].sg_list = &sge;
			w[i].num_sge = 1;
			w[i].opcode = IBV_WR_RDMA_WRITE;
			w[i].send_flags = IBV_SEND_SIGNALED;
			w[i].wr.rdma.remote_addr = (uintptr_t)buf + 32;
			w[i].wr.rdma.rkey = mr->rkey;
			w[i].next = i == 0 ? &w[1] : NULL;
		}
		CHECK(ibv_post_send(c, w, &bad) == 0, "post_send");
		/* Nothing polled until the overrun's event: the second completion
		 * overruns however the two ACKs come (a poll between them would
		 * make room for the second). */
		CHECK(event_pending(5000), "no event after the overrun");
		struct ibv_wc wc;
		int polled = 0;
		for (long spins = 0; spins < 50000000; spins++) {
			int k = ibv_poll_cq(small, 1, &wc);
			if (k < 0)
				break;
			polled += k;
		}
		CHECK(polled == 1, "polled %d from an overrun 1-entry CQ", polled);
		if (pass == 0) {
			/* Take events until CQ_ERR; acknowledge the others. */
			int got_cq_err = 0;
			for (int i = 0; i < 4 && !got_cq_err; i++) {
				CHECK(ibv_get_async_event(ctx, &ev) == 0, "get_async_event");
				if (ev.event_type == IBV_EVENT_CQ_ERR) {
					CHECK(ev.element.cq == small, "CQ_ERR names the CQ");
					got_cq_err = 1;
				} else {
					ibv_ack_async_event(&ev);
				}
			}
			CHECK(got_cq_err, "no CQ_ERR");
			CHECK(ibv_destroy_qp(c) == 0 && ibv_destroy_qp(d) == 0, "destroy_qp");
			destroy_waits_for_ack(small, 1, &ev);
		} else {
			/* Nothing taken: both the QP's and the CQ's events go with them. */
			CHECK(ibv_destroy_qp(c) == 0 && ibv_destroy_qp(d) == 0, "destroy_qp");
			CHECK(ibv_destroy_cq(small) == 0, "destroy_cq");
			if (event_pending(200)) {
				CHECK(ibv_get_async_event(ctx, &ev) == 0, "get_async_event");
				CHECK(0, "event %d for a destroyed object delivered", ev.event_type);
			}
		}
		CHECK(ibv_dereg_mr(mr) == 0, "dereg_mr");
	}

	/* 4. SRQ_LIMIT_REACHED, delivered and not acknowledged: destroy_srq
	 * waits. x (on srq2, limit 2 with 2 receives posted) gets one SEND. */
	{
		struct ibv_srq_init_attr si2 = { .attr = { .max_wr = 4, .max_sge = 1 } };
		struct ibv_srq *srq2 = ibv_create_srq(pd, &si2);
		CHECK(srq2, "create_srq");
		static char sbuf[256];
		struct ibv_mr *mr = ibv_reg_mr(pd, sbuf, sizeof(sbuf), IBV_ACCESS_LOCAL_WRITE);
		CHECK(mr, "reg_mr");
		struct ibv_qp *x = srq_qp(pd, cq, srq2);
		struct ibv_qp_init_attr yi = { .send_cq = cq, .recv_cq = cq,
					       .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
							.max_recv_sge = 1 },
					       .qp_type = IBV_QPT_RC };
		struct ibv_qp *y = ibv_create_qp(pd, &yi);
		CHECK(y, "create_qp y");
		connect_qp(x, y->qp_num, &gid);
		connect_qp(y, x->qp_num, &gid);
		struct ibv_sge sge = { .addr = (uintptr_t)sbuf, .length = 16, .lkey = mr->lkey };
		struct ibv_recv_wr rw[2], *rbad;
		for (int i = 0; i < 2; i++)
			rw[i] = (struct ibv_recv_wr){ .wr_id = 50 + i, .sg_list = &sge, .num_sge = 1,
						      .next = i == 0 ? &rw[1] : NULL };
		CHECK(ibv_post_srq_recv(srq2, rw, &rbad) == 0, "post_srq_recv");
		struct ibv_srq_attr sa = { .srq_limit = 2 };
		CHECK(ibv_modify_srq(srq2, &sa, IBV_SRQ_LIMIT) == 0, "arm the limit");
		struct ibv_send_wr sw = { .wr_id = 60, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED },
				   *sbad;
		CHECK(ibv_post_send(y, &sw, &sbad) == 0, "post_send");
		int got_limit = 0;
		for (int i = 0; i < 4 && !got_limit && event_pending(2000); i++) {
			CHECK(ibv_get_async_event(ctx, &ev) == 0, "get_async_event");
			if (ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED) {
				CHECK(ev.element.srq == srq2, "SRQ_LIMIT_REACHED names the SRQ");
				got_limit = 1;
			} else {
				ibv_ack_async_event(&ev);
			}
		}
		CHECK(got_limit, "no SRQ_LIMIT_REACHED");
		CHECK(ibv_destroy_qp(x) == 0 && ibv_destroy_qp(y) == 0, "destroy_qp x, y");
		/* x's LAST_WQE_REACHED (if raised) went with x. */
		struct destroyer d = { .obj = srq2, .is_cq = 2 };
		pthread_t t;
		CHECK(pthread_create(&t, NULL, destroy_thread, &d) == 0, "pthread_create");
		sleep_ms(300);
		CHECK(!__atomic_load_n(&d.done, __ATOMIC_SEQ_CST), "destroy_srq returned (%d) with an event not acknowledged",
		      d.rc);
		ibv_ack_async_event(&ev);
		pthread_join(t, NULL);
		CHECK(d.rc == 0, "destroy_srq rc %d", d.rc);
		struct ibv_wc wc;
		while (ibv_poll_cq(cq, 1, &wc) == 1)
			;
		CHECK(ibv_dereg_mr(mr) == 0, "dereg_mr");
	}

	/* 5. A completion event not taken goes with its CQ: the channel's fd is
	 * not readable afterwards, and the channel, used by no CQ, is destroyed. */
	{
		struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
		CHECK(ch, "create_comp_channel");
		struct ibv_cq *ccq = ibv_create_cq(ctx, 4, NULL, ch, 0);
		CHECK(ccq, "create_cq on the channel");
		struct ibv_qp_init_attr qi = { .send_cq = ccq, .recv_cq = ccq, .qp_type = IBV_QPT_RC,
					       .cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1,
							.max_recv_sge = 1 } };
		struct ibv_qp *qp = ibv_create_qp(pd, &qi);
		CHECK(qp, "create_qp");
		to_err(qp);
		CHECK(ibv_req_notify_cq(ccq, 0) == 0, "req_notify_cq");
		static char rbuf[16];
		struct ibv_sge sge = { .addr = (uintptr_t)rbuf, .length = 16, .lkey = 0 };
		struct ibv_recv_wr rw = { .wr_id = 70, .sg_list = &sge, .num_sge = 1 }, *rbad;
		CHECK(ibv_post_recv(qp, &rw, &rbad) == 0, "post_recv in ERR (flushed at once)");
		struct pollfd p = { .fd = ch->fd, .events = POLLIN };
		CHECK(poll(&p, 1, 2000) == 1, "no completion event");
		CHECK(ibv_destroy_qp(qp) == 0, "destroy_qp");
		CHECK(ibv_destroy_comp_channel(ch) == EBUSY, "a CQ still uses the channel");
		CHECK(ibv_destroy_cq(ccq) == 0, "destroy_cq with an event not taken");
		p.revents = 0;
		CHECK(poll(&p, 1, 100) == 0, "the channel still signals an event of a destroyed CQ");
		CHECK(ibv_destroy_comp_channel(ch) == 0, "destroy_comp_channel");
	}

	/* 6. A completion event taken and not acknowledged: destroy_cq waits
	 * for ibv_ack_cq_events (rdma-core's comp_events_completed). */
	{
		struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
		struct ibv_cq *ccq = ibv_create_cq(ctx, 4, NULL, ch, 0);
		CHECK(ch && ccq, "channel and CQ");
		struct ibv_qp_init_attr qi = { .send_cq = ccq, .recv_cq = ccq, .qp_type = IBV_QPT_RC,
					       .cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1,
							.max_recv_sge = 1 } };
		struct ibv_qp *qp = ibv_create_qp(pd, &qi);
		CHECK(qp, "create_qp");
		to_err(qp);
		CHECK(ibv_req_notify_cq(ccq, 0) == 0, "req_notify_cq");
		static char rbuf[16];
		struct ibv_sge sge = { .addr = (uintptr_t)rbuf, .length = 16, .lkey = 0 };
		struct ibv_recv_wr rw = { .wr_id = 80, .sg_list = &sge, .num_sge = 1 }, *rbad;
		CHECK(ibv_post_recv(qp, &rw, &rbad) == 0, "post_recv in ERR");
		struct ibv_cq *ev_cq;
		void *ev_ctx;
		CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0 && ev_cq == ccq, "get_cq_event");
		CHECK(ibv_destroy_qp(qp) == 0, "destroy_qp");
		struct destroyer d = { .obj = ccq, .is_cq = 1 };
		pthread_t t;
		CHECK(pthread_create(&t, NULL, destroy_thread, &d) == 0, "pthread_create");
		sleep_ms(300);
		CHECK(!__atomic_load_n(&d.done, __ATOMIC_SEQ_CST),
		      "destroy_cq returned (%d) with a completion event not acknowledged", d.rc);
		ibv_ack_cq_events(ccq, 1);
		pthread_join(t, NULL);
		CHECK(d.rc == 0, "destroy_cq rc %d", d.rc);
		CHECK(ibv_destroy_comp_channel(ch) == 0, "destroy_comp_channel");
	}

	CHECK(ibv_destroy_srq(srq) == 0, "destroy_srq");
	CHECK(ibv_destroy_cq(cq) == 0, "destroy_cq");
	CHECK(ibv_dealloc_pd(pd) == 0, "dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "close_device");
	printf("all ok\n");
	return 0;
}
