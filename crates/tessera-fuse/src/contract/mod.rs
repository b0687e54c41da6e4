//! The contract between the node agent (`tessera node`) and the processes it starts,
//! `tessera mount` and `tessera fd-holder`: everything both sides must read the same
//! way, defined once and imported by both. Agents and daemons of different releases
//! run side by side during an upgrade, so nothing here changes shape: a new flag gets
//! a default, a new layout a new magic, a new request a new op.
//!
//! ```text
//!  node agent ──args::MountArgs::to_args──▶ tessera mount (parses args::MountArgs)
//!  node agent ──args::HolderArgs::to_args─▶ tessera fd-holder (parses args::HolderArgs)
//!  node agent ◀──counters::read── <state>/mounts/<volume>.counters ◀──counters:: tessera mount
//!  node agent ──control::capacity_text, settings::settings_text, control::RELOAD──▶ tessera mount
//!  node agent ◀──ready::wait── --ready-fd pipe ◀──ready::say_mounted── tessera mount
//!  node agent, tessera mount ──holder_socket (take, claim, forget, PUT; agent: MOUNTED)──▶ fd holder
//!  node agent ──kernel_mount::plan─▶ mount(2) ─fd─▶ holder ─CLAIM─▶ tessera mount --mounted (same plan)
//!  node agent ──fence::news_text──▶ <state>/node.fence ──fence::News::parse──▶ tessera mount
//! ```
//!
//! [`args`] the command lines, [`control`] the signals and the capacity file,
//! [`settings`] the settings file, [`fence`] the fence file and self-fencing, [`counters`] the counters file's layout (written
//! by the daemon, read by the agent), [`holder_socket`] the fd holder's wire protocol
//! and its clients' calls, [`kernel_mount`] the flags and options of the FUSE mount
//! (the daemon's own or the agent's), [`ready`] the readiness pipe (`--ready-fd`: one byte,
//! then EOF). Nothing here knows of Kubernetes.

pub mod args;
pub mod control;
pub mod counters;
pub mod fence;
pub mod holder_socket;
pub mod kernel_mount;
pub mod ready;
pub mod settings;
