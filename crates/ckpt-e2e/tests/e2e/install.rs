//! Install: what `pod-checkpointer render` writes is accepted by the real API server
//! (server-side dry run into an empty namespace: the server validates and admits every
//! object, and keeps none, so the suite's own RBAC stays as it is), in each variant an
//! operator may choose; the default render (for 1.37) is refused by a 1.20 API server, which
//! is why `deploy` reads the version; and `deploy` refuses a namespace whose Pod Security
//! level would refuse the agent's pods.

use std::io::Write as _;
use std::process::{Command, Stdio};

use crate::suite::Scenario;

pub(crate) fn render_applies_to_the_api_server(ctx: &mut Scenario<'_>) -> anyhow::Result<()> {
    // A namespace of its own: the scenario's namespace already binds the suite's role
    // under the name the install uses (and a RoleBinding's roleRef cannot change).
    let ns = format!("{}-target", ctx.ns);
    ctx.step(&format!("create the empty namespace {ns} to install into"));
    ctx.suite.kubectl.run(&["create", "namespace", &ns], None)?;
    let variants: [(&str, &[&str]); 3] = [
        ("the default (CRI, node-local API server)", &[]),
        (
            "the kubelet API with its CA, another API server",
            &[
                "--runtime-endpoint",
                "",
                "--kubelet-ca",
                "/etc/kubernetes/pki/ca.crt",
                "--api-server",
                "https://10.0.0.1:6443",
                "--gc-strategy",
                "owner-reference",
            ],
        ),
        (
            "the kubelet API unverified, in-cluster API",
            &[
                "--runtime-endpoint",
                "",
                "--kubelet-insecure",
                "--api-server",
                "in-cluster",
            ],
        ),
    ];
    for (what, flags) in variants {
        ctx.step(&format!(
            "render for 1.20, {what}: the API server accepts every object"
        ));
        let yaml = render(ctx, &ns, &["--kubernetes-version", "1.20"], flags)?;
        let out = dry_run(ctx, &yaml)?;
        anyhow::ensure!(out.0, "the API server refused the render ({what}):\n{}", out.1);
        let documents = yaml.matches("\n---\n").count() + 1;
        let accepted = out.1.lines().filter(|l| l.contains("(server dry run)")).count();
        anyhow::ensure!(
            accepted == documents,
            "{accepted} of {documents} objects accepted ({what}):\n{}",
            out.1
        );
        for kind in [
            "serviceaccount/pod-checkpointer-static",
            "daemonset.apps/pod-checkpointer",
            "role.rbac.authorization.k8s.io/pod-checkpointer-token",
        ] {
            anyhow::ensure!(out.1.contains(kind), "no {kind} in:\n{}", out.1);
        }
    }

    let release = ckpt_e2e::e2e_env::Release::from_env()?;
    let yaml = render(ctx, &ns, &[], &[])?;
    if release == ckpt_e2e::e2e_env::Release::V1_20 {
        ctx.step("a default render (for 1.37: maxSurge) is refused by the 1.20 API server");
        let (ok, out) = dry_run(ctx, &yaml)?;
        anyhow::ensure!(
            !ok && out.contains("maxSurge"),
            "expected a refusal naming maxSurge:\n{out}"
        );
    } else {
        ctx.step(&format!(
            "a default render (maxSurge): the {release} API server accepts every object"
        ));
        let (ok, out) = dry_run(ctx, &yaml)?;
        anyhow::ensure!(ok, "the API server refused the default render:\n{out}");
    }
    refused_where_pod_security_enforces_baseline(ctx, release)
}

/// An existing namespace that enforces Pod Security `baseline` (admission GA from 1.25)
/// refuses the agent's pods (host network, hostPath, root), while a DaemonSet there is
/// accepted and would wait for pods forever: `deploy` refuses it before applying anything,
/// saying why and what to do.
fn refused_where_pod_security_enforces_baseline(
    ctx: &mut Scenario<'_>,
    release: ckpt_e2e::e2e_env::Release,
) -> anyhow::Result<()> {
    let ns = format!("{}-baseline", ctx.ns);
    ctx.step(&format!(
        "namespace {ns} enforces Pod Security `baseline`: deploy refuses it, applying nothing"
    ));
    let kubectl = &ctx.suite.kubectl;
    kubectl.run(&["create", "namespace", &ns], None)?;
    kubectl.run(
        &[
            "label",
            "namespace",
            &ns,
            "pod-security.kubernetes.io/enforce=baseline",
        ],
        None,
    )?;
    let result = (|| {
        if release.from_modules() {
            // What the check prevents: the API server refuses a pod like the agent's there.
            let pod = serde_json::json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": { "name": "like-the-agent", "namespace": ns },
                "spec": {
                    "hostNetwork": true,
                    "containers": [{ "name": "agent", "image": "localhost/pod-checkpointer:e2e" }],
                    "volumes": [{ "name": "etc", "hostPath": { "path": "/etc/kubernetes" } }]
                }
            });
            let (ok, out) = dry_run(ctx, &pod.to_string())?;
            anyhow::ensure!(
                !ok && out.contains("violates PodSecurity"),
                "expected Pod Security to refuse a host-network hostPath pod in {ns}:\n{out}"
            );
        }
        let output = Command::new(ckpt_e2e::harness::xtask_binary()?)
            .arg("deploy")
            .arg("--kubeconfig")
            .arg(ctx.suite.kubectl.kubeconfig())
            .args(["--namespace", &ns, "--no-wait"])
            .output()?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        anyhow::ensure!(
            !output.status.success()
                && stderr.contains(r#"enforces the Pod Security level "baseline""#)
                && stderr.contains("nothing was applied"),
            "deploy into {ns} should refuse, naming the level:\n{stderr}"
        );
        let left = ctx.suite.kubectl.run(
            &[
                "get",
                "daemonsets,serviceaccounts,configmaps",
                "-n",
                &ns,
                "-o",
                "name",
            ],
            None,
        )?;
        let ours: Vec<&str> = left.lines().filter(|l| l.contains("pod-checkpointer")).collect();
        anyhow::ensure!(ours.is_empty(), "deploy applied {ours:?} in {ns}");
        Ok(())
    })();
    ctx.suite
        .kubectl
        .run(&["delete", "namespace", &ns, "--wait=false"], None)?;
    result
}

/// `pod-checkpointer render --namespace NS …` from the agent binary under test.
fn render(ctx: &Scenario<'_>, ns: &str, version: &[&str], flags: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(&ctx.suite.agent_bin)
        .args(["render", "--namespace", ns])
        .args(version)
        .args(flags)
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "pod-checkpointer render failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

/// `kubectl apply --dry-run=server -f -` as admin: success and the combined output.
fn dry_run(ctx: &Scenario<'_>, yaml: &str) -> anyhow::Result<(bool, String)> {
    let kubeconfig = ctx.suite.kubectl.kubeconfig().display().to_string();
    let mut child = Command::new("kubectl")
        .args([
            &format!("--kubeconfig={kubeconfig}"),
            "--request-timeout=10s",
            "apply",
            "--dry-run=server",
            "-f",
            "-",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdin"))?
        .write_all(yaml.as_bytes())?;
    let output = child.wait_with_output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok((output.status.success(), text))
}
