//! The anchor of each backend root declared Shared: the node whose view of the root
//! holds the data served from it. Every MountPod of a Shared volume names it
//! (`spec.sharedRootAnchor`); the anchor's agent leaves a marker under the root, any
//! other node's agent serves only if it sees that marker through its own mount
//! (`host::shared`), so a root that is a plain directory on each node is refused
//! (`BackendNotShared`) instead of served empty.
//!
//! ```text
//!  remembered (this process) ─▶ else the anchor the oldest MountPod under the root names
//!    ─▶ else the last attached node of the oldest Shared Volume under the root
//!    ─▶ else the node being attached now (the first to serve the root)
//! ```
//!
//! Once chosen it stays: every node that served a Shared volume since then saw the
//! anchor's marker, so any node the durable facts name after a restart has the
//! anchor's view. The choice is pure ([`choose`]); [`Anchors`] remembers it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use kube::ResourceExt;

use crate::api::{BackendScope, MountPod, Volume};
use crate::host::roots::AllowedRoots;

/// The anchors chosen by this process, per allowed root.
#[derive(Debug, Default)]
pub struct Anchors(Mutex<HashMap<PathBuf, String>>);

impl Anchors {
    /// The anchor of `root`: the one remembered, else [`choose`]'s (then remembered).
    pub fn get_or_choose(&self, root: &Path, choose: impl FnOnce() -> String) -> String {
        let mut map = self.0.lock().expect("not poisoned");
        map.entry(root.to_path_buf()).or_insert_with(choose).clone()
    }
}

/// The allowed root a Shared `volume` is served from, `None` for a NodeLocal one (or
/// a root not allowed: no MountPod is made for it anyway).
pub fn shared_root(volume: &Volume, allowed: &AllowedRoots) -> Option<PathBuf> {
    if volume.spec.backend.scope != BackendScope::Shared {
        return None;
    }
    let p = allowed.check_root(&volume.spec.backend.root).ok()?;
    allowed.entry_of(&p).map(|e| e.path.clone())
}

/// Sort key: oldest first, then by name (a missing timestamp last).
fn age_key<K: ResourceExt>(o: &K) -> (bool, Option<jiff::Timestamp>, String) {
    let t = o.creation_timestamp().map(|t| t.0);
    (t.is_none(), t, o.name_any())
}

