//! Two real `pod-checkpointer run` processes on one lock file, as the DaemonSet copy and
//! the static copy run on a node: one active, one on standby (`/readyz` 200 `standby`:
//! a waiting copy must not stall a rollout); each copy's own health socket answers for
//! that copy alone (`pod-checkpointer health`, the pods' exec probes); SIGKILL the
//! active one and the standby takes over; SIGTERM exits 0.
//!
//! No API server is needed: the kubeconfig points at a closed port, which the agent
//! treats as "unreachable" and keeps running.

#[path = "support/http.rs"]
mod http;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `(status code, body)` of a GET, or `None` if nothing answers within 2 s.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    http::get(port, path, Duration::from_secs(2))
}

fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if check() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

struct Agent {
    child: Child,
    port: u16,
    socket: std::path::PathBuf,
}

impl Agent {
    fn start(dir: &Path, pod_name: &str) -> Agent {
        Self::start_on(dir, pod_name, free_port())
    }

    fn start_on(dir: &Path, pod_name: &str, port: u16) -> Agent {
        let log = std::fs::File::create(dir.join(format!("{pod_name}.log"))).expect("log file");
        let socket = dir.join(format!("{pod_name}.sock"));
        let child = Command::new(env!("CARGO_BIN_EXE_pod-checkpointer"))
            .args([
                "run",
                "--node-name",
                "node-1",
                "--pod-name",
                pod_name,
                "--pod-namespace",
                "kube-system",
            ])
            .arg("--kubeconfig")
            .arg(dir.join("kubeconfig"))
            .args(["--runtime-endpoint", "", "--kubelet-url", "http://127.0.0.1:1"])
            .arg("--checkpoint-dir")
            .arg(dir.join("ck"))
            .arg("--manifests-dir")
            .arg(dir.join("manifests"))
            .arg("--lock-file")
            .arg(dir.join("lock"))
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .arg("--health-socket")
            .arg(&socket)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starts");
        Agent { child, port, socket }
    }

    fn readyz(&self) -> Option<(u16, String)> {
        get(self.port, "/readyz")
    }

    /// `pod-checkpointer health --ready|--live` on this copy's socket: success and stdout.
    fn probe(&self, flag: &str) -> (bool, String) {
        let output = Command::new(env!("CARGO_BIN_EXE_pod-checkpointer"))
            .args(["health", flag, "--health-socket"])
            .arg(&self.socket)
            .output()
            .expect("runs");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A kubeconfig whose server is a closed port: the agent counts the API as unreachable.
fn write_unreachable_kubeconfig(dir: &Path) {
    std::fs::write(
        dir.join("kubeconfig"),
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\", insecure-skip-tls-verify: true}}]\n\
         users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n",
    )
    .expect("kubeconfig");
}

#[test]
fn standby_copy_takes_over_when_the_active_one_is_killed() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_unreachable_kubeconfig(dir.path());
    let timeout = Duration::from_secs(30);

    let mut daemonset_copy = Agent::start(dir.path(), "pc-abc");
    wait_for("the first copy to be ready", timeout, || {
        daemonset_copy.readyz() == Some((200, "ok\n".to_owned()))
    });

    let mut static_copy = Agent::start(dir.path(), "pc-abc-node-1");
    wait_for("the second copy to answer", timeout, || {
        static_copy.readyz().is_some()
    });
    assert_eq!(static_copy.readyz(), Some((200, "standby".to_owned())));
    assert_eq!(get(static_copy.port, "/healthz").map(|(s, _)| s), Some(200));
    // Each copy's probe reaches that copy alone.
    assert_eq!(static_copy.probe("--ready"), (true, "standby\n".to_owned()));
    assert_eq!(static_copy.probe("--live"), (true, "standby\n".to_owned()));
    assert_eq!(daemonset_copy.probe("--ready"), (true, "ok\n".to_owned()));
    assert_eq!(daemonset_copy.probe("--live"), (true, "ok\n".to_owned()));
    let metrics = get(static_copy.port, "/metrics").expect("metrics").1;
    assert!(
        metrics.lines().any(|l| l == "pod_checkpointer_lock_held 0"),
        "{metrics}"
    );
    let holder = ckpt_lock::read_holder(dir.path().join("lock"))
        .expect("readable")
        .expect("a holder");
    assert_eq!(holder.pid, daemonset_copy.child.id());

    // SIGKILL: no cleanup at all, the kernel drops the flock.
    daemonset_copy.child.kill().expect("kill");
    daemonset_copy.child.wait().expect("reaped");
    wait_for("the standby copy to take over", timeout, || {
        static_copy.readyz() == Some((200, "ok\n".to_owned()))
    });
    assert_eq!(static_copy.probe("--ready"), (true, "ok\n".to_owned()));
    assert_eq!(
        daemonset_copy.probe("--live"),
        (false, String::new()),
        "no process answers for the killed copy"
    );
    let holder = ckpt_lock::read_holder(dir.path().join("lock"))
        .expect("readable")
        .expect("a holder");
    assert_eq!(holder.pid, static_copy.child.id());

    // SIGTERM: finish, release the lock, exit 0.
    let status = Command::new("kill")
        .args(["-TERM", &static_copy.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let start = Instant::now();
    let exit = loop {
        if let Some(exit) = static_copy.child.try_wait().expect("wait") {
            break exit;
        }
        assert!(start.elapsed() < timeout, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(exit.code(), Some(0));
    let lock = ckpt_lock::LockFile::new(dir.path().join("lock"), "test");
    assert!(
        lock.try_acquire().expect("lock").into_guard().is_some(),
        "the lock was released"
    );
}

/// The DaemonSet copy and the static copy share the host network and one config: the
/// second must not exit because the first holds the health port; it serves once the
/// port is free.
#[test]
fn a_taken_health_port_is_retried_not_fatal() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_unreachable_kubeconfig(dir.path());
    let blocker = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = blocker.local_addr().expect("addr").port();
    let mut agent = Agent::start_on(dir.path(), "pc-abc", port);
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        agent.child.try_wait().expect("wait").is_none(),
        "the agent exited on a taken port"
    );
    drop(blocker);
    wait_for(
        "the agent to serve once the port is free",
        Duration::from_secs(30),
        || agent.readyz().is_some_and(|(s, _)| s == 200),
    );
}
