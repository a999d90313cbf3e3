/* The libmlx5 exports uroce does not implement (rdma-core 44's list less
 * the ones of libmlx5.c): each fails cleanly, as mlx5 does where the device
 * lacks the feature: EOPNOTSUPP returned (int) and in errno, or NULL (or -1)
 * with errno EOPNOTSUPP. mlx5dv_init_obj fails too (uroce has no mlx5 queues
 * to expose). Generated from /usr/include/infiniband/mlx5dv.h's return types
 * and objdump -T of Debian 12's libmlx5.so.1 (uroce does not include mlx5dv.h
 * here: the stubs take no arguments, which the x86-64 and aarch64 C ABIs
 * allow for a caller passing some). */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

int mlx5dv_query_device(void);
int mlx5dv_query_device(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_create_cq(void);
void * mlx5dv_create_cq(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

int uroce_mlx5dv_init_obj_1_2(void);
int uroce_mlx5dv_init_obj_1_2(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_set_context_attr(void);
int mlx5dv_set_context_attr(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_create_wq(void);
void * mlx5dv_create_wq(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

int mlx5dv_get_clock_info(void);
int mlx5dv_get_clock_info(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_create_flow_action_esp(void);
void * mlx5dv_create_flow_action_esp(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void * mlx5dv_create_flow(void);
void * mlx5dv_create_flow(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void * mlx5dv_create_flow_matcher(void);
void * mlx5dv_create_flow_matcher(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

int mlx5dv_destroy_flow_matcher(void);
int mlx5dv_destroy_flow_matcher(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_create_flow_action_modify_header(void);
void * mlx5dv_create_flow_action_modify_header(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void * mlx5dv_create_flow_action_packet_reformat(void);
void * mlx5dv_create_flow_action_packet_reformat(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void * mlx5dv_devx_alloc_uar(void);
void * mlx5dv_devx_alloc_uar(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void mlx5dv_devx_free_uar(void);
void mlx5dv_devx_free_uar(void)
{
	errno = EOPNOTSUPP;
}

int mlx5dv_devx_general_cmd(void);
int mlx5dv_devx_general_cmd(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_devx_obj_create(void);
void * mlx5dv_devx_obj_create(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

int mlx5dv_devx_obj_destroy(void);
int mlx5dv_devx_obj_destroy(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_devx_obj_modify(void);
int mlx5dv_devx_obj_modify(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_devx_obj_query(void);
int mlx5dv_devx_obj_query(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_devx_query_eqn(void);
int mlx5dv_devx_query_eqn(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_devx_umem_dereg(void);
int mlx5dv_devx_umem_dereg(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_devx_umem_reg(void);
void * mlx5dv_devx_umem_reg(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

int mlx5dv_devx_cq_modify(void);
int mlx5dv_devx_cq_modify(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_devx_cq_query(void);
int mlx5dv_devx_cq_query(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_devx_ind_tbl_modify(void);
int mlx5dv_devx_ind_tbl_modify(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_devx_ind_tbl_query(void);
int mlx5dv_devx_ind_tbl_query(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_devx_qp_modify(void);
int mlx5dv_devx_qp_modify(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_devx_qp_query(void);
int mlx5dv_devx_qp_query(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_devx_srq_modify(void);
int mlx5dv_devx_srq_modify(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_devx_srq_query(void);
int mlx5dv_devx_srq_query(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_devx_wq_modify(void);
int mlx5dv_devx_wq_modify(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_devx_wq_query(void);
int mlx5dv_devx_wq_query(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_devx_create_cmd_comp(void);
void * mlx5dv_devx_create_cmd_comp(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void mlx5dv_devx_destroy_cmd_comp(void);
void mlx5dv_devx_destroy_cmd_comp(void)
{
	errno = EOPNOTSUPP;
}

int mlx5dv_devx_get_async_cmd_comp(void);
int mlx5dv_devx_get_async_cmd_comp(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_devx_obj_query_async(void);
int mlx5dv_devx_obj_query_async(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_alloc_dm(void);
void * mlx5dv_alloc_dm(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void * mlx5dv_dr_action_create_dest_ibv_qp(void);
void * mlx5dv_dr_action_create_dest_ibv_qp(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void * mlx5dv_dr_action_create_dest_table(void);
void * mlx5dv_dr_action_create_dest_table(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void * mlx5dv_dr_action_create_dest_vport(void);
void * mlx5dv_dr_action_create_dest_vport(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void * mlx5dv_dr_action_create_drop(void);
void * mlx5dv_dr_action_create_drop(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void * mlx5dv_dr_action_create_flow_counter(void);
void * mlx5dv_dr_action_create_flow_counter(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void * mlx5dv_dr_action_create_modify_header(void);
void * mlx5dv_dr_action_create_modify_header(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void * mlx5dv_dr_action_create_packet_reformat(void);
void * mlx5dv_dr_action_create_packet_reformat(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void * mlx5dv_dr_action_create_tag(void);
void * mlx5dv_dr_action_create_tag(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

int mlx5dv_dr_action_destroy(void);
int mlx5dv_dr_action_destroy(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_dr_domain_create(void);
void * mlx5dv_dr_domain_create(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

int mlx5dv_dr_domain_destroy(void);
int mlx5dv_dr_domain_destroy(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_dr_domain_sync(void);
int mlx5dv_dr_domain_sync(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_dr_matcher_create(void);
void * mlx5dv_dr_matcher_create(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

int mlx5dv_dr_matcher_destroy(void);
int mlx5dv_dr_matcher_destroy(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_dr_rule_create(void);
void * mlx5dv_dr_rule_create(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

int mlx5dv_dr_rule_destroy(void);
int mlx5dv_dr_rule_destroy(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_dr_table_create(void);
void * mlx5dv_dr_table_create(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

int mlx5dv_dr_table_destroy(void);
int mlx5dv_dr_table_destroy(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_devx_create_event_channel(void);
void * mlx5dv_devx_create_event_channel(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void mlx5dv_devx_destroy_event_channel(void);
void mlx5dv_devx_destroy_event_channel(void)
{
	errno = EOPNOTSUPP;
}

ssize_t mlx5dv_devx_get_event(void);
ssize_t mlx5dv_devx_get_event(void)
{
	errno = EOPNOTSUPP;
	return -1;
}

int mlx5dv_devx_subscribe_devx_event(void);
int mlx5dv_devx_subscribe_devx_event(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_devx_subscribe_devx_event_fd(void);
int mlx5dv_devx_subscribe_devx_event_fd(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_alloc_var(void);
void * mlx5dv_alloc_var(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void * mlx5dv_dr_action_create_flow_meter(void);
void * mlx5dv_dr_action_create_flow_meter(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

int mlx5dv_dr_action_modify_flow_meter(void);
int mlx5dv_dr_action_modify_flow_meter(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_dump_dr_domain(void);
int mlx5dv_dump_dr_domain(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_dump_dr_matcher(void);
int mlx5dv_dump_dr_matcher(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_dump_dr_rule(void);
int mlx5dv_dump_dr_rule(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_dump_dr_table(void);
int mlx5dv_dump_dr_table(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void mlx5dv_free_var(void);
void mlx5dv_free_var(void)
{
	errno = EOPNOTSUPP;
}

void * mlx5dv_pp_alloc(void);
void * mlx5dv_pp_alloc(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void mlx5dv_pp_free(void);
void mlx5dv_pp_free(void)
{
	errno = EOPNOTSUPP;
}

void * mlx5dv_dr_action_create_default_miss(void);
void * mlx5dv_dr_action_create_default_miss(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void mlx5dv_dr_domain_set_reclaim_device_memory(void);
void mlx5dv_dr_domain_set_reclaim_device_memory(void)
{
	errno = EOPNOTSUPP;
}

int mlx5dv_modify_qp_lag_port(void);
int mlx5dv_modify_qp_lag_port(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_query_qp_lag_port(void);
int mlx5dv_query_qp_lag_port(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_dr_action_create_dest_devx_tir(void);
void * mlx5dv_dr_action_create_dest_devx_tir(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void * mlx5dv_dr_action_create_dest_array(void);
void * mlx5dv_dr_action_create_dest_array(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void * mlx5dv_dr_action_create_flow_sampler(void);
void * mlx5dv_dr_action_create_flow_sampler(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void * mlx5dv_dr_action_create_aso(void);
void * mlx5dv_dr_action_create_aso(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void * mlx5dv_dr_action_create_pop_vlan(void);
void * mlx5dv_dr_action_create_pop_vlan(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void * mlx5dv_dr_action_create_push_vlan(void);
void * mlx5dv_dr_action_create_push_vlan(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

int mlx5dv_dr_action_modify_aso(void);
int mlx5dv_dr_action_modify_aso(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_modify_qp_sched_elem(void);
int mlx5dv_modify_qp_sched_elem(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_modify_qp_udp_sport(void);
int mlx5dv_modify_qp_udp_sport(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_sched_leaf_create(void);
void * mlx5dv_sched_leaf_create(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

int mlx5dv_sched_leaf_destroy(void);
int mlx5dv_sched_leaf_destroy(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_sched_leaf_modify(void);
int mlx5dv_sched_leaf_modify(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_sched_node_create(void);
void * mlx5dv_sched_node_create(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

int mlx5dv_sched_node_destroy(void);
int mlx5dv_sched_node_destroy(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_sched_node_modify(void);
int mlx5dv_sched_node_modify(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_reserved_qpn_alloc(void);
int mlx5dv_reserved_qpn_alloc(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_reserved_qpn_dealloc(void);
int mlx5dv_reserved_qpn_dealloc(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int _mlx5dv_query_port(void);
int _mlx5dv_query_port(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_devx_umem_reg_ex(void);
void * mlx5dv_devx_umem_reg_ex(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void * mlx5dv_dm_map_op_addr(void);
void * mlx5dv_dm_map_op_addr(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

int _mlx5dv_mkey_check(void);
int _mlx5dv_mkey_check(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void mlx5dv_dr_domain_allow_duplicate_rules(void);
void mlx5dv_dr_domain_allow_duplicate_rules(void)
{
	errno = EOPNOTSUPP;
}

int mlx5dv_map_ah_to_qp(void);
int mlx5dv_map_ah_to_qp(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_qp_cancel_posted_send_wrs(void);
int mlx5dv_qp_cancel_posted_send_wrs(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_crypto_login(void);
int mlx5dv_crypto_login(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_crypto_login_query_state(void);
int mlx5dv_crypto_login_query_state(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_crypto_logout(void);
int mlx5dv_crypto_logout(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_dci_stream_id_reset(void);
int mlx5dv_dci_stream_id_reset(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_dek_create(void);
void * mlx5dv_dek_create(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

int mlx5dv_dek_destroy(void);
int mlx5dv_dek_destroy(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_dek_query(void);
int mlx5dv_dek_query(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_dr_action_create_dest_ib_port(void);
void * mlx5dv_dr_action_create_dest_ib_port(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

int mlx5dv_dr_matcher_set_layout(void);
int mlx5dv_dr_matcher_set_layout(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_get_vfio_device_list(void);
void * mlx5dv_get_vfio_device_list(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

int mlx5dv_vfio_get_events_fd(void);
int mlx5dv_vfio_get_events_fd(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_vfio_process_events(void);
int mlx5dv_vfio_process_events(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_dr_aso_other_domain_link(void);
int mlx5dv_dr_aso_other_domain_link(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_dr_aso_other_domain_unlink(void);
int mlx5dv_dr_aso_other_domain_unlink(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_devx_alloc_msi_vector(void);
void * mlx5dv_devx_alloc_msi_vector(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void * mlx5dv_devx_create_eq(void);
void * mlx5dv_devx_create_eq(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

int mlx5dv_devx_destroy_eq(void);
int mlx5dv_devx_destroy_eq(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_devx_free_msi_vector(void);
int mlx5dv_devx_free_msi_vector(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_create_steering_anchor(void);
void * mlx5dv_create_steering_anchor(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

void * mlx5dv_crypto_login_create(void);
void * mlx5dv_crypto_login_create(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

int mlx5dv_crypto_login_destroy(void);
int mlx5dv_crypto_login_destroy(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_crypto_login_query(void);
int mlx5dv_crypto_login_query(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

int mlx5dv_destroy_steering_anchor(void);
int mlx5dv_destroy_steering_anchor(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void * mlx5dv_dr_action_create_dest_root_table(void);
void * mlx5dv_dr_action_create_dest_root_table(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

/* rdma-core's mlx5dv_init_obj: compat @MLX5_1.0 and default @@MLX5_1.2 (above). */
int uroce_mlx5dv_init_obj_1_0(void);
int uroce_mlx5dv_init_obj_1_0(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}
__asm__(".symver uroce_mlx5dv_init_obj_1_0, mlx5dv_init_obj@MLX5_1.0");
__asm__(".symver uroce_mlx5dv_init_obj_1_2, mlx5dv_init_obj@@MLX5_1.2");
