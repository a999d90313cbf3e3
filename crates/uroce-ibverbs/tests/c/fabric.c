/* What applications do with libfabric's API (Debian's libfabric 1.17),
 * run through the drop-in libraries by tests/libfabric.rs, server and
 * client as two processes:
 *
 *   fabric msg server PORT          fabric msg client ADDR PORT
 *   fabric rdm server PORT          fabric rdm client ADDR PORT
 *
 * msg (provider verbs, FI_EP_MSG): CM data both ways (connect and accept),
 * send/recv, RMA write and read, RMA write with CQ data; the server's CQ
 * waits through epoll on the CQ's wait fd (FI_GETWAIT, fi_trywait).
 * rdm (provider "verbs;ofi_rxm", FI_EP_RDM): tagged messages (the client's
 * address travels in the first one), atomics (FI_SUM, fetching FI_SUM,
 * FI_CSWAP) on a server counter. Each side checks what it got and prints
 * "fabric <mode> <side> ok". The server binds no node ("localhost" in
 * libfabric), as fi_pingpong's does. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>
#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#define DIE(...)                                                      \
	do {                                                          \
		fprintf(stderr, "fabric %s %s: ", mode, side);        \
		fprintf(stderr, __VA_ARGS__);                         \
		fprintf(stderr, " (line %d)\n", __LINE__);            \
		exit(1);                                              \
	} while (0)
#define OK(call)                                                                  \
	do {                                                                      \
		long r_ = (long)(call);                                           \
		if (r_)                                                           \
			DIE("%s: %ld (%s)", #call, r_, fi_strerror((int)-r_)); \
	} while (0)

/* A post that may find no room yet (ofi_rxm while it connects): retried
 * (at most 20 s), the CQ read for nothing meanwhile to drive progress. */
#define POST(call)                                                                        \
	do {                                                                              \
		double end_ = now() + 20;                                                 \
		long r_;                                                                  \
		while ((r_ = (long)(call)) == -FI_EAGAIN && now() < end_)                 \
			fi_cq_read(cq, NULL, 0);                                          \
		if (r_)                                                                   \
			DIE("%s: %ld (%s)", #call, r_, fi_strerror((int)-r_));         \
	} while (0)

static double now(void);
static const char *mode = "?", *side = "?";
static struct fid_fabric *fabric;
static struct fid_domain *domain;
static struct fid_cq *cq;
static struct fid_mr *mr;
static int epfd = -1, cqfd = -1;
static char buf[1 << 16];

/* The remote buffer an RMA or atomic peer may use. */
struct remote {
	uint64_t addr, key;
};

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* One completion (at most 20 s), through epoll when the CQ has a wait fd. */
static void wait_cq(struct fi_cq_tagged_entry *e, const char *what)
{
	double end = now() + 20;
	while (now() < end) {
		ssize_t n = fi_cq_read(cq, e, 1);
		if (n == 1)
			return;
		if (n == -FI_EAVAIL) {
			struct fi_cq_err_entry err = { 0 };
			fi_cq_readerr(cq, &err, 0);
			DIE("%s: completion error %d (%s), prov %d", what, err.err, fi_strerror(err.err),
			    err.prov_errno);
		}
		if (n != -FI_EAGAIN)
			DIE("%s: fi_cq_read %zd", what, n);
		if (cqfd >= 0) {
			struct fid *f = &cq->fid;
			if (fi_trywait(fabric, &f, 1) == FI_SUCCESS) {
				struct epoll_event ev;
				epoll_wait(epfd, &ev, 1, 1000);
			}
		}
	}
	DIE("%s: no completion in 20 s", what);
}

/* The completion of the operation whose context is `ctx`: completions of
 * other operations read meanwhile are kept for their own wait (the order
 * of a send's and a receive's completions is not fixed). */
static struct fi_cq_tagged_entry wait_ctx(void *ctx, const char *what)
{
	static struct fi_cq_tagged_entry kept[16];
	static int nkept;
	for (;;) {
		for (int i = 0; i < nkept; i++) {
			if (kept[i].op_context == ctx) {
				struct fi_cq_tagged_entry e = kept[i];
				kept[i] = kept[--nkept];
				return e;
			}
		}
		if (nkept == 16)
			DIE("%s: 16 unexpected completions", what);
		wait_cq(&kept[nkept++], what);
	}
}

static struct fi_info *hints_for(enum fi_ep_type t, const char *prov)
{
	struct fi_info *h = fi_allocinfo();
	h->ep_attr->type = t;
	h->fabric_attr->prov_name = strdup(prov);
	h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	h->addr_format = FI_SOCKADDR_IN;
	if (t == FI_EP_MSG) {
		h->caps = FI_MSG | FI_RMA;
		h->mode = FI_CONTEXT | FI_RX_CQ_DATA;
		h->domain_attr->cq_data_size = 4;
	} else {
		h->caps = FI_TAGGED | FI_ATOMIC;
		h->mode = FI_CONTEXT;
	}
	return h;
}

static void open_cq(int with_fd)
{
	/* verbs' CQs have no tag: FI_CQ_FORMAT_DATA, a prefix of the tagged entry. */
	enum fi_cq_format f = strcmp(mode, "rdm") ? FI_CQ_FORMAT_DATA : FI_CQ_FORMAT_TAGGED;
	struct fi_cq_attr a = { .format = f, .size = 64,
				.wait_obj = with_fd ? FI_WAIT_FD : FI_WAIT_UNSPEC };
	OK(fi_cq_open(domain, &a, &cq, NULL));
	if (with_fd) {
		OK(fi_control(&cq->fid, FI_GETWAIT, &cqfd));
		epfd = epoll_create1(0);
		struct epoll_event ev = { .events = EPOLLIN };
		if (epfd < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, cqfd, &ev))
			DIE("epoll: %s", strerror(errno));
	}
	uint64_t acc = FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
	OK(fi_mr_reg(domain, buf, sizeof buf, acc, 0, 0, 0, &mr, NULL));
}

