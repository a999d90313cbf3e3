//! The device context (`ibv_context`): opening a device, its attributes,
//! completion channels and asynchronous events.

use super::attr::{DeviceAttr, PortAttr};
use super::config::DeviceConfig;
use super::device::{is_nonblocking, read_eventfd, write_eventfd, ChannelInner, DeviceShared};
use super::LinkStats;
use crate::ib::{Errno, Error, Gid, Mtu, Result, GID_TABLE_LEN};
use crate::io::{EventSink, Runtime, RuntimeConfig};
use crate::mem::Memory;
use crate::proto::{AsyncEvent, EngineConfig, Stats};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock, Weak};

fn registry() -> &'static Mutex<HashMap<String, Weak<DeviceShared>>> {
    static R: OnceLock<Mutex<HashMap<String, Weak<DeviceShared>>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// An open device (`ibv_context`).
#[derive(Clone)]
pub struct Context {
    pub(crate) dev: Arc<DeviceShared>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("name", &self.dev.name).field("addr", &self.dev.addr).finish()
    }
}

impl Context {
    /// Opens the device `cfg` describes, starting it if this process has not
    /// yet; a second open of the same name shares the running device.
    pub fn open(cfg: &DeviceConfig) -> Result<Context> {
        let mut reg = registry().lock().unwrap();
        if let Some(dev) = reg.get(&cfg.name).and_then(|w| w.upgrade()) {
            return Ok(Context { dev });
        }
        let mem = Memory::new();
        let rt = start_runtime(cfg, &mem)?;
        let addr = rt.local_addr();
        let inline_recv = if cfg.cqe_size == 128 { 64 } else { 32 };
        let dev = Arc::new(DeviceShared::new(cfg.name.clone(), rt.clone(), mem, cfg.scatter_to_cqe, inline_recv)?);
        let sink: Arc<dyn EventSink> = dev.clone();
        rt.set_sink(Arc::downgrade(&sink));
        reg.insert(cfg.name.clone(), Arc::downgrade(&dev));
        super::publish::device_started(&dev);
        tracing::info!(name = %cfg.name, %addr, "device started");
        Ok(Context { dev })
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.dev.name
    }

