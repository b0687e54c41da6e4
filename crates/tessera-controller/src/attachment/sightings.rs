//! When the controller first saw each ticket whose VolumeAttachment status does not
//! date it yet.
//!
//! A ticket's `requestedAt` (first come, first served; the latency histogram; how long
//! an attach has waited) lives in the VolumeAttachment status. A fast attach writes that
//! status once, when the ticket is satisfied, so until then the date is kept here: the
//! reconciles of that ticket agree on one first sighting instead of each taking its own
//! `now`. Once the status carries the date, or the ticket is gone, it is forgotten.
//! Lost on a restart, like a cache: the next leader dates the ticket on its first
//! sighting.
//!
//! ```text
//!  VolumeAttachment ─▶ first_seen ─▶ { ticket id ─▶ time } for tickets its status does not date
//!                        (remembered per volume; pruned by the status and the spec)
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use tessera_api::VolumeAttachment;

/// How long a sighting is kept if its volume is never reconciled again.
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// First sightings of undated tickets, by volume.
#[derive(Default)]
pub struct Sightings {
    by_volume: Mutex<HashMap<String, VolumeSightings>>,
}

/// The first sightings of one volume's undated tickets, by ticket id.
struct VolumeSightings {
    /// When the volume was last reconciled.
    touched: Instant,
    seen: BTreeMap<String, Time>,
}

impl Sightings {
    /// When each ticket of `va` that its status does not date was first seen (`now`
    /// for one seen for the first time). Tickets the status dates, and tickets no
    /// longer in the spec, are forgotten.
    pub fn first_seen(&self, va: &VolumeAttachment, now: &Time) -> BTreeMap<String, Time> {
        let mut all = self.by_volume.lock().expect("sightings lock");
        let at = Instant::now();
        all.retain(|_, v| at.duration_since(v.touched) < FORGET_AFTER);
        let dated = |id: &str| dated(va, id);
        let name = va.name_any();
        let VolumeSightings { touched, seen } =
            all.entry(name.clone()).or_insert_with(|| VolumeSightings {
                touched: at,
                seen: BTreeMap::new(),
            });
        *touched = at;
        seen.retain(|id, _| va.spec.attachment_tickets.contains_key(id) && !dated(id));
        for id in va.spec.attachment_tickets.keys() {
            if !dated(id) {
                seen.entry(id.clone()).or_insert_with(|| now.clone());
            }
        }
        let out = seen.clone();
        if out.is_empty() {
            all.remove(&name);
        }
        out
    }

    /// `va` as this controller just wrote it: the tickets its status dates now are
    /// forgotten at once, not on the next reconcile (the write's own watch event does
    /// not reconcile again, see `controller::echoes`), so [`pending`](Self::pending)
    /// does not count them.
    pub fn written(&self, va: &VolumeAttachment) {
        let mut all = self.by_volume.lock().expect("sightings lock");
        let name = va.name_any();
        let Some(v) = all.get_mut(&name) else {
            return;
        };
        v.seen
            .retain(|id, _| va.spec.attachment_tickets.contains_key(id) && !dated(va, id));
        if v.seen.is_empty() {
            all.remove(&name);
        }
    }

    /// How many tickets are undated (seen, their status not written yet): the new
    /// attaches under way, the controller's backlog.
    pub fn pending(&self) -> usize {
        let all = self.by_volume.lock().expect("sightings lock");
        let at = Instant::now();
        all.values()
            .filter(|v| at.duration_since(v.touched) < FORGET_AFTER)
            .map(|v| v.seen.len())
            .sum()
    }
}

/// Whether `va`'s status dates ticket `id` (its `requestedAt` is written).
fn dated(va: &VolumeAttachment, id: &str) -> bool {
    va.status
        .as_ref()
        .and_then(|s| s.attachment_ticket_statuses.get(id))
        .is_some_and(|s| s.requested_at.is_some())
}

#[cfg(test)]
mod tests {
    use tessera_api::{
        AttacherType, AttachmentTicket, AttachmentTicketStatus, VolumeAttachmentSpec,
        VolumeAttachmentStatus,
    };

    use super::*;

    fn t(s: i64) -> Time {
        Time(jiff::Timestamp::from_second(s).unwrap())
    }

    /// A VolumeAttachment with `tickets`; those in `dated` have a requestedAt in status.
    fn va(tickets: &[&str], dated: &[(&str, i64)]) -> VolumeAttachment {
        let mut va = VolumeAttachment::new(
            "v",
            VolumeAttachmentSpec {
                volume: "v".into(),
                attachment_tickets: tickets
                    .iter()
                    .map(|id| {
                        let t = AttachmentTicket::new(*id, AttacherType::CsiAttacher, "n1");
                        (id.to_string(), t)
                    })
                    .collect(),
            },
        );
        va.status = Some(VolumeAttachmentStatus {
            attachment_ticket_statuses: dated
                .iter()
                .map(|(id, at)| {
                    let s = AttachmentTicketStatus {
                        id: id.to_string(),
                        requested_at: Some(t(*at)),
                        ..Default::default()
                    };
                    (id.to_string(), s)
                })
                .collect(),
            ..Default::default()
        });
        va
    }

    #[test]
    fn undated_tickets_keep_their_first_sighting_until_the_status_dates_them() {
        let s = Sightings::default();
        // (tickets in spec, dated by the status, now, expected first sightings)
        type Dated<'a> = &'a [(&'a str, i64)];
        let steps: [(&[&str], Dated, i64, Dated); 5] = [
            (&["a"], &[], 10, &[("a", 10)]),
            // Seen again later: still its first sighting; b is new.
            (&["a", "b"], &[], 11, &[("a", 10), ("b", 11)]),
            // The status dates a: forgotten here (the status rules).
            (&["a", "b"], &[("a", 10)], 12, &[("b", 11)]),
            // b removed from the spec, then applied again: a new sighting.
            (&["a"], &[("a", 10)], 13, &[]),
            (&["a", "b"], &[("a", 10)], 14, &[("b", 14)]),
        ];
        for (i, (tickets, dated, now, want)) in steps.into_iter().enumerate() {
            let got = s.first_seen(&va(tickets, dated), &t(now));
            assert_eq!(s.pending(), want.len(), "step {i}: pending");
            let want: BTreeMap<String, Time> = want
                .iter()
                .map(|(id, at)| (id.to_string(), t(*at)))
                .collect();
            assert_eq!(got, want, "step {i}");
        }
    }

    #[test]
    fn a_status_written_forgets_the_tickets_it_dates_at_once() {
        let s = Sightings::default();
        s.first_seen(&va(&["a", "b"], &[]), &t(10));
        assert_eq!(s.pending(), 2);
        // The controller wrote a status dating a: b is still pending.
        s.written(&va(&["a", "b"], &[("a", 10)]));
        assert_eq!(s.pending(), 1);
        s.written(&va(&["a", "b"], &[("a", 10), ("b", 10)]));
        assert_eq!(s.pending(), 0);
        // The next sighting starts afresh.
        assert!(
            s.first_seen(&va(&["a", "b"], &[("a", 10), ("b", 10)]), &t(11))
                .is_empty()
        );
    }
}
