//! Kubernetes Events on the parent pod: best effort, never blocking the loop.

use std::time::Duration;

use ckpt_core::PodId;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tracing::debug;

/// Publishes Events in the background with a timeout; does nothing while the API server
/// is unreachable (the Event would only queue up behind a dead connection).
#[derive(Clone)]
pub(crate) struct EventSink {
    recorder: Recorder,
}

/// What happened to a checkpoint.
#[derive(Clone, Copy, Debug)]
pub(crate) enum EventKind {
    Activated,
    Deactivated,
    Removed,
    Refused,
}

impl EventSink {
    pub(crate) fn new(client: kube::Client, node: &str) -> Self {
        let reporter = Reporter {
            controller: "pod-checkpointer".into(),
            instance: Some(node.to_owned()),
        };
        Self {
            recorder: Recorder::new(client, reporter),
        }
    }

    pub(crate) fn publish(
        &self,
        api_reachable: bool,
        parent: &PodId,
        uid: Option<&str>,
        kind: EventKind,
        note: String,
    ) {
        if !api_reachable {
            return;
        }
        let (type_, reason, action) = match kind {
            EventKind::Activated => (EventType::Warning, "CheckpointActivated", "Activate"),
            EventKind::Deactivated => (EventType::Normal, "CheckpointDeactivated", "Deactivate"),
            EventKind::Removed => (EventType::Normal, "CheckpointRemoved", "Remove"),
            EventKind::Refused => (EventType::Warning, "CheckpointRefused", "Checkpoint"),
        };
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: action.into(),
            secondary: None,
        };
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(parent.namespace.clone()),
            name: Some(parent.name.clone()),
            uid: uid.map(str::to_owned),
            ..ObjectReference::default()
        };
        let recorder = self.recorder.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(Duration::from_secs(5), recorder.publish(&event, &reference)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => debug!(error = %e, reason = event.reason, "cannot publish an Event"),
                Err(_) => debug!(reason = event.reason, "publishing an Event timed out"),
            }
        });
    }
}
