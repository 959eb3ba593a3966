//! RBAC: the agent runs as the least-privilege identity `pod-checkpointer` in every scenario;
//! here one permission (reading Secrets) is missing. That must show up as a clear error line
//! in the log, not as a crash, and the agent must recover once the permission is granted.

use ckpt_e2e::harness::objects::{AGENT_USER, role_binding};
use ckpt_e2e::wait::{DEFAULT_TIMEOUT, Probe, wait_for};

use crate::suite::{AGENT_ROLE, AGENT_ROLE_WITHOUT_SECRETS, Scenario};

pub(crate) fn missing_permission(ctx: &mut Scenario<'_>) -> anyhow::Result<()> {
    ctx.step("bind the agent's role without `secrets` in this namespace");
    ctx.suite.kubectl.run(
        &["delete", "rolebinding", "pod-checkpointer", "-n", &ctx.ns],
        None,
    )?;
    ctx.suite.kubectl.apply(&[role_binding(
        &ctx.ns,
        "pod-checkpointer",
        AGENT_ROLE_WITHOUT_SECRETS,
        AGENT_USER,
    )])?;

    ctx.step("create the checkpointer's pod, a parent mounting a Secret and a parent without volumes");
    let me = ctx.create_checkpointer_pod()?;
    let with_secret = ctx.create_parent_with_data("kube-apiserver")?;
    let plain = ctx.create_plain_parent("kube-scheduler")?;
    ctx.expect_api_pod_running(&with_secret.name)?;

    ctx.step("start the agent: a clear error about the forbidden Secrets, no crash");
    let dirs = ctx.dirs("node")?;
    let config = ctx.agent_config("agent", &me.name, &dirs);
    let mut agent = ctx.start_agent(&config)?;
    let (line, _) = wait_for(
        "a WARN/ERROR log line saying that reading secrets is forbidden",
        DEFAULT_TIMEOUT,
        || {
            agent.ensure_running()?;
            let log = agent.log_text();
            Ok(match log.lines().find(|l| is_forbidden_secrets_error(l)) {
                Some(line) => Probe::Ready(line.to_owned()),
                None => Probe::Waiting(format!("last line: {}", log.lines().last().unwrap_or(""))),
            })
        },
    )?;
    eprintln!("    the agent logged: {line}");
    agent.ensure_running()?;
    let (health, _) = agent.http_get("/healthz")?;
    anyhow::ensure!(health == 200, "/healthz answered {health}");

    ctx.step("what needs no Secret is still checkpointed; the parent with a Secret is not");
    ctx.expect_checkpoint(&dirs, &plain.name, "inactive")?;
    ctx.expect_checkpoint(&dirs, &me.name, "active")?;
    let inspect = ctx.inspect(&dirs)?;
    anyhow::ensure!(
        inspect.get(&ctx.id(&with_secret.name)).is_none(),
        "without access to its Secret, {} must not be checkpointed: {}",
        with_secret.name,
        inspect.summary()
    );

    ctx.step("grant the full role: the agent recovers without a restart");
    ctx.suite.kubectl.run(
        &["delete", "rolebinding", "pod-checkpointer", "-n", &ctx.ns],
        None,
    )?;
    ctx.suite
        .kubectl
        .apply(&[role_binding(&ctx.ns, "pod-checkpointer", AGENT_ROLE, AGENT_USER)])?;
    ctx.expect_checkpoint_where(&dirs, &with_secret.name, "state inactive and 3 data files", |c| {
        c.state == "inactive" && c.data_files == 3
    })?;

    ctx.step("SIGTERM: the agent exits 0");
    let status = agent.stop()?;
    anyhow::ensure!(status.success(), "the agent exited with {status}");
    Ok(())
}

/// A warning or error line of the agent's own (not a library's debug dump) that names the
/// resource and says it is forbidden.
fn is_forbidden_secrets_error(line: &str) -> bool {
    let lower = line.to_lowercase();
    let own = line.contains(" ckpt_") || line.contains(" pod_checkpointer");
    own && (line.contains(" WARN ") || line.contains(" ERROR "))
        && lower.contains("secret")
        && (lower.contains("forbidden") || lower.contains("403"))
}
