//! The agent's errors, and how each maps to an exit code.

/// What can go wrong in the `pod-checkpointer` binary.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad flag, config file, strategy or kubeconfig: exit code 2, the message names it.
    #[error("{0}")]
    Usage(String),
    /// Anything else at run time: exit code 1.
    #[error("{context}")]
    Runtime {
        /// What failed.
        context: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl Error {
    pub(crate) fn runtime(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::Runtime {
            context: context.into(),
            source: source.into(),
        }
    }

    /// The process exit code for this error (DESIGN §3.7).
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(_) => 2,
            Error::Runtime { .. } => 1,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
