//! What a snapshot, a restore or a clone does next, decided without I/O.
//!
//! All three fill a new Volume (the snapshot's own Volume, or the new volume) from a
//! source Volume, in the same steps, each a ticket:
//!
//! ```text
//!  1. `snapshot-<dest>` / `clone-<dest>` ticket on the SOURCE, on the copy node
//!     (background: yields to workloads; satisfied = the source is mounted there, so
//!     the node can sync it before reading); none for a restore from a snapshot,
//!     which nobody writes
//!  2. once satisfied: `restore-<source>` ticket (volume-restore) on the DESTINATION,
//!     same node → MountPod task Populate → the agent copies, reports Ready
//!  3. once satisfied: both tickets removed, the destination annotated populated
//! ```
//!
//! The copy node is where the source is attached (so a running workload is synced
//! where it writes), else where its data lives, was last attached or was filled. A
//! source never attached anywhere has no data: the destination is populated empty at
//! once.

use sha2::{Digest, Sha256};

use tessera_api::{ANNOTATION_FILLED_ON, TicketReason, Volume, VolumeAttachment};

use super::Error;
use crate::proto::CapacityRange;

/// The next step of a fill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Put the source ticket on the source's VolumeAttachment.
    AddSourceTicket,
    /// The source ticket is not satisfied yet: why.
    WaitSource(TicketReason, String),
    /// Put the restore ticket on the destination's VolumeAttachment.
    AddRestoreTicket,
    /// The restore ticket (the copy) is not done yet: why.
    WaitRestore(TicketReason, String),
    /// The copy is done: remove the tickets, mark the destination populated.
    Done,
}

/// The step after the world `source_va` (`None`: the source Volume is gone, nothing to
/// sync) and `dest_va` shows.
pub fn next_step(
    source_va: Option<&VolumeAttachment>,
    source_ticket: &str,
    dest_va: &VolumeAttachment,
    restore_ticket: &str,
) -> Step {
    let blocked = |va: &VolumeAttachment, id: &str| {
        va.ticket_status(id)
            .and_then(|s| s.blocked_by())
            .map(|(r, m)| (r, m.to_owned()))
            .unwrap_or((TicketReason::Attaching, "waiting for the controller".into()))
    };
    if dest_va.ticket_satisfied(restore_ticket) {
        return Step::Done;
    }
    if dest_va.spec.attachment_tickets.contains_key(restore_ticket) {
        let (r, m) = blocked(dest_va, restore_ticket);
        return Step::WaitRestore(r, m);
    }
    match source_va {
        None => Step::AddRestoreTicket,
        Some(va) if va.ticket_satisfied(source_ticket) => Step::AddRestoreTicket,
        Some(va) if va.spec.attachment_tickets.contains_key(source_ticket) => {
            let (r, m) = blocked(va, source_ticket);
            Step::WaitSource(r, m)
        }
        Some(_) => Step::AddSourceTicket,
    }
}

/// Whether `va` is `volume`'s own VolumeAttachment: not being deleted, and owned by
/// this Volume (its uid). A Volume deleted and made again under the same name (the
/// CSI name is the same) can find the old one's VolumeAttachment for a moment, until
/// the controller replaces it: a ticket written there is lost with it.
pub fn attachment_of(va: &VolumeAttachment, volume: &Volume) -> bool {
    va.metadata.deletion_timestamp.is_none()
        && va.owned_by(volume.metadata.uid.as_deref().unwrap_or_default())
}

/// The node where `source` is copied: where it is attached (its status, else a
/// satisfied ticket of `source_va`, written before the status is), else where its
/// data is pinned, else where it was last attached, else where it was filled (its
/// `filled-on` annotation, written with `populated`). `None`: never attached, no data.
pub fn copy_node(source: &Volume, source_va: Option<&VolumeAttachment>) -> Option<String> {
    let status = source.status.as_ref();
    let satisfied = || {
        let va = source_va?;
        va.spec
            .attachment_tickets
            .values()
            .find(|t| va.ticket_satisfied(&t.id))
            .map(|t| t.node_id.clone())
    };
    status
        .and_then(|s| s.attached_nodes.first().cloned())
        .or_else(satisfied)
        .or_else(|| source.spec.backend.node.clone())
        .or_else(|| status.and_then(|s| s.last_attached_node.clone()))
        .or_else(|| {
            source
                .metadata
                .annotations
                .as_ref()?
                .get(ANNOTATION_FILLED_ON)
                .cloned()
        })
}

/// The size of a volume filled from a source of `have` bytes: the source's size when
/// the request names none, else what it asks (at least the source's); OUT_OF_RANGE
/// when the request cannot hold the source's data.
pub fn fill_size(
    range: Option<&CapacityRange>,
    have: u64,
    source_name: &str,
) -> Result<u64, Error> {
    let (required, limit) = range
        .map(|r| (r.required_bytes, r.limit_bytes))
        .unwrap_or((0, 0));
    let too_small = |want: i64| Error::SmallerThanSource {
        want: want.max(0) as u64,
        have,
        source_name: source_name.to_string(),
    };
    if limit > 0 && (limit as u64) < have {
        return Err(too_small(limit));
    }
    if required > 0 && (required as u64) < have {
        return Err(too_small(required));
    }
    let asked = super::request::size_for(range)?;
    Ok(if required > 0 { asked.max(have) } else { have })
}

/// A ticket id `<prefix>-<name>`, hashed when that would be too long for an id.
pub fn ticket_id(prefix: &str, name: &str) -> String {
    let id = format!("{prefix}-{name}");
    if id.len() <= 253 {
        id
    } else {
        format!(
            "{prefix}-{}",
            &hex::encode(Sha256::digest(name.as_bytes()))[..40]
        )
    }
}

#[cfg(test)]
mod tests;
