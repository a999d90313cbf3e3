/* Registered (pinned) memory keeps its pages, as a kernel device's pin
 * (issue 28 §1), through the drop-in C ABI. Two RC QPs of one device,
 * connected to each other; the "peer" is qp[0].
 * 1. The deterministic case: register, munmap, map new memory at the same
 *    address (MAP_FIXED), then WRITE and READ through the old key: the WRITE
 *    succeeds into the old pages and never lands in the new mapping; the
 *    READ returns the old pages' bytes, never the new mapping's.
 * 2. Rounds (10 000, or fewer when 60 s are up) of: map a victim, register
 *    it, post a WRITE and a READ through its key, unmap it at once, while
 *    two threads map, fill, check and unmap memory (the addresses the
 *    victims free): no byte ever changes in their mappings, no READ returns
 *    their patterns.
 * Exits non-zero with a message on the first failed check. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "check.h"
#include "wait.h"
#include "connect.h"
#include "rdma_op.h"

#define PAGE 4096
#define LEN (3 * PAGE)
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qp[2];

static void *map(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(p != MAP_FAILED, "mmap: %s", strerror(errno));
	return p;
}

static int all(const unsigned char *p, size_t n, unsigned char a, unsigned char b)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != a && p[i] != b)
			return 0;
	return 1;
}

static void deterministic(unsigned char *local, struct ibv_mr *lmr)
{
	for (int round = 0; round < 20; round++) {
		unsigned char *v = map(LEN);
		memset(v, 0x11, LEN);
		struct ibv_mr *mr = ibv_reg_mr(pd, v, LEN, ACCESS);
		CHECK(mr, "reg_mr: %s", strerror(errno));
		CHECK(munmap(v, LEN) == 0, "munmap");
		void *again = mmap(v, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
		CHECK(again == v, "mmap MAP_FIXED");
		memset(v, 0x22, LEN);
		memset(local, 0xab, PAGE);
		int st = rdma_op(qp[0], cq, IBV_WR_RDMA_WRITE, local, PAGE, lmr->lkey, (uintptr_t)v + PAGE, mr->rkey);
		CHECK(st == IBV_WC_SUCCESS, "round %d: WRITE %s", round, ibv_wc_status_str(st));
		CHECK(all(v, LEN, 0x22, 0x22), "round %d: the WRITE landed in the new mapping", round);
		memset(local, 0, LEN);
		st = rdma_op(qp[0], cq, IBV_WR_RDMA_READ, local, LEN, lmr->lkey, (uintptr_t)v, mr->rkey);
		CHECK(st == IBV_WC_SUCCESS, "round %d: READ %s", round, ibv_wc_status_str(st));
		CHECK(all(local, PAGE, 0x11, 0x11) && all(local + PAGE, PAGE, 0xab, 0xab) &&
			      all(local + 2 * PAGE, PAGE, 0x11, 0x11),
		      "round %d: the READ did not return the old pages", round);
		CHECK(ibv_dereg_mr(mr) == 0, "dereg_mr");
		munmap(v, LEN);
	}
	printf("deterministic ok\n");
}

static atomic_int stop;
static atomic_long checked;

static void *mapper(void *arg)
{
	unsigned char fill = (unsigned char)(uintptr_t)arg;
	long bad = 0;
	while (!atomic_load(&stop)) {
		unsigned char *m = map(LEN);
		memset(m, fill, LEN);
		for (int i = 0; i < 20; i++)
			sched_yield();
		bad += !all(m, LEN, fill, fill);
		munmap(m, LEN);
		atomic_fetch_add(&checked, 1);
	}
	return (void *)bad;
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void under_traffic(unsigned char *local, struct ibv_mr *lmr)
{
	pthread_t th[2];
	for (int i = 0; i < 2; i++)
		CHECK(pthread_create(&th[i], NULL, mapper, (void *)(uintptr_t)(0x30 + i)) == 0, "pthread_create");
	unsigned char *back = local + LEN;
	memset(local, 0xab, LEN);
	double deadline = now_s() + 60;
	int rounds = 0;
	for (; rounds < 10000 && now_s() < deadline; rounds++) {
		unsigned char *v = map(LEN);
		memset(v, 0x11, LEN);
		struct ibv_mr *mr = ibv_reg_mr(pd, v, LEN, ACCESS);
		CHECK(mr, "reg_mr: %s", strerror(errno));
		struct ibv_sge ws = { .addr = (uintptr_t)local, .length = 2 * PAGE, .lkey = lmr->lkey };
		struct ibv_sge rs = { .addr = (uintptr_t)back, .length = LEN, .lkey = lmr->lkey };
		struct ibv_send_wr r = { .wr_id = 2, .sg_list = &rs, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
					 .send_flags = IBV_SEND_SIGNALED };
		struct ibv_send_wr w = { .wr_id = 1, .next = &r, .sg_list = &ws, .num_sge = 1,
					 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED }, *bad;
		w.wr.rdma.remote_addr = (uintptr_t)v + PAGE;
		w.wr.rdma.rkey = mr->rkey;
		r.wr.rdma.remote_addr = (uintptr_t)v;
		r.wr.rdma.rkey = mr->rkey;
		CHECK(ibv_post_send(qp[0], &w, &bad) == 0, "post_send");
		munmap(v, LEN); /* while the operations are on their way */
		for (int i = 0; i < 2; i++) {
			struct ibv_wc wc = wait_wc(cq);
			CHECK(wc.status == IBV_WC_SUCCESS, "round %d: %s", rounds, ibv_wc_status_str(wc.status));
		}
		CHECK(all(back, LEN, 0x11, 0xab), "round %d: a READ returned another mapping's bytes", rounds);
		CHECK(ibv_dereg_mr(mr) == 0, "dereg_mr");
	}
	atomic_store(&stop, 1);
	long bad = 0;
	for (int i = 0; i < 2; i++) {
		void *b;
		pthread_join(th[i], &b);
		bad += (long)b;
	}
	printf("%d rounds, %ld mappings checked\n", rounds, atomic_load(&checked));
	CHECK(bad == 0, "%ld mappings changed under a peer's WRITE", bad);
	CHECK(rounds >= 100, "only %d rounds in 60 s", rounds);
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "no device");
	ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device");
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	CHECK(pd && cq, "pd/cq");
	rc_pair(pd, cq, 64, 1, qp);
	unsigned char *local = malloc(2 * LEN);
	CHECK(local, "malloc");
	struct ibv_mr *lmr = ibv_reg_mr(pd, local, 2 * LEN, ACCESS);
	CHECK(lmr, "reg_mr local");
	deterministic(local, lmr);
	under_traffic(local, lmr);
	CHECK(ibv_dereg_mr(lmr) == 0, "dereg local");
	free(local);
	ibv_destroy_qp(qp[0]);
	ibv_destroy_qp(qp[1]);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("all ok\n");
	return 0;
}
