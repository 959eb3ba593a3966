//! `render --prometheus`: the agent's metrics for a Prometheus operator. The active copy
//! serves them on the node's IP (`--metrics-listen $(HOST_IP):PORT`), a PodMonitor scrapes
//! both pods of a node (they answer alike: only the lock holder listens), and a
//! PrometheusRule alerts on what an operator must act on before the next power cut.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DynamicObject, TypeMeta};
use serde_json::json;

use crate::manifest::Manifest;
use crate::options::ManifestOptions;
use crate::{NAME, labels};

/// The container port's name the PodMonitor scrapes.
pub(crate) const PORT_NAME: &str = "metrics";

/// Where each alert's runbook is: a section of docs/operations.md named after the alert.
pub(crate) const RUNBOOKS: &str = concat!(env!("CARGO_PKG_REPOSITORY"), "/blob/main/docs/operations.md");

/// One alert of the PrometheusRule: what the tests check and docs/operations.md lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alert {
    pub name: &'static str,
    /// PromQL, with `JOB` standing for the PodMonitor's job selector and `DAEMONSET` for
    /// kube-state-metrics' selector of the agent's DaemonSet.
    pub expr: &'static str,
    pub for_: &'static str,
    pub severity: &'static str,
    pub summary: &'static str,
    pub description: &'static str,
}

impl Alert {
    /// The `runbook_url` annotation: the alert's section of docs/operations.md.
    pub fn runbook_url(&self) -> String {
        format!("{RUNBOOKS}#{}", self.name.to_ascii_lowercase())
    }
}

/// The alerts, each aggregated per node (`node` comes from the PodMonitor's relabeling),
/// but for the DaemonSet's, which kube-state-metrics reports per DaemonSet.
pub const ALERTS: &[Alert] = &[
    Alert {
        name: "PodCheckpointerNoActiveCopy",
        expr: "max by (node) (up{JOB}) == 0",
        for_: "5m",
        severity: "critical",
        summary: "No copy of pod-checkpointer is active on a node.",
        description: "Neither the DaemonSet pod nor its static copy holds the lock (nothing answers on the node's metrics port): the node's checkpointed pods are not kept up to date, and a power cut would bring back stale ones or none.",
    },
    Alert {
        name: "PodCheckpointerCheckpointActive",
        expr: "max by (node) (pod_checkpointer_checkpoints{JOB, state=~\"active|active-grace\"}) > 0",
        for_: "15m",
        severity: "warning",
        summary: "A checkpoint has been running instead of its parent for 15 minutes.",
        description: "The API server has been unreachable from the node, or a checkpointed parent has not run there, for 15 minutes; `pod-checkpointer inspect` on the node names the checkpoint.",
    },
    Alert {
        name: "PodCheckpointerWriteErrors",
        expr: "max by (node) (increase(pod_checkpointer_write_errors_total{JOB}[10m])) > 0",
        for_: "10m",
        severity: "warning",
        summary: "pod-checkpointer keeps failing to write checkpoints.",
        description: "Disk operations of the agent have failed for 10 minutes (a full or read-only disk, permissions); its logs name the files. Checkpoints may be stale.",
    },
    Alert {
        name: "PodCheckpointerApiNotSynced",
        expr: "time() - max by (node) (pod_checkpointer_last_api_sync_timestamp_seconds{JOB}) > 900",
        for_: "5m",
        severity: "warning",
        summary: "pod-checkpointer has not seen the API server for 15 minutes.",
        description: "The active copy's API view has not been synced for 15 minutes (unreachable, or credentials rejected): new pods and spec changes are not checkpointed.",
    },
    Alert {
        name: "PodCheckpointerKeptCredentialsExpiring",
        expr: "min by (node) (pod_checkpointer_kept_token_expiry_timestamp_seconds{JOB}) - time() < 86400",
        for_: "1h",
        severity: "warning",
        summary: "The token kept for pod-checkpointer's static copy expires within a day.",
        description: "The token is renewed every hour with a 7-day lifetime; one this close to expiry means renewal fails (RBAC for serviceaccounts/token, or an API server capping token lifetimes below a day: then raise this threshold). After a power cut the static copy could not reach the API server once it expires.",
    },
    Alert {
        name: "PodCheckpointerNotSelfCheckpointed",
        expr: "min by (node) (pod_checkpointer_self_checkpointed{JOB}) == 0",
        for_: "15m",
        severity: "critical",
        summary: "pod-checkpointer does not checkpoint itself on a node.",
        description: "The agent's own pod is not annotated checkpointer.alpha.coreos.com/checkpoint=true, or its namespace is not in --namespaces: no static copy of the agent exists, so after a power cut without the API server nothing activates the node's checkpoints. Its logs say which.",
    },
    Alert {
        name: "PodCheckpointerSelfGcDeferred",
        expr: "max by (node) (pod_checkpointer_self_gc_deferred{JOB}) > 0",
        for_: "30m",
        severity: "warning",
        summary: "pod-checkpointer no longer runs on a node but stays for a checkpoint that serves there.",
        description: "The agent's DaemonSet no longer targets the node (or is deleted), but an active checkpoint serves a DaemonSet that still targets it (after a failed handoff it may be the node's only API server): it and the agent stay. `pod-checkpointer inspect` names it; let its pod run on the node, stop its DaemonSet targeting the node, or annotate the Node pod-checkpointer.github.io/decommission=true to let everything go.",
    },
    Alert {
        name: "PodCheckpointerHandoffFailed",
        expr: "max by (node) (increase(pod_checkpointer_handoffs_total{JOB, step=\"failed\"}[1h])) > 0",
        for_: "0m",
        severity: "warning",
        summary: "A parent with new content did not become Ready in time: its known-good checkpoint serves again.",
        description: "The known-good checkpoint stepped aside for a parent whose content had never run here, and the parent did not become Ready within --handoff-timeout: the checkpoint is back and the new revision is marked rejected on the node. `pod-checkpointer inspect` names it; the parent's logs say why it failed. Fix or roll back its DaemonSet.",
    },
    Alert {
        name: "PodCheckpointerUnauthorized",
        expr: "max by (node) (pod_checkpointer_api_state{JOB, state=\"unauthorized\"}) == 1",
        for_: "15m",
        severity: "critical",
        summary: "The API server has rejected pod-checkpointer's credentials on a node for 15 minutes.",
        description: "The active copy's token is rejected (401) or it may read none of its pods (403): it neither writes nor removes checkpoints. A holder hands the lock over after --unauthorized-handover; one stuck here means both copies are refused: check the ServiceAccount, its bindings, and the token kept for the static copy (`pod-checkpointer inspect`).",
    },
    Alert {
        name: "PodCheckpointerMissingOnNodes",
        expr: "max by (namespace, daemonset) (kube_daemonset_status_desired_number_scheduled{DAEMONSET}) - max by (namespace, daemonset) (kube_daemonset_status_number_available{DAEMONSET}) > 0 or max by (namespace, daemonset) (kube_daemonset_status_desired_number_scheduled{DAEMONSET}) == 0",
        for_: "15m",
        severity: "warning",
        summary: "pod-checkpointer is not running on every node it should, or targets no node.",
        description: "From kube-state-metrics: the agent's DaemonSet has had fewer available pods than nodes it targets, or no node to target (no node carries the labels it runs on: see render --node-label), for 15 minutes. A node without the agent has no checkpoints kept up to date. `kubectl get ds` and the pods' events say which.",
    },
];

