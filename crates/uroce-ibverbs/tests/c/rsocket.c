/* rsockets through the drop-ins, in one process with one device
 * (tests/rstream.rs): bad calls get their errno (unknown fd EBADF, a
 * socket never connected ENOTCONN, double rclose EBADF, bad options
 * EFAULT/EINVAL, unknown options and raw sockets EOPNOTSUPP), rfcntl
 * keeps O_NONBLOCK; a non-blocking connect to this process's own listener
 * (EINPROGRESS) is driven by rpoll together with an ordinary pipe, raccept
 * returns the peer's address, MSG_PEEK leaves data queued, SO_ERROR is 0;
 * a half-close (rshutdown SHUT_WR) gives the peer end of stream while it
 * can still answer; after the peer's rclose, reads give 0 and sends fail
 * ECONNRESET with no SIGPIPE. Datagram sockets: a datagram each way, the
 * first over UDP, the next ones over UD QPs, with their source addresses;
 * rsend unconnected EDESTADDRREQ, rlisten EOPNOTSUPP. A thread blocked in
 * rrecv on an idle connection sleeps (no wake-ups on a poll interval), and
 * wakes for data. argv[1]: the device's IPv4 address.
 * Prints "all ok". */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <time.h>
#include <unistd.h>
#include "check.h"

static atomic_int reader_tid;
static char reader_buf[16];
static ssize_t reader_got;

/* Blocks in rrecv on the socket given. */
static void *reader(void *arg)
{
	int fd = *(int *)arg;
	atomic_store(&reader_tid, (int)syscall(SYS_gettid));
	reader_got = rrecv(fd, reader_buf, 5, MSG_WAITALL);
	return NULL;
}

/* A field of /proc/self/task/TID/status ("voluntary_ctxt_switches"), or
 * the state letter of .../stat when `field` is NULL. */
static long task_info(int tid, const char *field)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/self/task/%d/%s", tid, field ? "status" : "stat");
	FILE *f = fopen(path, "r");
	CHECK(f, "open %s: %m", path);
	long v = -1;
	if (!field) {
		CHECK(fgets(line, sizeof(line), f), "read %s", path);
		char *c = strrchr(line, ')');
		v = c && c[1] ? c[2] : -1;
	} else {
		while (fgets(line, sizeof(line), f))
			if (!strncmp(line, field, strlen(field)))
				v = atol(line + strlen(field) + 1);
	}
	fclose(f);
	return v;
}

static void pipe_signal(int sig)
{
	(void)sig;
	fprintf(stderr, "FAIL: SIGPIPE raised\n");
	_exit(1);
}