/// The anchor of `root` from the durable facts: the anchor named by the oldest
/// MountPod of a Shared volume under it, else the last attached node of the oldest
/// Shared Volume under it, else `first` (the node attached now).
pub fn choose(
    root: &Path,
    first: &str,
    volumes: &[&Volume],
    mountpods: &[&MountPod],
    allowed: &AllowedRoots,
) -> String {
    let under = |source_root: &str| {
        allowed
            .check_root(source_root)
            .ok()
            .and_then(|p| allowed.entry_of(&p).map(|e| e.path == root))
            .unwrap_or(false)
    };
    let mut named: Vec<&&MountPod> = mountpods
        .iter()
        .filter(|mp| mp.spec.shared_root_anchor.is_some())
        .filter(|mp| {
            Path::new(&mp.spec.source)
                .parent()
                .is_some_and(|p| under(&p.display().to_string()))
        })
        .collect();
    named.sort_by_key(|mp| age_key(**mp));
    if let Some(a) = named
        .first()
        .and_then(|mp| mp.spec.shared_root_anchor.clone())
    {
        return a;
    }
    let mut attached: Vec<&&Volume> = volumes
        .iter()
        .filter(|v| v.spec.backend.scope == BackendScope::Shared)
        .filter(|v| under(&v.spec.backend.root))
        .filter(|v| {
            v.status
                .as_ref()
                .is_some_and(|s| s.last_attached_node.is_some())
        })
        .collect();
    attached.sort_by_key(|v| age_key(**v));
    attached
        .first()
        .and_then(|v| v.status.as_ref()?.last_attached_node.clone())
        .unwrap_or_else(|| first.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::VolumeStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn allowed() -> AllowedRoots {
        AllowedRoots::new(["/shared Shared", "/other Shared", "/local NodeLocal"]).unwrap()
    }

    fn at(secs: i64) -> Option<Time> {
        Some(Time(jiff::Timestamp::from_second(secs).unwrap()))
    }

    fn vol(name: &str, root: &str, scope: BackendScope, last: Option<&str>, t: i64) -> Volume {
        let mut v: Volume = serde_json::from_value(serde_json::json!({
            "apiVersion": "tessera.io/v1alpha1", "kind": "Volume",
            "metadata": {"name": name},
            "spec": {"size": "1Gi", "accessMode": "ReadWriteOnce",
                     "backend": {"root": root, "scope": scope}},
        }))
        .unwrap();
        v.metadata.creation_timestamp = at(t);
        v.status = Some(VolumeStatus {
            last_attached_node: last.map(String::from),
            ..Default::default()
        });
        v
    }

    fn mp(name: &str, source: &str, anchor: Option<&str>, t: i64) -> MountPod {
        let mut m: MountPod = serde_json::from_value(serde_json::json!({
            "apiVersion": "tessera.io/v1alpha1", "kind": "MountPod",
            "metadata": {"name": name},
            "spec": {"volume": "v", "nodeName": "x", "source": source, "capacityBytes": 1},
        }))
        .unwrap();
        m.spec.shared_root_anchor = anchor.map(String::from);
        m.metadata.creation_timestamp = at(t);
        m
    }

    #[test]
    fn the_anchor_comes_from_the_durable_facts_oldest_first() {
        use BackendScope::*;
        let a = allowed();
        let root = Path::new("/shared");
        let v_old = vol("old", "/shared/fast", Shared, Some("n2"), 10);
        let v_new = vol("new", "/shared", Shared, Some("n3"), 20);
        let v_local = vol("loc", "/shared", NodeLocal, Some("n9"), 1);
        let v_other = vol("oth", "/other", Shared, Some("n8"), 1);
        let v_never = vol("never", "/shared", Shared, None, 1);
        let m_old = mp("m1", "/shared/fast/v", Some("n5"), 5);
        let m_new = mp("m2", "/shared/v", Some("n6"), 50);
        let m_none = mp("m3", "/shared/v", None, 1);
        let m_other = mp("m4", "/other/v", Some("n7"), 1);
        type Case<'a> = (&'a str, Vec<&'a Volume>, Vec<&'a MountPod>, &'a str);
        let table: Vec<Case> = vec![
            ("nothing yet: the node attached now", vec![], vec![], "n1"),
            (
                "never attached, NodeLocal, other roots: the node attached now",
                vec![&v_never, &v_local, &v_other],
                vec![&m_none, &m_other],
                "n1",
            ),
            (
                "the oldest Shared Volume's last node",
                vec![&v_new, &v_old, &v_local],
                vec![],
                "n2",
            ),
            (
                "a MountPod's anchor first, the oldest",
                vec![&v_old],
                vec![&m_new, &m_old, &m_other],
                "n5",
            ),
        ];
        for (what, volumes, mountpods, want) in table {
            assert_eq!(choose(root, "n1", &volumes, &mountpods, &a), want, "{what}");
        }
    }

    #[test]
    fn only_shared_volumes_have_a_shared_root_and_a_choice_stays() {
        let a = allowed();
        let v = vol("v", "/shared/fast", BackendScope::Shared, None, 1);
        assert_eq!(shared_root(&v, &a), Some(PathBuf::from("/shared")));
        let l = vol("l", "/local", BackendScope::NodeLocal, None, 1);
        assert_eq!(shared_root(&l, &a), None);
        let bad = vol("b", "/etc", BackendScope::Shared, None, 1);
        assert_eq!(shared_root(&bad, &a), None);
        let anchors = Anchors::default();
        assert_eq!(
            anchors.get_or_choose(Path::new("/shared"), || "n1".into()),
            "n1"
        );
        assert_eq!(
            anchors.get_or_choose(Path::new("/shared"), || "n2".into()),
            "n1"
        );
        assert_eq!(
            anchors.get_or_choose(Path::new("/other"), || "n2".into()),
            "n2"
        );
    }
}
