//! The local admission check (`ckpt_core::admit`) against its reference, the real v1.20
//! API server's validation: the kubelet validates a static pod as the API server validates
//! a pod create. Two parents, as the API server stores them (a `dryRun` create, with its
//! defaults and admission), are sanitized as the agent does; their checkpoints must be
//! admitted and accepted. Then each case breaks one rule of the first checkpoint (or
//! none). Every manifest is created with `dryRun` as the kubelet names it (`<name>-<node>`):
//! `admit` for a v1.20 kubelet must give the API server's verdict, and a refusal must name a
//! field the API server's message names too.

use anyhow::Context;
use ckpt_core::{ApiObjects, KubeletVersion, SanitizeOptions, Timestamp, admit, sanitize};
use ckpt_e2e::e2e_env::NODE_NAME;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use serde_json::{Value, json};

use crate::suite::Scenario;

/// The Secret and ConfigMap the parents use.
fn api_objects(ns: &str) -> anyhow::Result<ApiObjects> {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "admission-certs", "namespace": ns },
        "data": { "tls.crt": "Y2VydA==", "tls.key": "a2V5" }
    }))?;
    let config: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": "admission-config", "namespace": ns },
        "data": { "etcd-servers": "https://127.0.0.1:2379", "log-level": "2" }
    }))?;
    let mut objects = ApiObjects::default();
    objects.secrets.insert("admission-certs".into(), secret.into());
    objects
        .config_maps
        .insert("admission-config".into(), config.into());
    Ok(objects)
}

/// A host-network API server and a pod-network scheduler, with what sanitization rewrites:
/// Secret and projected volumes, env from a ConfigMap, named ports in probes.
fn parents(ns: &str) -> [Value; 2] {
    let checkpointed = json!({ "checkpointer.alpha.coreos.com/checkpoint": "true" });
    [
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "kube-apiserver-x7k2p",
                "namespace": ns,
                "labels": { "k8s-app": "kube-apiserver", "tier": "control-plane" },
                "annotations": checkpointed
            },
            "spec": {
                "nodeName": NODE_NAME,
                "hostNetwork": true,
                "containers": [{
                    "name": "kube-apiserver",
                    "image": "localhost/kube-control-plane:v1.20.2",
                    "command": ["kube-apiserver", "--secure-port=6443"],
                    "env": [
                        { "name": "ETCD_SERVERS", "valueFrom": { "configMapKeyRef": { "name": "admission-config", "key": "etcd-servers" } } },
                        { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } }
                    ],
                    "envFrom": [{ "configMapRef": { "name": "admission-config" }, "prefix": "CFG_" }],
                    "ports": [{ "name": "https", "containerPort": 6443 }],
                    "livenessProbe": { "httpGet": { "path": "/livez", "port": "https", "scheme": "HTTPS" } },
                    "volumeMounts": [
                        { "name": "certs", "mountPath": "/etc/kubernetes/secrets" },
                        { "name": "bundle", "mountPath": "/etc/kubernetes/bundle" }
                    ]
                }],
                "volumes": [
                    { "name": "certs", "secret": { "secretName": "admission-certs" } },
                    { "name": "bundle", "projected": { "sources": [
                        { "secret": { "name": "admission-certs", "items": [{ "key": "tls.crt", "path": "tls.crt" }] } },
                        { "configMap": { "name": "admission-config" } },
                        { "downwardAPI": { "items": [{ "path": "labels", "fieldRef": { "fieldPath": "metadata.labels" } }] } }
                    ] } }
                ]
            }
        }),
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "kube-scheduler-5d8f9",
                "namespace": ns,
                "labels": { "k8s-app": "kube-scheduler" },
                "annotations": checkpointed
            },
            "spec": {
                "nodeName": NODE_NAME,
                "containers": [{
                    "name": "kube-scheduler",
                    "image": "localhost/kube-control-plane:v1.20.2",
                    "ports": [{ "name": "metrics", "containerPort": 10259 }],
                    "readinessProbe": { "tcpSocket": { "port": "metrics" } },
                    "volumeMounts": [
                        { "name": "kubeconfig", "mountPath": "/etc/kubernetes/kubeconfig" },
                        { "name": "tmp", "mountPath": "/tmp" }
                    ]
                }],
                "volumes": [
                    { "name": "kubeconfig", "secret": { "secretName": "admission-certs", "defaultMode": 0o400 } },
                    { "name": "tmp", "emptyDir": {} }
                ]
            }
        }),
    ]
}

/// Each parent as the API server would store it (a `dryRun` create), sanitized.
fn sanitized_parents(ctx: &Scenario<'_>) -> anyhow::Result<Vec<(String, Value)>> {
    let objects = api_objects(&ctx.ns)?;
    let options = SanitizeOptions {
        checkpoint_dir: "/etc/kubernetes/checkpoint".into(),
        checkpointed_at: Timestamp::now(),
    };
    parents(&ctx.ns)
        .into_iter()
        .map(|parent| {
            let stored = ctx.suite.kubectl.run(
                &["create", "--dry-run=server", "-f", "-", "-o", "json"],
                Some(&parent.to_string()),
            )?;
            let pod: Pod = serde_json::from_str(&stored).context("the stored pod")?;
            let name = pod.metadata.name.clone().unwrap_or_default();
            let sanitized = sanitize(&pod, &objects, &options)
                .with_context(|| format!("sanitizing {name} as the API server stores it"))?;
            Ok((name, serde_json::to_value(&sanitized.checkpoint.manifest)?))
        })
        .collect()
}

