/* Object import through the drop-in C ABI (ibv_import_device, ibv_import_pd,
 * ibv_import_mr, ibv_import_dm and ibv_unimport_*), with the lifetime rules
 * of crates/uroce-ibverbs/src/import.rs:
 *   - a context's cmd_fd is a descriptor of its own; a duplicate of it
 *     imports the context, and the imported context owns (closes) it;
 *   - descriptors that name no open context fail with rdma-core 44's errno
 *     (EINVAL, ENODEV), a uroce context fd of no open context (another
 *     process's) with EOPNOTSUPP;
 *   - imported PDs and MRs carry traffic like the originals;
 *   - an object is destroyed through any struct naming it, imported ones
 *     included, which are not users (no EBUSY for them); unimport frees one
 *     struct and never the object;
 *   - objects outlive the original context while an imported one is open.
 * Run under valgrind by crates/uroce-ibverbs/tests/import_c.rs: every struct
 * must be freed exactly once. Exits non-zero with a message on the first
 * failed check; prints "all ok" at the end. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "check.h"
#include "connect.h"

/* A call that returns NULL and sets errno. */
#define NULL_ERRNO(call, want)                                                          \
	do {                                                                            \
		errno = 0;                                                              \
		void *r_ = (void *)(call);                                              \
		CHECK(r_ == NULL && errno == (want), "%s: got %p errno %d (%s), want NULL errno %d", \
		      #call, r_, errno, strerror(errno), (want));                       \
	} while (0)

/* A call that returns an error code (errno value). */
#define RC(call, want)                                                                       \
	do {                                                                                 \
		int r_ = (call);                                                             \
		CHECK(r_ == (want), "%s: got %d (%s), want %d", #call, r_, strerror(r_ < 0 ? -r_ : r_), (want)); \
	} while (0)

static int fd_open(int fd)
{
	return fcntl(fd, F_GETFD) != -1;
}

static struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &a);
	CHECK(qp, "create_qp: %s", strerror(errno));
	return qp;
}

/* One RDMA WRITE of `len` bytes; the completion's status. */
static enum ibv_wc_status rdma_write(struct ibv_qp *qp, struct ibv_cq *cq, void *src, uint32_t lkey, void *dst,
				     uint32_t rkey, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;
	wr.wr.rdma.remote_addr = (uintptr_t)dst;
	wr.wr.rdma.rkey = rkey;
	RC(ibv_post_send(qp, &wr, &bad), 0);
	struct ibv_wc wc;
	for (int i = 0; i < 20000000; i++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0, "poll_cq");
		if (n == 1)
			return wc.status;
		if (i > 1000)
			usleep(10);
	}
	CHECK(0, "no completion");
	return IBV_WC_GENERAL_ERR;
}

