//! `/healthz`, `/readyz` and `/metrics` on `--metrics-addr`, and `/healthz` and `/readyz`
//! on `--health-socket`: three GET paths, one request per connection, answered by hyper,
//! the HTTP server of `--metrics-listen` too (one parser for every request the agent
//! reads, fuzzed upstream).
//!
//! Both copies of the agent (the DaemonSet pod and its static copy) run with the host
//! network, so whichever binds the TCP port answers there for the node. The unix socket
//! lives in the pod's own emptyDir: `pod-checkpointer health --ready|--live`, the pods'
//! exec probes, asks it, so each pod's probes reflect that pod's own process.
//!
//! Readiness: a copy waiting on the lock is Ready (`standby`), so a DaemonSet pod that
//! waits while the static copy holds the lock never stalls a rollout; the holder is Ready
//! after its first pass. Liveness fails when the holder has not completed a pass for
//! `stall_after` (several resync intervals: the holder passes at least once per
//! interval), or when the copy is neither holding nor waiting (exiting).

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ckpt_core::Timestamp;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tracing::{debug, info, warn};

use crate::error::{Error, Result};

mod listen;
mod metrics;
mod process;

pub(crate) use listen::serve as serve_for_prometheus;

/// Where the agent is in its life, for `/readyz` and `/healthz`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Waiting for the lock: another copy is active.
    Standby,
    /// Holds the lock; no pass completed yet.
    Starting,
    /// Holds the lock and has completed a pass.
    Ready,
    /// Leaving (signal, self-GC, failure): neither holding nor waiting.
    Stopping,
}

/// What the probes see: the phase, since when, and the last completed pass.
#[derive(Clone, Copy, Debug)]
struct Life {
    phase: Phase,
    since: Instant,
    last_pass: Option<Instant>,
}

/// A probe's answer: HTTP status (200 or 503) and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub(crate) ok: bool,
    pub(crate) body: String,
}

impl Verdict {
    fn ok(body: &str) -> Self {
        Self {
            ok: true,
            body: body.to_owned(),
        }
    }

    fn failed(body: String) -> Self {
        Self { ok: false, body }
    }
}

/// Pass-duration histogram buckets, in seconds.
const BUCKETS: [f64; 8] = [0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0];

#[derive(Debug, Default)]
struct Counters {
    checkpoints_by_state: BTreeMap<&'static str, u64>,
    activations: u64,
    deactivations: u64,
    /// By (strategy, reason code): both from small fixed sets (the configured strategy,
    /// [`ckpt_core::RemovalReason::CODES`]); names of pods and owners stay out of labels.
    removals: BTreeMap<(String, &'static str), u64>,
    write_errors: u64,
    refused: u64,
    /// Handoffs from a known-good checkpoint to a parent, by step, in `Handoff::ALL`'s order.
    handoffs: [u64; 3],
    /// Revisions set aside because they crash-looped while active.
    set_aside: u64,
    /// State journals found unusable at start (kept aside).
    journals_unusable: u64,
    /// The known-good and rejected marks are unknown (the journal was lost).
    marks_unknown: bool,
    handovers: u64,
    passes: u64,
    pass_buckets: [u64; BUCKETS.len()],
    pass_sum: f64,
    api_state: &'static str,
    /// Whether the agent's own DaemonSet targets this node, while its own pod is gone
    /// from a synced view (`None` otherwise): `SelfScheduling::as_str`.
    self_scheduling: Option<&'static str>,
    /// Active checkpoints holding a due self-GC back (they serve DaemonSets that still
    /// target the node).
    self_gc_deferred: usize,
    /// Whether the agent's own pod is checkpointed, once a pass could tell.
    self_checkpointed: Option<bool>,
    local_view_available: bool,
    cri_answers_too_large: u64,
    last_sync: Option<Timestamp>,
}

/// The agent's health and metrics, shared between the loop and the HTTP servers.
#[derive(Debug, Clone)]
pub(crate) struct Health {
    life: Arc<Mutex<Life>>,
    counters: Arc<Mutex<Counters>>,
    stall_after: Duration,
    /// The token kept for the static copy, whose expiry `/metrics` reports.
    kept_token: Option<Arc<PathBuf>>,
}

impl Health {
    /// A copy on standby; liveness fails once the holder goes `stall_after` without
    /// completing a pass.
    pub(crate) fn new(stall_after: Duration) -> Self {
        Self {
            life: Arc::new(Mutex::new(Life {
                phase: Phase::Standby,
                since: Instant::now(),
                last_pass: None,
            })),
            counters: Arc::new(Mutex::new(Counters {
                api_state: "unreachable",
                ..Counters::default()
            })),
            stall_after,
            kept_token: None,
        }
    }

