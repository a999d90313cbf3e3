/* A fake libcuda.so.1 for tests: the CUDA driver functions nv_mem loads,
 * backed by host memory, so that the GPU client's code path runs where no
 * GPU is. Device pointers lie in a reserved PROT_NONE range (the CPU cannot
 * dereference them, as real device pointers); each allocation's bytes live
 * in a host shadow buffer reached only through cuMemcpy*. Allocations are
 * 2 MiB aligned, as cudaMalloc's; each has a fresh buffer id; a freed
 * allocation answers no attribute (CUDA_ERROR_INVALID_VALUE). One device,
 * one primary context. Thread-safe (one lock). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MAX_ALLOCS 64
#define ALIGN (2u << 20)
#define SPACE (128u << 20)
#define INVALID_VALUE 1
#define OUT_OF_MEMORY 2

typedef unsigned long long devptr;
struct alloc {
	devptr base;
	size_t size;
	unsigned long long id;
	unsigned char *shadow;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct alloc allocs[MAX_ALLOCS];
static devptr space;
static unsigned long long next_id = 1;
static int primary;
static __thread void *current;

int cuInit(unsigned flags)
{
	(void)flags;
	pthread_mutex_lock(&lock);
	if (!space) {
		void *p = mmap(NULL, SPACE + ALIGN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (p != MAP_FAILED)
			space = ((devptr)(uintptr_t)p + ALIGN - 1) & ~(devptr)(ALIGN - 1);
	}
	pthread_mutex_unlock(&lock);
	return space ? 0 : OUT_OF_MEMORY;
}

int cuDeviceGetCount(int *n) { *n = 1; return 0; }
int cuDeviceGet(int *dev, int ordinal) { *dev = ordinal; return ordinal == 0 ? 0 : INVALID_VALUE; }
int cuDevicePrimaryCtxRetain(void **ctx, int dev) { (void)dev; *ctx = &primary; return 0; }
int cuCtxGetCurrent(void **ctx) { *ctx = current; return 0; }
int cuCtxSetCurrent(void *ctx) { current = ctx; return 0; }

int cuGetErrorName(int r, const char **name)
{
	*name = r == INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE" : r == OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_UNKNOWN";
	return 0;
}

/* The live allocation holding [p, p + len), under the lock. */
static struct alloc *find(devptr p, size_t len)
{
	for (int i = 0; i < MAX_ALLOCS; i++) {
		struct alloc *a = &allocs[i];
		if (a->shadow && p >= a->base && p - a->base <= a->size && len <= a->size - (p - a->base))
			return a;
	}
	return NULL;
}

int cuMemAlloc_v2(devptr *p, size_t size)
{
	if (!size || size > SPACE)
		return INVALID_VALUE;
	pthread_mutex_lock(&lock);
	int r = OUT_OF_MEMORY;
	for (int i = 0; i < MAX_ALLOCS && space; i++) {
		struct alloc *a = &allocs[i];
		if (a->shadow)
			continue;
		/* Slot i owns the i-th 2 MiB stripe of the space: allocations up to 2 MiB. */
		devptr base = space + (devptr)i * (SPACE / MAX_ALLOCS);
		if (size > SPACE / MAX_ALLOCS)
			break;
		a->shadow = calloc(1, size);
		if (!a->shadow)
			break;
		a->base = base;
		a->size = size;
		a->id = next_id++;
		*p = base;
		r = 0;
		break;
	}
	pthread_mutex_unlock(&lock);
	return r;
}

int cuMemFree_v2(devptr p)
{
	pthread_mutex_lock(&lock);
	struct alloc *a = find(p, 0);
	int r = INVALID_VALUE;
	if (a && a->base == p) {
		free(a->shadow);
		memset(a, 0, sizeof(*a));
		r = 0;
	}
	pthread_mutex_unlock(&lock);
	return r;
}

int cuMemcpyDtoH_v2(void *dst, devptr src, size_t len)
{
	pthread_mutex_lock(&lock);
	struct alloc *a = find(src, len);
	if (a)
		memcpy(dst, a->shadow + (src - a->base), len);
	pthread_mutex_unlock(&lock);
	return a ? 0 : INVALID_VALUE;
}

int cuMemcpyHtoD_v2(devptr dst, const void *src, size_t len)
{
	pthread_mutex_lock(&lock);
	struct alloc *a = find(dst, len);
	if (a)
		memcpy(a->shadow + (dst - a->base), src, len);
	pthread_mutex_unlock(&lock);
	return a ? 0 : INVALID_VALUE;
}

/* CU_POINTER_ATTRIBUTE_*: MEMORY_TYPE 2, SYNC_MEMOPS 6, BUFFER_ID 7,
 * IS_MANAGED 8, RANGE_START_ADDR 11, RANGE_SIZE 12. */
int cuPointerGetAttribute(void *out, int attr, devptr p)
{
	pthread_mutex_lock(&lock);
	struct alloc *a = find(p, 0);
	int r = a ? 0 : INVALID_VALUE;
	if (a) {
		switch (attr) {
		case 2: *(unsigned *)out = 2; break; /* CU_MEMORYTYPE_DEVICE */
		case 7: *(unsigned long long *)out = a->id; break;
		case 8: *(unsigned *)out = 0; break;
		case 11: *(devptr *)out = a->base; break;
		case 12: *(size_t *)out = a->size; break;
		default: r = INVALID_VALUE;
		}
	}
	pthread_mutex_unlock(&lock);
	return r;
}

int cuPointerSetAttribute(const void *value, int attr, devptr p)
{
	(void)value;
	pthread_mutex_lock(&lock);
	int r = find(p, 0) && attr == 6 ? 0 : INVALID_VALUE;
	pthread_mutex_unlock(&lock);
	return r;
}
