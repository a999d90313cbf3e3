//! Devices and contexts: the device list, `ibv_open_device` (a
//! `verbs_context` with the ops table), and the query functions.

use crate::errno::{fail, null, set_errno};
use crate::ffi::*;
use crate::handles::{Share, UContext, UDevice};
use std::collections::HashMap;
use std::ffi::{c_char, c_int};
use std::sync::{Mutex, OnceLock};
use uroce::ib::{Errno, Gid};
use uroce::verbs::{Context, DeviceConfig};

fn copy_name(dst: &mut [c_char], s: &str) {
    let n = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
}

/// The devices of this process: those of the configuration file, the
/// default one first, with the environment's overrides (`UROCE_*`); or the
/// one default device. An invalid configuration gives no device (and a
/// message on stderr): uroce does not guess.
fn devices() -> &'static [usize] {
    static DEVS: OnceLock<Vec<usize>> = OnceLock::new();
    DEVS.get_or_init(|| {
        // Logs go to stderr only when asked for: the host program owns its output.
        if let Ok(f) = tracing_subscriber::EnvFilter::try_from_env("UROCE_LOG") {
            let _ = tracing_subscriber::fmt().with_env_filter(f).with_writer(std::io::stderr).try_init();
        }
        device_list()
    })
}

fn device_list() -> Vec<usize> {
    match DeviceConfig::list_from_env() {
        Ok(list) => list
            .into_iter()
            .map(|cfg| {
                // SAFETY: ibv_device is plain old data; all-zero is valid.
                let mut dev: ibv_device = unsafe { std::mem::zeroed() };
                dev.node_type = ibv_node_type_IBV_NODE_CA as _;
                dev.transport_type = ibv_transport_type_IBV_TRANSPORT_IB as _;
                copy_name(&mut dev.name, &cfg.name);
                // The device's node is /dev/null (uroce has no kernel part
                // and never opens it). Programs find it as rdma-core does,
                // as "/dev/infiniband/" + dev_name: UCX uses a device only
                // when that is a character device it may read and write,
                // which "../null" is wherever /dev/infiniband exists
                // (scripts/setup-ucx.sh makes it where it does not).
                copy_name(&mut dev.dev_name, "../null");
                copy_name(&mut dev.dev_path, "/dev/null");
                copy_name(&mut dev.ibdev_path, &format!("/nonexistent/uroce/{}", cfg.name));
                Box::into_raw(Box::new(UDevice { dev, cfg })) as usize
            })
            .collect(),
        Err(e) => {
            eprintln!("uroce: no device: {e}");
            Vec::new()
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    let devs = devices();
    // SAFETY: malloc of n+1 pointers; freed by ibv_free_device_list.
    let list = unsafe { libc::calloc(devs.len() + 1, std::mem::size_of::<usize>()) } as *mut *mut ibv_device;
    if list.is_null() {
        return null(libc::ENOMEM);
    }
    for (i, &d) in devs.iter().enumerate() {
        // SAFETY: i < len; `d` points to a leaked UDevice whose first field is the ibv_device.
        unsafe { *list.add(i) = d as *mut ibv_device };
    }
    if !num.is_null() {
        // SAFETY: the caller passes a valid int pointer or NULL.
        unsafe { *num = devs.len() as c_int };
    }
    list
}

#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: `list` came from ibv_get_device_list (calloc) or is NULL.
    unsafe { libc::free(list as *mut libc::c_void) };
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    if dev.is_null() {
        return null(libc::EINVAL);
    }
    // SAFETY: a device from our list.
    unsafe { (*dev).name.as_ptr() }
}

fn guid_of(cfg: &DeviceConfig) -> u64 {
    // Stable per device name and address, like a node GUID.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in cfg.name.bytes().chain(format!("{:?}{}", cfg.addr, cfg.port).bytes()) {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    (h & 0x00FF_FFFF_FFFF_FFFF) | 0x0200_0000_0000_0000
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(dev: *mut ibv_device) -> u64 {
    if dev.is_null() {
        return 0;
    }
    // SAFETY: devices we hand out are UDevices.
    let d = unsafe { &*(dev as *const UDevice) };
    guid_of(&d.cfg).to_be()
}

#[no_mangle]
pub extern "C" fn ibv_get_device_index(_dev: *mut ibv_device) -> c_int {
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    if dev.is_null() {
        return null(libc::EINVAL);
    }
    // SAFETY: devices we hand out are UDevices.
    let d = unsafe { &*(dev as *const UDevice) };
    let ctx = match Context::open(&d.cfg) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("uroce: cannot open {}: {e}", d.cfg.name);
            fail(&e);
            return std::ptr::null_mut();
        }
    };
    let share = match Share::open(dev, &ctx) {
        Ok(s) => s,
        Err(e) => return null(e),
    };
    // SAFETY: a device of our list.
    unsafe { new_context(dev, ctx, share) }
}

