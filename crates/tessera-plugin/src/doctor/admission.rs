//! The doctor's check of Tessera's ValidatingAdmissionPolicies (`config/*-policy.yaml`,
//! the chart's): each exists, is bound, and names the agent's ServiceAccount in the
//! namespace Tessera runs in. A policy that names another namespace never matches the
//! agent's requests: it is silently off, and a node's credentials reach every node's
//! MountPods and inline tickets.
//!
//! ```text
//!  policies (name, bindings, service accounts named) ─▶ missing / unbound /
//!                                                      another namespace / fine
//! ```

use super::{Finding, Inventory};

/// Tessera's policies, as `config/` and the chart name them (a unit test reads both).
pub const POLICIES: [&str; 4] = [
    "tessera-node-own-mountpods",
    "tessera-node-inline-volumes",
    "tessera-node-inline-tickets",
    "tessera-node-own-lease",
];

/// The agent's ServiceAccount's name.
const AGENT_ACCOUNT: &str = "tessera-node";

pub(super) fn policies(inv: &Inventory, out: &mut Vec<Finding>) {
    let Some(found) = &inv.policies else {
        out.push(Finding::info(
            "admission",
            "the API server does not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicies (Kubernetes < 1.30): a node agent's credentials are limited by RBAC alone".into(),
            "upgrade the control plane to enforce the policies in config/*-policy.yaml".into(),
        ));
        return;
    };
    let want = format!("system:serviceaccount:{}:{AGENT_ACCOUNT}", inv.namespace);
    let apply = "apply them: `kubectl apply -k config/` (or the chart, which writes its release's namespace into them)";
    let mut fine = 0;
    for name in POLICIES {
        let Some(p) = found.iter().find(|p| p.name == name) else {
            out.push(Finding::problem(
                "admission",
                format!("ValidatingAdmissionPolicy {name} does not exist: a node agent's credentials are limited by RBAC alone"),
                apply.into(),
            ));
            continue;
        };
        if p.bindings.is_empty() {
            out.push(Finding::problem(
                "admission",
                format!("ValidatingAdmissionPolicy {name} has no binding: it is not enforced"),
                format!("create its ValidatingAdmissionPolicyBinding ({name}); {apply}"),
            ));
            continue;
        }
        let elsewhere: Vec<&str> = p
            .service_accounts
            .iter()
            .filter(|a| a.ends_with(&format!(":{AGENT_ACCOUNT}")) && **a != want)
            .map(String::as_str)
            .collect();
        if !elsewhere.is_empty() || !p.service_accounts.contains(&want) {
            out.push(Finding::problem(
                "admission",
                format!(
                    "ValidatingAdmissionPolicy {name} names {} but the agent runs as {want}: the policy never applies",
                    if elsewhere.is_empty() {
                        "no agent ServiceAccount".to_string()
                    } else {
                        elsewhere.join(", ")
                    }
                ),
                format!("edit the policy's matchConditions to name {want} (config/ spells tessera-system: installing into another namespace needs the chart or an edit)"),
            ));
            continue;
        }
        fine += 1;
    }
    if fine > 0 {
        out.push(Finding::ok(
            "admission",
            format!(
                "{fine} of {} admission policies are bound and name {want}",
                POLICIES.len()
            ),
        ));
    }
}

/// The `system:serviceaccount:NAMESPACE:NAME` users named in CEL `expressions`.
pub fn service_accounts<'a>(expressions: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    const PREFIX: &str = "system:serviceaccount:";
    let mut out = Vec::new();
    for e in expressions {
        let mut rest = e;
        while let Some(at) = rest.find(PREFIX) {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, ':' | '-' | '.')))
                .unwrap_or(tail.len());
            out.push(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    out.sort();
    out.dedup();
    out
}
