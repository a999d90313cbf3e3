//! A two-process RC test peer: `--server PORT` or `--client HOST:PORT`.
//! The two exchange GID, QPN, PSN, rkey and address over TCP (as
//! ibv_rc_pingpong does), then the client RDMA-WRITEs a pattern into the
//! server, READs it back, SENDs a message, and both verify. Exit 0 on
//! success. Used by the multi-process and network-namespace tests.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;
use uroce::verbs::*;

const LEN: usize = 1 << 20;
const T: Duration = Duration::from_secs(20);

fn pattern() -> Vec<u8> {
    (0..LEN).map(|i| (i as u32).wrapping_mul(2654435761).to_be_bytes()[0]).collect()
}

struct Info {
    gid: Gid,
    qpn: u32,
    psn: u32,
    rkey: u32,
    addr: u64,
}

impl Info {
    fn to_bytes(&self) -> [u8; 40] {
        let mut b = [0u8; 40];
        b[..16].copy_from_slice(&self.gid.0);
        b[16..20].copy_from_slice(&self.qpn.to_be_bytes());
        b[20..24].copy_from_slice(&self.psn.to_be_bytes());
        b[24..28].copy_from_slice(&self.rkey.to_be_bytes());
        b[28..36].copy_from_slice(&self.addr.to_be_bytes());
        b
    }
    fn from_bytes(b: &[u8; 40]) -> Info {
        let u32at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
        Info {
            gid: Gid(b[..16].try_into().unwrap()),
            qpn: u32at(16),
            psn: u32at(20),
            rkey: u32at(24),
            addr: u64::from_be_bytes(b[28..36].try_into().unwrap()),
        }
    }
}

fn exchange(s: &mut TcpStream, mine: &Info) -> std::io::Result<Info> {
    s.write_all(&mine.to_bytes())?;
    let mut b = [0u8; 40];
    s.read_exact(&mut b)?;
    Ok(Info::from_bytes(&b))
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (server, target) = match args.get(1).map(String::as_str) {
        Some("--server") => (true, args.get(2).cloned().unwrap_or_else(|| "18515".into())),
        Some("--client") => (false, args.get(2).cloned().ok_or("--client HOST:PORT")?),
        _ => return Err("usage: uroce-rc-peer --server PORT | --client HOST:PORT".into()),
    };
    let ctx = Context::open(&DeviceConfig::from_env()?)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(64, None)?;
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq))?;
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = pd.register(vec![0u8; LEN], all)?;
    let psn = std::process::id() & 0xFFFFFF;
    let mine = Info { gid: ctx.query_gid(0)?, qpn: qp.qp_num(), psn, rkey: mr.rkey(), addr: mr.iova() };
    let mut sock = if server {
        let l = TcpListener::bind(format!("0.0.0.0:{target}"))?;
        println!("server: device {} at {}, waiting on tcp {target}", ctx.name(), ctx.local_addr());
        l.accept()?.0
    } else {
        let mut tries = 0;
        loop {
            match TcpStream::connect(&target) {
                Ok(s) => break s,
                Err(e) if tries < 100 => {
                    tries += 1;
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e.into()),
            }
        }
    };
    let peer = exchange(&mut sock, &mine)?;
    qp.connect_rc(&peer.gid, peer.qpn, psn, peer.psn)?;
    let rx = pd.register(vec![0u8; 64], Access::LOCAL_WRITE)?;
    qp.post_recv(&RecvWr { wr_id: 100, sg_list: vec![rx.sge(0, 64)] })?;
    // Both sides are ready: sync.
    sock.write_all(b"R")?;
    sock.read_exact(&mut [0u8; 1])?;
    let data = pattern();
    if server {
        let wc = cq.wait(1, T)?[0];
        if wc.status != WcStatus::Success || wc.wr_id != 100 {
            return Err(format!("server: receive completion {wc:?}").into());
        }
        if &rx.to_vec()[..wc.byte_len as usize] != b"done" {
            return Err("server: wrong message".into());
        }
        if mr.to_vec() != data {
            return Err("server: RDMA WRITE data differs".into());
        }
        println!("server: 1 MiB RDMA WRITE verified, message received; {:?}", ctx.stats().retransmits);
    } else {
        let src = pd.register(data.clone(), all)?;
        let mut w = SendWr::new(1, WrOpcode::RdmaWrite);
        w.sg_list = vec![src.sge(0, LEN as u32)];
        w.remote_addr = peer.addr;
        w.rkey = peer.rkey;
        qp.post_send(&w)?;
        let mut r = SendWr::new(2, WrOpcode::RdmaRead);
        r.sg_list = vec![mr.sge(0, LEN as u32)];
        r.remote_addr = peer.addr;
        r.rkey = peer.rkey;
        qp.post_send(&r)?;
        let msg = pd.register(b"done".to_vec(), Access::empty())?;
        let mut s = SendWr::new(3, WrOpcode::Send);
        s.sg_list = vec![msg.sge(0, 4)];
        qp.post_send(&s)?;
        let wcs = cq.wait(3, T)?;
        for wc in &wcs {
            if wc.status != WcStatus::Success {
                return Err(format!("client: completion {wc:?}").into());
            }
        }
        if mr.to_vec() != data {
            return Err("client: RDMA READ data differs".into());
        }
        println!("client: WRITE + READ of 1 MiB and SEND completed and verified");
    }
    sock.write_all(b"D")?;
    let _ = sock.read(&mut [0u8; 1]);
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("uroce-rc-peer: {e}");
        std::process::exit(1);
    }
}
