//! The library behind `cargo xtask`, shared by its commands and the end-to-end suite
//! (`xtask/tests/e2e`):
//!
//! - [`e2e_env`]: build, start and stop the real control plane (kube-apiserver v1.20.2, etcd
//!   and kubemark's hollow kubelet) and kill, pause or restart its API server;
//! - [`harness`]: what drives the agent against it: `pod-checkpointer` processes with their
//!   logs, kubectl, the hollow kubelet's CRI, the Kubernetes objects the scenarios create,
//!   bounded polling and Ctrl-C handling;
//! - [`image`]: OCI image archives built without a container engine (the agent's, the pause
//!   image, a busybox for test pods);
//! - [`apt`]: the Debian packages the tasks install when missing;
//! - [`progress`]: the progress lines every command prints on stderr.

pub mod apt;
pub mod e2e_env;
pub mod harness;
pub mod image;
pub mod progress;
