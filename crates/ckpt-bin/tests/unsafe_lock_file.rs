//! A lock file another user owns makes the binary exit 1 (a runtime failure: the flags
//! are fine, the host is not) with a message that names the file and the owner, instead
//! of waiting forever on whoever holds it. Needs root to give the file to uid 65534.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::process::Command;

fn running_as_root() -> bool {
    fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

#[test]
fn a_lock_file_owned_by_another_user_is_refused_with_exit_1() {
    if !running_as_root() {
        eprintln!("skipped: giving the lock file to another user needs root");
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let lock = tmp.path().join("run/pod-checkpointer.lock");
    fs::create_dir_all(lock.parent().expect("parent")).expect("dir");
    fs::write(&lock, "").expect("lock file");
    std::os::unix::fs::chown(&lock, Some(65534), Some(65534)).expect("chown");
    let dir = |name: &str| tmp.path().join(name).display().to_string();
    let disk = [
        "--checkpoint-dir".to_owned(),
        dir("ck"),
        "--manifests-dir".to_owned(),
        dir("manifests"),
        "--lock-file".to_owned(),
        lock.display().to_string(),
    ];
    let run = [
        "run",
        "--node-name",
        "node-1",
        "--pod-name",
        "pod-checkpointer-x",
        "--pod-namespace",
        "kube-system",
        "--metrics-addr",
        "",
        "--runtime-endpoint",
        "",
    ];
    for args in [&["drain"][..], &run[..]] {
        let output = Command::new(env!("CARGO_BIN_EXE_pod-checkpointer"))
            .args(args)
            .args(&disk)
            .env_remove("NODE_NAME")
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .env_remove("KUBECONFIG")
            .env("RUST_LOG", "warn")
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        let expected = format!(
            "refusing lock file {}: it is owned by uid 65534, not by this process (uid 0)",
            lock.display()
        );
        assert!(stderr.contains(&expected), "{args:?}: {stderr}");
    }
    assert!(
        !tmp.path().join("manifests").exists(),
        "nothing was touched before the lock"
    );
}
