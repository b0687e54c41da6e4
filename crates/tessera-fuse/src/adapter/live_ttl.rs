//! The attribute and name cache lifetime of a running mount: read by the adapter for
//! every reply, set by the signal thread when the settings file changes (see
//! `crate::contract::settings`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A cache lifetime shared by the adapter (which reads it for every reply) and the
/// signal thread (which sets it).
#[derive(Debug, Clone)]
pub struct LiveTtl(Arc<AtomicU64>);

impl LiveTtl {
    pub fn new(d: Duration) -> Self {
        LiveTtl(Arc::new(AtomicU64::new(d.as_nanos() as u64)))
    }

    pub fn get(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }

    /// Set a new lifetime; the old one.
    pub fn set(&self, d: Duration) -> Duration {
        Duration::from_nanos(self.0.swap(d.as_nanos() as u64, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_ttl_changes_for_every_reader() {
        let t = LiveTtl::new(Duration::from_secs(1));
        let reader = t.clone();
        assert_eq!(t.set(Duration::from_secs(30)), Duration::from_secs(1));
        assert_eq!(reader.get(), Duration::from_secs(30));
    }
}
