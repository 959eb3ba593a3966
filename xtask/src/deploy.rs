//! `cargo xtask deploy`: installs or updates pod-checkpointer in a cluster. The flags are
//! checked with the agent's own config parser before anything is sent; the manifests are
//! rendered for the cluster's Kubernetes version, applied with server-side apply (one
//! field manager, so re-running it is a no-op), and then the DaemonSet rollout is followed
//! until every node runs the new agent, or the timeout.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};

use ckpt_e2e::progress::Progress;

use ckpt_render::{KubernetesVersion, Manifest, ManifestArgs, ManifestOptions, NAME, render};

/// The field manager of every apply, so a second deploy owns (and can drop) what the first set.
pub(crate) const FIELD_MANAGER: &str = "pod-checkpointer-xtask";

/// The DaemonSet controller's label with the template generation a pod was made from.
const TEMPLATE_GENERATION_LABEL: &str = "pod-template-generation";

const POLL_INTERVAL: Duration = Duration::from_secs(1);

const PROGRESS: Progress = Progress::new("deploy");

/// Install or update pod-checkpointer with server-side apply and wait for the rollout.
#[derive(clap::Args)]
pub(crate) struct Deploy {
    #[command(flatten)]
    manifest: ManifestArgs,
    #[command(flatten)]
    agent: crate::render::AgentBinaryArg,
    /// Kubeconfig of the cluster [default: $KUBECONFIG, ~/.kube/config, else in-cluster]
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// Have the API server validate every object without persisting any
    #[arg(long)]
    dry_run: bool,
    /// How long to wait for the DaemonSet rollout, e.g. 90s, 5m
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_timeout)]
    timeout: Duration,
    /// Return once everything is applied, without waiting for the rollout
    #[arg(long)]
    no_wait: bool,
}

/// How applying one object went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Applied {
    Created,
    Configured,
    Unchanged,
    /// A dry run of an object in a namespace the same dry run "created": the server
    /// cannot check it, as the namespace does not exist.
    SkippedNewNamespace,
}

impl Applied {
    fn describe(self, dry_run: bool) -> &'static str {
        match (self, dry_run) {
            (Applied::Created, false) => "created",
            (Applied::Created, true) => "would be created",
            (Applied::Configured, false) => "configured",
            (Applied::Configured, true) => "would be configured",
            (Applied::Unchanged, _) => "unchanged",
            (Applied::SkippedNewNamespace, _) => "not checked (its namespace does not exist yet)",
        }
    }
}

impl Deploy {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        // Before connecting: an unknown strategy or a config the agent would refuse sends
        // nothing.
        self.manifest
            .options_for(KubernetesVersion::NEWEST, self.agent.checks().as_ref())?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        runtime.block_on(self.deploy())
    }

    async fn deploy(&self) -> anyhow::Result<()> {
        let client = client(self.kubeconfig.as_deref()).await?;
        let version = match self.manifest.kubernetes_version {
            Some(version) => version,
            None => cluster_version(&client).await?,
        };
        let options = self.manifest.options_for(version, self.agent.checks().as_ref())?;
        PROGRESS.say(&format!(
            "manifests for Kubernetes {version}: DaemonSet updates with {}, kubelet API as {}",
            if options.rolls_with_surge() {
                "maxSurge 1"
            } else {
                "maxUnavailable 1"
            },
            if options.kubelet == ckpt_render::KubeletTrust::NotUsed {
                "not used (the CRI is on)"
            } else if version.kubelet_authorizes_nodes_pods() {
                "nodes/pods"
            } else {
                "nodes/proxy"
            },
        ));
        let objects = render(&options);
        // Before anything is applied: a PodMonitor the cluster cannot take would fail
        // the deploy half-way, after the DaemonSet.
        for object in objects.iter().filter(|o| matches!(o, Manifest::Monitoring(_))) {
            serves(&client, object).await?;
        }
        // Before anything is applied: Pod Security admission would refuse every pod of the
        // DaemonSet in a namespace that enforces more than `privileged`, and the rollout
        // would wait out its timeout with no pod to show for it.
        let existing = Api::<Namespace>::all(client.clone())
            .get_opt(&options.namespace)
            .await
            .with_context(|| format!("cannot read namespace {}", options.namespace))?;
        if let Some(refusal) =
            existing.and_then(|ns| pod_security_refusal(&options.namespace, &ns.metadata.labels?))
        {
            bail!(refusal);
        }
        let mut new_namespaces = BTreeSet::new();
        for object in &objects {
            let applied = if self.dry_run && object.namespace().is_some_and(|ns| new_namespaces.contains(ns))
            {
                Applied::SkippedNewNamespace
            } else {
                apply(&client, object, self.dry_run).await?
            };
            if let (Manifest::Namespace(_), Applied::Created) = (object, applied) {
                new_namespaces.insert(object.name().to_owned());
            }
            PROGRESS.say(&format!(
                "{}: {}",
                object.describe(),
                applied.describe(self.dry_run)
            ));
        }
        if self.dry_run {
            PROGRESS.say(&format!(
                "dry run: the API server accepted {} object(s); nothing was persisted",
                objects.len()
            ));
            return Ok(());
        }
        if self.no_wait {
            return Ok(());
        }
        wait_for_rollout(&client, &options, self.timeout).await
    }
}

