//! Crash consistency of the checkpoint store (issue 18's fault campaign): a child process
//! runs what the agent does to the disk — write two checkpoints, activate one, save the
//! journal, rewrite it with new data, refresh and deactivate it, remove the other, save
//! the journal again — and is aborted at the N-th pass of a failpoint (`fsops.fsync`,
//! `fsops.rename`, `fsops.dirsync`, `fsops.unlink`), for every N until a run completes. After
//! each crash the store is opened again, as the restarted agent opens it, and checked:
//!
//! - it reads without error, and nothing of ours is quarantined (no corrupt file);
//! - no temporary file is left, and every file in the kubelet's manifests dir is a whole
//!   manifest;
//! - every active checkpoint has its inactive copy and every data directory it mounts;
//! - nothing is lost: a checkpoint written before the crashed step is there, whole (its
//!   manifest and every file its volumes name), at the old or the new version; the one
//!   being removed is there whole, partly removed in the store's order (active first,
//!   inactive last), or gone;
//! - the journal is absent, or reads as one of the states saved.
//!
//! The child is this test binary itself (the `crash_child` test, ignored unless asked
//! for), with the failpoint set through `CKPT_FAILPOINTS`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use ckpt_core::{ApiObjects, Checkpoint, PersistentState, PodId, SanitizeOptions, Timestamp, sanitize};
use ckpt_store::{Layout, Store};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use serde_json::json;

const NS: &str = "kube-system";
const POINTS: [&str; 4] = ["fsops.fsync", "fsops.rename", "fsops.dirsync", "fsops.unlink"];
/// A script that passes a point more often than this never ends: a bug in the test.
const MAX_PASSES: u64 = 200;
const CHILD_ROOT: &str = "CRASH_CHILD_ROOT";

fn layout(root: &Path) -> Layout {
    Layout::new(root.join("ck"), root.join("manifests"))
}

fn id(name: &str) -> PodId {
    PodId::new(NS, name)
}

/// A host-network parent with a Secret and a ConfigMap volume, sanitized at `version`
/// (the data and the image change with it).
fn checkpoint(root: &Path, name: &str, version: &str) -> Checkpoint {
    let mut pod = json!({
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"),
                     "annotations": {"checkpointer.alpha.coreos.com/checkpoint": "true"}},
        "spec": {"hostNetwork": true,
                 "containers": [{"name": "main", "image": format!("registry.example/{name}:{version}"),
                                 "volumeMounts": [{"name": "certs", "mountPath": "/certs"},
                                                  {"name": "config", "mountPath": "/config"}]}],
                 "volumes": [{"name": "certs", "secret": {"secretName": format!("{name}-certs")}},
                             {"name": "config", "configMap": {"name": format!("{name}-config")}}]}
    });
    // Its files belong to the user it runs as: root, unless the test runs as another user,
    // who cannot give files to root.
    if !running_as_root() {
        let (uid, gid) = (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        );
        pod["spec"]["securityContext"] = json!({"runAsUser": uid, "fsGroup": gid});
    }
    let pod: Pod = serde_json::from_value(pod).expect("a pod");
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-certs"), "namespace": NS},
        "stringData": {},
        "data": {"tls.key": base64(&format!("key {version}")), "tls.crt": base64(&format!("crt {version}"))}
    }))
    .expect("a secret");
    let config_map: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-config"), "namespace": NS},
        "data": {"config.yaml": format!("version: {version}\n")}
    }))
    .expect("a configmap");
    let objects = ApiObjects {
        secrets: BTreeMap::from([(format!("{name}-certs"), secret.into())]),
        config_maps: BTreeMap::from([(format!("{name}-config"), config_map.into())]),
    };
    let options = SanitizeOptions {
        checkpoint_dir: layout(root).checkpoint_dir().display().to_string(),
        checkpointed_at: Timestamp(0),
    };
    sanitize(&pod, &objects, &options).expect("sanitizes").checkpoint
}

fn base64(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn journal(absent: &[&str]) -> PersistentState {
    PersistentState {
        absent_since: absent.iter().map(|n| (id(n), Timestamp(1_000))).collect(),
        ..PersistentState::default()
    }
}

/// The steps, in order; the child writes each one's number to `progress` before it.
fn script(root: &Path, progress: &Path) {
    let store = Store::open(layout(root)).expect("open");
    let step = |n: u32| std::fs::write(progress, n.to_string()).expect("progress");
    step(1);
    store
        .write_inactive(&checkpoint(root, "a", "v1"))
        .expect("write a v1");
    step(2);
    store
        .write_inactive(&checkpoint(root, "b", "v1"))
        .expect("write b");
    step(3);
    store.activate(&id("a")).expect("activate a");
    step(4);
    store.write_journal(&journal(&["b"])).expect("journal 1");
    step(5);
    store
        .write_inactive(&checkpoint(root, "a", "v2"))
        .expect("write a v2");
    step(6);
    store.activate(&id("a")).expect("refresh a");
    step(7);
    store.deactivate(&id("a")).expect("deactivate a");
    step(8);
    store.remove(&id("b")).expect("remove b");
    step(9);
    store.write_journal(&journal(&[])).expect("journal 2");
    step(10);
}

/// The child: runs the script in the directory its parent names. Ignored unless the
/// parent runs it (with `--ignored --exact`).
#[test]
#[ignore = "the crash test's child process; run by every_crash_leaves_a_consistent_store"]
fn crash_child() {
    let root = PathBuf::from(std::env::var(CHILD_ROOT).expect("run by the crash test"));
    script(&root, &root.join("progress"));
}

#[test]
fn every_crash_leaves_a_consistent_store() {
    let exe = std::env::current_exe().expect("the test binary");
    let mut crashes = 0;
    for point in POINTS {
        for pass in 1..=MAX_PASSES {
            let dir = tempfile::tempdir().expect("temp dir");
            let output = Command::new(&exe)
                .args(["crash_child", "--exact", "--ignored", "--test-threads=1"])
                .env(CHILD_ROOT, dir.path())
                .env("CKPT_FAILPOINTS", format!("{point}=abort@{pass}"))
                .output()
                .expect("run the child");
            let step: u32 = std::fs::read_to_string(dir.path().join("progress"))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0);
            let what = format!("crash at pass {pass} of {point}, in step {step}");
            if output.status.success() {
                assert_eq!(step, 10, "{what}: the child ended early");
                check(dir.path(), 10, &what);
                assert!(pass > 1, "{point} is never passed");
                break;
            }
            assert!(
                std::os::unix::process::ExitStatusExt::signal(&output.status) == Some(6),
                "{what}: the child failed without the crash: {}",
                String::from_utf8_lossy(&output.stdout)
            );
            crashes += 1;
            check(dir.path(), step, &what);
            assert!(pass < MAX_PASSES, "{point}: more than {MAX_PASSES} passes");
        }
    }
    eprintln!("{crashes} crashes, every one left a consistent store");
    assert!(crashes >= 20, "only {crashes} crash points");
}

