//! The errors of the Controller service and their one mapping to gRPC codes.
//!
//! Every RPC returns [`Error`]; [`From<Error> for Status`] picks the code the CSI spec
//! asks for and writes the whole error chain as the message. Strings that came in a
//! request are cut to [`crate::SHOWN`] characters where the error is built, and
//! the message as a whole to [`crate::MESSAGE_MAX`].

use std::collections::BTreeMap;

use tonic::{Code, Status};

use tessera_api::{AccessMode, QuantityError, TicketReason};
use tessera_runtime::KubeError;

use crate::watch::WatchError;
use crate::{Missing, Pending};

/// Why a Controller RPC failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A required field is empty.
    #[error(transparent)]
    Missing(#[from] Missing),
    /// Another call on the volume is in progress.
    #[error(transparent)]
    Pending(#[from] Pending),
    /// A call to the API server failed.
    #[error(transparent)]
    Kube(#[from] KubeError),
    /// Waiting for an object failed.
    #[error(transparent)]
    Watch(#[from] WatchError),
    /// The capability asks for a block volume.
    #[error("block volumes are not supported: Tessera serves filesystems (access type mount)")]
    Block,
    /// The capability asks for MULTI_NODE_SINGLE_WRITER.
    #[error(
        "access mode MULTI_NODE_SINGLE_WRITER is not supported; use MULTI_NODE_MULTI_WRITER or a single-node mode"
    )]
    MultiNodeSingleWriter,
    /// The capability names no access mode.
    #[error("volume capability has no access mode")]
    NoAccessMode,
    /// A volume of one access mode cannot serve a capability asking for another.
    #[error("volume is {have}; the capability asks for {want}")]
    Incompatible {
        /// The volume's.
        have: AccessMode,
        /// The capability's.
        want: AccessMode,
    },
    /// CreateVolume: a content source that names neither a snapshot nor a volume.
    #[error("volume_content_source names neither a snapshot nor a volume")]
    ContentSource,
    /// No such snapshot (or the id names a Volume that is no snapshot).
    #[error("snapshot {0} not found")]
    SnapshotNotFound(String),
    /// CreateSnapshot: the name was used for a snapshot of another volume.
    #[error("snapshot {name} exists already, of volume {source_volume}")]
    SnapshotNameTaken {
        /// The snapshot (its Volume's name).
        name: String,
        /// The volume it is a snapshot of.
        source_volume: String,
    },
    /// CreateVolume from a snapshot whose copy is not finished.
    #[error("snapshot {0} is not ready yet (its copy is still being taken); retry later")]
    SnapshotNotReady(String),
    /// A clone or restore into less than the source's size.
    #[error(
        "the new volume ({want} bytes) is smaller than {source_name} ({have} bytes): it could not hold its data; ask for at least {have} bytes"
    )]
    SmallerThanSource {
        /// What the request allows at most.
        want: u64,
        /// The source's size.
        have: u64,
        /// The source (`snapshot X` or `volume X`).
        source_name: String,
    },
    /// The copy into a new volume (or snapshot) is not finished yet.
    #[error("volume {volume} is being filled from {source_volume}: {message}; retry later")]
    Populating {
        /// The volume being filled.
        volume: String,
        /// Its data source.
        source_volume: String,
        /// What it waits for (the blocking ticket's reason and message).
        message: String,
    },
    /// The `scope` parameter has another value.
    #[error("parameter scope must be Shared or NodeLocal, not {0:?}")]
    Scope(String),
    /// The `nodeFailover` parameter has another value.
    #[error("parameter nodeFailover must be Off or Fenced, not {0:?}")]
    NodeFailover(String),
    /// `backendRoot` names a directory the administrator did not allow.
    #[error("parameter backendRoot: {0}")]
    BackendRoot(#[source] tessera_host::roots::RootError),
    /// The volume's scope (the `scope` parameter) is one its root cannot hold.
    #[error("parameter scope: {0}")]
    ScopeMismatch(#[source] tessera_host::roots::RootError),
    /// The `idleMountDelay` parameter is no duration of 0 s to a day.
    #[error(
        "parameter idleMountDelay must be a duration of whole seconds from 0s to 24h (such as 90, 90s, 5m, 1h30m or 1d), not {0:?}"
    )]
    IdleMountDelay(String),
    /// A StorageClass parameter nobody knows.
    #[error(
        "unknown StorageClass parameter {0:?} (known: {known})",
        known = super::parameters::known()
    )]
    UnknownParameter(String),
    /// A VolumeAttributesClass asks to change what a Volume cannot change.
    #[error(
        "parameter {0:?} is immutable: it cannot change on an existing volume (where its data lives, or how its running mounts were started); create a new volume with a StorageClass that sets it, and copy the data"
    )]
    ImmutableParameter(String),
    /// A VolumeAttributesClass parameter nobody knows.
    #[error(
        "unknown VolumeAttributesClass parameter {0:?} (known: {known})",
        known = super::parameters::known_modifiable()
    )]
    UnknownMutableParameter(String),
    /// `attrCacheSeconds` is no whole number of seconds from 0 to 3600.
    #[error(
        "parameter attrCacheSeconds must be whole seconds from 0 to 3600 (such as 30 or 1m), not {0:?}"
    )]
    AttrCacheSeconds(String),
    /// A mount daemon's CPU or memory amount that is no quantity, out of bounds, or a
    /// request above its limit.
    #[error("StorageClass parameter {key}: {message}")]
    MountResource { key: &'static str, message: String },
    /// More bytes than any Volume may have.
    #[error("{0} bytes is more than the largest volume, {max} bytes", max = tessera_api::MAX_VOLUME_BYTES)]
    TooLarge(u64),
    /// A negative byte count.
    #[error("capacity range must not be negative")]
    NegativeCapacity,
    /// More required than allowed.
    #[error("required_bytes {required} exceeds limit_bytes {limit}")]
    CapacityAboveLimit {
        /// `required_bytes`.
        required: u64,
        /// `limit_bytes`.
        limit: u64,
    },
    /// No such Volume.
    #[error("volume {0} not found")]
    VolumeNotFound(String),
    /// No such Node.
    #[error("node {0} not found")]
    NodeNotFound(String),
    /// CreateVolume: the Volume of that name was created for another CSI name.
    #[error("a Volume named {0} exists for another request")]
    NameTaken(String),
    /// CreateVolume: the Volume of that name is still going.
    #[error("volume {0} is still being deleted")]
    BeingDeleted(String),
    /// CreateVolume: the volume exists, but not as asked.
    #[error("volume {name} exists with size {bytes} bytes and access mode {mode}")]
    ExistsOtherwise {
        /// The CSI name.
        name: String,
        /// Its size.
        bytes: u64,
        /// Its access mode.
        mode: AccessMode,
    },
    /// A Volume's `spec.size` does not parse (the API server's rules should prevent it).
    #[error("the size of volume {volume}")]
    Size {
        /// The Volume.
        volume: String,
        /// The cause.
        #[source]
        source: QuantityError,
    },
    /// The Volume object could not be built.
    #[error("building Volume {name}")]
    Encode {
        /// Its name.
        name: String,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// A new Volume has no VolumeAttachment yet.
    #[error("volume {0} has no VolumeAttachment yet (is the controller running?); retry")]
    NoAttachment(String),
    /// ControllerPublish: published on that node already, with other parameters.
    #[error(
        "volume {volume} is already published to node {node} with parameters {parameters:?}; unpublish it first"
    )]
    PublishedOtherwise {
        /// The volume.
        volume: String,
        /// The node.
        node: String,
        /// The ticket's parameters.
        parameters: BTreeMap<String, String>,
    },
    /// ControllerPublish: the volume's VolumeAttachment holds as many tickets as it can.
    #[error(
        "volume {volume} holds {max} attachment tickets, the most one VolumeAttachment can hold (docs/scaling-tickets.md): this attach succeeds once another node lets the volume go"
    )]
    TicketsFull {
        /// The volume.
        volume: String,
        /// [`tessera_api::MAX_TICKETS`].
        max: usize,
    },
    /// ControllerPublish: the ticket was not satisfied in time.
    #[error("ticket {ticket} not satisfied: {reason}: {message}")]
    NotSatisfied {
        /// The ticket.
        ticket: String,
        /// Why not (from its status).
        reason: TicketReason,
        /// What it waits for.
        message: String,
    },
    /// ControllerUnpublish: the mount was not gone in time.
    #[error("the mount of volume {volume} on node {node} is still being removed")]
    StillDetaching {
        /// The volume.
        volume: String,
        /// The node.
        node: String,
    },
    /// ListVolumes: a token this service did not hand out.
    #[error("starting_token {0:?} is not valid")]
    BadToken(String),
    /// ListVolumes: a token past the last volume.
    #[error("starting_token {0} is past the end")]
    TokenPastEnd(usize),
    /// An RPC this driver does not offer.
    #[error("{0} is not supported")]
    Unimplemented(&'static str),
}

