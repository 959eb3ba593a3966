//! Dead credentials never hold a node hostage (ARCHITECTURE.md, Credentials): the static
//! copy holds the lock on the token the DaemonSet copy keeps for it; that token is revoked
//! (its ServiceAccount deleted and created again, as an operator revokes every kept token
//! at once). The real API server answers the static copy 401; after
//! `--unauthorized-handover` it hands the lock to the waiting DaemonSet copy, whose own
//! credentials work, which keeps a fresh token; the static copy, holding the lock again
//! later, runs on it. Nothing is removed or activated throughout. And the kept token is
//! narrow: it cannot mint tokens, neither for itself nor for the DaemonSet's account.

use std::fs;

use ckpt_e2e::harness::kubectl::Kubectl;
use ckpt_e2e::harness::objects::{CHECKPOINTER_SERVICE_ACCOUNT, STATIC_SERVICE_ACCOUNT, service_account};
use ckpt_e2e::wait::{DEFAULT_TIMEOUT, Probe, wait_for};
use serde_json::json;

use crate::suite::Scenario;

pub(crate) fn revoked(ctx: &mut Scenario<'_>) -> anyhow::Result<()> {
    ctx.step("the checkpointer's pod and an annotated parent; C1 (the DaemonSet copy) checkpoints and keeps the static copy's credentials");
    let me = ctx.create_checkpointer_pod()?;
    let parent = ctx.create_parent_with_data("kube-apiserver")?;
    ctx.expect_api_pod_running(&parent.name)?;
    let dirs = ctx.dirs("node")?;
    let c1_config = ctx.agent_config("c1", &me.name, &dirs);
    let mut c1 = ctx.start_agent(&c1_config)?;
    c1.wait_ready()?;
    ctx.expect_checkpoint(&dirs, &parent.name, "inactive")?;
    ctx.expect_checkpoint(&dirs, &me.name, "active")?;
    let kept = dirs.checkpoint_dir.join("pod-checkpointer/kubeconfig");
    let token = dirs.checkpoint_dir.join("pod-checkpointer/token");
    wait_for("the kept credentials", DEFAULT_TIMEOUT, || {
        c1.ensure_running()?;
        Ok(if kept.exists() && token.exists() {
            Probe::Ready(())
        } else {
            Probe::Waiting(format!("no {}", kept.display()))
        })
    })?;

    ctx.step("the kept token is narrow: it reads pods, but mints no token, not even its own");
    let as_static = Kubectl::new(&kept, &ctx.dir.join("kubectl-static-cache"));
    as_static.run(&["get", "pods", "-n", &ctx.ns, "-o", "name"], None)?;
    for account in [STATIC_SERVICE_ACCOUNT, CHECKPOINTER_SERVICE_ACCOUNT] {
        let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}});
        let path = format!("/api/v1/namespaces/{}/serviceaccounts/{account}/token", ctx.ns);
        match as_static.run(&["create", "--raw", &path, "-f", "-"], Some(&request.to_string())) {
            Ok(out) => anyhow::bail!("the static copy's token minted a token for {account}: {out}"),
            Err(e) if format!("{e:#}").contains("forbidden") => {}
            Err(e) => return Err(e.context(format!("minting for {account} failed, but not as forbidden"))),
        }
    }

    ctx.step("C1 stops; C2 (the static copy) runs on the kept credentials and holds the lock");
    let status = c1.stop()?;
    anyhow::ensure!(status.success(), "C1 exited with {status}");
    let mut c2_config = ctx.agent_config("c2-static", &me.static_name, &dirs);
    c2_config.kubeconfig = None;
    c2_config.extra_args = vec!["--unauthorized-handover=5s".into()];
    let mut c2 = ctx.start_agent(&c2_config)?;
    c2.wait_ready()?;
    c2.wait_api_state("synced")?;

    ctx.step("C1 starts again and waits for the lock (standby)");
    let mut c1 = ctx.start_agent(&ctx.agent_config("c1-again", &me.name, &dirs))?;
    c1.wait_standby()?;
    let before = ctx.inspect(&dirs)?;

    ctx.step("revoke every kept token: delete the static copy's ServiceAccount and create it again");
    ctx.suite
        .kubectl
        .delete_now("serviceaccount", &ctx.ns, STATIC_SERVICE_ACCOUNT)?;
    ctx.suite
        .kubectl
        .create(&service_account(&ctx.ns, STATIC_SERVICE_ACCOUNT))?;
    let revoked = fs::read(&token)?;

    ctx.step("C2 sees its credentials rejected (401): unauthorized, not ready");
    c2.wait_api_state("unauthorized")?;

    ctx.step("C2 hands the lock over; C1 takes it and syncs");
    c1.wait_ready()?;
    c1.wait_api_state("synced")?;
    let c2_log = c2.log_text();
    anyhow::ensure!(
        c2_log.contains("handed the lock over"),
        "C2 did not say it handed the lock over"
    );
    c2.wait_standby()?;
    anyhow::ensure!(
        c2.metric("pod_checkpointer_lock_handovers_total")? == Some(1.0),
        "C2 does not count its handover"
    );

    ctx.step("C1 keeps a fresh token for the re-created account");
    wait_for("a fresh kept token", DEFAULT_TIMEOUT, || {
        c1.ensure_running()?;
        Ok(if fs::read(&token)? != revoked {
            Probe::Ready(())
        } else {
            Probe::Waiting("the kept token is still the revoked one".into())
        })
    })?;
    as_static.run(&["get", "pods", "-n", &ctx.ns, "-o", "name"], None)?;

    ctx.step("nothing was removed or activated");
    let after = ctx.inspect(&dirs)?;
    anyhow::ensure!(
        after.summary() == before.summary(),
        "the checkpoints changed:\nbefore {}\nafter  {}",
        before.summary(),
        after.summary()
    );

    ctx.step("C1 stops: C2 takes the lock again and syncs on the fresh token");
    let status = c1.stop()?;
    anyhow::ensure!(status.success(), "C1 exited with {status}");
    c2.wait_ready()?;
    c2.wait_api_state("synced")?;
    ctx.expect_checkpoint(&dirs, &parent.name, "inactive")?;

    ctx.step("SIGTERM: C2 exits 0");
    let status = c2.stop()?;
    anyhow::ensure!(status.success(), "C2 exited with {status}");
    Ok(())
}
