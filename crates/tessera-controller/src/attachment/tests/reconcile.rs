//! The reconcile, end to end against a scripted API server: which requests it makes,
//! in which order, what it does with the replies, which Events it publishes and when
//! it comes back. The caches are filled once ([`Caches::filled`]); the clock is real
//! (no ticket here expires, so the requeues do not depend on it).

use std::sync::Arc;

use kube::Client;
use kube::runtime::controller::Action;
use serde_json::{Value, json};

use tessera_api::ATTACHMENT_FINALIZER;
use tessera_host::roots::AllowedRoots;
use tessera_runtime::metrics::Metrics;

use super::scripted::{Transcript, at, expect, serve};
use super::*;
use crate::attachment::{Ctx, plan, reconcile};
use crate::{Caches, Context};

const VA_STATUS: &str = "/apis/tessera.io/v1alpha1/volumeattachments/v/status";
const VA_OBJECT: &str = "/apis/tessera.io/v1alpha1/volumeattachments/v";
const VOLUME_STATUS: &str = "/apis/tessera.io/v1alpha1/volumes/v/status";

fn mountpod_path(node: &str) -> String {
    format!(
        "/apis/tessera.io/v1alpha1/mountpods/{}",
        api::mountpod_name("v", node)
    )
}

/// The attachment controller on `client`, its caches holding these objects, nodes n1
/// and n2 with an agent each.
fn controller(
    client: Client,
    volume: Option<&Volume>,
    va: &VolumeAttachment,
    mountpods: &[MountPod],
) -> Arc<Ctx> {
    let caches = Caches::filled(
        volume.cloned(),
        [va.clone()],
        mountpods.to_vec(),
        &["n1", "n2"],
        &["n1", "n2"],
    );
    let shared = Context::new(
        client,
        Arc::new(Metrics::controller()),
        None,
        caches,
        Labels::default(),
        AllowedRoots::new(["/b"]).expect("an allowed root"),
    );
    Arc::new(Ctx::new(Arc::new(shared), Default::default()))
}

/// An RWO volume at resourceVersion 1.
fn rwo() -> Volume {
    let mut v = volume(AccessMode::ReadWriteOnce);
    v.metadata.resource_version = Some("1".into());
    v
}

/// Its VolumeAttachment at resourceVersion 1 with these tickets and the protection
/// finalizer, no status yet.
fn attachment(tickets: &[AttachmentTicket]) -> VolumeAttachment {
    let mut va = va(tickets);
    va.metadata.resource_version = Some("1".into());
    va.metadata.finalizers = Some(vec![ATTACHMENT_FINALIZER.into()]);
    va
}

/// The MountPod the controller wants for `volume` on `node`, mounted and ready.
fn ready_mountpod(volume: &Volume, node: &str) -> MountPod {
    let mut mp = mountpod(node, Some(MountPhase::Ready));
    mp.spec = desired_spec(volume, node, false, MountTask::Serve).expect("a servable Volume");
    // The volume is Shared (under /b): its MountPods name the root's anchor, here n1.
    mp.spec.shared_root_anchor = Some("n1".into());
    mp.metadata.uid = Some(format!("uid-mp-{node}"));
    mp.metadata.resource_version = Some("1".into());
    mp
}

/// `obj` as the API server answers a write: at resourceVersion 2.
fn written<T: kube::Resource + serde::Serialize>(obj: &T) -> Value {
    let mut v = serde_json::to_value(obj).expect("JSON");
    v["metadata"]["resourceVersion"] = json!("2");
    v
}

fn assert_clean(t: &Transcript) {
    assert!(t.errors.is_empty(), "departures from the script: {t:#?}");
    assert_eq!(t.left, 0, "scripted requests not made: {t:#?}");
}

