//! The strategy registry: every [`GcStrategyRegistration`] submitted with `inventory`,
//! looked up by name.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use serde_json::Value;

use crate::config::json_type;
use crate::{Error, GcConfig, GcPolicy, Result, StrategyConfig};

/// Builds a strategy from its configuration. A plain `fn` pointer, because
/// `inventory::submit!` needs a constant.
pub type BuildStrategy = fn(&StrategyConfig) -> Result<Box<dyn GcPolicy>>;

/// A GC strategy as submitted to the registry with `inventory::submit!`.
#[derive(Debug)]
pub struct GcStrategyRegistration {
    /// The name chosen with `--gc-strategy` and used as its key under `gc:`, in kebab-case.
    pub name: &'static str,
    /// One line for `pod-checkpointer strategies`.
    pub summary: &'static str,
    /// The constructor.
    pub build: BuildStrategy,
}

/// What `pod-checkpointer strategies` shows for a name registered more than once.
const AMBIGUOUS_SUMMARY: &str = "ambiguous: registered more than once, cannot be selected";

/// Registered strategies by name.
#[derive(Clone, Debug)]
pub struct Registry {
    /// Every registration per name; more than one makes the name ambiguous.
    by_name: BTreeMap<&'static str, Vec<&'static GcStrategyRegistration>>,
}

static GLOBAL: LazyLock<Registry> =
    LazyLock::new(|| Registry::from_registrations(inventory::iter::<GcStrategyRegistration>));

impl Registry {
    /// The registry of everything submitted with `inventory::submit!` in the crates linked
    /// into this program, built on first use.
    pub fn global() -> &'static Self {
        &GLOBAL
    }

    /// A registry of these registrations. Separate from [`Registry::global`] so that
    /// duplicate handling is testable without polluting the program-wide inventory.
    pub fn from_registrations(
        registrations: impl IntoIterator<Item = &'static GcStrategyRegistration>,
    ) -> Self {
        let mut by_name: BTreeMap<_, Vec<_>> = BTreeMap::new();
        for registration in registrations {
            by_name.entry(registration.name).or_default().push(registration);
        }
        for (name, registrations) in &by_name {
            if registrations.len() > 1 {
                tracing::warn!(
                    strategy = name,
                    count = registrations.len(),
                    "GC strategy registered more than once; it cannot be selected"
                );
            }
        }
        Self { by_name }
    }

    /// The registered names, sorted (ambiguous ones included).
    pub fn names(&self) -> Vec<&'static str> {
        self.by_name.keys().copied().collect()
    }

    /// `(name, summary)` of every registered strategy, sorted by name.
    pub fn strategies(&self) -> Vec<(&'static str, &'static str)> {
        self.by_name
            .iter()
            .map(|(name, registrations)| match registrations.as_slice() {
                [only] => (*name, only.summary),
                _ => (*name, AMBIGUOUS_SUMMARY),
            })
            .collect()
    }

    /// The one registration of `name`.
    pub fn get(&self, name: &str) -> Result<&'static GcStrategyRegistration> {
        match self.by_name.get(name).map(Vec::as_slice) {
            Some([only]) => Ok(only),
            Some(registrations) => Err(Error::Ambiguous {
                name: name.to_owned(),
                count: registrations.len(),
            }),
            None => Err(Error::UnknownStrategy {
                name: name.to_owned(),
                known: self.names(),
            }),
        }
    }

    /// Builds strategy `name` with its own section of `config.gc_section`. Every key of
    /// that section must name a registered strategy, so a typo is an error, not ignored.
    pub fn build(&self, name: &str, config: &GcConfig) -> Result<Box<dyn GcPolicy>> {
        let registration = self.get(name)?;
        let settings = self.settings_of(name, &config.gc_section)?;
        let policy = (registration.build)(&StrategyConfig {
            grace_period: config.grace_period,
            settings,
        })?;
        tracing::debug!(strategy = name, grace_period = ?config.grace_period, "built GC strategy");
        Ok(policy)
    }

    fn settings_of(&self, name: &str, gc_section: &Value) -> Result<Value> {
        let sections = match gc_section {
            Value::Null => return Ok(Value::Null),
            Value::Object(sections) => sections,
            other => {
                return Err(Error::SettingsNotAMapping {
                    found: json_type(other),
                });
            }
        };
        if let Some(key) = sections
            .keys()
            .find(|key| !self.by_name.contains_key(key.as_str()))
        {
            return Err(Error::UnknownSettingsSection {
                key: key.clone(),
                known: self.names(),
            });
        }
        Ok(sections.get(name).cloned().unwrap_or(Value::Null))
    }
}

