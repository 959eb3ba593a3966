//! What rendering can refuse.

/// Why the manifests were not rendered. Messages name what failed; the cause, if any, is
/// the `source()`, and [`ckpt_core::error_chain`] prints both on one line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag the manifests cannot be rendered with, or the agent's refusal of the strategy
    /// or config they would carry, starting with the flag (`--namespace: …`): the operator
    /// must change a flag (exit code 2 in `pod-checkpointer render`).
    #[error("{0}")]
    Usage(String),
    /// An object that cannot be written as YAML.
    #[error("cannot write {what}")]
    Yaml {
        /// The object (`DaemonSet kube-system/pod-checkpointer`).
        what: String,
        #[source]
        source: serde_saphyr::SerializeError,
    },
}

impl Error {
    /// A usage error that `message` says all of.
    pub(crate) fn usage_message(message: impl Into<String>) -> Self {
        Error::Usage(message.into())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
