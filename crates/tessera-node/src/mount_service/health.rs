//! How a recorded mount is doing ([`MountService::health`]): its daemon's liveness
//! and a probe of its mount point, read into a [`Health`]; a mount that answered
//! before and is silent for less than [`hang_grace`] is `Slow`, not `Broken`.

use tracing::warn;

use tessera_host::mounts::Probe;

use super::hung::hang_grace;
use super::{Health, MountService};
use crate::supervisor::{Liveness, Record};

impl MountService {
    /// How the mount of `record` is doing.
    pub fn health(&self, record: &Record) -> Health {
        match self.daemons.liveness(record.daemon, &record.mountpoint) {
            Liveness::Exited(why) => Health::Broken(why),
            Liveness::Running => {
                let young = record.age() < self.config.start_timeout;
                match self
                    .mounts
                    .probe(&record.mountpoint, self.config.probe_timeout)
                {
                    Probe::Answers { .. } => {
                        self.hung.answered(record);
                        Health::Healthy
                    }
                    Probe::NotMounted | Probe::TimedOut if young => Health::Starting,
                    Probe::TimedOut if record.answered => {
                        let (silent, first) = self.hung.silent(record);
                        let grace = hang_grace(self.config.start_timeout);
                        let why = format!(
                            "mount point {} did not answer within {:?} (silent for {:.1?})",
                            record.mountpoint.display(),
                            self.config.probe_timeout,
                            silent
                        );
                        if first {
                            warn!(volume = %record.volume, cause = %why, grace = ?grace, "mount slow to answer; repaired only if silent for the grace");
                        }
                        match silent < grace {
                            true => Health::Slow(why),
                            false => Health::Broken(why),
                        }
                    }
                    Probe::NotMounted => Health::Broken(format!(
                        "fuse daemon runs but nothing is mounted at {}",
                        record.mountpoint.display()
                    )),
                    Probe::TimedOut => Health::Broken(format!(
                        "mount point {} did not answer within {:?}",
                        record.mountpoint.display(),
                        self.config.probe_timeout
                    )),
                    Probe::Broken(errno) => Health::Broken(format!("mount point broken: {errno}")),
                    Probe::Missing => Health::Broken(format!(
                        "mount point {} is missing",
                        record.mountpoint.display()
                    )),
                }
            }
        }
    }
}