type Edit = fn(&mut Value);

/// One rule of the API server's checkpoint broken per case (or none, where the API's
/// defaults make a manifest valid).
const CASES: &[(&str, Edit)] = &[
    ("name too long once the node's is appended", |p| {
        p["metadata"]["name"] = json!("a".repeat(254 - NODE_NAME.len() - 1));
    }),
    ("longest name that fits", |p| {
        p["metadata"]["name"] = json!("a".repeat(253 - NODE_NAME.len() - 1));
    }),
    ("container name not a DNS label", |p| {
        p["spec"]["containers"][0]["name"] = json!("Kube_APIServer");
    }),
    ("an init container named like a container", |p| {
        p["spec"]["initContainers"] = json!([{ "name": "kube-apiserver", "image": "busybox" }]);
    }),
    ("volume name not a DNS label", |p| {
        p["spec"]["volumes"][0]["name"] = json!("certs.d");
        p["spec"]["containers"][0]["volumeMounts"][0]["name"] = json!("certs.d");
    }),
    ("two volumes of one name", |p| {
        let volume = p["spec"]["volumes"][0].clone();
        if let Some(volumes) = p["spec"]["volumes"].as_array_mut() {
            volumes.push(volume);
        }
    }),
    ("a mount without its volume", |p| p["spec"]["volumes"] = json!([])),
    ("two volume sources", |p| {
        p["spec"]["volumes"][0]["emptyDir"] = json!({})
    }),
    ("no volume source (the defaults make it an emptyDir)", |p| {
        p["spec"]["volumes"][0] = json!({ "name": "certs" })
    }),
    ("hostPath with ..", |p| {
        p["spec"]["volumes"][0]["hostPath"]["path"] = json!("/etc/kubernetes/../x");
    }),
    ("hostPath of an unknown type", |p| {
        p["spec"]["volumes"][0]["hostPath"]["type"] = json!("Dir");
    }),
    ("hostPath of a known type", |p| {
        p["spec"]["volumes"][0]["hostPath"]["type"] = json!("DirectoryOrCreate");
    }),
    ("empty mountPath", |p| {
        p["spec"]["containers"][0]["volumeMounts"][0]["mountPath"] = json!("");
    }),
    ("one mountPath twice", |p| {
        let mount = p["spec"]["containers"][0]["volumeMounts"][0].clone();
        if let Some(mounts) = p["spec"]["containers"][0]["volumeMounts"].as_array_mut() {
            mounts.push(mount);
        }
    }),
    ("absolute subPath", |p| {
        p["spec"]["containers"][0]["volumeMounts"][0]["subPath"] = json!("/etc");
    }),
    ("subPath with ..", |p| {
        p["spec"]["containers"][0]["volumeMounts"][0]["subPath"] = json!("a/../b");
    }),
    ("relative subPath", |p| {
        p["spec"]["containers"][0]["volumeMounts"][0]["subPath"] = json!("tls/crt");
    }),
    ("no image", |p| p["spec"]["containers"][0]["image"] = json!("")),
    ("containerPort 0", |p| {
        p["spec"]["containers"][0]["ports"] = json!([{ "containerPort": 0 }]);
    }),
    ("hostPort unlike containerPort on the host network", |p| {
        p["spec"]["containers"][0]["ports"] = json!([{ "containerPort": 6443, "hostPort": 443 }]);
    }),
    ("hostPort equal to containerPort", |p| {
        p["spec"]["containers"][0]["ports"] = json!([{ "containerPort": 6443, "hostPort": 6443 }]);
    }),
    ("port name longer than 15", |p| {
        let port = json!({ "name": "kube-apiserver-https", "containerPort": 6443 });
        p["spec"]["containers"][0]["ports"] = json!([port]);
    }),
    ("two ports of one name", |p| {
        let ports =
            json!([{ "name": "https", "containerPort": 6443 }, { "name": "https", "containerPort": 8443 }]);
        p["spec"]["containers"][0]["ports"] = ports;
    }),
    ("unknown protocol", |p| {
        p["spec"]["containers"][0]["ports"] = json!([{ "containerPort": 6443, "protocol": "HTTP" }]);
    }),
    ("env name starting with a digit", |p| {
        p["spec"]["containers"][0]["env"][0]["name"] = json!("1ST");
    }),
    ("env name with dots and dashes", |p| {
        p["spec"]["containers"][0]["env"][0]["name"] = json!("my.var-1");
    }),
    ("a probe with two handlers", |p| {
        p["spec"]["containers"][0]["livenessProbe"]["tcpSocket"] = json!({ "port": 6443 });
    }),
    ("unknown restartPolicy", |p| {
        p["spec"]["restartPolicy"] = json!("Sometimes")
    }),
    ("unknown dnsPolicy", |p| p["spec"]["dnsPolicy"] = json!("Cluster")),
    ("label value with a space", |p| {
        p["metadata"]["labels"]["tier"] = json!("control plane");
    }),
    ("label key with a bad prefix", |p| {
        p["metadata"]["labels"]["Bad_Prefix/x"] = json!("y");
    }),
    ("empty label value", |p| {
        p["metadata"]["labels"]["tier"] = json!("")
    }),
    ("annotations over 256 KiB", |p| {
        p["metadata"]["annotations"]["big"] = json!("x".repeat(256 * 1024));
    }),
    ("owner reference without a uid", |p| {
        p["metadata"]["ownerReferences"][0]["uid"] = json!("");
    }),
];