    /// Reports the expiry of the token kept at `path` (read on each scrape).
    pub(crate) fn with_kept_token(mut self, path: PathBuf) -> Self {
        self.kept_token = Some(Arc::new(path));
        self
    }

    fn life(&self) -> std::sync::MutexGuard<'_, Life> {
        self.life.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn set_phase(&self, phase: Phase) {
        let mut life = self.life();
        if life.phase != phase {
            life.phase = phase;
            life.since = Instant::now();
        }
    }

    pub(crate) fn phase(&self) -> Phase {
        self.life().phase
    }

    /// A pass completed now (the holder is alive and making progress).
    pub(crate) fn pass_completed(&self) {
        self.life().last_pass = Some(Instant::now());
    }

    /// `/healthz`: standby, or holding and passing.
    pub(crate) fn liveness(&self, now: Instant) -> Verdict {
        let life = *self.life();
        let stalled = |what: &str, from: Instant| {
            let idle = now.saturating_duration_since(from);
            (idle > self.stall_after).then(|| {
                Verdict::failed(format!(
                    "stalled: {what} for {}s (limit {}s)\n",
                    idle.as_secs(),
                    self.stall_after.as_secs()
                ))
            })
        };
        match life.phase {
            Phase::Standby => Verdict::ok("standby\n"),
            Phase::Starting => stalled("holding the lock, no pass completed", life.since)
                .unwrap_or_else(|| Verdict::ok("starting\n")),
            Phase::Ready => stalled("no pass completed", life.last_pass.unwrap_or(life.since))
                .unwrap_or_else(|| Verdict::ok("ok\n")),
            Phase::Stopping => Verdict::failed("stopping: neither holding nor waiting on the lock\n".into()),
        }
    }