/// A new context on `dev` (a device of our list) for `ctx`: the
/// `verbs_context` with the ops table, `cmd_fd` from `share`. Opened by
/// ibv_open_device, or imported (`import.rs`).
pub(crate) unsafe fn new_context(dev: *mut ibv_device, ctx: Context, share: Share) -> *mut ibv_context {
    // SAFETY: verbs_context is plain old data (pointers and integers); zero
    // is a valid initial value, every op NULL.
    let mut vctx: verbs_context = unsafe { std::mem::zeroed() };
    vctx.sz = std::mem::size_of::<verbs_context>();
    let c = &mut vctx.context;
    c.device = dev;
    c.cmd_fd = share.cmd_fd();
    c.async_fd = ctx.async_fd();
    c.num_comp_vectors = 1;
    c.abi_compat = VERBS_ABI_IS_EXTENDED;
    c.ops.poll_cq = Some(crate::datapath::poll_cq);
    c.ops.req_notify_cq = Some(crate::datapath::req_notify_cq);
    c.ops.post_send = Some(crate::datapath::post_send);
    c.ops.post_recv = Some(crate::datapath::post_recv);
    c.ops.post_srq_recv = Some(crate::srq::post_srq_recv);
    vctx.query_device_ex = Some(query_device_ex);
    vctx.advise_mr = Some(crate::ext::advise_mr);
    vctx.alloc_dm = Some(crate::dm::alloc_dm);
    vctx.free_dm = Some(crate::dm::free_dm);
    vctx.reg_dm_mr = Some(crate::dm::reg_dm_mr);
    vctx.alloc_td = Some(crate::domain::alloc_td);
    vctx.dealloc_td = Some(crate::domain::dealloc_td);
    vctx.alloc_parent_domain = Some(crate::domain::alloc_parent_domain);
    vctx.create_qp_ex = Some(crate::objects::create_qp_ex);
    vctx.create_cq_ex = Some(crate::cq_ex::create_cq_ex);
    vctx.open_xrcd = Some(crate::xrcd::open_xrcd);
    vctx.close_xrcd = Some(crate::xrcd::close_xrcd);
    vctx.create_srq_ex = Some(crate::srq::create_srq_ex);
    vctx.get_srq_num = Some(crate::srq::get_srq_num);
    c.ops.alloc_mw = Some(crate::mw::alloc_mw);
    c.ops.bind_mw = Some(crate::mw::bind_mw);
    c.ops.dealloc_mw = Some(crate::mw::dealloc_mw);
    let u = Box::new(UContext {
        vctx,
        ctx,
        cqs: Mutex::new(HashMap::new()),
        qps: Mutex::new(HashMap::new()),
        srqs: Mutex::new(HashMap::new()),
        events_reported: Mutex::new(HashMap::new()),
        comp_reported: Mutex::new(HashMap::new()),
        ahs: Mutex::new(Default::default()),
        mws: Mutex::new(Default::default()),
        share,
    });
    let u = Box::into_raw(u);
    // SAFETY: `u` is a fresh allocation; the mutex lives inside it.
    unsafe {
        libc::pthread_mutex_init(
            &mut (*u).vctx.context.mutex as *mut _ as *mut libc::pthread_mutex_t,
            std::ptr::null(),
        );
        &mut (*u).vctx.context
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    if ctx.is_null() {
        return libc::EINVAL;
    }
    let off = std::mem::offset_of!(verbs_context, context);
    // SAFETY: `ctx` came from ibv_open_device: it is inside a boxed UContext.
    let u = unsafe { Box::from_raw((ctx as *mut u8).sub(off) as *mut UContext) };
    if u.share.is_last() {
        // SAFETY: the objects of this context, which the application leaked.
        unsafe { release_leaked(&u) };
    }
    drop(u);
    0
}

/// What the application did not destroy before closing the last context of
/// its file is released, as the kernel does when it releases the file: QPs,
/// SRQs, CQs, AHs, memory windows, then regions and PDs. Without this a leaked object kept
/// the device (its socket, progress thread and capture) alive until the
/// process ended. The structs stay allocated (the application holds the
/// pointers) with no object behind them; using them is an error, as after
/// a kernel device's close.
unsafe fn release_leaked(u: &UContext) {
    let take = |m: &Mutex<HashMap<u32, usize>>| std::mem::take(&mut *m.lock().unwrap());
    for (_, p) in take(&u.qps) {
        // SAFETY: a QP of this context, not destroyed.
        drop(unsafe { (*(p as *mut crate::handles::UQp)).inner.take() });
    }
    for (_, p) in take(&u.srqs) {
        // SAFETY: an SRQ of this context, not destroyed.
        drop(unsafe { (*(p as *mut crate::handles::USrq)).inner.take() });
    }
    for (_, p) in take(&u.cqs) {
        // SAFETY: a CQ of this context, not destroyed.
        drop(unsafe { (*(p as *mut crate::handles::UCq)).inner.take() });
    }
    for p in std::mem::take(&mut *u.ahs.lock().unwrap()) {
        // SAFETY: an AH of this context, not destroyed.
        drop(unsafe { (*(p as *mut crate::handles::UAh)).inner.take() });
    }
    for p in std::mem::take(&mut *u.mws.lock().unwrap()) {
        // SAFETY: a memory window of this context, not deallocated.
        drop(unsafe { (*(p as *mut crate::handles::UMw)).inner.take() });
    }
    u.share.release_objects();
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(ctx: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
    if ctx.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: our context; `attr` points to a caller's ibv_device_attr.
    let (u, a) = unsafe { (UContext::from_ctx(ctx), &mut *attr) };
    let d = u.ctx.query_device();
    // SAFETY: plain old data.
    *a = unsafe { std::mem::zeroed() };
    copy_name(&mut a.fw_ver, &d.fw_ver);
    a.node_guid = d.node_guid.to_be();
    a.sys_image_guid = d.sys_image_guid.to_be();
    a.max_mr_size = d.max_mr_size;
    a.page_size_cap = d.page_size_cap;
    a.vendor_id = d.vendor_id;
    a.vendor_part_id = d.vendor_part_id;
    a.hw_ver = d.hw_ver;
    a.max_qp = d.max_qp as c_int;
    a.max_qp_wr = d.max_qp_wr as c_int;
    a.device_cap_flags = d.device_cap_flags;
    a.max_sge = d.max_sge as c_int;
    a.max_sge_rd = d.max_sge_rd as c_int;
    a.max_cq = d.max_cq as c_int;
    a.max_cqe = d.max_cqe as c_int;
    a.max_mr = d.max_mr as c_int;
    a.max_pd = d.max_pd as c_int;
    a.max_qp_rd_atom = d.max_qp_rd_atom as c_int;
    a.max_res_rd_atom = d.max_res_rd_atom as c_int;
    a.max_qp_init_rd_atom = d.max_qp_init_rd_atom as c_int;
    a.atomic_cap = d.atomic_cap as _;
    a.max_mw = d.max_mw as c_int;
    a.max_ah = d.max_ah as c_int;
    a.max_srq = d.max_srq as c_int;
    a.max_srq_wr = d.max_srq_wr as c_int;
    a.max_srq_sge = d.max_srq_sge as c_int;
    a.max_pkeys = d.max_pkeys;
    a.local_ca_ack_delay = d.local_ca_ack_delay;
    a.phys_port_cnt = d.phys_port_cnt;
    0
}

/// `verbs_context.query_device_ex`, behind verbs.h's inline
/// `ibv_query_device_ex`: the basic attributes plus the extended ones uroce
/// has (extended capability flags, ODP capabilities; no TSO or RSS: zero).
unsafe extern "C" fn query_device_ex(
    ctx: *mut ibv_context,
    _input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    if ctx.is_null() || attr.is_null() || attr_size < std::mem::size_of::<ibv_device_attr>() {
        return libc::EINVAL;
    }
    let n = attr_size.min(std::mem::size_of::<ibv_device_attr_ex>());
    // SAFETY: the caller's struct of at least `attr_size` bytes; all-zero is valid.
    unsafe { std::ptr::write_bytes(attr as *mut u8, 0, n) };
    // SAFETY: as above; orig_attr is the first member.
    let rc = unsafe { ibv_query_device(ctx, &mut (*attr).orig_attr) };
    if rc != 0 {
        return rc;
    }
    if attr_size >= std::mem::offset_of!(ibv_device_attr_ex, phys_port_cnt_ex) + 4 {
        // SAFETY: the field lies inside the caller's `attr_size` bytes.
        unsafe {
            (*attr).phys_port_cnt_ex = 1;
            (*attr).device_cap_flags_ex = UContext::from_ctx(ctx).ctx.query_device().device_cap_flags_ex;
            (*attr).odp_caps = crate::ext::odp_caps();
            (*attr).xrc_odp_caps = crate::ext::xrc_odp_caps();
            (*attr).max_dm_size = crate::dm_memory::MAX_DM_SIZE;
        }
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(ctx: *mut ibv_context, port: u8, attr: *mut ibv_port_attr) -> c_int {
    if ctx.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: our context; a caller's port attribute struct.
    let (u, a) = unsafe { (UContext::from_ctx(ctx), &mut *attr) };
    let p = match u.ctx.query_port(port) {
        Ok(p) => p,
        Err(e) => return e.errno.0,
    };
    // SAFETY: plain old data.
    *a = unsafe { std::mem::zeroed() };
    a.state = p.state as _;
    a.max_mtu = p.max_mtu.to_raw() as _;
    a.active_mtu = p.active_mtu.to_raw() as _;
    a.gid_tbl_len = p.gid_tbl_len as c_int;
    a.port_cap_flags = p.port_cap_flags;
    a.max_msg_sz = p.max_msg_sz;
    a.pkey_tbl_len = p.pkey_tbl_len;
    a.active_width = p.active_width;
    a.active_speed = p.active_speed;
    a.phys_state = p.phys_state;
    a.link_layer = p.link_layer;
    a.max_vl_num = 1;
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(ctx: *mut ibv_context, port: u8, index: c_int, gid: *mut ibv_gid) -> c_int {
    if ctx.is_null() || gid.is_null() || port != 1 || index < 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: our context.
    let u = unsafe { UContext::from_ctx(ctx) };
    let raw = match u.ctx.query_gid(index as u32) {
        Ok(g) => g.0,
        // An empty entry: libibverbs turns the kernel's ENODATA into success
        // with the zero GID.
        Err(e) if e.errno == Errno::ENODATA => [0; 16],
        Err(e) => {
            set_errno(e.errno.0);
            return -1;
        }
    };
    // SAFETY: a caller's ibv_gid.
    unsafe { (*gid).raw = raw };
    0
}

/// The `ibv_gid_entry` of a populated entry of port 1 (all RoCE v2), with
/// the index of the interface that owns the GID's address (rxe's netdev;
/// 0 when no interface of this namespace has it).
fn gid_entry(index: u32, gid: Gid) -> ibv_gid_entry {
    // SAFETY: plain old data.
    let mut e: ibv_gid_entry = unsafe { std::mem::zeroed() };
    e.gid.raw = gid.0;
    e.gid_index = index;
    e.port_num = 1;
    e.gid_type = ibv_gid_type_IBV_GID_TYPE_ROCE_V2 as _;
    e.ndev_ifindex = uroce::io::netdev::interface_index(gid.to_ip()).unwrap_or(0);
    e
}

#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    ctx: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    if ctx.is_null() || entry.is_null() || port != 1 || entry_size < std::mem::size_of::<ibv_gid_entry>() {
        return libc::EINVAL;
    }
    // No flag is defined (the kernel refuses any).
    if flags != 0 {
        return libc::EINVAL;
    }
    // SAFETY: our context.
    let u = unsafe { UContext::from_ctx(ctx) };
    // An empty entry is ENODATA, one beyond the table EINVAL (the kernel's
    // answers).
    match u.ctx.query_gid(index) {
        Ok(g) => {
            // SAFETY: a caller's entry of at least our size.
            unsafe { *entry = gid_entry(index, g) };
            0
        }
        Err(e) => e.errno.0,
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(ctx: *mut ibv_context, port: u8, index: u32, ty: *mut u32) -> c_int {
    if ctx.is_null() || ty.is_null() || port != 1 {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: our context.
    let u = unsafe { UContext::from_ctx(ctx) };
    // uroce's GIDs are all RoCE v2 (IBV_GID_TYPE_SYSFS_ROCE_V2 = 1); an
    // empty entry reads as IB/RoCE v1 (0), as with libibverbs.
    let t = match u.ctx.query_gid(index) {
        Ok(_) => 1,
        Err(e) if e.errno == Errno::ENODATA => 0,
        Err(e) => {
            set_errno(e.errno.0);
            return -1;
        }
    };
    // SAFETY: a caller's out parameter.
    unsafe { *ty = t };
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(ctx: *mut ibv_context, port: u8, index: c_int, pkey: *mut u16) -> c_int {
    if ctx.is_null() || pkey.is_null() || port != 1 || index != 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: a caller's out parameter (network order).
    unsafe { *pkey = 0xFFFFu16.to_be() };
    0
}

#[no_mangle]
pub extern "C" fn ibv_get_pkey_index(_ctx: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    if port == 1 && u16::from_be(pkey) & 0x7FFF == 0x7FFF {
        0
    } else {
        -1
    }
}

/// A uroce device has no sysfs directory: every file is missing.
#[no_mangle]
pub extern "C" fn ibv_read_sysfs_file(
    _dir: *const c_char,
    _file: *const c_char,
    _buf: *mut c_char,
    _size: usize,
) -> c_int {
    set_errno(libc::ENOENT);
    -1
}

#[no_mangle]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

/// Succeeds: uroce's own mappings of registered memory are already
/// `MADV_DONTFORK`, and a child gets private copies of registered ranges
/// (README, "fork and uroce"), as on a kernel with copy-on-fork of pinned
/// pages.
#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `IBV_FORK_UNNEEDED` (2), what rdma-core answers on a kernel with
/// copy-on-fork for pinned pages: fork protection is not needed.
#[no_mangle]
pub extern "C" fn ibv_is_fork_initialized() -> u32 {
    2
}

#[no_mangle]
pub extern "C" fn ibv_dontfork_range(_base: *mut libc::c_void, _size: usize) -> c_int {
    0
}

#[no_mangle]
pub extern "C" fn ibv_dofork_range(_base: *mut libc::c_void, _size: usize) -> c_int {
    0
}

/// Called by provider libraries' constructors (libmlx5, libefa): a no-op.
#[no_mangle]
pub extern "C" fn verbs_register_driver_34(_ops: *const libc::c_void) {}

/// `_ibv_query_gid_table`: the populated entries of every port, empty ones
/// skipped; -EINVAL when they do not fit. Entries are `entry_size` bytes
/// apart, each cut to or zero-filled from ours (as the kernel copies them).
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    ctx: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    let inval = -(libc::EINVAL as isize);
    if ctx.is_null() || entries.is_null() || max_entries == 0 || entry_size == 0 || flags != 0 {
        return inval;
    }
    // SAFETY: our context.
    let u = unsafe { UContext::from_ctx(ctx) };
    let Ok(port) = u.ctx.query_port(1) else { return inval };
    let found: Vec<ibv_gid_entry> =
        (0..port.gid_tbl_len).filter_map(|i| u.ctx.query_gid(i).ok().map(|g| gid_entry(i, g))).collect();
    if found.len() > max_entries {
        return inval;
    }
    let n = entry_size.min(std::mem::size_of::<ibv_gid_entry>());
    for (i, e) in found.iter().enumerate() {
        // SAFETY: the caller's array holds `max_entries` entries of
        // `entry_size` bytes; i < max_entries, and `n` <= entry_size.
        unsafe {
            let dst = (entries as *mut u8).add(i * entry_size);
            std::ptr::copy_nonoverlapping(e as *const ibv_gid_entry as *const u8, dst, n);
            std::ptr::write_bytes(dst.add(n), 0, entry_size - n);
        }
    }
    found.len() as isize
}
