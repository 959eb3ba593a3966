//! `immediate`: remove a checkpoint as soon as its parent is absent.

use async_trait::async_trait;
use ckpt_core::{GcDecision, GcVerdict, Orphan, Timestamp};

use crate::{GcPolicy, GcStrategyRegistration, NoSettings, Result, StrategyConfig};

const NAME: &str = "immediate";

/// Removes a checkpoint in the first pass that sees its parent absent from a synced API
/// view. The agent's own checkpoint gets the same verdict, but self-GC follows its
/// DaemonSet, not the verdict (see [`GcPolicy`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Immediate;

#[async_trait]
impl GcPolicy for Immediate {
    async fn decide(&self, _orphan: &Orphan, _now: Timestamp) -> GcDecision {
        GcDecision::new(GcVerdict::RemoveNow, "parent gone (immediate)")
    }
}

fn build(config: &StrategyConfig) -> Result<Box<dyn GcPolicy>> {
    let NoSettings {} = config.parse_settings(NAME)?;
    Ok(Box::new(Immediate))
}

inventory::submit! {
    GcStrategyRegistration {
        name: NAME,
        summary: "remove a checkpoint as soon as its parent is gone",
        build,
    }
}

#[cfg(test)]
mod tests {
    use ckpt_core::{PodId, Timestamp};

    use super::*;

    async fn check(is_self: bool, absent_since: i64, now: i64) {
        let orphan = Orphan {
            id: PodId::new("kube-system", "kube-scheduler-abc"),
            parent_uid: Some("uid".into()),
            owner: None,
            is_self,
            absent_since: Timestamp(absent_since),
            owner_status: ckpt_core::OwnerStatus::Unknown,
            siblings: Vec::new(),
        };
        let decision = Immediate.decide(&orphan, Timestamp(now)).await;
        assert_eq!(
            decision,
            GcDecision::new(GcVerdict::RemoveNow, "parent gone (immediate)"),
            "is_self={is_self} absent_since={absent_since} now={now}"
        );
    }

    #[tokio::test]
    async fn removes_now_whatever_the_clock_says() {
        check(false, 1_000, 1_000).await;
        check(false, 1_000, 500_000).await;
        // Clock went backwards: still removed, nothing to wait for.
        check(false, 1_000, 10).await;
        // Self goes through the same policy: immediate self-GC.
        check(true, 1_000, 1_000).await;
    }
}
