//! What every parser of outside input in ckpt-core keeps, whatever it is given: no panic,
//! the same answer twice, and its own invariants. Shared by the bounded property run in
//! CI (`tests/outside_input.rs`) and the coverage-guided fuzz targets (`fuzz/`), so both
//! check exactly the same things.

use std::collections::BTreeSet;
use std::path::{Component, Path};

use ckpt_core::{
    ApiObjects, ControllerOwner, KubeletVersion, LockIdentity, SanitizeOptions, Timestamp, admit,
    manifest_bytes, references_api_objects, sanitize,
};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};

/// Where the checkpoints of these checks live.
pub(crate) const CHECKPOINT_DIR: &str = "/etc/kubernetes/checkpoint";

/// The Secret `certs` and ConfigMap `config` the pods may reference (others are missing).
pub(crate) fn api_objects() -> ApiObjects {
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "certs", "namespace": "kube-system" },
        "data": { "tls.crt": "Y2VydA==", "tls.key": "a2V5", "..data": "eA==", "a/b": "eA==" }
    }))
    .expect("a Secret");
    let config: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "config", "namespace": "kube-system" },
        "data": { "etcd-servers": "https://127.0.0.1:2379", "1BAD": "x", "LEVEL": "2" },
        "binaryData": { "blob": "AAE=" }
    }))
    .expect("a ConfigMap");
    let mut objects = ApiObjects::default();
    objects.secrets.insert("certs".into(), secret.into());
    objects.config_maps.insert("config".into(), config.into());
    objects
}

/// `sanitize` on any pod: deterministic; a checkpoint it makes references no API object,
/// keeps its data inside the checkpoint dir (every volume it turned into a hostPath, every
/// data file a plain relative path), and `admit` answers the same twice about it.
pub(crate) fn check_sanitize(pod: &Pod, objects: &ApiObjects) {
    let options = SanitizeOptions {
        checkpoint_dir: CHECKPOINT_DIR.into(),
        checkpointed_at: Timestamp(1_764_892_800_000),
    };
    let first = sanitize(pod, objects, &options);
    let second = sanitize(pod, objects, &options);
    assert_eq!(first, second, "sanitize is not deterministic");
    let Ok(sanitized) = first else { return };
    let checkpoint = &sanitized.checkpoint;
    assert_eq!(
        manifest_bytes(&checkpoint.manifest),
        second
            .map(|s| manifest_bytes(&s.checkpoint.manifest))
            .unwrap_or_default()
    );
    let refs = references_api_objects(&checkpoint.manifest);
    assert!(refs.is_empty(), "the checkpoint references API objects: {refs:?}");

    // The parent's own hostPath volumes stay as they are; every other one is ours.
    let parents_host_paths: BTreeSet<&str> = (pod.spec.iter())
        .flat_map(|s| s.volumes.iter().flatten())
        .filter(|v| v.host_path.is_some())
        .map(|v| v.name.as_str())
        .collect();
    for volume in (checkpoint.manifest.spec.iter()).flat_map(|s| s.volumes.iter().flatten()) {
        let Some(host_path) = &volume.host_path else {
            continue;
        };
        if parents_host_paths.contains(volume.name.as_str()) {
            continue;
        }
        assert!(
            is_inside(&host_path.path, CHECKPOINT_DIR),
            "volume {} points outside the checkpoint dir: {}",
            volume.name,
            host_path.path
        );
    }
    for dir in &checkpoint.dirs {
        let path = Path::new(CHECKPOINT_DIR).join(dir.dir.relative_path());
        assert!(
            is_inside(&path.to_string_lossy(), CHECKPOINT_DIR),
            "data dir outside the checkpoint dir: {}",
            path.display()
        );
        for file in &dir.files {
            let relative = Path::new(&file.path);
            assert!(
                !file.path.is_empty() && relative.components().all(|c| matches!(c, Component::Normal(_))),
                "data file path {:?} is not a plain relative path",
                file.path
            );
        }
    }
    check_admit(&checkpoint.manifest);
}

/// `admit` on any pod and kubelet version: no panic, the same answer twice.
pub(crate) fn check_admit(pod: &Pod) {
    for kubelet in [
        None,
        Some(KubeletVersion::new(1, 20)),
        Some(KubeletVersion::new(1, 34)),
    ] {
        let node = "node-1";
        assert_eq!(
            admit(pod, node, kubelet),
            admit(pod, node, kubelet),
            "admit is not deterministic"
        );
    }
}

/// Every string parser: no panic, and what parses prints back to itself.
pub(crate) fn check_strings(text: &str) {
    if let Some(t) = Timestamp::parse_rfc3339(text) {
        assert_eq!(Timestamp::parse_rfc3339(&t.to_rfc3339()), Some(t), "{text:?}");
    }
    if let Some(owner) = ControllerOwner::from_annotation(text) {
        assert_eq!(owner.to_annotation(), text);
    }
    if let Some(holder) = LockIdentity::parse(text) {
        assert_eq!(LockIdentity::parse(&holder.to_string()), Some(holder), "{text:?}");
    }
    if let Ok(version) = text.parse::<KubeletVersion>() {
        assert_eq!(
            version.to_string().parse::<KubeletVersion>(),
            Ok(version),
            "{text:?}"
        );
    }
}

/// Whether `path` is below `dir`: absolute, no `.` or `..` element, starting with `dir/`.
fn is_inside(path: &str, dir: &str) -> bool {
    let path = Path::new(path);
    path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && path.starts_with(dir)
        && path != Path::new(dir)
}