/// The program-wide registry ([`Registry::global`]).
pub fn registry() -> &'static Registry {
    Registry::global()
}

/// The registered strategy names, sorted.
pub fn names() -> Vec<&'static str> {
    Registry::global().names()
}

/// `(name, summary)` of every registered strategy, sorted: `pod-checkpointer strategies`.
pub fn strategies() -> Vec<(&'static str, &'static str)> {
    Registry::global().strategies()
}

/// Builds the strategy `name` from the program-wide registry ([`Registry::build`]).
pub fn build(name: &str, config: &GcConfig) -> Result<Box<dyn GcPolicy>> {
    Registry::global().build(name, config)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use async_trait::async_trait;
    use ckpt_core::{GcDecision, GcVerdict, Orphan, PodId, Timestamp};
    use serde_json::json;

    use super::*;
    use crate::DEFAULT_STRATEGY;

    /// A policy that answers with the name it was registered under, to tell registrations apart.
    #[derive(Debug)]
    struct Named(&'static str);

    #[async_trait]
    impl GcPolicy for Named {
        async fn decide(&self, _orphan: &Orphan, _now: Timestamp) -> GcDecision {
            GcDecision::new(GcVerdict::Keep, self.0)
        }
    }

    fn build_a(_: &StrategyConfig) -> Result<Box<dyn GcPolicy>> {
        Ok(Box::new(Named("a")))
    }

    fn build_b(_: &StrategyConfig) -> Result<Box<dyn GcPolicy>> {
        Ok(Box::new(Named("b")))
    }

    static ZULU: GcStrategyRegistration = GcStrategyRegistration {
        name: "zulu",
        summary: "last",
        build: build_a,
    };
    static ALPHA: GcStrategyRegistration = GcStrategyRegistration {
        name: "alpha",
        summary: "first",
        build: build_a,
    };
    static TWIN_A: GcStrategyRegistration = GcStrategyRegistration {
        name: "twin",
        summary: "one",
        build: build_a,
    };
    static TWIN_B: GcStrategyRegistration = GcStrategyRegistration {
        name: "twin",
        summary: "other",
        build: build_b,
    };

    fn test_registry() -> Registry {
        Registry::from_registrations([&ZULU, &TWIN_A, &ALPHA, &TWIN_B])
    }

    #[test]
    fn listing_is_sorted() {
        let registry = test_registry();
        assert_eq!(registry.names(), ["alpha", "twin", "zulu"]);
        assert_eq!(
            registry.strategies(),
            [("alpha", "first"), ("twin", AMBIGUOUS_SUMMARY), ("zulu", "last")]
        );
    }

    #[test]
    fn duplicate_name_is_ambiguous_not_first_wins() {
        for registrations in [[&TWIN_A, &TWIN_B], [&TWIN_B, &TWIN_A]] {
            let registry = Registry::from_registrations(registrations);
            let error = registry.get("twin").expect_err("ambiguous");
            assert!(matches!(&error, Error::Ambiguous { name, count: 2 } if name == "twin"));
            assert_eq!(
                error.to_string(),
                "GC strategy \"twin\" is ambiguous: registered 2 times"
            );
            assert!(matches!(
                registry.build("twin", &GcConfig::default()),
                Err(Error::Ambiguous { .. })
            ));
        }
    }

    #[test]
    fn unknown_name_lists_the_known_ones() {
        let error = test_registry().get("foo").expect_err("unknown");
        assert_eq!(
            error.to_string(),
            "unknown GC strategy \"foo\" (known: alpha, twin, zulu)"
        );
        assert_eq!(
            build("foo", &GcConfig::default())
                .expect_err("unknown")
                .to_string(),
            "unknown GC strategy \"foo\" (known: grace-period, immediate, owner-reference)"
        );
    }

    #[test]
    fn global_registry_holds_the_built_ins() {
        assert_eq!(names(), ["grace-period", "immediate", "owner-reference"]);
        assert!(names().contains(&DEFAULT_STRATEGY));
        for (name, summary) in strategies() {
            assert!(
                !summary.is_empty() && !summary.ends_with('.'),
                "{name}: {summary:?}"
            );
        }
    }

    #[tokio::test]
    async fn every_built_in_builds_with_default_config_and_decides() {
        let orphan = Orphan {
            id: PodId::new("kube-system", "x"),
            parent_uid: None,
            owner: None,
            is_self: false,
            absent_since: Timestamp(1_000),
            owner_status: ckpt_core::OwnerStatus::Unknown,
            siblings: Vec::new(),
        };
        for name in names() {
            let policy = build(name, &GcConfig::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
            let decision = policy.decide(&orphan, Timestamp(1_000)).await;
            assert!(!decision.reason.is_empty(), "{name}");
            // An empty section or an explicit null is "no settings" too.
            let empty = GcConfig::default().with_gc_section(json!({ name: {} }));
            build(name, &empty).unwrap_or_else(|e| panic!("{name}: {e}"));
            build(name, &GcConfig::default().with_gc_section(json!({}))).expect(name);
            build(name, &GcConfig::default().with_gc_section(json!({ name: null }))).expect(name);
        }
    }

    #[test]
    fn settings_go_to_their_own_strategy_only() {
        // Another strategy's section is left alone: switching --gc-strategy keeps the file valid.
        let config = GcConfig::new(Duration::from_secs(5))
            .with_gc_section(json!({"owner-reference": {"whatever": 1}, "immediate": null}));
        build("grace-period", &config).expect("grace-period ignores owner-reference's section");
    }

    #[test]
    fn bad_settings_are_rejected() {
        let check = |gc_section: Value, expected: &str| {
            let config = GcConfig::default().with_gc_section(gc_section.clone());
            let error = build("grace-period", &config).expect_err("rejected");
            let mut message = error.to_string();
            if let Some(source) = std::error::Error::source(&error) {
                message = format!("{message}: {source}");
            }
            assert_eq!(message, expected, "{gc_section}");
        };
        check(
            json!({"grace-period": {"grace": "30s"}}),
            "invalid settings for GC strategy \"grace-period\" (gc.grace-period): \
             unknown field `grace`, there are no fields",
        );
        check(
            json!({"grace-period": "30s"}),
            "invalid settings for GC strategy \"grace-period\" (gc.grace-period): \
             invalid type: string \"30s\", expected struct NoSettings",
        );
        check(
            json!({"grace-priod": {}}),
            "gc.grace-priod names no GC strategy (known: grace-period, immediate, owner-reference)",
        );
        check(
            json!("owner-reference"),
            "the gc section must map GC strategy names to their settings, found a string",
        );
        check(
            json!([]),
            "the gc section must map GC strategy names to their settings, found a list",
        );
    }

    #[test]
    fn build_passes_grace_period_and_own_section() {
        fn build_echo(config: &StrategyConfig) -> Result<Box<dyn GcPolicy>> {
            assert_eq!(config.grace_period, Duration::from_secs(7));
            assert_eq!(config.settings, json!({"k": 1}));
            Ok(Box::new(Named("echo")))
        }
        static ECHO: GcStrategyRegistration = GcStrategyRegistration {
            name: "echo",
            summary: "checks its config",
            build: build_echo,
        };
        let registry = Registry::from_registrations([&ECHO, &ALPHA]);
        let config =
            GcConfig::new(Duration::from_secs(7)).with_gc_section(json!({"echo": {"k": 1}, "alpha": {}}));
        registry.build("echo", &config).expect("built");
    }
}
