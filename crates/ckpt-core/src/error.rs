//! Why a pod cannot become a checkpoint, and [`error_chain`]: how every crate of the
//! workspace reports an error with its causes.

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

/// Any error with its `source()` chain on one line, `outer: cause: root cause`, for logs,
/// status reports and the binary's error output. A cause whose text the line already
/// contains (an error that quotes its cause) or that is empty is skipped.
///
/// ```
/// let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
/// assert_eq!(ckpt_core::error_chain(&io), "no such file");
/// ```
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut next = err.source();
    while let Some(cause) = next {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        next = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error with a message and an optional cause.
    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    fn chain_of(messages: &[&'static str]) -> Layer {
        let mut layers = messages.iter().rev();
        let innermost = Layer(layers.next().expect("one message"), None);
        layers.fold(innermost, |cause, message| Layer(message, Some(Box::new(cause))))
    }

    fn check(messages: &[&'static str], expected: &str) {
        assert_eq!(error_chain(&chain_of(messages)), expected, "{messages:?}");
    }

    #[test]
    fn chains() {
        check(&["alone"], "alone");
        check(&["outer", "cause", "root"], "outer: cause: root");
        // A message that already quotes its cause does not repeat it.
        check(
            &["cannot read x: no such file", "no such file"],
            "cannot read x: no such file",
        );
        check(&["outer", "cause", "cause"], "outer: cause");
        // An empty cause adds nothing, not a dangling ": ".
        check(&["outer", "", "root"], "outer: root");
    }
}
