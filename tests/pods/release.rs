//! Upgrades between releases under a writing Pod (issue 31): the previous release
//! (its chart as published and its `config/`, kept in tests/upgrade/) installed as a
//! user installs it, images pulled from the harness registry; an application writing
//! through one open descriptor; then the upgrade the docs give, `helm upgrade
//! --reset-then-reuse-values` or `kubectl apply -k config/`. Every Tessera workload
//! rolls to the new image, the mount's daemon is replaced through the handoff (the
//! same mount, Event `Upgraded`), and the application sees no failed write.
//!
//! ```text
//!  helm.sh previous ─▶ release 0.1.0 ─▶ claim + writer (daemon_kill::begin)
//!  helm.sh upgrade  ─▶ controller, agents, fd holders on the new image
//!                   ─▶ agent: standby mount Pod of the new image takes the mount over
//!  helm.sh verify   ─▶ values kept, CRDs upgraded, policies in force, images pulled
//!  helm.sh rollback ─▶ back to the previous release, the mount handed back
//!  writer stopped ─▶ every record in the backend, in order, none failed
//! ```
//!
//! Run by tests/run.sh after the Helm install test, `helm` first, then `kustomize`,
//! which leaves this checkout's `config/` deployed (from the registry) for the failover
//! tests. The previous release's image is this checkout's binary under the previous
//! tag (none was published): what is tested is the chart, the manifests and the
//! rollout, not a protocol change between two binaries (tests/upgrade/README.md).

use k8s_openapi::api::core::v1::Event;

use tessera_api::MountPod;

use super::daemon_kill::{Case, NS, begin};
use super::writer;
use super::*;

/// The previous release: the version in tests/upgrade/'s chart package name.
fn previous() -> String {
    let dir = support::repo_root().join("tests/upgrade");
    let mut versions: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            Some(
                name.strip_prefix("tessera-")?
                    .strip_suffix(".tgz")?
                    .to_owned(),
            )
        })
        .collect();
    versions.sort();
    versions.pop().expect("a chart package in tests/upgrade/")
}

/// The harness registry (registry.env of the nodes' cluster).
fn registry() -> String {
    let env = std::fs::read_to_string(cluster_dir().join("registry.env"))
        .expect("the harness registry (registry.env)");
    env.lines()
        .find_map(|l| l.strip_prefix("TESSERA_REGISTRY="))
        .expect("TESSERA_REGISTRY in registry.env")
        .to_owned()
}

/// Run a harness script with `args` and `env`; panic with its name if it fails.
fn harness(script: &str, args: &[&str], env: &[(&str, &str)]) {
    let begun = Instant::now();
    let status = std::process::Command::new("bash")
        .arg(support::repo_root().join("tests/harness").join(script))
        .args(args)
        .envs(env.iter().copied())
        .status()
        .unwrap_or_else(|e| panic!("running {script}: {e}"));
    assert!(status.success(), "{script} {args:?}: {status}");
    eprintln!(
        "{script} {} took {:.1} s",
        args.join(" "),
        begun.elapsed().as_secs_f64()
    );
}

/// The image of the mount Pod's first container.
fn image_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

/// After the workloads rolled to `new`: the mount's daemon replaced through the
/// handoff, the app still writing. Returns the `Upgraded` Event's note.
async fn mount_upgraded(client: &Client, c: &Case, old: &str, new: &str) -> String {
    let mps: Api<MountPod> = Api::all(client.clone());
    let mp_name = tessera_api::mountpod_name(&c.vol, &c.node);
    let mp = eventually(WAIT, "the MountPod on the new image", || async {
        writer::fail_if_failed(client, &c.ns, "app", "during the upgrade").await;
        let mp = mps.get(&mp_name).await.ok()?;
        let image = mp.status.as_ref()?.image.clone()?;
        (image == new && mp.is_ready()).then_some(mp)
    })
    .await;
    let serving = Api::<Pod>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels("app.kubernetes.io/component=mount"))
        .await
        .unwrap()
        .items;
    let images: Vec<String> = serving.iter().map(image_of).collect();
    assert!(
        images.iter().all(|i| i == new),
        "mount Pods not on {new}: {images:?}"
    );
    assert_eq!(mp.status.as_ref().map(|s| s.restarts), Some(0), "a repair");
    let lp = ListParams::default().fields(&format!(
        "involvedObject.kind=MountPod,involvedObject.name={mp_name},reason=Upgraded"
    ));
    let upgraded = eventually(WAIT, "the Event Upgraded", || async {
        let events = Api::<Event>::all(client.clone()).list(&lp).await.ok()?;
        events.items.into_iter().find_map(|e| e.message)
    })
    .await;
    assert!(
        upgraded.contains(old) && upgraded.contains(new),
        "Upgraded says: {upgraded}"
    );
    assert_eq!(
        c.mounts_before,
        c.mounts(),
        "the mount was replaced, not taken over"
    );
    writer::wait_records(&c.data, 40).await;
    writer::assert_undisturbed(client, &c.ns, "app").await;
    upgraded
}

