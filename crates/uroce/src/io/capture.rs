//! Packet capture: every packet a device sends and receives, as a pcap file
//! that Wireshark and tshark decode as RoCEv2.

use crate::wire::pcap::PcapWriter;
use crate::wire::IpInfo;
use std::fs::File;
use std::io::{self, BufWriter};
use std::path::Path;
use std::sync::Mutex;
use std::time::SystemTime;

pub struct Capture {
    writer: Mutex<PcapWriter<BufWriter<File>>>,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Capture")
    }
}

impl Capture {
    pub fn create(path: &Path) -> io::Result<Capture> {
        let f = File::create(path)?;
        Ok(Capture { writer: Mutex::new(PcapWriter::new(BufWriter::new(f))?) })
    }

    pub fn record(&self, ip: &IpInfo, udp_payload: &[u8]) {
        let mut w = self.writer.lock().unwrap();
        if let Err(e) = w.write_roce(SystemTime::now(), ip, udp_payload) {
            tracing::warn!("packet capture: {e}");
        }
    }

    pub fn flush(&self) {
        let _ = self.writer.lock().unwrap().flush();
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.flush();
    }
}
