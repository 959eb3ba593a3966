//! The one error type of this crate.

use std::path::PathBuf;
use std::time::Duration;

// The workspace's one formatting of a cause chain, used by the modules here for errors of
// other crates (kube, hyper) too.
pub(crate) use ckpt_core::error_chain;

/// Everything that can go wrong while observing. Each variant names where: the URL, the
/// socket or the file concerned. Causes are chained with `#[source]`; [`Error::chain`]
/// formats the whole chain on one line for logs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A CRI call failed, timed out, or the endpoint is unusable (the error names the
    /// socket and the method).
    #[error(transparent)]
    Cri(#[from] ckpt_cri::Error),
    /// A kubelet URL that does not parse or has no `http`/`https` scheme.
    #[error("invalid kubelet URL {url:?}")]
    KubeletUrl {
        /// The URL as given.
        url: String,
        /// Why it does not parse (absent for a missing or unsupported scheme).
        #[source]
        source: Option<http::uri::InvalidUri>,
    },
    /// An https kubelet URL with a token to send, and neither a CA to verify the kubelet's
    /// certificate nor an explicit choice not to.
    #[error(
        "the kubelet at {url} would get the service-account token unverified: give its CA, or choose insecure explicitly"
    )]
    KubeletUnverified {
        /// The URL as given.
        url: String,
    },
    /// Building the HTTP client for a kubelet URL failed (TLS setup, CA file).
    #[error("cannot build an HTTP client for the kubelet at {url}")]
    KubeletClient {
        /// The kubelet URL.
        url: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// `GET <url>/pods/` failed (connection, TLS, HTTP status, bad JSON).
    #[error("GET {url}/pods/ failed")]
    KubeletRequest {
        /// The kubelet URL.
        url: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// `GET <url>/pods/` did not finish within the timeout.
    #[error("GET {url}/pods/ timed out after {timeout:?}")]
    KubeletTimeout {
        /// The kubelet URL.
        url: String,
        /// The timeout.
        timeout: Duration,
    },
    /// Both the kubelet URL and its read-only fallback failed; this is the fallback's
    /// error, the primary's is in the message.
    #[error("kubelet pod list failed at both URLs; first: {primary}")]
    KubeletBoth {
        /// The primary URL's error, formatted with its causes.
        primary: String,
        /// The read-only URL's error.
        #[source]
        fallback: Box<Error>,
    },
    /// A file we were told to read (service-account token, CA bundle) cannot be read.
    #[error("cannot read the {what} {}", path.display())]
    ReadFile {
        /// What the file is, e.g. `service-account token file`.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The token file holds something that cannot go into an HTTP header.
    #[error("the service-account token in {} is not a valid HTTP header value", path.display())]
    BadToken {
        /// The path.
        path: PathBuf,
    },
    /// A local source took longer than the whole local look may take (its calls each
    /// have a timeout of their own, but several in a row could add up).
    #[error("the {source_name} did not answer everything within {bound:?}")]
    LocalLookTimedOut {
        /// `CRI runtime` or `kubelet`.
        source_name: &'static str,
        /// The bound of the whole look.
        bound: std::time::Duration,
    },
    /// A client was created outside a Tokio runtime.
    #[error("{what} must be created inside a Tokio runtime")]
    NoRuntime {
        /// What was being created.
        what: &'static str,
    },
}

/// `Result` with this crate's [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The error and all its causes on one line, `outer: cause: root cause`, for logs and
    /// status reports.
    pub fn chain(&self) -> String {
        error_chain(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_includes_causes_once() {
        let err = Error::ReadFile {
            what: "service-account token file",
            path: "/var/run/token".into(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        };
        assert_eq!(
            err.chain(),
            "cannot read the service-account token file /var/run/token: no such file"
        );
        assert!(!err.to_string().ends_with('.'));
    }
}
