//! Orphaned inline volumes: a CSI ephemeral inline Volume ([`tessera_csi::node::ephemeral`])
//! whose Pod is gone, or is another Pod now (same name, new uid), while no NodeUnpublish
//! came to release it — its node was lost, or the Pod was force-deleted. The reaper
//! removes its `csi-ephemeral` tickets and deletes it, so its data goes through the
//! cleanup ticket like any deleted Volume's, with an Event on the Volume.
//!
//! ```text
//!  every ORPHAN_EVERY reaper passes: inline Volumes (cache) older than reap_grace
//!    ──▶ GET the Pod's metadata (annotation tessera.io/inline-pod) ──▶ [`orphaned`]
//!    ──▶ csi-ephemeral tickets removed (tested patch) ──▶ Volume deleted ──▶ Event
//! ```
//!
//! A Volume cannot name its Pod in an ownerReference (a cluster-scoped object with a
//! namespaced owner is never garbage-collected), hence this. One GET per inline Volume
//! per check: reads only, and only of Volumes past the grace.
//!
//! The other way round, a VolumeAttachment of an inline Volume that was deleted and is
//! recreated ([`super::volume`]) gets its `csi-ephemeral` ticket back from the same
//! Pod ([`ticket_of_pod`]): while the Pod it was made for runs on the Volume's node,
//! its mount is in use, and the node plugin writes the ticket only at NodePublish.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch};
use kube::runtime::events::EventType;
use tracing::info;

use tessera_api::{
    ANNOTATION_INLINE_POD, ANNOTATION_INLINE_POD_UID, AttacherType, AttachmentTicket,
    CSI_DRIVER_NAME, LABEL_INLINE, Volume, VolumeAttachment, inline_ticket, inline_volume_name,
};

use super::context::merge_params;
use super::events::publish;
use super::{Context, Error, KubeContext};

/// The orphan check runs on one reaper pass in this many.
pub const ORPHAN_EVERY: u64 = 6;

/// What the reaper knows of an inline Volume's Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodSeen {
    /// No Pod of that namespace and name.
    Gone,
    /// A Pod of that name, with this uid.
    Uid(String),
}

/// The Pod (`namespace`, `name`) an inline Volume was made for, if it is one.
pub fn pod_of(v: &Volume) -> Option<(&str, &str)> {
    if v.labels().get(LABEL_INLINE).map(String::as_str) != Some("true") {
        return None;
    }
    v.annotations().get(ANNOTATION_INLINE_POD)?.split_once('/')
}

/// Why inline Volume `v`, `age` old, should go, given what is seen of its Pod: never
/// before `grace`, never while being deleted, never without its Pod's uid recorded.
pub fn orphaned(v: &Volume, pod: &PodSeen, age: Duration, grace: Duration) -> Option<String> {
    let (ns, name) = pod_of(v)?;
    let uid = v.annotations().get(ANNOTATION_INLINE_POD_UID)?;
    if v.metadata.deletion_timestamp.is_some() || age < grace {
        return None;
    }
    match pod {
        PodSeen::Gone => Some(format!("its Pod {ns}/{name} is gone")),
        PodSeen::Uid(now) if now != uid => Some(format!(
            "its Pod {ns}/{name} (uid {uid}) is gone; a Pod of that name has uid {now}"
        )),
        PodSeen::Uid(_) => None,
    }
}

/// The `csi-ephemeral` ticket inline Volume `v` stands for while `pod` is the Pod it
/// was made for (same namespace, name and uid), placed on the Volume's node, not
/// ended, and declaring it (an inline `csi.tessera.io` volume whose name hashes to
/// `v`'s): the ticket the node plugin wrote at NodePublish, `readOnly` as the Pod's
/// volume says. `None` for anything else.
pub fn ticket_of_pod(v: &Volume, pod: &Pod) -> Option<AttachmentTicket> {
    let (ns, name) = pod_of(v)?;
    let uid = v.annotations().get(ANNOTATION_INLINE_POD_UID)?;
    let node = v.spec.backend.node.as_deref()?;
    let ours = pod.metadata.namespace.as_deref() == Some(ns)
        && pod.metadata.name.as_deref() == Some(name)
        && pod.metadata.uid.as_ref() == Some(uid);
    let spec = pod.spec.as_ref()?;
    let ended = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    if !ours || spec.node_name.as_deref() != Some(node) || ended {
        return None;
    }
    let volume = v.name_any();
    let csi = spec.volumes.iter().flatten().find_map(|pv| {
        pv.csi
            .as_ref()
            .filter(|c| c.driver == CSI_DRIVER_NAME && inline_volume_name(uid, &pv.name) == volume)
    })?;
    Some(inline_ticket(&volume, node, csi.read_only.unwrap_or(false)))
}

