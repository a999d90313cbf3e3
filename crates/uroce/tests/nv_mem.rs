//! nv_mem with a real GPU: RDMA WRITE/READ into GPU memory registered like
//! host memory, then cudaFree invalidates the region. Skips with a printed
//! reason where libcuda.so.1 or a GPU is absent (the client's logic is
//! unit-tested with a mock driver in `mem::peer::nv_mem`).

mod common;

use common::*;
use std::time::Duration;
use uroce::mem::peer::{self, nv_mem};
use uroce::verbs::*;

const T: Duration = Duration::from_secs(5);

#[test]
fn rdma_into_gpu_memory() {
    let client = match nv_mem::load() {
        Ok(c) => c,
        Err(reason) => {
            println!("SKIPPED nv_mem GPU test: {reason}");
            return;
        }
    };
    let gpu = nv_mem::cuda::CudaDriver::open().unwrap();
    peer::register_client(client).unwrap();
    let (a, b) = connected(None);
    let len = 256 * 1024;
    let dptr = gpu.alloc(len).unwrap();
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    // SAFETY: a device pointer claimed by nv_mem; the CPU never dereferences it.
    let mr = unsafe { b.pd.register_raw(dptr as *mut u8, len, dptr, rw) }.unwrap();
    let s = peer::client_stats().into_iter().find(|s| s.name == "nv_mem").unwrap();
    assert_eq!((s.num_alloc_mrs, s.num_reg_pages), (1, 4), "64 KiB pages");
    let data: Vec<u8> = (0..len).map(|i| (i % 249) as u8).collect();
    let src = a.pd.register(data.clone(), Access::empty()).unwrap();
    let mut w = wr(1, WrOpcode::RdmaWrite, src.sge(0, len as u32));
    w.remote_addr = dptr;
    w.rkey = mr.rkey();
    a.qp.post_send(&w).unwrap();
    assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
    let mut back = vec![0u8; len];
    use uroce::mem::peer::nv_mem::GpuDriver;
    gpu.copy_to_host(&mut back, dptr).unwrap();
    assert_eq!(back, data);
    let dst = a.pd.register(vec![0u8; 4096], Access::LOCAL_WRITE).unwrap();
    let mut r = wr(2, WrOpcode::RdmaRead, dst.sge(0, 4096));
    r.remote_addr = dptr + 4096;
    r.rkey = mr.rkey();
    a.qp.post_send(&r).unwrap();
    assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
    assert_eq!(dst.to_vec(), &data[4096..8192]);
    gpu.free(dptr).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let s = peer::client_stats().into_iter().find(|s| s.name == "nv_mem").unwrap();
    assert_eq!(s.num_free_callbacks, 1);
    let mut w = wr(3, WrOpcode::RdmaWrite, src.sge(0, 8));
    w.remote_addr = dptr;
    w.rkey = mr.rkey();
    a.qp.post_send(&w).unwrap();
    assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::RemAccessErr);
    drop(mr);
}
