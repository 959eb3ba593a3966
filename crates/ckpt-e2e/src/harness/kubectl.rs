//! The API server through `kubectl --kubeconfig …` with JSON in and out: what an operator
//! would type, and no Kubernetes client library in xtask. Every call is bounded by
//! `--request-timeout`, so a paused (SIGSTOPped) API server cannot hang a test.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use serde_json::Value;

use crate::command::{run_command, run_command_with_input};

/// kubectl as one identity (one kubeconfig).
#[derive(Clone, Debug)]
pub struct Kubectl {
    kubeconfig: PathBuf,
    cache_dir: PathBuf,
    /// The network namespace kubectl runs in (a LAN's); `None`: this process's.
    netns: Option<PathBuf>,
}

impl Kubectl {
    /// kubectl with `kubeconfig`; its discovery cache goes to `cache_dir` (in the work dir, so
    /// the user's `~/.kube` is never touched).
    pub fn new(kubeconfig: &Path, cache_dir: &Path) -> Kubectl {
        Kubectl {
            kubeconfig: kubeconfig.to_owned(),
            cache_dir: cache_dir.to_owned(),
            netns: None,
        }
    }

    /// This kubectl run in the network namespace `netns` (a LAN's: see
    /// `ControlPlane::netns`), or in this process's for `None`.
    pub fn in_netns(self, netns: Option<PathBuf>) -> Kubectl {
        Kubectl { netns, ..self }
    }

    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// `kubectl ARGS…` with `stdin`; returns stdout, or fails with the command and its stderr.
    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
        let mut command = match &self.netns {
            Some(netns) => crate::command::in_netns(netns, "kubectl"),
            None => Command::new("kubectl"),
        };
        command
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg(format!("--cache-dir={}", self.cache_dir.display()))
            .arg("--request-timeout=10s")
            .args(args);
        match stdin {
            Some(input) => run_command_with_input(&mut command, input),
            None => run_command(&mut command),
        }
    }

    /// `kubectl create -f -`: creates `object` and returns it as stored (with its uid).
    pub fn create(&self, object: &Value) -> anyhow::Result<Value> {
        let out = self.run(&["create", "-f", "-", "-o", "json"], Some(&object.to_string()))?;
        serde_json::from_str(&out).context("kubectl create printed no JSON")
    }

    /// `kubectl apply -f -` of several objects at once (created or updated).
    pub fn apply(&self, objects: &[Value]) -> anyhow::Result<()> {
        let list = serde_json::json!({ "apiVersion": "v1", "kind": "List", "items": objects });
        self.run(&["apply", "-f", "-"], Some(&list.to_string())).map(drop)
    }

    /// The pods of `namespace` that match the label `selector` (e.g. `app=web`).
    pub fn pods(&self, namespace: &str, selector: &str) -> anyhow::Result<Vec<Value>> {
        let out = self.run(
            &["get", "pods", "-n", namespace, "-l", selector, "-o", "json"],
            None,
        )?;
        let list: Value = serde_json::from_str(&out).context("kubectl get pods printed no JSON")?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }

    /// The object, or `None` when it does not exist. `resource` is e.g. `pod`, `daemonset`.
    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> anyhow::Result<Option<Value>> {
        let out = self.run(
            &[
                "get",
                resource,
                name,
                "-n",
                namespace,
                "--ignore-not-found",
                "-o",
                "json",
            ],
            None,
        )?;
        if out.trim().is_empty() {
            return Ok(None);
        }
        serde_json::from_str(&out)
            .map(Some)
            .context("kubectl get printed no JSON")
    }

    /// Deletes at once, as a kubelet confirming a deletion does (grace period 0); a missing
    /// object is fine.
    pub fn delete_now(&self, resource: &str, namespace: &str, name: &str) -> anyhow::Result<()> {
        self.run(
            &[
                "delete",
                resource,
                name,
                "-n",
                namespace,
                "--grace-period=0",
                "--force",
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        )
        .map(drop)
    }
}

/// A pod's `status.phase` (empty when it has none yet).
pub fn pod_phase(pod: &Value) -> &str {
    pod["status"]["phase"].as_str().unwrap_or("")
}

/// Whether a pod is Running with every container running.
pub fn pod_running(pod: &Value) -> bool {
    let statuses = pod["status"]["containerStatuses"].as_array();
    pod_phase(pod) == "Running"
        && statuses.is_some_and(|s| !s.is_empty() && s.iter().all(|c| c["state"]["running"].is_object()))
}

/// An object's `metadata.uid`.
pub fn uid(object: &Value) -> anyhow::Result<String> {
    object["metadata"]["uid"]
        .as_str()
        .map(str::to_owned)
        .context("the object has no metadata.uid")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn running_means_phase_and_every_container() {
        let running = json!({"status": {"phase": "Running", "containerStatuses": [
            {"state": {"running": {"startedAt": "x"}}}]}});
        let exited = json!({"status": {"phase": "Running", "containerStatuses": [
            {"state": {"terminated": {"exitCode": 0}}}]}});
        let failed = json!({"status": {"phase": "Failed"}});
        assert!(pod_running(&running));
        assert!(!pod_running(&exited));
        assert!(!pod_running(&failed));
        assert_eq!(pod_phase(&failed), "Failed");
        assert_eq!(pod_phase(&json!({})), "");
    }
}
