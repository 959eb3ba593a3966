//! A self-hosted control plane on the real node (issue 17): kube-apiserver,
//! kube-controller-manager and kube-scheduler running as pods the API manages, what
//! pod-checkpointer exists to bring back after a power cut.
//!
//! The pivot, as bootkube did it, with the plane's host processes as the bootstrap control
//! plane:
//! 1. the control plane's image ([`CONTROL_PLANE_IMAGE`], hyperkube-style) is imported into
//!    the node, and [`objects::control_plane_objects`] applied through the host API server;
//! 2. once the node's kube-apiserver pod serves on `<node>:6443`, the kubelet is pointed at
//!    it (`https://127.0.0.1:6443`, the node's own loopback) and restarted;
//! 3. the host controller-manager and scheduler stop, so their Leases pass to the pods, and
//!    the host API server is killed: from then on the cluster is served by its own pods.
//!
//! The bootstrap API server listens on the veth's host end, in another network namespace
//! than the node's `0.0.0.0:6443`: no port fight. etcd stays a host process (an external
//! etcd, which bootkube supported): the checkpointer never manages etcd, and a process-level
//! power cut would not prove etcd's durability anyway (the page cache survives it).
//!
//! ```no_run
//! # fn demo(plane: &mut ckpt_e2e::e2e_env::ControlPlane, node: &mut ckpt_e2e::e2e_env::RealNode)
//! # -> anyhow::Result<()> {
//! use ckpt_e2e::e2e_env::BinDir;
//! use ckpt_e2e::self_hosted::SelfHosted;
//!
//! let self_hosted = SelfHosted::install(plane, std::slice::from_mut(node), &BinDir::cached()?)?;
//! println!("{}", self_hosted.kubectl().run(&["get", "pods", "-A"], None)?);
//! # Ok(()) }
//! ```

pub mod objects;
pub mod plot;
pub mod timeline;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;

use crate::e2e_env::lan::ETCD_CLIENT_PORT;
use crate::e2e_env::{ApiEndpoint, BinDir, CONTROLLER_MANAGER_USER, ControlPlane, RealNode, SCHEDULER_USER};
use crate::harness::kubectl::{Kubectl, pod_running};
use crate::image::{CONTROL_PLANE_IMAGE, control_plane_image};
use crate::progress::Progress;
use crate::progress::human_duration;
use crate::wait::{Probe, wait_for, waiting_on_error};
use objects::{APISERVER, APISERVER_PORT, CONTROLLER_MANAGER, NAMESPACE, Params, SCHEDULER};

const PROGRESS: Progress = Progress::new("self-hosted");
/// Pods started by real components, a kubelet restart and Lease hand-overs: generous.
const TIMEOUT: Duration = Duration::from_secs(120);
/// The admin's kubeconfig against the (first) node's API server, in the plane's work dir.
const ADMIN_KUBECONFIG: &str = "kubeconfig-self-hosted";

/// The self-hosted control plane after the pivot.
#[derive(Clone)]
pub struct SelfHosted {
    /// The first node's API server as admin.
    api: ApiEndpoint,
    kubectl: Kubectl,
    /// Every node's API server as admin (`https://<node>:6443`), the first node's first.
    apis: Vec<ApiEndpoint>,
}

