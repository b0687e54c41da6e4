//! When a ControllerPublish may return before its ticket is satisfied: its node's
//! mount is decided and on its way, so the FUSE daemon's start is NodePublish's wait
//! (docs/csi.md, "The attach flow"). Pure: the caller brings what the service's one
//! MountPod list-watch ([`super::super::mountpods`]) holds.
//!
//! A publish is **granted** when the watch holds, for the ticket's node, a MountPod
//! that
//! - is **new**: not the object (uid) the watch held for that node when the ticket was
//!   written. The controller creates a MountPod only for a node its decision chose,
//!   from a view holding a ticket there; one made after the ticket was written is the
//!   answer to it. A MountPod that was there before (an idle mount a workload comes
//!   back to, a person's ticket on the node) may be on its way out on a decision made
//!   without this ticket: the publish then waits for the ticket's status, satisfied,
//!   which the controller writes at once for a Ready mount. Any MountPod will do once
//!   the status says the controller chose the ticket at its generation (`Attaching`
//!   or satisfied: [`decided`]), as for a publish repeated while its mount starts.
//!   (The watch may lag the API server by a moment: a MountPod made just before the
//!   ticket and not seen yet counts as new. It was made for a ticket on the same
//!   node, and NodePublish binds only a serving MountPod, never one being deleted.);
//! - is not being deleted, serves (task `Serve`: not removing or filling the data),
//!   has the mode the ticket needs ([`tickets::compatible`]) and is not `Fenced`;
//! - and, for a single-node volume (RWO, RWOP), is the only MountPod of the volume
//!   the watch holds. The controller creates a single-node volume's MountPod only once
//!   every other is gone (moving is detach, then attach), and a watch delivers the
//!   events of one kind in resourceVersion order: when it shows the new MountPod it
//!   has shown every deletion before it. A second MountPod seen beside it is a world
//!   the controller would not make; the publish does not return on it.
//!
//! [`tickets::compatible`]: tessera_api::tickets::compatible

use tessera_api::tickets;
use tessera_api::{
    AccessMode, CONDITION_FENCED, MountPod, MountTask, TicketReason, VolumeAttachment,
};

use super::memo::Bounded;

/// What the watch held for each ticket's node when this process wrote the ticket, by
/// ticket id and generation: a publish repeated after a timeout (the
/// external-attacher retries the same call) finds a MountPod made since as new.
/// Without an entry (another process wrote the ticket, or the map started over) a
/// repeat waits for the status. Bounded: past [`WrittenBefore::CAP`] entries it
/// starts over.
#[derive(Clone)]
pub struct WrittenBefore(Bounded<(String, i64), Option<String>>);

impl Default for WrittenBefore {
    fn default() -> Self {
        WrittenBefore(Bounded::new(Self::CAP))
    }
}

impl WrittenBefore {
    /// The most entries kept.
    pub const CAP: usize = 16_384;

    /// Ticket `id` at `generation` was written while the watch held `before` (a uid,
    /// or none) for its node.
    pub fn record(&self, id: &str, generation: i64, before: Option<String>) {
        self.0.insert((id.to_string(), generation), before);
    }

    /// What [`record`](Self::record) kept for ticket `id` at `generation`.
    pub fn get(&self, id: &str, generation: i64) -> Option<Option<String>> {
        self.0.get(&(id.to_string(), generation))
    }
}

/// Whether `va`'s status says the controller chose ticket `id` for its current
/// generation: satisfied, or `Attaching` (its node's mount on the way).
pub fn decided(va: &VolumeAttachment, id: &str) -> bool {
    let Some(ticket) = va.spec.attachment_tickets.get(id) else {
        return false;
    };
    va.ticket_status(id).is_some_and(|s| {
        s.generation == ticket.generation
            && (s.satisfied || s.reason() == Some(TicketReason::Attaching.as_str()))
    })
}

/// What a ticket asks of its node's mount.
#[derive(Clone, Copy, Debug)]
pub struct Wanted<'a> {
    /// The volume's access mode.
    pub mode: AccessMode,
    /// The ticket's `readOnly` parameter.
    pub read_only: bool,
    /// The uid of the MountPod the watch held for the ticket's node when the ticket
    /// was written (`None`: none).
    pub before: Option<&'a str>,
}

