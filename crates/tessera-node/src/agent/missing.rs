//! A daemon that never came (`--mounter=agent`): the agent mounted, the MountPod was
//! Ready (`AwaitingDaemon`) and Pods may have bound the mount, but no daemon took the
//! connection before the start timeout, or its start failed. The connection was let
//! go (the requests waiting on it failed with ENOTCONN) and the mount is made again;
//! this says so, once per failure, on the MountPod and on each Pod bound to it
//! (Warning `DaemonMissing`).

use kube::ResourceExt;
use kube::runtime::events::EventType;

use tessera_api::{CONDITION_READY, MountPod, MountPodStatus};

use super::oom::app_pods;
use super::status::AWAITING_DAEMON;
use super::{Context, publish, publish_on};

/// The Event's reason.
pub(super) const REASON: &str = "DaemonMissing";

/// Whether `status` says the agent's mount waits for its daemon.
pub(super) fn awaits_daemon(status: &MountPodStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == CONDITION_READY && c.reason == AWAITING_DAEMON)
}

/// What the Event says: `why` the daemon did not come.
pub(super) fn note(mp: &MountPod, why: &str) -> String {
    format!(
        "no mount daemon took the mount of volume {} over in time ({why}); the requests waiting on it failed with ENOTCONN, and it is mounted again for its daemon",
        mp.spec.volume
    )
}

/// Announce it on the MountPod and its Pods.
pub(super) async fn announce(ctx: &Context, mp: &MountPod, why: &str) {
    let note = note(mp, why);
    tracing::warn!(mountpod = %mp.name_any(), %note, "daemon missing");
    publish(ctx, mp, EventType::Warning, REASON, &note).await;
    for pod in app_pods(mp) {
        publish_on(ctx, &pod, EventType::Warning, REASON, &note).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_mount_awaiting_its_daemon_is_said_to() {
        let mut st = MountPodStatus::default();
        assert!(!awaits_daemon(&st));
        st.conditions.push(super::super::status::cond(
            CONDITION_READY,
            true,
            AWAITING_DAEMON,
            String::new(),
        ));
        assert!(awaits_daemon(&st));
        st.conditions[0].reason = "Mounted".into();
        assert!(!awaits_daemon(&st));
    }
}
