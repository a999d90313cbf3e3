/* PeerDirect from C (uroce.h): device memory of a storage peer-memory
 * client allocated with uroce_peer_alloc, registered with a plain
 * ibv_reg_mr, written and read by RDMA, seen by the host through
 * uroce_peer_memcpy_to/from and in the backing file; freed while registered
 * (invalidation: accesses fail, dereg still works); the client's counters
 * (<runtime dir>/<pid>/memory_peers/<client>/) adding up at each step; and
 * every bad argument's errno. Two RC QPs of one device, connected to each
 * other. The program writes its own configuration (UROCE_CONFIG) and runtime
 * directory (UROCE_RUNTIME_DIR) under a fresh temporary directory. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include "uroce.h"

#include "check.h"
#include "wait.h"
#include "connect.h"
#include "rdma_op.h"

#define CLIENT "ssd-c"
#define PAGES 19
#define LEN (PAGES * 4096)

static char dir[64], img[128], rt[128];
static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qp[2];

/* One RDMA op from qp[0] (rdma_op.h); returns the completion status. */
static int rdma(enum ibv_wr_opcode op, void *local, uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey)
{
	return rdma_op(qp[0], cq, op, local, len, lkey, raddr, rkey);
}

/* One counter of the client, as `cat /sys/kernel/mm/memory_peers/...`. */
static unsigned long long counter(const char *name)
{
	char p[256], buf[64] = { 0 };
	snprintf(p, sizeof(p), "%s/%d/memory_peers/" CLIENT "/%s", rt, (int)getpid(), name);
	int fd = open(p, O_RDONLY);
	CHECK(fd >= 0, "open %s: %s", p, strerror(errno));
	CHECK(read(fd, buf, sizeof(buf) - 1) > 0, "read %s", p);
	close(fd);
	return strtoull(buf, NULL, 10);
}

/* The seed's arithmetic: regions on the peer and pages/bytes mapped now. */
static void adds_up(unsigned long long regions, unsigned long long pages, unsigned long long bytes)
{
	unsigned long long r = counter("num_alloc_mrs") - counter("num_dealloc_mrs");
	unsigned long long p = counter("num_reg_pages") - counter("num_dereg_pages");
	unsigned long long b = counter("num_reg_bytes") - counter("num_dereg_bytes");
	CHECK(r == regions && p == pages && b == bytes, "counters: %llu regions, %llu pages, %llu bytes", r, p, b);
}

static void setup(void)
{
	strcpy(dir, "/tmp/uroce-peer-c-XXXXXX");
	CHECK(mkdtemp(dir), "mkdtemp");
	snprintf(img, sizeof(img), "%s/ssd.img", dir);
	snprintf(rt, sizeof(rt), "%s/run", dir);
	char cfg[128];
	snprintf(cfg, sizeof(cfg), "%s/uroce.toml", dir);
	FILE *f = fopen(cfg, "w");
	CHECK(f, "config");
	fprintf(f, "[peers]\nload = [\"storage\"]\n[[peers.storage]]\nname = \"" CLIENT "\"\npath = \"%s\"\n"
		   "capacity = 1048576\n", img);
	fclose(f);
	setenv("UROCE_CONFIG", cfg, 1);
	setenv("UROCE_RUNTIME_DIR", rt, 1);
}

static void bad_arguments(void)
{
	errno = 0;
	CHECK(!uroce_peer_alloc(NULL, 4096) && errno == EINVAL, "NULL client: %d", errno);
	CHECK(!uroce_peer_alloc(CLIENT, 0) && errno == EINVAL, "length 0: %d", errno);
	CHECK(!uroce_peer_alloc("no-such-client", 4096) && errno == ENOENT, "unknown client: %d", errno);
	CHECK(!uroce_peer_alloc(CLIENT, 1ull << 40) && errno == ENOMEM, "larger than the device: %d", errno);
	char host[8];
	CHECK(uroce_peer_free(NULL) == EINVAL, "free NULL");
	CHECK(uroce_peer_free(host) == EINVAL && errno == EINVAL, "free of host memory");
	CHECK(uroce_peer_memcpy_from(host, host, sizeof(host)) == EFAULT, "copy from host memory");
}

