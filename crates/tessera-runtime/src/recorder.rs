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
//! At most [`IN_FLIGHT`] Events are sent at once, whatever the shard: a Recorder holds
//! no lock while it sends, and Events are published off the reconciles' paths, so a
//! burst (an RWX volume attached on 500 nodes in one reconcile: 500 Events) otherwise
//! sends them all at once, each on an HTTP/1 connection of its own (217 sockets open in
//! the controller at the peak of `make bench-rwx`). Waiting Events queue in order.
//!
//! ```text
//!  publish(event, regarding) ─▶ permit (IN_FLIGHT) ─▶ shard(kind, namespace, name) ─▶ Recorder ─▶ Event (POST or series PATCH)
//! ```

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, Recorder, Reporter};
use tokio::sync::Semaphore;

/// How many Recorders an Event is spread over.
pub const SHARDS: usize = 32;

/// How many Events are sent at once.
pub const IN_FLIGHT: usize = 8;

/// Event recorders for one reporter, each object's Events through one of them.
#[derive(Clone)]
pub struct Recorders {
    shards: Arc<[Recorder]>,
    in_flight: Arc<Semaphore>,
}

impl Recorders {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Recorders {
            shards: (0..SHARDS)
                .map(|_| Recorder::new(client.clone(), reporter.clone()))
                .collect(),
            in_flight: Arc::new(Semaphore::new(IN_FLIGHT)),
        }
    }

    /// Publish `event` about `regarding` (see [`Recorder::publish`]).
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        // Never closed, so the permit always comes.
        let _permit = self.in_flight.acquire().await;
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

    /// A burst of Events (one per node of an RWX volume attached everywhere at once)
    /// keeps at most IN_FLIGHT requests open. The API server here is a stand-in
    /// service that holds each request a moment and counts how many it holds.
    #[tokio::test]
    async fn a_burst_of_events_is_sent_a_few_at_a_time() {
        use std::sync::atomic::{AtomicUsize, Ordering};

        use kube::runtime::events::EventType;
        let (now, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let service = tower::service_fn({
            let (now, peak) = (now.clone(), peak.clone());
            move |_req: http::Request<kube::client::Body>| {
                let (now, peak) = (now.clone(), peak.clone());
                async move {
                    peak.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    now.fetch_sub(1, Ordering::SeqCst);
                    let body = serde_json::json!({
                        "apiVersion": "events.k8s.io/v1", "kind": "Event",
                        "metadata": {"name": "e", "namespace": "default"},
                        "eventTime": "2026-12-02T00:00:00.000000Z",
                    });
                    Ok::<_, std::convert::Infallible>(http::Response::new(
                        kube::client::Body::from(serde_json::to_vec(&body).unwrap()),
                    ))
                }
            }
        });
        let recorders = Recorders::new(
            Client::new(service, "default"),
            Reporter {
                controller: "test".into(),
                instance: None,
            },
        );
        let sends = (0..64).map(|i| {
            let recorders = recorders.clone();
            tokio::spawn(async move {
                let ev = Event {
                    type_: EventType::Normal,
                    reason: "Attached".into(),
                    note: None,
                    action: format!("Attached:node-{i}"),
                    secondary: None,
                };
                recorders
                    .publish(&ev, &object("Volume", &format!("v{}", i % 4), "1"))
                    .await
            })
        });
        for sent in futures::future::join_all(sends).await {
            sent.unwrap().unwrap();
        }
        let peak = peak.load(Ordering::SeqCst);
        assert!(
            (1..=IN_FLIGHT).contains(&peak),
            "{peak} Events in flight at once"
        );
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
