//! `owner-reference`: follow the parent's controller owner (DaemonSet, ReplicaSet, …).

use std::time::Duration;

use async_trait::async_trait;
use ckpt_core::{ControllerOwner, GcDecision, GcVerdict, Orphan, Timestamp};

use crate::{GcPolicy, GcStrategyRegistration, GracePeriod, NoSettings, OwnerStatus, Result, StrategyConfig};

const NAME: &str = "owner-reference";

/// Follows the parent's controller owner. In order:
///
/// 1. No controller owner: as [`GracePeriod`].
/// 2. A sibling (a parent on this node with the same controller) already has its checkpoint
///    written: remove now, "superseded by ns/name". A rolling update thus replaces the old
///    checkpoint without a window in which the node has none.
/// 3. The owner is gone (404): remove now, "owner Kind/name deleted".
/// 4. A sibling exists but is not checkpointed yet: keep, until step 2 applies. (Only pods
///    the agent will checkpoint are [`Orphan::siblings`], so this cannot hold on forever.)
/// 5. The owner exists but has no pod here (the node was deselected): as [`GracePeriod`].
/// 6. The owner lookup failed: as [`GracePeriod`]; a failed lookup never removes early.
///
/// The agent's own checkpoint gets a verdict by the same rules, but self-GC follows its
/// DaemonSet, not the verdict (see [`GcPolicy`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnerReference {
    fallback: GracePeriod,
}

impl OwnerReference {
    /// The policy, with this grace period for its fallbacks.
    pub fn new(grace: Duration) -> Self {
        Self {
            fallback: GracePeriod::new(grace),
        }
    }
}

fn owner_label(owner: &ControllerOwner) -> String {
    format!("{}/{}", owner.kind, owner.name)
}

#[async_trait]
impl GcPolicy for OwnerReference {
    async fn decide(&self, orphan: &Orphan, _now: Timestamp) -> GcDecision {
        let Some(owner) = &orphan.owner else {
            return self.fallback.decision(orphan, "no controller owner");
        };
        // Sorted, so the reason names the same sibling every pass.
        let mut siblings: Vec<_> = orphan.siblings.iter().filter(|s| s.id != orphan.id).collect();
        siblings.sort();
        if let Some(newer) = siblings.iter().find(|sibling| sibling.checkpointed) {
            return GcDecision::new(GcVerdict::RemoveNow, format!("superseded by {}", newer.id));
        }
        let owner = owner_label(owner);
        match (orphan.owner_status, siblings.first()) {
            (OwnerStatus::Absent, _) => {
                GcDecision::new(GcVerdict::RemoveNow, format!("owner {owner} deleted"))
            }
            (_, Some(pending)) => GcDecision::new(
                GcVerdict::Keep,
                format!("waiting for {} of {owner} to be checkpointed", pending.id),
            ),
            (OwnerStatus::Present, None) => self
                .fallback
                .decision(orphan, &format!("owner {owner} has no pod on this node")),
            (OwnerStatus::Unknown, None) => {
                tracing::debug!(checkpoint = %orphan.id, %owner, "owner lookup failed; falling back to the grace period");
                self.fallback
                    .decision(orphan, &format!("owner {owner} unknown (lookup failed)"))
            }
        }
    }

    fn needs_owner_status(&self) -> bool {
        true
    }
}

fn build(config: &StrategyConfig) -> Result<Box<dyn GcPolicy>> {
    let NoSettings {} = config.parse_settings(NAME)?;
    Ok(Box::new(OwnerReference::new(config.grace_period)))
}

inventory::submit! {
    GcStrategyRegistration {
        name: NAME,
        summary: "follow the parent's controller: superseded by a checkpointed sibling or owner deleted \
                  removes now, otherwise the grace period",
        build,
    }
}

#[cfg(test)]
mod tests {
    use ckpt_core::{PodId, Sibling};

    use super::*;

    const NS: &str = "kube-system";
    const GRACE: Duration = Duration::from_secs(60);