/// The `csi-ephemeral` ticket to give back to the recreated VolumeAttachment of `v`
/// ([`ticket_of_pod`] of the Pod read now), if it is an inline Volume.
pub async fn ticket_back(ctx: &Context, v: &Volume) -> Result<Option<AttachmentTicket>, Error> {
    let Some((ns, name)) = pod_of(v) else {
        return Ok(None);
    };
    let pod = Api::<Pod>::namespaced(ctx.client.clone(), ns)
        .get_opt(name)
        .await
        .context(|| format!("reading Pod {ns}/{name}"))?;
    Ok(pod.and_then(|p| ticket_of_pod(v, &p)))
}

/// Check every inline Volume of the cache against its Pod.
pub async fn reap_orphans(ctx: &Context, grace: Duration) -> Result<(), Error> {
    let now = jiff::Timestamp::now();
    for v in ctx.caches.volumes.state() {
        let Some((ns, name)) = pod_of(&v) else {
            continue;
        };
        let age = v
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| Duration::from_secs_f64(now.duration_since(t.0).as_secs_f64().max(0.0)))
            .unwrap_or_default();
        if age < grace || v.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let pod = Api::<Pod>::namespaced(ctx.client.clone(), ns)
            .get_metadata_opt(name)
            .await
            .context(|| format!("reading Pod {ns}/{name}"))?;
        let seen = match pod.and_then(|p| p.metadata.uid) {
            Some(uid) => PodSeen::Uid(uid),
            None => PodSeen::Gone,
        };
        if let Some(why) = orphaned(&v, &seen, age, grace) {
            release(ctx, &v, &why).await?;
        }
    }
    Ok(())
}

