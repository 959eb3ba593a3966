//! An in-memory [`GcContext`] for tests, here and in crates with their own strategies.

use async_trait::async_trait;
use ckpt_core::{ControllerOwner, PodId, Timestamp};

use crate::{GcContext, OwnerStatus, Sibling};

/// A [`GcContext`] with a fixed clock and fixed answers.
///
/// An owner it was not told about is [`OwnerStatus::Unknown`], as if the lookup had failed:
/// the safe default.
///
/// ```
/// use ckpt_core::{ControllerOwner, PodId, Timestamp};
/// use ckpt_gc::{OwnerStatus, StaticContext};
///
/// let ds = ControllerOwner {
///     api_version: "apps/v1".into(),
///     kind: "DaemonSet".into(),
///     name: "kube-apiserver".into(),
///     uid: "u1".into(),
/// };
/// let ctx = StaticContext::new(Timestamp(60_000))
///     .with_owner("kube-system", &ds, OwnerStatus::Present)
///     .with_pod(PodId::new("kube-system", "kube-apiserver-new"), &ds, true);
/// # let _ = ctx;
/// ```
#[derive(Clone, Debug)]
pub struct StaticContext {
    now: Timestamp,
    owners: Vec<(String, ControllerOwner, OwnerStatus)>,
    pods: Vec<(PodId, ControllerOwner, bool)>,
}

impl StaticContext {
    /// A context at `now` that knows no owners and no pods.
    pub fn new(now: Timestamp) -> Self {
        Self {
            now,
            owners: Vec::new(),
            pods: Vec::new(),
        }
    }

    /// The same context, where `owner` in `namespace` has this status.
    pub fn with_owner(mut self, namespace: &str, owner: &ControllerOwner, status: OwnerStatus) -> Self {
        self.owners.push((namespace.to_owned(), owner.clone(), status));
        self
    }

    /// The same context, with a parent on this node controlled by `owner`, and whether its
    /// checkpoint is written.
    pub fn with_pod(mut self, id: PodId, owner: &ControllerOwner, checkpointed: bool) -> Self {
        self.pods.push((id, owner.clone(), checkpointed));
        self
    }
}

#[async_trait]
impl GcContext for StaticContext {
    fn now(&self) -> Timestamp {
        self.now
    }

    async fn owner_status(&self, namespace: &str, owner: &ControllerOwner) -> OwnerStatus {
        self.owners
            .iter()
            .find(|(ns, known, _)| ns == namespace && known.same_controller(owner))
            .map_or(OwnerStatus::Unknown, |(_, _, status)| *status)
    }

    async fn siblings(&self, namespace: &str, owner: &ControllerOwner) -> Vec<Sibling> {
        let mut siblings: Vec<_> = self
            .pods
            .iter()
            .filter(|(id, pod_owner, _)| id.namespace == namespace && pod_owner.same_controller(owner))
            .map(|(id, _, checkpointed)| Sibling::new(id.clone(), *checkpointed))
            .collect();
        siblings.sort();
        siblings
    }
}
