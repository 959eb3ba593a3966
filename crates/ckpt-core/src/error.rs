//! Why a pod cannot become a checkpoint.

/// A pod that cannot be represented as a static pod, or whose API objects are missing.
/// Every variant names the field, so the log line, metric and Event say what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The pod has no name.
    #[error("pod has no metadata.name")]
    MissingName,
    /// A field that a static pod cannot express (a PVC, a CSI volume, …).
    #[error("{field}: cannot be checkpointed: {reason}")]
    Unrepresentable {
        /// The field path, e.g. `spec.volumes[2] (data)`.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// A Secret or ConfigMap the pod needs (and does not mark optional) was not supplied.
    #[error("{field}: {kind} {name:?} not found")]
    MissingObject {
        /// The field path.
        field: String,
        /// `Secret` or `ConfigMap`.
        kind: &'static str,
        /// The object's name.
        name: String,
    },
    /// A key the pod needs (and does not mark optional) is not in the Secret/ConfigMap.
    #[error("{field}: key {key:?} not found in {kind} {name:?}")]
    MissingKey {
        /// The field path.
        field: String,
        /// `Secret` or `ConfigMap`.
        kind: &'static str,
        /// The object's name.
        name: String,
        /// The missing key.
        key: String,
    },
    /// A file path or mode in the pod that is not safe or valid.
    #[error("{field}: invalid {what}: {value:?}")]
    Invalid {
        /// The field path.
        field: String,
        /// `path`, `mode`, `key`, …
        what: &'static str,
        /// The offending value.
        value: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
