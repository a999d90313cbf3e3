//! The drop-in C ABI under arbitrary arguments: registrations with random
//! flags and lengths, QP state changes with random attributes and masks,
//! work requests with random opcodes, flags, lengths and keys (over real
//! buffers, as a C caller's pointers would be), polling. Every call returns
//! an errno or a result; nothing panics (the drop-in aborts on a panic, so a
//! panic here is a crash) and no byte outside the registered buffer changes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use uroce_ibverbs::ffi::*;

extern "C" {
    fn ibv_get_device_list(n: *mut i32) -> *mut *mut ibv_device;
    fn ibv_free_device_list(l: *mut *mut ibv_device);
    fn ibv_open_device(d: *mut ibv_device) -> *mut ibv_context;
    fn ibv_alloc_pd(c: *mut ibv_context) -> *mut ibv_pd;
    fn ibv_create_cq(
        c: *mut ibv_context,
        n: i32,
        ctx: *mut std::ffi::c_void,
        ch: *mut ibv_comp_channel,
        v: i32,
    ) -> *mut ibv_cq;
    fn ibv_create_qp(pd: *mut ibv_pd, a: *mut ibv_qp_init_attr) -> *mut ibv_qp;
    fn ibv_destroy_qp(qp: *mut ibv_qp) -> i32;
    fn ibv_modify_qp(qp: *mut ibv_qp, a: *mut ibv_qp_attr, mask: i32) -> i32;
    fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut std::ffi::c_void, len: usize, access: i32) -> *mut ibv_mr;
    fn ibv_dereg_mr(mr: *mut ibv_mr) -> i32;
}

struct Dev {
    ctx: usize,
    pd: usize,
    cq: usize,
}

fn dev() -> &'static Dev {
    static D: OnceLock<Dev> = OnceLock::new();
    D.get_or_init(|| unsafe {
        let list = ibv_get_device_list(std::ptr::null_mut());
        let ctx = ibv_open_device(*list);
        // The context outlives the list, as in rdma-core (LeakSanitizer
        // reported the list when it was kept).
        ibv_free_device_list(list);
        let pd = ibv_alloc_pd(ctx);
        let cq = ibv_create_cq(ctx, 4096, std::ptr::null_mut(), std::ptr::null_mut(), 0);
        assert!(!pd.is_null() && !cq.is_null());
        Dev { ctx: ctx as usize, pd: pd as usize, cq: cq as usize }
    })
}

const GUARD: usize = 64;
const LEN: usize = 8192;

