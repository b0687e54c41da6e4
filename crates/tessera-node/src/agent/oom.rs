//! OOM kills of mount daemons (pod mode), made visible: the mount container's
//! termination reason `OOMKilled` becomes an Event on the MountPod and on every
//! application Pod that uses the mount (found through the MountPod's references),
//! naming the volume, and `status.oomKills` / `status.lastOOMKillTime`.
//!
//! ```text
//!  mount Pod changed ─(watch)─▶ reconcile ─▶ check: read the mount Pod
//!    container state/lastState terminated, reason OOMKilled, finishedAt
//!      newer than status.lastOOMKillTime? ─▶ status (oomKills + 1, the time)
//!                                          ─▶ Event OOMKilled on the MountPod
//!                                          ─▶ Event MountOOMKilled on each app Pod
//! ```
//!
//! The status is written before the Events, so a kill is announced once (an agent
//! that restarts between the two announces nothing twice, at the price of possibly
//! announcing nothing). Recovery is the usual path: the kubelet restarts the
//! container, and its daemon takes the held connection over (or the repair remounts).
//! In process mode the daemons have no memory limit of their own: nothing here.

use k8s_openapi::api::core::v1::{ContainerStateTerminated, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use serde_json::json;
use tracing::{debug, warn};

use tessera_api::MOUNT_POD_CONTAINER;
use tessera_api::{MountPod, MountPodStatus};
use tessera_runtime::error_chain;

use super::{Context, publish, publish_on};
use crate::pods::spec::{is_mount_pod_of, selector};

/// Reason of a terminated container the kernel's OOM killer ended.
const OOM_KILLED: &str = "OOMKilled";

/// One OOM kill of a mount container, as its Pod's status tells it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct OomKill {
    /// When the container ended.
    pub(super) finished_at: Time,
    /// The container's restart count now.
    pub(super) restarts: i32,
    /// Its memory limit, as written in its spec.
    pub(super) limit: Option<String>,
}

/// The latest OOM kill of the mount container of `pod`: its current state if it is
/// terminated, else its last state.
pub(super) fn oom_kill(pod: &Pod) -> Option<OomKill> {
    let c = pod
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == MOUNT_POD_CONTAINER)?;
    let terminated = |t: Option<&ContainerStateTerminated>| {
        t.filter(|t| t.reason.as_deref() == Some(OOM_KILLED))
            .and_then(|t| t.finished_at.clone())
    };
    let now = c.state.as_ref().and_then(|s| s.terminated.as_ref());
    let finished_at = match now {
        Some(t) => terminated(Some(t)),
        None => terminated(c.last_state.as_ref().and_then(|s| s.terminated.as_ref())),
    }?;
    let limit = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == MOUNT_POD_CONTAINER))
        .and_then(|c| c.resources.as_ref()?.limits.as_ref()?.get("memory"))
        .map(|q| q.0.clone());
    Some(OomKill {
        finished_at,
        restarts: c.restart_count,
        limit,
    })
}

/// Whether `kill` is one the status does not count yet.
pub(super) fn is_new(status: &MountPodStatus, kill: &OomKill) -> bool {
    status
        .last_oom_kill_time
        .as_ref()
        .is_none_or(|t| t.0 < kill.finished_at.0)
}

/// The application Pods bound to the mount (`MountPod::app_pods`), as Event targets.
pub(super) fn app_pods(mp: &MountPod) -> Vec<ObjectReference> {
    mp.app_pods()
        .into_iter()
        .map(|(namespace, name, uid)| ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(namespace),
            name: Some(name),
            uid: Some(uid),
            ..ObjectReference::default()
        })
        .collect()
}

/// The Event notes: on the MountPod, and on an application Pod.
pub(super) fn notes(mp: &MountPod, node: &str, kill: &OomKill) -> (String, String) {
    let limit = kill
        .limit
        .as_deref()
        .map(|l| format!("memory limit {l}"))
        .unwrap_or_else(|| "no memory limit of its own".into());
    let volume = &mp.spec.volume;
    let mountpod = format!(
        "mount daemon of volume {volume} on node {node} OOM-killed ({limit}) at {}; container restarts: {}; the kubelet's restart takes the mount over",
        kill.finished_at.0, kill.restarts
    );
    let app = format!(
        "volume {volume}: its mount daemon on node {node} was OOM-killed ({limit}); I/O may have stalled or failed while it restarted (MountPod {}, restarts {}); raise the StorageClass's mountMemoryLimit if this repeats",
        mp.name_any(),
        kill.restarts
    );
    (mountpod, app)
}

