//! Waiting for a condition on one object by watching it, as ControllerPublish and
//! ControllerUnpublish wait for their ticket and the MountPod.
//!
//! ```text
//!  object as just read or written (resourceVersion N)
//!    cond holds? ─▶ done
//!    watch name=<it> from N ─▶ Added/Modified/Deleted: cond? ─▶ done
//!                           └─ watch ended (server timeout): watch again from the last version
//!                           └─ error event (410 Gone: N too old): list + watch afresh
//! ```
//!
//! Starting from the version in hand costs no list before the watch, and no change
//! after that version can be missed. Callers bound the wait with a timeout.

use futures::TryStreamExt;
use kube::api::{Api, WatchEvent};
use kube::core::params::WatchParams;
use kube::runtime::wait::await_condition;

/// The watch failed.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// Starting the watch or reading its events failed.
    #[error("watching {kind} {name}")]
    Watch {
        /// The kind watched.
        kind: String,
        /// The object.
        name: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// A list + watch (the fallback, or a wait for an object not read yet) failed.
    #[error("listing and watching {kind} {name}")]
    Wait {
        /// The kind watched.
        kind: String,
        /// The object.
        name: String,
        /// The cause.
        #[source]
        source: kube::runtime::wait::Error,
    },
}

/// Wait until `cond` holds for the object `from` is a version of: checked on `from`
/// itself, then on every change watched from `from`'s resourceVersion (no list first).
/// Falls back to a fresh list + watch when the server no longer has that version.
/// Returns the object that satisfied `cond` (`None`: it was deleted).
pub async fn await_from<K, F>(api: Api<K>, from: K, cond: F) -> Result<Option<K>, WatchError>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K: Sync,
    K::DynamicType: Default,
    F: Fn(Option<&K>) -> bool + Send + Clone + 'static,
{
    if cond(Some(&from)) {
        return Ok(Some(from));
    }
    let name = from.meta().name.clone().unwrap_or_default();
    let kind = K::kind(&Default::default()).to_string();
    let failed = |source| WatchError::Watch {
        kind: kind.clone(),
        name: name.clone(),
        source,
    };
    let mut rv = from.meta().resource_version.clone().unwrap_or_default();
    let wp = WatchParams::default().fields(&format!("metadata.name={name}"));
    loop {
        let stream = api.watch(&wp, &rv).await.map_err(failed)?;
        futures::pin_mut!(stream);
        while let Some(event) = stream.try_next().await.map_err(failed)? {
            match event {
                WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                    rv = o.meta().resource_version.clone().unwrap_or(rv);
                    if cond(Some(&o)) {
                        return Ok(Some(o));
                    }
                }
                WatchEvent::Deleted(o) => {
                    rv = o.meta().resource_version.clone().unwrap_or(rv);
                    if cond(None) {
                        return Ok(None);
                    }
                }
                WatchEvent::Bookmark(b) => rv = b.metadata.resource_version,
                // Too old (410 Gone) or any other watch error: list and watch afresh.
                WatchEvent::Error(_) => {
                    return await_condition(api, &name, cond).await.map_err(|source| {
                        WatchError::Wait {
                            kind: kind.clone(),
                            name: name.clone(),
                            source,
                        }
                    });
                }
            }
        }
        // The server ended the watch (its timeout): resume from the last version.
    }
}
