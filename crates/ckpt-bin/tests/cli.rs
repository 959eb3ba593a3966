//! The command-line contract (ARCHITECTURE.md, Command-line contract), driven through the real binary: exit codes,
//! usage errors that name the flag, `strategies`, `inspect` and `drain` on real files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ckpt_core::{ApiObjects, PodId, SanitizeOptions, Timestamp, sanitize};
use ckpt_store::{Layout, Store};
use k8s_openapi::api::core::v1::Pod;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pod-checkpointer"));
    c.env_remove("NODE_NAME")
        .env_remove("POD_NAME")
        .env_remove("POD_NAMESPACE")
        .env_remove("KUBECONFIG")
        .env("RUST_LOG", "warn");
    c
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("runs")
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

fn disk_args(dir: &Path) -> Vec<String> {
    vec![
        "--checkpoint-dir".into(),
        dir.join("ck").display().to_string(),
        "--manifests-dir".into(),
        dir.join("manifests").display().to_string(),
        "--lock-file".into(),
        dir.join("lock").display().to_string(),
    ]
}

/// `inspect -o json` on the checkpoint dirs under `dir`.
fn inspect_json(dir: &Path) -> serde_json::Value {
    let mut args = vec!["inspect".to_owned(), "-o".into(), "json".into()];
    args.extend(disk_args(dir));
    let out = bin().args(&args).output().expect("runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("json")
}

/// `(pod, state)` of every checkpoint in an `inspect -o json` report, in its order.
fn states_of(report: &serde_json::Value) -> Vec<(String, String)> {
    report["checkpoints"]
        .as_array()
        .expect("list")
        .iter()
        .map(|c| {
            (
                c["pod"].as_str().unwrap_or("").to_owned(),
                c["state"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// Writes a real checkpoint (sanitized from a pod) and activates it; returns its spec hash.
fn seed_checkpoint(dir: &Path, name: &str, active: bool) -> String {
    let store = Store::open(Layout::new(dir.join("ck"), dir.join("manifests"))).expect("store");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "kube-system", "uid": format!("uid-{name}"),
                     "annotations": {"checkpointer.alpha.coreos.com/checkpoint": "true"}},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.9"}]}
    }))
    .expect("pod");
    let options = SanitizeOptions {
        checkpoint_dir: dir.join("ck").display().to_string(),
        checkpointed_at: Timestamp::now(),
    };
    let checkpoint = sanitize(&pod, &ApiObjects::default(), &options)
        .expect("sanitizes")
        .checkpoint;
    store.write_inactive(&checkpoint).expect("written");
    if active {
        store.activate(&checkpoint.parent).expect("activated");
    }
    checkpoint.spec_hash
}

#[test]
fn strategies_lists_the_registry() {
    let out = run(&["strategies"]);
    assert!(out.status.success());
    let names: Vec<String> = text(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    assert_eq!(names, ["grace-period", "immediate", "owner-reference"]);
}

#[test]
fn usage_errors_exit_2_and_name_the_flag() {
    let ids = [
        "run",
        "--node-name",
        "n",
        "--pod-name",
        "p",
        "--pod-namespace",
        "kube-system",
    ];
    let check = |extra: &[&str], expected: &str| {
        let mut args = ids.to_vec();
        args.extend(extra);
        let out = run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains(expected),
            "{args:?}: {:?} should contain {expected:?}",
            text(&out.stderr)
        );
    };
    check(
        &["--gc-strategy", "nope"],
        "--gc-strategy: unknown GC strategy \"nope\" (known: grace-period, immediate, owner-reference)",
    );
    check(
        &["--checkpoint-grace-period", "soon"],
        "--checkpoint-grace-period",
    );
    check(
        &["--kubeconfig", "/nonexistent/kubeconfig"],
        "--kubeconfig: cannot read /nonexistent/kubeconfig",
    );
    check(
        &["--config", "/nonexistent.yaml"],
        "--config: cannot read /nonexistent.yaml",
    );
    check(&["--bogus-flag"], "--bogus-flag");
    let out = run(&["run", "--pod-name", "p", "--pod-namespace", "ns"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--node-name is required"),
        "{}",
        text(&out.stderr)
    );
    // Environment variables stand in for the flags.
    let out = bin()
        .args(["run", "--gc-strategy", "nope"])
        .env("NODE_NAME", "n")
        .env("POD_NAME", "p")
        .env("POD_NAMESPACE", "ns")
        .output()
        .expect("runs");
    assert!(
        text(&out.stderr).contains("--gc-strategy"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn bad_config_files_are_usage_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (yaml, expected) in [
        ("gc-strategy: [x", "--config"),
        ("gc-stratgy: immediate\n", "--config"),
        (
            "node-name: n\npod-name: p\npod-namespace: ns\ngc-strategy: immediate\ngc:\n  immediate:\n    nope: 1\n",
            "--gc-strategy",
        ),
        (
            "node-name: n\npod-name: p\npod-namespace: ns\ngc:\n  grace-priod: {}\n",
            "--gc-strategy",
        ),
    ] {
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, yaml).expect("write");
        let out = run(&["run", "--config", &path.display().to_string()]);
        assert_eq!(out.status.code(), Some(2), "{yaml:?}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains(expected),
            "{yaml:?}: {}",
            text(&out.stderr)
        );
    }
}

/// `check-config` answers as `run` would read the file, without running anything: 0 for
/// the deployed config, 2 naming the problem otherwise (a strategy this binary does not
/// have lists the ones it does: what a custom binary with more strategies is for).
#[test]
fn check_config_reads_a_file_or_stdin_as_run_would() {
    let dir = tempfile::tempdir().expect("tempdir");
    let deployed = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/pod-checkpointer.yaml"
    ))
    .expect("deploy manifests");
    let config: String = deployed
        .split("config.yaml: |\n")
        .nth(1)
        .expect("the agent's config in the manifests")
        .lines()
        .take_while(|l| l.starts_with("    "))
        .map(|l| format!("{}\n", &l[4..]))
        .collect();
    assert!(config.contains("gc-strategy:"), "{config}");
    for (yaml, code, needle) in [
        (config.as_str(), 0, ""),
        ("", 0, ""),
        (
            "gc-strategy: keep-forever\n",
            2,
            "(known: grace-period, immediate, owner-reference)",
        ),
        ("gc-stratgy: immediate\n", 2, "--config"),
        ("checkpoint-grace-period: soon\n", 2, "--checkpoint-grace-period"),
        ("log-level: \"ckpt_watch=[\"\n", 2, "--log-level"),
        // The agent's own namespace left out: it would never checkpoint itself (issue 36).
        (
            "pod-namespace: kube-system\nnamespaces: [cni]\n",
            2,
            "--namespaces: the agent's own namespace kube-system is not among",
        ),
        (
            "pod-namespace: kube-system\nnamespaces: [cni, kube-system]\n",
            0,
            "warning: --config: config: no apiVersion and kind",
        ),
        // Its namespace comes from the pod at run time: unknown here.
        (
            "namespaces: [cni]\n",
            0,
            "warning: --config: config: no apiVersion and kind",
        ),
        // Versioned: no warning; another version or kind, or one without the other, refused.
        (
            "apiVersion: pod-checkpointer.github.io/v1alpha1\nkind: AgentConfig\nnamespaces: [cni]\n",
            0,
            "",
        ),
        (
            "apiVersion: pod-checkpointer.github.io/v2\nkind: AgentConfig\n",
            2,
            "apiVersion \"pod-checkpointer.github.io/v2\" is not one this agent reads",
        ),
        (
            "apiVersion: pod-checkpointer.github.io/v1alpha1\nkind: Config\n",
            2,
            "kind \"Config\" is not one this agent reads",
        ),
        ("kind: AgentConfig\n", 2, "apiVersion and kind go together"),
    ] {
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, yaml).expect("write");
        let from_file = run(&["check-config", &path.display().to_string()]);
        let mut child = bin()
            .args(["check-config", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("runs");
        std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), yaml.as_bytes()).expect("stdin");
        let from_stdin = child.wait_with_output().expect("runs");
        for out in [from_file, from_stdin] {
            assert_eq!(out.status.code(), Some(code), "{yaml:?}: {}", text(&out.stderr));
            assert!(
                text(&out.stderr).contains(needle),
                "{yaml:?}: {}",
                text(&out.stderr)
            );
            if needle.is_empty() {
                assert!(
                    !text(&out.stderr).contains("warning"),
                    "{yaml:?}: {}",
                    text(&out.stderr)
                );
            }
        }
    }
    let missing = run(&[
        "check-config",
        &dir.path().join("nope.yaml").display().to_string(),
    ]);
    assert_eq!(missing.status.code(), Some(2), "{}", text(&missing.stderr));
}

#[test]
fn inspect_reports_states_and_what_runs_after_a_reboot() {
    let dir = tempfile::tempdir().expect("tempdir");
    seed_checkpoint(dir.path(), "kube-apiserver-abc", true);
    seed_checkpoint(dir.path(), "kube-scheduler-abc", false);
    // Someone else's static pod is not ours and not reported.
    std::fs::write(
        dir.path().join("manifests/etcd.yaml"),
        "apiVersion: v1\nkind: Pod\n",
    )
    .expect("write");
    let report = inspect_json(dir.path());
    let states = states_of(&report);
    assert_eq!(
        states,
        [
            ("kube-system/kube-apiserver-abc".into(), "active".into()),
            ("kube-system/kube-scheduler-abc".into(), "inactive".into())
        ]
    );
    assert_eq!(
        report["runs_after_reboot"],
        serde_json::json!(["kube-system/kube-apiserver-abc"])
    );
    assert_eq!(report["static_copy_credentials"], serde_json::Value::Null);
    let mut args = vec!["inspect".to_owned()];
    args.extend(disk_args(dir.path()));
    let table = text(&bin().args(&args).output().expect("runs").stdout);
    assert!(
        table.contains("After a reboot right now the kubelet would start: kube-system/kube-apiserver-abc"),
        "{table}"
    );
    assert!(
        table.contains("Static copy's API credentials: none kept"),
        "{table}"
    );
}

/// `inspect` says whether the content on disk is the one its parent proved (the journal's
/// known-good record), and since when the parent has a proof.
#[test]
fn inspect_reports_which_checkpoints_are_known_good() {
    use ckpt_core::SpecSince;

    let dir = tempfile::tempdir().expect("tempdir");
    let proven = seed_checkpoint(dir.path(), "kube-apiserver-abc", false);
    seed_checkpoint(dir.path(), "kube-scheduler-abc", false);
    seed_checkpoint(dir.path(), "kube-proxy-abc", false);
    let since = Timestamp(1_764_892_800_000);
    let record = |hash: &str| SpecSince {
        spec_hash: hash.to_owned(),
        since,
    };
    let state = ckpt_core::PersistentState {
        known_good: [
            (PodId::new("kube-system", "kube-apiserver-abc"), record(&proven)),
            // An earlier content was proven; the one on disk now is not.
            (
                PodId::new("kube-system", "kube-scheduler-abc"),
                record("an-older-hash"),
            ),
        ]
        .into(),
        ..Default::default()
    };
    let store = Store::open(Layout::new(dir.path().join("ck"), dir.path().join("manifests"))).expect("store");
    store.write_journal(&state).expect("journal");

    let report = inspect_json(dir.path());
    let known: Vec<(String, bool, Option<String>)> = (report["checkpoints"].as_array().expect("list").iter())
        .map(|c| {
            (
                c["pod"].as_str().unwrap_or("").to_owned(),
                c["known_good"].as_bool().expect("known_good"),
                c["known_good_since"].as_str().map(str::to_owned),
            )
        })
        .collect();
    let at = Some(since.to_rfc3339());
    assert_eq!(
        known,
        [
            ("kube-system/kube-apiserver-abc".to_owned(), true, at.clone()),
            ("kube-system/kube-proxy-abc".to_owned(), false, None),
            ("kube-system/kube-scheduler-abc".to_owned(), false, at),
        ]
    );
    let mut args = vec!["inspect".to_owned()];
    args.extend(disk_args(dir.path()));
    let table = text(&bin().args(&args).output().expect("runs").stdout);
    assert!(table.contains("KNOWN-GOOD"), "{table}");
}

/// `inspect` says when self-GC is pending: the journal's clock started by the first read
/// saying the agent's DaemonSet is deleted or descheduled (issue 36), and nothing without it.
#[test]
fn inspect_reports_a_pending_self_gc() {
    let dir = tempfile::tempdir().expect("tempdir");
    seed_checkpoint(dir.path(), "kube-apiserver-abc", false);
    let table = || {
        let mut args = vec!["inspect".to_owned()];
        args.extend(disk_args(dir.path()));
        text(&bin().args(&args).output().expect("runs").stdout)
    };
    assert!(!table().contains("Self-GC pending"), "{}", table());
    assert!(inspect_json(dir.path()).get("self_gc_pending_since").is_none());
    assert!(inspect_json(dir.path()).get("self_gc_deferred").is_none());

    let since = Timestamp(1_764_892_800_000);
    let state = ckpt_core::PersistentState {
        self_gc_since: Some(since),
        self_gc_deferred: vec![PodId::new("kube-system", "kube-apiserver-abc")],
        ..Default::default()
    };
    let store = Store::open(Layout::new(dir.path().join("ck"), dir.path().join("manifests"))).expect("store");
    store.write_journal(&state).expect("journal");
    let table = table();
    assert!(
        table.contains(&format!("Self-GC pending: the agent's DaemonSet was first read as deleted or no longer targeting this node at {}", since.to_rfc3339())),
        "{table}"
    );
    assert_eq!(
        inspect_json(dir.path())["self_gc_pending_since"].as_str(),
        Some(&*since.to_rfc3339())
    );
    // Held back by a checkpoint serving a DaemonSet that still targets the node.
    assert!(
        table.contains("Self-GC held back by: kube-system/kube-apiserver-abc"),
        "{table}"
    );
    assert_eq!(
        inspect_json(dir.path())["self_gc_deferred"],
        serde_json::json!(["kube-system/kube-apiserver-abc"])
    );
}

/// `inspect` says when the known-good and rejected marks are unknown: the journal holds
/// the flag the agent set when it found the journal unusable, or the journal is unusable
/// now (left in place: `inspect` moves nothing).
#[test]
fn inspect_reports_unknown_marks() {
    let dir = tempfile::tempdir().expect("tempdir");
    seed_checkpoint(dir.path(), "kube-apiserver-abc", false);
    let report = inspect_json(dir.path());
    assert!(report.get("revision_marks_unknown").is_none() && report.get("journal_unusable").is_none());

    let state = ckpt_core::PersistentState {
        marks_unknown: true,
        ..Default::default()
    };
    let store = Store::open(Layout::new(dir.path().join("ck"), dir.path().join("manifests"))).expect("store");
    store.write_journal(&state).expect("journal");
    assert_eq!(inspect_json(dir.path())["revision_marks_unknown"], true);

    let journal = store.layout().journal_path();
    std::fs::write(&journal, "{").expect("torn journal");
    let report = inspect_json(dir.path());
    assert_eq!(report["revision_marks_unknown"], true);
    assert!(
        report["journal_unusable"]
            .as_str()
            .is_some_and(|r| r.starts_with("not a state journal")),
        "{report}"
    );
    assert_eq!(std::fs::read_to_string(&journal).expect("left in place"), "{");
}

#[test]
fn inspect_reports_the_static_copys_credentials_and_their_expiry() {
    let dir = tempfile::tempdir().expect("tempdir");
    seed_checkpoint(dir.path(), "kube-apiserver-abc", true);
    // A kept kubeconfig whose token (a JWT; unsigned here) expired at 2001-09-09T01:46:40.000Z.
    let claims = "eyJleHAiOjEwMDAwMDAwMDB9"; // {"exp":1000000000}
    let path = dir.path().join("ck/pod-checkpointer/kubeconfig");
    let token = dir.path().join("ck/pod-checkpointer/token");
    std::fs::create_dir_all(dir.path().join("ck/pod-checkpointer")).expect("dir");
    let kept = format!(
        r#"{{"users":[{{"name":"u","user":{{"tokenFile":"{}"}}}}]}}"#,
        token.display()
    );
    std::fs::write(&path, kept).expect("write");
    std::fs::write(&token, format!("eyJhbGciOiJSUzI1NiJ9.{claims}.sig")).expect("write");
    let mut args = vec!["inspect".to_owned(), "-o".into(), "json".into()];
    args.extend(disk_args(dir.path()));
    let out = bin().args(&args).output().expect("runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let credentials = &report["static_copy_credentials"];
    assert_eq!(credentials["path"], path.display().to_string());
    assert_eq!(credentials["token_expires_at"], "2001-09-09T01:46:40.000Z");
    assert_eq!(credentials["token_expired"], true);
    let mut args = vec!["inspect".to_owned()];
    args.extend(disk_args(dir.path()));
    let table = text(&bin().args(&args).output().expect("runs").stdout);
    assert!(
        table.contains("token EXPIRED at 2001-09-09T01:46:40.000Z"),
        "{table}"
    );
}

/// The probe `cargo xtask image` runs on the release binary (ckpt-e2e's
/// `check_failpoints_compiled_out`), on this test build, which has the failpoints: a
/// `drain` whose every unlink fails with EIO. Here it fails and the data stays; the
/// release binary must drain as if the variable were not set.
#[test]
fn a_test_build_honours_ckpt_failpoints() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("ck/checkpoint-secrets/ns/p/s/k");
    std::fs::create_dir_all(data.parent().unwrap()).unwrap();
    std::fs::write(&data, "v").unwrap();
    let mut args = vec!["drain".to_owned(), "--force".into()];
    args.extend(disk_args(dir.path()));
    let out = bin()
        .args(&args)
        .env("CKPT_FAILPOINTS", "fsops.unlink=error(5)")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(data.exists(), "the failpoint failed the removal");
    let out = bin().args(&args).output().expect("runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!data.exists());
}

#[test]
fn drain_refuses_while_an_agent_holds_the_lock_unless_forced() {
    let dir = tempfile::tempdir().expect("tempdir");
    seed_checkpoint(dir.path(), "kube-apiserver-abc", true);
    let lock = ckpt_lock::LockFile::new(
        dir.path().join("lock"),
        "pod-checkpointer pod=kube-system/pc node=n1",
    );
    let guard = lock.try_acquire().expect("lock").into_guard().expect("free");
    let mut args = vec!["drain".to_owned()];
    args.extend(disk_args(dir.path()));
    let out = bin().args(&args).output().expect("runs");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("holds"), "{}", text(&out.stderr));
    assert!(
        dir.path()
            .join("manifests/kube-system_kube-apiserver-abc.json")
            .exists()
    );
    args.push("--force".into());
    let out = bin().args(&args).output().expect("runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("removed kube-system/kube-apiserver-abc"),
        "{}",
        text(&out.stdout)
    );
    assert!(
        !dir.path()
            .join("manifests/kube-system_kube-apiserver-abc.json")
            .exists()
    );
    assert!(
        !dir.path()
            .join("ck/inactive-manifests/kube-system_kube-apiserver-abc.json")
            .exists()
    );
    drop(guard);
    args.pop();
    let out = bin().args(&args).output().expect("runs");
    assert_eq!(text(&out.stdout), "nothing to remove\n");
}

#[test]
fn drain_dry_run_lists_in_order_and_changes_nothing_even_while_the_lock_is_held() {
    let dir = tempfile::tempdir().expect("tempdir");
    seed_checkpoint(dir.path(), "kube-apiserver-abc", true);
    seed_checkpoint(dir.path(), "pc-self", true);
    seed_checkpoint(dir.path(), "scheduler-xyz", false);
    // The holder is the agent whose own checkpoint is `pc-self`: listed last.
    let lock = ckpt_lock::LockFile::new(
        dir.path().join("lock"),
        "pod-checkpointer pod=kube-system/pc-self node=n1",
    );
    let guard = lock.try_acquire().expect("lock").into_guard().expect("free");
    let files_before = files_under(dir.path());
    let mut args = vec!["drain".to_owned(), "--dry-run".to_owned()];
    args.extend(disk_args(dir.path()));
    let out = bin().args(&args).output().expect("runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "would remove kube-system/kube-apiserver-abc: inactive manifest, active manifest\n\
         would remove kube-system/scheduler-xyz: inactive manifest\n\
         would remove kube-system/pc-self: inactive manifest, active manifest\n"
    );
    assert_eq!(files_under(dir.path()), files_before, "a dry run changes nothing");
    // Released, the lock file's holder record is emptied.
    drop(guard);
    let files_before = files_under(dir.path());
    args.push("--force".into());
    let out = bin().args(&args).output().expect("runs");
    assert_eq!(
        out.status.code(),
        Some(2),
        "--dry-run with --force is a usage error"
    );
    assert_eq!(files_under(dir.path()), files_before);
}

/// Every file under `dir` with its length, sorted.
fn files_under(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("readable").flatten() {
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).expect("stat");
            if meta.is_dir() {
                pending.push(path.clone());
            }
            files.push((path, meta.len()));
        }
    }
    files.sort();
    files
}