impl Error {
    /// The gRPC code of this error, as the CSI spec names them per RPC.
    pub fn code(&self) -> Code {
        use Error::*;
        match self {
            Missing(_)
            | Block
            | MultiNodeSingleWriter
            | NoAccessMode
            | Incompatible { .. }
            | ContentSource
            | Scope(_)
            | NodeFailover(_)
            | BackendRoot(_)
            | ScopeMismatch(_)
            | UnknownParameter(_)
            | IdleMountDelay(_)
            | MountResource { .. }
            | ImmutableParameter(_)
            | UnknownMutableParameter(_)
            | AttrCacheSeconds(_)
            | NegativeCapacity => Code::InvalidArgument,
            Pending(_) | BeingDeleted(_) | BadToken(_) | TokenPastEnd(_) => Code::Aborted,
            Kube(e) => kube_code(&e.source),
            Watch(_) | NoAttachment(_) | SnapshotNotReady(_) | Populating { .. } => {
                Code::Unavailable
            }
            CapacityAboveLimit { .. } | TooLarge(_) | SmallerThanSource { .. } => Code::OutOfRange,
            VolumeNotFound(_) | NodeNotFound(_) | SnapshotNotFound(_) => Code::NotFound,
            NameTaken(_)
            | ExistsOtherwise { .. }
            | PublishedOtherwise { .. }
            | SnapshotNameTaken { .. } => Code::AlreadyExists,
            Size { .. } | Encode { .. } => Code::Internal,
            NotSatisfied { reason, .. } => match reason {
                TicketReason::HeldByOtherNode
                | TicketReason::NodeLocalElsewhere
                | TicketReason::BackendNotShared => Code::FailedPrecondition,
                TicketReason::InvalidParameters => Code::InvalidArgument,
                _ => Code::DeadlineExceeded,
            },
            StillDetaching { .. } => Code::DeadlineExceeded,
            TicketsFull { .. } => Code::ResourceExhausted,
            Unimplemented(_) => Code::Unimplemented,
        }
    }
}

