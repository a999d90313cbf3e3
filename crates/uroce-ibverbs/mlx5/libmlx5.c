/* The drop-in libmlx5.so.1 (rdma-core 44's symbol versions, libmlx5.map):
 * the mlx5 direct verbs uroce implements, forwarded to the drop-in
 * libibverbs.so.1's private exports (node UROCE_MLX5_PRIVATE, implemented in
 * src/mlx5dv/), so that both libraries share one uroce instance; every other
 * export fails cleanly (stubs.c). mlx5dv.h's inline mlx5dv_wr_* builders
 * call through the struct mlx5dv_qp_ex that mlx5dv_qp_ex_from_ibv_qp_ex
 * returns. Built by scripts/build-dropin.sh.
 * It needs no rdma-core header (the build machine may lack them): the
 * structs are opaque here but mlx5dv_context_attr, as in rdma-core 44. */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ibv_device;
struct ibv_context;
struct ibv_qp;
struct ibv_qp_ex;
struct ibv_qp_init_attr_ex;
struct mlx5dv_qp_init_attr;
struct mlx5dv_qp_ex;
struct mlx5dv_mkey;
struct mlx5dv_mkey_init_attr;
struct mlx5dv_context_attr {
	uint32_t flags; /* enum mlx5dv_context_attr_flags */
	uint64_t comp_mask;
};

struct ibv_context *ibv_open_device(struct ibv_device *device);

bool uroce_mlx5dv_is_supported(struct ibv_device *device);
struct ibv_qp *uroce_mlx5dv_create_qp(struct ibv_context *context, struct ibv_qp_init_attr_ex *qp_attr,
				      struct mlx5dv_qp_init_attr *mlx5_qp_attr);
struct mlx5dv_qp_ex *uroce_mlx5dv_qp_ex_from_ibv_qp_ex(struct ibv_qp_ex *qp);
struct mlx5dv_mkey *uroce_mlx5dv_create_mkey(struct mlx5dv_mkey_init_attr *mkey_init_attr);
int uroce_mlx5dv_destroy_mkey(struct mlx5dv_mkey *mkey);

bool mlx5dv_is_supported(struct ibv_device *device)
{
	return uroce_mlx5dv_is_supported(device);
}

struct ibv_qp *mlx5dv_create_qp(struct ibv_context *context, struct ibv_qp_init_attr_ex *qp_attr,
				struct mlx5dv_qp_init_attr *mlx5_qp_attr)
{
	return uroce_mlx5dv_create_qp(context, qp_attr, mlx5_qp_attr);
}

struct mlx5dv_qp_ex *mlx5dv_qp_ex_from_ibv_qp_ex(struct ibv_qp_ex *qp)
{
	return uroce_mlx5dv_qp_ex_from_ibv_qp_ex(qp);
}

struct mlx5dv_mkey *mlx5dv_create_mkey(struct mlx5dv_mkey_init_attr *mkey_init_attr)
{
	return uroce_mlx5dv_create_mkey(mkey_init_attr);
}

int mlx5dv_destroy_mkey(struct mlx5dv_mkey *mkey)
{
	return uroce_mlx5dv_destroy_mkey(mkey);
}

/* Plain contexts only: DEVX (MLX5DV_CONTEXT_FLAGS_DEVX) needs mlx5 firmware. */
struct ibv_context *mlx5dv_open_device(struct ibv_device *device, struct mlx5dv_context_attr *attr)
{
	if (attr && (attr->flags || attr->comp_mask)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	return ibv_open_device(device);
}
