//! `pod-checkpointer inspect`: what is checkpointed, in which state, and what the kubelet
//! would start after a reboot right now. Reads the disk only: works without an API
//! server and while another copy holds the lock.

use std::path::Path;

use ckpt_core::revisions::RevisionSettings;
use ckpt_core::{DataKind, PersistentState, PodId, Timestamp};
use ckpt_store::{LoadedJournal, Store, StoredCheckpoint};
use serde::Serialize;

use crate::config::{DiskSettings, OutputFormat};
use crate::error::{Error, Result};

/// One checkpoint, as `inspect` reports it.
#[derive(Debug, Serialize)]
pub(crate) struct CheckpointReport {
    pub(crate) pod: String,
    /// `active`, `inactive`, or `active-only` (an active manifest without an inactive copy).
    pub(crate) state: &'static str,
    pub(crate) owner: Option<String>,
    pub(crate) parent_uid: Option<String>,
    pub(crate) checkpointed_at: Option<String>,
    pub(crate) age_seconds: Option<i64>,
    pub(crate) inactive_manifest: Option<String>,
    pub(crate) active_manifest: Option<String>,
    pub(crate) data_files: usize,
    /// When the parent was first seen missing from a synced API view (GC pending).
    pub(crate) parent_absent_since: Option<String>,
    /// The content on disk is the one its parent proved (Ready for a minute with it).
    pub(crate) known_good: bool,
    /// When the parent last proved a content, this one or an earlier one.
    pub(crate) known_good_since: Option<String>,
    /// Set aside since then because it crash-looped while active: its mark is suspended
    /// (`known_good` says false) while the revision run instead is on trial, until the API
    /// server is reached (the mark then goes for good: the other one brought it back).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) known_good_suspended_since: Option<String>,
    /// The kubelet runs this after a reboot (its manifest is in the manifests dir).
    pub(crate) runs_after_reboot: bool,
    /// Its place among the revisions of its DaemonSet on this node, when there are several.
    pub(crate) revision: Option<RevisionReport>,
}

/// A checkpoint that is one of several revisions (`--revisions`).
#[derive(Debug, Serialize)]
pub(crate) struct RevisionReport {
    /// How many revisions its DaemonSet has here.
    pub(crate) of: usize,
    /// It is the newest (its parent's current content).
    pub(crate) newest: bool,
    /// An activation runs this one: the newest known-good revision, else the newest.
    pub(crate) runs_if_api_lost: bool,
}

#[derive(Debug, Serialize)]
pub(crate) struct InspectReport {
    pub(crate) lock_holder: Option<String>,
    pub(crate) checkpoints: Vec<CheckpointReport>,
    pub(crate) runs_after_reboot: Vec<String>,
    /// The kubeconfig kept for the agent's static copy; `None` when there is none (the
    /// static copy then runs offline unless it is given a kubeconfig).
    pub(crate) static_copy_credentials: Option<CredentialsReport>,
    /// When a read first said that the agent's own DaemonSet is deleted or no longer
    /// targets this node (the journal's clock): self-GC comes the grace period after it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) self_gc_pending_since: Option<String>,
    /// The active checkpoints holding a due self-GC back, as the last synced pass saw them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) self_gc_deferred: Vec<String>,
    /// The known-good and rejected marks are unknown: the journal was lost (found
    /// unusable and set aside by the agent, or unusable now) and no synced pass has made
    /// them known again; `known_good` and the revisions' roles then say less than the
    /// node once knew.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) revision_marks_unknown: bool,
    /// Why the journal on disk cannot be used, if it cannot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) journal_unusable: Option<String>,
}

/// The kept kubeconfig: whether the static copy will still reach the API server.
#[derive(Debug, Serialize)]
pub(crate) struct CredentialsReport {
    pub(crate) path: String,
    /// When its token was last refreshed.
    pub(crate) written_at: Option<String>,
    /// When its token expires, if it can be read (a JWT's `exp`).
    pub(crate) token_expires_at: Option<String>,
    pub(crate) token_expired: Option<bool>,
}

