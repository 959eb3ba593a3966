//! The API server: pods on this node (one watch per allowed namespace) and a `/readyz`
//! health probe, reduced to [`ApiState`] and an [`ApiSnapshot`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ckpt_core::backoff::nth_delay;
use ckpt_core::{NamespaceAllowList, PodId, Timestamp};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::WatchedPod;
use crate::error::error_chain;
use crate::jitter::{equal_jitter, uniform_between};
use crate::reflect::{Driver, SharedSlot, Slot, lock};

/// Settings of [`ApiWatch`].
#[derive(Clone, Debug)]
pub struct ApiWatchConfig {
    /// This node's name: pods are watched with `fieldSelector=spec.nodeName=<node>`.
    pub node: String,
    /// The namespaces to watch, one watch each (a Role grants rights per namespace).
    pub namespaces: NamespaceAllowList,
    /// How often `/readyz` is probed while something is at stake (see
    /// [`ApiWatch::set_at_stake`]), while the API is unreachable and after a failed probe
    /// (default 250 ms). With the defaults a hung server is then unreachable 1.1–1.4 s
    /// after it hung (the first probe that follows the hang times out, and the probe that
    /// confirms it after half as long) and a refusing one after 0.25–0.5 s. Once
    /// unreachable, with something at stake the interval doubles after each failed probe, up to 1 s (or this interval if longer);
    /// with nothing at stake the probe slows to one every 5–10 s at once, its first retry
    /// spread over 0.25–10 s.
    pub probe_interval: Duration,
    /// How often `/readyz` is probed while nothing is at stake (default 15 s, each wait
    /// drawn from 80–120 % of it so that a fleet does not probe in step): a hung server
    /// then changes nothing on the node, so it may be seen late. The first failed probe
    /// switches to `probe_interval` to confirm at once.
    pub idle_probe_interval: Duration,
    /// How long one probe may take, connection included (default 750 ms). A server that
    /// accepts the connection but does not answer in time (hung, SIGSTOPped) fails it;
    /// `/readyz` answers in milliseconds even on a busy server.
    pub probe_timeout: Duration,
    /// After this many consecutive failed probes the API is [`ApiState::Unreachable`]
    /// (default 2; one lost probe does not flap the state). `0` counts as `1`.
    pub unreachable_after: u32,
    /// Deadline for each watch's initial list (default 10 s); a list that does not
    /// complete in time is retried.
    pub request_timeout: Duration,
    /// After an outage, how long `/readyz` must keep answering something other than a
    /// 2xx, a 5xx or a 401 (a 403, a 404) before the server counts as reachable again
    /// (default 10 s). A restarted kube-apiserver answers 403 for seconds while its
    /// authorizer loads (1.2–4.3 s in `cargo xtask bench --fleet`), and every list sent
    /// then is refused and sent again; a 200 ends the wait at once. The wait still ends
    /// for an identity that may not read `/readyz` at all, this much later.
    pub not_ready_grace: Duration,
}

impl ApiWatchConfig {
    /// The defaults for a node and its allowed namespaces.
    pub fn new(node: impl Into<String>, namespaces: NamespaceAllowList) -> Self {
        Self {
            node: node.into(),
            namespaces,
            probe_interval: Duration::from_millis(250),
            idle_probe_interval: Duration::from_secs(15),
            probe_timeout: Duration::from_millis(750),
            unreachable_after: 2,
            request_timeout: Duration::from_secs(10),
            not_ready_grace: Duration::from_secs(10),
        }
    }
}

/// The API server's state, as ckpt-core defines it (re-exported: the watch produces it).
pub use ckpt_core::ApiState;

/// One namespace's pod watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceStatus {
    /// A complete list has been received since the last outage or watch error.
    pub synced: bool,
    /// The watch's current problem (e.g. `forbidden: needs list and watch on pods in
    /// namespace kube-system (…)`), if any.
    pub error: Option<String>,
}

