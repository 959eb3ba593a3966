use serde_json::{Value, json};

use super::*;

/// A valid static pod: what sanitization makes of a host-network API server.
fn base() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "kube-apiserver-x7k2p",
            "namespace": "kube-system",
            "labels": { "k8s-app": "kube-apiserver", "tier": "control-plane" },
            "annotations": { "checkpointer.alpha.coreos.com/checkpoint-of": "kube-apiserver-x7k2p" },
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Pod", "name": "kube-apiserver-x7k2p",
                "uid": "0b1c", "controller": true
            }]
        },
        "spec": {
            "hostNetwork": true,
            "containers": [{
                "name": "kube-apiserver",
                "image": "localhost/kube-control-plane:v1.20.2",
                "env": [{ "name": "ETCD_SERVERS", "value": "https://10.213.0.1:2379" }],
                "ports": [{ "name": "https", "containerPort": 6443 }],
                "livenessProbe": { "httpGet": { "path": "/livez", "port": 6443, "scheme": "HTTPS" } },
                "volumeMounts": [{ "name": "certs", "mountPath": "/etc/kubernetes/secrets", "readOnly": true }]
            }],
            "volumes": [{
                "name": "certs",
                "hostPath": { "path": "/etc/kubernetes/checkpoint-secrets/kube-system/kube-apiserver-x7k2p/certs" }
            }],
            "restartPolicy": "Always"
        }
    })
}

/// `base()` with `edit` applied.
fn pod(edit: impl FnOnce(&mut Value)) -> Pod {
    let mut value = base();
    edit(&mut value);
    serde_json::from_value(value).expect("a Pod")
}

/// Admits `pod` on node `node-1` with `kubelet`; `expected` lists the fields refused.
fn check(pod: Pod, kubelet: Option<KubeletVersion>, expected: &[&str]) {
    let fields: Vec<String> = match admit(&pod, "node-1", kubelet) {
        Ok(()) => Vec::new(),
        Err(found) => {
            for f in &found {
                assert!(!f.reason.is_empty(), "{f:?} has a reason");
            }
            found.into_iter().map(|f| f.field).collect()
        }
    };
    assert_eq!(fields, expected, "kubelet {kubelet:?}");
}

const V1_20: Option<KubeletVersion> = Some(KubeletVersion::new(1, 20));
const V1_33: Option<KubeletVersion> = Some(KubeletVersion::new(1, 33));
const V1_34: Option<KubeletVersion> = Some(KubeletVersion::new(1, 34));
const V1_35: Option<KubeletVersion> = Some(KubeletVersion::new(1, 35));

#[test]
fn a_sanitized_api_server_is_admitted_by_every_kubelet() {
    for kubelet in [V1_20, V1_33, V1_34, None] {
        check(pod(|_| {}), kubelet, &[]);
    }
}

#[test]
fn names() {
    // The kubelet appends "-node-1": 246 characters and more no longer fit in 253.
    check(
        pod(|p| p["metadata"]["name"] = json!("a".repeat(246))),
        V1_20,
        &[],
    );
    check(
        pod(|p| p["metadata"]["name"] = json!("a".repeat(247))),
        V1_20,
        &["metadata.name"],
    );
    check(
        pod(|p| p["metadata"]["name"] = json!("")),
        V1_20,
        &["metadata.name"],
    );
    check(
        pod(|p| p["metadata"]["namespace"] = json!("Kube_System")),
        V1_20,
        &["metadata.namespace"],
    );
    // No namespace: the kubelet's `default`.
    check(pod(|p| p["metadata"]["namespace"] = Value::Null), V1_20, &[]);
    check(
        pod(|p| p["spec"]["containers"][0]["name"] = json!("Kube_APIServer")),
        V1_20,
        &["spec.containers[0].name"],
    );
    check(
        pod(|p| p["spec"]["volumes"][0]["name"] = json!("certs.d")),
        V1_20,
        &[
            "spec.volumes[0].name",
            // The mount no longer finds it.
            "spec.containers[0].volumeMounts[0].name",
        ],
    );
}

