/* GPU memory from C, as GPUDirect RDMA applications use it: a buffer from
 * cuMemAlloc registered with a plain ibv_reg_mr through the drop-in (the
 * nv_mem peer-memory client claims it), written and read by RDMA between
 * two RC QPs of one device, checked with cuMemcpy; the nv_mem counters of
 * <runtime dir>/<pid>/memory_peers/nv_mem/ move; cuMemFree invalidates the
 * region (a later WRITE fails with REM_ACCESS_ERR) and ibv_dereg_mr still
 * works. libcuda.so.1 is opened with dlopen, so the program builds where no
 * CUDA is installed; it exits 77 (skip) where libcuda or a GPU is absent.
 * Run with UROCE_RUNTIME_DIR set (the counters are read from there). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "check.h"
#include "wait.h"
#include "connect.h"
#include "rdma_op.h"

#define LEN (4 << 16) /* four 64 KiB GPU pages */

typedef int (*cu_init_t)(unsigned);
typedef int (*cu_device_get_t)(int *, int);
typedef int (*cu_ctx_retain_t)(void **, int);
typedef int (*cu_ctx_set_t)(void *);
typedef int (*cu_alloc_t)(unsigned long long *, size_t);
typedef int (*cu_free_t)(unsigned long long);
typedef int (*cu_dtoh_t)(void *, unsigned long long, size_t);
typedef int (*cu_htod_t)(unsigned long long, const void *, size_t);

static struct ibv_cq *cq;
static struct ibv_qp *qp[2];

/* One RDMA op from qp[0] (rdma_op.h); returns the completion status. */
static int rdma(enum ibv_wr_opcode op, void *local, uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey)
{
	return rdma_op(qp[0], cq, op, local, len, lkey, raddr, rkey);
}

static unsigned long long counter(const char *name)
{
	char p[512], buf[64] = { 0 };
	snprintf(p, sizeof(p), "%s/%d/memory_peers/nv_mem/%s", getenv("UROCE_RUNTIME_DIR"), (int)getpid(), name);
	int fd = open(p, O_RDONLY);
	CHECK(fd >= 0, "open %s: %s", p, strerror(errno));
	CHECK(read(fd, buf, sizeof(buf) - 1) > 0, "read %s", p);
	close(fd);
	return strtoull(buf, NULL, 10);
}

#define SYM(var, type, name)                                                     \
	type var = (type)dlsym(cuda, name);                                      \
	CHECK(var, "libcuda.so.1 has no %s", name)

int main(void)
{
	CHECK(getenv("UROCE_RUNTIME_DIR"), "set UROCE_RUNTIME_DIR");
	void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
	if (!cuda) {
		printf("SKIP libcuda.so.1 not found: %s\n", dlerror());
		return 77;
	}
	SYM(init, cu_init_t, "cuInit");
	SYM(dev_get, cu_device_get_t, "cuDeviceGet");
	SYM(retain, cu_ctx_retain_t, "cuDevicePrimaryCtxRetain");
	SYM(set, cu_ctx_set_t, "cuCtxSetCurrent");
	SYM(alloc, cu_alloc_t, "cuMemAlloc_v2");
	SYM(cufree, cu_free_t, "cuMemFree_v2");
	SYM(dtoh, cu_dtoh_t, "cuMemcpyDtoH_v2");
	SYM(htod, cu_htod_t, "cuMemcpyHtoD_v2");
	int dev;
	void *cuctx;
	if (init(0) != 0 || dev_get(&dev, 0) != 0) {
		printf("SKIP no GPU (cuInit/cuDeviceGet failed)\n");
		return 77;
	}
	CHECK(retain(&cuctx, dev) == 0 && set(cuctx) == 0, "CUDA context");

	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(pd && cq, "pd/cq");
	rc_pair(pd, cq, 8, 1, qp);

	unsigned long long d;
	CHECK(alloc(&d, LEN) == 0, "cuMemAlloc");
	unsigned long long mrs = counter("num_alloc_mrs"), pages = counter("num_reg_pages");
	struct ibv_mr *gmr = ibv_reg_mr(pd, (void *)(uintptr_t)d, LEN,
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(gmr, "ibv_reg_mr of GPU memory: %s", strerror(errno));
	CHECK(counter("num_alloc_mrs") == mrs + 1, "nv_mem claimed the region");
	unsigned long long got = counter("num_reg_pages") - pages;
	CHECK(got == 4 || got == 5, "64 KiB GPU pages: %llu", got);

	char *host = malloc(LEN), *back = malloc(LEN);
	CHECK(host && back, "malloc");
	for (int i = 0; i < LEN; i++)
		host[i] = (char)(i % 247);
	struct ibv_mr *hmr = ibv_reg_mr(pd, host, LEN, IBV_ACCESS_LOCAL_WRITE);
	CHECK(hmr, "reg host");
	CHECK(rdma(IBV_WR_RDMA_WRITE, host, LEN, hmr->lkey, d, gmr->rkey) == IBV_WC_SUCCESS, "WRITE to GPU");
	CHECK(dtoh(back, d, LEN) == 0, "cuMemcpyDtoH");
	CHECK(memcmp(back, host, LEN) == 0, "WRITE landed in GPU memory");

	for (int i = 0; i < 8192; i++)
		back[i] = (char)(i * 7 + 3);
	CHECK(htod(d + 100000, back, 8192) == 0, "cuMemcpyHtoD");
	memset(host, 0, 8192);
	CHECK(rdma(IBV_WR_RDMA_READ, host, 8192, hmr->lkey, d + 100000, gmr->rkey) == IBV_WC_SUCCESS, "READ");
	CHECK(memcmp(host, back, 8192) == 0, "READ from GPU memory");

	unsigned long long frees = counter("num_free_callbacks");
	CHECK(cufree(d) == 0, "cuMemFree");
	for (int i = 0; i < 1000 && counter("num_free_callbacks") == frees; i++)
		usleep(5000);
	CHECK(counter("num_free_callbacks") == frees + 1, "cuMemFree invalidated the region");
	int st = rdma(IBV_WR_RDMA_WRITE, host, 8, hmr->lkey, d, gmr->rkey);
	CHECK(st == IBV_WC_REM_ACCESS_ERR, "WRITE after cuMemFree: %s", ibv_wc_status_str(st));
	CHECK(ibv_dereg_mr(gmr) == 0, "dereg after free");
	printf("GPU memory through the drop-in: WRITE, READ, invalidation: all ok\n");
	return 0;
}