/// Scenario B's first step with no credentials at all: the static copy after a reboot has
/// no service-account token and no service environment. It must run offline and start
/// the checkpoints, not crash-loop on a missing kubeconfig.
#[test]
fn without_credentials_the_agent_runs_offline_and_activates() {
    let dir = tempfile::tempdir().expect("tempdir");
    seed_checkpoint(dir.path(), "kube-apiserver-abc", false);
    let mut args: Vec<String> = [
        "run",
        "--node-name",
        "node-1",
        "--pod-name",
        "pc-abc-node-1",
        "--pod-namespace",
        "kube-system",
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend(
        [
            "--runtime-endpoint",
            "",
            "--kubelet-url",
            "http://127.0.0.1:1",
            "--metrics-addr",
            "",
        ]
        .map(str::to_owned),
    );
    args.extend(disk_args(dir.path()));
    let mut child = bin()
        .args(&args)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("starts");
    let active = dir.path().join("manifests/kube-system_kube-apiserver-abc.json");
    let start = std::time::Instant::now();
    while !active.exists() && start.elapsed() < std::time::Duration::from_secs(30) {
        assert!(child.try_wait().expect("wait").is_none(), "the agent exited");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(active.exists(), "the checkpoint was not activated");
}

/// `pod-checkpointer render` writes the checked-in install manifests (installing needs no
/// Rust toolchain), to stdout or a file; an unknown strategy is a usage error naming the
/// registered ones.
#[test]
fn render_writes_the_install_manifests() {
    let checked_in = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/pod-checkpointer.yaml"),
    )
    .expect("deploy/pod-checkpointer.yaml");
    let out = run(&["render"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout) == checked_in,
        "deploy/pod-checkpointer.yaml is out of date: regenerate it with `pod-checkpointer render -o deploy/pod-checkpointer.yaml` (or `cargo xtask render -o deploy`)"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("install.yaml");
    let file_arg = file.display().to_string();
    let out = run(&[
        "render",
        "--gc-strategy",
        "owner-reference",
        "--namespace",
        "checkpointer",
        "--image",
        "registry.example/pc:dev",
        "--runtime-endpoint",
        "",
        "--kubelet-ca",
        "/etc/kubernetes/pki/ca.crt",
        "--api-server",
        "https://10.0.0.1:6443",
        "-o",
        &file_arg,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let yaml = std::fs::read_to_string(&file).expect("written");
    for expected in [
        "gc-strategy: \"owner-reference\"",
        "namespace: checkpointer",
        "image: registry.example/pc:dev",
        "kubelet-ca: \"/etc/kubernetes/pki/ca.crt\"",
        "server: \"https://10.0.0.1:6443\"",
        "name: pod-checkpointer-kubelet",
    ] {
        assert!(yaml.contains(expected), "{expected}: {yaml}");
    }

    let out = run(&["render", "--gc-strategy", "sometimes"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("--gc-strategy: unknown strategy \"sometimes\""),
        "{stderr}"
    );
    for name in ["grace-period", "immediate", "owner-reference"] {
        assert!(stderr.contains(name), "{stderr}");
    }
    let out = run(&["render", "--runtime-endpoint", ""]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--kubelet-ca"),
        "{}",
        text(&out.stderr)
    );
}

/// `pod-checkpointer health` with no agent behind the socket fails (exit 1); without a
/// socket it is a usage error (exit 2).
#[test]
fn health_fails_without_an_agent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("health.sock").display().to_string();
    let out = run(&["health", "--ready", "--health-socket", &socket]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no agent answers"),
        "{}",
        text(&out.stderr)
    );
    let out = run(&["health", "--live"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--health-socket"),
        "{}",
        text(&out.stderr)
    );
    let out = run(&["health", "--health-socket", &socket]);
    assert_eq!(out.status.code(), Some(2), "--ready or --live is required");
}

/// Migrating from bootkube's checkpointer (docs/migration.md, "Migrating from bootkube's
/// checkpointer"), as far as this machine allows without the original's binary: its files
/// as it writes them (`<ns>-<name>.json`, compact client-go JSON, plain 0600 data files) and
/// its lock held by another process with a plain `flock(2)`, as the original holds it.
/// `inspect` reports its checkpoints as ours, `drain --dry-run` lists them, and `drain`
/// waits for the original: it refuses while the lock is held.
#[test]
fn the_originals_checkpoints_and_lock_are_adopted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ck = dir.path().join("ck");
    let manifests = dir.path().join("manifests");
    for d in [ck.join("inactive-manifests"), manifests.clone()] {
        std::fs::create_dir_all(d).expect("dir");
    }
    let secret_dir = ck.join("checkpoint-secrets/kube-system/kube-apiserver-x1/apiserver-certs");
    std::fs::create_dir_all(&secret_dir).expect("dir");
    std::fs::write(secret_dir.join("tls.crt"), "cert").expect("write");
    let original = |name: &str, volume: serde_json::Value| {
        let pod = serde_json::json!({
            "kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": "kube-system", "creationTimestamp": null,
                         "annotations": {"checkpointer.alpha.coreos.com/checkpoint-of": name}},
            "spec": {"containers": [{"name": "c", "image": "quay.io/coreos/hyperkube:v1.20.2",
                                     "resources": {}}],
                     "volumes": [volume], "hostNetwork": true},
            "status": {}
        });
        format!("{}\n", serde_json::to_string(&pod).expect("json"))
    };
    let apiserver = original(
        "kube-apiserver-x1",
        serde_json::json!({"name": "apiserver-certs", "hostPath": {"path": secret_dir.display().to_string()}}),
    );
    let checkpointer = original(
        "pod-checkpointer-x7k2p",
        serde_json::json!({"name": "var-run", "hostPath": {"path": "/var/run"}}),
    );
    std::fs::write(
        ck.join("inactive-manifests/kube-system-kube-apiserver-x1.json"),
        &apiserver,
    )
    .expect("write");
    std::fs::write(
        ck.join("inactive-manifests/kube-system-pod-checkpointer-x7k2p.json"),
        &checkpointer,
    )
    .expect("write");
    std::fs::write(
        manifests.join("kube-system-pod-checkpointer-x7k2p.json"),
        &checkpointer,
    )
    .expect("write");

    let report = inspect_json(dir.path());
    let states = states_of(&report);
    assert_eq!(
        states,
        [
            ("kube-system/kube-apiserver-x1".into(), "inactive".into()),
            ("kube-system/pod-checkpointer-x7k2p".into(), "active".into())
        ],
        "{report}"
    );

    // The original holds its lock (a plain flock on the same file, which it creates 0600)
    // while it runs.
    let lock = dir.path().join("lock");
    std::fs::write(&lock, "").expect("lock file");
    std::fs::set_permissions(&lock, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
    let mut holder = Command::new("flock")
        .arg(&lock)
        .args(["sleep", "30"])
        .spawn()
        .expect("flock(1) from util-linux");
    let held = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        std::fs::read_to_string("/proc/locks").is_ok_and(|locks| {
            let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&lock).expect("lock file"));
            locks.lines().any(|l| l.contains(&format!(":{inode} ")))
        })
    });
    assert!(held, "flock(1) did not take the lock");
    let mut dry_run = vec!["drain".to_owned(), "--dry-run".into()];
    dry_run.extend(disk_args(dir.path()));
    let out = bin().args(&dry_run).output().expect("runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = text(&out.stdout);
    assert!(
        listed.contains("would remove kube-system/kube-apiserver-x1"),
        "{listed}"
    );
    assert!(
        listed.contains("would remove kube-system/pod-checkpointer-x7k2p"),
        "{listed}"
    );
    let mut drain = vec!["drain".to_owned()];
    drain.extend(disk_args(dir.path()));
    let out = bin().args(&drain).output().expect("runs");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("holds"), "{}", text(&out.stderr));
    assert!(manifests.join("kube-system-pod-checkpointer-x7k2p.json").exists());
    let _ = holder.kill();
    let _ = holder.wait();
}

