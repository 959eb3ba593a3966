//! `pod-checkpointer drain`: remove every checkpoint safely, for uninstalling or
//! migrating to plain static pods.

use std::collections::{BTreeMap, BTreeSet};

use ckpt_core::{LockIdentity, PodId};
use ckpt_lock::{LockFile, TryAcquire};
use ckpt_store::{Store, StoredCheckpoint};

use crate::config::DiskSettings;
use crate::error::{Error, Result};

/// Removes every checkpoint (and data directories left without one). Refuses while a
/// running agent holds the lock, unless `force`; without `force` it takes the lock, so no
/// agent starts half-way. The agent's own checkpoint, if recognisable from the lock
/// holder, goes last: removing it stops the static copy.
pub(crate) fn drain(disk: &DiskSettings, force: bool) -> Result<Vec<String>> {
    let lock = LockFile::new(
        &disk.lock_file,
        format!("pod-checkpointer drain pid={}", std::process::id()),
    );
    let mut holder_pod = None;
    let _guard = match lock.try_acquire() {
        Ok(TryAcquire::Acquired(guard)) => Some(guard),
        Ok(TryAcquire::Busy { holder }) if force => {
            holder_pod = holder
                .as_ref()
                .and_then(|h| LockIdentity::parse(&h.identity))
                .map(|i| i.parent_id());
            None
        }
        Ok(TryAcquire::Busy { holder }) => {
            let who = holder
                .map(|h| h.to_string())
                .unwrap_or_else(|| "another process".into());
            return Err(Error::usage_message(format!(
                "a running pod-checkpointer holds {} ({who}); stop it first, or use --force",
                disk.lock_file.display()
            )));
        }
        Err(e) if force => {
            tracing::warn!(error = %e, "cannot take the lock; draining anyway (--force)");
            None
        }
        Err(e) => {
            return Err(Error::runtime(
                format!("cannot take the lock {}", disk.lock_file.display()),
                e,
            ));
        }
    };
    let store =
        Store::open(disk.layout()).map_err(|e| Error::runtime("cannot open the checkpoint store", e))?;
    let (stored, with_data) = read_store(&store)?;
    let mut removed = Vec::new();
    for id in removal_order(stored.into_keys(), with_data, holder_pod.as_ref()) {
        let summary = store
            .remove(&id)
            .map_err(|e| Error::runtime(format!("cannot remove the checkpoint of {id}"), e))?;
        if summary.removed_anything() {
            removed.push(format!(
                "{id}: {} data dir(s){}{}",
                summary.data_dirs_removed,
                if summary.inactive_removed {
                    ", inactive manifest"
                } else {
                    ""
                },
                if summary.active_removed {
                    ", active manifest"
                } else {
                    ""
                },
            ));
        }
    }
    if store
        .remove_credentials()
        .map_err(|e| Error::runtime("cannot remove the kept API credentials", e))?
    {
        removed.push(format!(
            "the static copy's API credentials ({})",
            store.layout().credentials_path().display()
        ));
    }
    // Nothing is left to time; an uninstalled node keeps no file of ours.
    store
        .remove_journal()
        .map_err(|e| Error::runtime("cannot remove the state journal", e))?;
    Ok(removed)
}

/// `drain --dry-run`: what [`drain`] would remove, in the same order, changing nothing. It
/// does not take the lock (a running agent keeps it undisturbed); the holder record, which
/// may be stale, only decides which checkpoint is listed last.
pub(crate) fn dry_run(disk: &DiskSettings) -> Result<Vec<String>> {
    let holder_pod = ckpt_lock::read_holder(&disk.lock_file)
        .ok()
        .flatten()
        .and_then(|h| LockIdentity::parse(&h.identity))
        .map(|i| i.parent_id());
    let store = Store::open_read_only(disk.layout())
        .map_err(|e| Error::runtime("cannot open the checkpoint store", e))?;
    let (stored, with_data) = read_store(&store)?;
    let mut planned = Vec::new();
    let order = removal_order(stored.keys().cloned(), with_data.clone(), holder_pod.as_ref());
    for id in order {
        let checkpoint = stored.get(&id);
        let parts: Vec<&str> = [
            (with_data.contains(&id), "data"),
            (
                checkpoint.is_some_and(|c| c.inactive.is_some()),
                "inactive manifest",
            ),
            (checkpoint.is_some_and(|c| c.active.is_some()), "active manifest"),
        ]
        .into_iter()
        .filter_map(|(present, what)| present.then_some(what))
        .collect();
        planned.push(format!("{id}: {}", parts.join(", ")));
    }
    let credentials = store.layout().credentials_path();
    if credentials.exists() {
        planned.push(format!(
            "the static copy's API credentials ({})",
            credentials.display()
        ));
    }
    Ok(planned)
}

/// The checkpoints on disk, and the pods with checkpoint data.
fn read_store(store: &Store) -> Result<(BTreeMap<PodId, StoredCheckpoint>, BTreeSet<PodId>)> {
    let stored = store
        .read_all()
        .map_err(|e| Error::runtime("cannot read the checkpoints", e))?;
    let with_data = store
        .data_pods()
        .map_err(|e| Error::runtime("cannot list checkpoint data", e))?;
    Ok((stored, with_data))
}

/// Every pod with a checkpoint or checkpoint data, sorted, the one named by the lock's
/// holder last: removing it stops the static copy.
fn removal_order(
    checkpoints: impl Iterator<Item = PodId>,
    with_data: BTreeSet<PodId>,
    holder_pod: Option<&PodId>,
) -> Vec<PodId> {
    let mut ids: BTreeSet<PodId> = checkpoints.collect();
    ids.extend(with_data);
    let own = holder_pod.and_then(|p| ids.take(p));
    ids.into_iter().chain(own).collect()
}