#[test]
fn unique_names() {
    let second = json!({ "name": "kube-apiserver", "image": "busybox" });
    check(
        pod(|p| p["spec"]["initContainers"] = json!([second])),
        V1_20,
        &["spec.initContainers[0].name"],
    );
    check(
        pod(|p| {
            let volume = p["spec"]["volumes"][0].clone();
            p["spec"]["volumes"].as_array_mut().unwrap().push(volume);
        }),
        V1_20,
        &["spec.volumes[1].name"],
    );
}

#[test]
fn volume_references_and_sources() {
    check(
        pod(|p| p["spec"]["volumes"] = json!([])),
        V1_20,
        &["spec.containers[0].volumeMounts[0].name"],
    );
    check(
        pod(|p| p["spec"]["volumes"][0]["emptyDir"] = json!({})),
        V1_20,
        &["spec.volumes[0]"],
    );
    // No source: defaulted to an emptyDir, by the kubelet too.
    check(
        pod(|p| p["spec"]["volumes"][0] = json!({ "name": "certs" })),
        V1_20,
        &[],
    );
    check(
        pod(|p| p["spec"]["containers"][0]["volumeMounts"][0]["mountPath"] = json!("")),
        V1_20,
        &["spec.containers[0].volumeMounts[0].mountPath"],
    );
    check(
        pod(|p| {
            let mount = p["spec"]["containers"][0]["volumeMounts"][0].clone();
            p["spec"]["containers"][0]["volumeMounts"]
                .as_array_mut()
                .unwrap()
                .push(mount);
        }),
        V1_20,
        &["spec.containers[0].volumeMounts[1].mountPath"],
    );
    for (sub_path, refused) in [("tls.crt", false), ("a/../b", true), ("/etc", true), ("", false)] {
        let expected: &[&str] = if refused {
            &["spec.containers[0].volumeMounts[0].subPath"]
        } else {
            &[]
        };
        check(
            pod(|p| p["spec"]["containers"][0]["volumeMounts"][0]["subPath"] = json!(sub_path)),
            V1_20,
            expected,
        );
    }
}

#[test]
fn host_paths() {
    for (path, kind, expected) in [
        ("/etc/kubernetes/x", "DirectoryOrCreate", &[][..]),
        ("/etc/kubernetes/../x", "", &["spec.volumes[0].hostPath.path"][..]),
        ("", "", &["spec.volumes[0].hostPath.path"][..]),
        ("/etc/x", "Dir", &["spec.volumes[0].hostPath.type"][..]),
    ] {
        check(
            pod(|p| p["spec"]["volumes"][0]["hostPath"] = json!({ "path": path, "type": kind })),
            V1_20,
            expected,
        );
    }
}

/// A projected token needs a named service account (a rule of pods, not of templates),
/// whatever the version; with one named, only the ≥1.34 rule against references is left.
#[test]
fn a_projected_token_needs_a_service_account() {
    let token = json!({ "name": "certs", "projected": { "sources": [
        { "downwardAPI": { "items": [] } },
        { "serviceAccountToken": { "path": "token" } }
    ] } });
    let with_token = |account: Option<&str>| {
        pod(|p| {
            p["spec"]["volumes"] = json!([token]);
            if let Some(account) = account {
                p["spec"]["serviceAccountName"] = json!(account);
            }
        })
    };
    let field = "spec.volumes[0].projected.sources[1].serviceAccountToken";
    check(with_token(None), V1_20, &[field]);
    check(with_token(Some("")), V1_20, &[field]);
    check(with_token(Some("default")), V1_20, &[]);
    check(
        with_token(Some("default")),
        Some(KubeletVersion::new(1, 37)),
        &["spec.serviceAccountName", "spec.volumes[0] (certs)"],
    );
}