/// Whether the API server refused a write of a VolumeAttachment for holding more
/// tickets than its CRD allows (`maxProperties` of `spec.attachmentTickets`).
pub fn too_many_tickets(e: &KubeError) -> bool {
    matches!(&e.source, kube::Error::Api(s) if s.code == 422
    && s.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| {
        c.reason == "FieldValueTooMany" && c.field == "spec.attachmentTickets"
    })))
}

/// The code of a failed API call: the object is missing, changed meanwhile, or
/// refused; anything else is worth a retry.
fn kube_code(e: &kube::Error) -> Code {
    match e {
        kube::Error::Api(s) if s.code == 404 => Code::NotFound,
        kube::Error::Api(s) if s.code == 409 => Code::Aborted,
        kube::Error::Api(s) if s.code == 422 || s.code == 400 => Code::InvalidArgument,
        _ => Code::Unavailable,
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        crate::status(e.code(), &e)
    }
}

#[cfg(test)]
mod tests {
    use tessera_runtime::KubeContext;

    use super::*;

    fn api_error(code: u16) -> Error {
        let status = kube::core::Status::failure("refused", "Reason").with_code(code);
        let res: Result<(), _> = Err(kube::Error::Api(Box::new(status)));
        res.context(|| "reading Volume v".into())
            .unwrap_err()
            .into()
    }

