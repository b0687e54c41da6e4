//! What a MountPod asks of this node, validated: [`want`] turns a `MountPodSpec` into
//! a [`Want`] (volume a path component, source a volume's directory beneath an
//! allowed root, references under the kubelet directory, mount options from the
//! allowed list) without I/O, so a MountPod written around the API server's checks
//! still gets nothing it should not.

use std::path::PathBuf;
use std::time::Duration;

use tessera_api::MountPodSpec;
use tessera_host::paths;
use tessera_host::roots::{AllowedRoots, Beneath};

/// Settings of the node-side work.
#[derive(Debug, Clone)]
pub struct Config {
    /// Mounts go to `<mount_root>/<volume>`.
    pub mount_root: PathBuf,
    /// Every reference's target path must be under this directory.
    pub kubelet_dir: PathBuf,
    /// Sources must be a volume's directory beneath one of these.
    pub allowed_roots: AllowedRoots,
    /// How long a probe of a mount point may take before the mount counts as hung.
    pub probe_timeout: Duration,
    /// How long a new daemon may take before its mount answers.
    pub start_timeout: Duration,
    /// How long a daemon gets between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
    /// The agent renews its node's liveness Lease, so a daemon may fence itself.
    pub fencing: bool,
    /// The agent mounts (`/dev/fuse`, `mount(2)`, the descriptor to the fd holder)
    /// and the daemon serves what it is given; else (or without a holder) the
    /// daemon mounts.
    pub agent_mounts: bool,
}

/// One bind of the mount into a pod, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The bind mount's target (under the kubelet directory).
    pub path: PathBuf,
    /// Bind read-only.
    pub read_only: bool,
}

/// What a MountPod asks of this node, with every path validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    /// The MountPod's name.
    pub mountpod: String,
    /// The MountPod's uid (the owner of its mount Pod); empty when not known.
    pub mountpod_uid: String,
    /// The volume (one path component).
    pub volume: String,
    /// The volume's directory.
    pub source: PathBuf,
    /// The same, as an allowed root and the path beneath it.
    pub beneath: Beneath,
    /// `<mount_root>/<volume>`.
    pub mountpoint: PathBuf,
    /// The quota.
    pub capacity_bytes: u64,
    /// Mount read-only.
    pub read_only: bool,
    /// Extra mount options.
    pub options: Vec<String>,
    /// The backend is shared with other nodes: start the daemon with
    /// `--shared-backend`. A running daemon is never restarted for this alone.
    pub shared_backend: bool,
    /// The accepted references.
    pub references: Vec<Target>,
    /// The node (the MountPod's `nodeName`: this agent's).
    pub node: String,
    /// For a Shared root: the node whose marker must be visible under the root here
    /// (`spec.sharedRootAnchor`).
    pub anchor: Option<String>,
    /// The daemon's CPU and memory (pod mode: its container's; the agent's defaults
    /// fill what is unset). Taken at a start: a running daemon keeps its own.
    pub resources: Option<tessera_api::MountResources>,
    /// The attribute cache lifetime (applied live: settings file + SIGHUP).
    pub attr_cache_seconds: Option<i64>,
    /// The daemon fences itself (`--fence-file`, docs/failover.md).
    pub self_fence: bool,
}

/// Validate a MountPod spec: `Err` when the mount cannot be served at all; the
/// second value lists references refused (target outside the kubelet directory,
/// CVE-2020-8568), which are left alone but do not stop the mount.
pub fn want(
    mountpod: &str,
    spec: &MountPodSpec,
    config: &Config,
) -> Result<(Want, Vec<String>), String> {
    let volume = paths::component(&spec.volume).map_err(|e| format!("spec.volume: {e}"))?;
    let beneath = config
        .allowed_roots
        .check_source(&spec.source, volume)
        .map_err(|e| format!("spec.source: {e}"))?;
    let source = beneath.full();
    let capacity_bytes = u64::try_from(spec.capacity_bytes)
        .ok()
        .filter(|c| *c > 0)
        .ok_or_else(|| {
            format!(
                "spec.capacityBytes {} is not a positive number",
                spec.capacity_bytes
            )
        })?;
    // The API server refuses these already (CEL); a MountPod written around it, or by
    // an older CRD, still gets no suid, dev or smuggled option from the agent.
    if let Some(bad) = spec
        .mount_options
        .iter()
        .find(|o| !tessera_api::mount_option_allowed(o))
    {
        return Err(format!(
            "spec.mountOptions: {:?} is not one of {}",
            bad.chars().take(64).collect::<String>(),
            tessera_api::MOUNT_OPTIONS.join(", ")
        ));
    }
    let mut references = Vec::new();
    let mut refused = Vec::new();
    for r in &spec.references {
        match paths::under(&r.target_path, &config.kubelet_dir) {
            Ok(path) => references.push(Target {
                path,
                read_only: r.read_only,
            }),
            Err(e) => refused.push(format!(
                "reference refused: {e} (bind targets must be under the kubelet directory {})",
                config.kubelet_dir.display()
            )),
        }
    }
    let want = Want {
        mountpod: mountpod.to_string(),
        mountpod_uid: String::new(),
        volume: volume.to_string(),
        mountpoint: config.mount_root.join(volume),
        source,
        beneath,
        capacity_bytes,
        read_only: spec.read_only,
        options: spec.mount_options.clone(),
        shared_backend: spec.shared_backend,
        references,
        node: spec.node_name.clone(),
        anchor: spec.shared_root_anchor.clone(),
        resources: spec.resources.clone(),
        attr_cache_seconds: spec.attr_cache_seconds.map(|s| s.clamp(0, 3600)),
        self_fence: spec.self_fence,
    };
    Ok((want, refused))
}
