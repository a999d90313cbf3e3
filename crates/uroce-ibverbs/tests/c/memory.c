/* The memory features through the drop-in C ABI: ODP (explicit, implicit,
 * advise_mr, statistics, odp_caps), indirect keys (uroce.h: list,
 * interleaved, UMR through the send queue) and dma-buf registration.
 * Two RC QPs of one device, connected to each other. Exits non-zero with a
 * message on the first failed check. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include "uroce.h"

#include "check.h"
#include "wait.h"
#include "connect.h"
#include "rdma_op.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qp[2];

/* One RDMA op from qp[0] (rdma_op.h); returns the completion status. */
static int rdma(enum ibv_wr_opcode op, void *local, uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey)
{
	return rdma_op(qp[0], cq, op, local, len, lkey, raddr, rkey);
}

static void fresh_qps(void)
{
	rc_pair(pd, cq, 64, 4, qp);
}

static void test_odp(void)
{
	struct ibv_device_attr_ex ax;
	CHECK(ibv_query_device_ex(ctx, NULL, &ax) == 0, "query_device_ex");
	CHECK(ax.odp_caps.general_caps == (IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT), "general_caps %lx",
	      (unsigned long)ax.odp_caps.general_caps);
	CHECK(ax.odp_caps.per_transport_caps.rc_odp_caps & IBV_ODP_SUPPORT_ATOMIC, "rc caps");

	size_t len = 16 * 4096;
	char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(m != MAP_FAILED, "mmap");
	int acc = IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	struct ibv_mr *odp = ibv_reg_mr(pd, m, len, acc);
	CHECK(odp, "reg_mr ODP: %s", strerror(errno));
	char *src = malloc(len);
	for (size_t i = 0; i < len; i++)
		src[i] = (char)(i * 13);
	struct ibv_mr *smr = ibv_reg_mr(pd, src, len, IBV_ACCESS_LOCAL_WRITE);
	CHECK(smr, "reg_mr");
	CHECK(rdma(IBV_WR_RDMA_WRITE, src, len, smr->lkey, (uintptr_t)m, odp->rkey) == IBV_WC_SUCCESS, "ODP write");
	CHECK(memcmp(m, src, len) == 0, "ODP data");
	struct uroce_odp_stats st;
	CHECK(uroce_mr_odp_stats(odp, &st) == 0, "odp stats");
	CHECK(st.page_faults == 16, "page_faults %lu", (unsigned long)st.page_faults);
	CHECK(uroce_mr_odp_stats(smr, &st) == EOPNOTSUPP, "stats of a pinned MR");

	/* advise_mr */
	char *p2 = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct ibv_mr *odp2 = ibv_reg_mr(pd, p2, len, acc);
	struct ibv_sge sge = { .addr = (uintptr_t)p2, .length = 8 * 4096, .lkey = odp2->lkey };
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1) == 0, "advise");
	CHECK(uroce_mr_odp_stats(odp2, &st) == 0 && st.page_prefetch == 8, "page_prefetch %lu",
	      (unsigned long)st.page_prefetch);
	struct ibv_sge bad = { .addr = (uintptr_t)src, .length = 64, .lkey = smr->lkey };
	/* The errno value is returned and set in errno, as mlx5's (the ioctl's). */
	errno = 0;
	int arc = ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &bad, 1);
	CHECK(arc == EOPNOTSUPP && errno == EOPNOTSUPP, "advise on a pinned MR: %d, errno %d", arc, errno);
	errno = 0;
	arc = ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 2, &sge, 1);
	CHECK(arc == EINVAL && errno == EINVAL, "advise bad flags: %d, errno %d", arc, errno);
	CHECK(ibv_advise_mr(pd, 7, 0, &sge, 1) == EOPNOTSUPP, "advise bad advice");

	/* implicit ODP: a buffer allocated after registration */
	struct ibv_mr *imp = ibv_reg_mr(pd, NULL, SIZE_MAX, acc);
	CHECK(imp, "implicit ODP: %s", strerror(errno));
	char *late = malloc(5000);
	memset(late, 0, 5000);
	CHECK(rdma(IBV_WR_RDMA_WRITE, src, 5000, smr->lkey, (uintptr_t)late, imp->rkey) == IBV_WC_SUCCESS, "implicit");
	CHECK(memcmp(late, src, 5000) == 0, "implicit data");
	/* unmapped: error completion, process alive */
	munmap(m, len);
	CHECK(rdma(IBV_WR_RDMA_WRITE, src, 64, smr->lkey, (uintptr_t)m, odp->rkey) == IBV_WC_REM_ACCESS_ERR,
	      "write to unmapped ODP");
	struct uroce_odp_stats dev;
	CHECK(uroce_device_odp_stats(ctx, &dev) == 0 && dev.page_faults >= 16, "device stats");
	fresh_qps();
	CHECK(ibv_dereg_mr(imp) == 0 && ibv_dereg_mr(odp) == 0 && ibv_dereg_mr(odp2) == 0, "dereg");
	ibv_dereg_mr(smr);
	free(late);
	free(src);
	munmap(p2, len);
	printf("odp ok\n");
}

