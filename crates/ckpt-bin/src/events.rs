//! Kubernetes Events on the parent pod: what happened to its checkpoint, published in the
//! background, never blocking the loop.
//!
//! An activation happens only while the API server is unreachable, so Events are not sent
//! as they happen: they go into a bounded queue, in order, with the time they happened, and
//! a background task publishes them whenever the agent's view is synced (at once, in the
//! usual case; after an outage, once the API server is back and has listed every
//! namespace for the agent: an API server that has just restarted answers `/readyz` before
//! its authorizer has loaded RBAC, and refuses everything with 403 until then). The Event
//! carries the time it happened as `eventTime`; one published late also says so in its
//! note. A write that fails for a reason that may pass (a timeout, a 5xx, 429, and 401/403,
//! which a restarting API server or refreshed credentials clear) is tried again after a
//! backoff, [`ATTEMPTS`] times in all. A repeat of the same Event about the same pod within
//! [`SERIES_WINDOW`] of the last one patches that Event's `series` (count, last time), as
//! kube's recorder does.
//!
//! kube's `Recorder` is not used: it stamps every Event (and every series update) with the
//! time it is published, which after an outage is when the API server came back.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ckpt_core::backoff::nth_delay;
use ckpt_core::{ApiState, PodId};
use ckpt_watch::jitter::equal_jitter;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use name::event_name;

mod name;

/// Events kept while they cannot be published; later ones are counted and dropped (the
/// first transitions of an outage say the most: what was started).
pub(crate) const QUEUE_BOUND: usize = 256;
/// A repeat within this time of the last one is counted in that Event's series (kube's
/// recorder keeps its cache this long).
const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);
/// Timeout of one Event request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Attempts at an Event that fails for a reason that may pass before it is given up.
const ATTEMPTS: u32 = 5;
/// The wait before the second attempt; it doubles for each further one (1 + 2 + 4 + 8 s:
/// the API server's authorizer loads RBAC within seconds of a restart), each jittered
/// between half and all of it.
const RETRY_BASE: Duration = if cfg!(test) {
    Duration::from_millis(20)
} else {
    Duration::from_secs(1)
};
/// Notes are at most 1 kB.
const NOTE_LIMIT: usize = 1000;
const CONTROLLER: &str = "pod-checkpointer";

/// What happened to a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum EventKind {
    Activated,
    Deactivated,
    Removed,
    Refused,
    HandoffStarted,
    HandoffReady,
    HandoffFailed,
    SetAside,
    SelfGcDeferred,
}

impl EventKind {
    /// (type, reason, action).
    fn describe(self) -> (&'static str, &'static str, &'static str) {
        match self {
            EventKind::Activated => ("Warning", "CheckpointActivated", "Activate"),
            EventKind::Deactivated => ("Normal", "CheckpointDeactivated", "Deactivate"),
            EventKind::Removed => ("Normal", "CheckpointRemoved", "Remove"),
            EventKind::Refused => ("Warning", "CheckpointRefused", "Checkpoint"),
            EventKind::HandoffStarted => ("Normal", "HandoffStarted", "Handoff"),
            EventKind::HandoffReady => ("Normal", "HandoffReady", "Handoff"),
            EventKind::HandoffFailed => ("Warning", "HandoffFailed", "Handoff"),
            EventKind::SetAside => ("Warning", "RevisionCrashLooping", "Fallback"),
            EventKind::SelfGcDeferred => ("Warning", "SelfGcDeferred", "Keep"),
        }
    }
}

/// Queues Events and publishes them in the background while the API server is reachable.
#[derive(Clone)]
pub(crate) struct EventSink {
    outbox: Arc<Mutex<Outbox>>,
    /// Wakes the publishing task (capacity 1: one pending wake-up is enough).
    wake: mpsc::Sender<()>,
}

/// One Event not published yet.
#[derive(Clone, Debug)]
struct Pending {
    kind: EventKind,
    parent: PodId,
    uid: Option<String>,
    note: String,
    at: Timestamp,
    attempts: u32,
}

#[derive(Debug, Default)]
struct Outbox {
    /// The agent's view is synced: the API server answers and accepts its credentials.
    synced: bool,
    /// The front of the queue failed: not before this time again.
    retry_at: Option<tokio::time::Instant>,
    queue: VecDeque<Pending>,
    /// Dropped since the queue last emptied.
    dropped: u64,
}

