//! Where a volume may be used and how much fits where, as CSI says it: pure, shared
//! by both services (the nodes' free-bytes reports are `api::free_bytes`'s).
//!
//! ```text
//!  Node service   NodeGetInfo ─▶ node_segments: topology.tessera.io/node=<node>
//!                                 + root_topology_key(root)=served per Shared root it has
//!                 (the kubelet labels the Node with them when the plugin registers)
//!  Controller     CreateVolume ─▶ volume_topology: NodeLocal → its node; Shared → its root's key
//!                 GetCapacity(root, segment) ─▶ capacity over the nodes' reports
//!  node agent     each renewal of its liveness Lease: api::free_bytes (coarsened statvfs)
//! ```
//!
//! A node without a Shared root has no label for it, so the scheduler keeps Pods of
//! volumes on that root off it ("volume node affinity conflict"). Labels are only
//! added, never changed: a key's value is always [`TOPOLOGY_ROOT_SERVED`] (the kubelet
//! refuses to register a plugin whose value differs from the Node's label).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use tessera_api::{BackendScope, TOPOLOGY_NODE_KEY, TOPOLOGY_ROOT_SERVED, root_topology_key};
use tessera_host::roots::{AllowedRoots, RootScope};

use crate::proto::Topology;

/// At most this many Shared roots become a node's topology keys.
pub const MAX_ROOT_KEYS: usize = tessera_api::free_bytes::MAX_ROOTS;

/// The topology a node's plugin reports: its name, and the key of each Shared root
/// `has` says is present on it.
pub fn node_segments(
    node: &str,
    roots: &AllowedRoots,
    has: impl Fn(&Path) -> bool,
) -> HashMap<String, String> {
    let mut segments: HashMap<String, String> =
        [(TOPOLOGY_NODE_KEY.to_owned(), node.to_owned())].into();
    let shared = roots
        .entries()
        .iter()
        .filter(|e| e.scope == RootScope::Shared)
        .take(MAX_ROOT_KEYS);
    for e in shared {
        if has(&e.path) {
            let key = root_topology_key(&e.path.to_string_lossy());
            segments.insert(key, TOPOLOGY_ROOT_SERVED.to_owned());
        }
    }
    segments
}

/// Where a volume on `root` may be used: a NodeLocal one on its node, a Shared one
/// on the nodes that have its root.
pub fn volume_topology(scope: &BackendScope, root: &str, node: Option<&str>) -> Vec<Topology> {
    let segment = match (scope, node) {
        (BackendScope::NodeLocal, Some(node)) => (TOPOLOGY_NODE_KEY.to_owned(), node.to_owned()),
        (BackendScope::NodeLocal, None) => return vec![],
        (BackendScope::Shared, _) => (root_topology_key(root), TOPOLOGY_ROOT_SERVED.to_owned()),
    };
    vec![Topology {
        segments: [segment].into(),
    }]
}

/// What the controller knows of one node's space: the free bytes of each root it
/// has, and whether its Lease is still being renewed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeSpace {
    pub free: BTreeMap<String, u64>,
    pub fresh: bool,
}

/// The capacity for a volume on `root` on `node` (the segment's node; none: anywhere):
/// that node's free space there, or the most any live node has. A node whose Lease is
/// stale, or that does not have the root, has none: no new volume is placed there.
pub fn capacity(root: &str, node: Option<&str>, nodes: &BTreeMap<String, NodeSpace>) -> u64 {
    let of = |s: &NodeSpace| {
        if s.fresh {
            s.free.get(root).copied().unwrap_or(0)
        } else {
            0
        }
    };
    match node {
        Some(n) => nodes.get(n).map(of).unwrap_or(0),
        None => nodes.values().map(of).max().unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roots() -> AllowedRoots {
        AllowedRoots::declared([
            ("/var/lib/tessera/volumes", RootScope::NodeLocal),
            ("/mnt/shared/tessera", RootScope::Shared),
            ("/mnt/other", RootScope::Shared),
        ])
        .unwrap()
    }

    #[test]
    fn a_node_reports_its_name_and_the_shared_roots_it_has() {
        let s = node_segments("a", &roots(), |p| p != Path::new("/mnt/other"));
        let shared = root_topology_key("/mnt/shared/tessera");
        assert_eq!(s.len(), 2, "{s:?}");
        assert_eq!(s[TOPOLOGY_NODE_KEY], "a");
        assert_eq!(s[&shared], TOPOLOGY_ROOT_SERVED);
        let none = node_segments("b", &roots(), |_| false);
        assert_eq!(
            none.len(),
            1,
            "NodeLocal roots are the node key's: {none:?}"
        );
    }

    #[test]
    fn a_volume_is_used_where_its_data_is() {
        let local = volume_topology(
            &BackendScope::NodeLocal,
            "/var/lib/tessera/volumes",
            Some("a"),
        );
        assert_eq!(local[0].segments[TOPOLOGY_NODE_KEY], "a");
        assert!(volume_topology(&BackendScope::NodeLocal, "/x", None).is_empty());
        let shared = volume_topology(&BackendScope::Shared, "/mnt/shared/tessera", Some("a"));
        assert_eq!(shared.len(), 1);
        assert_eq!(
            shared[0].segments,
            [(
                root_topology_key("/mnt/shared/tessera"),
                "served".to_owned()
            )]
            .into()
        );
    }

    #[test]
    fn capacity_is_the_nodes_free_space_and_none_where_it_cannot_go() {
        let space = |free: &[(&str, u64)], fresh| NodeSpace {
            free: free.iter().map(|(r, b)| (r.to_string(), *b)).collect(),
            fresh,
        };
        let nodes: BTreeMap<String, NodeSpace> = [
            ("a".to_owned(), space(&[("/l", 10), ("/s", 100)], true)),
            ("b".to_owned(), space(&[("/l", 30)], true)),
            (
                "dead".to_owned(),
                space(&[("/l", 1000), ("/s", 1000)], false),
            ),
        ]
        .into();
        let table = [
            ("/l", Some("a"), 10),
            ("/l", Some("b"), 30),
            ("/s", Some("a"), 100),
            ("/s", Some("b"), 0),    // b does not have the shared root
            ("/l", Some("dead"), 0), // its Lease is stale
            ("/l", Some("unknown"), 0),
            ("/l", None, 30),
            ("/s", None, 100),
            ("/nowhere", None, 0),
        ];
        for (root, node, want) in table {
            assert_eq!(capacity(root, node, &nodes), want, "{root} on {node:?}");
        }
    }
}