/// The PodMonitor's job label, `<namespace>/<name>`, as the Prometheus operator sets it.
fn job(options: &ManifestOptions) -> String {
    format!("{}/{NAME}", options.namespace)
}

/// The PromQL of `alert` for this install.
pub fn expr(alert: &Alert, options: &ManifestOptions) -> String {
    alert
        .expr
        .replace("JOB", &format!("job=\"{}\"", job(options)))
        .replace(
            "DAEMONSET",
            &format!("namespace=\"{}\", daemonset=\"{NAME}\"", options.namespace),
        )
}

fn object(api_version: &str, kind: &str, options: &ManifestOptions, spec: serde_json::Value) -> Manifest {
    Manifest::Monitoring(Box::new(DynamicObject {
        types: Some(TypeMeta {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
        }),
        metadata: ObjectMeta {
            name: Some(NAME.to_owned()),
            namespace: Some(options.namespace.clone()),
            labels: Some(labels()),
            ..ObjectMeta::default()
        },
        data: json!({ "spec": spec }),
    }))
}

/// The PodMonitor and the PrometheusRule.
pub(crate) fn objects(options: &ManifestOptions) -> Vec<Manifest> {
    let pod_monitor = object(
        "monitoring.coreos.com/v1",
        "PodMonitor",
        options,
        json!({
            "selector": {"matchLabels": labels()},
            "podMetricsEndpoints": [{
                "port": PORT_NAME,
                "path": "/metrics",
                "interval": "30s",
                "relabelings": [{
                    "sourceLabels": ["__meta_kubernetes_pod_node_name"],
                    "targetLabel": "node",
                }],
            }],
        }),
    );
    let rules: Vec<serde_json::Value> = ALERTS
        .iter()
        .map(|a| {
            json!({
                "alert": a.name,
                "expr": expr(a, options),
                "for": a.for_,
                "labels": {"severity": a.severity},
                "annotations": {
                    "summary": a.summary,
                    "description": a.description,
                    "runbook_url": a.runbook_url(),
                },
            })
        })
        .collect();
    let rule = object(
        "monitoring.coreos.com/v1",
        "PrometheusRule",
        options,
        json!({"groups": [{"name": NAME, "rules": rules}]}),
    );
    vec![pod_monitor, rule]
}
