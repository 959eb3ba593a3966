//! Driving one kube `watcher` as a small reflector with an explicit "synced" flag.
//!
//! Shared by the pod watches of [`crate::ApiWatch`] and the per-object watches of
//! [`crate::ObjectWatch`]:
//! - the initial list is buffered and swapped in at `InitDone` (kube's reflector
//!   semantics), so a reader never sees half a list;
//! - any watcher error marks the watch not synced and **restarts** it (a fresh LIST)
//!   after a jittered backoff, reset only by a watch that held a while: kube's watcher
//!   would otherwise resume from its resourceVersion without relisting, and "synced"
//!   means "a complete list since the last problem";
//! - the initial list has a deadline (`request_timeout`): kube ≥ 4 has no global read
//!   timeout, and a LIST that hangs must not hold the watch forever; a list that runs
//!   out of time gets twice as long the next time (up to 16 times `request_timeout`),
//!   so a slow network still brings a large list in the end;
//! - an optional gate (the API health probe) stops the watch while the API server is
//!   unreachable; it restarts with a fresh LIST when the probe succeeds again;
//! - an optional relist signal (also the probe's: an answer after a probe that got none)
//!   restarts it at once: its connection may have gone silent without closing, and
//!   kube's watcher would notice only after its five-minute idle timeout;
//! - a watch of one object (a Secret or ConfigMap by name) whose list is forbidden reads
//!   that object by GET instead, every [`GET_POLL`], and tries its watch again every
//!   [`WATCH_AGAIN`]: the original's Role grants only `get` on them (a true drop-in keeps
//!   checkpointing the pods that mount them, seeing changes a minute late, as it did).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ckpt_core::backoff::{Doubling, doubling};
use futures::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::error::error_chain;
use crate::jitter::equal_jitter;

/// Locks a mutex, ignoring poisoning (every critical section leaves the data consistent).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What one watch knows.
#[derive(Debug)]
pub(crate) struct Slot<K> {
    /// The objects by name (the last complete view, kept through errors and outages).
    pub(crate) objects: BTreeMap<String, Arc<K>>,
    /// The initial list being received.
    buffer: Option<BTreeMap<String, Arc<K>>>,
    /// A complete list has been received since the watch (re)started.
    pub(crate) synced: bool,
    /// A complete list has been received at least once.
    pub(crate) known: bool,
    /// The current problem, if any.
    pub(crate) error: Option<String>,
    /// The current problem is a 403: the credentials lack the rights this watch needs.
    pub(crate) forbidden: bool,
}

impl<K> Default for Slot<K> {
    fn default() -> Self {
        Self {
            objects: BTreeMap::new(),
            buffer: None,
            synced: false,
            known: false,
            error: None,
            forbidden: false,
        }
    }
}

impl<K> Slot<K> {
    /// A complete view received (a list, or a GET of the one object): synced and known,
    /// and the problem it ends, if any, returned.
    fn complete(&mut self, objects: BTreeMap<String, Arc<K>>) -> Option<String> {
        self.objects = objects;
        self.buffer = None;
        self.synced = true;
        self.known = true;
        self.forbidden = false;
        self.error.take()
    }
}

/// A shared slot.
pub(crate) type SharedSlot<K> = Arc<Mutex<Slot<K>>>;

/// Exponential backoff between restarts: 250 ms doubling to 10 s ([`doubling`]), each
/// delay jittered ([`equal_jitter`]) where it is slept. Not kube's `DefaultBackoff` (fixed
/// 0.8 s → 30 s): a watch here must retry within 10 s.
///
/// Reset only by a watch that held [`Backoff::HELD`] after its complete list, not by the
/// list itself: with lists allowed and every watch failing at once (refused, cut by a
/// proxy), a reset per list relisted every object every 250 ms for as long as it lasted.
#[derive(Debug)]
struct Backoff {
    delays: Doubling,
}

impl Backoff {
    const MIN: Duration = Duration::from_millis(250);
    const MAX: Duration = Duration::from_secs(10);
    /// Three times [`Self::MAX`]: a watch that keeps failing sooner after its list relists
    /// at most once per 10 s, and one that held this long was healthy, so its next problem
    /// (an etcd leader change, a restarted API server) is retried at once again.
    const HELD: Duration = Duration::from_secs(30);

    fn new() -> Self {
        Self {
            delays: doubling(Self::MIN, Self::MAX),
        }
    }

    /// The delay before the next start (unjittered), after a watch that ran `held` since
    /// its complete list (`None`: it never completed one).
    fn next_delay(&mut self, held: Option<Duration>) -> Duration {
        if held.is_some_and(|held| held >= Self::HELD) {
            *self = Self::new();
        }
        self.delays.next().unwrap_or(Self::MAX)
    }
}