impl EventSink {
    /// Starts the publishing task (on the current runtime); it ends when every copy of
    /// the sink is dropped.
    pub(crate) fn new(client: kube::Client, node: &str) -> Self {
        let outbox = Arc::new(Mutex::new(Outbox::default()));
        let (wake, woken) = mpsc::channel(1);
        let publisher = Publisher {
            client,
            instance: node.to_owned(),
            series: HashMap::new(),
        };
        tokio::spawn(publisher.run(outbox.clone(), woken));
        Self { outbox, wake }
    }

    /// Says how the API server is now; publishes what waited for a synced view.
    pub(crate) fn api_state(&self, api: ApiState) {
        let flush = {
            let mut outbox = lock(&self.outbox);
            outbox.synced = api == ApiState::Synced;
            outbox.synced && !outbox.queue.is_empty()
        };
        if flush {
            self.wake();
        }
    }

    /// Queues an Event about `parent` that happened now, in a pass that saw the API
    /// server as `api`; it is published as soon as the view is synced.
    pub(crate) fn publish(
        &self,
        api: ApiState,
        parent: &PodId,
        uid: Option<&str>,
        kind: EventKind,
        note: String,
    ) {
        self.publish_at(api, parent, uid, kind, note, Timestamp::now());
    }

    fn publish_at(
        &self,
        api: ApiState,
        parent: &PodId,
        uid: Option<&str>,
        kind: EventKind,
        note: String,
        at: Timestamp,
    ) {
        let note = if api == ApiState::Unreachable {
            let at = at.strftime("%Y-%m-%dT%H:%M:%SZ");
            format!("{note} (at {at}, while the API server was unreachable)")
        } else {
            note
        };
        {
            let mut outbox = lock(&self.outbox);
            outbox.synced = api == ApiState::Synced;
            if outbox.queue.len() >= QUEUE_BOUND {
                outbox.dropped += 1;
                if outbox.dropped == 1 {
                    warn!(
                        bound = QUEUE_BOUND,
                        "too many Events wait for the API server: later ones are dropped until these are published"
                    );
                }
                return;
            }
            outbox.queue.push_back(Pending {
                kind,
                parent: parent.clone(),
                uid: uid.map(str::to_owned),
                note,
                at,
                attempts: 0,
            });
            if !outbox.synced {
                return;
            }
        }
        self.wake();
    }

    fn wake(&self) {
        // Full means a wake-up is pending already.
        let _ = self.wake.try_send(());
    }
}

/// The publishing task's state: the client and the Events published lately, for series.
struct Publisher {
    client: kube::Client,
    instance: String,
    series: HashMap<SeriesKey, Published>,
}

/// What makes a repeat the same Event (kube's recorder's key, with our fixed controller).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SeriesKey {
    kind: EventKind,
    parent: PodId,
    uid: Option<String>,
}

/// An Event created, for its series.
#[derive(Clone, Debug)]
struct Published {
    name: String,
    count: i32,
    last: Timestamp,
}

/// How a request for one Event ended.
#[derive(Debug)]
enum Sent {
    Done,
    /// Refused for good (4xx): dropped.
    Rejected(String),
    /// May pass (timeout, connection, 5xx, 429): tried again later.
    Failed(String),
}

impl Publisher {
    async fn run(mut self, outbox: Arc<Mutex<Outbox>>, mut woken: mpsc::Receiver<()>) {
        loop {
            let retry_at = lock(&outbox).retry_at;
            tokio::select! {
                wake = woken.recv() => {
                    if wake.is_none() {
                        return;
                    }
                }
                () = sleep_until(retry_at) => {}
            }
            self.drain(&outbox).await;
        }
    }

