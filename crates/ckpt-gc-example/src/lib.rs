//! An example of a GC strategy defined outside `ckpt-gc`: `keep-forever`.
//!
//! Nothing here is public except through the registry: the crate only `submit!`s. That is
//! exactly the kind of crate the linking rule ([inventory#7]) is about: a program that
//! wants `keep-forever` must reference the crate, or it is not linked and the strategy is
//! silently missing, even with the crate in `[dependencies]`:
//!
//! ```
//! use ckpt_gc_example as _; // inventory#7: link the crate so its strategy registers
//!
//! assert!(ckpt_gc::names().contains(&"keep-forever"));
//! ```
//!
//! Settings (`gc.keep-forever` in the agent's config file):
//!
//! ```yaml
//! gc-strategy: keep-forever
//! gc:
//!   keep-forever:
//!     except-self: true   # the verdict on the agent's own checkpoint is grace-period's (default false)
//! ```
//!
//! [inventory#7]: https://github.com/dtolnay/inventory/issues/7

use ckpt_core::{GcDecision, GcVerdict, Orphan, Timestamp};
use ckpt_gc::{GcPolicy, GcStrategyRegistration, GracePeriod, StrategyConfig, async_trait, inventory};
use serde::Deserialize;

const NAME: &str = "keep-forever";

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
struct Settings {
    /// Answer `grace-period`'s verdict for the agent's own checkpoint. The agent no longer
    /// acts on it (self-GC follows its DaemonSet's reads, whatever the strategy); kept so
    /// configs that set it still load.
    except_self: bool,
}

/// Keeps every checkpoint; removing them is left to `pod-checkpointer drain`.
#[derive(Debug)]
struct KeepForever {
    /// Set with `except-self`: the policy for the agent's own checkpoint.
    for_self: Option<GracePeriod>,
}

#[async_trait]
impl GcPolicy for KeepForever {
    async fn decide(&self, orphan: &Orphan, now: Timestamp) -> GcDecision {
        match &self.for_self {
            Some(grace) if orphan.is_self => grace.decide(orphan, now).await,
            _ => GcDecision::new(GcVerdict::Keep, "kept forever (keep-forever)"),
        }
    }
}

fn build(config: &StrategyConfig) -> ckpt_gc::Result<Box<dyn GcPolicy>> {
    let settings: Settings = config.parse_settings(NAME)?;
    let for_self = settings
        .except_self
        .then(|| GracePeriod::new(config.grace_period));
    Ok(Box::new(KeepForever { for_self }))
}

inventory::submit! {
    GcStrategyRegistration {
        name: NAME,
        summary: "never remove a checkpoint (optionally except the agent's own)",
        build,
    }
}

/// The README's example, compiled and run with the doctests so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeExample;
