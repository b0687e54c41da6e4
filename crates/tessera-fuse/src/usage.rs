//! Capacity and usage of a volume at one instant, whichever enforces the quota: the
//! daemon's count ([`super::quota`]) or an XFS project quota ([`super::projquota`]).
//! Below both, so that neither imports the other for it.

/// Capacity and usage at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Bytes the volume may hold.
    pub capacity: u64,
    /// Bytes it holds.
    pub used: u64,
}

impl Usage {
    /// Bytes that can still be written (0 when over capacity after a shrink).
    pub fn free(&self) -> u64 {
        self.capacity.saturating_sub(self.used)
    }
}
