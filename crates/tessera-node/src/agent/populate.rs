//! MountPods of task Populate: the copy of a volume's data source into it (the
//! node-side work of a `volume-restore` ticket), with its progress in Events.
//!
//! Done once per MountPod generation: a Ready status with `DataPopulated` True for the
//! current generation is not copied again. Progress goes to Events on the MountPod
//! (`Populating` at the start, `PopulateProgress` at most every few seconds,
//! `Populated` at the end with the totals and how many files were reflinked).

use std::time::{Duration, Instant};

use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use tessera_api::MountPod;
use tessera_host::copy::CopyStats;
use tessera_runtime::error_chain;

use super::status::Report;
use super::{Context, blocking, finish_task, publish, write_status};
use crate::Error;

/// How often a running copy reports its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

fn done(mp: &MountPod) -> bool {
    mp.status.as_ref().is_some_and(|s| {
        s.observed_generation == mp.metadata.generation
            && s.conditions
                .iter()
                .any(|c| c.type_ == "DataPopulated" && c.status == "True")
    })
}

fn summary(s: &CopyStats) -> String {
    format!(
        "{} files ({} by reflink), {} directories, {} symlinks, {} bytes",
        s.files, s.reflinked, s.dirs, s.symlinks, s.bytes
    )
}

pub(super) async fn populate(mp: &MountPod, ctx: &Context) -> Result<Action, Error> {
    if done(mp) {
        return Ok(Action::await_change());
    }
    let mut current = mp.status.clone().unwrap_or_default();
    let Some(from) = mp.spec.populate_from.clone() else {
        // A populated volume (or one without a data source) is never filled again.
        let msg = "the volume has no data source left to copy (populated already or none): its data is not replaced".to_string();
        let r = Report::task_failed(
            "NothingToPopulate",
            "DataPopulated",
            "NothingToPopulate",
            msg,
        );
        write_status(mp, ctx, &mut current, r).await?;
        return Ok(Action::await_change());
    };
    let note = format!(
        "copying volume {} ({}) into {}",
        from.volume, from.source, mp.spec.source
    );
    publish(ctx, mp, EventType::Normal, "Populating", &note).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<CopyStats>();
    let reporter = {
        let mp = mp.clone();
        async move {
            while let Some(s) = rx.recv().await {
                let note = format!("copied so far: {}", summary(&s));
                publish(ctx, &mp, EventType::Normal, "PopulateProgress", &note).await;
            }
        }
    };
    let host = ctx.host.clone();
    let source = mp.spec.source.clone();
    let volume = mp.spec.volume.clone();
    let budget = u64::try_from(mp.spec.capacity_bytes).unwrap_or(0);
    let (node, anchor) = (
        mp.spec.node_name.clone(),
        mp.spec.shared_root_anchor.clone(),
    );
    let work = blocking(move || {
        // Never filled into a directory that is not the one holding the data.
        host.check_shared(&source, &volume, &node, anchor.as_deref())?;
        let mut last = Instant::now();
        let mut progress = |s: &CopyStats| {
            if last.elapsed() >= PROGRESS_EVERY {
                last = Instant::now();
                let _ = tx.send(*s);
            }
        };
        host.populate(&source, &volume, &from, budget, &mut progress)
    });
    let (res, ()) = tokio::join!(work, reporter);
    let res = res.map_err(Error::Join)?;
    let report = match res {
        Ok(stats) => {
            let msg = format!("copied {}", summary(&stats));
            publish(ctx, mp, EventType::Normal, "Populated", &msg).await;
            Report::task_done("DataPopulated", "Copied", msg)
        }
        Err(e) => {
            let msg = error_chain(&e);
            let failure = match super::failure_reason(&e) {
                "BackendNotShared" => "BackendNotShared",
                _ => "PopulateFailed",
            };
            publish(ctx, mp, EventType::Warning, failure, &msg).await;
            Report::task_failed(failure, "DataPopulated", "CopyFailed", msg)
        }
    };
    finish_task(mp, ctx, current, report).await
}
