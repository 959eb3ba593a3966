//! `/healthz`, `/readyz` and `/metrics` on `--metrics-addr`: a deliberately tiny HTTP/1.1
//! server (three GET paths, one response per connection) so the agent needs no web stack.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ckpt_core::Timestamp;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

/// Where the agent is in its life, for `/readyz`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Waiting for the lock: another copy is active.
    Standby,
    /// Holds the lock; no pass completed yet.
    Starting,
    /// Holds the lock and has completed a pass.
    Ready,
}

/// Pass-duration histogram buckets, in seconds.
const BUCKETS: [f64; 8] = [0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0];

#[derive(Debug, Default)]
struct Counters {
    checkpoints_by_state: BTreeMap<&'static str, u64>,
    activations: u64,
    deactivations: u64,
    removals: BTreeMap<(String, String), u64>,
    write_errors: u64,
    refused: u64,
    handovers: u64,
    passes: u64,
    pass_buckets: [u64; BUCKETS.len()],
    pass_sum: f64,
    api_state: &'static str,
    local_view_available: bool,
    last_sync: Option<Timestamp>,
}

/// The agent's health and metrics, shared between the loop and the HTTP server.
#[derive(Debug, Clone)]
pub(crate) struct Health {
    phase: Arc<Mutex<Phase>>,
    counters: Arc<Mutex<Counters>>,
}

impl Health {
    pub(crate) fn new() -> Self {
        Self {
            phase: Arc::new(Mutex::new(Phase::Standby)),
            counters: Arc::new(Mutex::new(Counters {
                api_state: "unreachable",
                ..Counters::default()
            })),
        }
    }

    pub(crate) fn set_phase(&self, phase: Phase) {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner()) = phase;
    }

    pub(crate) fn phase(&self) -> Phase {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner())
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

    pub(crate) fn removal(&self, strategy: &str, reason: &str) {
        self.with(|c| {
            *c.removals
                .entry((strategy.to_owned(), reason.to_owned()))
                .or_default() += 1
        });
    }

    pub(crate) fn write_error(&self) {
        self.with(|c| c.write_errors += 1);
    }

    pub(crate) fn refused(&self) {
        self.with(|c| c.refused += 1);
    }

    /// The lock was handed over: the API server kept rejecting this copy's credentials.
    pub(crate) fn handover(&self) {
        self.with(|c| c.handovers += 1);
    }

    /// The Prometheus text exposition.
    pub(crate) fn render_metrics(&self, now: Timestamp) -> String {
        let phase = self.phase();
        self.with(|c| {
            let mut out = String::new();
            let mut metric = |name: &str, kind: &str, help: &str, samples: Vec<(String, String)>| {
                out.push_str(&format!(
                    "# HELP pod_checkpointer_{name} {help}\n# TYPE pod_checkpointer_{name} {kind}\n"
                ));
                for (labels, value) in samples {
                    out.push_str(&format!("pod_checkpointer_{name}{labels} {value}\n"));
                }
            };
            let states = ["inactive", "inactive-grace", "active", "active-grace", "self"];
            metric(
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
            metric(
                "activations_total",
                "counter",
                "Checkpoints activated.",
                vec![(String::new(), c.activations.to_string())],
            );
            metric(
                "deactivations_total",
                "counter",
                "Checkpoints deactivated.",
                vec![(String::new(), c.deactivations.to_string())],
            );
            metric(
                "removals_total",
                "counter",
                "Checkpoints removed, by GC strategy and reason.",
                c.removals
                    .iter()
                    .map(|((s, r), n)| {
                        (
                            format!("{{strategy=\"{}\",reason=\"{}\"}}", escape(s), escape(r)),
                            n.to_string(),
                        )
                    })
                    .collect(),
            );
            metric(
                "write_errors_total",
                "counter",
                "Failed disk operations.",
                vec![(String::new(), c.write_errors.to_string())],
            );
            metric(
                "refused_total",
                "counter",
                "Parents refused as not representable as static pods.",
                vec![(String::new(), c.refused.to_string())],
            );
            metric(
                "lock_handovers_total",
                "counter",
                "Times this copy released the lock because the API server kept rejecting its credentials.",
                vec![(String::new(), c.handovers.to_string())],
            );
            metric(
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
            metric(
                "local_view_available",
                "gauge",
                "Whether the container runtime (or kubelet) answered on the last pass.",
                vec![(String::new(), u8::from(c.local_view_available).to_string())],
            );
            metric(
                "last_api_sync_age_seconds",
                "gauge",
                "Seconds since the last synced API view (-1: never).",
                vec![(
                    String::new(),
                    c.last_sync
                        .map_or("-1".into(), |t| format!("{:.3}", now.since(t).as_secs_f64())),
                )],
            );
            metric(
                "lock_held",
                "gauge",
                "Whether this copy holds the lock (is the active copy).",
                vec![(String::new(), u8::from(phase != Phase::Standby).to_string())],
            );
            let mut samples: Vec<(String, String)> = BUCKETS
                .iter()
                .zip(c.pass_buckets)
                .map(|(le, n)| (format!("_bucket{{le=\"{le}\"}}"), n.to_string()))
                .collect();
            samples.push(("_bucket{le=\"+Inf\"}".into(), c.passes.to_string()));
            samples.push(("_sum".into(), format!("{:.6}", c.pass_sum)));
            samples.push(("_count".into(), c.passes.to_string()));
            metric(
                "pass_duration_seconds",
                "histogram",
                "Duration of a pass (observe, plan, execute).",
                samples,
            );
            out
        })
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
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
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let health = health.clone();
            tokio::spawn(async move {
                if let Err(e) = tokio::time::timeout(Duration::from_secs(5), respond(stream, &health)).await {
                    debug!(error = %e, "health request timed out");
                }
            });
        }
    });
    Ok(Server(task))
}