/// Issue 40, a true drop-in: the original's DaemonSet command line (no subcommand, Go's
/// flag syntax, its environment) runs as `run`, each mapping logged; what the original
/// refused exits 2 with Go's words. The kubeconfig named does not exist, so the run stops
/// before it takes the lock or touches a disk (exit 2, naming the flag).
#[test]
fn the_originals_command_line_runs_as_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lock = format!("--lock-file={}", dir.path().join("lock").display());
    let original = |args: &[&str]| {
        bin()
            .args(args)
            .env("NODE_NAME", "node-1")
            .env("POD_NAME", "pod-checkpointer-x7k2p")
            .env("POD_NAMESPACE", "kube-system")
            .output()
            .expect("runs")
    };
    let out = original(&[
        &lock,
        "--kubeconfig=/nonexistent/kubeconfig",
        "--checkpoint-grace-period=5m",
        "--container-runtime-endpoint=/run/containerd/containerd.sock",
        "-logtostderr",
        "-v=4",
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    for said in [
        "started with the original's (bootkube's) command line: running as `run`",
        "-checkpoint-grace-period=5m → --checkpoint-grace-period",
        "-container-runtime-endpoint=/run/containerd/containerd.sock: a bare path is a unix socket",
        "-logtostderr ignored",
        "-v=4 → --log-level debug",
        "-kubeconfig=/nonexistent/kubeconfig → --kubeconfig",
        // Then `run`'s own check of the kubeconfig, as for our own command line.
        "--kubeconfig: cannot read /nonexistent/kubeconfig",
    ] {
        assert!(stderr.contains(said), "{said:?} in:\n{stderr}");
    }
    assert!(
        !dir.path().join("lock").exists(),
        "the lock is taken only after the kubeconfig is read"
    );

    // What Go's flag package refused.
    for (args, said) in [
        (
            &["--no-such-flag"][..],
            "flag provided but not defined: -no-such-flag",
        ),
        (&["-kubeconfig"][..], "flag needs an argument: -kubeconfig"),
        (
            &["-container-runtime-endpoint=tcp://127.0.0.1:1"][..],
            "only support unix socket endpoint",
        ),
    ] {
        let out = original(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            text(&out.stderr).contains(said),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    // The original's required environment, named by our flags.
    let out = bin()
        .args([&lock, "--kubeconfig=/nonexistent/kubeconfig"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--node-name is required"),
        "{}",
        text(&out.stderr)
    );
    // Ours is untouched: no subcommand is still a usage error, help is ours.
    assert_eq!(run(&[]).status.code(), Some(2));
    assert!(text(&run(&["--help"]).stdout).contains("Usage: pod-checkpointer"));
}

/// What bootkube's checkpointer reads at start (it cannot be built here, so its reading is
/// modelled from its code, docs/migration.md): every file of the kubelet's manifests dir
/// and of `inactive-manifests` whose name does not start with `.` (those it deletes),
/// decoded as a pod and kept when it has the `checkpoint-of` annotation, keyed by its
/// content's namespace and name, not by the file name. Returns those ids, and the files of
/// the data dirs it would read for them.
fn what_the_original_reads(dir: &Path) -> (Vec<String>, Vec<PathBuf>) {
    let mut checkpoints = Vec::new();
    for read in [dir.join("manifests"), dir.join("ck/inactive-manifests")] {
        for entry in std::fs::read_dir(&read).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(text) = std::fs::read_to_string(entry.path()) else {
                continue;
            };
            let Ok(pod) = serde_json::from_str::<serde_json::Value>(&text) else {
                continue;
            };
            let annotations = &pod["metadata"]["annotations"];
            if !name.starts_with('.')
                && annotations
                    .get("checkpointer.alpha.coreos.com/checkpoint-of")
                    .is_some()
            {
                checkpoints.push(format!(
                    "{}/{}",
                    pod["metadata"]["namespace"].as_str().unwrap_or_default(),
                    pod["metadata"]["name"].as_str().unwrap_or_default()
                ));
            }
        }
    }
    let data = ["ck/checkpoint-secrets", "ck/checkpoint-configmaps"]
        .iter()
        .map(|d| dir.join(d))
        .filter(|d| d.is_dir())
        .flat_map(|d| files_under(&d))
        // A key's file, as the kubelet's atomic writer leaves it: a link into the
        // `..<time>` directory of its latest write, which the path resolves through.
        .filter(|(path, _)| path.is_file() && !path.to_string_lossy().contains("/.."))
        .map(|(path, _)| path)
        .collect();
    (checkpoints, data)
}

/// Issue 40, the way back (docs/migration.md, "Going back to bootkube's checkpointer"):
/// while this agent runs, its files are the original's layout (its checkpoints are pods with
/// `checkpoint-of` that the original reads, by content; the Secrets a pod mounts under
/// `checkpoint-secrets/<ns>/<pod>/<secret>/<key>`). The guide has the agent remove them
/// before the original starts, as the original names its files `<ns>-<name>.json` and would
/// never remove ours from the kubelet's dir. After step 3's `drain`, the original starts from
/// what it would have created itself: directories, and nothing it reads.
#[test]
fn the_way_back_leaves_what_the_original_starts_from() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(Layout::new(dir.path().join("ck"), dir.path().join("manifests"))).expect("store");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "kube-apiserver-x1", "namespace": "kube-system", "uid": "u1",
                     "annotations": {"checkpointer.alpha.coreos.com/checkpoint": "true"}},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/kube-apiserver:v1.37.2",
                                 "volumeMounts": [{"name": "certs", "mountPath": "/certs"}]}],
                 "volumes": [{"name": "certs", "secret": {"secretName": "apiserver-certs"}}]}
    }))
    .expect("pod");
    let secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "apiserver-certs", "namespace": "kube-system"},
        "data": {"tls.crt": "Y2VydA=="}
    }))
    .expect("secret");
    let objects = ApiObjects {
        secrets: [("apiserver-certs".to_owned(), std::sync::Arc::new(secret))].into(),
        ..ApiObjects::default()
    };
    let options = SanitizeOptions {
        checkpoint_dir: dir.path().join("ck").display().to_string(),
        checkpointed_at: Timestamp::now(),
    };
    let checkpoint = sanitize(&pod, &objects, &options).expect("sanitizes").checkpoint;
    store.write_inactive(&checkpoint).expect("written");
    store.activate(&checkpoint.parent).expect("activated");
    seed_checkpoint(dir.path(), "pod-checkpointer-x7k2p", true);

    let (read, data) = what_the_original_reads(dir.path());
    assert_eq!(
        read,
        [
            "kube-system/kube-apiserver-x1",
            "kube-system/pod-checkpointer-x7k2p",
            "kube-system/kube-apiserver-x1",
            "kube-system/pod-checkpointer-x7k2p"
        ],
        "active, then inactive"
    );
    assert_eq!(
        data,
        [dir.path()
            .join("ck/checkpoint-secrets/kube-system/kube-apiserver-x1/apiserver-certs/tls.crt")]
    );
    assert_eq!(std::fs::read(&data[0]).expect("data"), b"cert");

    let mut drain = vec!["drain".to_owned()];
    drain.extend(disk_args(dir.path()));
    let out = bin().args(&drain).output().expect("runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        what_the_original_reads(dir.path()),
        (Vec::new(), Vec::new()),
        "{}",
        text(&out.stdout)
    );
    // What is left is directories (mount points in the agent's pod), the manifests dir the
    // original lists, and `inactive-manifests`, which it creates 0700 and reuses.
    let left: Vec<_> = files_under(dir.path())
        .into_iter()
        .filter(|(path, _)| !path.is_dir())
        .collect();
    assert_eq!(
        left,
        [(dir.path().join("lock"), 0)],
        "only the emptied lock file is left"
    );
    assert!(dir.path().join("manifests").is_dir());
    let inactive = std::fs::metadata(dir.path().join("ck/inactive-manifests")).expect("inactive-manifests");
    assert!(inactive.is_dir());
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&inactive.permissions()) & 0o777,
        0o700
    );
}