    /// `/readyz`: a healthy copy waiting on the lock (`standby`), or the holder after its
    /// first pass.
    pub(crate) fn readiness(&self, now: Instant) -> Verdict {
        let live = self.liveness(now);
        if !live.ok {
            return live;
        }
        match self.phase() {
            Phase::Standby => Verdict::ok("standby"),
            // The holder cannot sync: not ready, and says why (it hands the lock over).
            Phase::Ready if self.api_state() == "unauthorized" => Verdict::failed(
                "unauthorized: the API server rejects this copy's credentials or forbids its pod reads"
                    .into(),
            ),
            Phase::Ready => Verdict::ok("ok\n"),
            Phase::Starting => Verdict::failed("starting".into()),
            Phase::Stopping => Verdict::failed("stopping".into()),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Counters) -> R) -> R {
        f(&mut self.counters.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub(crate) fn record_pass(&self, duration: Duration, states: BTreeMap<&'static str, u64>) {
        let secs = duration.as_secs_f64();
        self.with(|c| {
            c.passes += 1;
            c.pass_sum += secs;
            for (i, le) in BUCKETS.iter().enumerate() {
                if secs <= *le {
                    c.pass_buckets[i] += 1;
                }
            }
            c.checkpoints_by_state = states;
        });
        self.pass_completed();
    }

    pub(crate) fn record_views(
        &self,
        api_state: &'static str,
        local_available: bool,
        last_sync: Option<Timestamp>,
    ) {
        self.with(|c| {
            c.api_state = api_state;
            c.local_view_available = local_available;
            c.last_sync = last_sync.or(c.last_sync);
        });
    }

    /// The agent's own scheduling as the last pass saw it (`None`: it did not matter).
    pub(crate) fn record_self_scheduling(&self, scheduling: Option<&'static str>) {
        self.with(|c| c.self_scheduling = scheduling);
    }

    /// Whether the agent's own pod is checkpointed, as the last pass that could tell saw it.
    pub(crate) fn record_self_checkpointed(&self, checkpointed: bool) {
        self.with(|c| c.self_checkpointed = Some(checkpointed));
    }

    /// How many active checkpoints hold a due self-GC back, as the last synced pass saw it.
    pub(crate) fn record_self_gc_deferred(&self, count: usize) {
        self.with(|c| c.self_gc_deferred = count);
    }

    /// The runtime answers refused for their size so far (see `ckpt_cri::MAX_ANSWER_BYTES`).
    pub(crate) fn record_cri_answers_too_large(&self, total: u64) {
        self.with(|c| c.cri_answers_too_large = total);
    }

    /// The API state last recorded (`unreachable` before the first pass).
    pub(crate) fn api_state(&self) -> &'static str {
        self.with(|c| c.api_state)
    }

    pub(crate) fn activation(&self) {
        self.with(|c| c.activations += 1);
    }

    pub(crate) fn deactivation(&self) {
        self.with(|c| c.deactivations += 1);
    }

    /// A checkpoint removed under `strategy` (the configured one), for the reason `code`
    /// ([`ckpt_core::RemovalReason::code`]).
    pub(crate) fn removal(&self, strategy: &str, code: &'static str) {
        self.with(|c| *c.removals.entry((strategy.to_owned(), code)).or_default() += 1);
    }

    pub(crate) fn write_error(&self) {
        self.with(|c| c.write_errors += 1);
    }

    pub(crate) fn refused(&self) {
        self.with(|c| c.refused += 1);
    }

    /// A revision set aside because it crash-looped while active.
    pub(crate) fn set_aside(&self) {
        self.with(|c| c.set_aside += 1);
    }

    /// A state journal found unusable at start.
    pub(crate) fn journal_unusable(&self) {
        self.with(|c| c.journals_unusable += 1);
    }

    /// Whether the known-good and rejected marks are unknown after this pass; returns
    /// whether that changed.
    pub(crate) fn set_marks_unknown(&self, unknown: bool) -> bool {
        self.with(|c| std::mem::replace(&mut c.marks_unknown, unknown) != unknown)
    }

    /// A handoff step ([`ckpt_core::revisions::Handoff`]).
    pub(crate) fn handoff(&self, step: ckpt_core::revisions::Handoff) {
        use ckpt_core::revisions::Handoff;
        let i = Handoff::ALL.iter().position(|s| *s == step).unwrap_or_default();
        self.with(|c| c.handoffs[i] += 1);
    }

    /// The lock was handed over: the API server kept rejecting this copy's credentials.
    pub(crate) fn handover(&self) {
        self.with(|c| c.handovers += 1);
    }

    /// The Prometheus text exposition ([`metrics`]).
    pub(crate) fn render_metrics(&self) -> String {
        let phase = self.phase();
        // Files first, outside the lock the probes' answers take too: a read stuck on a
        // failing disk then holds this scrape only.
        let kept_token_expiry = self
            .kept_token
            .as_deref()
            .and_then(|path| kept_token_expiry(path));
        let process = process::sample();
        self.with(|c| metrics::render(c, phase, kept_token_expiry, process.as_ref()))
    }
}

/// The `exp` of the kept token at `path`, if it is a regular file holding a JWT.
fn kept_token_expiry(path: &Path) -> Option<i64> {
    ckpt_store::failpoint::hit("health.kept_token", path).ok()?;
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.is_file() || meta.len() > 64 * 1024 {
        return None;
    }
    crate::credentials::token_expiry(&std::fs::read(path).ok()?)
}

/// Stops serving when dropped.
#[derive(Debug)]
pub(crate) struct Server(tokio::task::JoinHandle<()>);

impl Drop for Server {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Serves on `addr` until the returned [`Server`] is dropped. If the address is taken — the other copy
/// of the agent (DaemonSet and static copy share the host network) holds it — keeps
/// trying in the background instead of failing: whichever copy holds the port answers
/// for the node. Any other bind error is returned.
pub(crate) async fn serve(addr: &str, health: Health) -> std::io::Result<Server> {
    let listener = match TcpListener::bind(addr).await {
        Ok(listener) => Some(listener),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            warn!(%addr, "the health address is in use (by the other copy?); retrying in the background");
            None
        }
        Err(e) => return Err(e),
    };
    let addr = addr.to_owned();
    let task = tokio::spawn(async move {
        let listener = match listener {
            Some(listener) => listener,
            None => loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                if let Ok(listener) = TcpListener::bind(&addr).await {
                    info!(%addr, "serving health and metrics");
                    break listener;
                }
            },
        };
        accept_loop(&listener, health, true).await;
    });
    Ok(Server(task))
}

/// Serves `/healthz` and `/readyz` on the unix socket `path` (in the pod's own emptyDir)
/// until the returned [`Server`] is dropped. A socket left by a process that is gone (a
/// restarted container) is replaced; one a live process answers on is not taken over.
pub(crate) async fn serve_unix(path: &Path, health: Health) -> std::io::Result<Server> {
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            "another process answers on this socket",
        ));
    }
    match std::fs::remove_file(path) {
        Ok(()) => debug!(path = %path.display(), "replaced a stale health socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    let task = tokio::spawn(async move {
        accept_loop(&listener, health, false).await;
    });
    Ok(Server(task))
}

