/* What a same-host single copy of a 64 KiB RDMA WRITE could cost (issue 30).
 *
 * A parent process holds the source buffer (the requester's registered
 * region, in a memfd as uroce's owned pages are); a forked child (the
 * responder) copies it into its own buffer in four ways, each timed over
 * `iters` copies, three rounds:
 *   memcpy      - from its own mapping of the pages (the baseline);
 *   pvm 64K     - one process_vm_readv of the whole 64 KiB from the parent;
 *   pvm 16x4K   - sixteen process_vm_readv of 4 KiB (one per RoCE packet);
 *   memfd       - memcpy from the parent's memfd mapped read-only once in
 *                 the child (the mapping and its first copy timed apart).
 *
 *   gcc -O2 -o /tmp/single_copy scripts/bench/single_copy.c && /tmp/single_copy 5000
 *
 * Results: docs/benchmarks-history.md, "A same-host single copy: what each
 * way costs".
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

#define LEN 65536
#define PIECE 4096

static int child(pid_t parent, int fd, const char *shared, int iters)
{
	char *dst = aligned_alloc(4096, LEN);
	memset(dst, 0, LEN);
	double t0 = now();
	const char *peer = mmap(NULL, LEN, PROT_READ, MAP_SHARED, fd, 0);
	if (peer == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	memcpy(dst, peer, LEN);
	double first = now() - t0;
	for (int round = 0; round < 3; round++) {
		t0 = now();
		for (int i = 0; i < iters; i++) {
			memcpy(dst, shared, LEN);
			__asm__ volatile("" ::"r"(dst) : "memory");
		}
		double tm = (now() - t0) / iters;
		t0 = now();
		for (int i = 0; i < iters; i++) {
			struct iovec l = { dst, LEN }, r = { (void *)shared, LEN };
			if (process_vm_readv(parent, &l, 1, &r, 1, 0) != LEN) {
				perror("process_vm_readv");
				return 1;
			}
		}
		double tw = (now() - t0) / iters;
		t0 = now();
		for (int i = 0; i < iters; i++) {
			for (size_t o = 0; o < LEN; o += PIECE) {
				struct iovec l = { dst + o, PIECE }, r = { (void *)(shared + o), PIECE };
				if (process_vm_readv(parent, &l, 1, &r, 1, 0) != PIECE) {
					perror("process_vm_readv");
					return 1;
				}
			}
		}
		double tp = (now() - t0) / iters;
		t0 = now();
		for (int i = 0; i < iters; i++) {
			memcpy(dst, peer, LEN);
			__asm__ volatile("" ::"r"(dst) : "memory");
		}
		double tf = (now() - t0) / iters;
		printf("64 KiB: memcpy %.2f us | pvm 64K %.2f us (%.2f x memcpy) | pvm 16x4K %.2f us (%.2f x) | "
		       "memfd %.2f us (%.2f x; map + first copy %.1f us)\n",
		       tm * 1e6, tw * 1e6, tm / tw, tp * 1e6, tm / tp, tf * 1e6, tm / tf, first * 1e6);
	}
	return 0;
}

int main(int argc, char **argv)
{
	int iters = argc > 1 ? atoi(argv[1]) : 5000;
	int fd = memfd_create("single-copy", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, LEN) != 0) {
		perror("memfd");
		return 1;
	}
	char *src = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (src == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	memset(src, 7, LEN);
	pid_t parent = getpid();
	pid_t c = fork();
	if (c < 0) {
		perror("fork");
		return 1;
	}
	if (c == 0)
		return child(parent, fd, src, iters);
	int st;
	waitpid(c, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