pub(crate) fn report(
    disk: &DiskSettings,
    revisions: &RevisionSettings,
    now: Timestamp,
) -> Result<InspectReport> {
    let store = Store::open_read_only(disk.layout())
        .map_err(|e| Error::runtime(format!("cannot read {}", disk.checkpoint_dir.display()), e))?;
    let all = store
        .read_all()
        .map_err(|e| Error::runtime("cannot read the checkpoints", e))?;
    // Read-only: an unusable journal is reported, left where it is.
    let (state, journal_unusable) = match store.load_journal::<PersistentState>() {
        Ok(LoadedJournal::Read(state)) => (state, None),
        Ok(LoadedJournal::Missing) => (PersistentState::default(), None),
        Ok(LoadedJournal::Unusable { reason, .. }) => (PersistentState::default(), Some(reason)),
        Err(e) => (PersistentState::default(), Some(ckpt_core::error_chain(&e))),
    };
    let lock_holder = ckpt_lock::read_holder(&disk.lock_file)
        .ok()
        .flatten()
        .map(|h| h.to_string());
    let on_disk = (all.iter())
        .map(|(id, stored)| (id.clone(), stored.disk_checkpoint()))
        .collect();
    // The marks the planner goes by: a suspended one counts as none.
    let mut known_good = state.known_good.clone();
    known_good.retain(|id, _| suspension(&state, id).is_none());
    let roles = ckpt_core::revisions::roles(&on_disk, &known_good, revisions);
    let checkpoints: Vec<CheckpointReport> = all
        .iter()
        .map(|(id, stored)| {
            let mut report = checkpoint_report(&store, id, stored, &state, now);
            report.revision = roles.get(id).map(|role| RevisionReport {
                of: role.of,
                newest: role.newest,
                runs_if_api_lost: role.runs,
            });
            report
        })
        .collect();
    let runs_after_reboot = checkpoints
        .iter()
        .filter(|c| c.runs_after_reboot)
        .map(|c| c.pod.clone())
        .collect();
    Ok(InspectReport {
        lock_holder,
        checkpoints,
        runs_after_reboot,
        static_copy_credentials: credentials_report(
            &store.layout().credentials_path(),
            &store.layout().credentials_token_path(),
            now,
        ),
        self_gc_pending_since: state.self_gc_since.map(|t| t.to_rfc3339()),
        self_gc_deferred: state.self_gc_deferred.iter().map(ToString::to_string).collect(),
        revision_marks_unknown: state.marks_unknown || journal_unusable.is_some(),
        journal_unusable,
    })
}

fn credentials_report(path: &Path, token_path: &Path, now: Timestamp) -> Option<CredentialsReport> {
    std::fs::symlink_metadata(path).ok()?;
    // symlink_metadata: a planted link is reported as unknown, never followed.
    let token_meta = std::fs::symlink_metadata(token_path).ok();
    let bytes = match &token_meta {
        Some(meta) if meta.is_file() => std::fs::read(token_path).unwrap_or_default(),
        _ => Vec::new(),
    };
    let written_at = token_meta
        .as_ref()
        .and_then(|meta| meta.modified().ok())
        // Saturating: a file time past year 292 million must not wrap to a negative one.
        .map(|t| Timestamp::from(t).to_rfc3339());
    let expiry = crate::credentials::token_expiry(&bytes).map(|secs| Timestamp(secs.saturating_mul(1000)));
    Some(CredentialsReport {
        path: path.display().to_string(),
        written_at,
        token_expires_at: expiry.map(|t| t.to_rfc3339()),
        token_expired: expiry.map(|t| t <= now),
    })
}

fn checkpoint_report(
    store: &Store,
    id: &PodId,
    stored: &StoredCheckpoint,
    state: &PersistentState,
    now: Timestamp,
) -> CheckpointReport {
    let meta = stored.meta();
    let checkpointed_at = meta.and_then(|m| m.checkpointed_at);
    let data_files = DataKind::ALL
        .iter()
        .map(|kind| count_files(&store.layout().pod_data_dir(*kind, id)))
        .sum();
    CheckpointReport {
        pod: id.to_string(),
        state: match (&stored.inactive, &stored.active) {
            (_, None) => "inactive",
            (Some(_), Some(_)) => "active",
            (None, Some(_)) => "active-only",
        },
        owner: meta
            .and_then(|m| m.owner.as_ref())
            .map(|o| format!("{}/{}", o.kind, o.name)),
        parent_uid: meta.and_then(|m| m.parent_uid.clone()),
        checkpointed_at: checkpointed_at.map(|t| t.to_rfc3339()),
        age_seconds: checkpointed_at.map(|t| now.0.saturating_sub(t.0) / 1000),
        inactive_manifest: stored.inactive.as_ref().map(|m| m.path.display().to_string()),
        active_manifest: stored.active.as_ref().map(|m| m.path.display().to_string()),
        data_files,
        parent_absent_since: state.absent_since.get(id).map(|t| t.to_rfc3339()),
        known_good: (state.known_good.get(id))
            .zip(meta.and_then(|m| m.spec_hash.as_deref()))
            .is_some_and(|(proven, on_disk)| proven.spec_hash == on_disk)
            && suspension(state, id).is_none(),
        known_good_since: state.known_good.get(id).map(|k| k.since.to_rfc3339()),
        known_good_suspended_since: suspension(state, id).map(|s| s.since.to_rfc3339()),
        runs_after_reboot: stored.active.is_some(),
        revision: None,
    }
}

/// A revision's suspended mark, unless the revision run instead failed alike (then the mark
/// holds again).
fn suspension<'s>(state: &'s PersistentState, id: &PodId) -> Option<&'s ckpt_core::Suspension> {
    state.suspended.get(id).filter(|s| !s.failed_alike)
}

