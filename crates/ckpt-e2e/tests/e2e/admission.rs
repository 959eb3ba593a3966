//! The local admission check (`ckpt_core::admit`) against its reference, the real v1.20
//! API server's validation: the kubelet validates a static pod as the API server validates
//! a pod create. Each case is a sanitized manifest with one rule broken (or none), named as
//! the kubelet names it (`<name>-<node>`) and created with `dryRun`; `admit` for a v1.20
//! kubelet must give the same verdict, and a refusal must name a field the API server's
//! message names too.

use ckpt_core::{KubeletVersion, admit};
use ckpt_e2e::e2e_env::NODE_NAME;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::suite::Scenario;

/// A sanitized host-network API server, as the agent writes it.
fn base(ns: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "kube-apiserver-x7k2p",
            "namespace": ns,
            "labels": { "k8s-app": "kube-apiserver", "tier": "control-plane" },
            "annotations": { "checkpointer.alpha.coreos.com/checkpoint-of": "kube-apiserver-x7k2p" },
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Pod", "name": "kube-apiserver-x7k2p",
                "uid": "4c0d6a1e-5b4a-4d8e-9d3a-2f1c0b9e8a7d", "controller": true
            }]
        },
        "spec": {
            "hostNetwork": true,
            "containers": [{
                "name": "kube-apiserver",
                "image": "localhost/kube-control-plane:v1.20.2",
                "env": [{ "name": "ETCD_SERVERS", "value": "https://127.0.0.1:2379" }],
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

type Edit = fn(&mut Value);

/// One rule broken per case (the first: none).
const CASES: &[(&str, Edit)] = &[
    ("valid", |_| {}),
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
        let mount = json!({ "name": "certs", "mountPath": "/etc/kubernetes/secrets" });
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
        p["spec"]["containers"][0]["ports"][0]["containerPort"] = json!(0);
    }),
    ("hostPort unlike containerPort on the host network", |p| {
        p["spec"]["containers"][0]["ports"][0]["hostPort"] = json!(443);
    }),
    ("hostPort equal to containerPort", |p| {
        p["spec"]["containers"][0]["ports"][0]["hostPort"] = json!(6443);
    }),
    ("port name longer than 15", |p| {
        p["spec"]["containers"][0]["ports"][0]["name"] = json!("kube-apiserver-https");
    }),
    ("two ports of one name", |p| {
        let port = json!({ "name": "https", "containerPort": 8443 });
        if let Some(ports) = p["spec"]["containers"][0]["ports"].as_array_mut() {
            ports.push(port);
        }
    }),
    ("unknown protocol", |p| {
        p["spec"]["containers"][0]["ports"][0]["protocol"] = json!("HTTP");
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
    ctx.step(&format!(
        "{} manifests: admit (kubelet v1.20) against the v1.20 API server's dry-run create",
        CASES.len()
    ));
    let kubelet = Some(KubeletVersion::new(1, 20));
    let mut refused = 0;
    let mut disagreements = Vec::new();
    for (what, edit) in CASES {
        let mut manifest = base(&ctx.ns);
        edit(&mut manifest);
        let pod: Pod = serde_json::from_value(manifest.clone())?;
        let verdict = admit(&pod, NODE_NAME, kubelet);

        // What the kubelet hands to validation: the pod under its name for it, bound to the
        // node; marked as a mirror pod, so that admission plugins (service accounts) leave
        // it alone.
        let mut as_kubelet_names_it = manifest;
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
            "    {:<48} {:<8} {}",
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
        CASES.len()
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