static void test_mkeys(void)
{
	int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	char *a = calloc(1, 4096), *b = calloc(1, 4096);
	memset(a, 'a', 4096);
	memset(b, 'b', 4096);
	struct ibv_mr *ma = ibv_reg_mr(pd, a, 4096, rw), *mb = ibv_reg_mr(pd, b, 4096, rw);
	struct uroce_mkey *mk = uroce_create_mkey(pd, 3);
	CHECK(mk && mk->max_entries == 4 && mk->lkey == mk->rkey, "create_mkey");
	struct ibv_sge l[2] = { { (uintptr_t)b + 100, 10, mb->lkey }, { (uintptr_t)a, 6, ma->lkey } };
	CHECK(uroce_mkey_set_list(mk, IBV_ACCESS_REMOTE_READ, 2, l) == 0, "set_list");
	char *dst = calloc(1, 64);
	struct ibv_mr *md = ibv_reg_mr(pd, dst, 64, IBV_ACCESS_LOCAL_WRITE);
	CHECK(rdma(IBV_WR_RDMA_READ, dst, 16, md->lkey, 0, mk->rkey) == IBV_WC_SUCCESS, "read via mkey");
	CHECK(memcmp(dst, "bbbbbbbbbbaaaaaa", 16) == 0, "mkey data %.16s", dst);
	CHECK(rdma(IBV_WR_RDMA_WRITE, dst, 4, md->lkey, 0, mk->rkey) == IBV_WC_REM_ACCESS_ERR, "mkey is read-only");
	fresh_qps();
	/* interleaved: every 4th byte of a */
	for (int i = 0; i < 4096; i++)
		a[i] = (char)i;
	struct uroce_mr_interleaved col = { (uintptr_t)a + 1, 1, 3, ma->lkey };
	CHECK(uroce_mkey_set_interleaved(mk, IBV_ACCESS_REMOTE_READ, 32, 1, &col) == 0, "set_interleaved");
	CHECK(rdma(IBV_WR_RDMA_READ, dst, 32, md->lkey, 0, mk->rkey) == IBV_WC_SUCCESS, "read interleaved");
	for (int i = 0; i < 32; i++)
		CHECK(dst[i] == (char)(1 + 4 * i), "interleaved byte %d", i);
	/* errors */
	struct ibv_sge five[5] = { l[0], l[0], l[0], l[0], l[0] };
	CHECK(uroce_mkey_set_list(mk, IBV_ACCESS_REMOTE_READ, 5, five) == ENOMEM, "too many entries");
	CHECK(uroce_mkey_set_list(mk, IBV_ACCESS_MW_BIND, 1, l) == EINVAL, "bad access");
	/* UMR through the send queue: LOCAL_INV, then UMR */
	struct ibv_send_wr inv = { .wr_id = 7, .opcode = IBV_WR_LOCAL_INV, .send_flags = IBV_SEND_SIGNALED }, *bad;
	inv.invalidate_rkey = mk->lkey;
	CHECK(ibv_post_send(qp[1], &inv, &bad) == 0, "post LOCAL_INV");
	struct ibv_wc wc = wait_wc(cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_LOCAL_INV, "LOCAL_INV wc %d", wc.status);
	CHECK(uroce_post_umr_list(qp[1], 8, IBV_SEND_SIGNALED, mk, IBV_ACCESS_REMOTE_READ, 1, &l[1]) == 0, "post umr");
	wc = wait_wc(cq);
	CHECK(wc.wr_id == 8 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_DRIVER1, "UMR wc %d op %d",
	      wc.status, wc.opcode);
	CHECK(rdma(IBV_WR_RDMA_READ, dst, 6, md->lkey, 0, mk->rkey) == IBV_WC_SUCCESS, "read after UMR");
	CHECK(memcmp(dst, a, 6) == 0, "UMR data");
	CHECK(uroce_post_umr_list(qp[1], 9, IBV_SEND_SIGNALED, mk, IBV_ACCESS_REMOTE_READ, 1, &l[0]) == 0, "post");
	wc = wait_wc(cq);
	CHECK(wc.status == IBV_WC_MW_BIND_ERR, "UMR over a valid key: %d", wc.status);
	CHECK(uroce_destroy_mkey(mk) == 0, "destroy_mkey");
	fresh_qps();
	ibv_dereg_mr(ma);
	ibv_dereg_mr(mb);
	ibv_dereg_mr(md);
	free(a);
	free(b);
	free(dst);
	printf("mkeys ok\n");
}