/* The next CM event, which must be `want`; its data into `data`. */
static size_t cm_event(struct fid_eq *eq, uint32_t want, struct fi_info **info, void *data, size_t len)
{
	struct {
		struct fi_eq_cm_entry e;
		char data[256];
	} ent;
	uint32_t ev;
	ssize_t n = fi_eq_sread(eq, &ev, &ent, sizeof ent, 20000, 0);
	if (n == -FI_EAVAIL) {
		struct fi_eq_err_entry err = { 0 };
		fi_eq_readerr(eq, &err, 0);
		DIE("EQ error %d (%s)", err.err, fi_strerror(err.err));
	}
	if (n < (ssize_t)sizeof ent.e || ev != want)
		DIE("EQ: %zd, event %u, want %u", n, ev, want);
	if (info)
		*info = ent.e.info;
	size_t got = n - sizeof ent.e;
	if (data)
		memcpy(data, ent.data, got < len ? got : len);
	return got;
}

static void *desc(void)
{
	return fi_mr_desc(mr);
}

/* Closes what the program opened, endpoint first, as applications do. */
static void close_all(struct fid *ep, struct fid *av)
{
	OK(fi_close(ep));
	if (av)
		OK(fi_close(av));
	OK(fi_close(&mr->fid));
	OK(fi_close(&cq->fid));
	OK(fi_close(&domain->fid));
}