#[tokio::test]
#[ignore = "needs real nodes and the harness registry (tests/run.sh, after the Helm test)"]
async fn helm_upgrade_from_the_previous_release_breaks_no_write() {
    let (prev, reg) = (previous(), registry());
    let version = env!("CARGO_PKG_VERSION");
    let (old, new) = (
        format!("{reg}/tessera:{prev}"),
        format!("{reg}/tessera:{version}"),
    );
    harness("helm.sh", &["previous"], &[]);
    let client = support::client().await;
    let c = begin(&client, "pods-release-helm").await;
    let begun = Instant::now();
    harness("helm.sh", &["upgrade"], &[]);
    let rolled = begun.elapsed();
    let upgraded = mount_upgraded(&client, &c, &old, &new).await;
    let took = begun.elapsed();
    harness("helm.sh", &["verify", &c.vol], &[]);
    // And back: `helm rollback` to the previous release, the mount handed back.
    let back = Instant::now();
    harness("helm.sh", &["rollback"], &[]);
    mount_upgraded(&client, &c, &new, &old).await;
    let back = back.elapsed();
    let checked = c.finish(&client).await;
    harness("helm.sh", &["down"], &[]);
    eprintln!("Upgraded: {upgraded}");
    eprintln!(
        "REAL NODES helm upgrade {prev} → {version} (chart from the registry), then helm \
         rollback: {} records through one descriptor, none failed; workloads rolled in \
         {:.1} s, the mount on the new image {:.1} s after `helm upgrade`, back on the old \
         one {:.1} s after `helm rollback`; longest write stall {:.0} ms",
        checked.records,
        rolled.as_secs_f64(),
        took.as_secs_f64(),
        back.as_secs_f64(),
        checked.longest_write * 1000.0,
    );
}

#[tokio::test]
#[ignore = "needs real nodes and the harness registry (tests/run.sh, after the Helm test)"]
async fn kustomize_upgrade_from_the_previous_release_breaks_no_write() {
    let (prev, reg) = (previous(), registry());
    let version = env!("CARGO_PKG_VERSION");
    let (old, new) = (
        format!("{reg}/tessera:{prev}"),
        format!("{reg}/tessera:{version}"),
    );
    // The previous release's config/ (and the crds/ it names), unpacked.
    let unpacked = cluster_dir().join("upgrade").join(&prev);
    let _ = std::fs::remove_dir_all(&unpacked);
    std::fs::create_dir_all(&unpacked).unwrap();
    let archive = support::repo_root().join(format!("tests/upgrade/config-{prev}.tar.gz"));
    let status = std::process::Command::new("tar")
        .arg("xzf")
        .arg(&archive)
        .arg("-C")
        .arg(&unpacked)
        .status()
        .unwrap();
    assert!(status.success(), "unpacking {}", archive.display());
    let config = unpacked.join("config");
    let config = config.to_str().unwrap();
    let registry_images = [("HARNESS_IMAGES", "registry"), ("IMAGE_ALSO_TAGS", &prev)];
    let mut previous_env = registry_images.to_vec();
    previous_env.push(("TESSERA_CONFIG_DIR", config));
    harness("deploy.sh", &["up"], &previous_env);
    let client = support::client().await;
    let c = begin(&client, "pods-release-kustomize").await;
    let begun = Instant::now();
    harness("deploy.sh", &["up"], &registry_images);
    let rolled = begun.elapsed();
    let upgraded = mount_upgraded(&client, &c, &old, &new).await;
    let took = begun.elapsed();
    let checked = c.finish(&client).await;
    eprintln!("Upgraded: {upgraded}");
    eprintln!(
        "REAL NODES kubectl apply -k config/ {prev} → {version}: {} records through one \
         descriptor, none failed; workloads rolled in {:.1} s, the mount on the new image \
         {:.1} s after the apply; longest write stall {:.0} ms",
        checked.records,
        rolled.as_secs_f64(),
        took.as_secs_f64(),
        checked.longest_write * 1000.0,
    );
}