/// Pod Security admission's label on a namespace: the level whose pods it refuses.
const POD_SECURITY_ENFORCE: &str = "pod-security.kubernetes.io/enforce";

/// Why an existing namespace labelled `labels` refuses the agent's pods (host network,
/// hostPath volumes, root): it enforces a Pod Security level other than `privileged`.
/// Deploy does not relabel it: that is the cluster owner's call.
fn pod_security_refusal(namespace: &str, labels: &BTreeMap<String, String>) -> Option<String> {
    let level = labels.get(POD_SECURITY_ENFORCE)?;
    (level != "privileged").then(|| {
        format!(
            "namespace {namespace} enforces the Pod Security level {level:?} ({POD_SECURITY_ENFORCE}), which \
             refuses the agent's pods (host network, hostPath volumes, root): label it privileged \
             (kubectl label namespace {namespace} {POD_SECURITY_ENFORCE}=privileged --overwrite) or install \
             into another namespace (--namespace); nothing was applied"
        )
    })
}

/// A client from `--kubeconfig`, else kube's usual inference.
pub(crate) async fn client(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("--kubeconfig: cannot read {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("--kubeconfig: {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no cluster configured: pass --kubeconfig or set KUBECONFIG")?,
    };
    kube::Client::try_from(config).context("cannot create the API client")
}

/// The oldest of the API server and the nodes' kubelets.
async fn cluster_version(client: &kube::Client) -> anyhow::Result<KubernetesVersion> {
    let info = client
        .apiserver_version()
        .await
        .context("cannot read the API server's version")?;
    let server = KubernetesVersion::from_version_info(&info.major, &info.minor)?;
    let kubelets: Vec<KubernetesVersion> = match Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(nodes) => nodes
            .items
            .iter()
            .filter_map(|node| node.status.as_ref()?.node_info.as_ref())
            .filter_map(|info| info.kubelet_version.parse().ok())
            .collect(),
        Err(e) => {
            PROGRESS.say(&format!(
                "cannot list nodes ({e}); assuming kubelets as new as the API server (or pass --kubernetes-version)"
            ));
            Vec::new()
        }
    };
    let oldest_kubelet = kubelets.iter().min().copied();
    PROGRESS.say(&format!(
        "API server {server}, {}",
        match oldest_kubelet {
            Some(kubelet) => format!("{} node(s), oldest kubelet {kubelet}", kubelets.len()),
            None => "no kubelet versions known".to_owned(),
        }
    ));
    Ok(oldest_kubelet.map_or(server, |kubelet| kubelet.min(server)))
}

/// Fails unless the API server serves `object`'s kind (a custom resource's CRD).
async fn serves(client: &kube::Client, object: &Manifest) -> anyhow::Result<()> {
    let resource = object.api_resource();
    let missing = || {
        anyhow::anyhow!(
            "the cluster does not serve {} ({}): install the Prometheus operator's CRDs, or deploy without --prometheus",
            resource.kind,
            resource.api_version
        )
    };
    match client.list_api_group_resources(&resource.api_version).await {
        Ok(list) if list.resources.iter().any(|r| r.name == resource.plural) => Ok(()),
        Ok(_) => Err(missing()),
        Err(kube::Error::Api(e)) if e.code == 404 => Err(missing()),
        Err(e) => {
            Err(anyhow::Error::new(e)
                .context(format!("cannot list the API server's {}", resource.api_version)))
        }
    }
}

/// Server-side apply of one object; compares resourceVersions to say what changed.
async fn apply(client: &kube::Client, object: &Manifest, dry_run: bool) -> anyhow::Result<Applied> {
    let resource = object.api_resource();
    let api: Api<DynamicObject> = match object.namespace() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let name = object.name();
    let before = api
        .get_opt(name)
        .await
        .with_context(|| format!("cannot read {}", object.describe()))?;
    let mut params = PatchParams::apply(FIELD_MANAGER).force();
    params.dry_run = dry_run;
    let after = api
        .patch(name, &params, &Patch::Apply(object))
        .await
        .with_context(|| format!("the API server refused {}", object.describe()))?;
    Ok(match before {
        None => Applied::Created,
        Some(before) if before.metadata.resource_version == after.metadata.resource_version => {
            Applied::Unchanged
        }
        Some(_) => Applied::Configured,
    })
}