/// How much longer than `request_timeout` a list may take in the end.
const LIST_TIMEOUT_GROWTH: u32 = 16;

/// Everything one watch task needs.
pub(crate) struct Driver<K: Resource> {
    /// The API to watch.
    pub(crate) api: Api<K>,
    /// Selectors etc.
    pub(crate) config: watcher::Config,
    /// Where the result goes.
    pub(crate) slot: SharedSlot<K>,
    /// Called after every change of the slot (outside its lock).
    pub(crate) on_change: Arc<dyn Fn() + Send + Sync>,
    /// Deadline for the initial list (doubled after each list that runs out of it).
    pub(crate) request_timeout: Duration,
    /// `true` while the API server is reachable; `None` = always run.
    pub(crate) gate: Option<watch::Receiver<bool>>,
    /// A second receiver of the same gate, read under the slot lock at `InitDone`.
    pub(crate) gate_check: Option<watch::Receiver<bool>>,
    /// Bumped when the watch should start over (a fresh LIST on a new connection).
    pub(crate) relist: Option<watch::Receiver<u64>>,
    /// For messages: `pods in namespace kube-system`.
    pub(crate) what: String,
    /// The RBAC rule a 403 means is missing: `list and watch on pods in namespace x`.
    pub(crate) rbac_hint: String,
    /// Applied to every object before it is stored (e.g. drop managed fields).
    pub(crate) modify: fn(&mut K),
    /// The one object this watch selects, read by GET while its list is forbidden; `None`:
    /// a forbidden list is retried like any failure.
    pub(crate) get_fallback: Option<String>,
}

/// How often an object whose list is forbidden is read by GET: the original's pace (it
/// read every mounted Secret and ConfigMap again each minute), jittered.
pub(crate) const GET_POLL: Duration = Duration::from_secs(60);

/// How long an object is read by GET before its watch is tried again: a Role that gains
/// `list` and `watch` is used within this, at the cost of one refused list per object.
pub(crate) const WATCH_AGAIN: Duration = Duration::from_secs(300);

/// How reading one object by GET ended.
enum ByGet {
    /// The gate's sender is gone: the owner shut down.
    Shutdown,
    /// Time to try the watch again (or the API server went unreachable: the watch waits
    /// for it as usual).
    WatchAgain,
    /// The GET is forbidden too.
    Forbidden(Problem),
}

/// Waits until the gate reports "down"; forever without a gate. Returns `false` when the
/// gate's sender is gone (the owner shut down).
async fn gate_down(gate: &mut Option<watch::Receiver<bool>>) -> bool {
    match gate {
        Some(g) => g.wait_for(|up| !*up).await.is_ok(),
        None => std::future::pending().await,
    }
}

