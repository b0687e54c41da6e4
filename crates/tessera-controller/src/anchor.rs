//! The anchor of each backend root declared Shared: the node whose view of the root
//! holds the data served from it. Every MountPod of a Shared volume names it
//! (`spec.sharedRootAnchor`); the anchor's agent leaves a marker under the root, any
//! other node's agent serves only if it sees that marker through its own mount
//! (`host::shared`), so a root that is a plain directory on each node is refused
//! (`BackendNotShared`) instead of served empty.
//!
//! ```text
//!  remembered (this process) ─▶ else the anchor the oldest Ready MountPod under the root names
//!    ─▶ else the last attached node of the oldest Shared Volume under the root
//!    ─▶ else the node being attached now (the first to serve the root), but not one
//!       that failed as its anchor (the root is missing there: `failed_anchors`)
//! ```
//!
//! Once chosen it stays while it holds ([`holds`]: a Ready MountPod names it, or its
//! own MountPod is still trying), so two first attaches at once agree: every node that served a Shared volume since then saw the
//! anchor's marker, so any node the durable facts name after a restart has the
//! anchor's view. The choice is pure ([`choose`]); [`Anchors`] remembers it.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::ResourceExt;

use tessera_api::{BackendScope, MountPhase, MountPod, Volume};
use tessera_host::roots::AllowedRoots;

/// The anchors chosen by this process, per allowed root: the node, when it was
/// chosen, and whether a Ready MountPod proved it (then nothing is looked at again).
#[derive(Debug, Default)]
pub struct Anchors(Mutex<HashMap<PathBuf, (String, Instant, bool)>>);

/// How long a new anchor stands without a MountPod to show for it (its MountPod may
/// not be in the cache yet).
pub const ANCHOR_GRACE: Duration = Duration::from_secs(30);

/// What the MountPods say of an anchor ([`holds`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holds {
    /// A Ready MountPod under the root names it: its node saw the marker.
    Proven,
    /// Its own MountPod there is still trying (starting, or failed otherwise).
    Trying,
    /// Its own MountPod there was refused: it could not leave the marker.
    Refused,
    /// No MountPod shows either (not yet cached, or gone before it was Ready).
    Unknown,
}

impl Anchors {
    /// The anchor of `root`: the one remembered (at once when proven) unless
    /// [`holds`] says it never left its marker (`Refused`, or `Unknown` past
    /// [`ANCHOR_GRACE`]), else [`choose`]'s (then remembered).
    pub fn get_or_choose(
        &self,
        root: &Path,
        holds: impl FnOnce(&str) -> Holds,
        choose: impl FnOnce() -> String,
    ) -> String {
        let mut map = self.0.lock().expect("not poisoned");
        if let Some((a, at, proven)) = map.get_mut(root) {
            if *proven {
                return a.clone();
            }
            match holds(a) {
                Holds::Proven => {
                    *proven = true;
                    return a.clone();
                }
                Holds::Trying => return a.clone(),
                Holds::Unknown if at.elapsed() <= ANCHOR_GRACE => return a.clone(),
                Holds::Refused | Holds::Unknown => {
                    map.remove(root);
                }
            }
        }
        let chosen = choose();
        map.insert(root.to_path_buf(), (chosen.clone(), Instant::now(), false));
        chosen
    }
}

/// What the MountPods say of `anchor` as the anchor of `root`.
pub fn holds(root: &Path, anchor: &str, mountpods: &[&MountPod], allowed: &AllowedRoots) -> Holds {
    let named: Vec<&&MountPod> = mountpods
        .iter()
        .filter(|mp| mp.spec.shared_root_anchor.as_deref() == Some(anchor))
        .filter(|mp| under(root, &mp.spec.source, allowed))
        .collect();
    let ready = |mp: &MountPod| mp.status.as_ref().and_then(|s| s.phase) == Some(MountPhase::Ready);
    if named.iter().any(|mp| ready(mp)) {
        return Holds::Proven;
    }
    match named.iter().find(|mp| mp.spec.node_name == anchor) {
        Some(mp) if refused_not_shared(mp) => Holds::Refused,
        Some(_) => Holds::Trying,
        None => Holds::Unknown,
    }
}

/// Whether `mp` was refused because its node does not share its root.
fn refused_not_shared(mp: &MountPod) -> bool {
    mp.status.as_ref().is_some_and(|s| {
        s.phase == Some(MountPhase::Failed)
            && s.conditions.iter().any(|c| {
                c.type_ == tessera_api::CONDITION_READY
                    && c.reason == tessera_api::TicketReason::BackendNotShared.as_str()
            })
    })
}

