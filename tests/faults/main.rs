//! Faults on the real control plane, one module per area, all in one test binary
//! (`cargo test --test faults`; one area: `cargo test --test faults chaos::`): Tessera's
//! processes killed mid-work, the leader Lease handed over, the API server restarted.
//!
//! Every test holds [`SERIAL`] throughout, so they run one at a time: an API server
//! restart would disturb any test beside it, and each test loads the machine enough to
//! distort another's figures. They have a binary of their own so that no other test
//! runs beside them either.

#[path = "../support/mod.rs"]
mod support;

mod chaos;
mod controller_faults;

/// Held by every test of this binary for its whole run.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