    /// The UDP address the device is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.dev.addr
    }

    /// The GID at `index` of the port's table. Index 0 holds the RoCEv2 GID
    /// of the device's address; the rest of the table
    /// ([`PortAttr::gid_tbl_len`] entries) is empty: ENODATA, as the kernel
    /// answers for an unpopulated entry. Beyond the table: EINVAL.
    pub fn query_gid(&self, index: u32) -> Result<Gid> {
        match index {
            0 => Ok(Gid::from_ip(self.dev.addr.ip())),
            i if i < GID_TABLE_LEN => Err(Error::new(Errno::ENODATA, "query_gid: empty GID entry")),
            _ => Err(Error::inval("query_gid: index out of range")),
        }
    }

    /// The device's attributes (`ibv_query_device`).
    pub fn query_device(&self) -> DeviceAttr {
        DeviceAttr::for_device(self.dev.guid())
    }

    /// The attributes of port `port` (`ibv_query_port`); the only port is 1
    /// (EINVAL for another).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        if port != 1 {
            return Err(Error::inval("query_port: no such port"));
        }
        Ok(PortAttr {
            state: 4,
            max_mtu: Mtu::Mtu4096,
            active_mtu: self.dev.mtu,
            gid_tbl_len: GID_TABLE_LEN,
            port_cap_flags: 0x0401_0000, // IsCM | IsDeviceManagement-like bits as rxe reports
            max_msg_sz: 0x8000_0000,
            pkey_tbl_len: 1,
            active_width: 2,  // 4X
            active_speed: 32, // EDR-ish; uroce has no real link speed
            link_layer: 2,
            phys_state: 5,
        })
    }

    /// A new completion channel (`ibv_create_comp_channel`).
    pub fn create_comp_channel(&self) -> Result<CompletionChannel> {
        self.comp_channel(Arc::downgrade(&self.dev.rt))
    }

    /// A channel for uroce's own threads (the CM agent): waiting on it
    /// receives nothing, and its CQs' arm state is not an application's
    /// (`proto::presence`).
    pub(crate) fn create_internal_comp_channel(&self) -> Result<CompletionChannel> {
        self.comp_channel(Weak::new())
    }

    fn comp_channel(&self, rt: Weak<Runtime>) -> Result<CompletionChannel> {
        Ok(CompletionChannel { inner: Arc::new(ChannelInner::new(rt)?) })
    }

    /// The fd that becomes readable when an asynchronous event is pending.
    pub fn async_fd(&self) -> RawFd {
        self.dev.async_fd()
    }

    /// Waits for the next asynchronous event (`ibv_get_async_event`).
    /// An event counted by the fd but discarded since (its object was
    /// destroyed) is skipped: the call waits for the next one (or fails
    /// with EAGAIN on a non-blocking fd).
    pub fn get_async_event(&self) -> Result<AsyncEvent> {
        self.dev.next_async_event()
    }

    /// The next asynchronous event, if one is pending.
    pub fn try_async_event(&self) -> Option<AsyncEvent> {
        self.dev.try_async_event()
    }

    /// The device's transport counters.
    pub fn stats(&self) -> Stats {
        self.dev.rt.stats()
    }

    /// Per peer: whether it is reached by the same-host shared-memory link
    /// or by UDP, and the packets and bytes each carried (see `io::link`).
    pub fn link_stats(&self) -> Vec<LinkStats> {
        self.dev.rt.link_stats()
    }

    /// Each medium's device-wide counters, by medium (`shm`: links up, the
    /// cap, and link attempts refused over the cap, for an address the
    /// peer does not own, or for a bad or slow setup; see `io::link`).
    pub fn medium_counters(&self) -> Vec<(&'static str, Vec<(&'static str, u64)>)> {
        self.dev.rt.medium_counters()
    }

    /// The device's ODP counters (all its ODP regions, past ones included).
    pub fn odp_stats(&self) -> crate::mem::OdpStats {
        self.dev.mem.odp_stats()
    }

    /// Bytes pinned by memory registrations.
    pub fn pinned_bytes(&self) -> u64 {
        self.dev.mem.pinned_bytes()
    }

    /// Flushes the packet capture file, if capturing.
    pub fn flush_capture(&self) {
        self.dev.rt.capture_flush();
    }
}

fn start_runtime(cfg: &DeviceConfig, mem: &Arc<Memory>) -> Result<Arc<Runtime>> {
    let faults = match &cfg.faults {
        Some(f) => Some(f.parse::<crate::io::faults::FaultConfig>().map_err(Error::inval)?),
        None => None,
    };
    let mk = |addr: IpAddr| {
        let mtu = cfg.mtu.unwrap_or_else(|| {
            crate::io::netdev::interface_mtu(addr).map_or(Mtu::Mtu1024, crate::io::netdev::roce_mtu_for)
        });
        let mut e = EngineConfig::new(addr, cfg.port, mtu);
        e.ipv4_any_id = cfg.ipv4_any_id;
        e.send_in_place = cfg.send_in_place;
        e.id_seed = crate::mem::os_random_u64();
        RuntimeConfig { engine: e, capture: cfg.capture.clone(), busy_poll: cfg.busy_poll, faults }
    };
    if let Some(addr) = cfg.addr {
        // A device of this process that was just closed may still hold the
        // address for an instant (its progress thread finishing a round, when
        // the last reference went away there): retry a bounded while.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        loop {
            match Runtime::start(mk(addr), mem.clone()) {
                Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) && std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                r => {
                    return r.map_err(|e| {
                        if let Some(c) = capture_error(&e) {
                            return c;
                        }
                        Error::new(
                            Errno(e.raw_os_error().unwrap_or(libc::EIO)),
                            format!(
                                "cannot bind {addr} port {}: {e} (another process uses it? set UROCE_ADDR)",
                                cfg.port
                            ),
                        )
                    })
                }
            }
        }
    }
    for host in 1..=254u8 {
        let addr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, host));
        match Runtime::start(mk(addr), mem.clone()) {
            Ok(rt) => return Ok(rt),
            Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => continue,
            Err(e) => {
                return Err(capture_error(&e).unwrap_or_else(|| {
                    Error::new(Errno(e.raw_os_error().unwrap_or(libc::EIO)), format!("bind {addr}: {e}"))
                }))
            }
        }
    }
    Err(Error::new(Errno::EADDRINUSE, "no free loopback address 127.0.0.1..254 for port 4791"))
}

