//! Real Pods on the harness's real nodes (kubelet, containerd, runc), with Tessera
//! deployed from `config/` (`make cluster-up deploy`): the kubelet, not this test, is
//! the CSI node plugin's client.
//!
//! ```text
//!  PVC ─(external-provisioner)─▶ PV, Volume ─ Pod on node A ─(A/D controller,
//!  external-attacher)─▶ ticket ─▶ MountPod ─▶ FUSE mount ─(kubelet: NodePublish)─▶ Pod
//!  Pod deleted ─▶ kubelet unpublishes ─▶ storage VolumeAttachment gone ─▶ detached
//! ```
//!
//! The tests are `#[ignore]`d because they need those nodes; `tests/run.sh` starts
//! them, deploys Tessera and runs these with `--ignored` (its closing line says so).

#[path = "../support/mod.rs"]
mod support;

mod backend;
mod chain;
mod csisurface;
mod daemon_kill;
mod doctor;
mod examples;
mod failover;
mod fence;
mod groups;
mod inline;
mod locks;
mod many;
mod modify;
mod oom;
mod placement;
mod preflight;
mod release;
mod rollout;
mod snapshots;
mod startup_order;
mod upgrade;
mod writer;

// What every module takes with `use super::*`.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use tessera_api::Volume;

use support::fixtures::eventually;
use support::pods::*;
use support::{kubectl_output, kubectl_stdin};
