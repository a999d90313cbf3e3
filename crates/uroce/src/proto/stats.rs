//! Device counters kept by the transport: packets, bytes, drops by reason,
//! retransmissions and NAKs.

/// Counters of one engine. Monotonic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub rx_drop_malformed: u64,
    pub rx_drop_icrc: u64,
    pub rx_drop_no_qp: u64,
    pub rx_drop_state: u64,
    pub rx_drop_pkey: u64,
    pub rx_drop_qkey: u64,
    pub rx_drop_addr: u64,
    pub rx_drop_no_recv: u64,
    pub rx_duplicates: u64,
    pub rx_out_of_sequence: u64,
    pub retransmits: u64,
    pub timeouts: u64,
    pub rnr_naks_sent: u64,
    pub rnr_naks_received: u64,
    pub naks_sent: u64,
    pub naks_received: u64,
    pub qp_errors: u64,
}

impl Stats {
    /// Every counter with its name, for tables and exporters.
    pub fn fields(&self) -> [(&'static str, u64); 21] {
        [
            ("tx_packets", self.tx_packets),
            ("tx_bytes", self.tx_bytes),
            ("rx_packets", self.rx_packets),
            ("rx_bytes", self.rx_bytes),
            ("rx_drop_malformed", self.rx_drop_malformed),
            ("rx_drop_icrc", self.rx_drop_icrc),
            ("rx_drop_no_qp", self.rx_drop_no_qp),
            ("rx_drop_state", self.rx_drop_state),
            ("rx_drop_pkey", self.rx_drop_pkey),
            ("rx_drop_qkey", self.rx_drop_qkey),
            ("rx_drop_addr", self.rx_drop_addr),
            ("rx_drop_no_recv", self.rx_drop_no_recv),
            ("rx_duplicates", self.rx_duplicates),
            ("rx_out_of_sequence", self.rx_out_of_sequence),
            ("retransmits", self.retransmits),
            ("timeouts", self.timeouts),
            ("rnr_naks_sent", self.rnr_naks_sent),
            ("rnr_naks_received", self.rnr_naks_received),
            ("naks_sent", self.naks_sent),
            ("naks_received", self.naks_received),
            ("qp_errors", self.qp_errors),
        ]
    }
}
