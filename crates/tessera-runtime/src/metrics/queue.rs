//! The reconcile queue of each controller, as `tessera_reconcile_queue_depth` counts
//! it: the objects a watch event asked a reconcile for that has not started yet (the
//! controllers run at most `--max-concurrent-reconciles` at once, so a burst waits
//! here). Each object counts once however many events asked, as kube-runtime's queue
//! holds it once.
//!
//! ```text
//!  watch event ─▶ mapper ─▶ Pending::asked(controller, name) ─┐
//!  reconcile starts ─▶ Pending::started(controller, name) ────┼─▶ depth (the gauge)
//!  every 5 s: Pending::retain(controller, in the cache?) ─────┘  (an object deleted
//!                                                                 before its reconcile)
//! ```
//!
//! Reconciles due after a delay (`Action::requeue`, an error's back-off) are not
//! asked by an event and are not counted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

/// Names asked for and not started, per controller.
#[derive(Debug, Default)]
pub struct Pending {
    names: Mutex<BTreeMap<String, BTreeSet<String>>>,
}

impl Pending {
    /// A reconcile of `name` by `controller` was asked for; the depth after.
    pub fn asked(&self, controller: &str, name: &str) -> usize {
        let mut all = self.names.lock().expect("pending lock");
        let names = all.entry(controller.to_string()).or_default();
        names.insert(name.to_string());
        names.len()
    }

    /// The reconcile of `name` by `controller` started; the depth after.
    pub fn started(&self, controller: &str, name: &str) -> usize {
        let mut all = self.names.lock().expect("pending lock");
        let names = all.entry(controller.to_string()).or_default();
        names.remove(name);
        names.len()
    }

    /// Keep only the names `keep` holds (the objects that still exist); the depth
    /// after.
    pub fn retain(&self, controller: &str, keep: impl Fn(&str) -> bool) -> usize {
        let mut all = self.names.lock().expect("pending lock");
        let names = all.entry(controller.to_string()).or_default();
        names.retain(|n| keep(n));
        names.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_counts_once_until_its_reconcile_starts() {
        let p = Pending::default();
        assert_eq!(p.asked("volume", "a"), 1);
        assert_eq!(p.asked("volume", "a"), 1, "asked twice, queued once");
        assert_eq!(p.asked("volume", "b"), 2);
        assert_eq!(p.asked("attachment", "a"), 1, "per controller");
        assert_eq!(p.started("volume", "a"), 1);
        assert_eq!(p.started("volume", "a"), 1, "not queued: nothing changes");
        assert_eq!(p.started("volume", "c"), 1);
        // b was deleted before its reconcile: gone with it.
        assert_eq!(p.retain("volume", |n| n != "b"), 0);
        assert_eq!(p.retain("attachment", |_| true), 1);
    }
}