/* Descriptors that name no open context. */
static void bad_descriptors(struct ibv_context *ctx)
{
	NULL_ERRNO(ibv_import_device(-1), EINVAL);
	int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
	CHECK(devnull >= 0, "open /dev/null");
	NULL_ERRNO(ibv_import_device(devnull), ENODEV); /* a character device, no verbs device */
	CHECK(fd_open(devnull), "a failed import keeps the descriptor");
	close(devnull);
	int p[2];
	CHECK(pipe(p) == 0, "pipe");
	NULL_ERRNO(ibv_import_device(p[0]), EINVAL);
	close(p[0]);
	close(p[1]);
	/* What a uroce cmd_fd received from another process looks like. */
	int other = memfd_create("uroce-context", MFD_CLOEXEC);
	CHECK(other >= 0, "memfd_create");
	NULL_ERRNO(ibv_import_device(other), EOPNOTSUPP);
	close(other);

	NULL_ERRNO(ibv_import_pd(NULL, 1), EINVAL);
	NULL_ERRNO(ibv_import_mr(NULL, 1), EINVAL);
	NULL_ERRNO(ibv_import_dm(NULL, 1), EINVAL);
	ibv_unimport_pd(NULL);
	ibv_unimport_mr(NULL);
	ibv_unimport_dm(NULL);
	(void)ctx;
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0, "no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	struct ibv_context *other = ibv_open_device(list[0]);
	CHECK(ctx && other, "open_device: %s", strerror(errno));
	ibv_free_device_list(list);

	/* Each context has a cmd_fd of its own. */
	struct stat s1, s2;
	CHECK(ctx->cmd_fd >= 0 && fstat(ctx->cmd_fd, &s1) == 0, "cmd_fd");
	CHECK(fstat(other->cmd_fd, &s2) == 0, "cmd_fd");
	CHECK(ctx->cmd_fd != ctx->async_fd && s1.st_ino != s2.st_ino, "contexts share a cmd_fd");

	bad_descriptors(ctx);

	/* Import the context from a duplicate of its cmd_fd. */
	int dup_fd = dup(ctx->cmd_fd);
	CHECK(dup_fd >= 0, "dup");
	struct ibv_context *imp = ibv_import_device(dup_fd);
	CHECK(imp, "import_device: %s", strerror(errno));
	CHECK(imp != ctx && imp->cmd_fd == dup_fd && imp->device == ctx->device, "imported context");
	struct ibv_device_attr da;
	RC(ibv_query_device(imp, &da), 0);
	union ibv_gid gid;
	RC(ibv_query_gid(imp, 1, 0, &gid), 0);

	/* PD and MR, imported: same handles and keys; the MR's addr is NULL. */
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd, "alloc_pd");
	struct ibv_pd *ipd = ibv_import_pd(imp, pd->handle);
	CHECK(ipd, "import_pd: %s", strerror(errno));
	CHECK(ipd != pd && ipd->handle == pd->handle && ipd->context == imp, "imported PD");
	NULL_ERRNO(ibv_import_pd(imp, pd->handle + 100000), ENOENT);
	NULL_ERRNO(ibv_import_pd(other, pd->handle), ENOENT); /* another context's objects */

	size_t len = 1 << 16;
	char *buf = aligned_alloc(4096, len);
	CHECK(buf, "alloc");
	memset(buf, 0, len);
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, len, acc);
	CHECK(mr, "reg_mr: %s", strerror(errno));
	struct ibv_mr *imr = ibv_import_mr(ipd, mr->handle);
	CHECK(imr, "import_mr: %s", strerror(errno));
	CHECK(imr->lkey == mr->lkey && imr->rkey == mr->rkey && imr->length == len && imr->addr == NULL &&
		      imr->handle == mr->handle && imr->pd == ipd && imr->context == imp,
	      "imported MR");
	NULL_ERRNO(ibv_import_mr(ipd, pd->handle), EINVAL); /* a PD's handle */
	NULL_ERRNO(ibv_import_pd(imp, mr->handle), EINVAL); /* an MR's handle */
	NULL_ERRNO(ibv_import_mr(ipd, mr->handle + 100000), ENOENT);

	/* Traffic: a QP of the imported PD writes with the imported keys into
	 * a QP of the original one. */
	struct ibv_cq *icq = ibv_create_cq(imp, 8, NULL, NULL, 0);
	struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	CHECK(icq && cq, "create_cq");
	struct ibv_qp *a = rc_qp(ipd, icq), *b = rc_qp(pd, cq);
	connect_qp(a, b->qp_num, &gid);
	connect_qp(b, a->qp_num, &gid);
	for (int i = 0; i < 4096; i++)
		buf[i] = (char)(i * 7 + 1);
	CHECK(rdma_write(a, icq, buf, imr->lkey, buf + 8192, imr->rkey, 4096) == IBV_WC_SUCCESS, "write");
	CHECK(memcmp(buf, buf + 8192, 4096) == 0, "written data");

	/* Imported structs are no users; QPs and MRs are. */
	RC(ibv_dealloc_pd(pd), EBUSY);
	RC(ibv_dealloc_pd(ipd), EBUSY);
	RC(ibv_destroy_qp(a), 0);
	RC(ibv_destroy_qp(b), 0);
	RC(ibv_destroy_cq(icq), 0);
	RC(ibv_destroy_cq(cq), 0);

	/* Unimport leaves the object: the original deregisters it. */
	ibv_unimport_mr(imr);
	uint32_t h = mr->handle;
	RC(ibv_dereg_mr(mr), 0);
	NULL_ERRNO(ibv_import_mr(ipd, h), ENOENT);

	/* Deregistration through a copy destroys the MR; the original struct
	 * may then only be unimported. */
	mr = ibv_reg_mr(ipd, buf, len, acc); /* registered through the imported PD */
	CHECK(mr && mr->context == imp, "reg_mr on an imported PD: %s", strerror(errno));
	RC(ibv_dealloc_pd(pd), EBUSY);
	imr = ibv_import_mr(pd, mr->handle); /* from the original context: same file */
	CHECK(imr && imr->context == ctx, "import_mr: %s", strerror(errno));
	RC(ibv_dereg_mr(imr), 0);
	NULL_ERRNO(ibv_import_mr(pd, mr->handle), ENOENT);
	RC(ibv_dereg_mr(mr), EINVAL);
	ibv_unimport_mr(mr);

	/* The original MR struct unimported: the region stays, can be imported
	 * again, and goes with a copy's deregistration. */
	mr = ibv_reg_mr(pd, buf, len, acc);
	CHECK(mr, "reg_mr");
	uint32_t rkey = mr->rkey;
	h = mr->handle;
	ibv_unimport_mr(mr);
	imr = ibv_import_mr(ipd, h);
	CHECK(imr && imr->rkey == rkey, "import_mr after unimport: %s", strerror(errno));
	RC(ibv_dealloc_pd(pd), EBUSY); /* the region is still registered */
	RC(ibv_dereg_mr(imr), 0);

	/* Device memory: both structs reach the same memory; a region over
	 * either makes the free EBUSY. */
	struct ibv_alloc_dm_attr dattr = { .length = 4096 };
	struct ibv_dm *dm = ibv_alloc_dm(ctx, &dattr);
	CHECK(dm, "alloc_dm: %s", strerror(errno));
	struct ibv_dm *idm = ibv_import_dm(imp, dm->handle);
	CHECK(idm && idm->handle == dm->handle && idm->context == imp, "import_dm: %s", strerror(errno));
	NULL_ERRNO(ibv_import_dm(imp, pd->handle), EINVAL);
	NULL_ERRNO(ibv_import_dm(other, dm->handle), ENOENT);
	uint32_t in[64], out[64];
	for (int i = 0; i < 64; i++)
		in[i] = 0xab000000u | (uint32_t)i;
	RC(ibv_memcpy_to_dm(dm, 256, in, sizeof(in)), 0);
	memset(out, 0, sizeof(out));
	RC(ibv_memcpy_from_dm(out, idm, 256, sizeof(out)), 0);
	CHECK(memcmp(in, out, sizeof(in)) == 0, "imported DM reads the original's data");
	struct ibv_mr *dmr = ibv_reg_dm_mr(ipd, idm, 0, 4096, IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE);
	CHECK(dmr, "reg_dm_mr on an imported DM: %s", strerror(errno));
	RC(ibv_free_dm(dm), EBUSY);
	RC(ibv_free_dm(idm), EBUSY);
	RC(ibv_dereg_mr(dmr), 0);
	RC(ibv_free_dm(idm), 0); /* freed through the copy */
	NULL_ERRNO(ibv_import_dm(imp, dm->handle), ENOENT);
	ibv_unimport_dm(dm);

	/* PD: freed through the imported struct while the original and a
	 * second copy exist (they are not users); both then only unimported. */
	struct ibv_pd *ipd2 = ibv_import_pd(ctx, pd->handle);
	CHECK(ipd2, "import_pd into the original context: %s", strerror(errno));
	RC(ibv_dealloc_pd(ipd), 0);
	NULL_ERRNO(ibv_import_pd(imp, pd->handle), ENOENT);
	ibv_unimport_pd(ipd2);
	ibv_unimport_pd(pd);

	/* Objects outlive the original context while the imported one is
	 * open; closing a context closes its cmd_fd. */
	pd = ibv_alloc_pd(ctx);
	CHECK(pd, "alloc_pd");
	dm = ibv_alloc_dm(ctx, &dattr);
	CHECK(dm, "alloc_dm");
	int fd = ctx->cmd_fd, keep = dup(fd);
	CHECK(keep >= 0, "dup");
	RC(ibv_close_device(ctx), 0);
	CHECK(!fd_open(fd), "close_device leaves cmd_fd open");
	ipd = ibv_import_pd(imp, pd->handle);
	CHECK(ipd, "import_pd after the original context closed: %s", strerror(errno));
	idm = ibv_import_dm(imp, dm->handle);
	CHECK(idm, "import_dm after the original context closed: %s", strerror(errno));
	RC(ibv_memcpy_to_dm(idm, 0, in, sizeof(in)), 0);
	RC(ibv_dealloc_pd(ipd), 0);
	ibv_unimport_pd(pd);
	ibv_unimport_dm(idm);
	ibv_unimport_dm(dm); /* the DM stays in its file until the file goes */
	struct ibv_context *imp2 = ibv_import_device(keep);
	CHECK(imp2, "import from a duplicate after the original closed: %s", strerror(errno));
	keep = dup(keep);
	CHECK(keep >= 0, "dup");
	RC(ibv_close_device(imp2), 0);
	RC(ibv_close_device(imp), 0);
	CHECK(!fd_open(dup_fd), "close_device leaves the imported cmd_fd open");
	/* Every context of the file closed: nothing left to import. */
	NULL_ERRNO(ibv_import_device(keep), EOPNOTSUPP);
	close(keep);

	RC(ibv_close_device(other), 0);
	free(buf);
	printf("all ok\n");
	return 0;
}