/// Whether the volume directory `source` of a MountPod lies under the allowed `root`.
fn under(root: &Path, source: &str, allowed: &AllowedRoots) -> bool {
    Path::new(source)
        .parent()
        .and_then(|p| allowed.check_root(&p.display().to_string()).ok())
        .and_then(|p| allowed.entry_of(&p).map(|e| e.path == root))
        .unwrap_or(false)
}

/// The nodes that could not anchor `root`: named as its anchor by their own MountPod
/// there, they were refused (`BackendNotShared`: the root is missing there, or the
/// marker could not be written). Another node anchors the root instead.
pub fn failed_anchors(
    root: &Path,
    mountpods: &[&MountPod],
    allowed: &AllowedRoots,
) -> BTreeSet<String> {
    mountpods
        .iter()
        .filter(|mp| mp.spec.shared_root_anchor.as_deref() == Some(mp.spec.node_name.as_str()))
        .filter(|mp| under(root, &mp.spec.source, allowed) && refused_not_shared(mp))
        .map(|mp| mp.spec.node_name.clone())
        .collect()
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

/// The anchor of `root` from the durable facts: the anchor named by the oldest Ready
/// MountPod of a Shared volume under it (Ready: its node saw that anchor's marker),
/// else the last attached node of the oldest Shared Volume under it, else the first
/// of `candidates` (the nodes attached now, in order) not in `failed`.
pub fn choose(
    root: &Path,
    candidates: &[&str],
    failed: &BTreeSet<String>,
    volumes: &[&Volume],
    mountpods: &[&MountPod],
    allowed: &AllowedRoots,
) -> String {
    let under_root = |source_root: &str| {
        allowed
            .check_root(source_root)
            .ok()
            .and_then(|p| allowed.entry_of(&p).map(|e| e.path == root))
            .unwrap_or(false)
    };
    let mut named: Vec<&&MountPod> = mountpods
        .iter()
        .filter(|mp| {
            mp.spec.shared_root_anchor.is_some()
                && mp.status.as_ref().and_then(|s| s.phase) == Some(MountPhase::Ready)
        })
        .filter(|mp| under(root, &mp.spec.source, allowed))
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
        .filter(|v| under_root(&v.spec.backend.root))
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
        .or_else(|| {
            candidates
                .iter()
                .find(|c| !failed.contains(**c))
                .or(candidates.first())
                .map(|c| c.to_string())
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use tessera_api::VolumeStatus;

    use super::*;

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

    /// A MountPod on `node` under `source` naming `anchor`, in `phase`, refused as not
    /// shared when `not_shared`.
    fn mp(
        node: &str,
        source: &str,
        anchor: Option<&str>,
        t: i64,
        phase: Option<MountPhase>,
        not_shared: bool,
    ) -> MountPod {
        let mut m: MountPod = serde_json::from_value(serde_json::json!({
            "apiVersion": "tessera.io/v1alpha1", "kind": "MountPod",
            "metadata": {"name": format!("m-{node}-{t}")},
            "spec": {"volume": "v", "nodeName": node, "source": source, "capacityBytes": 1},
        }))
        .unwrap();
        m.spec.shared_root_anchor = anchor.map(String::from);
        m.metadata.creation_timestamp = at(t);
        let reason = if not_shared {
            "BackendNotShared"
        } else {
            "Mounted"
        };
        m.status = Some(
            serde_json::from_value(serde_json::json!({
                "phase": phase,
                "conditions": [{"type": "Ready", "status": "False", "reason": reason,
                                "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            }))
            .unwrap(),
        );
        m
    }

    #[test]
    fn the_anchor_comes_from_the_durable_facts_oldest_first() {
        use BackendScope::*;
        use MountPhase::*;
        let a = allowed();
        let root = Path::new("/shared");
        let v_old = vol("old", "/shared/fast", Shared, Some("n2"), 10);
        let v_new = vol("new", "/shared", Shared, Some("n3"), 20);
        let v_local = vol("loc", "/shared", NodeLocal, Some("n9"), 1);
        let v_other = vol("oth", "/other", Shared, Some("n8"), 1);
        let v_never = vol("never", "/shared", Shared, None, 1);
        let m_old = mp("x", "/shared/fast/v", Some("n5"), 5, Some(Ready), false);
        let m_new = mp("y", "/shared/v", Some("n6"), 50, Some(Ready), false);
        let m_none = mp("z", "/shared/v", None, 1, Some(Ready), false);
        let m_other = mp("w", "/other/v", Some("n7"), 1, Some(Ready), false);
        let m_starting = mp("s", "/shared/v", Some("n4"), 1, Some(Mounting), false);
        // n1 could not anchor the root (missing there): another node does.
        let m_failed = mp("n1", "/shared/v", Some("n1"), 1, Some(Failed), true);
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
                "a Ready MountPod's anchor first, the oldest",
                vec![&v_old],
                vec![&m_new, &m_old, &m_other, &m_starting],
                "n5",
            ),
            (
                "a MountPod not Ready is no proof of its anchor",
                vec![],
                vec![&m_starting],
                "n1",
            ),
            (
                "not a node that failed as the anchor",
                vec![],
                vec![&m_failed, &m_starting],
                "n3",
            ),
        ];
        for (what, volumes, mountpods, want) in table {
            let failed = failed_anchors(root, &mountpods, &a);
            let got = choose(root, &["n1", "n3"], &failed, &volumes, &mountpods, &a);
            assert_eq!(got, want, "{what}");
        }
        let failed = failed_anchors(root, &[&m_failed, &m_starting, &m_new], &a);
        assert_eq!(failed, BTreeSet::from(["n1".to_string()]));
        assert!(failed_anchors(Path::new("/other"), &[&m_failed], &a).is_empty());
    }

    #[test]
    fn only_shared_volumes_have_a_shared_root_and_a_choice_stays_while_it_holds() {
        let a = allowed();
        let v = vol("v", "/shared/fast", BackendScope::Shared, None, 1);
        assert_eq!(shared_root(&v, &a), Some(PathBuf::from("/shared")));
        let l = vol("l", "/local", BackendScope::NodeLocal, None, 1);
        assert_eq!(shared_root(&l, &a), None);
        let bad = vol("b", "/etc", BackendScope::Shared, None, 1);
        assert_eq!(shared_root(&bad, &a), None);
        let anchors = Anchors::default();
        let shared = Path::new("/shared");
        let trying = |_: &str| Holds::Trying;
        assert_eq!(anchors.get_or_choose(shared, trying, || "n1".into()), "n1");
        assert_eq!(anchors.get_or_choose(shared, trying, || "n2".into()), "n1");
        let other = Path::new("/other");
        assert_eq!(anchors.get_or_choose(other, trying, || "n2".into()), "n2");
        // Not shown yet: stands (its MountPod may not be cached yet).
        let unknown = |_: &str| Holds::Unknown;
        assert_eq!(anchors.get_or_choose(shared, unknown, || "n4".into()), "n1");
        // Refused: another is chosen.
        let refused = |_: &str| Holds::Refused;
        assert_eq!(anchors.get_or_choose(shared, refused, || "n2".into()), "n2");
        // Proven: kept, and never looked at again.
        let proven = |_: &str| Holds::Proven;
        assert_eq!(anchors.get_or_choose(shared, proven, || "n3".into()), "n2");
        let never = |_: &str| -> Holds { panic!("a proven anchor is not looked at") };
        assert_eq!(anchors.get_or_choose(shared, never, || "n3".into()), "n2");
    }

    #[test]
    fn an_anchor_holds_while_proven_or_still_trying() {
        use MountPhase::*;
        let a = allowed();
        let root = Path::new("/shared");
        let ready_b = mp("b", "/shared/v", Some("n1"), 1, Some(Ready), false);
        let own_starting = mp("n1", "/shared/v", Some("n1"), 1, Some(Mounting), false);
        let own_refused = mp("n1", "/shared/v", Some("n1"), 1, Some(Failed), true);
        let own_failed_otherwise = mp("n1", "/shared/v", Some("n1"), 1, Some(Failed), false);
        let other_refused = mp("b", "/shared/v", Some("n1"), 1, Some(Failed), true);
        let elsewhere = mp("n1", "/other/v", Some("n1"), 1, Some(Ready), false);
        use Holds::*;
        let table: &[(&str, Vec<&MountPod>, Holds)] = &[
            (
                "a Ready MountPod names it",
                vec![&ready_b, &own_refused],
                Proven,
            ),
            ("its own MountPod is starting", vec![&own_starting], Trying),
            (
                "its own failed, not for sharing",
                vec![&own_failed_otherwise],
                Trying,
            ),
            (
                "its own was refused",
                vec![&own_refused, &other_refused],
                Refused,
            ),
            ("no MountPod shows it", vec![], Unknown),
            ("only under another root", vec![&elsewhere], Unknown),
        ];
        for (what, mountpods, want) in table {
            assert_eq!(holds(root, "n1", mountpods, &a), *want, "{what}");
        }
    }
}
