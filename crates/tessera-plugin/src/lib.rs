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
//!
//! | module | owns |
//! |---|---|
//! | [`status`] | `kubectl tessera status`: the chain from a claim to its mounts on one screen |
//! | [`tickets`] | `kubectl tessera tickets`: a row per ticket, with its owners and how long it waits |
//! | [`pods`] | a Pod's Tessera volumes, each where `status pod/NAME` starts |
//! | [`mounts`] | `kubectl tessera mounts`: every MountPod, a line each, by node |
//! | [`doctor`] | `kubectl tessera doctor`: the rules that check an install, and their findings |
//! | [`preflight`] | `kubectl tessera preflight`: the rules over what each node's preflight Pod read |
//! | [`text`] | ages, one-line messages, tables cut to the terminal width |

pub mod doctor;
pub mod mounts;
pub mod pods;
pub mod preflight;
pub mod status;
pub mod text;
pub mod tickets;