/// Whether `mine` (the watch's MountPod of the ticket's volume on its node) grants the
/// publish, `others` being how many MountPods of the volume on other nodes the same
/// watch holds (looked at for a single-node volume only).
pub fn granted(wanted: &Wanted, mine: Option<&MountPod>, others: impl FnOnce() -> usize) -> bool {
    let Some(mp) = mine else {
        return false;
    };
    let uid = mp.metadata.uid.as_deref();
    let new = uid.is_some() && uid != wanted.before;
    let fenced = mp.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == CONDITION_FENCED && c.status == "True")
    });
    new && mp.metadata.deletion_timestamp.is_none()
        && mp.spec.task == MountTask::Serve
        && tickets::compatible(wanted.mode, wanted.read_only, mp.spec.read_only)
        && !fenced
        && (wanted.mode.is_multi_node() || others() == 0)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    use super::*;

    fn mp(uid: &str) -> MountPod {
        let spec = serde_json::json!({
            "volume": "v", "nodeName": "n1", "source": "/b/v", "capacityBytes": 1,
        });
        let mut mp = MountPod::new("mp", serde_json::from_value(spec).unwrap());
        mp.metadata.uid = Some(uid.into());
        mp
    }

    #[test]
    fn a_new_serving_mountpod_of_the_node_grants_the_publish() {
        let t = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let deleting = {
            let mut m = mp("u2");
            m.metadata.deletion_timestamp = Some(t.clone());
            m
        };
        let task = |task| {
            let mut m = mp("u2");
            m.spec.task = task;
            m
        };
        let read_only = {
            let mut m = mp("u2");
            m.spec.read_only = true;
            m
        };
        let fenced = {
            let mut m = mp("u2");
            m.status = Some(serde_json::from_value(serde_json::json!({})).unwrap());
            m.status.as_mut().unwrap().conditions.push(Condition {
                type_: CONDITION_FENCED.into(),
                status: "True".into(),
                reason: "LeaseExpired".into(),
                message: "m".into(),
                last_transition_time: t.clone(),
                observed_generation: None,
            });
            m
        };
        let new = mp("u2");
        let removing = task(MountTask::RemoveData);
        let filling = task(MountTask::Populate);
        let rwo = AccessMode::ReadWriteOnce;
        let rwop = AccessMode::ReadWriteOncePod;
        let rwx = AccessMode::ReadWriteMany;
        let rox = AccessMode::ReadOnlyMany;
        // (what, mode, ticket read-only, uid before, MountPod, others, granted)
        type Case<'a> = (
            &'a str,
            AccessMode,
            bool,
            Option<&'a str>,
            Option<&'a MountPod>,
            usize,
            bool,
        );
        let cases: Vec<Case> = vec![
            ("no MountPod yet", rwo, false, None, None, 0, false),
            (
                "a new one, RWO, alone",
                rwo,
                false,
                None,
                Some(&new),
                0,
                true,
            ),
            (
                "a new one, RWOP, alone",
                rwop,
                false,
                None,
                Some(&new),
                0,
                true,
            ),
            (
                "a new one replacing another",
                rwo,
                false,
                Some("u1"),
                Some(&new),
                0,
                true,
            ),
            (
                "the one there before the ticket",
                rwo,
                false,
                Some("u2"),
                Some(&new),
                0,
                false,
            ),
            (
                "RWO, another node's MountPod seen too",
                rwo,
                false,
                None,
                Some(&new),
                1,
                false,
            ),
            (
                "RWOP, another node's MountPod seen too",
                rwop,
                false,
                None,
                Some(&new),
                1,
                false,
            ),
            (
                "RWX, other nodes' MountPods",
                rwx,
                false,
                None,
                Some(&new),
                7,
                true,
            ),
            ("being deleted", rwx, false, None, Some(&deleting), 0, false),
            (
                "removing the data",
                rwx,
                false,
                None,
                Some(&removing),
                0,
                false,
            ),
            (
                "filling the volume",
                rwo,
                false,
                None,
                Some(&filling),
                0,
                false,
            ),
            (
                "read-only mount, read-write ticket",
                rwx,
                false,
                None,
                Some(&read_only),
                0,
                false,
            ),
            (
                "read-only mount, read-only ticket",
                rwx,
                true,
                None,
                Some(&read_only),
                0,
                true,
            ),
            (
                "ROX wants a read-only mount",
                rox,
                true,
                None,
                Some(&new),
                0,
                false,
            ),
            (
                "ROX, read-only mount",
                rox,
                true,
                None,
                Some(&read_only),
                0,
                true,
            ),
            ("its node fenced", rwo, false, None, Some(&fenced), 0, false),
        ];
        for (what, mode, read_only, before, mine, others, want) in cases {
            let wanted = Wanted {
                mode,
                read_only,
                before,
            };
            assert_eq!(granted(&wanted, mine, || others), want, "{what}");
        }
    }

    #[test]
    fn a_ticket_is_decided_when_satisfied_or_attaching_at_its_generation() {
        use tessera_api::{
            AttacherType, AttachmentTicket, AttachmentTicketStatus, CONDITION_SATISFIED,
            VolumeAttachmentSpec, VolumeAttachmentStatus,
        };
        let cond = |reason: &str| Condition {
            type_: CONDITION_SATISFIED.into(),
            status: "False".into(),
            reason: reason.into(),
            message: "m".into(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            observed_generation: None,
        };
        // (what, ticket generation, status: (satisfied, generation, reason), decided)
        type Status<'a> = Option<(bool, i64, Option<&'a str>)>;
        let cases: [(&str, i64, Status, bool); 6] = [
            ("no status yet", 1, None, false),
            ("satisfied", 1, Some((true, 1, None)), true),
            ("attaching", 1, Some((false, 1, Some("Attaching"))), true),
            (
                "attaching, an older generation",
                2,
                Some((false, 1, Some("Attaching"))),
                false,
            ),
            (
                "satisfied, an older generation",
                2,
                Some((true, 1, None)),
                false,
            ),
            (
                "waiting for a detach",
                1,
                Some((false, 1, Some("WaitingForDetach"))),
                false,
            ),
        ];
        for (what, generation, status, want) in cases {
            let spec = VolumeAttachmentSpec {
                volume: "v".into(),
                attachment_tickets: Default::default(),
            };
            let mut va = VolumeAttachment::new("v", spec);
            let mut t = AttachmentTicket::new("t", AttacherType::CsiAttacher, "n1");
            t.generation = generation;
            va.spec.attachment_tickets.insert("t".into(), t);
            if let Some((satisfied, generation, reason)) = status {
                let s = AttachmentTicketStatus {
                    id: "t".into(),
                    satisfied,
                    generation,
                    conditions: reason.map(cond).into_iter().collect(),
                    ..Default::default()
                };
                va.status = Some(VolumeAttachmentStatus {
                    attachment_ticket_statuses: [("t".to_string(), s)].into(),
                    ..Default::default()
                });
            }
            assert_eq!(decided(&va, "t"), want, "{what}");
            assert!(!decided(&va, "other"), "{what}: an unknown ticket");
        }
    }

    #[test]
    fn what_was_there_when_a_ticket_was_written_is_kept_by_generation_and_bounded() {
        let memo = WrittenBefore::default();
        assert_eq!(memo.get("t", 1), None, "nothing recorded");
        memo.record("t", 1, None);
        memo.record("u", 1, Some("uid-u".into()));
        assert_eq!(memo.get("t", 1), Some(None), "no MountPod there then");
        assert_eq!(memo.get("u", 1), Some(Some("uid-u".into())));
        assert_eq!(memo.get("t", 2), None, "another generation");
        for i in 0..WrittenBefore::CAP {
            memo.record(&format!("x{i}"), 1, None);
        }
        assert!(memo.0.kept() <= WrittenBefore::CAP);
        assert_eq!(memo.get("t", 1), None, "started over");
    }

    #[test]
    fn a_multi_node_volume_never_counts_the_other_nodes() {
        let wanted = Wanted {
            mode: AccessMode::ReadWriteMany,
            read_only: false,
            before: None,
        };
        assert!(granted(&wanted, Some(&mp("u")), || unreachable!(
            "an RWX publish scans no other MountPod"
        )));
    }
}
