//! Device counters kept by the transport: packets, bytes, drops by reason,
//! retransmissions and NAKs. The engine keeps one set per device and one per
//! queue pair (each QP's share of the device's counts).

macro_rules! counters {
    ($(#[$doc:meta])* $name:ident { $($(#[$fdoc:meta])* $field:ident),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $name {
            $($(#[$fdoc])* pub $field: u64,)*
        }

        impl $name {
            /// Number of counters.
            pub const LEN: usize = [$(stringify!($field)),*].len();

            /// Every counter with its name, for tables and exporters.
            pub fn fields(&self) -> [(&'static str, u64); Self::LEN] {
                [$((stringify!($field), self.$field)),*]
            }

            /// Adds a QP's counters to the device's: all but the received
            /// packets and bytes, which the device counts for every packet
            /// before it finds the QP.
            pub fn add_qp_share(&mut self, qp: &Self) {
                let rx = (self.rx_packets, self.rx_bytes);
                self.add(qp);
                (self.rx_packets, self.rx_bytes) = rx;
            }

            /// Adds another set (aggregation over devices or processes).
            pub fn add(&mut self, other: &Self) {
                $(self.$field += other.$field;)*
            }
        }
    };
}

counters! {
    /// Counters of one engine or one QP. Monotonic.
    Stats {
        /// Packets sent.
        tx_packets,
        /// Their bytes, BTH to ICRC (the UDP payload).
        tx_bytes,
        /// Packets received, counted before any check.
        rx_packets,
        /// Their bytes, BTH to ICRC (the UDP payload).
        rx_bytes,
        /// Not a valid RoCE packet.
        rx_drop_malformed,
        /// Bad ICRC: no IPv4 Identification a sender may have used makes it
        /// match (or, IPv6, it does not match).
        rx_drop_icrc,
        /// Accepted IPv4 packets whose ICRC matched with an Identification
        /// of 1..=63: segment k > 0 of a peer's UDP GSO send.
        rx_icrc_gso_id,
        /// Accepted IPv4 packets whose Identification was solved from the
        /// ICRC: from a peer learned to send hashed IDs (Linux rxe), or any
        /// peer with `ipv4_any_id`.
        rx_icrc_solved_id,
        /// Peers learned to send hashed IPv4 IDs (`proto::rx_ids`).
        rx_icrc_peers_learned,
        /// Packets whose ID solved but whose sender is known to use a
        /// uroce sender's IDs: dropped (and counted in `rx_drop_icrc`).
        rx_icrc_solved_refused,
        /// No such destination QP.
        rx_drop_no_qp,
        /// Wrong transport for the QP, or the QP's state does not accept it.
        rx_drop_state,
        /// P_Key does not match.
        rx_drop_pkey,
        /// UD: Q_Key does not match the QP's.
        rx_drop_qkey,
        /// Source address does not match the QP's address vector.
        rx_drop_addr,
        /// No receive WQE (UC/UD drop; RC answers RNR NAK).
        rx_drop_no_recv,
        /// Packets with a PSN already handled (requests seen before,
        /// responses and ACKs already processed).
        rx_duplicates,
        /// Packets with a PSN ahead of the one expected.
        rx_out_of_sequence,
        /// Go-back-N rewinds: times the requester went back to its oldest
        /// unacknowledged PSN to send again.
        retransmits,
        /// Retransmission (local ACK) timeouts.
        timeouts,
        /// RNR NAKs sent (no receive WQE, or a page fault).
        rnr_naks_sent,
        /// RNR NAKs received.
        rnr_naks_received,
        /// NAKs sent other than RNR NAKs (sequence error, invalid request,
        /// remote access or operational error).
        naks_sent,
        /// NAKs received other than RNR NAKs.
        naks_received,
        /// Of those, PSN sequence error NAKs (mlx5's `packet_seq_err`).
        seq_naks_received,
        /// QPs moved to the error state by a transport error.
        qp_errors,
        /// Receives completed inline (scatter-to-CQE: the message travelled
        /// in the completion and was copied at poll time).
        rx_inline_recvs,
        /// Their message bytes.
        rx_inline_bytes,
        /// Copies that might block (on-demand paging, peer memory) run by a
        /// copy job outside the engine's locks (`proto::copy`).
        copies_deferred,
        /// RNR NAKs answering a request that met a page fault (its copy
        /// job faults the pages in), as mlx5 answers a responder page fault;
        /// also counted in `rnr_naks_sent`.
        fault_rnr_naks,
        /// Retransmission timeouts not counted against `retry_cnt`: the QP
        /// waited for a local copy job (an ODP fault on this side).
        timeouts_behind_copies,
        /// Packets dropped because too many waited behind their QP's copy
        /// job (a reliable sender sends them again).
        rx_drop_busy,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_qp_share_adds_all_but_what_the_device_counts_itself() {
        let mut dev = Stats { rx_packets: 10, rx_bytes: 1000, tx_packets: 3, ..Default::default() };
        let qp = Stats { rx_packets: 4, rx_bytes: 400, tx_packets: 2, naks_sent: 1, ..Default::default() };
        dev.add_qp_share(&qp);
        assert_eq!((dev.rx_packets, dev.rx_bytes, dev.tx_packets, dev.naks_sent), (10, 1000, 5, 1));
        assert_eq!(Stats::LEN, 32);
        // Inline receives are the QP's: the device's is the sum.
        let inl = Stats { rx_inline_recvs: 2, rx_inline_bytes: 40, ..Default::default() };
        dev.add_qp_share(&inl);
        assert_eq!((dev.rx_inline_recvs, dev.rx_inline_bytes), (2, 40));
        assert_eq!(dev.fields()[0], ("tx_packets", 5));
    }
}