int main(int argc, char **argv)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(7497) };
	struct sockaddr_in peer;
	socklen_t len;
	char buf[64];
	int l, c, s, val, p[2];

	CHECK(argc == 2 && inet_pton(AF_INET, argv[1], &sa.sin_addr) == 1, "usage: rsocket-test ADDR");
	signal(SIGPIPE, pipe_signal);

	/* Bad fds and arguments. */
	errno = 0;
	CHECK(rsend(12345, "x", 1, 0) == -1 && errno == EBADF, "rsend bad fd: %m");
	CHECK(rrecv(12345, buf, 1, 0) == -1 && errno == EBADF, "rrecv bad fd: %m");
	CHECK(rclose(-1) == -1 && errno == EBADF, "rclose bad fd: %m");
	CHECK(rfcntl(12345, F_GETFL) == -1 && errno == EBADF, "rfcntl bad fd: %m");
	CHECK(rsocket(AF_INET, SOCK_RAW, 0) == -1 && errno == EOPNOTSUPP, "raw: %m");
	CHECK(rsocket(AF_UNIX, SOCK_STREAM, 0) == -1 && errno == EOPNOTSUPP, "AF_UNIX: %m");
	CHECK(rsocket(AF_INET, SOCK_STREAM, IPPROTO_UDP) == -1 && errno == EOPNOTSUPP, "proto: %m");

	/* A socket never connected. */
	c = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(c >= 0, "rsocket: %m");
	CHECK(rsend(c, "x", 1, 0) == -1 && errno == ENOTCONN, "rsend unconnected: %m");
	CHECK(rrecv(c, buf, 1, 0) == -1 && errno == ENOTCONN, "rrecv unconnected: %m");
	len = sizeof(peer);
	CHECK(rgetpeername(c, (struct sockaddr *)&peer, &len) == -1 && errno == ENOTCONN, "getpeername: %m");
	CHECK(rshutdown(c, SHUT_RDWR) == -1 && errno == ENOTCONN, "rshutdown unconnected: %m");
	CHECK(rshutdown(c, 7) == -1 && errno == EINVAL, "rshutdown how 7: %m");
	CHECK(raccept(c, NULL, NULL) == -1 && errno == EINVAL, "raccept not listening: %m");
	CHECK(rsend(c, NULL, 5, 0) == -1 && errno == EFAULT, "rsend NULL: %m");
	CHECK(rconnect(c, NULL, 16) == -1 && errno == EFAULT, "rconnect NULL: %m");
	CHECK(rconnect(c, (struct sockaddr *)&sa, 4) == -1 && errno == EINVAL, "rconnect short len: %m");
	val = 1;
	CHECK(rsetsockopt(c, SOL_SOCKET, SO_REUSEADDR, NULL, 4) == -1 && errno == EFAULT, "setsockopt NULL");
	CHECK(rsetsockopt(c, SOL_SOCKET, SO_REUSEADDR, &val, 1) == -1 && errno == EINVAL, "setsockopt len 1");
	CHECK(rsetsockopt(c, SOL_SOCKET, SO_BROADCAST, &val, 4) == -1 && errno == EOPNOTSUPP, "SO_BROADCAST");
	CHECK(rsetsockopt(c, SOL_RDMA, RDMA_ROUTE, &val, 4) == -1 && errno == EOPNOTSUPP, "RDMA_ROUTE");
	CHECK(rsetsockopt(c, IPPROTO_TCP, TCP_KEEPIDLE, &(int){ 0 }, 4) == -1 && errno == EINVAL, "KEEPIDLE 0");
	CHECK(rsetsockopt(c, IPPROTO_TCP, TCP_NODELAY, &val, 4) == 0, "TCP_NODELAY: %m");
	CHECK(rsetsockopt(c, SOL_RDMA, RDMA_INLINE, &(int){ 0 }, 4) == 0, "RDMA_INLINE: %m");
	len = sizeof(val);
	val = 5;
	CHECK(rgetsockopt(c, IPPROTO_TCP, TCP_NODELAY, &val, &len) == 0 && val == 1, "get TCP_NODELAY");
	CHECK(rgetsockopt(c, SOL_RDMA, RDMA_INLINE, &val, &len) == 0 && val == 0, "get RDMA_INLINE");
	CHECK(rgetsockopt(c, SOL_SOCKET, SO_BROADCAST, &val, &len) == -1 && errno == EOPNOTSUPP, "get SO_BROADCAST");
	CHECK(rfcntl(c, F_GETFL) == 0, "F_GETFL");
	CHECK(rfcntl(c, F_SETFL, O_NONBLOCK) == 0 && rfcntl(c, F_GETFL) == O_NONBLOCK, "F_SETFL");
	CHECK(rfcntl(c, F_DUPFD, 0) == -1 && errno == EOPNOTSUPP, "F_DUPFD: %m");
	CHECK(riomap(c, buf, sizeof(buf), PROT_READ, 0, -1) == -1 && errno == EINVAL, "riomap PROT_READ: %m");
	CHECK(riounmap(c, buf, sizeof(buf)) == -1 && errno == EINVAL, "riounmap nothing: %m");
	CHECK(riowrite(12345, buf, 1, 0, 0) == (size_t)-1 && errno == EBADF, "riowrite bad fd: %m");
	CHECK(rclose(c) == 0, "rclose: %m");
	CHECK(rclose(c) == -1 && errno == EBADF, "rclose twice: %m");

	/* A listener and a non-blocking connect to it, driven by rpoll with a pipe. */
	l = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(l >= 0, "rsocket: %m");
	val = 1;
	CHECK(rsetsockopt(l, SOL_SOCKET, SO_REUSEADDR, &val, sizeof(val)) == 0, "REUSEADDR: %m");
	CHECK(rbind(l, (struct sockaddr *)&sa, sizeof(sa)) == 0, "rbind: %m");
	CHECK(rbind(l, (struct sockaddr *)&sa, sizeof(sa)) == -1 && errno == EINVAL, "rbind twice: %m");
	CHECK(rlisten(l, 4) == 0, "rlisten: %m");
	CHECK(rfcntl(l, F_SETFL, O_NONBLOCK) == 0, "listener O_NONBLOCK");
	CHECK(raccept(l, NULL, NULL) == -1 && errno == EAGAIN, "raccept nothing: %m");
	CHECK(pipe(p) == 0, "pipe");
	CHECK(write(p[1], "p", 1) == 1, "write pipe");

	c = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(c >= 0, "rsocket: %m");
	CHECK(rfcntl(c, F_SETFL, O_NONBLOCK) == 0, "client O_NONBLOCK");
	CHECK(rconnect(c, (struct sockaddr *)&sa, sizeof(sa)) == -1 && errno == EINPROGRESS, "rconnect: %m");
	CHECK(rsend(c, "x", 1, 0) == -1 && errno == EAGAIN, "rsend while connecting: %m");
	s = -1;
	/* The pipe is always readable: rpoll returns at once; bounded by time. */
	for (time_t end = time(NULL) + 20; s < 0 && time(NULL) < end;) {
		struct pollfd f[3] = { { .fd = c, .events = POLLOUT }, { .fd = l, .events = POLLIN },
				       { .fd = p[0], .events = POLLIN } };
		/* rpoll leaves errno alone (rstream prints what a refused connect left). */
		errno = EINPROGRESS;
		int n = rpoll(f, 3, 100);
		CHECK(n >= 1 && (f[2].revents & POLLIN), "rpoll with the pipe: %d", n);
		CHECK(errno == EINPROGRESS, "rpoll changed errno: %m");
		if (f[1].revents & POLLIN) {
			len = sizeof(peer);
			s = raccept(l, (struct sockaddr *)&peer, &len);
			CHECK(s >= 0, "raccept: %m");
			CHECK(len == sizeof(peer) && peer.sin_family == AF_INET &&
			      peer.sin_addr.s_addr == sa.sin_addr.s_addr, "raccept peer address");
		}
	}
	CHECK(s >= 0, "no connection request within 20 s");
	for (int i = 0;; i++) {
		struct pollfd f = { .fd = c, .events = POLLOUT };
		CHECK(i < 100, "not connected within 10 s");
		if (rpoll(&f, 1, 100) == 1) {
			CHECK(f.revents == POLLOUT, "revents %#x", f.revents);
			break;
		}
	}
	len = sizeof(val);
	CHECK(rgetsockopt(c, SOL_SOCKET, SO_ERROR, &val, &len) == 0 && val == 0, "SO_ERROR %d", val);
	len = sizeof(peer);
	CHECK(rgetsockname(c, (struct sockaddr *)&peer, &len) == 0 && peer.sin_family == AF_INET, "rgetsockname");
	len = sizeof(peer);
	CHECK(rgetpeername(c, (struct sockaddr *)&peer, &len) == 0 && peer.sin_port == sa.sin_port, "rgetpeername");
	CHECK(rconnect(c, (struct sockaddr *)&sa, sizeof(sa)) == -1 && errno == EISCONN, "rconnect again: %m");

	/* Data: peek, then read; rselect says readable. */
	CHECK(rsend(c, "hello", 5, 0) == 5, "rsend: %m");
	fd_set rs;
	struct timeval tv = { .tv_sec = 10 };
	FD_ZERO(&rs);
	FD_SET(s, &rs);
	CHECK(rselect(s + 1, &rs, NULL, NULL, &tv) == 1 && FD_ISSET(s, &rs), "rselect");
	memset(buf, 0, sizeof(buf));
	CHECK(rrecv(s, buf, sizeof(buf), MSG_PEEK) == 5 && !memcmp(buf, "hello", 5), "peek");
	memset(buf, 0, sizeof(buf));
	CHECK(rrecv(s, buf, sizeof(buf), 0) == 5 && !memcmp(buf, "hello", 5), "rrecv");
	CHECK(rrecv(s, buf, sizeof(buf), MSG_DONTWAIT) == -1 && errno == EAGAIN, "nothing: %m");

	/* A reader blocked on an idle connection sleeps until data comes: at
	 * most a few wake-ups in a second (a 100 ms poll slice made ten). */
	pthread_t rt;
	CHECK(pthread_create(&rt, NULL, reader, &s) == 0, "pthread_create");
	int tid = 0;
	for (time_t end = time(NULL) + 10; !(tid = atomic_load(&reader_tid));) {
		CHECK(time(NULL) < end, "the reader did not start");
		usleep(1000);
	}
	for (time_t end = time(NULL) + 10; task_info(tid, NULL) != 'S';) {
		CHECK(time(NULL) < end, "the reader does not sleep");
		usleep(1000);
	}
	long before = task_info(tid, "voluntary_ctxt_switches");
	struct timespec idle = { .tv_sec = 1 };
	nanosleep(&idle, NULL);
	long woke = task_info(tid, "voluntary_ctxt_switches") - before;
	CHECK(woke <= 3, "a reader blocked on an idle connection woke %ld times in a second", woke);
	CHECK(rsend(c, "world", 5, 0) == 5, "rsend to the blocked reader: %m");
	CHECK(pthread_join(rt, NULL) == 0 && reader_got == 5 && !memcmp(reader_buf, "world", 5),
	      "the blocked reader got %zd", reader_got);

	/* Half-close: the server reads end of stream, and can still answer. */
	CHECK(rshutdown(c, SHUT_WR) == 0, "rshutdown SHUT_WR: %m");
	CHECK(rsend(c, "x", 1, 0) == -1 && errno == ECONNRESET, "rsend after SHUT_WR: %m");
	CHECK(rrecv(s, buf, sizeof(buf), 0) == 0, "end of stream");
	CHECK(rsend(s, "bye", 3, 0) == 3, "answer after half-close: %m");
	for (int i = 0;; i++) {
		CHECK(i < 100, "answer not received within 10 s");
		ssize_t n = rrecv(c, buf, sizeof(buf), 0);
		if (n == -1 && errno == EAGAIN) {
			struct pollfd f = { .fd = c, .events = POLLIN };
			rpoll(&f, 1, 100);
			continue;
		}
		CHECK(n == 3 && !memcmp(buf, "bye", 3), "answer: %zd %m", n);
		break;
	}

	/* The server closes: the client reads 0, its sends fail ECONNRESET. */
	CHECK(rclose(s) == 0, "rclose server: %m");
	for (int i = 0;; i++) {
		CHECK(i < 100, "no end of stream within 10 s");
		ssize_t n = rrecv(c, buf, sizeof(buf), 0);
		if (n == -1 && errno == EAGAIN) {
			struct pollfd f = { .fd = c, .events = POLLIN };
			rpoll(&f, 1, 100);
			continue;
		}
		CHECK(n == 0, "after the peer's close: %zd %m", n);
		break;
	}
	CHECK(rsend(c, "x", 1, 0) == -1 && errno == ECONNRESET, "rsend after peer close: %m");
	CHECK(rclose(c) == 0 && rclose(l) == 0, "rclose: %m");
	close(p[0]);
	close(p[1]);

	/* Datagrams: b (unbound) to a (bound), a answers to where it came from. */
	struct sockaddr_in da = sa, from;
	da.sin_port = htons(7498);
	int a = rsocket(AF_INET, SOCK_DGRAM, 0), b = rsocket(AF_INET, SOCK_DGRAM, 0);
	CHECK(a >= 0 && b >= 0, "rsocket dgram: %m");
	CHECK(rbind(a, (struct sockaddr *)&da, sizeof(da)) == 0, "rbind dgram: %m");
	CHECK(rlisten(a, 1) == -1 && errno == EOPNOTSUPP, "rlisten dgram: %m");
	CHECK(rsend(b, "x", 1, 0) == -1 && errno == EDESTADDRREQ, "rsend unconnected dgram: %m");
	for (int i = 0; i < 20; i++) {
		char msg[32], got[64];
		int n = snprintf(msg, sizeof(msg), "ping %d", i);
		CHECK(rsendto(b, msg, n, 0, (struct sockaddr *)&da, sizeof(da)) == n, "rsendto %d: %m", i);
		struct pollfd f = { .fd = a, .events = POLLIN };
		CHECK(rpoll(&f, 1, 10000) == 1 && f.revents == POLLIN, "dgram %d not received", i);
		len = sizeof(from);
		memset(got, 0, sizeof(got));
		CHECK(rrecvfrom(a, got, sizeof(got), 0, (struct sockaddr *)&from, &len) == n && !memcmp(got, msg, n),
		      "rrecvfrom %d: %s", i, got);
		CHECK(len == sizeof(from) && from.sin_family == AF_INET && from.sin_port != 0, "source %d", i);
		CHECK(rsendto(a, "pong", 4, 0, (struct sockaddr *)&from, len) == 4, "answer %d: %m", i);
		memset(got, 0, sizeof(got));
		CHECK(rrecv(b, got, sizeof(got), 0) == 4 && !memcmp(got, "pong", 4), "pong %d: %s", i, got);
	}
	CHECK(rclose(a) == 0 && rclose(b) == 0 && rclose(a) == -1 && errno == EBADF, "rclose dgram");
	printf("all ok\n");
	return 0;
}
