//! `owner-reference`: follow the parent's controller owner (DaemonSet, ReplicaSet, …).

use std::time::Duration;

use async_trait::async_trait;
use ckpt_core::{ControllerOwner, GcDecision, GcVerdict, Orphan};

use crate::{
    GcContext, GcPolicy, GcStrategyRegistration, GracePeriod, NoSettings, OwnerStatus, Result, StrategyConfig,
};

const NAME: &str = "owner-reference";

/// Follows the parent's controller owner. In order:
///
/// 1. No controller owner: as [`GracePeriod`].
/// 2. A sibling (a parent on this node with the same controller) already has its checkpoint
///    written: remove now, "superseded by ns/name". A rolling update thus replaces the old
///    checkpoint without a window in which the node has none.
/// 3. The owner is gone (404): remove now, "owner Kind/name deleted".
/// 4. A sibling exists but is not checkpointed yet: keep, until step 2 applies. (The agent
///    lists only pods it will checkpoint as siblings, so this cannot hold on forever.)
/// 5. The owner exists but has no pod here (the node was deselected): as [`GracePeriod`].
/// 6. The owner lookup failed: as [`GracePeriod`]; a failed lookup never removes early.
///
/// The agent's own checkpoint follows the same rules, so deleting the agent's DaemonSet
/// triggers self-GC at once and deselecting the node triggers it after the grace period.
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
    async fn decide(&self, orphan: &Orphan, ctx: &dyn GcContext) -> GcDecision {
        let Some(owner) = &orphan.owner else {
            return self.fallback.decision(orphan, "no controller owner");
        };
        let namespace = orphan.id.namespace.as_str();
        // Sorted, so the reason names the same sibling every pass.
        let mut siblings = ctx.siblings(namespace, owner).await;
        siblings.retain(|sibling| sibling.id != orphan.id);
        siblings.sort();
        if let Some(newer) = siblings.iter().find(|sibling| sibling.checkpointed) {
            return GcDecision::new(GcVerdict::RemoveNow, format!("superseded by {}", newer.id));
        }
        let status = ctx.owner_status(namespace, owner).await;
        let owner = owner_label(owner);
        match (status, siblings.first()) {
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
    use ckpt_core::{PodId, Timestamp};

    use super::*;
    use crate::StaticContext;

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
            id: PodId::new(NS, name),
            parent_uid: Some(format!("uid-{name}")),
            owner: owner.cloned(),
            is_self: false,
            absent_since: Timestamp(absent_since),
        }
    }

    fn pod(name: &str) -> PodId {
        PodId::new(NS, name)
    }

    async fn check(ctx: StaticContext, orphan: Orphan, verdict: GcVerdict, reason: &str) {
        let decision = OwnerReference::new(GRACE).decide(&orphan, &ctx).await;
        assert_eq!(decision, GcDecision::new(verdict, reason), "{orphan:?}\n{ctx:?}");
    }

    #[tokio::test]
    async fn decisions() {
        let api = daemon_set("kube-apiserver", "u1");
        // The same DaemonSet deleted and re-created: new UID, same controller.
        let api_recreated = daemon_set("kube-apiserver", "u2");
        let other = daemon_set("kube-scheduler", "u3");
        let now = Timestamp(130_000);
        let at = |ms| GcVerdict::RemoveAt(Timestamp(ms));
        let cases: Vec<(&str, StaticContext, Orphan, GcVerdict, &str)> = vec![
            (
                "rolling update: the new pod is checkpointed",
                StaticContext::new(now)
                    .with_owner(NS, &api, OwnerStatus::Present)
                    .with_pod(pod("kube-apiserver-new"), &api, true),
                orphan("kube-apiserver-old", Some(&api), 100_000),
                GcVerdict::RemoveNow,
                "superseded by kube-system/kube-apiserver-new",
            ),
            (
                "rolling update: the new pod is not checkpointed yet",
                StaticContext::new(now)
                    .with_owner(NS, &api, OwnerStatus::Present)
                    .with_pod(pod("kube-apiserver-new"), &api, false),
                orphan("kube-apiserver-old", Some(&api), 100_000),
                GcVerdict::Keep,
                "waiting for kube-system/kube-apiserver-new of DaemonSet/kube-apiserver to be checkpointed",
            ),
            (
                "rolling update: superseding needs no owner lookup (lookup failing)",
                StaticContext::new(now).with_pod(pod("kube-apiserver-new"), &api, true),
                orphan("kube-apiserver-old", Some(&api), 100_000),
                GcVerdict::RemoveNow,
                "superseded by kube-system/kube-apiserver-new",
            ),
            (
                "rolling update: pending sibling and failed lookup keep",
                StaticContext::new(now).with_pod(pod("kube-apiserver-new"), &api, false),
                orphan("kube-apiserver-old", Some(&api), 100_000),
                GcVerdict::Keep,
                "waiting for kube-system/kube-apiserver-new of DaemonSet/kube-apiserver to be checkpointed",
            ),
            (
                "controller re-created under the same name supersedes too",
                StaticContext::new(now)
                    .with_owner(NS, &api_recreated, OwnerStatus::Present)
                    .with_pod(pod("kube-apiserver-new"), &api_recreated, true),
                orphan("kube-apiserver-old", Some(&api), 100_000),
                GcVerdict::RemoveNow,
                "superseded by kube-system/kube-apiserver-new",
            ),
            (
                "several siblings: the first checkpointed one by name",
                StaticContext::new(now)
                    .with_owner(NS, &api, OwnerStatus::Present)
                    .with_pod(pod("kube-apiserver-c"), &api, true)
                    .with_pod(pod("kube-apiserver-a"), &api, false)
                    .with_pod(pod("kube-apiserver-b"), &api, true),
                orphan("kube-apiserver-old", Some(&api), 100_000),
                GcVerdict::RemoveNow,
                "superseded by kube-system/kube-apiserver-b",
            ),
            (
                "a pod of another controller supersedes nothing",
                StaticContext::new(now)
                    .with_owner(NS, &api, OwnerStatus::Present)
                    .with_pod(pod("kube-scheduler-x"), &other, true),
                orphan("kube-apiserver-old", Some(&api), 100_000),
                at(160_000),
                "owner DaemonSet/kube-apiserver has no pod on this node; grace period 60s",
            ),
            (
                "a same-named controller in another namespace supersedes nothing",
                StaticContext::new(now)
                    .with_owner(NS, &api, OwnerStatus::Present)
                    .with_pod(PodId::new("default", "kube-apiserver-new"), &api, true),
                orphan("kube-apiserver-old", Some(&api), 100_000),
                at(160_000),
                "owner DaemonSet/kube-apiserver has no pod on this node; grace period 60s",
            ),
            (
                "the orphan is never its own sibling",
                StaticContext::new(now)
                    .with_owner(NS, &api, OwnerStatus::Present)
                    .with_pod(pod("kube-apiserver-old"), &api, true),
                orphan("kube-apiserver-old", Some(&api), 100_000),
                at(160_000),
                "owner DaemonSet/kube-apiserver has no pod on this node; grace period 60s",
            ),
            (
                "owner deleted",
                StaticContext::new(now).with_owner(NS, &api, OwnerStatus::Absent),
                orphan("kube-apiserver-old", Some(&api), 100_000),
                GcVerdict::RemoveNow,
                "owner DaemonSet/kube-apiserver deleted",
            ),
            (
                "owner deleted wins over a pending sibling (it is being deleted too)",
                StaticContext::new(now)
                    .with_owner(NS, &api, OwnerStatus::Absent)
                    .with_pod(pod("kube-apiserver-new"), &api, false),
                orphan("kube-apiserver-old", Some(&api), 100_000),
                GcVerdict::RemoveNow,
                "owner DaemonSet/kube-apiserver deleted",
            ),
            (
                "owner present, no pod here (node deselected)",
                StaticContext::new(now).with_owner(NS, &api, OwnerStatus::Present),
                orphan("kube-apiserver-old", Some(&api), 100_000),
                at(160_000),
                "owner DaemonSet/kube-apiserver has no pod on this node; grace period 60s",
            ),
            (
                "owner lookup failed: grace period, never now",
                StaticContext::new(now).with_owner(NS, &api, OwnerStatus::Unknown),
                orphan("kube-apiserver-old", Some(&api), 100_000),
                at(160_000),
                "owner DaemonSet/kube-apiserver unknown (lookup failed); grace period 60s",
            ),
            (
                "pod without owner: grace period",
                StaticContext::new(now).with_pod(pod("kube-apiserver-new"), &api, true),
                orphan("static-ish", None, 100_000),
                at(160_000),
                "no controller owner; grace period 60s",
            ),
            (
                "deadline exactly reached is still reported as the deadline",
                StaticContext::new(Timestamp(160_000)).with_owner(NS, &api, OwnerStatus::Present),
                orphan("kube-apiserver-old", Some(&api), 100_000),
                at(160_000),
                "owner DaemonSet/kube-apiserver has no pod on this node; grace period 60s",
            ),
            (
                "clock went backwards: the deadline does not move earlier",
                StaticContext::new(Timestamp(10_000)).with_owner(NS, &api, OwnerStatus::Present),
                orphan("kube-apiserver-old", Some(&api), 100_000),
                at(160_000),
                "owner DaemonSet/kube-apiserver has no pod on this node; grace period 60s",
            ),
            (
                "parent back and gone again: a fresh absent_since, a fresh deadline",
                StaticContext::new(Timestamp(200_000)).with_owner(NS, &api, OwnerStatus::Present),
                orphan("kube-apiserver-old", Some(&api), 200_000),
                at(260_000),
                "owner DaemonSet/kube-apiserver has no pod on this node; grace period 60s",
            ),
        ];
        for (name, ctx, orphan, verdict, reason) in cases {
            eprintln!("case: {name}");
            check(ctx, orphan, verdict, reason).await;
        }
    }

    #[tokio::test]
    async fn grace_zero_falls_back_to_absent_since() {
        let api = daemon_set("kube-apiserver", "u1");
        let ctx = StaticContext::new(Timestamp(100_000)).with_owner(NS, &api, OwnerStatus::Unknown);
        let decision = OwnerReference::new(Duration::ZERO)
            .decide(&orphan("kube-apiserver-old", Some(&api), 100_000), &ctx)
            .await;
        assert_eq!(decision.verdict, GcVerdict::RemoveAt(Timestamp(100_000)));
    }

    #[tokio::test]
    async fn self_goes_through_the_same_rules() {
        let agent = daemon_set("pod-checkpointer", "u1");
        let mut me = orphan("pod-checkpointer-abc", Some(&agent), 100_000);
        me.is_self = true;
        let deleted = StaticContext::new(Timestamp(100_000)).with_owner(NS, &agent, OwnerStatus::Absent);
        check(
            deleted,
            me.clone(),
            GcVerdict::RemoveNow,
            "owner DaemonSet/pod-checkpointer deleted",
        )
        .await;
        let deselected = StaticContext::new(Timestamp(100_000)).with_owner(NS, &agent, OwnerStatus::Present);
        check(
            deselected,
            me,
            GcVerdict::RemoveAt(Timestamp(160_000)),
            "owner DaemonSet/pod-checkpointer has no pod on this node; grace period 60s",
        )
        .await;
    }
}