static void msg_server(const char *port)
{
	struct fi_info *fi, *req;
	struct fid_eq *eq;
	struct fid_pep *pep;
	struct fid_ep *ep;
	struct fi_eq_attr ea = { .wait_obj = FI_WAIT_UNSPEC };
	struct fi_cq_tagged_entry e;
	char cmdata[64] = { 0 };

	OK(fi_getinfo(FI_VERSION(1, 9), NULL, port, FI_SOURCE, hints_for(FI_EP_MSG, "verbs"), &fi));
	OK(fi_fabric(fi->fabric_attr, &fabric, NULL));
	OK(fi_eq_open(fabric, &ea, &eq, NULL));
	OK(fi_passive_ep(fabric, fi, &pep, NULL));
	OK(fi_pep_bind(pep, &eq->fid, 0));
	OK(fi_listen(pep));
	printf("listening\n");
	fflush(stdout);
	size_t n = cm_event(eq, FI_CONNREQ, &req, cmdata, sizeof cmdata - 1);
	if (n != 15 || strcmp(cmdata, "client cm data"))
		DIE("CONNREQ data: %zu bytes '%s'", n, cmdata);
	OK(fi_domain(fabric, req, &domain, NULL));
	OK(fi_endpoint(domain, req, &ep, NULL));
	open_cq(1);
	OK(fi_ep_bind(ep, &eq->fid, 0));
	OK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
	OK(fi_enable(ep));
	/* Receives: the client's message, its RMA write with CQ data. */
	static struct fi_context ctx[4];
	POST(fi_recv(ep, buf, 64, desc(), 0, &ctx[0]));
	POST(fi_recv(ep, buf + 64, 64, desc(), 0, &ctx[1]));
	memset(buf + 8192, 'S', 64);
	struct remote r = { (uintptr_t)buf, fi_mr_key(mr) };
	OK(fi_accept(ep, &r, sizeof r));
	cm_event(eq, FI_CONNECTED, NULL, NULL, 0);

	e = wait_ctx(&ctx[0], "recv");
	if (!(e.flags & FI_RECV) || e.len != 18 || strcmp(buf, "hello from client"))
		DIE("recv: flags %" PRIx64 " len %zu '%s'", e.flags, e.len, buf);
	strcpy(buf + 256, "hello from server");
	POST(fi_send(ep, buf + 256, 18, desc(), 0, &ctx[2]));
	e = wait_ctx(&ctx[2], "send");
	/* The write with CQ data comes after the plain write and the read. */
	e = wait_ctx(&ctx[1], "write with CQ data");
	if (!(e.flags & FI_REMOTE_CQ_DATA) || e.data != 0xC0FFEE)
		DIE("CQ data: flags %" PRIx64 " data %" PRIx64, e.flags, e.data);
	for (int i = 0; i < 64; i++)
		if (buf[4096 + i] != 'W' || buf[12288 + i] != 'D')
			DIE("RMA write: byte %d is %d/%d", i, buf[4096 + i], buf[12288 + i]);
	strcpy(buf + 320, "ok");
	POST(fi_send(ep, buf + 320, 3, desc(), 0, &ctx[3]));
	e = wait_ctx(&ctx[3], "send ok");
	cm_event(eq, FI_SHUTDOWN, NULL, NULL, 0);
	close_all(&ep->fid, NULL);
	OK(fi_close(&pep->fid));
	printf("fabric msg server ok\n");
}