#[test]
fn containers_ports_env_and_probes() {
    check(
        pod(|p| p["spec"]["containers"] = json!([])),
        V1_20,
        &["spec.containers"],
    );
    check(
        pod(|p| p["spec"]["containers"][0]["image"] = json!("")),
        V1_20,
        &["spec.containers[0].image"],
    );
    for (port, expected) in [
        (json!({ "containerPort": 6443, "hostPort": 6443 }), &[][..]),
        (
            json!({ "containerPort": 6443, "hostPort": 443 }),
            &["spec.containers[0].ports[0].containerPort"][..],
        ),
        (
            json!({ "containerPort": 0 }),
            &["spec.containers[0].ports[0].containerPort"][..],
        ),
        (
            json!({ "containerPort": 6443, "name": "kube-apiserver-https" }),
            &["spec.containers[0].ports[0].name"][..],
        ),
        (
            json!({ "containerPort": 6443, "protocol": "HTTP" }),
            &["spec.containers[0].ports[0].protocol"][..],
        ),
    ] {
        check(
            pod(|p| p["spec"]["containers"][0]["ports"] = json!([port])),
            V1_20,
            expected,
        );
    }
    // The same refusal, reported on hostPort from 1.28 on (and when the version is unknown).
    let mismatch =
        || pod(|p| p["spec"]["containers"][0]["ports"] = json!([{ "containerPort": 6443, "hostPort": 443 }]));
    for (kubelet, field) in [
        (Some(KubeletVersion::new(1, 27)), "containerPort"),
        (Some(KubeletVersion::new(1, 28)), "hostPort"),
        (Some(KubeletVersion::new(1, 37)), "hostPort"),
        (None, "hostPort"),
    ] {
        check(
            mismatch(),
            kubelet,
            &[format!("spec.containers[0].ports[0].{field}").as_str()],
        );
    }
    check(
        pod(|p| {
            p["spec"]["containers"][0]["ports"] =
                json!([{ "containerPort": 1, "name": "a" }, { "containerPort": 2, "name": "a" }])
        }),
        V1_20,
        &["spec.containers[0].ports[1].name"],
    );
    // Not C-like: refused before 1.35 (kubelets before it validate a static pod with the
    // strict rule, even where their API server takes relaxed names; the real v1.34.4
    // kubelet refuses `1ST`) and when the version is unknown, accepted after.
    let env = |name: &str| pod(|p| p["spec"]["containers"][0]["env"][0]["name"] = json!(name));
    check(env("1ST"), V1_20, &["spec.containers[0].env[0].name"]);
    check(env("1ST"), None, &["spec.containers[0].env[0].name"]);
    check(env("1ST"), V1_34, &["spec.containers[0].env[0].name"]);
    check(env("1ST"), V1_35, &[]);
    check(env("A=B"), V1_35, &["spec.containers[0].env[0].name"]);
    check(
        pod(|p| p["spec"]["containers"][0]["livenessProbe"]["tcpSocket"] = json!({ "port": 6443 })),
        V1_20,
        &["spec.containers[0].livenessProbe"],
    );
    check(
        pod(|p| p["spec"]["restartPolicy"] = json!("Sometimes")),
        V1_20,
        &["spec.restartPolicy"],
    );
}

#[test]
fn metadata_rules() {
    check(
        pod(|p| p["metadata"]["ownerReferences"][0]["uid"] = json!("")),
        V1_20,
        &["metadata.ownerReferences[0].uid"],
    );
    check(
        pod(|p| p["metadata"]["labels"]["tier"] = json!("control plane")),
        V1_20,
        &["metadata.labels[\"tier\"]"],
    );
    check(pod(|p| p["metadata"]["labels"]["tier"] = json!("")), V1_20, &[]);
    check(
        pod(|p| p["metadata"]["labels"]["Bad_Prefix/x"] = json!("")),
        V1_20,
        &["metadata.labels[\"Bad_Prefix/x\"]"],
    );
    check(
        pod(|p| p["metadata"]["annotations"]["big"] = json!("x".repeat(ANNOTATIONS_MAX_BYTES))),
        V1_20,
        &["metadata.annotations"],
    );
}

#[test]
fn api_object_references_are_refused_from_1_34_and_when_unknown() {
    let with_secret = || {
        pod(|p| {
            p["spec"]["containers"][0]["env"][0] =
                json!({ "name": "TOKEN", "valueFrom": { "secretKeyRef": { "name": "s", "key": "k" } } });
        })
    };
    check(with_secret(), V1_33, &[]);
    check(
        with_secret(),
        V1_34,
        &["spec.containers[0].env[0].valueFrom.secretKeyRef"],
    );
    check(
        with_secret(),
        None,
        &["spec.containers[0].env[0].valueFrom.secretKeyRef"],
    );
}

