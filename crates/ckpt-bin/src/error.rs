//! The agent's errors, and how each maps to an exit code.

/// A cause of either kind, kept with `#[source]`.
type Cause = Box<dyn std::error::Error + Send + Sync>;

/// What can go wrong in the `pod-checkpointer` binary. Messages name what failed; the
/// cause is the `source()`, and [`ckpt_core::error_chain`] prints both on one line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad flag, config file, strategy or kubeconfig: exit code 2, the message names it.
    #[error("{context}")]
    Usage {
        /// What is wrong, starting with the flag (`--kubeconfig: cannot read …`).
        context: String,
        /// Why, when another error says it.
        #[source]
        source: Option<Cause>,
    },
    /// Anything else at run time: exit code 1.
    #[error("{context}")]
    Runtime {
        /// What failed.
        context: String,
        /// Why.
        #[source]
        source: Cause,
    },
}

impl Error {
    /// A usage error caused by `source`: `context` names the flag and what was done.
    pub(crate) fn usage(context: impl Into<String>, source: impl Into<Cause>) -> Self {
        Error::Usage {
            context: context.into(),
            source: Some(source.into()),
        }
    }

    /// A usage error that `message` says all of.
    pub(crate) fn usage_message(message: impl Into<String>) -> Self {
        Error::Usage {
            context: message.into(),
            source: None,
        }
    }

    pub(crate) fn runtime(context: impl Into<String>, source: impl Into<Cause>) -> Self {
        Error::Runtime {
            context: context.into(),
            source: source.into(),
        }
    }

    /// The process exit code for this error (ARCHITECTURE.md, Command-line contract).
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Usage { .. } => 2,
            Error::Runtime { .. } => 1,
        }
    }
}

/// `render`'s refusals are usage errors; YAML it cannot write is a runtime failure.
impl From<ckpt_render::Error> for Error {
    fn from(error: ckpt_render::Error) -> Self {
        match error {
            ckpt_render::Error::Usage(message) => Error::usage_message(message),
            ckpt_render::Error::Yaml { what, source } => {
                Error::runtime(format!("cannot write {what}"), source)
            }
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
