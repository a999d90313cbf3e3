//! nv_mem with a real GPU: RDMA WRITE/READ into GPU memory registered like
//! host memory, bytes checked with cuMemcpy, then cuMemFree invalidates the
//! region. Skipped (tests/skip) where libcuda.so.1 or
//! a GPU is absent (the client's logic is unit-tested with a mock driver in
//! `mem::peer::nv_mem`).

mod common;
#[macro_use]
mod skip;

use common::*;
use std::time::{Duration, Instant};
use uroce::ib::Errno;
use uroce::mem::peer::nv_mem::{self, GpuDriver, GPU_PAGE};
use uroce::mem::peer::{self, PeerStats};
use uroce::verbs::*;

fn stats() -> PeerStats {
    peer::client_stats().into_iter().find(|s| s.name == nv_mem::NAME).expect("nv_mem registered")
}

#[test]
fn rdma_into_gpu_memory() {
    let client = match nv_mem::load() {
        Ok(c) => c,
        Err(reason) => {
            skip!("{reason}");
        }
    };
    // Device start may already have loaded nv_mem (default configuration).
    match peer::register_client(client) {
        Ok(_) => {}
        Err(e) if e.errno == Errno::EEXIST => {}
        Err(e) => panic!("register nv_mem: {e}"),
    }
    let gpu = nv_mem::cuda::CudaDriver::open().unwrap();
    let (a, b) = connected(None);
    let len = 4 * GPU_PAGE as usize;
    let dptr = gpu.alloc(len).unwrap();
    let before = stats();
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    // SAFETY: a device pointer, claimed by nv_mem; the CPU never dereferences it.
    let mr = unsafe { b.pd.register_raw(dptr as *mut u8, len, dptr, rw) }.unwrap();
    let s = stats();
    assert_eq!(s.num_alloc_mrs - before.num_alloc_mrs, 1, "claimed by nv_mem, not pinned as host memory");
    let pages = nv_mem::gpu_pages(dptr, len as u64).unwrap();
    assert!(pages == 4 || pages == 5, "cuMemAlloc aligns at least to 512 bytes");
    assert_eq!(s.num_reg_pages - before.num_reg_pages, pages, "64 KiB pages");

    // RDMA WRITE into GPU memory; read back with cuMemcpyDtoH.
    let data: Vec<u8> = (0..len).map(|i| (i % 249) as u8).collect();
    let src = a.pd.register(data.clone(), Access::empty()).unwrap();
    let mut w = wr(1, WrOpcode::RdmaWrite, src.sge(0, len as u32));
    w.remote_addr = dptr;
    w.rkey = mr.rkey();
    a.qp.post_send(&w).unwrap();
    assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
    let mut back = vec![0u8; len];
    gpu.copy_to_host(&mut back, dptr).unwrap();
    assert_eq!(back, data, "RDMA WRITE landed in GPU memory");

    // Bytes written with cuMemcpyHtoD come back by RDMA READ.
    let pattern: Vec<u8> = (0..8192).map(|i| (i % 251) as u8 ^ 0x5a).collect();
    gpu.copy_to_device(dptr + 70_000, &pattern).unwrap();
    let dst = a.pd.register(vec![0u8; 8192], Access::LOCAL_WRITE).unwrap();
    let mut r = wr(2, WrOpcode::RdmaRead, dst.sge(0, 8192));
    r.remote_addr = dptr + 70_000;
    r.rkey = mr.rkey();
    a.qp.post_send(&r).unwrap();
    assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
    assert_eq!(dst.to_vec(), pattern, "RDMA READ from GPU memory");

    // cudaFree: the region is invalidated (once) and refuses access.
    gpu.free(dptr).unwrap();
    let t = Instant::now();
    while stats().num_free_callbacks == before.num_free_callbacks {
        assert!(t.elapsed() < Duration::from_secs(5), "free not detected");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    let s = stats();
    assert_eq!(s.num_free_callbacks - before.num_free_callbacks, 1, "invalidated once");
    assert_eq!(s.num_dealloc_mrs - before.num_dealloc_mrs, 1);
    let mut w = wr(3, WrOpcode::RdmaWrite, src.sge(0, 8));
    w.remote_addr = dptr;
    w.rkey = mr.rkey();
    a.qp.post_send(&w).unwrap();
    assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::RemAccessErr);
    drop(mr);
    let s = stats();
    assert_eq!(s.num_dereg_bytes - before.num_dereg_bytes, len as u64);
}

/// The GPU client's whole path where no GPU is: `rdma_into_gpu_memory` run
/// again in a child process whose `libcuda.so.1` is a fake built here
/// (tests/fake_cuda/libcuda.c: the driver functions nv_mem loads, backed by
/// host memory), found through the ordinary loader path (LD_LIBRARY_PATH).
#[test]
fn the_gpu_path_runs_on_a_fake_libcuda() {
    if std::env::var_os("UROCE_FAKE_CUDA_CHILD").is_some() {
        return; // the child runs rdma_into_gpu_memory only
    }
    let dir = std::env::temp_dir().join(format!("uroce-fake-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_cuda/libcuda.c");
    let cc = match std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
        .arg(dir.join("libcuda.so.1"))
        .arg(&src)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            skip!("cc is not installed (Debian package gcc): {e}");
        }
    };
    assert!(cc.status.success(), "cc: {}", String::from_utf8_lossy(&cc.stderr));
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "rdma_into_gpu_memory", "--nocapture"])
        .env("LD_LIBRARY_PATH", &dir)
        .env("UROCE_FAKE_CUDA_CHILD", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed") && !text.contains("SKIPPED"), "ran on the fake driver:\n{text}");
}