    fn daemon_set(name: &str, uid: &str) -> ControllerOwner {
        ControllerOwner {
            api_version: "apps/v1".into(),
            kind: "DaemonSet".into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    fn orphan(name: &str, owner: Option<&ControllerOwner>, absent_since: i64) -> Orphan {
        Orphan {
            parent_uid: Some(format!("uid-{name}")),
            owner: owner.cloned(),
            ..Orphan::new(PodId::new(NS, name), Timestamp(absent_since))
        }
    }

    /// The facts the agent gathered about an orphan (the agent filters siblings to pods
    /// of the same controller in the same namespace: ckpt-core's `assess` tests).
    trait Facts {
        fn owner_is(self, status: OwnerStatus) -> Self;
        fn sibling(self, name: &str, checkpointed: bool) -> Self;
    }

    impl Facts for Orphan {
        fn owner_is(mut self, status: OwnerStatus) -> Self {
            self.owner_status = status;
            self
        }

        fn sibling(mut self, name: &str, checkpointed: bool) -> Self {
            self.siblings.push(Sibling {
                id: PodId::new(NS, name),
                checkpointed,
            });
            self
        }
    }

    async fn check(now: Timestamp, orphan: Orphan, verdict: GcVerdict, reason: &str) {
        let decision = OwnerReference::new(GRACE).decide(&orphan, now).await;
        assert_eq!(decision, GcDecision::new(verdict, reason), "{orphan:?}");
    }

    #[tokio::test]
    async fn decisions() {
        use OwnerStatus::{Absent, Present, Unknown};
        let api = daemon_set("kube-apiserver", "u1");
        let now = Timestamp(130_000);
        let at = |ms| GcVerdict::RemoveAt(Timestamp(ms));
        let old = || orphan("kube-apiserver-old", Some(&api), 100_000);
        let cases: Vec<(&str, Timestamp, Orphan, GcVerdict, &str)> = vec![
            (
                "rolling update: the new pod is checkpointed",
                now,
                old().owner_is(Present).sibling("kube-apiserver-new", true),
                GcVerdict::RemoveNow,
                "superseded by kube-system/kube-apiserver-new",
            ),
            (
                "rolling update: the new pod is not checkpointed yet",
                now,
                old().owner_is(Present).sibling("kube-apiserver-new", false),
                GcVerdict::Keep,
                "waiting for kube-system/kube-apiserver-new of DaemonSet/kube-apiserver to be checkpointed",
            ),
            (
                "rolling update: superseding needs no owner status (lookup failing)",
                now,
                old().owner_is(Unknown).sibling("kube-apiserver-new", true),
                GcVerdict::RemoveNow,
                "superseded by kube-system/kube-apiserver-new",
            ),
            (
                "rolling update: pending sibling and failed lookup keep",
                now,
                old().owner_is(Unknown).sibling("kube-apiserver-new", false),
                GcVerdict::Keep,
                "waiting for kube-system/kube-apiserver-new of DaemonSet/kube-apiserver to be checkpointed",
            ),
            (
                "several siblings: the first checkpointed one by name",
                now,
                old()
                    .owner_is(Present)
                    .sibling("kube-apiserver-c", true)
                    .sibling("kube-apiserver-a", false)
                    .sibling("kube-apiserver-b", true),
                GcVerdict::RemoveNow,
                "superseded by kube-system/kube-apiserver-b",
            ),
            (
                "the orphan is never its own sibling",
                now,
                old().owner_is(Present).sibling("kube-apiserver-old", true),
                at(160_000),
                "owner DaemonSet/kube-apiserver has no pod on this node; grace period 60s",
            ),
            (
                "owner deleted",
                now,
                old().owner_is(Absent),
                GcVerdict::RemoveNow,
                "owner DaemonSet/kube-apiserver deleted",
            ),
            (
                "owner deleted wins over a pending sibling (it is being deleted too)",
                now,
                old().owner_is(Absent).sibling("kube-apiserver-new", false),
                GcVerdict::RemoveNow,
                "owner DaemonSet/kube-apiserver deleted",
            ),
            (
                "owner present, no pod here (node deselected)",
                now,
                old().owner_is(Present),
                at(160_000),
                "owner DaemonSet/kube-apiserver has no pod on this node; grace period 60s",
            ),
            (
                "owner lookup failed: grace period, never now",
                now,
                old().owner_is(Unknown),
                at(160_000),
                "owner DaemonSet/kube-apiserver unknown (lookup failed); grace period 60s",
            ),
            (
                "pod without owner: grace period",
                now,
                orphan("static-ish", None, 100_000).sibling("kube-apiserver-new", true),
                at(160_000),
                "no controller owner; grace period 60s",
            ),
            (
                "deadline exactly reached is still reported as the deadline",
                Timestamp(160_000),
                old().owner_is(Present),
                at(160_000),
                "owner DaemonSet/kube-apiserver has no pod on this node; grace period 60s",
            ),
            (
                "clock went backwards: the deadline does not move earlier",
                Timestamp(10_000),
                old().owner_is(Present),
                at(160_000),
                "owner DaemonSet/kube-apiserver has no pod on this node; grace period 60s",
            ),
            (
                "parent back and gone again: a fresh absent_since, a fresh deadline",
                Timestamp(200_000),
                orphan("kube-apiserver-old", Some(&api), 200_000).owner_is(Present),
                at(260_000),
                "owner DaemonSet/kube-apiserver has no pod on this node; grace period 60s",
            ),
        ];
        for (name, now, orphan, verdict, reason) in cases {
            eprintln!("case: {name}");
            check(now, orphan, verdict, reason).await;
        }
    }

    #[tokio::test]
    async fn grace_zero_falls_back_to_absent_since() {
        let api = daemon_set("kube-apiserver", "u1");
        let decision = OwnerReference::new(Duration::ZERO)
            .decide(
                &orphan("kube-apiserver-old", Some(&api), 100_000),
                Timestamp(100_000),
            )
            .await;
        assert_eq!(decision.verdict, GcVerdict::RemoveAt(Timestamp(100_000)));
    }

    #[tokio::test]
    async fn self_goes_through_the_same_rules() {
        let agent = daemon_set("pod-checkpointer", "u1");
        let mut me = orphan("pod-checkpointer-abc", Some(&agent), 100_000);
        me.is_self = true;
        let now = Timestamp(100_000);
        check(
            now,
            me.clone().owner_is(OwnerStatus::Absent),
            GcVerdict::RemoveNow,
            "owner DaemonSet/pod-checkpointer deleted",
        )
        .await;
        check(
            now,
            me.owner_is(OwnerStatus::Present),
            GcVerdict::RemoveAt(Timestamp(160_000)),
            "owner DaemonSet/pod-checkpointer has no pod on this node; grace period 60s",
        )
        .await;
    }

    #[test]
    fn asks_for_owner_status() {
        assert!(OwnerReference::new(GRACE).needs_owner_status());
    }
}