async fn release(ctx: &Context, v: &Volume, why: &str) -> Result<(), Error> {
    let name = v.name_any();
    let vas: Api<VolumeAttachment> = Api::all(ctx.client.clone());
    if let Some(va) = vas
        .get_opt(&name)
        .await
        .context(|| format!("reading VolumeAttachment {name}"))?
    {
        for t in va
            .spec
            .attachment_tickets
            .values()
            .filter(|t| t.type_ == AttacherType::CsiEphemeral)
        {
            match vas
                .patch(
                    &name,
                    &merge_params(),
                    &Patch::<()>::Json(t.remove_if_unchanged_patch()),
                )
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 422 || s.code == 404 => {}
                Err(e) => Err(e).context(|| format!("removing ticket {} from {name}", t.id))?,
            }
        }
    }
    match Api::<Volume>::all(ctx.client.clone())
        .delete(&name, &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => Err(e).context(|| format!("deleting Volume {name}"))?,
    }
    ctx.metrics.tickets_reaped.inc();
    info!(volume = %name, reason = %why, "orphaned inline volume deleted");
    publish(
        ctx,
        v,
        EventType::Warning,
        "InlineVolumeOrphaned",
        &format!("inline volume deleted with its data: {why}"),
    )
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn volume(labels: bool, deleting: bool) -> Volume {
        let mut v: Volume = serde_json::from_value(json!({
            "apiVersion": "tessera.io/v1alpha1", "kind": "Volume",
            "metadata": {
                "name": "inline-x",
                "annotations": {ANNOTATION_INLINE_POD: "apps/web", ANNOTATION_INLINE_POD_UID: "u1"},
            },
            "spec": {"size": "1Mi", "accessMode": "ReadWriteOnce",
                     "backend": {"root": "/r", "scope": "NodeLocal", "node": "n1"}},
        }))
        .unwrap();
        if labels {
            v.labels_mut().insert(LABEL_INLINE.into(), "true".into());
        }
        if deleting {
            v.metadata.deletion_timestamp = Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
            );
        }
        v
    }

    #[test]
    fn an_inline_volume_goes_when_its_pod_does() {
        let (old, young, grace) = (
            Duration::from_secs(60),
            Duration::from_secs(5),
            Duration::from_secs(30),
        );
        let same = PodSeen::Uid("u1".into());
        let other = PodSeen::Uid("u2".into());
        for (v, pod, age, gone) in [
            (volume(true, false), &PodSeen::Gone, old, true),
            (volume(true, false), &other, old, true),
            (volume(true, false), &same, old, false),
            // Within the grace: a Pod being created is not looked at yet.
            (volume(true, false), &PodSeen::Gone, young, false),
            // Not an inline Volume: never.
            (volume(false, false), &PodSeen::Gone, old, false),
            // Being deleted already.
            (volume(true, true), &PodSeen::Gone, old, false),
        ] {
            let why = orphaned(&v, pod, age, grace);
            assert_eq!(why.is_some(), gone, "{pod:?} {age:?}: {why:?}");
            if let Some(why) = why {
                assert!(why.contains("apps/web"), "{why}");
            }
        }
        let mut no_uid = volume(true, false);
        no_uid.annotations_mut().remove(ANNOTATION_INLINE_POD_UID);
        assert_eq!(orphaned(&no_uid, &PodSeen::Gone, old, grace), None);
    }

    /// The Pod `apps/web` (uid u1) on node n1, declaring the inline volume `scratch`
    /// (read-only as given), in `phase`.
    fn pod(read_only: Option<bool>, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"namespace": "apps", "name": "web", "uid": "u1"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}],
                     "volumes": [{"name": "other", "emptyDir": {}},
                                 {"name": "scratch", "csi": {"driver": CSI_DRIVER_NAME, "readOnly": read_only}}]},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn a_recreated_attachment_gets_the_ticket_of_the_pod_that_still_uses_it() {
        let mut v = volume(true, false);
        v.metadata.name = Some(inline_volume_name("u1", "scratch"));
        let name = v.name_any();
        type Change = fn(&mut Pod);
        let table: [(&str, Change, Option<bool>); 9] = [
            ("its running Pod", |_| {}, Some(false)),
            (
                "read-only",
                |p| {
                    p.spec.as_mut().unwrap().volumes.as_mut().unwrap()[1]
                        .csi
                        .as_mut()
                        .unwrap()
                        .read_only = Some(true)
                },
                Some(true),
            ),
            (
                "a Pod being deleted still uses it",
                |p| {
                    p.metadata.deletion_timestamp = Some(
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
                    );
                },
                Some(false),
            ),
            ("another uid", |p| p.metadata.uid = Some("u2".into()), None),
            (
                "another name",
                |p| p.metadata.name = Some("db".into()),
                None,
            ),
            (
                "on another node",
                |p| p.spec.as_mut().unwrap().node_name = Some("n2".into()),
                None,
            ),
            (
                "not scheduled",
                |p| p.spec.as_mut().unwrap().node_name = None,
                None,
            ),
            (
                "ended",
                |p| p.status.as_mut().unwrap().phase = Some("Succeeded".into()),
                None,
            ),
            (
                "another driver's volume of that name",
                |p| {
                    p.spec.as_mut().unwrap().volumes.as_mut().unwrap()[1]
                        .csi
                        .as_mut()
                        .unwrap()
                        .driver = "other.csi".into()
                },
                None,
            ),
        ];
        for (what, change, want) in table {
            let mut p = pod(None, "Running");
            change(&mut p);
            let got = ticket_of_pod(&v, &p);
            assert_eq!(
                got.as_ref().map(|t| t.parameters["readOnly"] == "true"),
                want,
                "{what}"
            );
            if let Some(t) = got {
                assert_eq!(
                    t,
                    inline_ticket(&name, "n1", want.unwrap()),
                    "{what}: what NodePublish wrote"
                );
                assert_eq!(t.type_, AttacherType::CsiEphemeral);
            }
        }
        // Not an inline Volume, or one of another volume of the Pod: nothing.
        assert_eq!(
            ticket_of_pod(&volume(false, false), &pod(None, "Running")),
            None
        );
        assert_eq!(
            ticket_of_pod(&volume(true, false), &pod(None, "Running")),
            None
        );
    }
}
