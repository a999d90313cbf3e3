/* Seed 003's declarations (libibverbs/verbs.h in the seed), included by the
 * drop-in's infiniband/verbs.h and by uroce.h, after the system's verbs.h.
 * Link with the drop-in library: -L<dir> -libverbs (symbols of UROCE_1.1). */
#ifndef UROCE_VERBS_NONCONTIG
#define UROCE_VERBS_NONCONTIG

#include <stdint.h>

struct ibv_mr;
struct ibv_sge;

#ifdef __cplusplus
extern "C" {
#endif

/* Seed 003, "verbs: Introduce non-contiguous memory registration"
 * (man ibv_rereg_mr_interleaved(3), ibv_rereg_mr_sg(3); symbols UROCE_1.1).
 * Both give an existing MR (from ibv_reg_mr, ibv_reg_dmabuf_mr or an earlier
 * call of these) a non-contiguous layout over other MRs of its PD, replacing
 * its translation: afterwards mr->addr is NULL (the MR is zero based),
 * mr->length is the layout's length and mr->lkey/rkey are new keys, usable
 * in SEND/RECV SGEs and as the rkey of RDMA WRITE/READ and atomics at
 * offsets 0..mr->length. Access is a subset of LOCAL_WRITE | REMOTE_WRITE |
 * REMOTE_READ | REMOTE_ATOMIC; each access also needs the right in every MR
 * it reaches. Returns 0, or an errno value (also set in errno): EINVAL (bad
 * arguments or layout, an entry naming the MR itself), ENOMEM (more than
 * 4096 SGEs; 4096 interleaved entries or more, as the interleaved layout
 * takes one slot more), EBUSY (memory windows bound), EOPNOTSUPP (peer or
 * device memory). Nothing changes on error. */
struct ibv_mr_interleaved {
	uint64_t addr;        /* first cell of this entry, in the MR of lkey */
	uint64_t bytes_count; /* bytes taken per repetition (the cell size) */
	uint64_t stride;      /* bytes from one repetition's cell to the next,
			       * >= bytes_count, any value below 4 GiB + bytes_count */
	uint32_t lkey;
};

/* Repeats the block of `num_entries` entries `repeat_count` times: byte o of
 * the MR is, with B = sum of bytes_count, r = o / B and q = o % B, byte
 * q - prefix(i) of repetition r of the entry i that holds q, at
 * entries[i].addr + r * entries[i].stride + (q - prefix(i)). A matrix column
 * (N rows of M cells of size c, row-major, at base): one entry
 * { base + col * c, c, M * c, lkey } repeated N times. */
int ibv_rereg_mr_interleaved(struct ibv_mr *mr, int access, uint32_t repeat_count, unsigned int num_entries,
			     const struct ibv_mr_interleaved *entries);

/* Concatenates the SGEs (a "composite region" over several MRs). */
int ibv_rereg_mr_sg(struct ibv_mr *mr, int access, unsigned int num_sge, const struct ibv_sge *sg_list);

#ifdef __cplusplus
}
#endif

#endif /* UROCE_VERBS_NONCONTIG */