fuzz_target!(|data: &[u8]| {
    let d = dev();
    let (ctx, pd, cq) = (d.ctx as *mut ibv_context, d.pd as *mut ibv_pd, d.cq as *mut ibv_cq);
    let mut buf = vec![0x77u8; LEN + 2 * GUARD];
    let base = unsafe { buf.as_mut_ptr().add(GUARD) };
    let mut it = data.iter().copied();
    let mut next = move || it.next();
    // SAFETY (whole block): calls of the C ABI with pointers to live local
    // objects, as a C program would make them.
    unsafe {
        let mut ia: ibv_qp_init_attr = std::mem::zeroed();
        ia.send_cq = cq;
        ia.recv_cq = cq;
        ia.qp_type =
            [ibv_qp_type_IBV_QPT_RC, ibv_qp_type_IBV_QPT_UC, ibv_qp_type_IBV_QPT_UD][next().unwrap_or(0) as usize % 3];
        ia.cap.max_send_wr = next().unwrap_or(8) as u32;
        ia.cap.max_recv_wr = next().unwrap_or(8) as u32;
        ia.cap.max_send_sge = next().unwrap_or(2) as u32 % 40;
        ia.cap.max_recv_sge = next().unwrap_or(2) as u32 % 40;
        ia.cap.max_inline_data = next().unwrap_or(0) as u32 * 4;
        let qp = ibv_create_qp(pd, &mut ia);
        let mut mrs = Vec::new();
        while let Some(op) = next() {
            match op % 6 {
                0 => {
                    let off = next().unwrap_or(0) as usize * 32;
                    let len = (next().unwrap_or(0) as usize * 40).min(LEN - off.min(LEN));
                    let access = next().unwrap_or(0) as i32 | ((next().unwrap_or(0) as i32) << 8);
                    let mr = ibv_reg_mr(pd, base.add(off.min(LEN)).cast(), len, access);
                    if !mr.is_null() {
                        mrs.push(mr);
                    }
                }
                1 if !mrs.is_empty() => {
                    let i = next().unwrap_or(0) as usize % mrs.len();
                    let _ = ibv_dereg_mr(mrs.swap_remove(i));
                }
                2 if !qp.is_null() => {
                    let mut a: ibv_qp_attr = std::mem::zeroed();
                    a.qp_state = next().unwrap_or(0) as u32 % 8;
                    a.qp_access_flags = next().unwrap_or(0) as u32;
                    a.path_mtu = next().unwrap_or(0) as u32 % 7;
                    a.dest_qp_num = (*qp).qp_num;
                    a.port_num = next().unwrap_or(1) % 3;
                    a.timeout = next().unwrap_or(0);
                    a.retry_cnt = next().unwrap_or(0);
                    a.max_rd_atomic = next().unwrap_or(0);
                    a.max_dest_rd_atomic = next().unwrap_or(0);
                    a.ah_attr.is_global = 1;
                    a.ah_attr.port_num = 1;
                    let mut gid: ibv_gid = std::mem::zeroed();
                    gid.raw = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, next().unwrap_or(1)];
                    a.ah_attr.grh.dgid = gid;
                    let mask = (next().unwrap_or(0) as i32)
                        | ((next().unwrap_or(0) as i32) << 8)
                        | ((next().unwrap_or(0) as i32) << 16);
                    let _ = ibv_modify_qp(qp, &mut a, mask);
                }
                3 | 4 if !qp.is_null() => {
                    let n = next().unwrap_or(1) as usize % 5;
                    let mut sges: Vec<ibv_sge> = (0..n)
                        .map(|_| {
                            let off = next().unwrap_or(0) as usize * 32 % LEN;
                            let key =
                                mrs.get(next().unwrap_or(0) as usize % (mrs.len() + 1)).map_or(0x1234, |m| (**m).lkey);
                            ibv_sge {
                                addr: base as u64 + off as u64,
                                length: next().unwrap_or(0) as u32 * 64,
                                lkey: key,
                            }
                        })
                        .collect();
                    if op % 6 == 3 {
                        let mut wr: ibv_send_wr = std::mem::zeroed();
                        wr.opcode = next().unwrap_or(0) as u32 % 12;
                        wr.send_flags = next().unwrap_or(0) as u32 & !ibv_send_flags_IBV_SEND_INLINE; // inline reads SGE memory: kept valid below
                        wr.sg_list = sges.as_mut_ptr();
                        wr.num_sge = n as i32;
                        if (*qp).qp_type == ibv_qp_type_IBV_QPT_UD {
                            // The union holds an AH pointer: a C caller passes a
                            // real one or NULL (a garbage pointer is the caller's
                            // undefined behaviour, in libibverbs as here).
                            wr.wr.ud.ah = std::ptr::null_mut();
                            wr.wr.ud.remote_qpn = (*qp).qp_num;
                        } else {
                            wr.wr.rdma.remote_addr = base as u64 + (next().unwrap_or(0) as u64 * 64);
                            wr.wr.rdma.rkey = mrs.first().map_or(0, |m| (**m).rkey);
                        }
                        let mut bad = std::ptr::null_mut();
                        let post = (*ctx).ops.post_send.unwrap();
                        let _ = post(qp, &mut wr, &mut bad);
                    } else {
                        let mut wr: ibv_recv_wr = std::mem::zeroed();
                        wr.sg_list = sges.as_mut_ptr();
                        wr.num_sge = n as i32;
                        let mut bad = std::ptr::null_mut();
                        let post = (*ctx).ops.post_recv.unwrap();
                        let _ = post(qp, &mut wr, &mut bad);
                    }
                }
                _ => {
                    let mut wc: [ibv_wc; 16] = std::mem::zeroed();
                    let poll = (*ctx).ops.poll_cq.unwrap();
                    let _ = poll(cq, next().unwrap_or(1) as i32 % 17, wc.as_mut_ptr());
                }
            }
        }
        // Drain, then tear down (deregistration waits for transfers in
        // flight, so the buffer may be freed after it).
        let mut wc: [ibv_wc; 64] = std::mem::zeroed();
        let poll = (*ctx).ops.poll_cq.unwrap();
        while poll(cq, 64, wc.as_mut_ptr()) > 0 {}
        if !qp.is_null() {
            let _ = ibv_destroy_qp(qp);
        }
        for mr in mrs {
            let _ = ibv_dereg_mr(mr);
        }
        while poll(cq, 64, wc.as_mut_ptr()) > 0 {}
    }
    assert!(buf[..GUARD].iter().chain(&buf[GUARD + LEN..]).all(|&b| b == 0x77), "write outside the registered buffer");
});