/// `newest`/`older` of N, and `runs if the API is lost` for the one an activation runs.
fn revision(r: &RevisionReport) -> String {
    let which = if r.newest { "newest" } else { "older" };
    let runs = if r.runs_if_api_lost {
        ", runs if the API is lost"
    } else {
        ""
    };
    format!("{which} of {}{runs}", r.of)
}

fn count_files(dir: &Path) -> usize {
    // symlink_metadata: never follow a planted link out of our tree.
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.path().symlink_metadata() {
            Ok(m) if m.is_dir() => count_files(&e.path()),
            Ok(m) if m.is_file() && !e.file_name().to_string_lossy().starts_with('.') => 1,
            _ => 0,
        })
        .sum()
}

pub(crate) fn render(report: &InspectReport, format: OutputFormat) -> String {
    match format {
        OutputFormat::Json => serde_json::to_string_pretty(report).unwrap_or_default() + "\n",
        OutputFormat::Table => render_table(report),
    }
}

fn render_table(report: &InspectReport) -> String {
    let mut rows: Vec<[String; 9]> = vec![[
        "CHECKPOINT".into(),
        "STATE".into(),
        "OWNER".into(),
        "AGE".into(),
        "FILES".into(),
        "KNOWN-GOOD".into(),
        "PARENT ABSENT SINCE".into(),
        "RUNS AFTER REBOOT".into(),
        "REVISION".into(),
    ]];
    for c in &report.checkpoints {
        rows.push([
            c.pod.clone(),
            c.state.to_owned(),
            c.owner.clone().unwrap_or_else(|| "-".into()),
            c.age_seconds.map(age).unwrap_or_else(|| "-".into()),
            c.data_files.to_string(),
            if c.known_good { "yes" } else { "no" }.into(),
            c.parent_absent_since.clone().unwrap_or_else(|| "-".into()),
            if c.runs_after_reboot { "yes" } else { "no" }.into(),
            c.revision.as_ref().map_or_else(|| "-".into(), revision),
        ]);
    }
    let widths: Vec<usize> = (0..9)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    if report.checkpoints.is_empty() {
        out.push_str("(no checkpoints)\n");
    }
    let fallbacks: Vec<&str> = (report.checkpoints.iter())
        .filter(|c| {
            c.revision
                .as_ref()
                .is_some_and(|r| r.runs_if_api_lost && !r.newest)
        })
        .map(|c| c.pod.as_str())
        .collect();
    if !fallbacks.is_empty() {
        out.push_str(&format!(
            "\nNot proven yet, so losing the API would run the known-good revision instead: {}\n",
            fallbacks.join(", ")
        ));
    }
    out.push_str(&format!(
        "\nAfter a reboot right now the kubelet would start: {}\n",
        if report.runs_after_reboot.is_empty() {
            "nothing".to_owned()
        } else {
            report.runs_after_reboot.join(", ")
        }
    ));
    if let Some(since) = &report.self_gc_pending_since {
        out.push_str(&format!(
            "Self-GC pending: the agent's DaemonSet was first read as deleted or no longer targeting this \
             node at {since}; everything goes once the grace period has passed since then, unless a read \
             says it targets the node again\n"
        ));
    }
    if !report.self_gc_deferred.is_empty() {
        out.push_str(&format!(
            "Self-GC held back by: {} (each serves a DaemonSet that still targets this node; the agent \
             stays with them until its pod runs here, its DaemonSet stops targeting the node, `drain \
             --force`, or the Node is annotated {}=true)\n",
            report.self_gc_deferred.join(", "),
            ckpt_core::ANNOTATION_DECOMMISSION
        ));
    }
    if let Some(reason) = &report.journal_unusable {
        out.push_str(&format!(
            "State journal unusable ({reason}): the agent sets it aside when it starts\n"
        ));
    }
    if report.revision_marks_unknown {
        out.push_str(
            "Known-good and rejected marks unknown: the state journal was lost; an active older revision \
             serves on until its DaemonSet's newest pod is Ready, no handoff, no set-aside\n",
        );
    }
    out.push_str(&format!(
        "Lock: {}\n",
        report.lock_holder.as_deref().unwrap_or("no holder recorded")
    ));
    out.push_str(&format!(
        "Static copy's API credentials: {}\n",
        match &report.static_copy_credentials {
            None => "none kept (the static copy runs offline unless given a kubeconfig)".to_owned(),
            Some(c) => format!(
                "{} (written {}; token {})",
                c.path,
                c.written_at.as_deref().unwrap_or("at an unknown time"),
                match (&c.token_expires_at, c.token_expired) {
                    (Some(at), Some(true)) => format!("EXPIRED at {at}"),
                    (Some(at), _) => format!("valid until {at}"),
                    _ => "expiry unknown".to_owned(),
                }
            ),
        }
    ));
    out
}

fn age(seconds: i64) -> String {
    match seconds.max(0) {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}
