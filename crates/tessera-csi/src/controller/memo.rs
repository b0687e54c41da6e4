//! What the Controller service remembers of its own recent calls, shared by the calls
//! of every RPC: a map that starts over once it holds its bound, because a forgotten
//! entry only costs the read or the wait it would have saved
//! ([`super::grant::WrittenBefore`], [`super::publish_cache::RefusedAtCap`]).

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

/// A map of at most `cap` entries, shared by clones.
#[derive(Clone)]
pub struct Bounded<K, V> {
    map: Arc<Mutex<HashMap<K, V>>>,
    cap: usize,
}

impl<K: Eq + Hash, V: Clone> Bounded<K, V> {
    /// An empty map of at most `cap` entries.
    pub fn new(cap: usize) -> Self {
        Bounded {
            map: Arc::default(),
            cap,
        }
    }

    /// Keep `value` for `key`; a full map starts over first.
    pub fn insert(&self, key: K, value: V) {
        let mut map = self.map.lock().expect("memo poisoned");
        if map.len() >= self.cap {
            map.clear();
        }
        map.insert(key, value);
    }

    /// What is kept for `key`.
    pub fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        self.map.lock().expect("memo poisoned").get(key).cloned()
    }

    /// Forget `key`.
    pub fn remove<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        self.map.lock().expect("memo poisoned").remove(key);
    }

    /// How many entries are kept (for tests of its users' bounds).
    #[cfg(test)]
    pub fn kept(&self) -> usize {
        self.map.lock().expect("memo poisoned").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_until_removed_and_started_over_when_full() {
        let memo = Bounded::new(3);
        memo.insert("a".to_string(), 1);
        memo.insert("b".to_string(), 2);
        assert_eq!(memo.get("a"), Some(1));
        memo.remove("a");
        assert_eq!(memo.get("a"), None);
        memo.insert("c".to_string(), 3);
        memo.insert("d".to_string(), 4);
        assert_eq!(memo.kept(), 3);
        memo.insert("e".to_string(), 5);
        assert_eq!(memo.kept(), 1, "full: started over");
        assert_eq!((memo.get("b"), memo.get("e")), (None, Some(5)));
    }
}