/// A device start that failed on its capture file, reported as such.
fn capture_error(e: &std::io::Error) -> Option<Error> {
    let c = e.get_ref()?.downcast_ref::<crate::io::capture::CaptureOpenError>()?;
    Some(Error::new(Errno(c.errno), c.message.clone()))
}

/// A completion channel (`ibv_comp_channel`): a pollable fd that becomes
/// readable when an armed CQ gets a completion.
#[derive(Clone)]
pub struct CompletionChannel {
    pub(crate) inner: Arc<ChannelInner>,
}

impl CompletionChannel {
    /// The channel's file descriptor, readable while a CQ event waits.
    pub fn fd(&self) -> RawFd {
        self.inner.fd.as_raw_fd()
    }

    /// Waits (unless the fd was made non-blocking) for the next CQ event and
    /// returns the handle of the CQ it is for (`ibv_get_cq_event`).
    /// A count whose event was discarded since (its CQ was destroyed) is
    /// skipped: the call waits for the next event (EAGAIN on a non-blocking
    /// fd).
    ///
    /// A blocking wait receives for the device meanwhile: the thread sleeps
    /// on the device's socket beside the channel, so the datagram that
    /// completes its CQ wakes it once, as a blocking `recv` would, rather
    /// than wake the progress thread which then wakes it.
    pub fn get_event(&self) -> Result<u32> {
        self.next_event(None)?.ok_or_else(|| Error::new(Errno(libc::EAGAIN), "no CQ event"))
    }

    /// Waits at most `timeout` for a CQ event (receiving for the device
    /// meanwhile, as [`Self::get_event`]).
    pub fn wait(&self, timeout: std::time::Duration) -> Result<Option<u32>> {
        self.next_event(Some(std::time::Instant::now() + timeout))
    }

    /// The next event, waiting until `deadline` (None: for ever) unless the
    /// fd is non-blocking; None at the deadline.
    fn next_event(&self, deadline: Option<std::time::Instant>) -> Result<Option<u32>> {
        let rt = self.inner.rt.upgrade().filter(|_| !is_nonblocking(self.fd()));
        loop {
            if let Some(rt) = &rt {
                let fired = || !self.inner.fired.lock().unwrap().is_empty();
                match rt.wait_receiving(self.fd(), deadline, fired) {
                    Ok(true) => {}
                    Ok(false) => return Ok(None),
                    Err(e) => {
                        let errno = e.raw_os_error().unwrap_or(libc::EIO);
                        return Err(Error::new(Errno(errno), "wait for a CQ event"));
                    }
                }
            } else if let Some(d) = deadline {
                let left = d.saturating_duration_since(std::time::Instant::now());
                let mut pfd = libc::pollfd { fd: self.fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd.
                let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
                if n <= 0 {
                    return Ok(None);
                }
            }
            read_eventfd(self.fd())?;
            if let Some(cq) = self.inner.fired.lock().unwrap().pop_front() {
                return Ok(Some(cq));
            }
            if self.inner.interrupted.swap(false, Ordering::SeqCst) {
                return Ok(None);
            }
        }
    }

    /// Wakes the thread waiting in [`Self::wait`] on this channel (or the
    /// next one to wait): its call returns `Ok(None)`, no event, at once.
    /// For a channel its owner's own thread sleeps on (the CM agent's),
    /// woken for a new deadline or to stop instead of waking to look.
    pub fn interrupt(&self) {
        self.inner.interrupted.store(true, Ordering::SeqCst);
        write_eventfd(self.fd());
    }

    /// Whether a CQ that was not destroyed uses the channel.
    pub fn is_used(&self) -> bool {
        self.inner.cqs.load(Ordering::SeqCst) > 0
    }
}

impl std::fmt::Debug for CompletionChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionChannel").field("fd", &self.fd()).finish()
    }
}
