//! An index of one watched kind's cached objects by a key of theirs (MountPods by
//! `spec.volume`), kept current from the same watch events as the reflector's store,
//! so that a reconcile asks for the MountPods of one volume without scanning every
//! cached MountPod (a scan per reconcile was O(n), O(n²) per burst of n volumes).
//!
//! ```text
//!  watch event ─▶ reflector (Store: name ─▶ object) ─▶ Index::apply (key ─▶ names)
//!  reader: Index::get(key) ─▶ names ─▶ Store::get each ─▶ objects of that key
//! ```
//!
//! It follows the store's own rules: `Apply` and `Delete` change one object (a changed
//! key moves it), a relist (`Init`, `InitApply`…, `InitDone`) is buffered and replaces
//! the whole index at its end, as the store is replaced then; until then the index
//! answers as before the relist. The index holds names, not objects: readers take the
//! objects from the store (and check their key there, which a reader a moment ahead
//! of the index may see changed).

use std::collections::{BTreeSet, HashMap};

use kube::runtime::watcher::Event;

/// Object names by key, and each object's key.
#[derive(Debug)]
pub struct Index<K> {
    key: fn(&K) -> String,
    names: HashMap<String, BTreeSet<String>>,
    key_of: HashMap<String, String>,
    /// The objects of a relist under way, with their keys.
    relist: Option<HashMap<String, String>>,
}

impl<K: kube::Resource> Index<K> {
    /// An empty index of objects by `key`.
    pub fn new(key: fn(&K) -> String) -> Self {
        Index {
            key,
            names: HashMap::new(),
            key_of: HashMap::new(),
            relist: None,
        }
    }

    /// Apply one watch event (after the store applied it).
    pub fn apply(&mut self, event: &Event<K>) {
        match event {
            Event::Apply(o) => {
                let key = (self.key)(o);
                self.insert(name(o), key);
            }
            Event::Delete(o) => self.remove(&name(o)),
            Event::Init => self.relist = Some(HashMap::new()),
            Event::InitApply(o) => {
                let key = (self.key)(o);
                self.relist.get_or_insert_default().insert(name(o), key);
            }
            Event::InitDone => {
                let listed = self.relist.take().unwrap_or_default();
                self.names.clear();
                self.key_of.clear();
                for (name, key) in listed {
                    self.insert(name, key);
                }
            }
        }
    }

    /// The names of the objects of `key`, in name order.
    pub fn get(&self, key: &str) -> Vec<String> {
        self.names
            .get(key)
            .map(|n| n.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The number of keys that have objects.
    pub fn keys(&self) -> usize {
        self.names.len()
    }

    fn insert(&mut self, name: String, key: String) {
        match self.key_of.get(&name) {
            Some(old) if *old == key => return,
            Some(_) => self.remove(&name),
            None => {}
        }
        self.names
            .entry(key.clone())
            .or_default()
            .insert(name.clone());
        self.key_of.insert(name, key);
    }

    fn remove(&mut self, name: &str) {
        let Some(key) = self.key_of.remove(name) else {
            return;
        };
        if let Some(names) = self.names.get_mut(&key) {
            names.remove(name);
            if names.is_empty() {
                self.names.remove(&key);
            }
        }
    }
}

/// An object's identity in the index: its namespace and name (the store's own key).
fn name<K: kube::Resource>(o: &K) -> String {
    let meta = o.meta();
    match &meta.namespace {
        Some(ns) => format!("{ns}/{}", meta.name.as_deref().unwrap_or_default()),
        None => meta.name.clone().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use tessera_api::MountPod;

    use super::*;

    fn mp(name: &str, volume: &str) -> MountPod {
        let spec = serde_json::json!({
            "volume": volume, "nodeName": "n1", "source": "/b/v", "capacityBytes": 1,
        });
        MountPod::new(name, serde_json::from_value(spec).expect("a MountPod spec"))
    }

    fn index() -> Index<MountPod> {
        Index::new(|m: &MountPod| m.spec.volume.clone())
    }

    #[test]
    fn the_index_follows_every_event_as_the_store_does() {
        use Event::*;
        // (event, then the names of volumes "a" and "b")
        type Step<'a> = (Event<MountPod>, &'a [&'a str], &'a [&'a str]);
        let steps: Vec<Step> = vec![
            (Apply(mp("a-1", "a")), &["a-1"], &[]),
            (Apply(mp("a-2", "a")), &["a-1", "a-2"], &[]),
            (Apply(mp("b-1", "b")), &["a-1", "a-2"], &["b-1"]),
            // A modification that keeps the key.
            (Apply(mp("a-1", "a")), &["a-1", "a-2"], &["b-1"]),
            // A modification that changes it: the object moves.
            (Apply(mp("a-2", "b")), &["a-1"], &["a-2", "b-1"]),
            (Delete(mp("a-1", "a")), &[], &["a-2", "b-1"]),
            // A deletion of an object never seen changes nothing.
            (Delete(mp("zz", "a")), &[], &["a-2", "b-1"]),
            // A deletion as last seen under another key still removes it.
            (Delete(mp("a-2", "a")), &[], &["b-1"]),
            // A relist: until it is done, the index answers as before it.
            (Init, &[], &["b-1"]),
            (InitApply(mp("a-3", "a")), &[], &["b-1"]),
            (InitApply(mp("b-2", "b")), &[], &["b-1"]),
            // Done: b-1 went while the watch was down (no Delete came), a-3 came.
            (InitDone, &["a-3"], &["b-2"]),
            // An Apply during a later relist counts at once (the store applies it at
            // once too), and the relist's end then replaces everything.
            (Init, &["a-3"], &["b-2"]),
            (Apply(mp("a-4", "a")), &["a-3", "a-4"], &["b-2"]),
            (InitApply(mp("a-3", "a")), &["a-3", "a-4"], &["b-2"]),
            (InitDone, &["a-3"], &[]),
            // A relist of nothing empties it.
            (Init, &["a-3"], &[]),
            (InitDone, &[], &[]),
        ];
        let mut ix = index();
        for (i, (event, a, b)) in steps.into_iter().enumerate() {
            let shown = format!("{event:?}");
            ix.apply(&event);
            assert_eq!(ix.get("a"), *a, "step {i} ({shown}): volume a");
            assert_eq!(ix.get("b"), *b, "step {i} ({shown}): volume b");
        }
        assert_eq!(ix.keys(), 0, "no empty key is kept");
    }

    #[test]
    fn namespaced_objects_are_told_apart_by_namespace() {
        let mut ix: Index<k8s_openapi::api::core::v1::Pod> =
            Index::new(|p| p.metadata.labels.clone().unwrap_or_default()["v"].clone());
        let pod = |ns: &str| {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": ns, "labels": {"v": "x"}}
            }))
            .unwrap()
        };
        ix.apply(&Event::Apply(pod("n1")));
        ix.apply(&Event::Apply(pod("n2")));
        assert_eq!(ix.get("x"), ["n1/p", "n2/p"]);
        ix.apply(&Event::Delete(pod("n1")));
        assert_eq!(ix.get("x"), ["n2/p"]);
    }
}
