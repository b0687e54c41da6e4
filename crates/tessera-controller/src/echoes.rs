//! The versions the attachment controller wrote itself, so that their watch events do
//! not reconcile it again.
//!
//! Every write comes back on the watch. A version the attachment controller wrote (a
//! VolumeAttachment or Volume status, a MountPod it created or applied) holds nothing
//! the reconcile that wrote it did not decide: what else changed before it came in
//! versions of its own, with their own events. Reconciling again on it decided the
//! same thing and wrote nothing: five of the 7–8 reconciles of an attach in
//! `make bench-controller`, on the same two cores as the API server.
//!
//! ```text
//!  attachment reconcile ── write ──▶ wrote(kind, name, resourceVersion)
//!  watch event (kind, name, rv) ──▶ seen: the version written? skip (once) : forget, trigger
//! ```
//!
//! Only a version delivered as a change is skipped: not one listed after a watch
//! restarts (the versions between may never have been delivered), not a deletion.
//! Any other version of an object forgets what was written of it, so a write whose
//! echo came before it was remembered costs one reconcile, as before, and nothing is
//! kept for long. The volume controller is still triggered by these versions (a
//! cleanup ticket's status is how it learns that the data is gone).

use std::collections::HashMap;
use std::sync::Mutex;

/// The last version the attachment controller wrote of each object, by kind and name.
#[derive(Default)]
pub struct Echoes {
    written: Mutex<HashMap<String, String>>,
}

impl Echoes {
    /// The attachment controller wrote object `kind`/`name`; the server answered with
    /// version `rv`.
    pub fn wrote(&self, kind: &str, name: &str, rv: Option<String>) {
        let mut written = self.written.lock().expect("echoes lock");
        match rv {
            Some(rv) => written.insert(format!("{kind}/{name}"), rv),
            None => written.remove(&format!("{kind}/{name}")),
        };
    }

    /// The watch delivered version `rv` of `kind`/`name` (`change`: as a change, not
    /// listed or deleted). Whether it is the echo of a write, which is then forgotten;
    /// any other version forgets the write too.
    pub fn seen(&self, kind: &str, name: &str, rv: Option<&str>, change: bool) -> bool {
        let mut written = self.written.lock().expect("echoes lock");
        let Some(wrote) = written.remove(&format!("{kind}/{name}")) else {
            return false;
        };
        change && rv == Some(wrote.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_written_version_delivered_as_a_change_is_an_echo_and_only_once() {
        // (writes before, the event: name, rv, change; an echo?)
        type Case<'a> = (&'a [(&'a str, &'a str)], (&'a str, &'a str, bool), bool);
        let cases: &[Case] = &[
            // The version written, as a change: skipped.
            (&[("v1", "12")], ("v1", "12", true), true),
            // Another object, another version, the same version listed after a
            // restart of the watch: delivered.
            (&[("v1", "12")], ("v2", "12", true), false),
            (&[("v1", "12")], ("v1", "11", true), false),
            (&[("v1", "12")], ("v1", "12", false), false),
            // Nothing written.
            (&[], ("v1", "12", true), false),
            // Two writes: the last one is the echo.
            (&[("v1", "12"), ("v1", "14")], ("v1", "14", true), true),
            (&[("v1", "12"), ("v1", "14")], ("v1", "12", true), false),
        ];
        for (i, (writes, (name, rv, change), want)) in cases.iter().enumerate() {
            let e = Echoes::default();
            for (n, v) in *writes {
                e.wrote("VolumeAttachment", n, Some(v.to_string()));
            }
            assert_eq!(
                e.seen("VolumeAttachment", name, Some(rv), *change),
                *want,
                "case {i}"
            );
        }
    }

    #[test]
    fn a_write_is_skipped_once_and_any_other_version_forgets_it() {
        let e = Echoes::default();
        e.wrote("Volume", "v1", Some("12".into()));
        // The same kind and name of another kind is another object.
        assert!(!e.seen("MountPod", "v1", Some("12"), true));
        assert!(e.seen("Volume", "v1", Some("12"), true));
        // Delivered twice (a watch replaying it): the second time it triggers.
        assert!(!e.seen("Volume", "v1", Some("12"), true));
        // An echo that came before its write was remembered: the next version of the
        // object forgets it, and the late echo is not waited for.
        e.wrote("Volume", "v1", Some("15".into()));
        assert!(!e.seen("Volume", "v1", Some("16"), true));
        assert!(!e.seen("Volume", "v1", Some("15"), true));
    }
}
