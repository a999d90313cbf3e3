/* ibv_close_device with leaked objects (issue 17 §2; perftest's
 * `ib_send_bw -c UD` client leaks and closes): as the kernel releases a
 * file's objects on close, the context's QP, CQ, SRQ, AH, MW, MR and PD go with
 * it, and so does the device: its progress thread ends, its UDP port is free (a plain socket binds it), and a new
 * ibv_open_device starts a working device on the same address.
 * Run with UROCE_ADDR set. Prints "all ok". */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "check.h"

/* The device progress threads of the process (named uroce-progress; the
 * statistics publisher and the ODP notifier are process-wide). */
static int threads(void)
{
	int n = 0;
	DIR *d = opendir("/proc/self/task");
	CHECK(d, "opendir /proc/self/task");
	for (struct dirent *e; (e = readdir(d));) {
		if (e->d_name[0] == '.')
			continue;
		char path[300], comm[64] = { 0 };
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		if (fgets(comm, sizeof(comm), f))
			n += strncmp(comm, "uroce-progress", 14) == 0;
		fclose(f);
	}
	closedir(d);
	return n;
}

/* Whether the device's UDP port can be bound by a plain socket. */
static int port_free(void)
{
	const char *addr = getenv("UROCE_ADDR"), *port = getenv("UROCE_PORT");
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port ? atoi(port) : 4791) };
	CHECK(addr && inet_pton(AF_INET, addr, &sa.sin_addr) == 1, "UROCE_ADDR");
	int s = socket(AF_INET, SOCK_DGRAM, 0);
	CHECK(s >= 0, "socket");
	int ok = bind(s, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	close(s);
	return ok;
}

static struct ibv_context *open_first(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0, "no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device: %s", strerror(errno));
	ibv_free_device_list(list);
	return ctx;
}

int main(void)
{
	int before = threads();
	for (int round = 0; round < 3; round++) {
		struct ibv_context *ctx = open_first();
		CHECK(!port_free(), "round %d: the open device's port is bound", round);
		/* (The thread names itself once it runs.) */
		for (int i = 0; i < 200 && threads() == before; i++)
			usleep(10000);
		CHECK(threads() > before, "the device has a progress thread");
		union ibv_gid gid;
		CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "query_gid");
		/* Objects, none destroyed. */
		struct ibv_pd *pd = ibv_alloc_pd(ctx);
		static char buf[8192];
		struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
		struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
		struct ibv_srq_init_attr si = { .attr = { .max_wr = 2, .max_sge = 1 } };
		struct ibv_srq *srq = ibv_create_srq(pd, &si);
		struct ibv_qp_init_attr qi = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
					       .cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1,
							.max_recv_sge = 1 } };
		struct ibv_qp *qp = ibv_create_qp(pd, &qi);
		qi.srq = srq;
		struct ibv_qp *qp2 = ibv_create_qp(pd, &qi);
		struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .hop_limit = 1 } };
		struct ibv_ah *ah = ibv_create_ah(pd, &aa);
		struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
		CHECK(pd && mr && cq && srq && qp && qp2 && ah && mw, "objects: %s", strerror(errno));
		CHECK(ibv_close_device(ctx) == 0, "close_device");
		/* The device is gone: its thread ended and its port is free. */
		int n = threads();
		for (int i = 0; i < 200 && n > before; i++) {
			usleep(10000);
			n = threads();
		}
		CHECK(n == before, "round %d: %d progress threads after close, %d before open", round, n, before);
		CHECK(port_free(), "round %d: the device's port is still bound after ibv_close_device", round);
	}
	/* A new device on the same address works. */
	struct ibv_context *ctx = open_first();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	CHECK(pd && cq, "objects on the new device");
	CHECK(ibv_destroy_cq(cq) == 0 && ibv_dealloc_pd(pd) == 0 && ibv_close_device(ctx) == 0, "teardown");
	printf("all ok\n");
	return 0;
}