/// What the API server told us, at one moment.
#[derive(Clone, Debug)]
pub struct ApiSnapshot {
    /// The state.
    pub state: ApiState,
    /// The pods on this node in the allowed namespaces (all of them, not only parents).
    /// Complete and current when `state` is [`ApiState::Synced`]; otherwise the last
    /// complete view (possibly stale) — never use it to conclude that a pod is gone.
    pub pods: BTreeMap<PodId, Arc<Pod>>,
    /// The pods of `pods` with fields the typed model does not know (see [`WatchedPod`]),
    /// and those fields' paths.
    pub unknown_fields: BTreeMap<PodId, Arc<[String]>>,
    /// When the current [`ApiState::Synced`] period began; `None` in the other states.
    pub synced_at: Option<Timestamp>,
    /// The current problem: the failing probe's error, else the first failing namespace
    /// watch's error; `None` when everything works.
    pub last_error: Option<String>,
    /// Each namespace's watch.
    pub namespaces: BTreeMap<String, NamespaceStatus>,
    /// How many times the API became unreachable since the start (for metrics).
    pub outages: u64,
}

/// Probe and state bookkeeping, under one lock.
#[derive(Debug)]
struct Status {
    /// `false` once `unreachable_after` probes failed in a row.
    reachable: bool,
    /// The last probe was answered 401: the server rejects the agent's credentials.
    unauthorized: bool,
    consecutive_failures: u32,
    /// Since when `/readyz` has answered neither 2xx, 5xx nor 401 while unreachable (see
    /// [`ApiWatchConfig::not_ready_grace`]).
    not_ready_since: Option<tokio::time::Instant>,
    probe_error: Option<String>,
    state: ApiState,
    synced_at: Option<Timestamp>,
    outages: u64,
}

struct Inner {
    slots: BTreeMap<String, SharedSlot<WatchedPod>>,
    status: Mutex<Status>,
    notify: watch::Sender<u64>,
    /// `true` while reachable: the watches run only then.
    gate: watch::Sender<bool>,
    /// Whether something is at stake: the probe's pace.
    at_stake: watch::Sender<bool>,
    /// Bumped when the watches should start over: a probe got an answer after one that
    /// got none, so connections to the server may have gone silent.
    relist: watch::Sender<u64>,
    /// Bumped when a pod watch fails: the probe then confirms at once whether the server
    /// is gone, instead of at its idle pace while the watches retry on their own.
    watch_failed: watch::Sender<u64>,
    /// Probing without credentials ([`ApiWatch::spawn_anonymous`]): never synced, and a
    /// 401 says the server is alive, not that credentials are rejected.
    anonymous: bool,
}

impl Status {
    /// After an outage, whether a not-ready answer (`status`, at `now`) still keeps the
    /// server unreachable: until the same kind of answer has lasted `grace`.
    fn waits_for_ready(
        &mut self,
        status: http::StatusCode,
        now: tokio::time::Instant,
        grace: Duration,
    ) -> bool {
        let since = *self.not_ready_since.get_or_insert_with(|| {
            info!(%status, ?grace, "API server answers again after an outage, but not ready: waiting for a 200 on /readyz (or the same answer that long)");
            now
        });
        now.duration_since(since) < grace
    }
}

