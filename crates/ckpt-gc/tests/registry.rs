//! The program-wide registry as a user of the crate sees it: exactly the built-ins, each
//! buildable by name. (Third-party registration is tested in `crates/ckpt-gc-example`.)

use ckpt_gc::{DEFAULT_STRATEGY, GcConfig};

#[test]
fn built_in_strategies_are_registered() {
    assert_eq!(ckpt_gc::names(), ["grace-period", "immediate", "owner-reference"]);
    assert_eq!(ckpt_gc::registry().names(), ckpt_gc::names());
    let listed: Vec<_> = ckpt_gc::strategies().into_iter().map(|(name, _)| name).collect();
    assert_eq!(listed, ckpt_gc::names());
    assert!(ckpt_gc::names().contains(&DEFAULT_STRATEGY));
}

#[test]
fn every_built_in_builds_by_name() {
    for name in ckpt_gc::names() {
        ckpt_gc::build(name, &GcConfig::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}
