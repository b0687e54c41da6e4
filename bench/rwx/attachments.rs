//! Many storage.k8s.io VolumeAttachments of one PersistentVolume, one per node,
//! created at once and deleted at once, timed by the benchmark's watch
//! ([`crate::csi_attach::watch_attachments`]).

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::storage::v1::VolumeAttachment as StorageVa;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::csi_attach::{Seen, va_name};
use crate::support::fixtures::TEST_LABEL;

/// The storage.k8s.io VolumeAttachments of PersistentVolume `pv` (named as its
/// volume handle) for `driver` on `nodes`, labelled with test `id`, and the watch
/// that sees them.
pub struct Attachments<'a> {
    pub client: &'a Client,
    pub id: &'a str,
    pub driver: &'a str,
    pub pv: &'a str,
    pub nodes: &'a [String],
    pub seen: &'a Seen,
}

impl Attachments<'_> {
    /// Their names, in the order of `nodes`.
    pub fn names(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|node| va_name(self.pv, self.driver, node))
            .collect()
    }

    /// Create them all at once (64 creates in flight, as the attach-detach controller
    /// would for Pods on every node) and wait, at most `timeout`, until all are seen
    /// attached, or refused for the volume's ticket cap when `cap` (more nodes than
    /// one VolumeAttachment holds tickets): the time from the first create to the
    /// last attached (to the timeout when some were neither), and how many were not
    /// attached.
    pub async fn attach(&self, timeout: Duration, cap: Option<usize>) -> (Duration, usize) {
        let storage: Api<StorageVa> = Api::all(self.client.clone());
        let names = self.names();
        let t0 = Instant::now();
        futures::stream::iter(self.nodes.iter().zip(&names).map(|(node, va)| {
            let storage = storage.clone();
            let body: StorageVa = serde_json::from_value(json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
                "metadata": {"name": va, "labels": {TEST_LABEL: self.id}},
                "spec": {"attacher": self.driver, "nodeName": node,
                    "source": {"persistentVolumeName": self.pv}},
            }))
            .unwrap();
            async move {
                storage
                    .create(&PostParams::default(), &body)
                    .await
                    .unwrap_or_else(|e| panic!("creating VolumeAttachment {va}: {e}"));
            }
        }))
        .buffer_unordered(64)
        .collect::<Vec<()>>()
        .await;
        // Past the cap, each VolumeAttachment is attached or refused for it, and the
        // attached ones are as many as the cap allows.
        let all_attached = |s: &Seen| {
            let a = s.attached.lock().unwrap();
            let r = s.refused.lock().unwrap();
            let attached = names.iter().filter(|n| a.contains_key(*n)).count();
            match cap {
                None => attached == names.len(),
                Some(cap) => {
                    attached >= cap.min(names.len())
                        && names.iter().all(|n| a.contains_key(n) || r.contains_key(n))
                }
            }
        };
        let all = self.seen.wait(timeout, all_attached).await;
        let a = self.seen.attached.lock().unwrap();
        let last = names.iter().filter_map(|n| a.get(n)).max().copied();
        let failed = names.iter().filter(|n| !a.contains_key(*n)).count();
        if cap.is_some() {
            let r = self.seen.refused.lock().unwrap();
            let refused = names.iter().filter(|n| r.contains_key(*n)).count();
            eprintln!(
                "  {} attached, {refused} refused at the volume's ticket cap ({})",
                names.len() - failed,
                self.driver
            );
        }
        if !all {
            eprintln!(
                "  warning: {failed} of {} VolumeAttachments ({}) not attached within {timeout:?}",
                names.len(),
                self.driver
            );
        }
        let wall = match (all, last) {
            (true, Some(l)) => l.saturating_duration_since(t0),
            _ => t0.elapsed(),
        };
        (wall, failed)
    }

    /// Delete them all (64 in flight) and wait, at most `timeout`, until all are seen
    /// gone (then drop their finalizers): the time from the first delete to the last
    /// gone.
    pub async fn detach(&self, timeout: Duration) -> Duration {
        let storage: Api<StorageVa> = Api::all(self.client.clone());
        let names = self.names();
        let t1 = Instant::now();
        futures::stream::iter(names.iter().map(|va| {
            let storage = storage.clone();
            async move {
                let _ = storage.delete(va, &DeleteParams::default()).await;
            }
        }))
        .buffer_unordered(64)
        .collect::<Vec<()>>()
        .await;
        let all_gone = |s: &Seen| {
            let g = s.gone.lock().unwrap();
            names.iter().all(|n| g.contains_key(n))
        };
        if !self.seen.wait(timeout, all_gone).await {
            eprintln!(
                "  warning: VolumeAttachments ({}) still present after {timeout:?}; removing finalizers",
                self.driver
            );
            for va in &names {
                let patch = json!({"metadata": {"finalizers": null}});
                let _ = storage
                    .patch(va, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
            }
        }
        let g = self.seen.gone.lock().unwrap();
        names
            .iter()
            .filter_map(|n| g.get(n))
            .max()
            .map_or(t1.elapsed(), |l| l.saturating_duration_since(t1))
    }
}
