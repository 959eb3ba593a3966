//! `grace-period` (the default): remove a checkpoint once its parent has been absent for
//! the grace period.

use std::time::Duration;

use async_trait::async_trait;
use ckpt_core::{GcDecision, GcVerdict, Orphan, Timestamp};

use crate::{GcPolicy, GcStrategyRegistration, NoSettings, Result, StrategyConfig};

const NAME: &str = "grace-period";

/// Removes a checkpoint at `absent_since + grace`. The deadline depends only on when the
/// parent left (persisted by the agent), never on the current clock, so neither a restart
/// nor a clock going backwards brings it forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GracePeriod {
    grace: Duration,
}

impl GracePeriod {
    /// The policy with this grace period (`--checkpoint-grace-period`).
    pub fn new(grace: Duration) -> Self {
        Self { grace }
    }

    /// The grace period.
    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// When the orphan's checkpoint is due: `absent_since + grace`, saturating.
    pub fn deadline(&self, orphan: &Orphan) -> Timestamp {
        orphan.absent_since.saturating_add(self.grace)
    }

    /// The grace-period verdict, with `why` in front of the reason.
    pub(crate) fn decision(&self, orphan: &Orphan, why: &str) -> GcDecision {
        GcDecision::new(
            GcVerdict::RemoveAt(self.deadline(orphan)),
            format!("{why}; grace period {:?}", self.grace),
        )
    }
}

#[async_trait]
impl GcPolicy for GracePeriod {
    async fn decide(&self, orphan: &Orphan, _now: Timestamp) -> GcDecision {
        self.decision(orphan, "parent gone")
    }
}

fn build(config: &StrategyConfig) -> Result<Box<dyn GcPolicy>> {
    // The grace period is the agent's `--checkpoint-grace-period`; a second knob for the
    // same thing under `gc:` would only raise the question of which one wins.
    let NoSettings {} = config.parse_settings(NAME)?;
    Ok(Box::new(GracePeriod::new(config.grace_period)))
}

inventory::submit! {
    GcStrategyRegistration {
        name: NAME,
        summary: "remove a checkpoint once its parent has been gone for --checkpoint-grace-period (default)",
        build,
    }
}

#[cfg(test)]
mod tests {
    use ckpt_core::PodId;

    use super::*;

    async fn check(grace_ms: u64, absent_since: i64, now: i64, expected_deadline: i64) {
        let orphan = Orphan {
            id: PodId::new("kube-system", "kube-apiserver-abc"),
            parent_uid: None,
            owner: None,
            is_self: false,
            absent_since: Timestamp(absent_since),
            owner_status: ckpt_core::OwnerStatus::Unknown,
            siblings: Vec::new(),
        };
        let policy = GracePeriod::new(Duration::from_millis(grace_ms));
        let decision = policy.decide(&orphan, Timestamp(now)).await;
        let expected = GcDecision::new(
            GcVerdict::RemoveAt(Timestamp(expected_deadline)),
            format!("parent gone; grace period {:?}", Duration::from_millis(grace_ms)),
        );
        assert_eq!(
            decision, expected,
            "grace={grace_ms}ms absent_since={absent_since} now={now}"
        );
    }

    #[tokio::test]
    async fn deadline_is_absent_since_plus_grace() {
        // (grace ms, absent since, now, deadline)
        let cases = [
            // Just went absent.
            (60_000, 100_000, 100_000, 160_000),
            // Half-way: same deadline, the clock does not move it.
            (60_000, 100_000, 130_000, 160_000),
            // Deadline exactly reached (the planner removes at now >= deadline).
            (60_000, 100_000, 160_000, 160_000),
            // Long past: still the same deadline, in the past.
            (60_000, 100_000, 900_000, 160_000),
            // Clock went backwards before absent_since: never earlier than absent_since + grace.
            (60_000, 100_000, 40_000, 160_000),
            // Grace 0: due the moment the parent left.
            (0, 100_000, 100_000, 100_000),
            (0, 100_000, 50_000, 100_000),
            // Saturates instead of overflowing.
            (60_000, i64::MAX - 1, i64::MAX - 1, i64::MAX),
        ];
        for (grace_ms, absent_since, now, deadline) in cases {
            check(grace_ms, absent_since, now, deadline).await;
        }
    }

    #[tokio::test]
    async fn parent_back_before_deadline_then_gone_again_gets_a_fresh_deadline() {
        // Absent at 100 s: due at 160 s. Back at 130 s: the agent stops asking and drops
        // absent_since. Gone again at 200 s: a fresh absent_since, so a fresh full grace.
        check(60_000, 100_000, 130_000, 160_000).await;
        check(60_000, 200_000, 200_000, 260_000).await;
    }

    #[tokio::test]
    async fn self_follows_the_same_deadline() {
        let orphan = Orphan {
            id: PodId::new("kube-system", "pod-checkpointer-abc"),
            parent_uid: None,
            owner: None,
            is_self: true,
            absent_since: Timestamp(1_000),
            owner_status: ckpt_core::OwnerStatus::Unknown,
            siblings: Vec::new(),
        };
        let decision = GracePeriod::new(Duration::from_secs(1))
            .decide(&orphan, Timestamp(1_000))
            .await;
        assert_eq!(decision.verdict, GcVerdict::RemoveAt(Timestamp(2_000)));
    }
}