    /// Publishes the queue in order while the view is synced; stops at the first failure
    /// that may pass, to try again after a backoff (see [`RETRY_BASE`]).
    async fn drain(&mut self, outbox: &Mutex<Outbox>) {
        let mut published = 0u64;
        loop {
            let next = {
                let mut outbox = lock(outbox);
                if !outbox.synced {
                    break;
                }
                if outbox.retry_at.is_some_and(|at| at > tokio::time::Instant::now()) {
                    break;
                }
                outbox.retry_at = None;
                match outbox.queue.front() {
                    Some(pending) => pending.clone(),
                    None => break,
                }
            };
            let sent = self.send(&next).await;
            let mut outbox = lock(outbox);
            match sent {
                Sent::Done => {
                    published += 1;
                    outbox.queue.pop_front();
                }
                Sent::Rejected(error) => {
                    debug!(%error, reason = next.kind.describe().1, pod = %next.parent, "the API server refused an Event");
                    outbox.queue.pop_front();
                }
                Sent::Failed(error) => {
                    let attempts = next.attempts + 1;
                    if attempts >= ATTEMPTS {
                        debug!(%error, reason = next.kind.describe().1, pod = %next.parent, "cannot publish an Event; giving up");
                        outbox.queue.pop_front();
                        continue;
                    }
                    // Jittered: after an outage every node publishes at once.
                    // No cap of its own: the attempts run out first.
                    let backoff = equal_jitter(nth_delay(RETRY_BASE, Duration::MAX, attempts - 1));
                    debug!(%error, reason = next.kind.describe().1, pod = %next.parent, retry_ms = backoff.as_millis() as u64, "cannot publish an Event; trying again later");
                    if let Some(front) = outbox.queue.front_mut() {
                        front.attempts = attempts;
                    }
                    outbox.retry_at = Some(tokio::time::Instant::now() + backoff);
                    break;
                }
            }
            if outbox.queue.is_empty() && outbox.dropped > 0 {
                info!(
                    published,
                    dropped = outbox.dropped,
                    "published the queued Events; some were dropped (too many while the API server was unreachable)"
                );
                outbox.dropped = 0;
            }
        }
        // Only series that may still grow are kept.
        let now = Timestamp::now();
        self.series.retain(|_, p| within_window(p.last, now));
    }

    async fn send(&mut self, pending: &Pending) -> Sent {
        let key = SeriesKey {
            kind: pending.kind,
            parent: pending.parent.clone(),
            uid: pending.uid.clone(),
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &pending.parent.namespace);
        if let Some(published) = self
            .series
            .get(&key)
            .filter(|p| within_window(p.last, pending.at))
        {
            let count = published.count + 1;
            let patch = serde_json::json!({
                "series": {"count": count, "lastObservedTime": MicroTime(pending.at)},
            });
            let name = published.name.clone();
            match timed(api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))).await {
                Ok(_) => {
                    self.series.insert(
                        key,
                        Published {
                            name,
                            count,
                            last: pending.at,
                        },
                    );
                    return Sent::Done;
                }
                // Expired (the API server keeps Events an hour) or deleted: a new one.
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    self.series.remove(&key);
                }
                Err(e) => return classify(&e),
            }
        }
        let event = self.event(pending);
        let name = event.metadata.name.clone().unwrap_or_default();
        match timed(api.create(&PostParams::default(), &event)).await {
            Ok(_) => {
                self.series.insert(
                    key,
                    Published {
                        name,
                        count: 1,
                        last: pending.at,
                    },
                );
                Sent::Done
            }
            Err(e) => classify(&e),
        }
    }

    /// The Event as kube's recorder writes it, at the time it happened.
    fn event(&self, pending: &Pending) -> Event {
        let (type_, reason, action) = pending.kind.describe();
        let parent = &pending.parent;
        Event {
            action: Some(action.into()),
            reason: Some(reason.into()),
            event_time: Some(MicroTime(pending.at)),
            regarding: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(parent.namespace.to_string()),
                name: Some(parent.name.to_string()),
                uid: pending.uid.clone(),
                ..ObjectReference::default()
            }),
            note: Some(pending.note.chars().take(NOTE_LIMIT).collect()),
            metadata: ObjectMeta {
                namespace: Some(parent.namespace.to_string()),
                name: Some(event_name(&parent.name, pending.at)),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(CONTROLLER.into()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(type_.into()),
            ..Event::default()
        }
    }
}

fn within_window(last: Timestamp, at: Timestamp) -> bool {
    at.duration_since(last) < SERIES_WINDOW
}

async fn timed<T>(request: impl Future<Output = kube::Result<T>>) -> kube::Result<T> {
    tokio::time::timeout(REQUEST_TIMEOUT, request)
        .await
        .unwrap_or_else(|_| {
            Err(kube::Error::Service(
                std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer within 5 s").into(),
            ))
        })
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// 401 and 403 may pass: a restarted API server refuses everything until its authorizer
/// has loaded RBAC, and credentials are refreshed while the agent runs.
fn classify(error: &kube::Error) -> Sent {
    match error {
        kube::Error::Api(status)
            if (400..500).contains(&status.code) && ![401, 403, 408, 429].contains(&status.code) =>
        {
            Sent::Rejected(error.to_string())
        }
        _ => Sent::Failed(error.to_string()),
    }
}

fn lock(outbox: &Mutex<Outbox>) -> MutexGuard<'_, Outbox> {
    outbox.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