/// The fields a kubelet drops: named, for a warning, never refused.
fn check_dropped(pod: Pod, kubelet: Option<KubeletVersion>, expected: &[&str]) {
    let fields: Vec<String> = dropped_fields(&pod, kubelet)
        .into_iter()
        .map(|f| f.field)
        .collect();
    assert_eq!(fields, expected, "kubelet {kubelet:?}");
    assert_eq!(
        admit(&pod, "node-1", kubelet),
        Ok(()),
        "a dropped field is not a refusal"
    );
}

#[test]
fn fields_the_kubelet_does_not_know() {
    let sidecar = || {
        pod(|p| {
            p["spec"]["initContainers"] =
                json!([{ "name": "proxy", "image": "busybox", "restartPolicy": "Always" }]);
            p["spec"]["os"] = json!({ "name": "linux" });
        })
    };
    check_dropped(
        sidecar(),
        V1_20,
        &["spec.os", "spec.initContainers[0].restartPolicy"],
    );
    check_dropped(
        sidecar(),
        Some(KubeletVersion::new(1, 23)),
        &["spec.initContainers[0].restartPolicy"],
    );
    check_dropped(sidecar(), Some(KubeletVersion::new(1, 28)), &[]);
    // A kubelet that knows every listed field.
    check_dropped(sidecar(), V1_33, &[]);
    // Unknown version: nothing to say.
    check_dropped(sidecar(), None, &[]);
    // Empty lists are unset fields.
    check_dropped(pod(|p| p["spec"]["schedulingGates"] = json!([])), V1_20, &[]);
    check_dropped(
        pod(|p| p["spec"]["containers"][0]["volumeMounts"][0]["recursiveReadOnly"] = json!("Disabled")),
        Some(KubeletVersion::new(1, 29)),
        &["spec.containers[0].volumeMounts[0].recursiveReadOnly"],
    );
}

#[test]
fn every_newer_field_is_a_field_the_pod_type_carries() {
    // A path the pod type does not serialize would never be found: each must round-trip.
    for (path, _) in NEWER_FIELDS {
        let mut value = base();
        let mut at = &mut value;
        let segments: Vec<&str> = path.split('.').collect();
        for (i, segment) in segments.iter().enumerate() {
            let last = i + 1 == segments.len();
            let (key, every) = match segment.strip_suffix("[]") {
                Some(key) => (key, true),
                None => (*segment, false),
            };
            if every {
                if !at[key].is_array() || at[key].as_array().unwrap().is_empty() {
                    at[key] = json!([{ "name": "c", "image": "i", "mountPath": "/m" }]);
                }
                at = &mut at[key][0];
            } else if last {
                at[key] = sample(key);
            } else {
                if !at[key].is_object() {
                    at[key] = json!({});
                }
                at = &mut at[key];
            }
        }
        let pod: Pod = serde_json::from_value(value).expect("a Pod");
        let json = serde_json::to_value(&pod).unwrap();
        assert!(
            !present(&json, path).is_empty(),
            "{path} is not carried by the Pod type"
        );
    }
}

/// A value the Pod type accepts for a field of [`NEWER_FIELDS`].
fn sample(key: &str) -> Value {
    match key {
        "os" => json!({ "name": "linux" }),
        "hostUsers" => json!(false),
        "schedulingGates" => json!([{ "name": "g" }]),
        "resizePolicy" => json!([{ "resourceName": "cpu", "restartPolicy": "NotRequired" }]),
        "sleep" => json!({ "seconds": 1 }),
        "appArmorProfile" => json!({ "type": "RuntimeDefault" }),
        "image" => json!({ "reference": "busybox" }),
        "resources" => json!({ "limits": { "cpu": "1" } }),
        "stopSignal" => json!("SIGTERM"),
        _ => json!("Always"),
    }
}

#[test]
fn kubelet_versions_parse() {
    for (text, expected) in [
        ("v1.20.2", Some((1, 20))),
        ("1.33", Some((1, 33))),
        ("v1.30.4+k3s1", Some((1, 30))),
        ("v1.29.0-gke.1", Some((1, 29))),
        ("v1.31+", Some((1, 31))),
        ("v1", None),
        ("", None),
        ("vx.y", None),
    ] {
        let parsed = text.parse::<KubeletVersion>().ok().map(|v| (v.major, v.minor));
        assert_eq!(parsed, expected, "{text:?}");
    }
    assert_eq!(KubeletVersion::new(1, 20).to_string(), "v1.20");
}