/// The invariants after a crash in `step` (10: no crash).
fn check(root: &Path, step: u32, what: &str) {
    let store = Store::open(layout(root)).unwrap_or_else(|e| panic!("{what}: open: {e}"));
    let all = store
        .read_all()
        .unwrap_or_else(|e| panic!("{what}: read_all: {e}"));
    let quarantine = layout(root).quarantine_dir();
    assert!(
        files_under(&quarantine).is_empty(),
        "{what}: quarantined {:?}",
        files_under(&quarantine)
    );
    // A tree being removed goes entry by entry: a crash may leave a volume's `..data`
    // link of `b`, removed in step 8, without its target (not a temporary file).
    let removing_b = |f: &str| step == 8 && f.contains(&format!("/{NS}/b/")) && f.ends_with("/..data");
    let leftovers: Vec<String> = files_under(root)
        .into_iter()
        .filter(|f| f.rsplit('/').next().is_some_and(|n| n.starts_with('.')) && !removing_b(f))
        .collect();
    assert!(
        leftovers.is_empty(),
        "{what}: temporary files left: {leftovers:?}"
    );
    for file in files_under(&root.join("manifests")) {
        let bytes = std::fs::read(root.join("manifests").join(&file)).expect("read");
        assert!(
            serde_json::from_slice::<Pod>(&bytes).is_ok(),
            "{what}: {file} in the manifests dir is not a whole manifest"
        );
    }

    // Which versions of `a` may be there; whether `a` and `b` must be (a step that was
    // under way may or may not have published its checkpoint).
    let a_versions: &[&str] = match step {
        0 => &[],
        1..=4 => &["v1"],
        5 => &["v1", "v2"],
        _ => &["v2"],
    };
    let must_be = [("a", step >= 2), ("b", (3..=7).contains(&step))];
    for (name, required) in must_be {
        if required {
            assert!(all.contains_key(&id(name)), "{what}: {name} lost");
        }
    }
    if !(2..=8).contains(&step) {
        assert!(!all.contains_key(&id("b")), "{what}: b is there in step {step}");
    }
    for (pod, stored) in &all {
        let inactive = layout(root).inactive_manifest_path(pod);
        let active = layout(root).active_manifest_path(pod);
        let being_removed = pod.name.as_ref() == "b" && step == 8;
        if active.exists() {
            assert!(
                inactive.exists(),
                "{what}: {pod} active without its inactive copy"
            );
        }
        if being_removed && !active.exists() {
            // Partly removed, in order: the data may be gone already.
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&inactive) else {
            assert!(being_removed, "{what}: {pod} has no inactive copy: {stored:?}");
            continue;
        };
        let manifest: Pod = serde_json::from_str(&text).expect("checked by read_all");
        let image = manifest.spec.as_ref().expect("spec").containers[0]
            .image
            .clone()
            .unwrap_or_default();
        if pod.name.as_ref() == "a" {
            assert!(
                a_versions.iter().any(|v| image.ends_with(v)),
                "{what}: a at {image}, expected one of {a_versions:?}"
            );
        }
        for volume in manifest.spec.as_ref().expect("spec").volumes.iter().flatten() {
            let Some(host_path) = &volume.host_path else {
                continue;
            };
            let dir = Path::new(&host_path.path);
            assert!(
                dir.is_dir(),
                "{what}: {pod} mounts {} which is missing",
                dir.display()
            );
            assert!(
                !files_under(dir).is_empty(),
                "{what}: {pod} mounts {} which is empty",
                dir.display()
            );
        }
    }

    match store.read_journal::<PersistentState>() {
        Ok(None) => assert!(step <= 4, "{what}: the journal saved in step 4 is gone"),
        Ok(Some(state)) => assert!(
            [journal(&["b"]), journal(&[])].contains(&state),
            "{what}: the journal reads {state:?}"
        ),
        Err(e) => panic!("{what}: the journal is unreadable: {e}"),
    }
}

/// Every file under `dir`, relative to it, sorted.
fn files_under(dir: &Path) -> Vec<String> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, root, out);
            } else {
                out.push(path.strip_prefix(root).unwrap_or(&path).display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Whether this process runs as root (the owner of `/proc/self`).
fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}