impl SelfHosted {
    /// Pivots the plane of `nodes` (one real node, or a LAN's) to a self-hosted control
    /// plane (see the module doc). On return the host API server, controller-manager and
    /// scheduler are gone; the nodes' pods serve, each kubelet talks to its own node's API
    /// server, and their pods hold the Leases. On several nodes each API server uses its
    /// node's etcd member and the controllers run two replicas.
    pub fn install(
        plane: &mut ControlPlane,
        nodes: &mut [RealNode],
        bins: &BinDir,
    ) -> anyhow::Result<SelfHosted> {
        let started = Instant::now();
        anyhow::ensure!(!nodes.is_empty(), "no node to pivot to");
        let archive = plane.workdir().join("images").join("kube-control-plane.oci.tar");
        control_plane_image(
            &[
                bins.kube_apiserver(),
                bins.kube_controller_manager(),
                bins.kube_scheduler(),
            ],
            &archive,
        )?;
        for node in nodes.iter() {
            node.import_image(&archive)?;
        }
        // The archive is in the nodes' containerd now; 250 MB need not stay.
        let _ = fs::remove_file(&archive);
        PROGRESS.say(&format!(
            "{CONTROL_PLANE_IMAGE} built and imported into {} node(s) after {}",
            nodes.len(),
            human_duration(started.elapsed())
        ));

        let apis: Vec<ApiEndpoint> = nodes
            .iter()
            .map(|node| ApiEndpoint {
                url: format!("https://{}:{APISERVER_PORT}", node.ip()),
                ..plane.api()
            })
            .collect();
        let host =
            Kubectl::new(&plane.kubeconfig(), &plane.workdir().join("kubectl-cache")).in_netns(plane.netns());
        let self_hosted = SelfHosted {
            kubectl: Kubectl::new(
                &plane.write_kubeconfig(ADMIN_KUBECONFIG, &apis[0].url, "admin")?,
                &plane.workdir().join("kubectl-cache-self-hosted"),
            )
            .in_netns(plane.netns()),
            api: apis[0].clone(),
            apis,
        };
        host.apply(&objects::control_plane_objects(&params(plane, nodes, bins)?))?;
        wait_running(&host, &[APISERVER, CONTROLLER_MANAGER, SCHEDULER])?;
        for api in &self_hosted.apis {
            wait_for(&format!("{} /readyz 200", api.url), TIMEOUT, || {
                Ok(match api.get_within("/readyz", Duration::from_secs(1)) {
                    Ok((200, _)) => Probe::Ready(()),
                    Ok((status, _)) => Probe::Waiting(format!("HTTP {status}")),
                    Err(e) => Probe::Waiting(format!("{e:#}")),
                })
            })?;
        }
        PROGRESS.say(&format!(
            "the self-hosted control plane's pods run and its API servers serve at {} after {}",
            self_hosted
                .apis
                .iter()
                .map(|api| api.url.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            human_duration(started.elapsed())
        ));

        let bootstrap_holders = [CONTROLLER_MANAGER, SCHEDULER]
            .map(|lease| lease_holder(&host, lease).ok().flatten().unwrap_or_default());
        let switched = Instant::now();
        for node in nodes.iter_mut() {
            let kubelet_kubeconfig = plane.write_kubeconfig(
                &format!("kubeconfig-{}-self-hosted", node.name()),
                &format!("https://127.0.0.1:{APISERVER_PORT}"),
                &format!("system:node:{}", node.name()),
            )?;
            node.set_kubeconfig(&kubelet_kubeconfig)?;
            node.restart_kubelet()?;
        }
        plane.stop_controllers()?;
        plane.kill_apiserver()?;
        let pivoted = Instant::now();
        PROGRESS.say("each kubelet talks to its node's API server; the bootstrap plane is stopped");

        let kubectl = &self_hosted.kubectl;
        for node in nodes.iter() {
            let name = node.name();
            wait_for(
                &format!("{name}'s kubelet to renew its Lease through its node's API server"),
                TIMEOUT,
                || {
                    waiting_on_error((|| {
                        let lease = kubectl
                            .get("lease", "kube-node-lease", name)?
                            .context("no Lease of the node")?;
                        let renewed = lease["spec"]["renewTime"].as_str().unwrap_or_default().to_owned();
                        Ok(if renewed_since(&renewed, switched) {
                            Probe::Ready(())
                        } else {
                            Probe::Waiting(format!("renewTime {renewed}"))
                        })
                    })())
                },
            )?;
        }
        for (lease, before) in [CONTROLLER_MANAGER, SCHEDULER].iter().zip(&bootstrap_holders) {
            wait_for(&format!("a pod of {lease} to hold its Lease"), TIMEOUT, || {
                waiting_on_error((|| {
                    let holder = lease_holder(kubectl, lease)?.unwrap_or_default();
                    Ok(if !holder.is_empty() && holder != *before {
                        Probe::Ready(())
                    } else {
                        Probe::Waiting(format!("held by {holder:?} (the bootstrap's was {before:?})"))
                    })
                })())
            })?;
        }
        PROGRESS.say(&format!(
            "pivot done: the nodes' pods hold the Leases {} after the bootstrap plane stopped (total {})",
            human_duration(pivoted.elapsed()),
            human_duration(started.elapsed())
        ));
        Ok(self_hosted)
    }

    /// Every node's API server as admin, the first node's first.
    pub fn apis(&self) -> impl Iterator<Item = &str> {
        self.apis.iter().map(|api| api.url.as_str())
    }

    /// The HTTP status of `GET /readyz` on the API server at `url` (one of [`apis`](Self::apis);
    /// 0 when unreachable within a second).
    pub fn readyz_of(&self, url: &str) -> u16 {
        self.apis
            .iter()
            .find(|api| api.url == url)
            .and_then(|api| api.get_within("/readyz", Duration::from_secs(1)).ok())
            .map_or(0, |(status, _)| status)
    }

    /// kubectl as admin against the node's API server.
    pub fn kubectl(&self) -> &Kubectl {
        &self.kubectl
    }

    /// The admin's kubeconfig against the node's API server.
    pub fn kubeconfig(&self) -> &Path {
        self.kubectl.kubeconfig()
    }

    /// `https://<node>:6443`.
    pub fn url(&self) -> &str {
        &self.api.url
    }

    /// The HTTP status of `GET /readyz` (0 when unreachable within a second).
    pub fn readyz(&self) -> u16 {
        self.get("/readyz", Duration::from_secs(1)).0
    }

    /// `GET path` as admin within `timeout`: the HTTP status (0 when unreachable) and body.
    pub fn get(&self, path: &str, timeout: Duration) -> (u16, String) {
        self.api.get_within(path, timeout).unwrap_or((0, String::new()))
    }
}

/// The objects' parameters from the plane's files: the same PKI and tokens as the bootstrap.
/// One node reaches the plane's etcd; a LAN's nodes each their own member.
fn params(plane: &ControlPlane, nodes: &[RealNode], bins: &BinDir) -> anyhow::Result<Params> {
    let read =
        |path: &Path| fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()));
    let (crt, key) = plane.serving_cert();
    let (etcd_servers, node_ip, replicas) = match (plane.lan(), nodes) {
        (Some(_), _) => (format!("http://127.0.0.1:{ETCD_CLIENT_PORT}"), None, 2),
        (None, [node]) => {
            let network = plane.node_network().context("the plane has no node network")?;
            (
                format!("http://{}:{}", network.host_ip, plane.etcd_port()),
                Some(node.ip()),
                1,
            )
        }
        (None, _) => anyhow::bail!("several nodes need a LAN"),
    };
    Ok(Params {
        ca_crt: read(&plane.ca_cert())?,
        apiserver_crt: read(&crt)?,
        apiserver_key: read(&key)?,
        sa_key: read(&plane.service_account_key())?,
        tokens_csv: read(&plane.tokens_csv())?,
        controller_manager_token: plane.token(CONTROLLER_MANAGER_USER)?,
        scheduler_token: plane.token(SCHEDULER_USER)?,
        etcd_servers,
        node_ip,
        replicas,
        release: bins.release(),
    })
}

