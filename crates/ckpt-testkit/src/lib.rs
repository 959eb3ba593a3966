//! `ckpt-testkit`: test doubles for everything pod-checkpointer observes (not published).
//!
//! - [`FakeApi`]: a fake Kubernetes API behind a real [`kube::Client`] (kube's
//!   `tower-test` pattern): lists, watches with [`FakeApi::apply`]/[`FakeApi::delete`]
//!   events, `/readyz`, plain GETs, `events.k8s.io` Event writes, a request log with
//!   bodies, and whole-server outages
//!   ([`FakeApi::set_outage`] with [`Reply::Hang`] or [`Reply::Refuse`],
//!   [`FakeApi::end_outage`]).
//! - [`FakeCri`]: a CRI runtime (`runtime.v1` and/or `runtime.v1alpha2`) on a unix socket,
//!   speaking `ckpt-cri`'s messages; add, remove and clear pods, slow it down, make it
//!   misbehave ([`CriFault`]: hang, reset streams, answer `Unimplemented` or `Internal`),
//!   stop it.
//! - [`FakeKubelet`]: `/pods/` on 127.0.0.1, plain HTTP or TLS with a certificate signed by
//!   [`TEST_CA_PEM`]; set its status, stop it.
//! - [`FaultProxy`]: a TCP proxy that breaks the network on demand ([`NetFault`]: a
//!   blackhole, resets, a slow body; [`FaultProxy::half_open`] silences the open
//!   connections) and counts connections; in front of [`FakeApi::serve`], the fake API
//!   over a real socket.
//!
//! `ckpt-watch`'s unit tests and `ckpt-bin`'s in-process agent tests
//! (`tests/agent_inprocess.rs`) run against them; `ckpt-cri`'s client tests run against
//! [`FakeCri`]. The doubles accept anything and panic on misuse: only ever a
//! `[dev-dependencies]` entry. Waiting helpers ([`within`], [`wait_until`]) fail the
//! test after a generous timeout instead of asserting timings.
//!
//! ```
//! use std::time::Duration;
//!
//! use ckpt_cri::{RuntimeClient, proto};
//! use ckpt_testkit::{FakeCri, within};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let runtime = FakeCri::start(false, true); // an older runtime: v1alpha2 only
//! runtime.add_pod("kube-system", "etcd", proto::SANDBOX_READY, &[proto::CONTAINER_RUNNING]);
//! let cri = RuntimeClient::new(&runtime.endpoint(), Duration::from_secs(2)).unwrap();
//! let sandboxes = within(5, "the sandbox list", cri.list_pod_sandbox(None)).await.unwrap();
//! assert_eq!(sandboxes[0].pod(), Some(("kube-system", "etcd")));
//! # }
//! ```

use std::future::Future;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

mod api;
mod cri;
mod kubelet;
mod proxy;

pub use api::{FakeApi, Reply, Seen, pod_json, status_body};
pub use cri::{CriFault, CriState, FakeCri};
pub use kubelet::{FakeKubelet, KubeletState, TEST_CA_PEM};
pub use proxy::{FaultProxy, NetFault};

/// Fails the test if `fut` does not finish within `secs` seconds.
pub async fn within<T>(secs: u64, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(secs), fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {secs}s waiting for {what}"),
    }
}

/// Polls `cond` on every bump of `rx` (and every 10 ms) until it holds; panics after `secs`.
pub async fn wait_until(secs: u64, what: &str, mut rx: watch::Receiver<u64>, mut cond: impl FnMut() -> bool) {
    within(secs, what, async {
        while !cond() {
            let _ = tokio::time::timeout(Duration::from_millis(10), rx.changed()).await;
        }
    })
    .await;
}

/// Locks a mutex, ignoring poisoning (a test that panicked holding it already failed).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