/// The status write of a re-checked decision is refused (409: the tickets changed
/// since they were read): nothing else is written, no Event, back soon.
#[tokio::test]
async fn a_conflict_on_the_attachment_status_write_ends_the_reconcile() {
    let volume = rwo();
    let va = attachment(&[ticket("t1", AttacherType::CsiAttacher, "n1")]);
    let mps = [ready_mountpod(&volume, "n1")];
    let (client, server) = serve(vec![
        // Newly satisfied on a single-node volume: re-checked (one ticket, its own
        // node: nothing to read), the write carries the resourceVersion read.
        expect("PATCH", VA_STATUS)
            .body(at("/metadata/resourceVersion", json!("1")))
            .fail(409, "Conflict"),
    ]);
    let ctx = controller(client, Some(&volume), &va, &mps);
    let va_read = va.clone();
    let action = reconcile(Arc::new(va), ctx.clone())
        .await
        .expect("no error");
    let t = server.finish(0).await;
    assert_clean(&t);
    assert_eq!(t.requests(), [format!("PATCH {VA_STATUS}")]);
    assert!(t.events().is_empty(), "{t:#?}");
    assert_eq!(action, Action::requeue(plan::AFTER_CONFLICT));
    // The refused write is not taken for written: the next reconcile sees the
    // VolumeAttachment as the cache shows it.
    let seen = ctx
        .shared
        .written_attachments
        .view("v", Some(Arc::new(va_read)));
    assert_eq!(
        seen.and_then(|va| va.metadata.resource_version.clone()),
        Some("1".into())
    );
}

/// A MountPod the cache still shows on another node is gone when the re-check reads
/// it (404): the statuses are written on the decision taken again without it, the
/// VolumeAttachment's first (with the resourceVersion read), then the Volume's.
#[tokio::test]
async fn a_mountpod_gone_at_the_recheck_is_decided_without() {
    let volume = rwo();
    let va = attachment(&[ticket("t1", AttacherType::CsiAttacher, "n1")]);
    // n2's MountPod, deleted long ago (a slow detach), still in the cache.
    let mut stale = deleting(ready_mountpod(&volume, "n2"));
    stale.metadata.deletion_timestamp = Some(t(5));
    let mps = [ready_mountpod(&volume, "n1"), stale];
    let (client, server) = serve(vec![
        expect("GET", mountpod_path("n2")).fail(404, "NotFound"),
        expect("PATCH", VA_STATUS)
            .body(|b: &Value| {
                at("/metadata/resourceVersion", json!("1"))(b)?;
                at("/status/attachmentTicketStatuses/t1/satisfied", json!(true))(b)
            })
            .ok(written(&va)),
        expect("PATCH", VOLUME_STATUS).ok(written(&volume)),
    ]);
    let ctx = controller(client, Some(&volume), &va, &mps);
    let action = reconcile(Arc::new(va), ctx).await.expect("no error");
    let t = server.finish(3).await;
    assert_clean(&t);
    assert_eq!(
        t.requests(),
        [
            format!("GET {}", mountpod_path("n2")),
            format!("PATCH {VA_STATUS}"),
            format!("PATCH {VOLUME_STATUS}"),
        ]
    );
    // The slow detach of n2 is reported; the Volume is attached on n1 (and, as the
    // cache shows it, still mounted on n2).
    assert_eq!(
        t.events(),
        [
            "EVENT Attached on Volume",
            "EVENT Attaching on Volume",
            "EVENT Detaching on Volume"
        ]
    );
    assert_eq!(action, Action::requeue(plan::SAFETY_NET));
}

/// A VolumeAttachment being deleted with no workload ticket satisfied: the statuses
/// (both at once, the VolumeAttachment's sent first), then the finalizer goes.
#[tokio::test]
async fn a_deleted_attachment_no_workload_holds_lets_go_after_its_statuses() {
    let volume = rwo();
    let va = deleting(attachment(&[]));
    let (client, server) = serve(vec![
        expect("PATCH", VA_STATUS)
            .body(|b: &Value| match b.get("metadata") {
                None => Ok(()),
                Some(m) => Err(format!("a precondition without a re-check: {m}")),
            })
            .ok(written(&va)),
        expect("PATCH", VOLUME_STATUS).ok(written(&volume)),
        expect("PATCH", VA_OBJECT)
            .body(|b: &Value| {
                let want = json!([
                    {"op": "test", "path": "/metadata/finalizers/0", "value": ATTACHMENT_FINALIZER},
                    {"op": "remove", "path": "/metadata/finalizers/0"},
                ]);
                (*b == want).then_some(()).ok_or(format!("{b}"))
            })
            .ok(written(&va)),
    ]);
    let ctx = controller(client, Some(&volume), &va, &[]);
    let action = reconcile(Arc::new(va), ctx).await.expect("no error");
    let t = server.finish(0).await;
    assert_clean(&t);
    assert_eq!(
        t.requests(),
        [
            format!("PATCH {VA_STATUS}"),
            format!("PATCH {VOLUME_STATUS}"),
            format!("PATCH {VA_OBJECT}"),
        ]
    );
    assert!(t.events().is_empty(), "{t:#?}");
    assert_eq!(action, Action::requeue(plan::SAFETY_NET));
}

