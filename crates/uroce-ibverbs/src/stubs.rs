//! Symbols that consumers must resolve at load time (they are linked with
//! immediate binding) but that have no meaning on uroce: the
//! IBVERBS_PRIVATE_34 provider interface that libmlx5 and libefa import,
//! multicast, ECE, and kernel-ABI copies. Provider code is never entered for
//! a uroce device (callers gate it on vendor_id); each stub fails cleanly
//! with EOPNOTSUPP (or does nothing, for functions returning void).

use crate::errno::{null, set_errno};
use std::ffi::c_int;

macro_rules! fail_int {
    ($($name:ident),* $(,)?) => {$(
        /// Not supported on uroce: EOPNOTSUPP (errno set as well).
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            set_errno(libc::EOPNOTSUPP);
            libc::EOPNOTSUPP
        }
    )*};
}

macro_rules! fail_ptr {
    ($($name:ident),* $(,)?) => {$(
        /// Not supported on uroce: NULL with errno EOPNOTSUPP.
        #[no_mangle]
        pub extern "C" fn $name() -> *mut libc::c_void {
            null(libc::EOPNOTSUPP)
        }
    )*};
}

macro_rules! nothing {
    ($($name:ident),* $(,)?) => {$(
        /// Nothing to do on uroce.
        #[no_mangle]
        pub extern "C" fn $name() {}
    )*};
}

fail_int! {
    execute_ioctl, ibv_cmd_advise_mr, ibv_cmd_alloc_dm, ibv_cmd_alloc_mw, ibv_cmd_alloc_pd, ibv_cmd_attach_mcast,
    ibv_cmd_close_xrcd, ibv_cmd_create_ah, ibv_cmd_create_counters, ibv_cmd_create_cq_ex, ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp, ibv_cmd_create_qp_ex2, ibv_cmd_create_qp_ex, ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_srq, ibv_cmd_create_srq_ex, ibv_cmd_create_wq, ibv_cmd_dealloc_mw, ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr, ibv_cmd_destroy_ah, ibv_cmd_destroy_counters, ibv_cmd_destroy_cq, ibv_cmd_destroy_flow,
    ibv_cmd_destroy_flow_action, ibv_cmd_destroy_qp, ibv_cmd_destroy_rwq_ind_table, ibv_cmd_destroy_srq,
    ibv_cmd_destroy_wq, ibv_cmd_detach_mcast, ibv_cmd_free_dm, ibv_cmd_get_context, ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp, ibv_cmd_modify_qp, ibv_cmd_modify_qp_ex, ibv_cmd_modify_srq, ibv_cmd_modify_wq,
    ibv_cmd_open_qp, ibv_cmd_open_xrcd, ibv_cmd_query_context, ibv_cmd_query_device_any, ibv_cmd_query_mr,
    ibv_cmd_query_port, ibv_cmd_query_qp, ibv_cmd_query_srq, ibv_cmd_read_counters, ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr, ibv_cmd_reg_mr, ibv_cmd_rereg_mr, ibv_cmd_resize_cq,
    ibv_cmd_create_cq, ibv_cmd_create_qp, ibv_cmd_poll_cq, ibv_cmd_post_recv, ibv_cmd_post_send,
    ibv_cmd_post_srq_recv, ibv_cmd_req_notify_cq, ibv_read_ibdev_sysfs_file, __ioctl_final_num_attrs,
    ibv_attach_mcast, ibv_detach_mcast, ibv_query_ece, ibv_set_ece, ibv_resolve_eth_l2_from_gid,
}

fail_ptr! {
    _verbs_init_and_alloc_context, verbs_open_device,
}

nothing! {
    __verbs_log, verbs_set_ops, verbs_uninit_context, verbs_init_cq, ibv_copy_ah_attr_from_kern,
    ibv_copy_path_rec_from_kern, ibv_copy_path_rec_to_kern, ibv_copy_qp_attr_from_kern,
}

/// `bool verbs_allow_disassociate_destroy(int cmd, int ret)`: never.
#[no_mangle]
pub extern "C" fn verbs_allow_disassociate_destroy(_cmd: c_int, _ret: c_int) -> bool {
    false
}
