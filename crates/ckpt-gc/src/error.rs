//! The crate's error type.

/// Everything that can go wrong while choosing and building a GC strategy.
///
/// Deciding never fails: [`GcPolicy::decide`](crate::GcPolicy::decide) answers with a
/// decision even when a lookup fails (see there), so every variant is a configuration
/// problem the agent reports as a usage error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No strategy is registered under this name.
    #[error("unknown GC strategy {name:?} (known: {})", .known.join(", "))]
    UnknownStrategy {
        /// The name asked for.
        name: String,
        /// The registered names, sorted.
        known: Vec<&'static str>,
    },

    /// More than one registration uses this name, so none of them is picked: silently
    /// choosing one would depend on link order.
    #[error("GC strategy {name:?} is ambiguous: registered {count} times")]
    Ambiguous {
        /// The name asked for.
        name: String,
        /// How many registrations carry it.
        count: usize,
    },

    /// The `gc:` section of the config is neither a mapping nor empty.
    #[error("the gc section must map GC strategy names to their settings, found {found}")]
    SettingsNotAMapping {
        /// The JSON type found instead, e.g. `a string`.
        found: &'static str,
    },

    /// A key of the `gc:` section names no registered strategy (most likely a typo).
    #[error("gc.{key} names no GC strategy (known: {})", .known.join(", "))]
    UnknownSettingsSection {
        /// The offending key.
        key: String,
        /// The registered names, sorted.
        known: Vec<&'static str>,
    },

    /// A strategy's settings (`gc.<strategy>`) do not deserialize: a wrong type or an
    /// unknown key.
    #[error("invalid settings for GC strategy {strategy:?} (gc.{strategy})")]
    InvalidSettings {
        /// The strategy whose settings were rejected.
        strategy: String,
        /// What serde found wrong; it names the field.
        #[source]
        source: serde_json::Error,
    },

    /// A strategy refused its configuration for another reason (for third-party strategies
    /// whose settings need checks beyond deserialization).
    #[error("cannot build GC strategy {strategy:?}")]
    Build {
        /// The strategy that refused.
        strategy: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Convenient alias for `Result<T, Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
