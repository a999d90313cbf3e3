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

            /// Adds `after - before` (the counts of one operation).
            pub fn add_delta(&mut self, before: &Self, after: &Self) {
                $(self.$field += after.$field.wrapping_sub(before.$field);)*
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
        tx_packets,
        tx_bytes,
        rx_packets,
        rx_bytes,
        /// Not a valid RoCE packet.
        rx_drop_malformed,
        /// Bad ICRC.
        rx_drop_icrc,
        /// No such destination QP.
        rx_drop_no_qp,
        /// Wrong transport for the QP, or the QP's state does not accept it.
        rx_drop_state,
        rx_drop_pkey,
        rx_drop_qkey,
        /// Source address does not match the QP's address vector.
        rx_drop_addr,
        /// No receive WQE (UC/UD drop; RC answers RNR NAK).
        rx_drop_no_recv,
        rx_duplicates,
        rx_out_of_sequence,
        retransmits,
        timeouts,
        rnr_naks_sent,
        rnr_naks_received,
        naks_sent,
        naks_received,
        qp_errors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delta_and_names() {
        let before = Stats { tx_packets: 3, ..Default::default() };
        let after = Stats { tx_packets: 5, naks_sent: 1, ..Default::default() };
        let mut q = Stats::default();
        q.add_delta(&before, &after);
        assert_eq!((q.tx_packets, q.naks_sent), (2, 1));
        assert_eq!(Stats::LEN, 21);
        assert_eq!(q.fields()[0], ("tx_packets", 2));
    }
}
