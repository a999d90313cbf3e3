/* A thread cancelled while it waits in ibv_get_cq_event (rping cancels its
 * CQ thread so; the wait is a cancellation point, as the kernel's read is)
 * must not stop its device receiving. While a thread waits on a completion
 * channel, uroce lets it read the device's packets and the progress thread
 * leaves them to it; a waiter cancelled in its sleep never says it left,
 * so its claim must run out soon (one sleep, at most 200 ms; the progress
 * thread's own idle sleep is 60 s).
 *
 * The target (this process, UROCE_ADDR) cancels its waiter and then calls
 * uroce no more; a forked writer (its own device at the next address)
 * then does an RDMA WRITE into it, which only the target's progress thread
 * can execute: it must land within 10 s and complete with success at the
 * writer. (While a waiter's claim lasts, the progress thread receives
 * every 500 µs instead of sleeping on the packets: reception goes on, at
 * a cost.) Then the target idles: its progress thread must sleep, waking
 * fewer than 100 times in 2 s (a claim of a waiter cancelled in a 60 s
 * sleep kept it waking ~2 000 times a second). Prints "all ok". */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <infiniband/verbs.h>

#include "check.h"
#include "connect.h"

struct info {
	uint32_t qpn, rkey;
	uint64_t addr;
	union ibv_gid gid;
};

static const char text[64] = "written after the target's waiter was cancelled";
static struct ibv_comp_channel *chan;
static struct ibv_cq *ev_cq;
static volatile pid_t waiter_tid;

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void put(int fd, const void *p, size_t n)
{
	CHECK(write(fd, p, n) == (ssize_t)n, "pipe write: %s", strerror(errno));
}

static void get(int fd, void *p, size_t n)
{
	CHECK(read(fd, p, n) == (ssize_t)n, "pipe read: %s", strerror(errno));
}

/* The device, a PD, a CQ (with the channel when `channel`) and an RC QP. */
static struct ibv_qp *setup(struct ibv_pd **pd, struct ibv_cq **cq, int channel)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0, "no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device");
	*pd = ibv_alloc_pd(ctx);
	CHECK(*pd, "alloc_pd");
	if (channel) {
		chan = ibv_create_comp_channel(ctx);
		CHECK(chan, "create_comp_channel");
		ev_cq = ibv_create_cq(ctx, 4, NULL, chan, 0);
		CHECK(ev_cq, "create_cq");
	}
	*cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(*cq, "create_cq");
	struct ibv_qp_init_attr ia = { .send_cq = *cq, .recv_cq = *cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(*pd, &ia);
	CHECK(qp, "create_qp: %s", strerror(errno));
	return qp;
}

static int writer(int from_target, int to_target)
{
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp = setup(&pd, &cq, 0);
	struct ibv_mr *mr = ibv_reg_mr(pd, (void *)text, sizeof(text), 0);
	CHECK(mr, "reg_mr");
	struct info me = { .qpn = qp->qp_num }, target;
	CHECK(ibv_query_gid(pd->context, 1, 0, &me.gid) == 0, "query_gid");
	put(to_target, &me, sizeof(me));
	get(from_target, &target, sizeof(target));
	connect_qp(qp, target.qpn, &target.gid);
	char go;
	get(from_target, &go, 1);
	struct ibv_sge sge = { .addr = (uintptr_t)text, .length = sizeof(text), .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED };
	wr.wr.rdma.remote_addr = target.addr;
	wr.wr.rdma.rkey = target.rkey;
	struct ibv_send_wr *bad;
	CHECK(ibv_post_send(qp, &wr, &bad) == 0, "post_send");
	struct ibv_wc wc;
	int n;
	double t0 = now_s();
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		CHECK(now_s() - t0 < 30, "writer: no completion");
	CHECK(n == 1 && wc.status == IBV_WC_SUCCESS, "writer: the WRITE completed with %s",
	      n == 1 ? ibv_wc_status_str(wc.status) : "an error");
	put(to_target, &go, 1); /* done: the target may go */
	return 0;
}

static void *waiter(void *arg)
{
	(void)arg;
	waiter_tid = (pid_t)syscall(SYS_gettid);
	CHECK(ibv_req_notify_cq(ev_cq, 0) == 0, "req_notify_cq");
	struct ibv_cq *cq;
	void *ctx;
	ibv_get_cq_event(chan, &cq, &ctx); /* never returns: cancelled */
	return NULL;
}