/// Waits for the next relist signal; forever without one, or once its sender is gone.
async fn relist_due(relist: &mut Option<watch::Receiver<u64>>) {
    if let Some(r) = relist
        && r.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// Why a watch failed: the message, and whether the server forbade the request (a 403).
struct Problem {
    message: String,
    forbidden: bool,
}

impl Problem {
    /// Any problem but a 403.
    fn other(message: String) -> Self {
        Self {
            message,
            forbidden: false,
        }
    }
}

/// Why a watch stopped.
enum Stop {
    /// The API server is unreachable: wait for the gate.
    GateDown,
    /// Told to start over: at once, without a backoff.
    Relist,
    /// A problem: start over after a backoff.
    Failed(Problem),
}

impl<K> Driver<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// Runs until the gate's sender is dropped (or forever without a gate); abort the task
    /// to stop it earlier.
    pub(crate) async fn run(mut self) {
        let mut backoff = Backoff::new();
        let mut gate = self.gate.take();
        let mut relist = self.relist.take();
        let mut list_timeout = self.request_timeout;
        // Whether reading by GET has been said (once: it goes on for as long as the Role).
        let mut said_by_get = false;
        loop {
            if let Some(g) = &mut gate
                && g.wait_for(|up| *up).await.is_err()
            {
                return;
            }
            // This start is the relist any earlier signal asked for.
            if let Some(r) = &mut relist {
                r.borrow_and_update();
            }
            let mut stream = watcher(self.api.clone(), self.config.clone()).boxed();
            let mut deadline = Some(Instant::now() + list_timeout);
            // When this start's list completed.
            let mut listed_at: Option<Instant> = None;
            let failure = loop {
                tokio::select! {
                    alive = gate_down(&mut gate) => {
                        if !alive {
                            return;
                        }
                        break Stop::GateDown;
                    }
                    () = relist_due(&mut relist) => break Stop::Relist,
                    () = async {
                        match deadline {
                            Some(d) => tokio::time::sleep_until(d).await,
                            None => std::future::pending().await,
                        }
                    } => {
                        let problem = format!(
                            "the list of {} did not complete within {list_timeout:?}",
                            self.what
                        );
                        // A slow network, not a hung server, gets a longer list next time.
                        list_timeout = (list_timeout * 2).min(self.request_timeout * LIST_TIMEOUT_GROWTH);
                        break Stop::Failed(Problem::other(problem));
                    }
                    event = stream.next() => match event {
                        Some(Ok(event)) => {
                            if self.apply(event) {
                                deadline = None;
                                list_timeout = self.request_timeout;
                                listed_at.get_or_insert_with(Instant::now);
                            }
                        }
                        Some(Err(err)) => break Stop::Failed(self.describe(&err)),
                        None => break Stop::Failed(Problem::other(format!("the watch of {} ended", self.what))),
                    },
                }
            };
            drop(stream);
            match failure {
                Stop::GateDown => {
                    debug!(what = %self.what, "API server unreachable: watch stopped until it answers again");
                    self.set_problem(None);
                }
                Stop::Relist => {
                    debug!(what = %self.what, "watch restarted: its connection may have gone silent");
                    self.set_problem(None);
                }
                Stop::Failed(problem) if problem.forbidden && self.get_fallback.is_some() => {
                    match self.read_by_get(&mut gate, &mut relist, &mut said_by_get).await {
                        ByGet::Shutdown => return,
                        ByGet::WatchAgain => {}
                        ByGet::Forbidden(problem) => {
                            self.set_problem(Some(problem));
                            let delay = equal_jitter(backoff.next_delay(None));
                            tokio::select! {
                                () = tokio::time::sleep(delay) => {}
                                alive = gate_down(&mut gate) => if !alive { return },
                            }
                        }
                    }
                }
                Stop::Failed(message) => {
                    self.set_problem(Some(message));
                    let delay = equal_jitter(backoff.next_delay(listed_at.map(|at| at.elapsed())));
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        alive = gate_down(&mut gate) => if !alive { return },
                    }
                }
            }
        }
    }

    /// Reads the one object of [`Driver::get_fallback`] by GET, every [`GET_POLL`] (at once
    /// on a relist signal), for [`WATCH_AGAIN`]. A GET that fails otherwise than by a 403
    /// marks the object not synced and keeps its last value, as a failed watch does.
    async fn read_by_get(
        &self,
        gate: &mut Option<watch::Receiver<bool>>,
        relist: &mut Option<watch::Receiver<u64>>,
        said: &mut bool,
    ) -> ByGet {
        let Some(name) = self.get_fallback.as_deref() else {
            return ByGet::WatchAgain;
        };
        let until = Instant::now() + WATCH_AGAIN;
        loop {
            match tokio::time::timeout(self.request_timeout, self.api.get_opt(name)).await {
                Ok(Ok(object)) => {
                    if !*said {
                        info!(
                            what = %self.what,
                            every = ?GET_POLL,
                            "list and watch forbidden: reading it by GET instead (grant {} to see changes at once)",
                            self.rbac_hint
                        );
                        *said = true;
                    }
                    self.store_got(name, object);
                }
                Ok(Err(kube::Error::Api(status))) if status.code == 403 => {
                    *said = false;
                    return ByGet::Forbidden(self.forbidden(&status));
                }
                Ok(Err(e)) => self.set_problem(Some(Problem::other(format!(
                    "the GET of {} failed: {}",
                    self.what,
                    error_chain(&e)
                )))),
                Err(_) => self.set_problem(Some(Problem::other(format!(
                    "the GET of {} did not complete within {:?}",
                    self.what, self.request_timeout
                )))),
            }
            if Instant::now() >= until {
                return ByGet::WatchAgain;
            }
            tokio::select! {
                () = tokio::time::sleep(equal_jitter(GET_POLL)) => {}
                () = relist_due(relist) => {}
                alive = gate_down(gate) => {
                    if !alive {
                        return ByGet::Shutdown;
                    }
                    self.set_problem(None);
                    return ByGet::WatchAgain;
                }
            }
        }
    }

    /// Stores what a GET of `name` read (`None`: it does not exist) as a complete view.
    fn store_got(&self, name: &str, object: Option<K>) {
        let version = |o: &K| o.meta().resource_version.clone();
        let changed = {
            let mut slot = lock(&self.slot);
            let before = slot.objects.get(name).map(|o| version(o));
            let after = object.as_ref().map(version);
            let changed = !slot.synced || slot.error.is_some() || before != after;
            let read = (object.into_iter())
                .map(|mut o| {
                    (self.modify)(&mut o);
                    (name.to_owned(), Arc::new(o))
                })
                .collect();
            if let Some(problem) = slot.complete(read) {
                info!(what = %self.what, %problem, "read again by GET");
            }
            changed
        };
        if changed {
            (self.on_change)();
        }
    }

    /// Applies one watcher event; `true` when it completed a list.
    fn apply(&self, event: watcher::Event<K>) -> bool {
        let name_of = |obj: &K| obj.meta().name.clone().unwrap_or_default();
        let prepare = |mut obj: K| {
            (self.modify)(&mut obj);
            Arc::new(obj)
        };
        let mut completed = false;
        let changed = {
            let mut slot = lock(&self.slot);
            match event {
                watcher::Event::Init => {
                    slot.buffer = Some(BTreeMap::new());
                    false
                }
                watcher::Event::InitApply(obj) => {
                    let name = name_of(&obj);
                    slot.buffer
                        .get_or_insert_with(BTreeMap::new)
                        .insert(name, prepare(obj));
                    false
                }
                watcher::Event::InitDone => {
                    if !self.gate_check.as_ref().is_none_or(|g| *g.borrow()) {
                        // The API went unreachable while this list was in flight: it
                        // does not count as a list since the outage.
                        slot.buffer = None;
                        return false;
                    }
                    let listed = slot.buffer.take().unwrap_or_default();
                    if let Some(problem) = slot.complete(listed) {
                        info!(what = %self.what, %problem, "watch recovered: complete list received");
                    }
                    completed = true;
                    true
                }
                watcher::Event::Apply(obj) => {
                    let name = name_of(&obj);
                    slot.objects.insert(name, prepare(obj));
                    true
                }
                watcher::Event::Delete(obj) => slot.objects.remove(&name_of(&obj)).is_some(),
            }
        };
        if changed {
            (self.on_change)();
        }
        completed
    }

    /// Marks the watch not synced, with a problem (logged once per distinct message) or
    /// without one (an API outage: the probe reports it).
    fn set_problem(&self, problem: Option<Problem>) {
        let forbidden = problem.as_ref().is_some_and(|p| p.forbidden);
        let problem = problem.map(|p| p.message);
        let changed = {
            let mut slot = lock(&self.slot);
            let changed = slot.synced || slot.error != problem || slot.forbidden != forbidden;
            if let Some(p) = &problem
                && slot.error.as_ref() != Some(p)
            {
                warn!(what = %self.what, problem = %p, "watch failed; relisting after a backoff");
            } else if let Some(p) = &problem {
                debug!(what = %self.what, problem = %p, "watch failed again");
            }
            slot.synced = false;
            slot.buffer = None;
            slot.error = problem;
            slot.forbidden = forbidden;
            changed
        };
        if changed {
            (self.on_change)();
        }
    }

    fn describe(&self, err: &watcher::Error) -> Problem {
        let status = match err {
            watcher::Error::InitialListFailed(e)
            | watcher::Error::WatchStartFailed(e)
            | watcher::Error::WatchFailed(e) => match e {
                kube::Error::Api(s) => Some(s.as_ref()),
                _ => None,
            },
            watcher::Error::WatchError(s) => Some(s.as_ref()),
            watcher::Error::NoResourceVersion => None,
        };
        match status {
            Some(s) if s.code == 403 => self.forbidden(s),
            _ => Problem::other(format!("watch of {} failed: {}", self.what, error_chain(err))),
        }
    }

    /// A 403: the rule the credentials lack, and the server's words.
    fn forbidden(&self, status: &kube::core::Status) -> Problem {
        Problem {
            message: format!(
                "forbidden: needs {} ({})",
                self.rbac_hint,
                if status.message.is_empty() {
                    "403"
                } else {
                    &status.message
                }
            ),
            forbidden: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each input is how long a failed watch had held since its complete list (`None`: no
    /// list completed); the output, the delays before each restart.
    fn check(input: &[Option<u64>], expected: &[u64]) {
        let mut b = Backoff::new();
        let delays: Vec<u64> = input
            .iter()
            .map(|held| b.next_delay(held.map(Duration::from_secs)).as_millis() as u64)
            .collect();
        assert_eq!(delays, expected, "{input:?}");
    }

    #[test]
    fn backoff_doubles_to_a_cap_and_resets_only_after_a_watch_held() {
        let cases: &[(&[Option<u64>], &[u64])] = &[
            // Lists failing.
            (&[None; 8], &[250, 500, 1000, 2000, 4000, 8000, 10_000, 10_000]),
            // Lists complete, every watch fails at once: the list does not reset it.
            (&[Some(0); 7], &[250, 500, 1000, 2000, 4000, 8000, 10_000]),
            (&[Some(29); 3], &[250, 500, 1000]),
            // A watch that held 30 s was healthy: its problem is retried at once.
            (&[Some(0), Some(0), Some(0), Some(30)], &[250, 500, 1000, 250]),
            (&[None, None, Some(3600), Some(1)], &[250, 500, 250, 500]),
        ];
        for (input, expected) in cases {
            check(input, expected);
        }
    }
}
