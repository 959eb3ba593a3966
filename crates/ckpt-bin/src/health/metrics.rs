//! `/metrics` in the Prometheus text format: the agent's own `pod_checkpointer_*` families
//! (labels only from small fixed sets: states, reasons, steps, the configured strategy) and
//! the standard `process_*` ones.

use super::process::ProcessSample;
use super::{BUCKETS, Counters, Phase};

/// One scrape's text. The files behind `kept_token_expiry` and `process` are read before
/// the counters' lock is taken (see `Health::render_metrics`).
pub(super) fn render(
    counters: &Counters,
    phase: Phase,
    kept_token_expiry: Option<i64>,
    process: Option<&ProcessSample>,
) -> String {
    let mut out = Exposition {
        text: String::new(),
        prefix: "pod_checkpointer_",
    };
    checkpoints(&mut out, counters);
    api_and_lock(&mut out, counters, phase);
    passes(&mut out, counters);
    out.sample(
        "build_info",
        "gauge",
        "Always 1; the agent's version as a label.",
        format!("{{version=\"{}\"}}", env!("CARGO_PKG_VERSION")),
        1,
    );
    if let Some(expiry) = kept_token_expiry {
        out.sample(
            "kept_token_expiry_timestamp_seconds",
            "gauge",
            "When the API token kept for the static copy expires, in seconds since the epoch (absent without one).",
            String::new(),
            expiry,
        );
    }
    if let Some(p) = process {
        out.prefix = "process_";
        process_metrics(&mut out, p);
    }
    out.text
}

/// Metric families written one after the other, each name under `prefix`.
struct Exposition {
    text: String,
    prefix: &'static str,
}

impl Exposition {
    /// A family's HELP and TYPE lines, then one line per `(labels, value)` sample (`labels`
    /// is `{…}`, a histogram's `_bucket{…}`, or empty).
    fn family(&mut self, name: &str, kind: &str, help: &str, samples: Vec<(String, String)>) {
        let prefix = self.prefix;
        self.text.push_str(&format!(
            "# HELP {prefix}{name} {help}\n# TYPE {prefix}{name} {kind}\n"
        ));
        for (labels, value) in samples {
            self.text.push_str(&format!("{prefix}{name}{labels} {value}\n"));
        }
    }

    /// A family of one sample.
    fn sample(&mut self, name: &str, kind: &str, help: &str, labels: String, value: impl ToString) {
        self.family(name, kind, help, vec![(labels, value.to_string())]);
    }

    /// A family of one sample without labels.
    fn value(&mut self, name: &str, kind: &str, help: &str, value: impl ToString) {
        self.sample(name, kind, help, String::new(), value);
    }
}

/// What happened to checkpoints: on disk by state, activated, deactivated, removed,
/// failed writes, refused parents, handoffs and revisions set aside.
fn checkpoints(out: &mut Exposition, c: &Counters) {
    let states = ["inactive", "inactive-grace", "active", "active-grace", "self"];
    out.family(
        "checkpoints",
        "gauge",
        "Checkpoints on disk by state.",
        states
            .iter()
            .map(|s| {
                (
                    format!("{{state=\"{s}\"}}"),
                    c.checkpoints_by_state.get(s).copied().unwrap_or(0).to_string(),
                )
            })
            .collect(),
    );
    out.value(
        "activations_total",
        "counter",
        "Checkpoints activated.",
        c.activations,
    );
    out.value(
        "deactivations_total",
        "counter",
        "Checkpoints deactivated.",
        c.deactivations,
    );
    out.family(
        "removals_total",
        "counter",
        "Checkpoints removed, by the configured GC strategy and the reason: gc (the strategy's verdict), superseded-self, self-gc, namespace-not-allowed or completed.",
        c.removals
            .iter()
            .map(|((s, r), n)| (format!("{{strategy=\"{}\",reason=\"{r}\"}}", escape(s)), n.to_string()))
            .collect(),
    );
    out.value(
        "write_errors_total",
        "counter",
        "Failed disk operations.",
        c.write_errors,
    );
    out.value(
        "refused_total",
        "counter",
        "Parents refused as not representable as static pods.",
        c.refused,
    );
    out.family(
        "handoffs_total",
        "counter",
        "Handoffs from a known-good checkpoint to a parent with unproven content, by step: started (the checkpoint stepped aside), ready (the parent became Ready in time), failed (it did not: the checkpoint is back).",
        (ckpt_core::revisions::Handoff::ALL.iter().zip(c.handoffs))
            .map(|(step, n)| (format!("{{step=\"{}\"}}", step.code()), n.to_string()))
            .collect(),
    );
    out.value(
        "revisions_set_aside_total",
        "counter",
        "Active revisions that crash-looped while the API server was unreachable, replaced by the previous known-good revision.",
        c.set_aside,
    );
    out.value(
        "journal_unusable_total",
        "counter",
        "State journals found unusable at start (unreadable, not JSON, another schema), moved to the quarantine dir.",
        c.journals_unusable,
    );
    out.value(
        "revision_marks_unknown",
        "gauge",
        "Whether the known-good and rejected marks are unknown (the state journal was lost): an active older revision serves on, no handoff, no set-aside.",
        u8::from(c.marks_unknown),
    );
}

