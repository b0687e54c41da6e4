//! A backend root declared Shared is verified before a node serves it (issue 30), with
//! the real controller and two real node agents: node A sees the root as everyone
//! does; node B's agent runs in a mount namespace of its own where the root is a
//! directory of its own (a bind mount over it), as a node whose "shared" root is a
//! plain directory of its disk. A's ticket is served (A anchors the root: its marker
//! is left there); B's ticket is refused with `BackendNotShared`, nothing is created
//! in B's directory, and a Warning Event names node B and the root.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};

use tessera_api::{MountPhase, MountPod};

use crate::support;
use support::fixtures::{self, AgentProcess, ControllerProcess, eventually};

const WAIT: Duration = Duration::from_secs(60);

/// A root of its own for the test, outside every root the fixtures allow (the first
/// allowed root containing a path is the one whose scope counts), removed on drop.
struct Root(PathBuf);

impl Drop for Root {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn warning_events(client: &kube::Client, reason: &str) -> Vec<Event> {
    Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason) && e.type_.as_deref() == Some("Warning"))
        .collect()
}

#[tokio::test]
async fn a_node_that_does_not_share_a_shared_root_is_refused_and_nothing_is_created_there() {
    let env = support::env::Env::new("notshared", 2, WAIT).await;
    let root = Root(PathBuf::from(format!("/var/lib/tessera/shared-{}", env.id)));
    std::fs::create_dir_all(&root.0).unwrap();
    let declared = format!("--allowed-backend-root={}=Shared", root.0.display());
    let _ctrl = ControllerProcess::alone(&env.id, &[&declared]);
    let a = AgentProcess::start_with(&env.id, &env.nodes[0], std::slice::from_ref(&declared));
    // B's own directory where the root is: empty, and it must stay so.
    let own = support::temp_dir("tessera-own-root-");
    let b = AgentProcess::start_with_private_root(
        &env.id,
        &env.nodes[1],
        &root.0,
        own.path(),
        std::slice::from_ref(&declared),
    );

    let name = env.volume_name("v");
    let vol = fixtures::volume_at(&name, &env.id, "ReadWriteMany", &root.0, true);
    let vol = env.create_volume(&vol).await;

    // A serves it, and leaves the root's marker (A is the first to serve the root).
    env.attach(&vol, "manual-a", "manual", &a.node).await;
    let mp_a = fixtures::mountpod_on(&env.client, &vol, &a.node)
        .await
        .unwrap();
    assert_eq!(
        mp_a.spec.shared_root_anchor.as_deref(),
        Some(a.node.as_str())
    );
    let marker = root.0.join(format!(".tessera-shared-{}", a.node));
    assert!(marker.is_file(), "{} left by A", marker.display());
    std::fs::write(a.mountpoint(&vol).join("on-a"), b"written on A").unwrap();
    assert_eq!(
        std::fs::read(root.0.join(&vol).join("on-a")).unwrap(),
        b"written on A"
    );

    // B's ticket: refused, with the reason on the ticket and on B's MountPod.
    fixtures::put_ticket(
        &env.client,
        &vol,
        "manual-b",
        "manual",
        &b.node,
        serde_json::json!({}),
    )
    .await;
    // (Attaching first, while B's agent tries: the reason that stays is the refusal.)
    let state = eventually(
        WAIT,
        "ticket manual-b refused: BackendNotShared",
        || async {
            fixtures::ticket_states(&env.client, &vol)
                .await
                .remove("manual-b")
                .filter(|s| s.reason == "BackendNotShared" && !s.satisfied)
        },
    )
    .await;
    println!("ticket manual-b: {}", state.message);
    assert!(
        state.message.contains(&b.node) && state.message.contains(&a.node),
        "{}",
        state.message
    );
    let mp_b: MountPod = eventually(WAIT, "B's MountPod refused", || async {
        fixtures::mountpod_on(&env.client, &vol, &b.node)
            .await
            .filter(|mp| {
                mp.status.as_ref().is_some_and(|s| {
                    s.phase == Some(MountPhase::Failed)
                        && s.conditions.iter().any(|c| c.reason == "BackendNotShared")
                })
            })
    })
    .await;
    println!(
        "MountPod on B: {}",
        mp_b.status.unwrap().last_error.unwrap_or_default()
    );
    // The Event names node B and the root.
    let shown = root.0.display().to_string();
    let event = eventually(WAIT, "a Warning Event BackendNotShared", || async {
        warning_events(&env.client, "BackendNotShared")
            .await
            .into_iter()
            .find(|e| {
                let note = e.note.clone().unwrap_or_default();
                note.contains(&b.node) && note.contains(&shown)
            })
    })
    .await;
    println!("Event: {}", event.note.unwrap_or_default());
    // Nothing was created in B's own directory: no volume directory, no marker.
    let left: Vec<_> = std::fs::read_dir(own.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "created on B: {left:?}");
    assert!(!b.mountpoint(&vol).join("on-a").exists());
    // A is not disturbed.
    assert_eq!(
        std::fs::read(a.mountpoint(&vol).join("on-a")).unwrap(),
        b"written on A"
    );
    assert_eq!(
        fixtures::ticket_states(&env.client, &vol).await["manual-a"].reason,
        "Attached"
    );

    fixtures::remove_ticket(&env.client, &vol, "manual-b").await;
    env.detach(&vol, "manual-a", &a.node).await;
    env.cleanup_waiting(&[vol]).await;
    assert!(Path::new(&root.0).is_dir());
}