/* The state letter of thread `tid` of this process ('S': asleep). */
static char thread_state(pid_t tid)
{
	char path[64], buf[256];
	snprintf(path, sizeof(path), "/proc/self/task/%d/stat", tid);
	FILE *f = fopen(path, "r");
	if (!f)
		return '?';
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	char *p = strrchr(buf, ')');
	return p && p[1] == ' ' ? p[2] : '?';
}

/* Context switches so far of this process's thread named `name`. */
static long switches_of(const char *name)
{
	char path[300], buf[4096];
	DIR *d = opendir("/proc/self/task");
	CHECK(d, "opendir /proc/self/task: %s", strerror(errno));
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		size_t n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		buf[n] = 0;
		if (strncmp(buf, name, strlen(name)) != 0 || buf[strlen(name)] != '\n')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/status", e->d_name);
		closedir(d);
		f = fopen(path, "r");
		CHECK(f, "status of %s", name);
		long v = 0, nv = 0;
		while (fgets(buf, sizeof(buf), f)) {
			sscanf(buf, "voluntary_ctxt_switches: %ld", &v);
			sscanf(buf, "nonvoluntary_ctxt_switches: %ld", &nv);
		}
		fclose(f);
		return v + nv;
	}
	closedir(d);
	CHECK(0, "no thread %s", name);
	return 0;
}

int main(void)
{
	const char *addr = getenv("UROCE_ADDR");
	CHECK(addr, "UROCE_ADDR is not set");
	int to_writer[2], from_writer[2];
	CHECK(pipe(to_writer) == 0 && pipe(from_writer) == 0, "pipe");
	/* The writer's device at the next address (before any device opens). */
	struct in_addr a;
	CHECK(inet_pton(AF_INET, addr, &a) == 1, "UROCE_ADDR %s", addr);
	a.s_addr = htonl(ntohl(a.s_addr) + 1);
	char next[INET_ADDRSTRLEN];
	inet_ntop(AF_INET, &a, next, sizeof(next));
	fflush(stdout);
	pid_t pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		setenv("UROCE_ADDR", next, 1);
		exit(writer(to_writer[0], from_writer[1]));
	}

	static volatile char dst[64];
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp = setup(&pd, &cq, 1);
	struct ibv_mr *mr = ibv_reg_mr(pd, (void *)dst, sizeof(dst), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(mr, "reg_mr");
	struct info me = { .qpn = qp->qp_num, .rkey = mr->rkey, .addr = (uintptr_t)dst }, w;
	CHECK(ibv_query_gid(pd->context, 1, 0, &me.gid) == 0, "query_gid");
	put(to_writer[1], &me, sizeof(me));
	get(from_writer[0], &w, sizeof(w));
	connect_qp(qp, w.qpn, &w.gid);

	/* A waiter asleep in ibv_get_cq_event, then cancelled there. */
	pthread_t t;
	CHECK(pthread_create(&t, NULL, waiter, NULL) == 0, "pthread_create");
	double t0 = now_s();
	while (!waiter_tid || thread_state(waiter_tid) != 'S')
		CHECK(now_s() - t0 < 30, "the waiter never slept");
	CHECK(pthread_cancel(t) == 0, "pthread_cancel");
	void *res;
	CHECK(pthread_join(t, &res) == 0 && res == PTHREAD_CANCELED, "the waiter was not cancelled");

	/* No uroce call from here until the WRITE has landed. */
	t0 = now_s();
	put(to_writer[1], "g", 1);
	while (memcmp((const char *)dst, text, sizeof(text)) != 0) {
		CHECK(now_s() - t0 < 10, "the WRITE did not land within 10 s of the cancelled waiter");
		usleep(1000);
	}
	printf("the WRITE landed %.3f s after the go\n", now_s() - t0);
	char done;
	get(from_writer[0], &done, 1);
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the writer failed");
	/* Idle now: after a moment for the writer's link or ACKs to settle,
	 * the progress thread sleeps. */
	sleep(1);
	long before = switches_of("uroce-progress");
	sleep(2);
	long woke = switches_of("uroce-progress") - before;
	printf("the idle progress thread woke %ld times in 2 s\n", woke);
	CHECK(woke < 100, "the progress thread woke %ld times in 2 s after the waiter was cancelled", woke);
	printf("all ok\n");
	return 0;
}
