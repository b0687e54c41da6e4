//! `examples/` on a default install, as far as backend roots go (issue 30): every
//! Volume, StorageClass and inline volume there names a root that `config/`'s
//! backend-roots file allows, with a scope that root can hold, by the same rules the
//! controller and the CSI driver apply (`AllowedRoots::check_scope`,
//! `parameters::scope_for`). The API server's own checks of the same files are
//! `api_server::examples_pass_server_side_dry_run`; the Pods running for real are
//! `tests/pods`.

use std::collections::HashMap;

use serde_json::Value;

use tessera_api::BackendScope;
use tessera_csi::controller::parameters::{Parameters, scope_for};
use tessera_host::roots::{AllowedRoots, DEFAULT_ROOT, RootScope, parse_list};

use crate::support;

/// The roots `config/backend-roots.yaml` allows.
fn default_install_roots() -> AllowedRoots {
    let path = support::repo_root().join("config/backend-roots.yaml");
    let cm: Value = support::parse_documents(&std::fs::read_to_string(path).unwrap()).remove(0);
    let text = cm["data"]["backend-roots"].as_str().expect("backend-roots");
    AllowedRoots::new(parse_list(text)).expect("a valid roots file")
}

fn scope(v: &Value) -> RootScope {
    match v.as_str() {
        None | Some("Shared") => RootScope::Shared,
        Some("NodeLocal") => RootScope::NodeLocal,
        Some(other) => panic!("scope {other:?}"),
    }
}

#[test]
fn the_default_install_declares_its_roots_and_the_default_one_is_node_local() {
    let roots = default_install_roots();
    assert!(roots.undeclared().is_empty(), "{:?}", roots.undeclared());
    assert_eq!(roots.scope_of(DEFAULT_ROOT), Ok(RootScope::NodeLocal));
    assert_eq!(roots.scope_of("/mnt/shared/tessera"), Ok(RootScope::Shared));
    // A StorageClass with no parameters: NodeLocal, so its volume carries CSI topology.
    let none = Parameters::parse(&HashMap::new(), DEFAULT_ROOT).unwrap();
    assert_eq!(scope_for(&none, &roots).unwrap(), BackendScope::NodeLocal);
}

#[test]
fn examples_name_roots_a_default_install_allows_with_scopes_they_fit() {
    let roots = default_install_roots();
    let mut checked = 0;
    for file in support::yaml_files(&support::repo_root().join("examples")) {
        let text = std::fs::read_to_string(&file).unwrap();
        let name = file.display().to_string();
        for obj in support::parse_documents::<Value>(&text) {
            match obj["kind"].as_str() {
                Some("Volume") => {
                    let b = &obj["spec"]["backend"];
                    let root = b["root"].as_str().expect("backend.root");
                    roots
                        .check_scope(root, scope(&b["scope"]))
                        .unwrap_or_else(|e| panic!("{name}: {e}"));
                    checked += 1;
                }
                Some("StorageClass") if obj["provisioner"] == "csi.tessera.io" => {
                    let params: HashMap<String, String> =
                        serde_json::from_value(obj["parameters"].clone()).unwrap_or_default();
                    let p = Parameters::parse(&params, DEFAULT_ROOT)
                        .unwrap_or_else(|e| panic!("{name}: {e}"));
                    scope_for(&p, &roots).unwrap_or_else(|e| panic!("{name}: {e}"));
                    checked += 1;
                }
                Some("Pod") => {
                    let volumes = obj["spec"]["volumes"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    for v in volumes {
                        if let Some(root) = v["csi"]["volumeAttributes"]["backendRoot"].as_str() {
                            roots
                                .check_root(root)
                                .unwrap_or_else(|e| panic!("{name}: {e}"));
                            checked += 1;
                        }
                    }
                }
                _ => {}
            }
        }
    }
    // volume-nodelocal, -rwo, -rwx; the StorageClasses of pvc-pod, idle-mount and
    // bounded-mounts; the inline Pod.
    assert!(checked >= 7, "only {checked} checked");
}
