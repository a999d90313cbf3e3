/* The C clients' one RDMA operation: posts a signaled WRITE or READ of
 * `len` bytes at `local` (key `lkey`) to `raddr`/`rkey` on `qp` and waits
 * for its completion on `cq` (wait.h); returns the completion status. */
#ifndef UROCE_TEST_RDMA_OP_H
#define UROCE_TEST_RDMA_OP_H
#include <stdint.h>
#include <infiniband/verbs.h>
#include "check.h"
#include "wait.h"

static inline int rdma_op(struct ibv_qp *qp, struct ibv_cq *cq, enum ibv_wr_opcode op, void *local, uint32_t len,
			  uint32_t lkey, uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	CHECK(ibv_post_send(qp, &wr, &bad) == 0, "post_send");
	return wait_wc(cq).status;
}

#endif
