//! The FUSE filesystem of one volume on one node (`tessera mount`). Knows nothing of
//! Kubernetes. (Being written.)

use std::path::PathBuf;

/// Command line of `tessera mount`.
#[derive(clap::Args, Debug, Clone)]
pub struct MountArgs {
    /// The volume's directory on the node (the backend root joined with the volume name).
    #[arg(long)]
    pub source: PathBuf,
    /// Where to mount the filesystem.
    #[arg(long)]
    pub mountpoint: PathBuf,
    /// Quota in bytes.
    #[arg(long)]
    pub capacity_bytes: u64,
    /// A file holding the quota in bytes (decimal); re-read on SIGHUP, so the quota can
    /// grow on a mounted volume.
    #[arg(long)]
    pub capacity_file: Option<PathBuf>,
    /// Mount read-only.
    #[arg(long)]
    pub read_only: bool,
    /// Extra mount options (comma separated, as in mount -o).
    #[arg(long, value_delimiter = ',')]
    pub options: Vec<String>,
}

/// Errors of the mount role.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not built yet.
    #[error("tessera mount is not implemented yet")]
    NotImplemented,
}

/// Serve the volume until unmounted or signalled.
pub fn run(_args: MountArgs) -> Result<(), Error> {
    Err(Error::NotImplemented)
}
