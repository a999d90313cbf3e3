/* uroce.h: extensions of the uroce drop-in libibverbs.so.1.
 *
 * Indirect keys (mkeys) present one zero-based address space made of
 * pieces of other registered memory: a list of SGEs, or an interleaved
 * (strided) block repeated `repeat_count` times, as mlx5dv_wr_mr_list /
 * mlx5dv_wr_mr_interleaved. Entries may name other mkeys (nesting, 4 levels).
 * A new mkey is free (invalid). Two ways to give it a layout:
 *   - uroce_mkey_set_*: verbs-style re-registration, immediate, replaces any
 *     layout;
 *   - uroce_post_umr_*: a UMR work request on an RC QP, ordered with the QP's
 *     other work requests, completing with opcode IBV_WC_DRIVER1 (mlx5's
 *     MLX5DV_WC_UMR); it needs a free key: invalidate a valid one first with
 *     IBV_WR_LOCAL_INV (else IBV_WC_MW_BIND_ERR).
 * Access is a subset of LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ |
 * REMOTE_ATOMIC (else EINVAL); each access through the key also needs the
 * right in every region it reaches. Through a UMR, bytes_count and
 * bytes_skip must fit in 16 bits (the mlx5 WQE's fields; EINVAL); the
 * immediate uroce_mkey_set_interleaved takes any 32-bit value. More entries
 * than max_entries (rounded up to 4; an interleaved layout needs one extra)
 * is ENOMEM.
 *
 * Link with the drop-in library: -L<dir> -libverbs (symbols of UROCE_1.0).
 */
#ifndef UROCE_H
#define UROCE_H

#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>
/* Seed 003's ibv_rereg_mr_interleaved and ibv_rereg_mr_sg, which the
 * drop-in's infiniband/verbs.h (beside this file) also declares, where the
 * seed puts them. */
#include "infiniband/uroce_noncontig.h"

#ifdef __cplusplus
extern "C" {
#endif

struct uroce_mkey {
	uint32_t lkey;
	uint32_t rkey;
	uint32_t max_entries;
	/* opaque state follows */
};

/* = struct mlx5dv_mr_interleaved */
struct uroce_mr_interleaved {
	uint64_t addr;
	uint32_t bytes_count;
	uint32_t bytes_skip;
	uint32_t lkey;
};

/* ODP counters with mlx5's names and meanings. */
struct uroce_odp_stats {
	uint64_t page_faults;
	uint64_t page_faults_handled;
	uint64_t page_invalidations;
	uint64_t page_invalidations_handled;
	uint64_t page_prefetch;
};

/* NULL + errno (EINVAL: max_entries 0 or > 4096). */
struct uroce_mkey *uroce_create_mkey(struct ibv_pd *pd, uint16_t max_entries);
int uroce_destroy_mkey(struct uroce_mkey *mkey);

/* 0 or an errno value. */
int uroce_mkey_set_list(struct uroce_mkey *mkey, uint32_t access_flags, uint16_t num_sges,
			const struct ibv_sge *sge);
int uroce_mkey_set_interleaved(struct uroce_mkey *mkey, uint32_t access_flags, uint32_t repeat_count,
			       uint16_t num_interleaved, const struct uroce_mr_interleaved *data);
int uroce_mkey_clear(struct uroce_mkey *mkey);

/* UMR through the send queue: 0 or an errno value (as ibv_post_send). */
int uroce_post_umr_list(struct ibv_qp *qp, uint64_t wr_id, unsigned int send_flags, struct uroce_mkey *mkey,
			uint32_t access_flags, uint16_t num_sges, const struct ibv_sge *sge);
int uroce_post_umr_interleaved(struct ibv_qp *qp, uint64_t wr_id, unsigned int send_flags,
			       struct uroce_mkey *mkey, uint32_t access_flags, uint32_t repeat_count,
			       uint16_t num_interleaved, const struct uroce_mr_interleaved *data);

/* ODP statistics of one MR (EOPNOTSUPP unless IBV_ACCESS_ON_DEMAND) or of the device. */
int uroce_mr_odp_stats(struct ibv_mr *mr, struct uroce_odp_stats *stats);
int uroce_device_odp_stats(struct ibv_context *context, struct uroce_odp_stats *stats);

/* PeerDirect device memory (MLNX OFED peer-memory clients, seed 000).
 *
 * uroce_peer_alloc() allocates `length` bytes of the device memory of the
 * loaded peer-memory client named `client` -- a storage device declared in
 * the configuration file (uroce.toml):
 *
 *     [peers]
 *     load = ["storage"]
 *     [[peers.storage]]
 *     name = "ssd0"
 *     path = "/var/tmp/ssd0.img"
 *     capacity = 1048576
 *
 * and returns its device address. The CPU cannot dereference it (like a GPU
 * pointer); a plain ibv_reg_mr(pd, addr, length, access) registers it
 * through that client, transparently, and RDMA into and out of the region
 * reaches the device (the file). The host reads and writes device memory
 * with uroce_peer_memcpy_to/from (as cudaMemcpy). uroce_peer_free()
 * invalidates regions still registered over the allocation: their accesses
 * then fail (IBV_WC_REM_ACCESS_ERR at the requester), and ibv_dereg_mr
 * still succeeds. Counters: `uroce peers`.
 *
 * uroce_peer_alloc: the address, or NULL with errno EINVAL (client NULL or
 * longer than 63 bytes, length 0), ENOENT (no such client loaded),
 * EOPNOTSUPP (the client does not allocate, e.g. nv_mem: use cudaMalloc),
 * ENOMEM (the device is full).
 * The others: 0, or an errno value (also in errno): EINVAL (not an
 * allocation's start; NULL host buffer), EFAULT (range outside every
 * allocation of uroce_peer_alloc), EIO (the device failed).
 */
void *uroce_peer_alloc(const char *client, size_t length);
int uroce_peer_free(void *addr);
int uroce_peer_memcpy_to(void *dst_device, const void *src_host, size_t length);
int uroce_peer_memcpy_from(void *dst_host, const void *src_device, size_t length);

#ifdef __cplusplus
}
#endif

#endif /* UROCE_H */