/// At most this many requests are served at once; more wait to be accepted. Each holds a
/// descriptor for up to [`REQUEST_TIMEOUT`]: without a cap, a local process opening
/// connections could exhaust the agent's descriptors (and with them its checkpoint writes).
const MAX_CONNECTIONS: usize = 32;
/// How long one request may take, reading included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The pause after a failed accept (`EMFILE`, say), which would otherwise fail again at
/// once and spin a core.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// A listener the health server accepts connections from.
trait Accept {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept_stream(&self) -> impl std::future::Future<Output = std::io::Result<Self::Stream>> + Send;
}

impl Accept for TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn accept_stream(&self) -> std::io::Result<Self::Stream> {
        Ok(self.accept().await?.0)
    }
}

impl Accept for UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn accept_stream(&self) -> std::io::Result<Self::Stream> {
        Ok(self.accept().await?.0)
    }
}

/// Accepts and answers connections, at most [`MAX_CONNECTIONS`] at once, backing off
/// after a failed accept; runs until its task is aborted.
async fn accept_loop<L: Accept>(listener: &L, health: Health, with_metrics: bool) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut failing = false;
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        match listener.accept_stream().await {
            Ok(stream) => {
                if failing {
                    info!("health connections are accepted again");
                    failing = false;
                }
                let health = health.clone();
                tokio::spawn(async move {
                    let answered = tokio::time::timeout(
                        REQUEST_TIMEOUT,
                        listen::answer_one(stream, &health, with_metrics),
                    );
                    if let Err(e) = answered.await {
                        debug!(error = %e, "health request timed out");
                    }
                    drop(slot);
                });
            }
            Err(e) => {
                if !failing {
                    warn!(error = %e, "cannot accept health connections; retrying");
                    failing = true;
                }
                drop(slot);
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

const TEXT: &str = "text/plain; charset=utf-8";

/// [`route`], with `/metrics` rendered on the blocking pool: it reads files (the kept
/// token, `/proc`), and a read stuck on a failing disk must not hold the thread that
/// answers the liveness probe.
async fn route_off_thread(method: &str, path: &str, health: &Health) -> (&'static str, &'static str, String) {
    let now = Instant::now();
    if !path.starts_with("/metrics") {
        return route(method, path, health, now);
    }
    let (method, path, health) = (method.to_owned(), path.to_owned(), health.clone());
    crate::blocking_pool::blocking(move || route(&method, &path, &health, now)).await
}

fn route(method: &str, path: &str, health: &Health, now: Instant) -> (&'static str, &'static str, String) {
    if method != "GET" {
        return ("405 Method Not Allowed", TEXT, "only GET\n".into());
    }
    let answer = |verdict: Verdict| {
        let status = if verdict.ok {
            "200 OK"
        } else {
            "503 Service Unavailable"
        };
        (status, TEXT, verdict.body)
    };
    match path.split('?').next().unwrap_or("") {
        "/healthz" => answer(health.liveness(now)),
        "/readyz" => answer(health.readiness(now)),
        "/metrics" => ("200 OK", "text/plain; version=0.0.4", health.render_metrics()),
        _ => ("404 Not Found", TEXT, "not found\n".into()),
    }
}

/// Which endpoint `pod-checkpointer health` asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ProbeKind {
    Ready,
    Live,
}

/// How long `pod-checkpointer health` waits for the agent (below the probes' timeout).
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// `pod-checkpointer health`: asks the agent on `socket`; the body when it answers 200,
/// an error (exit 1) with its answer, or why there is none, otherwise.
pub(crate) fn probe(socket: &Path, kind: ProbeKind) -> Result<String> {
    let path = match kind {
        ProbeKind::Ready => "/readyz",
        ProbeKind::Live => "/healthz",
    };
    let failed = |what: String, e: std::io::Error| {
        Error::runtime(format!("{path} on {}: {what}", socket.display()), e)
    };
    let mut stream =
        std::os::unix::net::UnixStream::connect(socket).map_err(|e| failed("no agent answers".into(), e))?;
    stream
        .set_read_timeout(Some(PROBE_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(PROBE_TIMEOUT)))
        .and_then(|()| stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: agent\r\n\r\n").as_bytes()))
        .map_err(|e| failed("cannot ask".into(), e))?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| failed("no answer".into(), e))?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status == "200" {
        Ok(body.to_owned())
    } else {
        Err(failed(
            format!("answered {status}"),
            std::io::Error::other(body.trim().to_owned()),
        ))
    }
}

/// The socket `pod-checkpointer health` asks: its own flag, else the config file's.
pub(crate) fn probe_socket(flag: Option<PathBuf>, config_socket: Option<PathBuf>) -> Result<PathBuf> {
    flag.or(config_socket)
        .filter(|p| !p.as_os_str().is_empty())
        .ok_or_else(|| {
            Error::usage_message(
                "--health-socket is required (or `health-socket:` in --config): the agent's socket",
            )
        })
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    const STALL: Duration = Duration::from_secs(90);

    /// `(phase, seconds since the phase began, seconds since the last pass)` → the
    /// `/readyz` and `/healthz` answers `(status, body)`.
    fn check(phase: Phase, in_phase: u64, since_pass: Option<u64>, ready: (&str, &str), live: (&str, &str)) {
        let h = Health::new(STALL);
        h.set_phase(phase);
        let start = Instant::now();
        {
            let mut life = h.life();
            life.since = start;
            life.last_pass = since_pass.map(|s| start + Duration::from_secs(in_phase - s));
        }
        let now = start + Duration::from_secs(in_phase);
        let answer = |path: &str| {
            let (status, _, body) = route("GET", path, &h, now);
            (status.to_owned(), body)
        };
        let case = format!("{phase:?} for {in_phase}s, last pass {since_pass:?}s ago");
        let (status, body) = answer("/readyz");
        assert_eq!(status, ready.0, "readyz, {case}");
        assert!(body.starts_with(ready.1), "readyz {body:?}, {case}");
        let (status, body) = answer("/healthz");
        assert_eq!(status, live.0, "healthz, {case}");
        assert!(body.starts_with(live.1), "healthz {body:?}, {case}");
    }

    const OK: &str = "200 OK";
    const DOWN: &str = "503 Service Unavailable";

    #[test]
    fn readiness_and_liveness_per_state() {
        // A copy waiting on the lock is ready (a rollout must not stall on it) and live,
        // however long it waits.
        check(Phase::Standby, 5, None, (OK, "standby"), (OK, "standby"));
        check(Phase::Standby, 86_400, None, (OK, "standby"), (OK, "standby"));
        // The holder before its first pass: alive, not ready; stalled past the limit.
        check(Phase::Starting, 1, None, (DOWN, "starting"), (OK, "starting"));
        check(Phase::Starting, 91, None, (DOWN, "stalled"), (DOWN, "stalled"));
        // The holder after a pass: ready and live while passes complete.
        check(Phase::Ready, 3_600, Some(10), (OK, "ok"), (OK, "ok"));
        check(Phase::Ready, 3_600, Some(90), (OK, "ok"), (OK, "ok"));
        check(
            Phase::Ready,
            3_600,
            Some(91),
            (DOWN, "stalled"),
            (DOWN, "stalled"),
        );
        // Neither holding nor waiting.
        check(
            Phase::Stopping,
            5,
            Some(1),
            (DOWN, "stopping"),
            (DOWN, "stopping"),
        );
    }

    #[test]
    fn a_holder_whose_credentials_are_rejected_is_live_but_not_ready() {
        let h = Health::new(STALL);
        h.set_phase(Phase::Ready);
        h.record_pass(Duration::from_millis(3), BTreeMap::new());
        h.record_views("unauthorized", true, None);
        let (status, _, body) = route("GET", "/readyz", &h, Instant::now());
        assert_eq!(
            (status, body.as_str()),
            (
                DOWN,
                "unauthorized: the API server rejects this copy's credentials or forbids its pod reads"
            )
        );
        assert_eq!(route("GET", "/healthz", &h, Instant::now()).0, OK);
        h.record_views("synced", true, None);
        assert_eq!(route("GET", "/readyz", &h, Instant::now()).0, OK);
    }

    #[test]
    fn a_completed_pass_keeps_the_holder_live() {
        let h = Health::new(Duration::from_secs(1));
        h.set_phase(Phase::Ready);
        h.record_pass(Duration::from_millis(3), BTreeMap::new());
        assert!(h.liveness(Instant::now()).ok);
        assert!(!h.liveness(Instant::now() + Duration::from_secs(2)).ok);
        assert_eq!(
            route("POST", "/healthz", &h, Instant::now()).0,
            "405 Method Not Allowed"
        );
        assert_eq!(route("GET", "/nope", &h, Instant::now()).0, "404 Not Found");
    }

    /// The exec probe's client against the agent's unix socket server, per state.
    #[tokio::test]
    async fn the_probe_asks_the_agent_on_its_socket() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("health.sock");
        let h = Health::new(STALL);
        let server = serve_unix(&socket, h.clone()).await.unwrap();
        let ask = |kind| {
            let socket = socket.clone();
            tokio::task::spawn_blocking(move || probe(&socket, kind))
        };
        assert_eq!(ask(ProbeKind::Ready).await.unwrap().unwrap(), "standby");
        h.set_phase(Phase::Starting);
        let refused = ckpt_core::error_chain(&ask(ProbeKind::Ready).await.unwrap().unwrap_err());
        assert!(
            refused.contains("answered 503") && refused.contains("starting"),
            "{refused}"
        );
        assert_eq!(ask(ProbeKind::Live).await.unwrap().unwrap(), "starting\n");
        h.set_phase(Phase::Ready);
        assert_eq!(ask(ProbeKind::Ready).await.unwrap().unwrap(), "ok\n");

        // A second agent does not take over a live socket; a stale one is replaced.
        let taken = serve_unix(&socket, Health::new(STALL)).await.unwrap_err();
        assert_eq!(taken.kind(), std::io::ErrorKind::AddrInUse);
        drop(server);
        tokio::task::yield_now().await;
        let other = Health::new(STALL);
        let _server = serve_unix(&socket, other).await.unwrap();
        assert_eq!(ask(ProbeKind::Ready).await.unwrap().unwrap(), "standby");

        let gone = dir.path().join("missing.sock");
        let error = ckpt_core::error_chain(&probe(&gone, ProbeKind::Live).unwrap_err());
        assert!(error.contains("no agent answers"), "{error}");
    }

    /// An acceptor that always fails, as `accept` does once descriptors run out.
    struct Exhausted(std::sync::atomic::AtomicUsize);

    impl Accept for Exhausted {
        type Stream = tokio::net::TcpStream;
        async fn accept_stream(&self) -> std::io::Result<Self::Stream> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Err(std::io::Error::from_raw_os_error(24)) // EMFILE
        }
    }

    #[tokio::test]
    async fn a_failing_accept_backs_off_instead_of_spinning() {
        let exhausted = Exhausted(Default::default());
        let _ = tokio::time::timeout(
            Duration::from_millis(550),
            accept_loop(&exhausted, Health::new(STALL), true),
        )
        .await;
        let calls = exhausted.0.load(std::sync::atomic::Ordering::Relaxed);
        assert!((1..=7).contains(&calls), "{calls} accepts in 550 ms");
    }

    #[tokio::test]
    async fn connections_are_capped_and_the_rest_wait() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let h = Health::new(STALL);
        let _server = Server(tokio::spawn(async move {
            accept_loop(&listener, h, true).await;
        }));
        // Connections that never send a request hold every slot...
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        let ask = || async move {
            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            stream.write_all(b"GET /healthz HTTP/1.1\r\n\r\n").await.unwrap();
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await.unwrap();
            answer
        };
        let waiting = tokio::spawn(ask());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "a request past the cap is not served yet");
        // ...until one goes: the waiting request is served then.
        drop(idle.pop());
        let answer = tokio::time::timeout(Duration::from_secs(3), waiting)
            .await
            .expect("served once a slot is free")
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    }

    /// The kept token's `exp`, read on each scrape; nothing for a missing file, a link or
    /// something that is not a JWT.
    #[test]
    fn the_kept_tokens_expiry_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let h = Health::new(STALL).with_kept_token(path.clone());
        let sample = |h: &Health| {
            h.render_metrics()
                .lines()
                .find(|l| l.starts_with("pod_checkpointer_kept_token_expiry_timestamp_seconds "))
                .map(str::to_owned)
        };
        assert_eq!(sample(&h), None);
        // {"exp":1000000000}
        std::fs::write(&path, "eyJhbGciOiJSUzI1NiJ9.eyJleHAiOjEwMDAwMDAwMDB9.sig").unwrap();
        assert_eq!(
            sample(&h).as_deref(),
            Some("pod_checkpointer_kept_token_expiry_timestamp_seconds 1000000000")
        );
        std::fs::write(&path, "not a token").unwrap();
        assert_eq!(sample(&h), None);
        std::fs::remove_file(&path).unwrap();
        std::fs::write(
            dir.path().join("elsewhere"),
            "eyJhbGciOiJSUzI1NiJ9.eyJleHAiOjEwMDAwMDAwMDB9.sig",
        )
        .unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &path).unwrap();
        assert_eq!(sample(&h), None);
    }

    #[test]
    fn metrics_are_prefixed_and_counted() {
        let h = Health::new(STALL);
        h.activation();
        h.removal("grace-period", "gc");
        h.record_pass(Duration::from_millis(20), [("active", 2)].into());
        h.record_views("synced", true, Some(Timestamp(1_000)));
        h.record_self_scheduling(Some("unknown"));
        h.record_cri_answers_too_large(2);
        let text = h.render_metrics();
        for line in [
            "pod_checkpointer_activations_total 1",
            "pod_checkpointer_removals_total{strategy=\"grace-period\",reason=\"gc\"} 1",
            "pod_checkpointer_checkpoints{state=\"active\"} 2",
            "pod_checkpointer_api_state{state=\"synced\"} 1",
            "pod_checkpointer_self_scheduling{state=\"unknown\"} 1",
            "pod_checkpointer_self_scheduling{state=\"deleted\"} 0",
            "pod_checkpointer_cri_answers_too_large_total 2",
            "pod_checkpointer_last_api_sync_timestamp_seconds 1.000",
            concat!(
                "pod_checkpointer_build_info{version=\"",
                env!("CARGO_PKG_VERSION"),
                "\"} 1"
            ),
            "pod_checkpointer_pass_duration_seconds_bucket{le=\"0.05\"} 1",
            "pod_checkpointer_pass_duration_seconds_bucket{le=\"0.01\"} 0",
            "pod_checkpointer_pass_duration_seconds_count 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert!(
            samples
                .iter()
                .all(|l| l.starts_with("pod_checkpointer_") || l.starts_with("process_")),
            "{text}"
        );
        for name in [
            "process_resident_memory_bytes",
            "process_cpu_seconds_total",
            "process_open_fds",
            "process_start_time_seconds",
        ] {
            assert!(
                samples.iter().any(|l| l.starts_with(&format!("{name} "))),
                "no {name} in\n{text}"
            );
        }
    }
}
