//! What the repository declares, one module per area, all in one test binary (`cargo
//! test --test manifests`; one area: `cargo test --test manifests chart::`): the CRDs
//! generated from the Rust types and served by the API server, `config/` and
//! `examples/`, the Helm chart against `config/`, the alert rules (promtool) and the
//! dashboard, the Argo CD health script, and the RBAC and admission policies under
//! each component's identity, and the links between the Markdown pages. These need at
//! most the API server: no Tessera process, no root. (The architecture of the
//! sources is `tests/arch`'s.)

#[path = "../support/mod.rs"]
mod support;

mod api_server;
mod argocd;
mod chart;
mod chart_knobs;
mod chart_namespace;
mod chart_pods;
mod crds_in_sync;
mod doc_links;
mod examples;
mod inline_policy;
mod krew;
mod monitoring;
mod node_policy;
mod parameters;
mod rbac;
