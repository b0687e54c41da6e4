//! `kubectl tessera preflight`: the rules over what each node's preflight Pod read
//! ([`NodeFacts`]) and which nodes' markers each saw in each root ([`Sightings`]).
//! The findings are the doctor's ([`Finding`]), rendered the same way.
//!
//! ```text
//!  NodeFacts per node ─┬─▶ kernel      Linux ≥ 6.9: FUSE passthrough and resend on takeover
//!                      ├─▶ host paths  what the DaemonSet mounts exists (else its Pod never starts)
//!                      └─▶ roots       each root exists on every node
//!  Sightings per node ───▶ sharing     a root each node sees all others' markers in is shared;
//!                                      none: one per node; some: split (a problem always)
//! ```

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use tessera_host::preflight::{NodeFacts, Sightings};

use super::doctor::Finding;

/// The first kernel with FUSE passthrough and `FUSE_NOTIFY_RESEND`.
pub const FULL_FEATURE_KERNEL: (u32, u32) = (6, 9);

/// What the administrator says a root is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Scope {
    /// Not said: report what it is.
    Unknown,
    /// One filesystem every node reaches (Volumes of scope Shared).
    Shared,
    /// Each node's own disk (Volumes of scope NodeLocal).
    NodeLocal,
}

/// `PATH`, `PATH=shared` or `PATH=node-local`.
pub fn parse_root(s: &str) -> Result<(String, Scope), String> {
    let (path, scope) = match s.rsplit_once('=') {
        Some((p, "shared")) => (p, Scope::Shared),
        Some((p, "node-local")) => (p, Scope::NodeLocal),
        Some(_) => {
            return Err(format!(
                "{s:?}: expected PATH, PATH=shared or PATH=node-local"
            ));
        }
        None => (s, Scope::Unknown),
    };
    if !path.starts_with('/') || path.split('/').any(|c| c == "..") {
        return Err(format!(
            "{path:?}: a backend root is an absolute path without `..`"
        ));
    }
    Ok((path.trim_end_matches('/').to_string(), scope))
}

/// The roots of a backend-roots file (the `tessera-backend-roots` ConfigMap's
/// `backend-roots`), with what each is declared: `PATH Shared`, `PATH NodeLocal`, or a
/// path alone (the older format: `Unknown`, reported as found). Lines that are no
/// root entry are left out (the controller and agents refuse them at start).
pub fn roots_of_file(text: &str) -> BTreeMap<String, Scope> {
    use tessera_host::roots::{RootScope, parse_entry, parse_list};
    parse_list(text)
        .iter()
        .filter_map(|l| parse_entry(l).ok())
        .map(|e| {
            let scope = match (e.declared, e.scope) {
                (false, _) => Scope::Unknown,
                (true, RootScope::Shared) => Scope::Shared,
                (true, RootScope::NodeLocal) => Scope::NodeLocal,
            };
            (e.path.display().to_string(), scope)
        })
        .collect()
}

/// `6.12.3-amd64` → (6, 12).
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// Every rule over the nodes' facts and sightings.
pub fn diagnose(
    facts: &[NodeFacts],
    sightings: &[Sightings],
    roots: &BTreeMap<String, Scope>,
) -> Vec<Finding> {
    let mut out = Vec::new();
    kernels(facts, &mut out);
    host_paths(facts, &mut out);
    existence(facts, roots, &mut out);
    sharing(facts, sightings, roots, &mut out);
    out
}

fn kernels(facts: &[NodeFacts], out: &mut Vec<Finding>) {
    let (major, minor) = FULL_FEATURE_KERNEL;
    for f in facts {
        match kernel_version(&f.kernel) {
            Some(v) if v >= FULL_FEATURE_KERNEL => out.push(Finding::ok(
                "kernel",
                format!("node {}: Linux {} (passthrough, resend on takeover)", f.node, f.kernel),
            )),
            Some(_) => out.push(Finding::info(
                "kernel",
                format!(
                    "node {}: Linux {} is older than {major}.{minor}: no FUSE passthrough (reads and writes go through the daemon) and a daemon's successor cannot have the kernel resend requests in flight",
                    f.node, f.kernel
                ),
                "volumes work; for full speed and seamless daemon upgrades run Linux ≥ 6.9".into(),
            )),
            None => out.push(Finding::problem(
                "kernel",
                format!("node {}: kernel release {:?} unreadable", f.node, f.kernel),
                "the preflight Pod's log on that node".into(),
            )),
        }
    }
}