static void msg_client(const char *addr, const char *port)
{
	struct fi_info *fi;
	struct fid_eq *eq;
	struct fid_ep *ep;
	struct fi_eq_attr ea = { .wait_obj = FI_WAIT_UNSPEC };
	struct fi_cq_tagged_entry e;
	struct remote r;
	static struct fi_context ctx[8];

	OK(fi_getinfo(FI_VERSION(1, 9), addr, port, 0, hints_for(FI_EP_MSG, "verbs"), &fi));
	OK(fi_fabric(fi->fabric_attr, &fabric, NULL));
	OK(fi_eq_open(fabric, &ea, &eq, NULL));
	OK(fi_domain(fabric, fi, &domain, NULL));
	OK(fi_endpoint(domain, fi, &ep, NULL));
	open_cq(0);
	OK(fi_ep_bind(ep, &eq->fid, 0));
	OK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
	OK(fi_enable(ep));
	POST(fi_recv(ep, buf, 64, desc(), 0, &ctx[0]));
	POST(fi_recv(ep, buf + 64, 64, desc(), 0, &ctx[1]));
	OK(fi_connect(ep, fi->dest_addr, "client cm data", 15));
	if (cm_event(eq, FI_CONNECTED, NULL, &r, sizeof r) < sizeof r || !r.addr)
		DIE("CONNECTED: no accept data");

	strcpy(buf + 256, "hello from client");
	POST(fi_send(ep, buf + 256, 18, desc(), 0, &ctx[2]));
	e = wait_ctx(&ctx[2], "send");
	e = wait_ctx(&ctx[0], "recv");
	if (!(e.flags & FI_RECV) || strcmp(buf, "hello from server"))
		DIE("recv: '%s'", buf);
	memset(buf + 1024, 'W', 64);
	POST(fi_write(ep, buf + 1024, 64, desc(), 0, r.addr + 4096, r.key, &ctx[3]));
	e = wait_ctx(&ctx[3], "write");
	POST(fi_read(ep, buf + 2048, 64, desc(), 0, r.addr + 8192, r.key, &ctx[4]));
	e = wait_ctx(&ctx[4], "read");
	for (int i = 0; i < 64; i++)
		if (buf[2048 + i] != 'S')
			DIE("RMA read: byte %d is %d", i, buf[2048 + i]);
	memset(buf + 3072, 'D', 64);
	POST(fi_writedata(ep, buf + 3072, 64, desc(), 0xC0FFEE, 0, r.addr + 12288, r.key, &ctx[5]));
	e = wait_ctx(&ctx[5], "write with CQ data");
	e = wait_ctx(&ctx[1], "recv ok");
	if (strcmp(buf + 64, "ok"))
		DIE("recv ok: '%s'", buf + 64);
	OK(fi_shutdown(ep, 0));
	close_all(&ep->fid, NULL);
	printf("fabric msg client ok\n");
}

static struct fid_ep *rdm_ep(struct fi_info *fi, struct fid_av **av)
{
	struct fid_ep *ep;
	struct fi_av_attr aa = { .type = FI_AV_TABLE };
	OK(fi_fabric(fi->fabric_attr, &fabric, NULL));
	OK(fi_domain(fabric, fi, &domain, NULL));
	OK(fi_av_open(domain, &aa, av, NULL));
	OK(fi_endpoint(domain, fi, &ep, NULL));
	open_cq(0);
	OK(fi_ep_bind(ep, &(*av)->fid, 0));
	OK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
	OK(fi_enable(ep));
	return ep;
}

/* Tags: the client's hello (its address), the server's answer (its
 * counter), the client's done, the server's goodbye. */
enum { T_HELLO = 0x11, T_COUNTER = 0x22, T_DONE = 0x33, T_BYE = 0x44 };

static void rdm_server(const char *port)
{
	struct fi_info *fi;
	struct fid_av *av;
	struct fi_cq_tagged_entry e;
	fi_addr_t peer;
	static struct fi_context ctx[4];

	OK(fi_getinfo(FI_VERSION(1, 9), NULL, port, FI_SOURCE, hints_for(FI_EP_RDM, "verbs;ofi_rxm"), &fi));
	struct fid_ep *ep = rdm_ep(fi, &av);
	uint64_t *counter = (uint64_t *)(buf + 8192);
	*counter = 10;
	POST(fi_trecv(ep, buf, 256, desc(), FI_ADDR_UNSPEC, T_HELLO, 0, &ctx[0]));
	printf("listening\n");
	fflush(stdout);
	e = wait_ctx(&ctx[0], "hello");
	if (!(e.flags & FI_TAGGED) || e.tag != T_HELLO)
		DIE("hello: flags %" PRIx64 " tag %" PRIx64, e.flags, e.tag);
	if (fi_av_insert(av, buf, 1, &peer, 0, NULL) != 1)
		DIE("fi_av_insert of the client's address");
	POST(fi_trecv(ep, buf + 512, 64, desc(), peer, T_DONE, 0, &ctx[1]));
	struct remote r = { (uintptr_t)counter, fi_mr_key(mr) };
	memcpy(buf + 1024, &r, sizeof r);
	POST(fi_tsend(ep, buf + 1024, sizeof r, desc(), peer, T_COUNTER, &ctx[2]));
	/* Our send, then the client's done (atomics progress meanwhile). */
	wait_ctx(&ctx[2], "send counter");
	wait_ctx(&ctx[1], "done");
	if (strcmp(buf + 512, "done"))
		DIE("done: '%s'", buf + 512);
	if (*counter != 100)
		DIE("counter %" PRIu64 ", want 100 (10 + 5, then swapped for 100)", *counter);
	/* Goodbye: the client closes after it, then we do. */
	strcpy(buf + 2048, "bye");
	POST(fi_tsend(ep, buf + 2048, 4, desc(), peer, T_BYE, &ctx[3]));
	wait_ctx(&ctx[3], "bye");
	printf("fabric rdm server transfers done\n");
	close_all(&ep->fid, &av->fid);
	printf("fabric rdm server ok\n");
}

