//! Why an access through a key fails: the one error every kind of memory
//! reports, below the files that check keys and copy.

/// Why an access through a key failed; the transport turns it into a
/// completion status or a NAK.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    #[error("no such key, or stale key variant")]
    BadKey,
    #[error("key belongs to another protection domain")]
    WrongPd,
    #[error("access rights do not allow the operation")]
    Permission,
    #[error("range outside the region")]
    Range,
    #[error("memory went away: unmapped on-demand page or invalidated peer memory")]
    Fault,
}