fn host_paths(facts: &[NodeFacts], out: &mut Vec<Finding>) {
    for f in facts {
        let bad: Vec<String> = f
            .host_paths
            .iter()
            .filter_map(|(p, problem)| problem.as_ref().map(|w| format!("{p} ({w})")))
            .collect();
        if bad.is_empty() {
            out.push(Finding::ok(
                "host-paths",
                format!(
                    "node {}: {} present",
                    f.node,
                    f.host_paths.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            ));
            continue;
        }
        let fuse = f.host_paths.get("/dev/fuse").is_some_and(Option::is_some);
        out.push(Finding::problem(
            "host-paths",
            format!(
                "node {}: the node DaemonSet's hostPaths are not there: {} — its Pod will not start",
                f.node,
                bad.join(", ")
            ),
            if fuse {
                "load FUSE on the node (`modprobe fuse`; /dev/fuse is a character device), and create the directories named".into()
            } else {
                "create the directories named (the kubelet directory: pass --kubelet-dir if it is not /var/lib/kubelet)".into()
            },
        ));
    }
}

fn existence(facts: &[NodeFacts], roots: &BTreeMap<String, Scope>, out: &mut Vec<Finding>) {
    for (root, scope) in roots {
        // A NodeLocal root in Tessera's own directory: the node agent makes it.
        let made_by_agent = *scope == Scope::NodeLocal
            && std::path::Path::new(root).starts_with(tessera_host::TESSERA_DIR)
            && root.trim_end_matches('/') != tessera_host::TESSERA_DIR;
        let missing: Vec<String> = facts
            .iter()
            .filter_map(|f| {
                let r = f.roots.get(root)?;
                (!r.exists)
                    .then(|| format!("{} ({})", f.node, r.problem.as_deref().unwrap_or("missing")))
            })
            .collect();
        if missing.is_empty() {
            let fs: BTreeSet<&str> = facts
                .iter()
                .filter_map(|f| f.roots.get(root))
                .map(|r| r.filesystem.as_str())
                .collect();
            out.push(Finding::ok(
                "roots",
                format!(
                    "{root} exists on all {} nodes (on {})",
                    facts.len(),
                    fs.into_iter().collect::<Vec<_>>().join(", ")
                ),
            ));
        } else if made_by_agent {
            out.push(Finding::ok(
                "roots",
                format!(
                    "{root} (NodeLocal) is not there yet on {}: the node agent creates it at start",
                    missing.join(", ")
                ),
            ));
        } else {
            out.push(Finding::problem(
                "roots",
                format!("backend root {root} is not a directory on {}", missing.join(", ")),
                "create it there (a Shared root: mount the shared filesystem there), or remove it from the allowed roots: a volume on it hangs in ContainerCreating on those nodes".into(),
            ));
        }
    }
}

fn sharing(
    facts: &[NodeFacts],
    sightings: &[Sightings],
    roots: &BTreeMap<String, Scope>,
    out: &mut Vec<Finding>,
) {
    if facts.len() < 2 {
        if !facts.is_empty() {
            out.push(Finding::info(
                "sharing",
                "one node: whether a root is shared cannot be told".into(),
                "run preflight again once the cluster has two nodes".into(),
            ));
        }
        return;
    }
    for (root, scope) in roots {
        // Nodes where the root exists, and what each saw there.
        let have: BTreeSet<&str> = facts
            .iter()
            .filter(|f| f.roots.get(root).is_some_and(|r| r.exists))
            .map(|f| f.node.as_str())
            .collect();
        if have.len() < 2 {
            continue;
        }
        let seen: BTreeMap<&str, BTreeSet<&str>> = sightings
            .iter()
            .filter(|s| have.contains(s.node.as_str()))
            .filter_map(|s| {
                let nodes = s.seen.get(root)?;
                Some((s.node.as_str(), nodes.iter().map(String::as_str).collect()))
            })
            .collect();
        if seen.len() < have.len() {
            out.push(Finding::problem(
                "sharing",
                format!(
                    "{root}: {} of {} nodes reported what they see there",
                    seen.len(),
                    have.len()
                ),
                "the preflight Pods' logs".into(),
            ));
            continue;
        }
        let shared = seen.values().all(|s| *s == have);
        let alone = seen.iter().all(|(n, s)| s.len() == 1 && s.contains(n));
        let groups: BTreeSet<Vec<&str>> =
            seen.values().map(|s| s.iter().copied().collect()).collect();
        match (shared, alone, scope) {
            (true, _, Scope::NodeLocal) => out.push(Finding::problem(
                "sharing",
                format!("{root} is one filesystem shared by {} nodes, said to be node-local", have.len()),
                "node-local volumes of different nodes would write into one directory: use a directory on each node's own disk".into(),
            )),
            (true, _, _) => out.push(Finding::ok(
                "sharing",
                format!("{root} is shared: each of {} nodes sees every other's writes", have.len()),
            )),
            (false, true, Scope::Shared) => out.push(Finding::problem(
                "sharing",
                format!("{root} is said to be shared, but each node has its own: no node sees another's writes"),
                "mount the shared filesystem (NFS, CephFS, GlusterFS…) at this path on every node; a Volume of scope Shared here would follow its Pod to an empty directory".into(),
            )),
            (false, true, Scope::NodeLocal) => out.push(Finding::ok(
                "sharing",
                format!("{root} is node-local: each node has its own, as said"),
            )),
            (false, true, Scope::Unknown) => out.push(Finding::info(
                "sharing",
                format!("{root} is node-local: each node has its own"),
                "use it only for Volumes of scope NodeLocal (spec.backend.scope); a Shared Volume here would follow its Pod to an empty directory".into(),
            )),
            (false, false, _) => out.push(Finding::problem(
                "sharing",
                format!(
                    "{root} is split: the nodes see different sets of each other's writes ({})",
                    groups
                        .iter()
                        .map(|g| g.join("+"))
                        .collect::<Vec<_>>()
                        .join(" | ")
                ),
                "mount one filesystem at this path on every node (some nodes have it, some have a local directory)".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests;