/// Where a DaemonSet rollout stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Rollout {
    /// Every scheduled pod runs the current template and is ready.
    pub(crate) done: bool,
    /// One line for the progress output.
    pub(crate) summary: String,
    /// Nodes whose pod runs the current template and is ready.
    pub(crate) ready_nodes: BTreeSet<String>,
}

/// The rollout of `daemonset` from its status and its pods, as `kubectl rollout status`
/// judges it: the controller has observed the current generation, and every node it
/// schedules to runs an updated, ready (and available) pod.
pub(crate) fn rollout(daemonset: &DaemonSet, pods: &[Pod]) -> Rollout {
    let generation = daemonset.metadata.generation.unwrap_or(0);
    let ready_nodes = pods
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .filter(|pod| {
            let labels = pod.metadata.labels.as_ref();
            labels.and_then(|l| l.get(TEMPLATE_GENERATION_LABEL)) == Some(&generation.to_string())
        })
        .filter(|pod| is_ready(pod))
        .filter_map(|pod| pod.spec.as_ref()?.node_name.clone())
        .collect();
    let status = daemonset.status.as_ref();
    let observed = status.and_then(|s| s.observed_generation).unwrap_or(0);
    let Some(status) = status.filter(|_| observed >= generation && generation > 0) else {
        return Rollout {
            done: false,
            summary: format!("waiting for the DaemonSet controller to observe generation {generation}"),
            ready_nodes,
        };
    };
    let desired = status.desired_number_scheduled;
    if desired == 0 {
        return Rollout {
            done: true,
            summary: "no node matches: the DaemonSet runs on control-plane nodes only (labels \
                      node-role.kubernetes.io/control-plane or .../master)"
                .to_owned(),
            ready_nodes,
        };
    }
    let updated = status.updated_number_scheduled.unwrap_or(0);
    let ready = status.number_ready;
    let available = status.number_available.unwrap_or(0);
    Rollout {
        done: updated >= desired && ready >= desired && available >= desired,
        summary: format!(
            "{updated}/{desired} node(s) updated, {ready}/{desired} ready, {available}/{desired} available"
        ),
        ready_nodes,
    }
}

fn is_ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|conditions| {
        conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// Follows the rollout: a line when the summary changes, one per node that comes up.
async fn wait_for_rollout(
    client: &kube::Client,
    options: &ManifestOptions,
    timeout: Duration,
) -> anyhow::Result<()> {
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), &options.namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &options.namespace);
    let selector = ListParams::default().labels(&format!("app.kubernetes.io/name={NAME}"));
    let started = Instant::now();
    let mut last_summary = String::new();
    let mut announced = BTreeSet::new();
    loop {
        let daemonset = daemonsets.get(NAME).await.context("cannot read the DaemonSet")?;
        let pod_list = pods
            .list(&selector)
            .await
            .context("cannot list the agent's pods")?;
        let rollout = rollout(&daemonset, &pod_list.items);
        for node in rollout.ready_nodes.difference(&announced) {
            PROGRESS.say(&format!("node {node}: the new agent is ready"));
        }
        announced.extend(rollout.ready_nodes.iter().cloned());
        if rollout.summary != last_summary {
            PROGRESS.say(&format!("rollout: {}", rollout.summary));
            last_summary = rollout.summary.clone();
        }
        if rollout.done {
            PROGRESS.say(&format!("rollout complete in {:.0?}", started.elapsed()));
            return Ok(());
        }
        if started.elapsed() >= timeout {
            bail!(
                "the DaemonSet rollout did not finish within {timeout:?}: {} (see `kubectl -n {} describe daemonset {NAME}`)",
                rollout.summary,
                options.namespace
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// `90s`, `5m`, `1h`, or plain seconds.
fn parse_timeout(text: &str) -> Result<Duration, String> {
    let invalid = || format!("invalid duration {text:?} (use e.g. 90s, 5m, 1h)");
    let text = text.trim();
    let (digits, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let value: u64 = digits.parse().map_err(|_| invalid())?;
    let seconds = match unit {
        "" | "s" => Some(value),
        "m" => value.checked_mul(60),
        "h" => value.checked_mul(3600),
        _ => None,
    };
    seconds.map(Duration::from_secs).ok_or_else(invalid)
}

#[cfg(test)]
mod tests;