/// Waits until a pod of each of `apps` (label `k8s-app`) runs.
fn wait_running(kubectl: &Kubectl, apps: &[&str]) -> anyhow::Result<()> {
    for app in apps {
        wait_for(&format!("a {app} pod running"), TIMEOUT, || {
            waiting_on_error((|| {
                let pods = pods_of(kubectl, app)?;
                Ok(if pods.iter().any(pod_running) {
                    Probe::Ready(())
                } else {
                    Probe::Waiting(format!(
                        "phases {:?}",
                        pods.iter()
                            .map(|p| p["status"]["phase"].as_str().unwrap_or("").to_owned())
                            .collect::<Vec<_>>()
                    ))
                })
            })())
        })?;
    }
    Ok(())
}

/// The pods of one of the control plane's components (label `k8s-app`), mirror pods of
/// their checkpoints included.
pub fn pods_of(kubectl: &Kubectl, app: &str) -> anyhow::Result<Vec<Value>> {
    kubectl.pods(NAMESPACE, &format!("k8s-app={app}"))
}

/// The holder of a component's leader-election Lease in kube-system, if it has one.
pub fn lease_holder(kubectl: &Kubectl, lease: &str) -> anyhow::Result<Option<String>> {
    Ok(kubectl
        .get("lease", NAMESPACE, lease)?
        .and_then(|lease| lease["spec"]["holderIdentity"].as_str().map(str::to_owned)))
}

/// Whether an RFC 3339 time (a Lease's `renewTime`) is after `instant`, a moment of this
/// process's clock, compared on the wall clock: now - renewed < now - instant.
fn renewed_since(rfc3339: &str, instant: Instant) -> bool {
    let ago = instant.elapsed();
    ckpt_core::Timestamp::parse_rfc3339(rfc3339)
        .is_some_and(|renewed| ckpt_core::Timestamp::now().since(renewed) < ago)
}