static void rdma_through_the_peer(void)
{
	char *dev = uroce_peer_alloc(CLIENT, LEN);
	CHECK(dev, "uroce_peer_alloc: %s", strerror(errno));
	/* A plain ibv_reg_mr: the storage client claims the address. */
	struct ibv_mr *mr = ibv_reg_mr(pd, dev, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
							 IBV_ACCESS_REMOTE_READ);
	CHECK(mr, "ibv_reg_mr of peer memory: %s", strerror(errno));
	CHECK(counter("num_alloc_mrs") == 1 && counter("num_reg_pages") == PAGES, "registered on the peer");
	adds_up(1, PAGES, LEN);

	static char src[LEN], back[LEN];
	for (int i = 0; i < LEN; i++)
		src[i] = (char)(i * 7 + 3);
	struct ibv_mr *smr = ibv_reg_mr(pd, src, LEN, 0);
	struct ibv_mr *bmr = ibv_reg_mr(pd, back, LEN, IBV_ACCESS_LOCAL_WRITE);
	CHECK(smr && bmr, "host MRs");
	CHECK(counter("num_alloc_mrs") == 1, "host buffers are not peer memory");
	CHECK(rdma(IBV_WR_RDMA_WRITE, src, LEN, smr->lkey, (uintptr_t)dev, mr->rkey) == IBV_WC_SUCCESS, "WRITE");
	CHECK(uroce_peer_memcpy_from(back, dev, LEN) == 0 && !memcmp(back, src, LEN), "device memory holds it");
	/* ... which is the storage device's file (the first allocation is at offset 0). */
	int fd = open(img, O_RDONLY);
	memset(back, 0, LEN);
	CHECK(fd >= 0 && pread(fd, back, LEN, 0) == LEN && !memcmp(back, src, LEN), "the file holds it");
	close(fd);
	uint64_t v = 0x1122334455667788ull;
	CHECK(uroce_peer_memcpy_to(dev + 4096, &v, 8) == 0, "memcpy_to");
	memset(back, 0, 16);
	CHECK(rdma(IBV_WR_RDMA_READ, back, 16, bmr->lkey, (uintptr_t)dev + 4096, mr->rkey) == IBV_WC_SUCCESS, "READ");
	CHECK(!memcmp(back, &v, 8) && !memcmp(back + 8, src + 4104, 8), "READ from the peer");
	CHECK(uroce_peer_memcpy_from(back, dev + LEN - 4, 8) == EFAULT, "copy past the allocation");

	/* Freed while registered: invalidated; the mapping ends now. */
	CHECK(uroce_peer_free(dev) == 0, "uroce_peer_free");
	CHECK(counter("num_free_callbacks") == 1 && counter("num_dealloc_mrs") == 1, "invalidated");
	adds_up(0, 0, 0);
	CHECK(rdma(IBV_WR_RDMA_WRITE, src, 64, smr->lkey, (uintptr_t)dev, mr->rkey) == IBV_WC_REM_ACCESS_ERR,
	      "an invalidated region refuses access");
	CHECK(ibv_dereg_mr(mr) == 0, "dereg after invalidation");
	adds_up(0, 0, 0);
	CHECK(counter("num_dereg_pages") == PAGES && counter("num_dereg_bytes") == LEN, "counted once");
	CHECK(uroce_peer_free(dev) == EINVAL, "double free");
	CHECK(uroce_peer_memcpy_from(back, dev, 8) == EFAULT, "copy from freed memory");

	/* Plain dereg (no invalidation) and a second allocation. */
	dev = uroce_peer_alloc(CLIENT, 4096);
	CHECK(dev, "second alloc");
	mr = ibv_reg_mr(pd, dev, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "second reg");
	adds_up(1, 1, 4096);
	CHECK(ibv_dereg_mr(mr) == 0, "dereg");
	adds_up(0, 0, 0);
	CHECK(uroce_peer_free(dev) == 0 && counter("num_free_callbacks") == 1, "free after dereg: no callback");
	ibv_dereg_mr(smr);
	ibv_dereg_mr(bmr);
}

int main(void)
{
	setup();
	bad_arguments();
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "no device");
	ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device");
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(pd && cq, "pd/cq");
	rc_pair(pd, cq, 16, 1, qp);
	rdma_through_the_peer();
	ibv_destroy_qp(qp[0]);
	ibv_destroy_qp(qp[1]);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	char cmd[160];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	CHECK(system(cmd) == 0, "cleanup");
	printf("all ok\n");
	return 0;
}
