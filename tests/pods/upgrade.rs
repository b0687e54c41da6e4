//! A mount image upgrade breaks no write (issue 14, third case): an application writes
//! through one open descriptor on a Tessera volume while Tessera is upgraded to a new
//! image (the same binary under a new tag in the nodes' containerd, which proves the
//! mechanism): `kubectl set image` of the node agent's DaemonSet rolls the agent (which
//! touches no mount), and the new agent, whose mount image is its own, replaces the
//! mount Pod through the /dev/fuse handoff: the old daemon leaves the connection to
//! the fd holder (SIGUSR2, then its Pod's deletion), a new mount Pod of the new image
//! takes it over. The mount Pod then runs the new image, the mount is the same (its id
//! in the node's mountinfo unchanged), no write failed, the app never restarted, and
//! every record is in the backend, in order; the MountPod says `Upgraded`.

use k8s_openapi::api::core::v1::Event;

use tessera_api::MountPod;
use tessera_node::pods::spec::{pod_name, standby_name};

use super::daemon_kill::{NS, begin, daemon_pid};
use super::writer;
use super::*;

/// The node agent's DaemonSet and its container.
const DS: &str = "daemonset/tessera-node";
const CONTAINER: &str = "tessera";

/// Tag `from` as `to` in every node's containerd (the images are loaded offline; no
/// registry).
fn tag_on_nodes(nodes: &Nodes, from: &str, to: &str) {
    let ctr = support::repo_root().join("target/harness/bin/ctr");
    for node in nodes.names() {
        let socket = nodes.var(&node, "_CONTAINERD");
        let out = std::process::Command::new(&ctr)
            .args([
                "--address",
                &socket,
                "-n",
                "k8s.io",
                "images",
                "tag",
                "--force",
            ])
            .args([from, to])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ctr images tag on {node}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Puts the agent's image back when the test ends, passed or not.
struct Restore(String);

impl Drop for Restore {
    fn drop(&mut self) {
        let image = format!("{CONTAINER}={}", self.0);
        let _ = support::kubectl()
            .args(["-n", NS, "set", "image", DS, &image])
            .output();
        let _ = support::kubectl()
            .args(["-n", NS, "rollout", "status", DS, "--timeout=180s"])
            .output();
    }
}

/// The reasons and notes of the Events about MountPod `name`.
async fn events_of(client: &Client, name: &str) -> Vec<(String, String)> {
    let lp = ListParams::default().fields(&format!(
        "involvedObject.kind=MountPod,involvedObject.name={name}"
    ));
    let mut found = Vec::new();
    for api in [
        Api::<Event>::all(client.clone()),
        Api::<Event>::namespaced(client.clone(), "default"),
    ] {
        for e in api.list(&lp).await.map(|l| l.items).unwrap_or_default() {
            found.push((e.reason.unwrap_or_default(), e.message.unwrap_or_default()));
        }
    }
    found
}

#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn a_mount_image_upgrade_breaks_no_write() {
    let client = support::client().await;
    let c = begin(&client, "pods-upgrade").await;
    let (nodes, ns, node, vol, data, uid) = (&c.nodes, &c.ns, &c.node, &c.vol, &c.data, &c.uid);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let name = pod_name(vol, node);
    let image_of = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.image.clone())
            .unwrap_or_default()
    };
    let old = image_of(&pods.get(&name).await.unwrap());
    let agent_image = kubectl_output(&[
        "-n",
        NS,
        "get",
        DS,
        "-o",
        &format!("jsonpath={{.spec.template.spec.containers[?(@.name==\"{CONTAINER}\")].image}}"),
    ]);
    assert_eq!(old, agent_image, "the mount Pod runs the agent's image");
    let new = format!("{old}-upgrade");
    // The successor starts beside it, as a standby, under the other name.
    let standby = standby_name(vol, node, &new);
    let mp_name = tessera_api::mountpod_name(vol, node);
    let mps: Api<MountPod> = Api::all(client.clone());
    let restarts = |m: &MountPod| m.status.as_ref().map(|s| s.restarts).unwrap_or(0);
    let restarts_before = restarts(&mps.get(&mp_name).await.unwrap());

    tag_on_nodes(nodes, &old, &new);
    let _restore = Restore(old.clone());
    let begun = Instant::now();
    kubectl_output(&["-n", NS, "set", "image", DS, &format!("{CONTAINER}={new}")]);
    kubectl_output(&["-n", NS, "rollout", "status", DS, "--timeout=180s"]);
    let rolled = begun.elapsed();
    // The app first: it keeps writing, or it failed (the mount was lost).
    let upgraded = eventually(WAIT, "the mount Pod of the new image", || async {
        writer::fail_if_failed(&client, ns, "app", "during the upgrade").await;
        let p = pods.get_opt(&standby).await.ok().flatten()?;
        let status = p.status.as_ref()?;
        let ready = status
            .container_statuses
            .as_ref()?
            .first()
            .is_some_and(|c| c.ready);
        (image_of(&p) == new && ready).then(|| p.uid().unwrap_or_default())
    })
    .await;
    let took = begun.elapsed();
    assert_ne!(upgraded, *uid, "the same mount Pod");
    eventually(WAIT, "the old mount Pod gone", || async {
        pods.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await;
    let successor = daemon_pid(vol, &upgraded).expect("the new mount daemon");
    assert_ne!(successor, c.pid);
    assert!(daemon_pid(vol, uid).is_none(), "the old daemon still runs");
    writer::wait_records(data, 40).await;
    writer::assert_undisturbed(&client, ns, "app").await;
    // The agent reports it: Ready, the new image, no repair counted, Event Upgraded.
    let mp = eventually(WAIT, "the MountPod on the new image", || async {
        let mp = mps.get(&mp_name).await.ok()?;
        let image = mp.status.as_ref()?.image.clone()?;
        (image == new && mp.is_ready()).then_some(mp)
    })
    .await;
    assert_eq!(
        restarts(&mp),
        restarts_before,
        "the upgrade counted as a repair"
    );
    let events = events_of(&client, &mp_name).await;
    let upgraded_event = events
        .iter()
        .find(|(reason, _)| reason == "Upgraded")
        .unwrap_or_else(|| panic!("no Upgraded Event: {events:?}"));
    assert!(
        upgraded_event.1.contains(&old) && upgraded_event.1.contains(&new),
        "{upgraded_event:?}"
    );
    let mounts_after = c.mounts();
    assert_eq!(
        c.mounts_before, mounts_after,
        "the mount was replaced, not taken over"
    );
    let checked = c.finish(&client).await;
    eprintln!("Upgraded: {}", upgraded_event.1);
    eprintln!(
        "REAL NODES mount image upgrade: {} records through one descriptor, none failed; \
         same mount (ids {:?}); agent rolled in {:.1} s, mount Pod on the new image {:.1} s after \
         `set image`; longest write stall {:.0} ms (record {})",
        checked.records,
        mounts_after.iter().map(|m| &m.0).collect::<Vec<_>>(),
        rolled.as_secs_f64(),
        took.as_secs_f64(),
        checked.longest_write * 1000.0,
        checked.longest_at
    );
}
