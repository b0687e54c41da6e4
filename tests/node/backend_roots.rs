//! Backend roots are the node administrator's (issue 13, security item 1), against the
//! real control plane with the real controller and a real node agent: a Volume naming
//! a root outside the allow-list is refused (status condition, Warning Event), never
//! created, mounted or deleted; MountPods made by hand, with a source outside the
//! allowed roots or not owned by their Volume, are refused by the agent (`InvalidSpec`)
//! and nothing is mounted or created.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use tessera_api::{MountPhase, MountPod, Volume, VolumeAttachment};

use crate::support;
use support::fixtures::{self, AgentProcess, ControllerProcess, TEST_LABEL, eventually};

const WAIT: Duration = Duration::from_secs(30);

async fn warnings_about(client: &kube::Client, name: &str, reason: &str) -> usize {
    Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.reason.as_deref() == Some(reason)
                && e.type_.as_deref() == Some("Warning")
        })
        .count()
}

#[tokio::test]
async fn a_volume_naming_a_root_outside_the_allow_list_is_refused() {
    let env = support::env::Env::new("roots", 1, WAIT).await;
    let _ctrl = ControllerProcess::alone(&env.id, &[]);
    let name = env.volume_name("etc");
    let vol = fixtures::volume_at(&name, &env.id, "ReadWriteOnce", Path::new("/etc"), false);
    let volumes: Api<Volume> = Api::all(env.client.clone());
    volumes.create(&PostParams::default(), &vol).await.unwrap();

    let refused = eventually(WAIT, "the Volume says its root is refused", || async {
        let v = volumes.get(&name).await.ok()?;
        let st = v.status.clone()?;
        st.conditions
            .iter()
            .find(|c| c.reason == "BackendRootNotAllowed")
            .map(|c| (c.clone(), v.clone()))
    })
    .await;
    let (cond, v) = refused;
    println!("condition: {}: {}", cond.reason, cond.message);
    assert!(cond.message.contains("/etc"), "{}", cond.message);
    assert!(
        v.finalizers().is_empty(),
        "no finalizer: {:?}",
        v.finalizers()
    );
    eventually(WAIT, "a Warning Event BackendRootNotAllowed", || async {
        (warnings_about(&env.client, &name, "BackendRootNotAllowed").await > 0).then_some(())
    })
    .await;
    // No VolumeAttachment, so no ticket and no MountPod can ever be made for it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let vas: Api<VolumeAttachment> = Api::all(env.client.clone());
    assert!(vas.get_opt(&name).await.unwrap().is_none());
    assert!(!Path::new("/etc").join(&name).exists(), "created in /etc");
    // Deleting it deletes nothing on disk, and it goes at once.
    volumes
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    eventually(WAIT, "the Volume gone", || async {
        volumes
            .get_opt(&name)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    // One status write and one Event, not one per reconcile.
    assert_eq!(
        warnings_about(&env.client, &name, "BackendRootNotAllowed").await,
        1
    );
    env.cleanup(&[]).await;
}

/// A MountPod written by hand for this node, as an attacker with MountPod rights
/// would.
fn hand_made(
    env: &support::env::Env,
    name: &str,
    volume: &str,
    source: &str,
    owner: Option<&Volume>,
) -> MountPod {
    let owners = match owner {
        Some(v) => {
            json!([{"apiVersion": "tessera.io/v1alpha1", "kind": "Volume", "name": v.name_any(),
                           "uid": v.uid().unwrap(), "controller": true}])
        }
        None => json!([]),
    };
    serde_json::from_value(json!({
        "apiVersion": "tessera.io/v1alpha1", "kind": "MountPod",
        "metadata": {"name": name, "ownerReferences": owners, "labels": {
            TEST_LABEL: env.id, "tessera.io/node": env.nodes[0], "tessera.io/volume": volume}},
        "spec": {"volume": volume, "nodeName": env.nodes[0], "source": source,
                 "capacityBytes": 1048576},
    }))
    .unwrap()
}

#[tokio::test]
async fn the_agent_refuses_mountpods_outside_the_allowed_roots_or_not_owned() {
    let env = support::env::Env::new("roots-mp", 1, WAIT).await;
    let agent = AgentProcess::start(&env.id, &env.nodes[0]);
    let backend = support::temp_dir("tessera-backend-");
    // A Volume of an allowed root (no controller runs: nothing else writes MountPods).
    let owner_name = env.volume_name("owner");
    let owner = Api::<Volume>::all(env.client.clone())
        .create(
            &PostParams::default(),
            &fixtures::volume_at(&owner_name, &env.id, "ReadWriteOnce", backend.path(), true),
        )
        .await
        .unwrap();
    let victim = format!("/etc/{}", env.volume_name("x"));
    let cases = [
        // Owned by its Volume, but the source is outside every allowed root.
        ("etc", owner_name.clone(), victim.clone(), Some(&owner)),
        // Under an allowed root, but made by hand: no owner.
        (
            "unowned",
            env.volume_name("unowned"),
            backend
                .path()
                .join(env.volume_name("unowned"))
                .display()
                .to_string(),
            None,
        ),
        // Owned, under an allowed root, but the root itself, not the volume's directory.
        (
            "root",
            owner_name.clone(),
            backend.path().display().to_string(),
            Some(&owner),
        ),
    ];
    let api: Api<MountPod> = Api::all(env.client.clone());
    let mut names = vec![];
    for (suffix, volume, source, owner) in cases {
        let name = format!("{}-{suffix}", env.id);
        api.create(
            &PostParams::default(),
            &hand_made(&env, &name, &volume, &source, owner),
        )
        .await
        .unwrap();
        let mp = eventually(WAIT, &format!("MountPod {suffix} refused"), || async {
            let mp = api.get(&name).await.ok()?;
            let st = mp.status.clone()?;
            (st.phase == Some(MountPhase::Failed)
                && st.conditions.iter().any(|c| c.reason == "InvalidSpec"))
            .then_some(mp)
        })
        .await;
        println!(
            "{suffix}: {}",
            mp.status.unwrap().last_error.unwrap_or_default()
        );
        names.push(name);
    }
    assert!(!Path::new(&victim).exists(), "{victim} created");
    assert!(
        !backend.path().join(env.volume_name("unowned")).exists(),
        "an unowned MountPod's source was created"
    );
    for volume in [owner_name.clone(), env.volume_name("unowned")] {
        assert!(
            fixtures::mounts_at(&agent.mountpoint(&volume)).is_empty(),
            "{volume} mounted"
        );
    }
    for name in &names {
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
    for name in &names {
        eventually(WAIT, "hand-made MountPod gone", || async {
            api.get_opt(name).await.unwrap().is_none().then_some(())
        })
        .await;
    }
    fixtures::delete_volumes(&env.client, &[owner_name]).await;
    env.cleanup(&[]).await;
}

/// A Shared Volume on a root the administrator declared NodeLocal (issue 30): refused
/// like a root not allowed (Faulted, Stalled, one Warning Event), with the reason
/// `BackendScopeMismatch`; a NodeLocal Volume on the same root is served.
#[tokio::test]
async fn a_shared_volume_on_a_node_local_root_is_refused() {
    let env = support::env::Env::new("scope", 1, WAIT).await;
    let root = format!("/var/lib/tessera/local-{}", env.id);
    let declared = format!("--allowed-backend-root={root}=NodeLocal");
    let _ctrl = ControllerProcess::alone(&env.id, &[&declared]);
    let volumes: Api<Volume> = Api::all(env.client.clone());
    let shared = env.volume_name("shared");
    let vol = fixtures::volume_at(&shared, &env.id, "ReadWriteOnce", Path::new(&root), false);
    volumes.create(&PostParams::default(), &vol).await.unwrap();
    let cond = eventually(WAIT, "the Volume says its scope is refused", || async {
        let v = volumes.get(&shared).await.ok()?;
        v.status?
            .conditions
            .into_iter()
            .find(|c| c.reason == "BackendScopeMismatch" && c.type_ == "Stalled")
    })
    .await;
    println!("condition: {}", cond.message);
    assert!(
        cond.message.contains(&root) && cond.message.contains("NodeLocal"),
        "{}",
        cond.message
    );
    eventually(WAIT, "a Warning Event BackendScopeMismatch", || async {
        (warnings_about(&env.client, &shared, "BackendScopeMismatch").await > 0).then_some(())
    })
    .await;
    let vas: Api<VolumeAttachment> = Api::all(env.client.clone());
    assert!(vas.get_opt(&shared).await.unwrap().is_none());
    assert!(volumes.get(&shared).await.unwrap().finalizers().is_empty());

    // NodeLocal on the same root: accepted (its VolumeAttachment is made).
    let local = env.volume_name("local");
    let mut vol = fixtures::volume_at(&local, &env.id, "ReadWriteOnce", Path::new(&root), true);
    vol.spec.backend.scope = tessera_api::BackendScope::NodeLocal;
    env.create_volume(&vol).await;
    fixtures::delete_volumes(&env.client, std::slice::from_ref(&shared)).await;
    env.cleanup(&[local]).await;
}
