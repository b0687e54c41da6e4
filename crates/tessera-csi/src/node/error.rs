//! The errors of the Node service and their one mapping to gRPC codes.
//!
//! As for the Controller service: every RPC returns [`Error`], [`From<Error> for
//! Status`] picks the code and writes the whole chain, bounded. Paths in messages
//! are bounded where they are validated ([`tessera_host::paths`]), other request
//! strings where the error is built.

use tonic::{Code, Status};

use tessera_api::{QuantityError, TicketReason};
use tessera_host::mounts;
use tessera_host::paths::PathError;
use tessera_host::roots::RootError;
use tessera_runtime::KubeError;

use crate::watch::WatchError;
use crate::{Missing, Pending};

/// Why an inline volume's request is refused (INVALID_ARGUMENT: the Pod must change).
#[derive(Debug, thiserror::Error)]
pub enum InlineError {
    /// An attribute Tessera does not know.
    #[error(
        "volumeAttributes key {0:?} is not known: an inline Tessera volume takes only `size` and `backendRoot`"
    )]
    UnknownKey(String),
    /// `size` is no quantity, or zero.
    #[error("volumeAttributes size {0:?} is not a positive quantity such as 64Mi")]
    Size(String),
    /// `size` is above the node's bound.
    #[error("volumeAttributes size {asked} is above the largest inline volume, {max} bytes")]
    TooLarge {
        /// What was asked, as written.
        asked: String,
        /// The bound, in bytes.
        max: u64,
    },
    /// `backendRoot` is not an allowed root.
    #[error("volumeAttributes backendRoot")]
    BackendRoot(#[source] RootError),
    /// No backend root is allowed on this node at all.
    #[error("no backend root is allowed on this node")]
    NoRoot,
    /// The kubelet did not send the Pod (the CSIDriver's `podInfoOnMount` is off).
    #[error("volume_context has no {0} (is podInfoOnMount set on the CSIDriver?)")]
    NoPodInfo(&'static str),
    /// The target path is not a Pod's CSI volume path, or names another Pod.
    #[error("target path {0} is not the CSI volume path of the Pod in volume_context")]
    NotPodPath(String),
}

/// Why a Node RPC failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A required field is empty.
    #[error(transparent)]
    Missing(#[from] Missing),
    /// Another call on the volume is in progress.
    #[error(transparent)]
    Pending(#[from] Pending),
    /// A call to the API server failed (always worth a retry: the node only reads and
    /// patches objects that exist).
    #[error(transparent)]
    Kube(#[from] KubeError),
    /// A mount syscall or the mount table failed.
    #[error(transparent)]
    Mount(#[from] mounts::Error),
    /// The capability asks for a block volume.
    #[error("block volumes are not supported: Tessera serves filesystems")]
    Block,
    /// A staging or target path is refused.
    #[error("{field}")]
    Path {
        /// The request field.
        field: &'static str,
        /// Why.
        #[source]
        source: PathError,
    },
    /// A volume path outside the kubelet directory: no path of this volume.
    #[error("{field} is no path of a volume")]
    UnknownPath {
        /// The request field.
        field: &'static str,
        /// Why.
        #[source]
        source: PathError,
    },
    /// The volume path does not exist.
    #[error("{0} does not exist")]
    PathMissing(String),
    /// No such Volume.
    #[error("volume {0} not found")]
    VolumeNotFound(String),
    /// No MountPod of the volume on this node.
    #[error("volume {volume} is not attached to node {node}")]
    NotAttached {
        /// The volume.
        volume: String,
        /// This node.
        node: String,
    },
    /// The MountPod is not Ready.
    #[error("the mount of volume {volume} on node {node} is not ready (phase {phase}{last_error})")]
    NotReady {
        /// The volume.
        volume: String,
        /// This node.
        node: String,
        /// Its phase, as written.
        phase: String,
        /// `: <its last error>`, or nothing.
        last_error: String,
    },
    /// The mount did not become Ready within NodePublish's bound.
    #[error(
        "the mount of volume {volume} on node {node} was not ready within {seconds} s: {state}"
    )]
    MountTimeout {
        /// The volume.
        volume: String,
        /// This node.
        node: String,
        /// The bound, in seconds.
        seconds: u64,
        /// Where it stood: no MountPod, or its phase and last error.
        state: String,
    },
    /// The MountPod is Ready without a mount point (the agent writes both at once).
    #[error("MountPod has no mount point yet")]
    NoMountPoint,
    /// A single-writer (ReadWriteOncePod) volume is published to another target.
    #[error(
        "volume {volume} is ReadWriteOncePod and already published to {target} (owner {owner}): one target at a time"
    )]
    SingleWriter {
        /// The volume.
        volume: String,
        /// The target that holds it.
        target: String,
        /// Who owns that target.
        owner: String,
    },
    /// Something else is mounted on the target path.
    #[error("{0} is mounted from something else")]
    TargetTaken(String),
    /// A directory could not be created or removed.
    #[error("{action} {path}")]
    Dir {
        /// `creating` or `removing`.
        action: &'static str,
        /// The directory.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The MountPod went away while a reference was being added.
    #[error("MountPod {0} is gone")]
    MountPodGone(String),
    /// The MountPod's references changed under five attempts in a row.
    #[error("MountPod {0} kept changing; retry")]
    KeptChanging(String),
    /// The statfs task did not finish.
    #[error("statfs of the volume path")]
    Statfs(#[source] tokio::task::JoinError),
    /// A Volume's `spec.size` does not parse (the API server's rules should prevent it).
    #[error("the size of volume {volume}")]
    Size {
        /// The Volume.
        volume: String,
        /// The cause.
        #[source]
        source: QuantityError,
    },
    /// An inline volume's attributes or path are refused (the Pod must change).
    #[error(transparent)]
    Inline(#[from] InlineError),
    /// The inline Volume of this Pod volume is being deleted (a Pod uid is never
    /// reused, so this is a late retry).
    #[error("inline volume {0} is being deleted")]
    InlineBeingDeleted(String),
    /// The inline Volume of this Pod volume exists with other attributes.
    #[error("inline volume {0} exists with other attributes or for another Pod")]
    InlineOtherwise(String),
    /// The inline Volume got no VolumeAttachment in time.
    #[error("inline volume {0} has no VolumeAttachment yet (is the controller running?)")]
    InlineNoAttachment(String),
    /// The inline volume's ticket was not satisfied in time.
    #[error("ticket {ticket} not satisfied: {reason}: {message}")]
    InlineNotSatisfied {
        /// The ticket.
        ticket: String,
        /// Why, as its status says.
        reason: TicketReason,
        /// What blocks it.
        message: String,
    },
    /// Watching the inline volume's VolumeAttachment failed.
    #[error(transparent)]
    Watch(WatchError),
    /// The inline Volume could not be encoded (a bug).
    #[error("encoding the inline Volume")]
    Encode(#[source] serde_json::Error),
}

impl Error {
    /// The gRPC code of this error, as the CSI spec names them per RPC.
    pub fn code(&self) -> Code {
        use Error::*;
        match self {
            Missing(_) | Block | Path { .. } | Inline(_) => Code::InvalidArgument,
            Pending(_) | KeptChanging(_) | InlineBeingDeleted(_) => Code::Aborted,
            Kube(_) | NoMountPoint | InlineNoAttachment(_) | Watch(_) => Code::Unavailable,
            InlineNotSatisfied { .. } | MountTimeout { .. } => Code::Unavailable,
            InlineOtherwise(_) => Code::AlreadyExists,
            Mount(_) | Dir { .. } | Statfs(_) | Size { .. } | Encode(_) => Code::Internal,
            UnknownPath { .. } | PathMissing(_) | VolumeNotFound(_) => Code::NotFound,
            NotAttached { .. } | NotReady { .. } | MountPodGone(_) | SingleWriter { .. } => {
                Code::FailedPrecondition
            }
            TargetTaken(_) => Code::AlreadyExists,
        }
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        crate::status(e.code(), &e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes() {
        let refused = || PathError::Outside {
            path: "/etc".into(),
            dir: "/var/lib/kubelet".into(),
        };
        for (e, want) in [
            (
                Error::Missing(Missing("target_path")),
                Code::InvalidArgument,
            ),
            (
                Error::Path {
                    field: "target_path",
                    source: refused(),
                },
                Code::InvalidArgument,
            ),
            (
                Error::UnknownPath {
                    field: "volume_path",
                    source: refused(),
                },
                Code::NotFound,
            ),
            (Error::VolumeNotFound("v".into()), Code::NotFound),
            (
                Error::NotAttached {
                    volume: "v".into(),
                    node: "n".into(),
                },
                Code::FailedPrecondition,
            ),
            (Error::TargetTaken("/t".into()), Code::AlreadyExists),
            (
                // Not final: the mount may still come, and the kubelet retries.
                Error::MountTimeout {
                    volume: "v".into(),
                    node: "n".into(),
                    seconds: 60,
                    state: "MountPod v-n phase Some(Starting)".into(),
                },
                Code::Unavailable,
            ),
            (
                Error::SingleWriter {
                    volume: "v".into(),
                    target: "/t".into(),
                    owner: "pod/1".into(),
                },
                Code::FailedPrecondition,
            ),
            (Error::KeptChanging("mp".into()), Code::Aborted),
            (Error::NoMountPoint, Code::Unavailable),
            (
                Error::Mount(mounts::Error::MountInfo(std::io::Error::other("x"))),
                Code::Internal,
            ),
        ] {
            let text = e.to_string();
            assert_eq!(Status::from(e).code(), want, "{text}");
        }
    }

    #[test]
    fn the_message_names_the_field_and_the_reason() {
        let status = Status::from(Error::Path {
            field: "target_path",
            source: PathError::Outside {
                path: "/etc".into(),
                dir: "/var/lib/kubelet".into(),
            },
        });
        assert_eq!(
            status.message(),
            "target_path: \"/etc\" is not under /var/lib/kubelet"
        );
    }
}