pub(crate) fn agrees_with_the_api_server(ctx: &mut Scenario<'_>) -> anyhow::Result<()> {
    ctx.step("sanitize two parents as the API server stores them");
    let sanitized = sanitized_parents(ctx)?;
    let base = sanitized[0].1.clone();
    let manifests: Vec<(String, Value)> = (sanitized.into_iter())
        .map(|(name, manifest)| (format!("the checkpoint of {name}"), manifest))
        .chain(CASES.iter().map(|(what, edit)| {
            let mut manifest = base.clone();
            edit(&mut manifest);
            ((*what).to_owned(), manifest)
        }))
        .collect();
    // The kubelet of the plane's own release: admit's version rules (relaxed env names from
    // 1.32, say) are judged by the API server they were written for.
    let release = ckpt_e2e::e2e_env::Release::from_env()?;
    let kubelet_version: KubeletVersion = release.name().parse().map_err(anyhow::Error::msg)?;
    ctx.step(&format!(
        "{} manifests: admit (kubelet {kubelet_version}) against the {release} API server's dry-run create",
        manifests.len()
    ));
    let kubelet = Some(kubelet_version);
    let mut refused = 0;
    let mut disagreements = Vec::new();
    for (what, manifest) in &manifests {
        let pod: Pod = serde_json::from_value(manifest.clone())?;
        let verdict = admit(&pod, NODE_NAME, kubelet);

        // What the kubelet hands to validation: the pod under its name for it, bound to the
        // node; marked as a mirror pod, so that admission plugins (service accounts) leave
        // it alone.
        let mut as_kubelet_names_it = manifest.clone();
        let name = as_kubelet_names_it["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        as_kubelet_names_it["metadata"]["name"] = json!(format!("{name}-{NODE_NAME}"));
        as_kubelet_names_it["metadata"]["annotations"]["kubernetes.io/config.mirror"] = json!("e2e");
        as_kubelet_names_it["spec"]["nodeName"] = json!(NODE_NAME);
        let api = ctx.suite.kubectl.run(
            &[
                "create",
                "--dry-run=server",
                "--validate=false",
                "-f",
                "-",
                "-o",
                "name",
            ],
            Some(&as_kubelet_names_it.to_string()),
        );
        if what.starts_with("the checkpoint of ") && verdict.is_err() {
            disagreements.push(format!("{what} as sanitized must run: {verdict:?}"));
        }
        let agreed = match (&verdict, &api) {
            (Ok(()), Ok(_)) => true,
            (Err(problems), Err(message)) => {
                refused += 1;
                let message = without_selectors(&format!("{message:#}"));
                let named = problems
                    .iter()
                    .any(|p| message.contains(&without_selectors(&p.field)));
                if !named {
                    disagreements.push(format!(
                        "{what}: both refuse, but the API server names none of {problems:?}: {message}"
                    ));
                }
                named
            }
            _ => {
                disagreements.push(format!(
                    "{what}: admit says {verdict:?}, the API server {}",
                    api.as_ref()
                        .map_or_else(|e| format!("refuses: {e:#}"), |_| "accepts".to_owned())
                ));
                false
            }
        };
        eprintln!(
            "    {:<52} {:<8} {}",
            what,
            if verdict.is_ok() { "admitted" } else { "refused" },
            if agreed { "= API server" } else { "≠ API server" }
        );
    }
    anyhow::ensure!(
        disagreements.is_empty(),
        "admit and the API server disagree:\n{}",
        disagreements.join("\n")
    );
    ctx.step(&format!(
        "admit agrees with the API server on all {} manifests ({refused} refused)",
        manifests.len()
    ));
    Ok(())
}

/// `text` without the index and map-key selectors of field paths (`[0]`, `["tier"]`): the
/// API server writes some paths without them (`metadata.ownerReferences.uid`,
/// `metadata.labels`). Other brackets (the API server's list of errors) stay.
fn without_selectors(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let selector = after.find(']').map(|close| &after[..close]).filter(|inside| {
            let quoted = inside.len() >= 2 && inside.starts_with('"') && inside.ends_with('"');
            quoted || (!inside.is_empty() && inside.bytes().all(|b| b.is_ascii_digit()))
        });
        match selector {
            Some(inside) => rest = &after[inside.len() + 1..],
            None => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}