static void test_dmabuf(void)
{
	int fd = memfd_create("uroce-dmabuf", 0);
	CHECK(fd >= 0, "memfd");
	CHECK(ftruncate(fd, 8192) == 0, "ftruncate");
	char page[4096];
	memset(page, 'x', sizeof(page));
	CHECK(pwrite(fd, page, 4096, 4096) == 4096, "pwrite");
	struct ibv_mr *mr = ibv_reg_dmabuf_mr(pd, 4096, 4096, 0x10000, fd,
					      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(mr, "reg_dmabuf_mr: %s", strerror(errno));
	CHECK(mr->addr == (void *)4096 && mr->length == 4096, "dmabuf mr fields");
	close(fd);
	char *dst = calloc(1, 64);
	struct ibv_mr *md = ibv_reg_mr(pd, dst, 64, IBV_ACCESS_LOCAL_WRITE);
	CHECK(rdma(IBV_WR_RDMA_READ, dst, 64, md->lkey, 0x10000, mr->rkey) == IBV_WC_SUCCESS, "read dmabuf");
	CHECK(dst[0] == 'x' && dst[63] == 'x', "dmabuf data");
	CHECK(!ibv_reg_dmabuf_mr(pd, 0, 4096, 0, 12345, IBV_ACCESS_LOCAL_WRITE) && errno == EBADF, "bad fd: %d", errno);
	int fd2 = memfd_create("uroce-dmabuf2", 0);
	CHECK(ftruncate(fd2, 8192) == 0, "ftruncate");
	CHECK(!ibv_reg_dmabuf_mr(pd, 0, 4096, 1, fd2, IBV_ACCESS_LOCAL_WRITE) && errno == EINVAL, "page offset");
	CHECK(!ibv_reg_dmabuf_mr(pd, 4096, 8192, 0, fd2, IBV_ACCESS_LOCAL_WRITE) && errno == EINVAL, "past EOF");
	close(fd2);
	CHECK(ibv_dereg_mr(mr) == 0, "dereg dmabuf");
	ibv_dereg_mr(md);
	free(dst);
	printf("dmabuf ok\n");
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
	fresh_qps();
	test_odp();
	test_mkeys();
	test_dmabuf();
	ibv_destroy_qp(qp[0]);
	ibv_destroy_qp(qp[1]);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("all ok\n");
	return 0;
}