    #[test]
    fn a_write_past_the_most_tickets_is_told_from_other_refusals() {
        // As the API server answers a merge patch adding the 1,025th ticket.
        let refusal = |reason: &str, field: &str| {
            let status: kube::core::Status = serde_json::from_value(serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "VolumeAttachment.tessera.io \"v\" is invalid: spec.attachmentTickets: Too many: 1025: must have at most 1024 items",
                "reason": "Invalid",
                "details": {"name": "v", "group": "tessera.io", "kind": "VolumeAttachment",
                    "causes": [{"reason": reason, "message": "Too many: 1025: must have at most 1024 items", "field": field}]},
                "code": 422
            }))
            .unwrap();
            let res: Result<(), _> = Err(kube::Error::Api(Box::new(status)));
            res.context(|| "adding ticket".into()).unwrap_err()
        };
        assert!(too_many_tickets(&refusal(
            "FieldValueTooMany",
            "spec.attachmentTickets"
        )));
        assert!(!too_many_tickets(&refusal(
            "FieldValueInvalid",
            "spec.attachmentTickets"
        )));
        assert!(!too_many_tickets(&refusal(
            "FieldValueTooMany",
            "spec.attachmentTickets[a].parameters"
        )));
        let Error::Kube(other) = api_error(422) else {
            unreachable!()
        };
        assert!(!too_many_tickets(&other));
    }

    #[test]
    fn codes() {
        let not_satisfied = |reason| Error::NotSatisfied {
            ticket: "csi-1".into(),
            reason,
            message: "m".into(),
        };
        for (e, want) in [
            (Error::Missing(Missing("volume_id")), Code::InvalidArgument),
            (Error::Block, Code::InvalidArgument),
            (Error::Scope("x".into()), Code::InvalidArgument),
            (Error::NodeFailover("x".into()), Code::InvalidArgument),
            (Error::IdleMountDelay("x".into()), Code::InvalidArgument),
            (
                Error::CapacityAboveLimit {
                    required: 2,
                    limit: 1,
                },
                Code::OutOfRange,
            ),
            (Error::VolumeNotFound("v".into()), Code::NotFound),
            (Error::NameTaken("v".into()), Code::AlreadyExists),
            (Error::BeingDeleted("v".into()), Code::Aborted),
            (Error::NoAttachment("v".into()), Code::Unavailable),
            (
                Error::TicketsFull {
                    volume: "v".into(),
                    max: 1024,
                },
                Code::ResourceExhausted,
            ),
            (
                not_satisfied(TicketReason::HeldByOtherNode),
                Code::FailedPrecondition,
            ),
            (
                not_satisfied(TicketReason::NodeLocalElsewhere),
                Code::FailedPrecondition,
            ),
            (
                not_satisfied(TicketReason::InvalidParameters),
                Code::InvalidArgument,
            ),
            (
                not_satisfied(TicketReason::Attaching),
                Code::DeadlineExceeded,
            ),
            (Error::BadToken("x".into()), Code::Aborted),
            (Error::Unimplemented("snapshots"), Code::Unimplemented),
            (api_error(404), Code::NotFound),
            (api_error(409), Code::Aborted),
            (api_error(422), Code::InvalidArgument),
            (api_error(400), Code::InvalidArgument),
            (api_error(500), Code::Unavailable),
        ] {
            let text = e.to_string();
            assert_eq!(Status::from(e).code(), want, "{text}");
        }
    }

    #[test]
    fn the_message_is_the_chain() {
        let status = Status::from(api_error(500));
        assert!(
            status.message().starts_with("reading Volume v: ")
                && status.message().contains("refused"),
            "{}",
            status.message()
        );
        let size = Error::Size {
            volume: "v".into(),
            source: QuantityError("12x".into()),
        };
        assert_eq!(
            Status::from(size).message(),
            "the size of volume v: \"12x\" is not a quantity of bytes (like 10Gi, 500M or 1073741824)"
        );
    }

    #[test]
    fn messages_are_bounded() {
        let long = "x".repeat(100_000);
        let status = Status::from(Error::NotSatisfied {
            ticket: "csi-1".into(),
            reason: TicketReason::Attaching,
            message: long,
        });
        assert!(status.message().chars().count() <= crate::MESSAGE_MAX + 1);
    }
}