/// A VolumeAttachment being deleted while a workload ticket is satisfied: the
/// statuses are written (re-checked: one after the other), the finalizer stays, and a
/// DeletionBlocked Warning goes on the Volume and the VolumeAttachment, after the
/// writes.
#[tokio::test]
async fn a_deleted_attachment_a_workload_holds_stays_and_says_so() {
    let volume = rwo();
    let va = deleting(attachment(&[ticket("t1", AttacherType::CsiAttacher, "n1")]));
    let mps = [ready_mountpod(&volume, "n1")];
    let (client, server) = serve(vec![
        expect("PATCH", VA_STATUS)
            .body(at("/metadata/resourceVersion", json!("1")))
            .ok(written(&va)),
        expect("PATCH", VOLUME_STATUS).ok(written(&volume)),
    ]);
    let ctx = controller(client, Some(&volume), &va, &mps);
    let action = reconcile(Arc::new(va), ctx).await.expect("no error");
    let t = server.finish(3).await;
    assert_clean(&t);
    assert_eq!(
        t.requests(),
        [
            format!("PATCH {VA_STATUS}"),
            format!("PATCH {VOLUME_STATUS}")
        ]
    );
    assert_eq!(
        t.events(),
        [
            "EVENT Attached on Volume",
            "EVENT DeletionBlocked on Volume",
            "EVENT DeletionBlocked on VolumeAttachment",
        ]
    );
    assert!(t.events_last(), "{t:#?}");
    assert_eq!(action, Action::requeue(plan::SAFETY_NET));
}

/// The write of the VolumeAttachment status fails otherwise (500): an error (the
/// error policy's backoff), and after a re-check the Volume status is not written.
#[tokio::test]
async fn a_failed_attachment_status_write_after_a_recheck_writes_nothing_else() {
    let volume = rwo();
    let va = attachment(&[ticket("t1", AttacherType::CsiAttacher, "n1")]);
    let mps = [ready_mountpod(&volume, "n1")];
    let (client, server) = serve(vec![expect("PATCH", VA_STATUS).fail(500, "InternalError")]);
    let ctx = controller(client, Some(&volume), &va, &mps);
    let res = reconcile(Arc::new(va), ctx).await;
    let t = server.finish(0).await;
    assert_clean(&t);
    assert!(res.is_err(), "{res:?}");
    assert_eq!(t.requests(), [format!("PATCH {VA_STATUS}")]);
}

/// A new attach: the MountPod is created (POST), decided again on it (not ready yet:
/// nothing to say within the quiet time), and nothing else is written.
#[tokio::test]
async fn a_new_attach_creates_its_mountpod_and_waits_quietly() {
    let volume = rwo();
    let va = attachment(&[ticket("t1", AttacherType::CsiAttacher, "n1")]);
    let mut created = mountpod("n1", None);
    created.spec = desired_spec(&volume, "n1", false, MountTask::Serve).unwrap();
    created.metadata.resource_version = Some("2".into());
    let (client, server) = serve(vec![
        expect("POST", "/apis/tessera.io/v1alpha1/mountpods")
            .body(at("/spec/nodeName", json!("n1")))
            .ok(serde_json::to_value(&created).unwrap()),
    ]);
    let ctx = controller(client, Some(&volume), &va, &[]);
    let action = reconcile(Arc::new(va), ctx).await.expect("no error");
    let t = server.finish(0).await;
    assert_clean(&t);
    assert_eq!(t.requests(), ["POST /apis/tessera.io/v1alpha1/mountpods"]);
    // Back when the attach may be slow: its quiet time (one attach under way, none
    // done lately: the shortest) from this reconcile, when the ticket was first seen.
    let quiet = crate::pace::ATTACH_QUIET;
    assert_eq!(action, Action::requeue(quiet + plan::PAST_WAIT));
}