impl Inner {
    fn bump(&self) {
        self.notify.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Applies `f` to the status, recomputes the state, logs and notifies on a change.
    /// Lock order: status, then slots (slots are never held while taking the status).
    fn update(&self, f: impl FnOnce(&mut Status)) {
        let changed = {
            let mut st = lock(&self.status);
            f(&mut st);
            if !st.reachable {
                // An outage: stop the watches and forget that they were synced, before
                // anything else can observe the new state. A watch marks itself synced
                // only while holding its slot lock and seeing the gate up, so a list
                // completing during the outage cannot count.
                self.gate.send_if_modified(|up| std::mem::replace(up, false));
                for slot in self.slots.values() {
                    lock(slot).synced = false;
                }
            } else {
                self.gate.send_if_modified(|up| !std::mem::replace(up, true));
            }
            let all_synced = !self.anonymous && self.slots.values().all(|s| lock(s).synced);
            // Credentials that authenticate but may not read this node's pods anywhere
            // (their bindings gone, another identity's) serve the agent no better than
            // rejected ones; a 403 in some namespaces only is an RBAC gap the other copy
            // shares.
            let all_forbidden = !self.slots.is_empty() && self.slots.values().all(|s| lock(s).forbidden);
            let state = if !st.reachable {
                ApiState::Unreachable
            } else if st.unauthorized || all_forbidden {
                // Even a watch that still streams (a server does not re-check an open
                // watch's token) proves nothing once the credentials are rejected.
                ApiState::Unauthorized
            } else if all_synced {
                ApiState::Synced
            } else {
                ApiState::Reachable
            };
            let previous = st.state;
            if state != previous {
                st.state = state;
                st.synced_at = (state == ApiState::Synced).then(Timestamp::now);
                if state == ApiState::Unreachable {
                    st.outages += 1;
                }
                match state {
                    ApiState::Unreachable => warn!(
                        from = previous.as_str(),
                        problem = st.probe_error.as_deref().unwrap_or(""),
                        "API server unreachable"
                    ),
                    _ => info!(
                        from = previous.as_str(),
                        to = state.as_str(),
                        "API server state changed"
                    ),
                }
            }
            state != previous
        };
        if changed {
            self.bump();
        }
    }

    fn snapshot(&self) -> ApiSnapshot {
        let st = lock(&self.status);
        let mut pods = BTreeMap::new();
        let mut unknown_fields = BTreeMap::new();
        let mut namespaces = BTreeMap::new();
        let mut first_error = None;
        for (ns, slot) in &self.slots {
            let slot = lock(slot);
            for (name, watched) in &slot.objects {
                let id = PodId::new(ns.as_str(), name.as_str());
                if !watched.unknown_fields.is_empty() {
                    unknown_fields.insert(id.clone(), Arc::clone(&watched.unknown_fields));
                }
                pods.insert(id, Arc::clone(&watched.pod));
            }
            if first_error.is_none() {
                first_error.clone_from(&slot.error);
            }
            namespaces.insert(
                ns.clone(),
                NamespaceStatus {
                    synced: slot.synced,
                    error: slot.error.clone(),
                },
            );
        }
        ApiSnapshot {
            state: st.state,
            pods,
            unknown_fields,
            synced_at: st.synced_at,
            last_error: st.probe_error.clone().or(first_error),
            namespaces,
            outages: st.outages,
        }
    }
}

/// Watches the pods on this node and probes the API server's health.
///
/// [`ApiWatch::spawn`] starts Tokio tasks: one kube watcher per allowed namespace
/// (`fieldSelector=spec.nodeName=<node>`, event-driven) and a `/readyz` probe loop.
/// Dropping the `ApiWatch` (or [`ApiWatch::shutdown`]) stops them.
///
/// The state follows ARCHITECTURE.md, Planner rules and Observing:
/// - only the probe makes the API [`ApiState::Unreachable`]: a connection error, a
///   timeout (a hung server) or a 5xx on `/readyz`, `unreachable_after` times in a row.
///   Any other HTTP answer (2xx, and also 401/403/404: the server is alive) is a success,
///   except that after an outage only a 2xx or a 401 ends it at once: another answer must
///   persist for `not_ready_grace` (a restarted server refuses everything while its
///   authorizer loads); a 401 makes the state [`ApiState::Unauthorized`] until a probe is
///   answered otherwise,
///   and so does a 403 on the pod list or watch of every namespace, until one lists again.
///   A failed watch request never makes it unreachable;
/// - [`ApiState::Synced`] needs a complete list from every namespace since the last
///   outage; a watch error un-syncs that namespace and relists it (with a backoff);
/// - while unreachable the watches are stopped (no requests but the probe); the first
///   successful probe restarts them with a fresh list.
///
/// Every pod event and every change of state or of a watch's error bumps the counter
/// of [`ApiWatch::subscribe`].
pub struct ApiWatch {
    inner: Arc<Inner>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for ApiWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiWatch")
            .field("namespaces", &self.inner.slots.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl ApiWatch {
    /// Starts the watches and the probe.
    ///
    /// # Panics
    /// Outside a Tokio runtime (it spawns tasks).
    pub fn spawn(client: kube::Client, config: ApiWatchConfig) -> ApiWatch {
        Self::start(client, config, false)
    }

    /// Only the `/readyz` probe, for a copy without credentials: reachability needs none
    /// (kube-apiserver lets anonymous requests read `/readyz` by default), so such a copy
    /// can still tell a healthy server from a dead one. The state is
    /// [`ApiState::Unreachable`] or [`ApiState::Reachable`], never synced (no pods are
    /// read) nor unauthorized (a 401 to an anonymous request is an answer).
    ///
    /// # Panics
    /// Outside a Tokio runtime (it spawns a task).
    pub fn spawn_anonymous(client: kube::Client, config: ApiWatchConfig) -> ApiWatch {
        Self::start(client, config, true)
    }

    fn start(client: kube::Client, config: ApiWatchConfig, anonymous: bool) -> ApiWatch {
        let slots: BTreeMap<String, SharedSlot<WatchedPod>> = (config.namespaces.namespaces())
            .filter(|_| !anonymous)
            .map(|ns| (ns.to_owned(), Arc::new(Mutex::new(Slot::default()))))
            .collect();
        let (notify, _) = watch::channel(0);
        let (gate, gate_rx) = watch::channel(true);
        // At stake until the agent says otherwise: it knows nothing yet.
        let (at_stake, _) = watch::channel(true);
        let (relist, _) = watch::channel(0);
        let (watch_failed, _) = watch::channel(0);
        let inner = Arc::new(Inner {
            slots,
            status: Mutex::new(Status {
                reachable: true,
                unauthorized: false,
                consecutive_failures: 0,
                not_ready_since: None,
                probe_error: None,
                state: ApiState::Reachable,
                synced_at: None,
                outages: 0,
            }),
            notify,
            gate,
            at_stake,
            relist,
            watch_failed,
            anonymous,
        });
        let mut tasks = Vec::new();
        let field_selector = format!("spec.nodeName={}", config.node);
        for (ns, slot) in &inner.slots {
            let on_change = {
                let inner = Arc::clone(&inner);
                let slot = Arc::clone(slot);
                Arc::new(move || {
                    let failed = lock(&slot).error.is_some();
                    inner.update(|_| {});
                    inner.bump();
                    if failed {
                        inner.watch_failed.send_modify(|n| *n = n.wrapping_add(1));
                    }
                })
            };
            let driver = Driver {
                api: Api::<WatchedPod>::namespaced(client.clone(), ns),
                config: watcher::Config::default().fields(&field_selector),
                slot: Arc::clone(slot),
                on_change,
                request_timeout: config.request_timeout,
                gate: Some(gate_rx.clone()),
                gate_check: Some(gate_rx.clone()),
                relist: Some(inner.relist.subscribe()),
                what: format!("pods in namespace {ns}"),
                rbac_hint: format!("list and watch on pods in namespace {ns}"),
                modify: |pod: &mut WatchedPod| {
                    use k8s_openapi::Metadata;
                    pod.metadata_mut().managed_fields = None;
                },
                get_fallback: None,
            };
            tasks.push(tokio::spawn(driver.run()));
        }
        tasks.push(tokio::spawn(probe_loop(client, config, Arc::clone(&inner))));
        ApiWatch { inner, tasks }
    }

    /// The current view.
    pub fn snapshot(&self) -> ApiSnapshot {
        self.inner.snapshot()
    }

    /// Whether a change of the API server matters on this node now (`ckpt_core`'s
    /// `Report::at_stake`): the probe runs every `probe_interval` while it does (and at
    /// first), else every `idle_probe_interval`. Becoming at stake probes at once if the
    /// last probe is older than `probe_interval`.
    pub fn set_at_stake(&self, at_stake: bool) {
        let changed = self
            .inner
            .at_stake
            .send_if_modified(|current| std::mem::replace(current, at_stake) != at_stake);
        if changed {
            debug!(at_stake, "API probe pace changed");
        }
    }

    /// The current state (cheaper than a snapshot).
    pub fn state(&self) -> ApiState {
        lock(&self.inner.status).state
    }

    /// A counter bumped on every pod event and every change of state: await
    /// `changed()` on it and run a pass.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.notify.subscribe()
    }

    /// Bumped when a probe gets an answer after one that got none (no answer in time,
    /// a connection error): the watches' connections may have gone silent without
    /// closing, as a lost NAT entry or load-balancer flow leaves them, and they restart.
    /// [`crate::ObjectWatch::with_relists`] takes it.
    pub fn relists(&self) -> watch::Receiver<u64> {
        self.inner.relist.subscribe()
    }

    /// Up while the API server is reachable, down while it is not: the pod watches stop
    /// while it is down and restart with a fresh list when it is up.
    /// [`crate::ObjectWatch::with_gate`] takes it.
    pub fn gate(&self) -> watch::Receiver<bool> {
        self.inner.gate.subscribe()
    }

    /// The sender behind [`ApiWatch::subscribe`], to let other sources (e.g.
    /// [`crate::ObjectWatch`]) wake the same receivers.
    pub fn notifier(&self) -> watch::Sender<u64> {
        self.inner.notify.clone()
    }

    /// Stops all tasks (same as dropping).
    pub fn shutdown(self) {}
}

impl Drop for ApiWatch {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// How a probe that got an answer went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answered {
    /// A 2xx: the server is alive and ready.
    Ready,
    /// Any other answer but a 5xx or a 401 (a 403, a 404; for an anonymous probe a 401
    /// too): the server is alive and says nothing against the credentials, but not that it
    /// is ready. A restarted kube-apiserver answers 403 to everything while its authorizer
    /// loads; an identity that may not read `/readyz` gets it for ever.
    NotReady(http::StatusCode),
    /// 401: alive, but the credentials are rejected (expired, revoked, unknown signer).
    Unauthorized,
}

/// Slices of a probe's timeout: the probe's clock is read at each slice's end.
const PROBE_SLICES: u32 = 5;
/// A slice's end seen later than this was not on time: the runtime could not run.
const LATE_WAKE: Duration = Duration::from_millis(50);

/// `work`'s output if it comes within `timeout` of time in which this task could run.
///
/// A runtime held up by something else (a blocking call on its thread, a paused VM, a
/// starved CPU) could not have sent a request or read its answer meanwhile, and a
/// healthy server must not look hung for it: the wait is sliced, and a slice that ends
/// late adds its lateness back.
pub(crate) async fn within_runnable_time<T>(timeout: Duration, work: impl Future<Output = T>) -> Option<T> {
    let mut work = std::pin::pin!(work);
    let slice = (timeout / PROBE_SLICES).max(Duration::from_millis(1));
    let mut left = timeout;
    while !left.is_zero() {
        let step = slice.min(left);
        let due = tokio::time::Instant::now() + step;
        match tokio::time::timeout_at(due, &mut work).await {
            Ok(output) => return Some(output),
            Err(_) => {
                let late = tokio::time::Instant::now().saturating_duration_since(due);
                let stalled = if late > LATE_WAKE { late } else { Duration::ZERO };
                left = left - step + stalled;
            }
        }
    }
    None
}

/// Why a probe failed.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ProbeFailure {
    problem: String,
    /// No answer came (a timeout, a connection error), so the connection may be dead; a
    /// 5xx is an answer.
    unanswered: bool,
}

/// One probe: `GET /readyz`, answer and body within `timeout` of runnable time
/// ([`within_runnable_time`]). `Err` describes why the server does not count as answering.
async fn probe_once(client: &kube::Client, timeout: Duration) -> Result<Answered, ProbeFailure> {
    let unanswered = |problem| ProbeFailure {
        problem,
        unanswered: true,
    };
    let request = http::Request::get("/readyz")
        .body(kube::client::Body::from(Vec::new()))
        .map_err(|e| unanswered(format!("cannot build the probe request: {e}")))?;
    let attempt = async {
        let response = client
            .send(request)
            .await
            .map_err(|e| unanswered(error_chain(&e)))?;
        let status = response.status();
        // Read the (tiny) body so the connection goes back to the pool instead of a new
        // TCP+TLS handshake every second.
        let _ = response.into_body().collect().await;
        if status.is_server_error() {
            return Err(ProbeFailure {
                problem: format!("GET /readyz answered {status}"),
                unanswered: false,
            });
        }
        Ok(if status.is_success() {
            Answered::Ready
        } else if status == http::StatusCode::UNAUTHORIZED {
            Answered::Unauthorized
        } else {
            Answered::NotReady(status)
        })
    };
    within_runnable_time(timeout, attempt).await.unwrap_or_else(|| {
        Err(unanswered(format!(
            "GET /readyz got no answer within {timeout:?}"
        )))
    })
}

/// The most a probe waits for the next while the API is unreachable and something is at
/// stake: the node waits for the API to retire a checkpoint or to keep its view.
const MAX_UNREACHABLE_PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The pace of the probe while the API is unreachable and nothing is at stake: nothing on
/// the node waits for the API, so a recovery seen a few seconds late costs nothing, while
/// a fleet probing every second would try the server with every node every second, and
/// meet it all at once when it returns (`cargo xtask bench --fleet`: issue 39). Waits of
/// 5–10 s (equal jitter) have about an eighth of a fleet try in any one second; 3–6 s had a
/// third of a fleet of 100 in some seconds.
pub(crate) const QUIET_UNREACHABLE_PROBE_INTERVAL: Duration = Duration::from_secs(10);

/// How long after the last probe the next one runs, before jitter: `probe_interval` while
/// `fast` (at stake, or after a failed probe). Past the unreachable threshold, if
/// `at_stake`, doubling after each failed probe ([`nth_delay`]) up to
/// [`MAX_UNREACHABLE_PROBE_INTERVAL`] (so a network that resets every connection costs the
/// server a TLS handshake a second from each node, not four, and a recovery is still seen
/// within a second); if not, [`QUIET_UNREACHABLE_PROBE_INTERVAL`] at once. Else
/// `idle_probe_interval`.
fn probe_pace(config: &ApiWatchConfig, fast: bool, at_stake: bool, failures: u32) -> Duration {
    if !fast {
        return config.idle_probe_interval;
    }
    let past_threshold = failures.saturating_sub(config.unreachable_after.max(1));
    if !at_stake && past_threshold > 0 {
        return QUIET_UNREACHABLE_PROBE_INTERVAL.max(config.probe_interval);
    }
    let cap = MAX_UNREACHABLE_PROBE_INTERVAL.max(config.probe_interval);
    nth_delay(config.probe_interval, cap, past_threshold)
}

/// How long the next probe may take: `probe_timeout`, but half as long for a probe that
/// confirms an unanswered one (`unanswered`, fewer than `unreachable_after` failures so
/// far). A server that let one probe time out is hung or overloaded; the confirmation need
/// not wait as long, and with something at stake its half is what brings a hung server's
/// detection under 1.5 s (DESIGN §5). Once unreachable, every probe has the whole timeout
/// again: a server coming back slowly is seen back.
fn confirming_timeout(config: &ApiWatchConfig, unanswered: bool, failures: u32) -> Duration {
    let confirming = unanswered && failures > 0 && failures < config.unreachable_after.max(1);
    if confirming {
        config.probe_timeout / 2
    } else {
        config.probe_timeout
    }
}

/// The jittered wait before the next probe while the API is unreachable (`pace` from
/// [`probe_pace`]): equal jitter, except for the first quiet probe after the threshold,
/// spread over the whole quiet interval, so that a fleet that lost the server together is
/// spread from its first retry on instead of after several.
fn unreachable_wait(config: &ApiWatchConfig, at_stake: bool, failures: u32, pace: Duration) -> Duration {
    let threshold = config.unreachable_after.max(1);
    if !at_stake && failures == threshold.saturating_add(1) {
        uniform_between(config.probe_interval, pace)
    } else {
        equal_jitter(pace)
    }
}

async fn probe_loop(client: kube::Client, config: ApiWatchConfig, inner: Arc<Inner>) {
    let threshold = config.unreachable_after.max(1);
    let mut at_stake = inner.at_stake.subscribe();
    let mut watch_failed = inner.watch_failed.subscribe();
    // A watch failed since the last probe: the next one runs at the fast pace.
    let mut nudged = false;
    let mut last_probe: Option<tokio::time::Instant> = None;
    // A probe got no answer since the last one that did.
    let mut unanswered = false;
    loop {
        let (failures, failing, unreachable) = {
            let st = lock(&inner.status);
            (
                st.consecutive_failures,
                !st.reachable || st.consecutive_failures > 0,
                !st.reachable,
            )
        };
        let stake = *at_stake.borrow_and_update();
        let fast = stake || failing || nudged;
        let pace = probe_pace(&config, fast, stake, failures);
        // While unreachable a probe is a retry: jittered, so the nodes that lost the server
        // together do not come back to it in step (never later than the pace).
        let pace = if unreachable {
            unreachable_wait(&config, stake, failures, pace)
        } else if !fast {
            // 80–120 % of the idle pace: a fleet that saw the server return together
            // does not probe it in step for ever after (the same rate on average).
            uniform_between(pace * 4 / 5, pace * 6 / 5)
        } else {
            pace
        };
        if let Some(last) = last_probe {
            tokio::select! {
                () = tokio::time::sleep_until(last + pace) => {}
                // Something coming at stake ends a quiet wait too: the node now waits
                // for the API.
                changed = at_stake.changed(), if !stake => {
                    if changed.is_err() {
                        return;
                    }
                    // Something came at stake: the fast pace applies from the last probe.
                    continue;
                }
                // A watch failed on a server that seemed fine: a killed server breaks
                // every connection at once, and its watches would retry alone for up to
                // an idle pace before a probe confirms it is gone and stops them.
                changed = watch_failed.changed(), if !fast => {
                    if changed.is_err() {
                        return;
                    }
                    nudged = true;
                    continue;
                }
            }
        }
        nudged = false;
        last_probe = Some(tokio::time::Instant::now());
        let timeout = confirming_timeout(&config, unanswered, failures);
        let result = match probe_once(&client, timeout).await {
            // Without credentials a 401 is an answer like a 403.
            Ok(Answered::Unauthorized) if inner.anonymous => {
                Ok(Answered::NotReady(http::StatusCode::UNAUTHORIZED))
            }
            other => other,
        };
        let answered_at = tokio::time::Instant::now();
        match &result {
            Err(failure) => unanswered |= failure.unanswered,
            Ok(_) if std::mem::take(&mut unanswered) => {
                // The server answers on a new connection; the watches' may be as silent
                // as the probe's was (a lost NAT entry, a load balancer's flow): they
                // start over, or kube's idle timeout would notice only after minutes.
                info!("API server answers again after a probe got no answer: restarting the watches");
                inner.relist.send_modify(|n| *n = n.wrapping_add(1));
            }
            Ok(_) => {}
        }
        inner.update(|st| match &result {
            Ok(Answered::NotReady(status))
                if !st.reachable && st.waits_for_ready(*status, answered_at, config.not_ready_grace) =>
            {
                // Still unreachable: the watches stay stopped, the probe keeps its pace.
                st.probe_error = Some(format!(
                    "GET /readyz answered {status} after an outage: waiting for 200 OK"
                ));
            }
            Ok(answered) => {
                st.not_ready_since = None;
                if st.consecutive_failures > 0 {
                    debug!(failures = st.consecutive_failures, "API probe succeeded again");
                }
                st.consecutive_failures = 0;
                st.reachable = true;
                st.unauthorized = *answered == Answered::Unauthorized;
                st.probe_error = st.unauthorized.then(|| {
                    "GET /readyz answered 401 Unauthorized: the API server rejects the agent's credentials".to_owned()
                });
            }
            Err(ProbeFailure { problem, .. }) => {
                // The server says it is not ready (a 5xx) or is gone again: a later
                // non-200 answer waits anew.
                st.not_ready_since = None;
                st.consecutive_failures = st.consecutive_failures.saturating_add(1);
                if st.probe_error.as_ref() != Some(problem) {
                    debug!(%problem, failures = st.consecutive_failures, "API probe failed");
                }
                st.probe_error = Some(problem.clone());
                if st.consecutive_failures >= threshold {
                    st.reachable = false;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests;