/// In pod mode, look for a new OOM kill of `mp`'s mount container; when there is one,
/// record it in the status and announce it. The MountPod with the status written,
/// if it was.
pub(super) async fn check(mp: &MountPod, ctx: &Context) -> Option<MountPod> {
    let namespace = ctx.mount_namespace.as_deref()?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    // Its mount Pod: the one of the plain name or, after an upgrade, its standby's
    // (spec::standby_name); an OOM kill is looked for in each.
    let lp = ListParams::default()
        .labels(&selector())
        .fields(&format!("spec.nodeName={}", ctx.node));
    let list = match pods.list(&lp).await {
        Ok(l) => l,
        Err(e) => {
            debug!(error = %error_chain(&e), volume = %mp.spec.volume, "reading the mount Pods for OOM kills");
            return None;
        }
    };
    let pod = list.items.into_iter().find(|p| {
        is_mount_pod_of(
            &p.name_any(),
            crate::pods::spec::image_of(p),
            &mp.spec.volume,
            &ctx.node,
        ) && oom_kill(p).is_some()
    })?;
    // The mount Pod of this MountPod, not a leftover of an earlier one.
    let owned = pod
        .owner_references()
        .iter()
        .any(|o| Some(o.uid.as_str()) == mp.uid().as_deref());
    let kill = oom_kill(&pod).filter(|_| owned)?;
    let mut status = mp.status.clone().unwrap_or_default();
    if !is_new(&status, &kill) {
        return None;
    }
    status.oom_kills = status.oom_kills.saturating_add(1);
    status.last_oom_kill_time = Some(kill.finished_at.clone());
    let body = json!({"apiVersion": "tessera.io/v1alpha1", "kind": "MountPod", "status": status});
    if let Err(e) = Api::<MountPod>::all(ctx.client.clone())
        .patch_status(
            &mp.name_any(),
            &PatchParams::apply(&ctx.field_manager).force(),
            &Patch::Apply(&body),
        )
        .await
    {
        if tessera_runtime::is_not_found(&e) {
            debug!(error = %error_chain(&e), "recording an OOM kill: the MountPod is gone");
        } else {
            warn!(error = %error_chain(&e), "recording an OOM kill");
        }
        return None;
    }
    let (on_mountpod, on_app) = notes(mp, &ctx.node, &kill);
    warn!(limit = ?kill.limit, restarts = kill.restarts, "mount daemon OOM-killed");
    publish(ctx, mp, EventType::Warning, "OOMKilled", &on_mountpod).await;
    for pod in app_pods(mp) {
        publish_on(ctx, &pod, EventType::Warning, "MountOOMKilled", &on_app).await;
    }
    let mut updated = mp.clone();
    updated.status = Some(status);
    Some(updated)
}

#[cfg(test)]
mod tests {
    use tessera_api::{MountReference, PodRef};

    use super::super::status::tests::mountpod;
    use super::*;

    fn pod(now: Option<(&str, &str)>, last: Option<(&str, &str)>, restarts: i32) -> Pod {
        let term = |(reason, at): (&str, &str)| json!({"terminated": {"exitCode": 137, "reason": reason, "finishedAt": at}});
        serde_json::from_value(json!({
            "metadata": {"name": "m"},
            "spec": {"containers": [{"name": MOUNT_POD_CONTAINER,
                "resources": {"limits": {"memory": "24Mi"}}}]},
            "status": {"containerStatuses": [{
                "name": MOUNT_POD_CONTAINER, "image": "i", "imageID": "", "ready": false,
                "restartCount": restarts,
                "state": now.map(term).unwrap_or(json!({"running": {}})),
                "lastState": last.map(term).unwrap_or(json!({})),
            }]},
        }))
        .unwrap()
    }

    const T1: &str = "2026-01-01T00:00:01Z";
    const T2: &str = "2026-01-01T00:00:02Z";

    #[test]
    fn oom_kills_are_read_from_the_container() {
        let k = oom_kill(&pod(None, Some(("OOMKilled", T1)), 1)).unwrap();
        assert_eq!(k.finished_at.0.to_string(), T1);
        assert_eq!((k.restarts, k.limit.as_deref()), (1, Some("24Mi")));
        let k = oom_kill(&pod(Some(("OOMKilled", T2)), Some(("Error", T1)), 3)).unwrap();
        assert_eq!(k.finished_at.0.to_string(), T2, "the current state first");
        for (what, p) in [
            ("running, never killed", pod(None, None, 0)),
            ("ended by an error", pod(None, Some(("Error", T1)), 1)),
            (
                "terminated now, not by the OOM killer",
                pod(Some(("Completed", T2)), Some(("OOMKilled", T1)), 1),
            ),
        ] {
            assert_eq!(oom_kill(&p), None, "{what}");
        }
    }

    #[test]
    fn a_kill_is_counted_once() {
        let k = oom_kill(&pod(None, Some(("OOMKilled", T2)), 1)).unwrap();
        let mut st = MountPodStatus::default();
        assert!(is_new(&st, &k));
        st.last_oom_kill_time = Some(k.finished_at.clone());
        assert!(!is_new(&st, &k), "the same kill");
        st.last_oom_kill_time = Some(Time(T1.parse().unwrap()));
        assert!(is_new(&st, &k), "a later kill");
    }

    #[test]
    fn app_pods_come_from_the_references() {
        let mut mp = mountpod(1, 0);
        let r = |target: &str, owner: &str, pod: Option<(&str, &str)>| MountReference {
            target_path: target.into(),
            owner: owner.into(),
            read_only: false,
            pod: pod.map(|(ns, n)| PodRef {
                namespace: ns.into(),
                name: n.into(),
            }),
        };
        mp.spec.references = vec![
            r("/k/pods/u1/a", "pod/u1", Some(("apps", "web-0"))),
            r("/k/pods/u1/b", "pod/u1", Some(("apps", "web-0"))),
            r("/k/pods/u2/a", "pod/u2", None),
            r("/k/x", "csi/v", Some(("apps", "nope"))),
            r("/k/pods/u3/a", "pod/u3", Some(("db", "pg-1"))),
        ];
        let got: Vec<(String, String, String)> = app_pods(&mp)
            .into_iter()
            .map(|o| (o.namespace.unwrap(), o.name.unwrap(), o.uid.unwrap()))
            .collect();
        let want = [("apps", "web-0", "u1"), ("db", "pg-1", "u3")]
            .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()));
        assert_eq!(got, want);
        let k = oom_kill(&pod(None, Some(("OOMKilled", T1)), 2)).unwrap();
        let (on_mp, on_app) = notes(&mp, "n1", &k);
        for note in [&on_mp, &on_app] {
            assert!(note.contains(&mp.spec.volume), "{note}");
            assert!(
                note.contains("24Mi") && note.contains("OOM-killed"),
                "{note}"
            );
        }
        assert!(on_mp.contains("container restarts: 2"), "{on_mp}");
    }
}
