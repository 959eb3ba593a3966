//! `ckpt-watch`: observing the world for pod-checkpointer.
//!
//! The API server, the kubelet and the container runtime, each reduced to a view that
//! says explicitly when the source is unavailable (ARCHITECTURE.md, Observing). Nothing here decides
//! anything: the planner in `ckpt-core` does.
//!
//! - [`ApiWatch`]: one kube watcher per allowed namespace over the pods bound to this node
//!   (`fieldSelector=spec.nodeName=<node>`, event-driven), plus a `/readyz` probe with a
//!   short timeout. [`ApiSnapshot::state`] is [`ApiState::Unreachable`] (only the probe
//!   decides: down, refusing or hung; after an outage, until `/readyz` answers 200),
//!   [`ApiState::Reachable`] (answers, no complete list
//!   since the last outage, e.g. a 403), [`ApiState::Unauthorized`] (`/readyz` answers
//!   401: the credentials are rejected) or [`ApiState::Synced`]. Each pod is read as a
//!   [`WatchedPod`]: typed, with the paths of any fields the typed model does not know
//!   ([`ApiSnapshot::unknown_fields`]), so a checkpoint never silently loses them.
//! - [`ObjectWatch`]: per-object watches of the Secrets and ConfigMaps checkpointed pods
//!   mount, started and stopped as the pods need them; no periodic re-fetch.
//! - [`OwnerLookup`]: does a pod's controller owner still exist (404 vs. any error).
//! - [`Observer`]: the three above as one: an owned [`ckpt_core::Observation`] per pass,
//!   the object watches kept in step with the parents, owners looked up before deciding.
//! - [`CriClient`]: which pods run, from the CRI runtime (`ckpt-cri`'s client:
//!   `runtime.v1` / `runtime.v1alpha2`, negotiated, over a unix socket).
//! - [`KubeletClient`]: the kubelet's `/pods` with a service-account token, TLS with or
//!   without a CA, plain HTTP, a read-only fallback URL.
//! - [`LocalObserver`]: CRI + kubelet → [`ckpt_core::LocalView`]; a failing source is
//!   [`LocalView::Unknown`](ckpt_core::LocalView::Unknown), never "nothing runs".
//!
//! The unit tests run against `ckpt-testkit`'s fake API server, CRI runtime and kubelet.
//!
//! Every network call has a timeout. The crate emits only `tracing` events, and logs a
//! failing source once per change of state rather than on every attempt.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use ckpt_core::NamespaceAllowList;
//! use ckpt_watch::{ApiState, ApiWatch, ApiWatchConfig, CriClient, LocalObserver};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let client = kube::Client::try_default().await?;
//! let namespaces = NamespaceAllowList::new(["kube-system"]);
//! let api = ApiWatch::spawn(client, ApiWatchConfig::new("node-1", namespaces.clone()));
//! let cri = CriClient::new("unix:///run/containerd/containerd.sock", Duration::from_secs(2))?;
//! let local = LocalObserver::new(Some(cri), None, namespaces.clone());
//!
//! let mut changes = api.subscribe();
//! loop {
//!     let snapshot = api.snapshot();
//!     let view = local.observe().await;
//!     if snapshot.state == ApiState::Synced {
//!         println!("{} pods on this node; local view {view:?}", snapshot.pods.len());
//!     }
//!     // Wake on the next API event, or poll the runtime again after a second.
//!     let _ = tokio::time::timeout(Duration::from_secs(1), changes.changed()).await;
//! }
//! # }
//! ```

mod api;
pub mod cri;
mod error;
pub mod jitter;
mod kubelet;
mod local;
mod objects;
mod observer;
mod owner;
mod reflect;
mod watched_pod;

// The test doubles, under the path the unit tests have always used.
#[cfg(test)]
use ckpt_testkit as testkit;

#[doc(inline)]
pub use api::{ApiSnapshot, ApiState, ApiWatch, ApiWatchConfig, NamespaceStatus};
#[doc(inline)]
pub use cri::{CriApi, CriClient};
#[doc(inline)]
pub use error::{Error, Result};
#[doc(inline)]
pub use kubelet::{KubeletClient, KubeletConfig};
#[doc(inline)]
pub use local::{LOCAL_LOOK_BOUND, LocalObserver, runs};
#[doc(inline)]
pub use objects::{ObjectKind, ObjectRef, ObjectWatch, ObjectsView};
#[doc(inline)]
pub use observer::Observer;
#[doc(inline)]
pub use owner::{OwnerLookup, OwnerPresence};
pub use watched_pod::WatchedPod;

/// The README's example, compiled and run with the doctests so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeExample;
