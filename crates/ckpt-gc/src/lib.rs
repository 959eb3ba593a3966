//! `ckpt-gc`: pluggable garbage-collection strategies for pod checkpoints.
//!
//! A strategy decides what happens to a checkpoint whose parent is absent from a
//! successful, synced API view (a [`ckpt_core::Orphan`]): keep it, remove it now, or
//! remove it at a deadline (a [`ckpt_core::GcDecision`]). The agent asks on every pass,
//! persists when the parent went missing, and hands the verdicts to the pure planner.
//!
//! - [`GcPolicy`]: the strategy trait. A strategy receives facts, not callbacks: each
//!   [`Orphan`](ckpt_core::Orphan) carries its owner, its siblings on this node and (when
//!   the strategy asks for it) whether its owner exists, gathered before deciding.
//! - [`GcStrategyRegistration`]: a strategy's name, one-line summary and constructor,
//!   submitted with [`inventory`]. [`Registry`] looks names up; [`names`], [`strategies`]
//!   and [`build`] use the program-wide one. A name registered twice is ambiguous and
//!   cannot be selected (no "first wins"); an unknown name is an error listing the known
//!   ones.
//! - [`GcConfig`] / [`StrategyConfig`]: the grace period (`--checkpoint-grace-period`) and
//!   the `gc:` section of the config file, which maps strategy names to their own settings.
//! - Built-ins: [`Immediate`] (`immediate`), [`GracePeriod`] (`grace-period`, the
//!   [`DEFAULT_STRATEGY`]) and [`OwnerReference`] (`owner-reference`).
//!
//! ```
//! use std::time::Duration;
//!
//! let policy = ckpt_gc::build(ckpt_gc::DEFAULT_STRATEGY, &ckpt_gc::GcConfig::new(Duration::from_secs(300)))?;
//! assert_eq!(
//!     ckpt_gc::names(),
//!     ["grace-period", "immediate", "owner-reference"],
//! );
//! # let _ = policy;
//! # Ok::<(), ckpt_gc::Error>(())
//! ```
//!
//! # Writing a strategy in another crate
//!
//! Implement [`GcPolicy`] and submit a [`GcStrategyRegistration`] at module level (not in a
//! function). The constructor must be a `fn` (a constant), and parses the strategy's own
//! settings, `gc.<name>` in the config file, with [`StrategyConfig::parse_settings`].
//! [`macro@async_trait`] and [`inventory`] are re-exported, so the crate needs neither as a
//! dependency of its own.
//!
//! (A doctest that submits a strategy, like this one, needs `standalone_crate`: edition 2024
//! merges doctests into one binary, so the strategy would appear in all of them.)
//!
//! ```standalone_crate
//! use ckpt_core::{GcDecision, GcVerdict, Orphan, Timestamp};
//! use ckpt_gc::{GcPolicy, GcStrategyRegistration, StrategyConfig, async_trait, inventory};
//!
//! /// Never removes a checkpoint by itself; `pod-checkpointer drain` does it by hand.
//! #[derive(Debug)]
//! struct KeepForever;
//!
//! #[async_trait]
//! impl GcPolicy for KeepForever {
//!     async fn decide(&self, _orphan: &Orphan, _now: Timestamp) -> GcDecision {
//!         GcDecision::new(GcVerdict::Keep, "kept forever")
//!     }
//! }
//!
//! fn build(config: &StrategyConfig) -> ckpt_gc::Result<Box<dyn GcPolicy>> {
//!     // No settings: any key under `gc.keep-forever` is an error naming the strategy.
//!     let ckpt_gc::NoSettings {} = config.parse_settings("keep-forever")?;
//!     Ok(Box::new(KeepForever))
//! }
//!
//! inventory::submit! {
//!     GcStrategyRegistration {
//!         name: "keep-forever",
//!         summary: "never remove a checkpoint",
//!         build,
//!     }
//! }
//!
//! fn main() {
//!     assert!(ckpt_gc::names().contains(&"keep-forever"));
//! }
//! ```
//!
//! **The linking rule** ([inventory#7]): a registration only exists if its crate is linked
//! into the program, and Rust does not link a dependency that nothing references — being
//! listed in `[dependencies]` is not enough. A crate that holds only `submit!`s therefore
//! vanishes silently from the registry unless the binary (or test) that wants it says
//!
//! ```no_run
//! # mod my_strategies {}
//! use my_strategies as _; // inventory#7: link the crate so its strategies register
//! ```
//!
//! The built-ins need nothing: they live in `ckpt-gc`, which the agent references anyway.
//! `crates/ckpt-gc-example` in this workspace is a third-party crate of the kind the rule is
//! about, with a test that depends on it.
//!
//! [inventory#7]: https://github.com/dtolnay/inventory/issues/7

mod config;
mod error;
mod grace_period;
mod immediate;
mod owner_reference;
mod policy;
mod registry;

pub use async_trait::async_trait;
pub use inventory;

#[doc(inline)]
pub use ckpt_core::{OwnerStatus, Sibling};
#[doc(inline)]
pub use config::{DEFAULT_GRACE_PERIOD, GcConfig, NoSettings, StrategyConfig};
#[doc(inline)]
pub use error::{Error, Result};
#[doc(inline)]
pub use grace_period::GracePeriod;
#[doc(inline)]
pub use immediate::Immediate;
#[doc(inline)]
pub use owner_reference::OwnerReference;
#[doc(inline)]
pub use policy::GcPolicy;
#[doc(inline)]
pub use registry::{BuildStrategy, GcStrategyRegistration, Registry, build, names, registry, strategies};

/// The strategy used when none is chosen.
pub const DEFAULT_STRATEGY: &str = "grace-period";

inventory::collect!(GcStrategyRegistration);

/// The README's example, compiled and run with the doctests so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeExample;