async fn respond(mut stream: tokio::net::TcpStream, health: &Health) {
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    // Read until the end of the request head (or the buffer is full: a bad request).
    while len < buf.len() {
        match stream.read(&mut buf[len..]).await {
            Ok(0) | Err(_) => break,
            Ok(n) => len += n,
        }
        if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") || buf[..len].windows(2).any(|w| w == b"\n\n") {
            break;
        }
    }
    let head = String::from_utf8_lossy(&buf[..len]);
    let mut parts = head.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, content_type, body) = route(method, path, health);
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if let Err(e) = stream.write_all(response.as_bytes()).await {
        warn!(error = %e, "cannot answer a health request");
    }
}

fn route(method: &str, path: &str, health: &Health) -> (&'static str, &'static str, String) {
    const TEXT: &str = "text/plain; charset=utf-8";
    if method != "GET" {
        return ("405 Method Not Allowed", TEXT, "only GET\n".into());
    }
    match path.split('?').next().unwrap_or("") {
        "/healthz" => ("200 OK", TEXT, "ok\n".into()),
        "/readyz" => match health.phase() {
            // The holder cannot sync: not ready, and says why (it hands the lock over).
            Phase::Ready if health.api_state() == "unauthorized" => (
                "503 Service Unavailable",
                TEXT,
                "unauthorized: the API server rejects this copy's credentials".into(),
            ),
            Phase::Ready => ("200 OK", TEXT, "ok\n".into()),
            Phase::Standby => ("503 Service Unavailable", TEXT, "standby".into()),
            Phase::Starting => ("503 Service Unavailable", TEXT, "starting".into()),
        },
        "/metrics" => (
            "200 OK",
            "text/plain; version=0.0.4",
            health.render_metrics(Timestamp::now()),
        ),
        _ => ("404 Not Found", TEXT, "not found\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_follows_the_phase() {
        let h = Health::new();
        let check = |phase: Phase, status: &str, body: &str| {
            h.set_phase(phase);
            let (s, _, b) = route("GET", "/readyz", &h);
            assert_eq!((s, b.as_str()), (status, body));
            assert_eq!(route("GET", "/healthz", &h).0, "200 OK");
        };
        check(Phase::Standby, "503 Service Unavailable", "standby");
        check(Phase::Starting, "503 Service Unavailable", "starting");
        check(Phase::Ready, "200 OK", "ok\n");
        h.record_views("unauthorized", true, None);
        check(
            Phase::Ready,
            "503 Service Unavailable",
            "unauthorized: the API server rejects this copy's credentials",
        );
        h.record_views("synced", true, None);
        check(Phase::Ready, "200 OK", "ok\n");
        assert_eq!(route("POST", "/healthz", &h).0, "405 Method Not Allowed");
        assert_eq!(route("GET", "/nope", &h).0, "404 Not Found");
    }

    #[test]
    fn metrics_are_prefixed_and_counted() {
        let h = Health::new();
        h.activation();
        h.removal("grace-period", "parent \"deleted\"");
        h.record_pass(Duration::from_millis(20), [("active", 2)].into());
        h.record_views("synced", true, Some(Timestamp(1_000)));
        let text = h.render_metrics(Timestamp(3_500));
        for line in [
            "pod_checkpointer_activations_total 1",
            "pod_checkpointer_removals_total{strategy=\"grace-period\",reason=\"parent \\\"deleted\\\"\"} 1",
            "pod_checkpointer_checkpoints{state=\"active\"} 2",
            "pod_checkpointer_api_state{state=\"synced\"} 1",
            "pod_checkpointer_last_api_sync_age_seconds 2.500",
            "pod_checkpointer_pass_duration_seconds_bucket{le=\"0.05\"} 1",
            "pod_checkpointer_pass_duration_seconds_bucket{le=\"0.01\"} 0",
            "pod_checkpointer_pass_duration_seconds_count 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        assert!(
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .all(|l| l.starts_with("pod_checkpointer_"))
        );
    }
}
