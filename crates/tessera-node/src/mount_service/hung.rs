//! Since when each mount that answered before has stopped answering its probes, so
//! that a slow mount (a loaded node, a slow backend) is told from a hung one: only a
//! mount silent for [`hang_grace`] is repaired. A repair unmounts the connection the
//! Pods' containers hold (they see ENOTCONN until they restart), so it waits.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::supervisor::Record;

/// How long a mount that answered before may go without answering before it counts
/// as hung and is repaired: two start timeouts (60 s by default).
pub fn hang_grace(start_timeout: Duration) -> Duration {
    start_timeout.saturating_mul(2)
}

/// By mount point and daemon start: when its probes first went unanswered. Bounded:
/// past [`HungSince::CAP`] entries it starts over (each entry ends when its mount
/// answers, so only mounts silent at once count).
#[derive(Default)]
pub struct HungSince(Mutex<HashMap<(PathBuf, String), Instant>>);

impl HungSince {
    /// The most entries kept.
    pub const CAP: usize = 4096;

    fn key(record: &Record) -> (PathBuf, String) {
        (record.mountpoint.clone(), record.started_at.clone())
    }

    /// `record`'s mount did not answer: how long it has not (zero the first time),
    /// and whether this is the first time.
    pub fn silent(&self, record: &Record) -> (Duration, bool) {
        let mut map = self.0.lock().expect("hang map poisoned");
        if map.len() >= Self::CAP {
            map.clear();
        }
        let mut first = false;
        let since = *map.entry(Self::key(record)).or_insert_with(|| {
            first = true;
            Instant::now()
        });
        (since.elapsed(), first)
    }

    /// `record`'s mount answered.
    pub fn answered(&self, record: &Record) {
        self.0
            .lock()
            .expect("hang map poisoned")
            .remove(&Self::key(record));
    }

    /// Count `record`'s silence as begun `ago` (tests).
    #[cfg(test)]
    pub fn backdate(&self, record: &Record, ago: Duration) {
        let at = Instant::now().checked_sub(ago).expect("a time in the past");
        self.0.lock().unwrap().insert(Self::key(record), at);
    }
}