/// What this copy sees of the API server and the node, and whether it holds the lock.
fn api_and_lock(out: &mut Exposition, c: &Counters, phase: Phase) {
    out.value(
        "lock_handovers_total",
        "counter",
        "Times this copy released the lock because the API server kept rejecting its credentials.",
        c.handovers,
    );
    out.family(
        "api_state",
        "gauge",
        "API server view: unreachable, reachable (not synced), unauthorized (credentials rejected) or synced.",
        ckpt_core::ApiState::ALL
            .iter()
            .map(|s| s.as_str())
            .map(|s| {
                (
                    format!("{{state=\"{s}\"}}"),
                    u8::from(c.api_state == s).to_string(),
                )
            })
            .collect(),
    );
    out.family(
        "self_scheduling",
        "gauge",
        "While the agent's own pod is gone from a synced view: whether its DaemonSet targets this node \
         (targeted), no longer does (descheduled), is deleted, or cannot be read (unknown: self-GC held \
         back, every checkpoint kept). All 0 while the pod is listed.",
        ckpt_core::SelfScheduling::NAMES
            .iter()
            .map(|s| {
                (
                    format!("{{state=\"{s}\"}}"),
                    u8::from(c.self_scheduling == Some(*s)).to_string(),
                )
            })
            .collect(),
    );
    out.family(
        "self_checkpointed",
        "gauge",
        "Whether the agent's own pod is checkpointed (1), so that its static copy restarts it after a \
         reboot, or not (0: its pod lacks the checkpoint annotation, or its namespace is outside \
         --namespaces). Absent until a pass could tell.",
        (c.self_checkpointed.iter())
            .map(|checkpointed| (String::new(), u8::from(*checkpointed).to_string()))
            .collect(),
    );
    out.value(
        "self_gc_deferred",
        "gauge",
        "Active checkpoints holding a due self-GC back: the agent's DaemonSet no longer runs it here, but \
         each serves a DaemonSet that still targets this node, so it and the agent stay.",
        c.self_gc_deferred,
    );
    out.value(
        "local_view_available",
        "gauge",
        "Whether the container runtime (or kubelet) answered on the last pass.",
        u8::from(c.local_view_available),
    );
    out.value(
        "cri_answers_too_large_total",
        "counter",
        "Container runtime answers refused for being over 16 MiB (the local view is unknown then).",
        c.cri_answers_too_large,
    );
    out.value(
        "last_api_sync_timestamp_seconds",
        "gauge",
        "When the API view was last synced, in seconds since the epoch (0: never).",
        c.last_sync
            .map_or("0".into(), |t| format!("{:.3}", t.0 as f64 / 1000.0)),
    );
    out.value(
        "lock_held",
        "gauge",
        "Whether this copy holds the lock (is the active copy).",
        u8::from(matches!(phase, Phase::Starting | Phase::Ready)),
    );
}

/// How long passes take: a histogram.
fn passes(out: &mut Exposition, c: &Counters) {
    let mut samples: Vec<(String, String)> = BUCKETS
        .iter()
        .zip(c.pass_buckets)
        .map(|(le, n)| (format!("_bucket{{le=\"{le}\"}}"), n.to_string()))
        .collect();
    samples.push(("_bucket{le=\"+Inf\"}".into(), c.passes.to_string()));
    samples.push(("_sum".into(), format!("{:.6}", c.pass_sum)));
    samples.push(("_count".into(), c.passes.to_string()));
    out.family(
        "pass_duration_seconds",
        "histogram",
        "Duration of a pass (observe, plan, execute).",
        samples,
    );
}

/// The standard `process_*` metrics (see [`super::process`]).
fn process_metrics(out: &mut Exposition, p: &ProcessSample) {
    out.value(
        "resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
        p.resident_bytes,
    );
    out.value(
        "virtual_memory_bytes",
        "gauge",
        "Virtual memory size in bytes.",
        p.virtual_bytes,
    );
    out.value(
        "cpu_seconds_total",
        "counter",
        "Total user and system CPU time spent in seconds.",
        format!("{:.2}", p.cpu_seconds),
    );
    out.value(
        "start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
        format!("{:.2}", p.start_time_seconds),
    );
    if let Some(n) = p.open_fds {
        out.value("open_fds", "gauge", "Number of open file descriptors.", n);
    }
    if let Some(n) = p.max_fds {
        out.value("max_fds", "gauge", "Maximum number of open file descriptors.", n);
    }
}

/// A label value in the text format's escaping.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
