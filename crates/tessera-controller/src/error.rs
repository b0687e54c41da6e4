//! The controllers' errors, and how a failed reconcile is logged.
//!
//! A kube call that fails becomes [`Error::Kube`] with the action it was doing
//! ([`tessera_runtime::KubeContext::context`]); where the error is handled (the controllers' run loops,
//! `error_policy`, the reaper) its whole chain is printed once with
//! [`tessera_runtime::error_chain`].

use tracing::{debug, warn};

use tessera_runtime::{KubeError, error_chain};

use super::leader;

pub(crate) use tessera_runtime::KubeContext;

/// Errors of the controllers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error(transparent)]
    Kube(#[from] KubeError),
    /// The Volume's spec cannot be served (for example its size does not parse).
    #[error("volume {volume}: {message}")]
    InvalidVolume {
        /// The Volume.
        volume: String,
        /// What is wrong.
        message: String,
    },
    /// The allowed backend roots given on the command line are unusable.
    #[error("--allowed-backend-root")]
    AllowedRoots(#[source] tessera_host::roots::RootError),
    /// Leader election failed.
    #[error(transparent)]
    Leader(#[from] leader::Error),
    /// The role's shared parts (client, metrics, signals, CSI socket) could not start.
    #[error(transparent)]
    Runtime(#[from] tessera_runtime::Error),
}

/// Whether a controller's error is expected in normal operation: a reconcile that a
/// related object's event asked for, of an object not (yet, or no longer) in the store,
/// e.g. a new Volume's VolumeAttachment before it is created, or either after deletion;
/// or a reconcile that failed because an object it wrote was already gone (404: a
/// deleted Volume's VolumeAttachment, a MountPod deleted meanwhile).
pub(super) fn expected_run_error<R, Q>(e: &kube::runtime::controller::Error<R, Q>) -> bool
where
    R: std::error::Error + 'static,
{
    match e {
        kube::runtime::controller::Error::ObjectNotFound(_) => true,
        kube::runtime::controller::Error::ReconcilerFailed(err, _) => {
            tessera_runtime::is_not_found(err)
        }
        _ => false,
    }
}

/// A controller's error for one log line, its cause included once. A failed reconcile
/// prints its object and our error's chain (kube-runtime's message would repeat our
/// error before its chain); kube-runtime's other errors already print their causes.
pub(super) fn run_error_message<R, Q>(e: &kube::runtime::controller::Error<R, Q>) -> String
where
    R: std::error::Error,
    kube::runtime::controller::Error<R, Q>: std::fmt::Display,
{
    match e {
        kube::runtime::controller::Error::ReconcilerFailed(err, object) => {
            format!(
                "reconciler for object {object} failed: {}",
                error_chain(err)
            )
        }
        other => other.to_string(),
    }
}

/// Log a controller's error: expected ones at debug, every other one as a warning.
pub(super) fn log_run_error<R, Q>(controller: &str, e: &kube::runtime::controller::Error<R, Q>)
where
    R: std::error::Error + 'static,
    kube::runtime::controller::Error<R, Q>: std::fmt::Display,
{
    let error = run_error_message(e);
    if expected_run_error(e) {
        debug!(%error, "{controller} controller");
    } else {
        warn!(%error, "{controller} controller");
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::controller::Error as RunError;
    use kube::runtime::reflector::ObjectRef;

    use tessera_api::Volume;

    use super::*;

    #[test]
    fn a_reconcile_of_an_object_not_in_the_store_is_expected() {
        let missing: RunError<Error, std::io::Error> =
            RunError::ObjectNotFound(Box::new(ObjectRef::<Volume>::new("v").erase()));
        assert!(expected_run_error(&missing));
        let failed: RunError<std::io::Error, std::io::Error> = RunError::ReconcilerFailed(
            std::io::Error::other("boom"),
            Box::new(ObjectRef::<Volume>::new("v").erase()),
        );
        assert!(!expected_run_error(&failed));
        let queue: RunError<Error, std::io::Error> =
            RunError::QueueError(std::io::Error::other("watch failed"));
        assert!(!expected_run_error(&queue));
    }

    /// A reconcile that failed on a 404 (what it wrote is already gone) is expected;
    /// one that failed on any other answer is not.
    #[test]
    fn a_reconcile_that_finds_its_object_gone_is_expected() {
        let failed = |code: u16| -> RunError<Error, std::io::Error> {
            let status = kube::core::Status::failure("gone", "NotFound").with_code(code);
            let res: Result<(), kube::Error> = Err(kube::Error::Api(Box::new(status)));
            let e = res
                .context(|| "writing the status of VolumeAttachment v".into())
                .unwrap_err();
            RunError::ReconcilerFailed(
                Error::Kube(e),
                Box::new(ObjectRef::<Volume>::new("v").erase()),
            )
        };
        assert!(expected_run_error(&failed(404)));
        assert!(!expected_run_error(&failed(409)));
        assert!(!expected_run_error(&failed(500)));
    }

    #[test]
    fn a_failed_reconcile_names_its_action_and_cause_once() {
        let failed: RunError<Error, std::io::Error> = RunError::ReconcilerFailed(
            Error::Runtime(tessera_runtime::Error::Metrics {
                addr: "127.0.0.1:1".parse().unwrap(),
                source: std::io::Error::other("address in use"),
            }),
            Box::new(ObjectRef::<Volume>::new("v").erase()),
        );
        let msg = run_error_message(&failed);
        assert!(
            msg.ends_with("serving metrics on 127.0.0.1:1: address in use"),
            "{msg}"
        );
        assert_eq!(msg.matches("serving metrics").count(), 1, "{msg}");
        let queue: RunError<Error, std::io::Error> =
            RunError::QueueError(std::io::Error::other("watch failed"));
        assert_eq!(run_error_message(&queue), "event queue error: watch failed");
    }
}