/// A node without the Shared root at all (the share is not mounted there): its agent
/// runs, its ticket for a Shared volume is refused (`BackendNotShared`: the root does
/// not exist there), even when it asked first (it cannot anchor the root: the next
/// node does), and a NodeLocal volume is served there.
#[tokio::test]
async fn a_node_without_the_shared_root_serves_node_local_volumes_and_refuses_shared_ones() {
    let env = support::env::Env::new("noshare", 2, WAIT).await;
    let parent = Root(PathBuf::from(format!("/var/lib/tessera/shared-{}", env.id)));
    let root = parent.0.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let declared = format!("--allowed-backend-root={}=Shared", root.display());
    let _ctrl = ControllerProcess::alone(&env.id, &[&declared]);
    let a = AgentProcess::start_with(&env.id, &env.nodes[0], std::slice::from_ref(&declared));
    // On B the parent is an empty directory of its own: no root there.
    let empty = support::temp_dir("tessera-no-share-");
    let b = AgentProcess::start_with_private_root(
        &env.id,
        &env.nodes[1],
        &parent.0,
        empty.path(),
        std::slice::from_ref(&declared),
    );

    let name = env.volume_name("v");
    let vol = fixtures::volume_at(&name, &env.id, "ReadWriteMany", &root, true);
    let vol = env.create_volume(&vol).await;
    let refused = |id: &'static str| {
        let (client, vol) = (env.client.clone(), vol.clone());
        async move {
            eventually(WAIT, &format!("ticket {id} refused"), || async {
                fixtures::ticket_states(&client, &vol)
                    .await
                    .remove(id)
                    .filter(|s| s.reason == "BackendNotShared" && !s.satisfied)
            })
            .await
        }
    };
    // B asks first: refused, the root is not there.
    fixtures::put_ticket(
        &env.client,
        &vol,
        "manual-b",
        "manual",
        &b.node,
        serde_json::json!({}),
    )
    .await;
    let state = refused("manual-b").await;
    println!("B first: {}", state.message);
    assert!(
        state.message.contains("does not exist"),
        "{}",
        state.message
    );
    // A then: served (A anchors the root, not B).
    env.attach(&vol, "manual-a", "manual", &a.node).await;
    let mp_a = fixtures::mountpod_on(&env.client, &vol, &a.node)
        .await
        .unwrap();
    assert_eq!(
        mp_a.spec.shared_root_anchor.as_deref(),
        Some(a.node.as_str())
    );
    assert!(root.join(format!(".tessera-shared-{}", a.node)).is_file());
    // B stays refused, and nothing was made in its directory.
    eventually(
        WAIT,
        "B's MountPod names A's anchor and is refused",
        || async {
            fixtures::mountpod_on(&env.client, &vol, &b.node)
                .await
                .filter(|mp| {
                    mp.spec.shared_root_anchor.as_deref() == Some(a.node.as_str())
                        && mp.status.as_ref().is_some_and(|s| {
                            s.phase == Some(MountPhase::Failed)
                                && s.conditions.iter().any(|c| c.reason == "BackendNotShared")
                        })
                })
        },
    )
    .await;
    assert_eq!(std::fs::read_dir(empty.path()).unwrap().count(), 0);

    // A NodeLocal volume on B (under the fixtures' /tmp root) is served there.
    let local_dir = support::temp_dir("tessera-local-");
    let local = env.volume_name("local");
    let mut lv = fixtures::volume_at(&local, &env.id, "ReadWriteOnce", local_dir.path(), true);
    lv.spec.backend.scope = tessera_api::BackendScope::NodeLocal;
    let local = env.create_volume(&lv).await;
    env.attach(&local, "manual-b", "manual", &b.node).await;
    // (B's mount is in B's mount namespace: the test sees its data directory.)
    assert!(local_dir.path().join(&local).is_dir());
    let mp = fixtures::mountpod_on(&env.client, &local, &b.node)
        .await
        .unwrap();
    assert_eq!(mp.spec.shared_root_anchor, None);

    env.detach(&local, "manual-b", &b.node).await;
    fixtures::remove_ticket(&env.client, &vol, "manual-b").await;
    env.detach(&vol, "manual-a", &a.node).await;
    env.cleanup_waiting(&[vol, local]).await;
}
