//! `cargo xtask demo [--self-hosted]`: the README's "run it" command. Without a flag, the
//! agent's life cycle narrated on a hollow node (`ckpt_e2e::demo`). With `--self-hosted`,
//! the reason the agent exists: a self-hosted control plane on the real node through one
//! power cut, each step timed. That is the end-to-end suite's
//! `real_node_self_hosted_power_cut` scenario cut down to one plain cut (`E2E_DEMO=1`), so
//! what the demo shows is exactly what CI tests. With `--self-hosted --nodes 3`, the same
//! on three real nodes with an etcd member each, all cut at once: the suite's
//! `three_nodes_self_hosted_full_power_cut` scenario, narrated.

use ckpt_e2e::demo::Demo as HollowDemo;

use crate::e2e::{Mode, run_suite_on};

/// The suite's scenario the self-hosted demo runs.
const SELF_HOSTED_SCENARIO: &str = "real_node_self_hosted_power_cut";
/// … and on three nodes.
const THREE_NODES_SCENARIO: &str = "three_nodes_self_hosted_full_power_cut";

/// A narrated run of the agent on a local control plane.
#[derive(clap::Args)]
// The hollow demo's arguments are flattened in: one argument group for both.
#[group(skip)]
pub(crate) struct Demo {
    /// Instead, a self-hosted kube-apiserver, controller-manager and scheduler on a real
    /// node (kubelet, containerd, runc; needs root) through one power cut, timed from the
    /// cut to the API back (~5 min once the control plane is built).
    #[arg(long, conflicts_with = "grace_period")]
    self_hosted: bool,
    /// With `--self-hosted`: on 1 real node, or on 3 (a LAN of three real nodes, an etcd
    /// member on each, all three cut at once; ~3 min once built).
    #[arg(long, default_value = "1", requires = "self_hosted", value_parser = ["1", "3"])]
    nodes: String,
    #[command(flatten)]
    hollow: HollowDemo,
}

impl Demo {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        if self.self_hosted && self.nodes == "3" {
            let say = ckpt_e2e::progress::Progress::new("demo");
            say.say(
                "a self-hosted control plane on three nodes through a full power cut: a LAN of three real nodes \
                 (kubelet, containerd, runc and an etcd member each, in namespaces of their own) and a bootstrap \
                 control plane start; kube-apiserver (a DaemonSet: one per node, each on its node's etcd member), \
                 kube-controller-manager and kube-scheduler (Deployments of two) take over, and the bootstrap stops; \
                 pod-checkpointer is deployed on the three nodes; then all three lose power at once, and the way back \
                 is timed",
            );
            say.say("the first run builds the control plane's binaries (~8.5 min on 2 cores); later runs take ~3 min");
            run_suite_on(
                &[THREE_NODES_SCENARIO.to_owned()],
                false,
                Mode::Demo,
                self.hollow.kubernetes(),
            )
        } else if self.self_hosted {
            let say = ckpt_e2e::progress::Progress::new("demo");
            say.say(
                "a self-hosted control plane through a power cut: etcd, a bootstrap control plane and a real node \
                 (kubelet, containerd and runc in a network namespace of their own) start; kube-apiserver (a DaemonSet), \
                 kube-controller-manager and kube-scheduler (Deployments) are applied, take over, and the bootstrap plane \
                 stops; pod-checkpointer is deployed as an operator would (`cargo xtask deploy`); then every process of \
                 the node is SIGKILLed, its disk kept, and the way back is timed",
            );
            say.say("the first run builds the control plane's binaries (~8.5 min on 2 cores); later runs take ~5 min");
            run_suite_on(
                &[SELF_HOSTED_SCENARIO.to_owned()],
                false,
                Mode::Demo,
                self.hollow.kubernetes(),
            )
        } else {
            self.hollow.run()
        }
    }
}