static void rdm_client(const char *addr, const char *port)
{
	struct fi_info *fi;
	struct fid_av *av;
	fi_addr_t server;
	struct remote r;
	static struct fi_context ctx[8];

	OK(fi_getinfo(FI_VERSION(1, 9), addr, port, 0, hints_for(FI_EP_RDM, "verbs;ofi_rxm"), &fi));
	struct fid_ep *ep = rdm_ep(fi, &av);
	if (fi_av_insert(av, fi->dest_addr, 1, &server, 0, NULL) != 1)
		DIE("fi_av_insert of the server's address");
	POST(fi_trecv(ep, buf + 4096, sizeof r, desc(), server, T_COUNTER, 0, &ctx[0]));
	size_t len = 256;
	OK(fi_getname(&ep->fid, buf, &len));
	POST(fi_tsend(ep, buf, len, desc(), server, T_HELLO, &ctx[1]));
	wait_ctx(&ctx[1], "hello sent");
	wait_ctx(&ctx[0], "counter");
	memcpy(&r, buf + 4096, sizeof r);
	if (!r.addr)
		DIE("no counter address");
	uint64_t *v = (uint64_t *)(buf + 1024), *res = v + 1, *cmp = v + 2;
	*v = 5;
	POST(fi_atomic(ep, v, 1, desc(), server, r.addr, r.key, FI_UINT64, FI_SUM, &ctx[2]));
	wait_ctx(&ctx[2], "atomic sum");
	*v = 0;
	POST(fi_fetch_atomic(ep, v, 1, desc(), res, desc(), server, r.addr, r.key, FI_UINT64, FI_SUM, &ctx[3]));
	wait_ctx(&ctx[3], "fetching atomic");
	if (*res != 15)
		DIE("fetched %" PRIu64 ", want 15", *res);
	*cmp = 15;
	*v = 100;
	POST(fi_compare_atomic(ep, v, 1, desc(), cmp, desc(), res, desc(), server, r.addr, r.key, FI_UINT64,
			     FI_CSWAP, &ctx[4]));
	wait_ctx(&ctx[4], "compare and swap");
	if (*res != 15)
		DIE("compare and swap fetched %" PRIu64 ", want 15", *res);
	strcpy(buf + 2048, "done");
	POST(fi_trecv(ep, buf + 3072, 64, desc(), server, T_BYE, 0, &ctx[6]));
	POST(fi_tsend(ep, buf + 2048, 5, desc(), server, T_DONE, &ctx[5]));
	wait_ctx(&ctx[5], "done");
	wait_ctx(&ctx[6], "bye");
	if (strcmp(buf + 3072, "bye"))
		DIE("bye: '%s'", buf + 3072);
	printf("fabric rdm client transfers done\n");
	close_all(&ep->fid, &av->fid);
	printf("fabric rdm client ok\n");
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: %s msg|rdm server PORT | client ADDR PORT\n", argv[0]);
		return 2;
	}
	/* Each line as it comes: a crash in the teardown keeps what came before. */
	setvbuf(stdout, NULL, _IOLBF, 0);
	mode = argv[1];
	side = argv[2];
	int rdm = !strcmp(mode, "rdm");
	if (!strcmp(side, "server"))
		rdm ? rdm_server(argv[3]) : msg_server(argv[3]);
	else if (argc > 4)
		rdm ? rdm_client(argv[3], argv[4]) : msg_client(argv[3], argv[4]);
	else
		return 2;
	return 0;
}
