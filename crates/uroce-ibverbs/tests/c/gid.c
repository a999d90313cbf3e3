/* The GID table through the drop-in C ABI, as on a kernel RoCE device (rxe,
 * rdma-core 44): the table (gid_tbl_len) is longer than its populated
 * entries. Index 0 holds the device's RoCE v2 GID. An empty entry reads as
 * the zero GID with ibv_query_gid (success) and as IB/RoCE v1 with
 * ibv_query_gid_type, is ENODATA for ibv_query_gid_ex and is skipped by
 * ibv_query_gid_table; an index beyond the table is EINVAL everywhere. A
 * populated entry names the interface that owns its address (ndev_ifindex:
 * lo for the 127.0.0.x device), as rxe's entries name its netdev.
 * Exits non-zero with a message on the first failed check; prints "all ok"
 * at the end. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <net/if.h>
#include <infiniband/verbs.h>

/* libibverbs' IBVERBS_PRIVATE_34 export (infiniband/driver.h, not installed):
 * IBV_GID_TYPE_SYSFS_IB_ROCE_V1 = 0, IBV_GID_TYPE_SYSFS_ROCE_V2 = 1. */
int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index, unsigned int *type);

#include "check.h"

#define RC(call, want)                                                                       \
	do {                                                                                 \
		int r_ = (call);                                                             \
		CHECK(r_ == (want), "%s: got %d (%s), want %d", #call, r_, strerror(r_ < 0 ? -r_ : r_), (want)); \
	} while (0)

/* A call that returns -1 and sets errno. */
#define MINUS1_ERRNO(call, want)                                                                  \
	do {                                                                                      \
		errno = 0;                                                                        \
		int r_ = (call);                                                                  \
		CHECK(r_ == -1 && errno == (want), "%s: got %d errno %d (%s), want -1 errno %d", #call, r_, \
		      errno, strerror(errno), (want));                                            \
	} while (0)

static const union ibv_gid zero;

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0, "no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device: %s", strerror(errno));
	ibv_free_device_list(list);

	struct ibv_port_attr pa;
	RC(ibv_query_port(ctx, 1, &pa), 0);
	int len = pa.gid_tbl_len;
	CHECK(len > 1, "gid_tbl_len %d: no room for an empty entry", len);

	/* Index 0: the device's RoCE v2 GID (its address, IPv4-mapped). */
	union ibv_gid gid0;
	RC(ibv_query_gid(ctx, 1, 0, &gid0), 0);
	CHECK(memcmp(&gid0, &zero, sizeof(zero)) != 0, "GID 0 is empty");
	CHECK(gid0.raw[10] == 0xff && gid0.raw[11] == 0xff && gid0.raw[12] == 127, "GID 0 is not ::ffff:127.x.y.z");
	struct ibv_gid_entry e;
	memset(&e, 0x5a, sizeof(e));
	RC(ibv_query_gid_ex(ctx, 1, 0, &e, 0), 0);
	CHECK(memcmp(&e.gid, &gid0, sizeof(gid0)) == 0 && e.gid_index == 0 && e.port_num == 1 &&
		      e.gid_type == IBV_GID_TYPE_ROCE_V2 && e.ndev_ifindex == if_nametoindex("lo"),
	      "gid_ex 0: index %u port %u type %u ifindex %u", e.gid_index, e.port_num, e.gid_type, e.ndev_ifindex);
	unsigned int type = 77;
	RC(ibv_query_gid_type(ctx, 1, 0, &type), 0);
	CHECK(type == 1, "gid type of index 0: %u", type);

	/* The empty entries. */
	for (int i = 1; i < len; i++) {
		union ibv_gid g;
		memset(&g, 0xee, sizeof(g));
		RC(ibv_query_gid(ctx, 1, i, &g), 0);
		CHECK(memcmp(&g, &zero, sizeof(zero)) == 0, "empty entry %d reads non-zero", i);
		RC(ibv_query_gid_ex(ctx, 1, i, &e, 0), ENODATA);
		type = 77;
		RC(ibv_query_gid_type(ctx, 1, i, &type), 0);
		CHECK(type == 0, "gid type of empty entry %d: %u", i, type);
	}

	/* Beyond the table, a bad port, flags: EINVAL. */
	union ibv_gid g;
	MINUS1_ERRNO(ibv_query_gid(ctx, 1, len, &g), EINVAL);
	MINUS1_ERRNO(ibv_query_gid(ctx, 1, -1, &g), EINVAL);
	MINUS1_ERRNO(ibv_query_gid(ctx, 2, 0, &g), EINVAL);
	RC(ibv_query_gid_ex(ctx, 1, len, &e, 0), EINVAL);
	RC(ibv_query_gid_ex(ctx, 2, 0, &e, 0), EINVAL);
	RC(ibv_query_gid_ex(ctx, 1, 0, &e, 1), EINVAL);
	MINUS1_ERRNO(ibv_query_gid_type(ctx, 1, len, &type), EINVAL);

	/* The table: populated entries only; too small a buffer is -EINVAL. */
	struct ibv_gid_entry *t = calloc(len, sizeof(*t));
	CHECK(t, "calloc");
	RC((int)ibv_query_gid_table(ctx, t, len, 0), 1);
	CHECK(memcmp(&t[0].gid, &gid0, sizeof(gid0)) == 0 && t[0].gid_index == 0 && t[0].port_num == 1 &&
		      t[0].gid_type == IBV_GID_TYPE_ROCE_V2 && t[0].ndev_ifindex == e.ndev_ifindex,
	      "table entry 0");
	RC((int)ibv_query_gid_table(ctx, t, 1, 0), 1);
	RC((int)ibv_query_gid_table(ctx, t, 0, 0), -EINVAL);
	RC((int)ibv_query_gid_table(ctx, t, len, 1), -EINVAL);
	/* Larger entries (a newer header): each zero-filled past ours. */
	size_t big = sizeof(struct ibv_gid_entry) + 16;
	unsigned char *raw = malloc(2 * big);
	CHECK(raw, "malloc");
	memset(raw, 0x77, 2 * big);
	RC((int)_ibv_query_gid_table(ctx, (struct ibv_gid_entry *)raw, 2, 0, big), 1);
	CHECK(memcmp(raw, &t[0], sizeof(t[0])) == 0, "wide entry 0");
	for (size_t i = sizeof(t[0]); i < big; i++)
		CHECK(raw[i] == 0, "wide entry 0 not zero-filled at byte %zu", i);
	CHECK(raw[big] == 0x77, "wrote past the populated entries");
	free(raw);
	free(t);

	RC(ibv_close_device(ctx), 0);
	printf("all ok\n");
	return 0;
}