/// Tickets applied before their Volume: the VolumeAttachment status says so (no
/// precondition), nothing else; back when the Volume comes (its watch).
#[tokio::test]
async fn tickets_without_a_volume_are_told_so() {
    let va = attachment(&[ticket("t1", AttacherType::CsiAttacher, "n1")]);
    let (client, server) = serve(vec![
        expect("PATCH", VA_STATUS)
            .body(|b: &Value| match b.get("metadata") {
                None => Ok(()),
                Some(m) => Err(format!("a precondition: {m}")),
            })
            .ok(written(&va)),
    ]);
    // The caches hold no Volume.
    let ctx = controller(client, None, &va, &[]);
    let action = reconcile(Arc::new(va), ctx).await.expect("no error");
    let t = server.finish(0).await;
    assert_clean(&t);
    assert_eq!(t.requests(), [format!("PATCH {VA_STATUS}")]);
    assert_eq!(action, Action::await_change());
}

/// A node-local volume with no node yet is pinned to the first node chosen for it
/// (a merge patch of its spec), and nothing else is done before it is decided again.
#[tokio::test]
async fn a_node_local_volume_is_pinned_first() {
    let mut volume = rwo();
    volume.spec.backend.scope = BackendScope::NodeLocal;
    let va = attachment(&[ticket("t1", AttacherType::CsiAttacher, "n2")]);
    let mut pinned = volume.clone();
    pinned.spec.backend.node = Some("n2".into());
    let (client, server) = serve(vec![
        expect("PATCH", "/apis/tessera.io/v1alpha1/volumes/v")
            .body(at("/spec/backend/node", json!("n2")))
            .ok(written(&pinned)),
    ]);
    let ctx = controller(client, Some(&volume), &va, &[]);
    let action = reconcile(Arc::new(va), ctx.clone())
        .await
        .expect("no error");
    let t = server.finish(0).await;
    assert_clean(&t);
    assert_eq!(t.requests(), ["PATCH /apis/tessera.io/v1alpha1/volumes/v"]);
    assert_eq!(action, Action::requeue(plan::AFTER_PIN));
    // The next reconcile sees the pin before the cache does.
    let seen = ctx.shared.written_volumes.view("v", Some(Arc::new(volume)));
    let seen = seen.expect("the Volume");
    assert_eq!(seen.spec.backend.node.as_deref(), Some("n2"));
}

/// A restore ticket on a Volume the cache does not yet show populated (the mark was
/// just written; its watch event is behind the ticket's): the Volume is read before
/// its Populate MountPod is created, and the MountPod carries no source to copy, so
/// data written since the fill is never replaced (CI saw the second fill run).
#[tokio::test]
async fn a_fill_reads_the_volume_before_it_copies_into_it() {
    let mut volume = rwo();
    volume.spec.data_source = Some(tessera_api::DataSource {
        volume: "src".into(),
        source: "/b/src".into(),
    });
    let va = attachment(&[ticket("again", AttacherType::VolumeRestore, "n1")]);
    let mut populated = volume.clone();
    populated
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(api::ANNOTATION_POPULATED.into(), "true".into());
    populated.metadata.resource_version = Some("2".into());
    let mut created = mountpod("n1", None);
    created.spec = desired_spec(&populated, "n1", false, MountTask::Populate).unwrap();
    created.metadata.resource_version = Some("2".into());
    let (client, server) = serve(vec![
        expect("GET", "/apis/tessera.io/v1alpha1/volumes/v").ok(written(&populated)),
        expect("POST", "/apis/tessera.io/v1alpha1/mountpods")
            .body(|b: &Value| {
                at("/spec/task", json!("Populate"))(b)?;
                match b.pointer("/spec/populateFrom") {
                    None => Ok(()),
                    Some(f) => Err(format!("a populated volume filled again from {f}")),
                }
            })
            .ok(serde_json::to_value(&created).unwrap()),
    ]);
    let ctx = controller(client, Some(&volume), &va, &[]);
    reconcile(Arc::new(va), ctx).await.expect("no error");
    let t = server.finish(0).await;
    assert_clean(&t);
    assert_eq!(
        t.requests(),
        [
            "GET /apis/tessera.io/v1alpha1/volumes/v",
            "POST /apis/tessera.io/v1alpha1/mountpods"
        ]
    );
}
