//! `ckpt-cri`: the Container Runtime Interface as pod-checkpointer speaks it.
//!
//! One definition of the CRI wire for the agent (which asks the runtime what runs), the
//! fake runtime its tests run against (`ckpt-testkit`), and the end-to-end harness (which
//! stops pods like a crash would):
//!
//! - [`proto`]: the `RuntimeService` messages used, hand-written with `prost` (no
//!   `protoc`), valid for both `runtime.v1` and `runtime.v1alpha2`; each is checked
//!   against bytes derived from the upstream `api.proto`.
//! - [`Method`] and [`ApiVersion`]: the gRPC paths, for the client and for servers that
//!   route by path.
//! - [`RuntimeClient`]: tonic over a unix socket; negotiates `runtime.v1`, falling back to
//!   `runtime.v1alpha2` as the kubelet does; every call has a timeout; a broken
//!   connection is dropped and the next call reconnects and negotiates again.
//!
//! The crate emits only `tracing` events; errors are one [`Error`] enum.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use ckpt_cri::{RuntimeClient, proto};
//!
//! # async fn example() -> Result<(), ckpt_cri::Error> {
//! let cri = RuntimeClient::new("unix:///run/containerd/containerd.sock", Duration::from_secs(2))?;
//! let (api, version) = cri.version().await?;
//! println!("{} {} speaks runtime.{api}", version.runtime_name, version.runtime_version);
//! let ready = proto::PodSandboxFilter {
//!     state: Some(proto::PodSandboxStateValue { state: proto::SANDBOX_READY }),
//!     ..Default::default()
//! };
//! for sandbox in cri.list_pod_sandbox(Some(ready)).await? {
//!     if let Some((namespace, name)) = sandbox.pod() {
//!         println!("{namespace}/{name} has a ready sandbox");
//!     }
//! }
//! # Ok(())
//! # }
//! ```

mod client;
mod error;
pub mod proto;
mod service;

#[doc(inline)]
pub use client::{MAX_ANSWER_BYTES, RuntimeClient, Stopped};
#[doc(inline)]
pub use error::{Error, Result};
#[doc(inline)]
pub use service::{ApiVersion, Method};
