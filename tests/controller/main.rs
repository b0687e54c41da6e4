//! The controller against the real control plane, one module per area, all in one test
//! binary (`cargo test --test controller`; one area: `cargo test --test controller
//! controller_owners::`). Each test runs its own `tessera controller` scoped to its
//! objects by a watch selector, and the stand-in node agent ([`support::fixtures::FakeAgent`]);
//! no root, no FUSE. The `kubectl tessera` plugin is tested here too, on what such a
//! controller made.

#[path = "../support/mod.rs"]
mod support;

mod controller;
mod controller_lifecycle;
mod controller_owners;
mod failover;
mod failover_conditions;
mod failover_in_use;
mod failover_taint;
mod gitops_health;
mod inline_orphans;
mod kubectl_plugin;
