//! The node-side work of a `volume-restore` ticket: fill a volume's directory with a
//! copy of its data source, crash-consistently.
//!
//! ```text
//!  MountPod task Populate { source: <root>/<B>, populateFrom: { volume A, <root'>/<A> } }
//!     both checked: a volume's directory strictly beneath an allowed root
//!     refused while a mount on this node serves B (never under a workload)
//!     syncfs on every mount of A on this node, and on A's backend filesystem
//!     copy::copy_volume(A → B, budget = B's size)   (reflink, else bytes)
//! ```

use tracing::{info, warn};

use tessera_api::DataSource;
use tessera_host::copy::{self, CopyStats};

use super::{Error, MountService};

impl MountService {
    /// Fill `source` (the directory of `volume`) with a copy of `from`, at most
    /// `budget` bytes; `progress` sees the running totals.
    pub fn populate(
        &self,
        source: &str,
        volume: &str,
        from: &DataSource,
        budget: u64,
        progress: &mut dyn FnMut(&CopyStats),
    ) -> Result<CopyStats, Error> {
        let to = self.config.allowed_roots.check_source(source, volume)?;
        let origin = self
            .config
            .allowed_roots
            .check_source(&from.source, &from.volume)?;
        let records = self.state.list()?;
        if let Some(r) = records.iter().find(|r| r.source == to.full()) {
            return Err(Error::StillMounted {
                source_dir: to.full(),
                mountpoint: r.mountpoint.clone(),
            });
        }
        // Crash consistency: what the source's mounts on this node accepted is on the
        // backend before the copy reads it.
        for r in records.iter().filter(|r| r.source == origin.full()) {
            match copy::sync_filesystem(&r.mountpoint) {
                Ok(()) => info!(mountpoint = %r.mountpoint.display(), "source mount synced"),
                Err(errno) => {
                    warn!(mountpoint = %r.mountpoint.display(), %errno, "could not sync the source's mount")
                }
            }
        }
        if let Err(errno) = copy::sync_filesystem(&origin.root) {
            warn!(root = %origin.root.display(), %errno, "could not sync the source's backend");
        }
        let stats = copy::copy_volume(&origin, &to, budget, progress)?;
        info!(
            from = %origin.full().display(),
            to = %to.full().display(),
            files = stats.files,
            reflinked = stats.reflinked,
            bytes = stats.bytes,
            "volume populated"
        );
        Ok(stats)
    }
}
