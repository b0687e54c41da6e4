//! The controller's own recent writes, remembered until its watch caches show them.
//!
//! A reconcile reads the caches, decides and writes. The next reconcile of the same
//! volume is often triggered before the watch has delivered those writes (by the
//! MountPod it just created, say), and would decide again from the older objects:
//! it would write the same status a second time with fresh timestamps, re-apply a
//! MountPod and repeat its Event. Each write's response is the object as the API
//! server stored it, so it is remembered here together with the resourceVersions it
//! superseded: the one the write was decided on and, when writes follow each other
//! faster than the watch, the earlier remembered writes. While the cache shows one of
//! those, the remembered object is the newer truth and is used in its place; as soon
//! as the cache shows anything else (the write itself or a later change) the memory
//! is dropped and the cache rules again. resourceVersions are only compared for
//! equality, never ordered.
//!
//! Nothing here can make a decision staler than the cache alone: a remembered object
//! is only ever used instead of the exact version it superseded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::ResourceExt;

/// How long a remembered write is kept if nothing looks at it again.
const FORGET_AFTER: Duration = Duration::from_secs(60);
/// How many superseded versions of one object are remembered.
const MAX_CHAIN: usize = 16;

struct Entry<K> {
    /// The volume the object belongs to (for list views).
    scope: String,
    /// resourceVersions known to be older than `after` (`None`: no object yet).
    superseded: Vec<Option<String>>,
    /// The object after the write (`None`: deleted).
    after: Option<Arc<K>>,
    at: Instant,
}

/// The controller's own writes of one kind, by object name, remembered until the
/// cache shows them.
pub struct OwnWrites<K> {
    entries: Mutex<HashMap<String, Entry<K>>>,
}

