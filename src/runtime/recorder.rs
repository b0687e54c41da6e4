//! kube-runtime's Event [`Recorder`], in shards.
//!
//! A Recorder remembers the Events it published in the last six minutes, so that a
//! repeat is folded into a series, and sweeps that whole memory on every publish. A
//! controller that publishes one Event an attach then walks every Event of the last six
//! minutes for each new one: O(n²) in a burst (4 % of the controller's CPU in
//! `make bench-controller`, 1,000 attaches, measured with perf). [`Recorders`] keeps
//! [`SHARDS`] Recorders and sends each Event through the one its regarding object
//! hashes to: every Event of an object meets the Events it can fold with, and each
//! sweep walks a [`SHARDS`]th of the memory.
//!
//! ```text
//!  publish(event, regarding) ─▶ shard(kind, namespace, name) ─▶ Recorder ─▶ Event (POST or series PATCH)
//! ```

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, Recorder, Reporter};

/// How many Recorders an Event is spread over.
pub const SHARDS: usize = 32;

/// Event recorders for one reporter, each object's Events through one of them.
#[derive(Clone)]
pub struct Recorders {
    shards: Arc<[Recorder]>,
}

impl Recorders {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Recorders {
            shards: (0..SHARDS)
                .map(|_| Recorder::new(client.clone(), reporter.clone()))
                .collect(),
        }
    }

    /// Publish `event` about `regarding` (see [`Recorder::publish`]).
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        self.shards[shard(regarding, self.shards.len())]
            .publish(event, regarding)
            .await
    }
}

/// The shard of an object's Events: from the fields that name it, all of them part of
/// the key a Recorder folds repeats by, so repeats always meet in one shard.
fn shard(regarding: &ObjectReference, shards: usize) -> usize {
    let mut h = DefaultHasher::new();
    (&regarding.kind, &regarding.namespace, &regarding.name).hash(&mut h);
    (h.finish() % shards as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(kind: &str, name: &str, rv: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("tessera.io/v1alpha1".into()),
            kind: Some(kind.into()),
            name: Some(name.into()),
            resource_version: Some(rv.into()),
            ..Default::default()
        }
    }

    #[test]
    fn an_objects_events_share_a_shard_and_objects_spread_over_all() {
        // The same object at another resourceVersion: the same shard.
        assert_eq!(
            shard(&object("Volume", "v1", "1"), SHARDS),
            shard(&object("Volume", "v1", "9"), SHARDS)
        );
        let mut used = vec![0usize; SHARDS];
        for i in 0..SHARDS * 64 {
            used[shard(&object("Volume", &format!("pvc-{i}"), "1"), SHARDS)] += 1;
        }
        // Every shard in use, none with more than twice its share.
        assert!(used.iter().all(|&n| n > 0 && n <= 128), "{used:?}");
    }
}
