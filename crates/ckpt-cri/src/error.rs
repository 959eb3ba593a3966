//! The one error type of this crate.

use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong talking to a runtime. Each variant names the socket.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An endpoint that is neither `unix:///path` nor `/path`.
    #[error("unsupported CRI endpoint {endpoint:?}: expected unix:///path or an absolute socket path")]
    Endpoint {
        /// The endpoint as given.
        endpoint: String,
    },
    /// A call failed (connection refused, socket missing, an error status).
    #[error("CRI call {method} on {} failed", socket.display())]
    Call {
        /// The socket path.
        socket: PathBuf,
        /// The gRPC path, e.g. `/runtime.v1.RuntimeService/ListPodSandbox`.
        method: &'static str,
        /// The gRPC status.
        #[source]
        source: Box<tonic::Status>,
    },
    /// A call did not finish within the timeout.
    #[error("CRI call {method} on {} timed out after {timeout:?}", socket.display())]
    Timeout {
        /// The socket path.
        socket: PathBuf,
        /// The gRPC path.
        method: &'static str,
        /// The timeout.
        timeout: Duration,
    },
    /// An answer larger than [`crate::MAX_ANSWER_BYTES`] (a node with very many pods, or
    /// a runtime gone wrong): refused, not read.
    #[error("CRI call {method} on {} answered more than {limit} bytes", socket.display())]
    AnswerTooLarge {
        /// The socket path.
        socket: PathBuf,
        /// The gRPC path.
        method: &'static str,
        /// The limit, in bytes.
        limit: usize,
    },
    /// The runtime answered `Unimplemented` to both `runtime.v1` and `runtime.v1alpha2`.
    #[error("CRI runtime on {} serves neither runtime.v1 nor runtime.v1alpha2", socket.display())]
    Unsupported {
        /// The socket path.
        socket: PathBuf,
    },
    /// [`crate::RuntimeClient::stop_pod`]: the runtime runs nothing of that pod (no ready
    /// sandbox, no container that has not exited).
    #[error("CRI runtime on {} runs nothing of pod {namespace}/{name}", socket.display())]
    PodNotRunning {
        /// The socket path.
        socket: PathBuf,
        /// The pod's namespace.
        namespace: String,
        /// The pod's name.
        name: String,
    },
}

/// `Result` with this crate's [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
