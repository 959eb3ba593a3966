//! What rendering can refuse.

/// The cause behind an agent's refusal, kept with `#[source]`.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// Why the manifests were not rendered. Messages name what failed; the cause is the
/// `source()`, and [`ckpt_core::error_chain`] prints both on one line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag the manifests cannot be rendered with, or the agent's refusal of the strategy
    /// or config they would carry: the operator must change a flag (exit code 2 in
    /// `pod-checkpointer render`).
    #[error("{context}")]
    Usage {
        /// What is wrong, starting with the flag (`--namespace: …`).
        context: String,
        /// Why, when another error says it.
        #[source]
        source: Option<Cause>,
    },
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
        Error::Usage {
            context: message.into(),
            source: None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
