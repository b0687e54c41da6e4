//! The node agent against the real control plane, one module per area, all in one test
//! binary (`cargo test --test node`; one area: `cargo test --test node handoff_agent::`):
//! real `tessera node` processes (each with its own node name and directories) and
//! real `tessera mount` FUSE daemons, with a real `tessera controller` (and, in
//! `monitoring`, config/monitoring/ checked against their metrics; in the #[ignore]d
//! `dashboard_run`, the run behind docs/figures/dashboard.svg). Root and `/dev/fuse`
//! needed.

#[path = "../support/mod.rs"]
mod support;

mod agent_mount;
mod backend_roots;
mod dashboard_run;
mod fence;
mod gitops_health;
mod handoff_agent;
mod monitoring;
mod node_agent;
mod populate_agent;
mod shared_roots;
mod write_budget;
