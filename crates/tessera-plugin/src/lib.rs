//! The pure parts of `kubectl tessera` (the `kubectl-tessera` binary): what it shows
//! and what it concludes, computed from objects the binary has already read.
//!
//! ```text
//!  kubectl-tessera (src/bin): reads objects ──▶ plugin::tickets  rows + owners (managedFields)
//!                                          ──▶ plugin::status   one screen, PVC → … → agent log
//!                                          ──▶ plugin::pods     a Pod's volumes, each a status target
//!                                          ──▶ plugin::mounts   every MountPod, a line each
//!                                          ──▶ plugin::doctor   Inventory ─▶ Findings (+ what to do)
//!     preflight Pods' JSON lines (node::preflight) ──▶ plugin::preflight  NodeFacts ─▶ Findings
//!                                                 plugin::text  ages, tables, truncation
//! ```
//!
//! Nothing here talks to the API server, so every view and every diagnosis rule is a
//! table test; the binary stays a thin layer of reads.

pub mod doctor;
pub mod mounts;
pub mod pods;
pub mod preflight;
pub mod status;
pub mod text;
pub mod tickets;
