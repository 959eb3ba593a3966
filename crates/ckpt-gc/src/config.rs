//! Strategy configuration: the global grace period and the `gc:` section of the config file.

use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{Error, Result};

/// The grace period when the agent is not told one (`--checkpoint-grace-period`).
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(60);

/// The agent's GC configuration, from which the registry builds the chosen strategy.
///
/// The `gc:` section maps strategy names to their own settings, so switching strategies
/// with `--gc-strategy` never trips over another strategy's keys, and two third-party
/// strategies cannot collide on a key:
///
/// ```yaml
/// gc-strategy: owner-reference
/// checkpoint-grace-period: 5m
/// gc:
///   keep-forever: {except-self: true}
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct GcConfig {
    /// `--checkpoint-grace-period`.
    pub grace_period: Duration,
    /// The `gc:` section converted to JSON: `null`, or a mapping from strategy name to that
    /// strategy's settings.
    pub gc_section: Value,
}

impl GcConfig {
    /// A configuration with this grace period and no `gc:` section.
    pub fn new(grace_period: Duration) -> Self {
        Self {
            grace_period,
            gc_section: Value::Null,
        }
    }

    /// The same configuration with a `gc:` section.
    pub fn with_gc_section(mut self, gc_section: Value) -> Self {
        self.gc_section = gc_section;
        self
    }
}

impl Default for GcConfig {
    fn default() -> Self {
        Self::new(DEFAULT_GRACE_PERIOD)
    }
}

/// What one strategy is built from: the grace period and its own section, `gc.<name>`.
#[derive(Clone, Debug, PartialEq)]
pub struct StrategyConfig {
    /// `--checkpoint-grace-period`; built-in strategies take it from here, and so should
    /// third-party ones unless they have a reason to differ.
    pub grace_period: Duration,
    /// This strategy's settings (`gc.<name>`); `null` when the config has none.
    pub settings: Value,
}

impl StrategyConfig {
    /// A configuration with this grace period and no settings.
    pub fn new(grace_period: Duration) -> Self {
        Self {
            grace_period,
            settings: Value::Null,
        }
    }

    /// The same configuration with settings.
    pub fn with_settings(mut self, settings: Value) -> Self {
        self.settings = settings;
        self
    }

    /// The settings as the strategy's own type; `null` gives `T::default()`. Give `T`
    /// `#[serde(deny_unknown_fields)]`, so a misspelt key is an error rather than silently
    /// ignored; the error names `strategy` and serde's message names the field.
    pub fn parse_settings<T: DeserializeOwned + Default>(&self, strategy: &str) -> Result<T> {
        if self.settings.is_null() {
            return Ok(T::default());
        }
        T::deserialize(&self.settings).map_err(|source| Error::InvalidSettings {
            strategy: strategy.to_owned(),
            source,
        })
    }
}

impl Default for StrategyConfig {
    fn default() -> Self {
        Self::new(DEFAULT_GRACE_PERIOD)
    }
}

/// The settings of a strategy that has none: accepts only `null` or `{}`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoSettings {}

/// The JSON type of a value, for error messages.
pub(crate) fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[derive(Debug, Default, PartialEq, Deserialize)]
    #[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
    struct Delay {
        delay_seconds: u64,
    }

    #[test]
    fn parse_settings() {
        let check = |settings: Value, expected: std::result::Result<Delay, &str>| {
            let config = StrategyConfig::default().with_settings(settings.clone());
            let parsed = config.parse_settings::<Delay>("delayed");
            match (parsed, expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{settings}"),
                (Err(e), Err(want)) => {
                    let chain = format!("{e}: {}", std::error::Error::source(&e).expect("source"));
                    assert_eq!(chain, want, "{settings}");
                }
                (got, want) => panic!("{settings}: got {got:?}, want {want:?}"),
            }
        };
        check(Value::Null, Ok(Delay::default()));
        check(json!({}), Ok(Delay::default()));
        check(json!({"delay-seconds": 5}), Ok(Delay { delay_seconds: 5 }));
        check(
            json!({"delay_seconds": 5}),
            Err("invalid settings for GC strategy \"delayed\" (gc.delayed): \
                 unknown field `delay_seconds`, expected `delay-seconds`"),
        );
        check(
            json!({"delay-seconds": "5s"}),
            Err("invalid settings for GC strategy \"delayed\" (gc.delayed): \
                 invalid type: string \"5s\", expected u64"),
        );
    }

    #[test]
    fn no_settings_accepts_only_nothing() {
        let parse = |settings: Value| {
            StrategyConfig::default()
                .with_settings(settings)
                .parse_settings::<NoSettings>("x")
        };
        assert!(parse(Value::Null).is_ok());
        assert!(parse(json!({})).is_ok());
        assert!(matches!(
            parse(json!({"grace": "30s"})),
            Err(Error::InvalidSettings { .. })
        ));
        assert!(matches!(parse(json!("30s")), Err(Error::InvalidSettings { .. })));
    }
}
