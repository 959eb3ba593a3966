//! A strategy from another crate is picked up by the program-wide registry, next to the
//! built-ins, once the crate is linked.

// inventory#7: nothing below names an item of the crate, so without this line it would not
// be linked and `keep-forever` would be missing from the registry.
use ckpt_gc_example as _;

use std::time::Duration;

use ckpt_core::{GcVerdict, Orphan, PodId, Timestamp};
use ckpt_gc::GcConfig;
use serde_json::json;

fn orphan(is_self: bool) -> Orphan {
    Orphan {
        is_self,
        ..Orphan::new(
            PodId::new("kube-system", "pod-checkpointer-abc"),
            Timestamp(1_000),
        )
    }
}

#[test]
fn registered_alongside_the_built_ins() {
    assert_eq!(
        ckpt_gc::names(),
        ["grace-period", "immediate", "keep-forever", "owner-reference"]
    );
    assert!(ckpt_gc::strategies().contains(&(
        "keep-forever",
        "never remove a checkpoint (optionally except the agent's own)"
    )));
}

#[tokio::test]
async fn built_from_its_own_gc_section() {
    let now = Timestamp(1_000);
    let config = |section| GcConfig::new(Duration::from_secs(5)).with_gc_section(section);

    let keep_all = ckpt_gc::build("keep-forever", &config(json!(null))).expect("built");
    assert_eq!(keep_all.decide(&orphan(true), now).await.verdict, GcVerdict::Keep);
    assert_eq!(
        keep_all.decide(&orphan(false), now).await.verdict,
        GcVerdict::Keep
    );

    let except_self = ckpt_gc::build(
        "keep-forever",
        &config(json!({"keep-forever": {"except-self": true}})),
    )
    .expect("built");
    assert_eq!(
        except_self.decide(&orphan(true), now).await.verdict,
        GcVerdict::RemoveAt(Timestamp(6_000))
    );
    assert_eq!(
        except_self.decide(&orphan(false), now).await.verdict,
        GcVerdict::Keep
    );
}

#[test]
fn unknown_setting_names_the_strategy() {
    let config = GcConfig::default().with_gc_section(json!({"keep-forever": {"except_self": true}}));
    let error = ckpt_gc::build("keep-forever", &config).expect_err("rejected");
    let source = std::error::Error::source(&error)
        .expect("serde error")
        .to_string();
    assert_eq!(
        error.to_string(),
        "invalid settings for GC strategy \"keep-forever\" (gc.keep-forever)"
    );
    assert!(
        source.starts_with("unknown field `except_self`, expected `except-self`"),
        "{source}"
    );
}