impl<K> Default for OwnWrites<K> {
    fn default() -> Self {
        OwnWrites {
            entries: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: ResourceExt> OwnWrites<K> {
    /// Remember that object `name` of volume `scope`, which the cache showed at
    /// resourceVersion `base` (`None`: absent), is now `after` (`None`: deleted).
    pub fn record(&self, scope: &str, name: &str, base: Option<String>, after: Option<Arc<K>>) {
        let mut entries = self.entries.lock().expect("own writes lock");
        let now = Instant::now();
        entries.retain(|_, e| now.duration_since(e.at) < FORGET_AFTER);
        // A write decided on a remembered version (or on one it superseded) supersedes
        // that whole chain: the cache may show any link of it until it catches up.
        let mut superseded = match entries.remove(name) {
            Some(e)
                if e.superseded.contains(&base)
                    || e.after.as_ref().and_then(|a| a.resource_version()) == base =>
            {
                let mut chain = e.superseded;
                chain.push(e.after.as_ref().and_then(|a| a.resource_version()));
                chain
            }
            _ => Vec::new(),
        };
        superseded.push(base);
        superseded.dedup();
        if superseded.len() > MAX_CHAIN {
            superseded.drain(..superseded.len() - MAX_CHAIN);
        }
        entries.insert(
            name.to_string(),
            Entry {
                scope: scope.to_string(),
                superseded,
                after,
                at: now,
            },
        );
    }

    /// The freshest known version of object `name`, given what the cache shows.
    pub fn view(&self, name: &str, cached: Option<Arc<K>>) -> Option<Arc<K>> {
        let mut entries = self.entries.lock().expect("own writes lock");
        let Some(e) = entries.get(name) else {
            return cached;
        };
        if e.superseded
            .contains(&cached.as_ref().and_then(|c| c.resource_version()))
        {
            e.after.clone()
        } else {
            entries.remove(name);
            cached
        }
    }

    /// The freshest known versions of the objects of volume `scope`, given the cached
    /// ones.
    pub fn view_scope(&self, scope: &str, cached: Vec<Arc<K>>) -> Vec<Arc<K>> {
        let mut entries = self.entries.lock().expect("own writes lock");
        let mut out: Vec<Arc<K>> = Vec::with_capacity(cached.len());
        let mut seen = std::collections::HashSet::new();
        for obj in cached {
            let name = obj.name_any();
            seen.insert(name.clone());
            match entries.get(&name) {
                Some(e) if e.superseded.contains(&obj.resource_version()) => {
                    out.extend(e.after.clone())
                }
                Some(_) => {
                    entries.remove(&name);
                    out.push(obj);
                }
                None => out.push(obj),
            }
        }
        // Created by us, not in the cache yet.
        for (name, e) in entries.iter() {
            if e.scope == scope && e.superseded.contains(&None) && !seen.contains(name) {
                out.extend(e.after.clone());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    use super::*;

    fn cm(name: &str, rv: &str, data: &str) -> Arc<ConfigMap> {
        Arc::new(ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            data: Some([("v".to_string(), data.to_string())].into()),
            ..Default::default()
        })
    }

    fn data(c: &Option<Arc<ConfigMap>>) -> Option<String> {
        c.as_ref().and_then(|c| c.data.as_ref()?.get("v").cloned())
    }

    #[test]
    fn nothing_remembered_means_the_cache() {
        let r = OwnWrites::<ConfigMap>::default();
        assert_eq!(
            data(&r.view("a", Some(cm("a", "1", "x")))),
            Some("x".into())
        );
        assert!(r.view("a", None).is_none());
    }

    #[test]
    fn a_write_is_used_while_the_cache_shows_its_base_then_forgotten() {
        let r = OwnWrites::<ConfigMap>::default();
        r.record("v", "a", Some("1".into()), Some(cm("a", "2", "new")));
        // The cache still shows version 1: the written version 2 is newer.
        assert_eq!(
            data(&r.view("a", Some(cm("a", "1", "old")))),
            Some("new".into())
        );
        // The cache moved on (to the write or to anything later): the cache rules.
        assert_eq!(
            data(&r.view("a", Some(cm("a", "3", "later")))),
            Some("later".into())
        );
        // ...and the memory is gone even if an old version showed up again.
        assert_eq!(
            data(&r.view("a", Some(cm("a", "1", "old")))),
            Some("old".into())
        );
    }

    #[test]
    fn chained_writes_supersede_the_whole_chain() {
        let r = OwnWrites::<ConfigMap>::default();
        r.record("v", "a", Some("1".into()), Some(cm("a", "2", "second")));
        // The next reconcile saw version 2 (from memory) and wrote version 3.
        r.record("v", "a", Some("2".into()), Some(cm("a", "3", "third")));
        assert_eq!(
            data(&r.view("a", Some(cm("a", "1", "first")))),
            Some("third".into())
        );
        // The cache reaching the first write is not yet the second.
        assert_eq!(
            data(&r.view("a", Some(cm("a", "2", "second")))),
            Some("third".into())
        );
        assert_eq!(
            data(&r.view("a", Some(cm("a", "3", "third")))),
            Some("third".into())
        );
        assert!(
            r.entries.lock().unwrap().is_empty(),
            "forgotten once cached"
        );
    }

    #[test]
    fn a_write_decided_on_something_else_starts_a_new_chain() {
        let r = OwnWrites::<ConfigMap>::default();
        r.record("v", "a", Some("1".into()), Some(cm("a", "2", "ours")));
        // Someone else wrote 5; a reconcile that read 5 from the cache wrote 6.
        r.record("v", "a", Some("5".into()), Some(cm("a", "6", "after 5")));
        // Version 2 is not known to be older than 6 any more: the cache rules.
        assert_eq!(
            data(&r.view("a", Some(cm("a", "2", "ours")))),
            Some("ours".into())
        );
    }

    #[test]
    fn created_objects_appear_in_their_scope_until_the_cache_has_them() {
        let r = OwnWrites::<ConfigMap>::default();
        r.record("vol", "mp1", None, Some(cm("mp1", "5", "created")));
        assert!(r.view_scope("other", vec![]).is_empty());
        let v = r.view_scope("vol", vec![]);
        assert_eq!(v.len(), 1);
        let v = r.view_scope("vol", vec![cm("mp1", "5", "created")]);
        assert_eq!(v.len(), 1);
        assert!(
            r.entries.lock().unwrap().is_empty(),
            "forgotten once cached"
        );
    }

    #[test]
    fn deleted_objects_vanish_from_their_scope_while_the_cache_shows_them() {
        let r = OwnWrites::<ConfigMap>::default();
        r.record("vol", "mp1", Some("5".into()), None);
        assert!(r.view_scope("vol", vec![cm("mp1", "5", "x")]).is_empty());
        assert!(r.view("mp1", Some(cm("mp1", "5", "x"))).is_none());
        // A newer version in the cache (say, deletionTimestamp set) wins.
        assert_eq!(r.view_scope("vol", vec![cm("mp1", "6", "y")]).len(), 1);
    }
}
