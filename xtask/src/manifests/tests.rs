//! Render tests: the YAML reads back into the same objects, every registered strategy
//! renders a config the agent accepts, and the manifests say what ARCHITECTURE.md, Deployment asks for.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::api::rbac::v1::PolicyRule;

use super::*;

fn options(args: &ManifestArgs) -> ManifestOptions {
    args.options(KubernetesVersion::NEWEST).unwrap()
}

fn default_options() -> ManifestOptions {
    options(&ManifestArgs::default())
}

fn legacy_options() -> ManifestOptions {
    ManifestArgs::default()
        .options(KubernetesVersion::new(1, 20))
        .unwrap()
}

fn daemonset_of(objects: &[Manifest]) -> &DaemonSet {
    objects
        .iter()
        .find_map(|o| match o {
            Manifest::DaemonSet(ds) => Some(ds.as_ref()),
            _ => None,
        })
        .expect("a DaemonSet")
}

fn pod_spec_of(objects: &[Manifest]) -> &PodSpec {
    daemonset_of(objects)
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
}

fn container_of(objects: &[Manifest]) -> &Container {
    &pod_spec_of(objects).containers[0]
}

fn config_of(objects: &[Manifest]) -> &str {
    objects
        .iter()
        .find_map(|o| match o {
            Manifest::ConfigMap(cm) => cm.data.as_ref()?.get(CONFIG_KEY),
            _ => None,
        })
        .expect("the agent's ConfigMap")
}

fn cluster_rules(objects: &[Manifest]) -> &[PolicyRule] {
    objects
        .iter()
        .find_map(|o| match o {
            Manifest::ClusterRole(r) => r.rules.as_deref(),
            _ => None,
        })
        .expect("a ClusterRole")
}

/// Parses what [`to_yaml`] wrote, each document by its `kind`.
fn from_yaml(text: &str) -> anyhow::Result<Vec<Manifest>> {
    let documents: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(text).context("not a multi-document YAML stream")?;
    documents
        .into_iter()
        .enumerate()
        .map(|(index, doc)| manifest_from_json(doc).with_context(|| format!("document {}", index + 1)))
        .collect()
}

/// One document, by its `kind`.
fn manifest_from_json(value: serde_json::Value) -> anyhow::Result<Manifest> {
    let kind = value
        .get("kind")
        .and_then(|k| k.as_str())
        .unwrap_or_default()
        .to_owned();
    let parsed = match kind.as_str() {
        "Namespace" => serde_json::from_value(value).map(Manifest::Namespace),
        "ServiceAccount" => serde_json::from_value(value).map(Manifest::ServiceAccount),
        "ConfigMap" => serde_json::from_value(value).map(Manifest::ConfigMap),
        "ClusterRole" => serde_json::from_value(value).map(Manifest::ClusterRole),
        "ClusterRoleBinding" => serde_json::from_value(value).map(Manifest::ClusterRoleBinding),
        "Role" => serde_json::from_value(value).map(Manifest::Role),
        "RoleBinding" => serde_json::from_value(value).map(Manifest::RoleBinding),
        "DaemonSet" => serde_json::from_value(value).map(|ds| Manifest::DaemonSet(Box::new(ds))),
        other => bail!("unexpected kind {other:?}"),
    };
    parsed.with_context(|| format!("invalid {kind}"))
}

fn kinds_and_names(objects: &[Manifest]) -> Vec<String> {
    objects.iter().map(Manifest::describe).collect()
}

#[test]
fn yaml_reads_back_into_the_same_objects() {
    let variants = [
        ManifestArgs::default(),
        ManifestArgs {
            gc_strategy: "owner-reference".into(),
            grace_period: "5m".into(),
            namespaces: vec!["monitoring".into(), "kube-system".into()],
            namespace: "pod-checkpointer".into(),
            image: "registry.example/pod-checkpointer:dev".into(),
            runtime_endpoint: String::new(),
            kubernetes_version: Some(KubernetesVersion::new(1, 20)),
            bind_user: vec!["pod-checkpointer".into()],
            ..ManifestArgs::default()
        },
    ];
    for args in variants {
        let objects = render(&options(&args));
        let yaml = to_yaml(&objects).unwrap();
        let parsed = from_yaml(&yaml).unwrap();
        assert_eq!(parsed, objects, "{yaml}");
        assert_eq!(to_yaml(&parsed).unwrap(), yaml, "rendering is deterministic");
    }
}

#[test]
fn every_registered_strategy_renders_a_config_the_agent_accepts() {
    let names = ckpt_gc::names();
    assert!(names.len() >= 3, "{names:?}");
    for name in names {
        let args = ManifestArgs {
            gc_strategy: name.to_owned(),
            ..ManifestArgs::default()
        };
        let objects = render(&options(&args));
        let config = config_of(&objects);
        ckpt_bin::config::check_config_file(config)
            .unwrap_or_else(|e| panic!("{name}: {}\n{config}", ckpt_core::error_chain(&e)));
        let parsed: serde_json::Value = serde_saphyr::from_str(config).unwrap();
        assert_eq!(parsed["gc-strategy"], name);
        assert!(from_yaml(&to_yaml(&objects).unwrap()).is_ok(), "{name}");
    }
}

#[test]
fn the_config_names_strategy_grace_period_namespaces_paths_and_metrics() {
    let args = ManifestArgs {
        gc_strategy: "immediate".into(),
        grace_period: "90s".into(),
        namespaces: vec!["b".into(), "a".into(), "b".into()],
        runtime_endpoint: "unix:///var/run/crio/crio.sock".into(),
        metrics_port: 9999,
        ..ManifestArgs::default()
    };
    let objects = render(&options(&args));
    let parsed: serde_json::Value = serde_saphyr::from_str(config_of(&objects)).unwrap();
    assert_eq!(
        parsed,
        serde_json::json!({
            "gc-strategy": "immediate",
            "checkpoint-grace-period": "90s",
            "namespaces": ["a", "b", "kube-system"],
            "checkpoint-dir": "/etc/kubernetes",
            "manifests-dir": "/etc/kubernetes/manifests",
            "lock-file": "/var/run/lock/pod-checkpointer.lock",
            "runtime-endpoint": "unix:///var/run/crio/crio.sock",
            "metrics-addr": "127.0.0.1:9999",
        })
    );
}

#[test]
fn an_unknown_strategy_is_rejected_naming_the_registered_ones() {
    let args = ManifestArgs {
        gc_strategy: "sometimes".into(),
        ..ManifestArgs::default()
    };
    let error = args.options(KubernetesVersion::NEWEST).unwrap_err().to_string();
    assert!(
        error.starts_with("--gc-strategy: unknown strategy \"sometimes\""),
        "{error}"
    );
    for name in ckpt_gc::names() {
        assert!(error.contains(name), "{error}");
    }
}

#[test]
fn flags_the_agent_would_refuse_are_rejected_before_rendering() {
    let refused = [
        ManifestArgs {
            grace_period: "5 minutes".into(),
            ..ManifestArgs::default()
        },
        ManifestArgs {
            namespaces: vec!["Not_A_Namespace".into()],
            ..ManifestArgs::default()
        },
        ManifestArgs {
            namespace: "kube_system".into(),
            ..ManifestArgs::default()
        },
        ManifestArgs {
            runtime_endpoint: "tcp://127.0.0.1:1234".into(),
            ..ManifestArgs::default()
        },
        ManifestArgs {
            manifests_dir: "manifests".into(),
            ..ManifestArgs::default()
        },
        ManifestArgs {
            image: " ".into(),
            ..ManifestArgs::default()
        },
    ];
    for args in refused {
        let error = args.options(KubernetesVersion::NEWEST).unwrap_err();
        assert!(!error.to_string().ends_with('.'), "{error}");
    }
    let error = ManifestArgs {
        grace_period: "5 minutes".into(),
        ..ManifestArgs::default()
    }
    .options(KubernetesVersion::NEWEST)
    .unwrap_err();
    assert!(
        error.to_string().contains("--checkpoint-grace-period"),
        "the agent's own message: {error}"
    );
}

#[test]
fn the_default_grace_period_is_the_agents() {
    assert_eq!(ckpt_gc::DEFAULT_GRACE_PERIOD, Duration::from_secs(60));
    assert_eq!(DEFAULT_GRACE_PERIOD, "1m");
}

#[test]
fn objects_come_in_apply_order_with_a_role_per_checkpointed_namespace() {
    let in_kube_system = render(&default_options());
    assert_eq!(
        kinds_and_names(&in_kube_system),
        [
            "ServiceAccount kube-system/pod-checkpointer",
            "ServiceAccount kube-system/pod-checkpointer-static",
            "ConfigMap kube-system/pod-checkpointer",
            "ClusterRole pod-checkpointer",
            "ClusterRoleBinding pod-checkpointer",
            "Role kube-system/pod-checkpointer",
            "RoleBinding kube-system/pod-checkpointer",
            "Role kube-system/pod-checkpointer-token",
            "RoleBinding kube-system/pod-checkpointer-token",
            "DaemonSet kube-system/pod-checkpointer",
        ]
    );
    let elsewhere = render(&options(&ManifestArgs {
        namespace: "checkpointer".into(),
        namespaces: vec!["kube-system".into()],
        ..ManifestArgs::default()
    }));
    assert_eq!(
        kinds_and_names(&elsewhere),
        [
            "Namespace checkpointer",
            "ServiceAccount checkpointer/pod-checkpointer",
            "ServiceAccount checkpointer/pod-checkpointer-static",
            "ConfigMap checkpointer/pod-checkpointer",
            "ClusterRole pod-checkpointer",
            "ClusterRoleBinding pod-checkpointer",
            "Role checkpointer/pod-checkpointer",
            "RoleBinding checkpointer/pod-checkpointer",
            "Role kube-system/pod-checkpointer",
            "RoleBinding kube-system/pod-checkpointer",
            "Role checkpointer/pod-checkpointer-token",
            "RoleBinding checkpointer/pod-checkpointer-token",
            "DaemonSet checkpointer/pod-checkpointer",
        ],
        "the install namespace is always checkpointed: the agent checkpoints itself"
    );
}

#[test]
fn bindings_name_the_service_account_and_any_extra_user() {
    let objects = render(&options(&ManifestArgs {
        bind_user: vec!["pod-checkpointer".into()],
        ..ManifestArgs::default()
    }));
    for object in &objects {
        let (role_ref, subjects) = match object {
            Manifest::ClusterRoleBinding(b) => (&b.role_ref, b.subjects.as_ref().unwrap()),
            Manifest::RoleBinding(b) => (&b.role_ref, b.subjects.as_ref().unwrap()),
            _ => continue,
        };
        let subjects: Vec<_> = subjects
            .iter()
            .map(|s| (s.kind.as_str(), s.name.as_str(), s.namespace.as_deref()))
            .collect();
        let mut expected = vec![
            ("ServiceAccount", NAME, Some("kube-system")),
            ("User", "pod-checkpointer", None),
        ];
        if role_ref.name == NAME {
            // The static copy reads what the agent reads; only the agent mints tokens.
            expected.push(("ServiceAccount", STATIC_NAME, Some("kube-system")));
        } else {
            assert_eq!(role_ref.name, "pod-checkpointer-token");
        }
        assert_eq!(subjects, expected);
    }
}

#[test]
fn rbac_is_least_privilege() {
    let objects = render(&default_options());
    for object in &objects {
        let rules = match object {
            Manifest::ClusterRole(r) => r.rules.as_ref().unwrap(),
            Manifest::Role(r) => r.rules.as_ref().unwrap(),
            _ => continue,
        };
        for rule in rules {
            let resources = rule.resources.as_ref().unwrap();
            let everything = [rule.api_groups.as_ref().unwrap(), resources, &rule.verbs];
            assert!(
                everything.iter().all(|list| !list.iter().any(|s| s == "*")),
                "no wildcards: {rule:?}"
            );
            let writes: Vec<_> = rule
                .verbs
                .iter()
                .filter(|v| !["get", "list", "watch"].contains(&v.as_str()))
                .collect();
            let static_token = resources == &["serviceaccounts/token"]
                && rule.resource_names.as_deref() == Some(&[STATIC_NAME.to_owned()][..])
                && object.namespace() == Some("kube-system");
            assert!(
                writes.is_empty() || resources == &["events"] || static_token,
                "only Events are written, and tokens of the static copy's service account minted: {rule:?}"
            );
        }
    }
}

#[test]
fn tokens_only_of_the_static_account_in_its_own_namespace_minted_by_the_agent_alone() {
    let mut options = default_options();
    options.namespaces = vec!["kube-system".into(), "cni".into()];
    let objects = render(&options);
    let token_rules: Vec<(Option<&str>, &PolicyRule)> = objects
        .iter()
        .filter_map(|object| match object {
            Manifest::Role(r) => Some((object.namespace(), r.rules.as_ref()?)),
            _ => None,
        })
        .flat_map(|(ns, rules)| rules.iter().map(move |r| (ns, r)))
        .filter(|(_, r)| {
            r.resources
                .iter()
                .flatten()
                .any(|res| res.contains("serviceaccounts"))
        })
        .collect();
    assert_eq!(token_rules.len(), 1, "{token_rules:?}");
    let (ns, rule) = token_rules[0];
    assert_eq!(ns, Some("kube-system"));
    assert_eq!(rule.verbs, ["create"]);
    assert_eq!(
        rule.resource_names.as_deref(),
        Some(&[STATIC_NAME.to_owned()][..])
    );
    // Its binding names the agent's account only: the static copy cannot renew itself,
    // while every other binding names both accounts.
    for object in &objects {
        let Manifest::RoleBinding(binding) = object else {
            continue;
        };
        let names: Vec<&str> = (binding.subjects.iter().flatten())
            .map(|s| s.name.as_str())
            .collect();
        if binding.role_ref.name == "pod-checkpointer-token" {
            assert_eq!(names, [NAME], "{binding:?}");
        } else {
            assert_eq!(names, [NAME, STATIC_NAME], "{binding:?}");
        }
    }
}

#[test]
fn the_kubelet_api_and_rolling_update_follow_the_kubernetes_version() {
    let current = render(&default_options());
    let legacy = render(&legacy_options());
    let subresource = |objects: &[Manifest]| cluster_rules(objects)[0].resources.clone().unwrap();
    assert_eq!(subresource(&current), ["nodes/pods"]);
    assert_eq!(subresource(&legacy), ["nodes/proxy"]);

    let rolling = |objects: &[Manifest]| {
        let strategy = daemonset_of(objects)
            .spec
            .clone()
            .unwrap()
            .update_strategy
            .unwrap();
        assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
        strategy.rolling_update.unwrap()
    };
    assert_eq!(
        rolling(&current),
        RollingUpdateDaemonSet {
            max_surge: Some(IntOrString::Int(1)),
            max_unavailable: Some(IntOrString::Int(0)),
        }
    );
    assert_eq!(
        rolling(&legacy),
        RollingUpdateDaemonSet {
            max_surge: None,
            max_unavailable: Some(IntOrString::Int(1)),
        }
    );
    assert!(
        !to_yaml(&legacy).unwrap().contains("maxSurge"),
        "an API server before 1.21 refuses the field in a server-side apply"
    );
}

#[test]
fn the_daemonset_runs_the_agent_on_control_plane_nodes_and_checkpoints_itself() {
    let objects = render(&default_options());
    let template = &daemonset_of(&objects).spec.as_ref().unwrap().template;
    let annotations = template.metadata.as_ref().unwrap().annotations.as_ref().unwrap();
    assert_eq!(annotations[CHECKPOINT_ANNOTATION], "true");
    assert!(annotations.contains_key(CONFIG_HASH_ANNOTATION));

    let spec = pod_spec_of(&objects);
    assert_eq!(spec.host_network, Some(true));
    assert_eq!(spec.service_account_name.as_deref(), Some(NAME));
    assert_eq!(spec.priority_class_name.as_deref(), Some("system-node-critical"));
    let terms = &spec
        .affinity
        .as_ref()
        .unwrap()
        .node_affinity
        .as_ref()
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .unwrap()
        .node_selector_terms;
    let keys: Vec<_> = terms
        .iter()
        .map(|t| t.match_expressions.as_ref().unwrap()[0].key.as_str())
        .collect();
    assert_eq!(
        keys,
        [
            "node-role.kubernetes.io/control-plane",
            "node-role.kubernetes.io/master"
        ]
    );
    let tolerated: Vec<_> = spec
        .tolerations
        .as_ref()
        .unwrap()
        .iter()
        .map(|t| (t.key.as_deref().unwrap(), t.effect.as_deref().unwrap()))
        .collect();
    assert_eq!(
        tolerated,
        [
            ("node-role.kubernetes.io/control-plane", "NoSchedule"),
            ("node-role.kubernetes.io/master", "NoSchedule")
        ]
    );

    let container = container_of(&objects);
    assert_eq!(container.image.as_deref(), Some(DEFAULT_IMAGE));
    assert_eq!(container.image_pull_policy.as_deref(), Some("IfNotPresent"));
    assert_eq!(
        container.args.as_deref().unwrap(),
        ["run", "--config", "/etc/pod-checkpointer/config.yaml"]
    );
    let env: Vec<_> = container
        .env
        .as_ref()
        .unwrap()
        .iter()
        .map(|e| {
            let field = e.value_from.as_ref().unwrap().field_ref.as_ref().unwrap();
            (e.name.as_str(), field.field_path.as_str())
        })
        .collect();
    assert_eq!(
        env,
        [
            ("NODE_NAME", "spec.nodeName"),
            ("POD_NAME", "metadata.name"),
            ("POD_NAMESPACE", "metadata.namespace"),
            ("HOST_IP", "status.hostIP"),
        ]
    );
    for (probe, path) in [
        (container.liveness_probe.as_ref(), "/healthz"),
        (container.readiness_probe.as_ref(), "/readyz"),
    ] {
        let get = probe.unwrap().http_get.as_ref().unwrap();
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(get.port, IntOrString::Int(i32::from(DEFAULT_METRICS_PORT)));
        assert_eq!(get.host.as_deref(), Some("127.0.0.1"));
    }
}

#[test]
fn host_paths_are_mounted_where_they_are_on_the_host() {
    let mounted = |options: &ManifestOptions| -> Vec<(String, String, bool)> {
        let objects = render(options);
        let spec = pod_spec_of(&objects);
        let volumes = spec.volumes.as_ref().unwrap();
        container_of(&objects)
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .filter_map(|m| {
                let volume = volumes.iter().find(|v| v.name == m.name).unwrap();
                let host = volume.host_path.as_ref()?;
                assert_eq!(host.path, m.mount_path, "{}", m.name);
                Some((m.name.clone(), host.path.clone(), m.read_only == Some(true)))
            })
            .collect()
    };
    let expected = |cri: &[(&str, &str, bool)]| -> Vec<(String, String, bool)> {
        [
            ("checkpoint-dir", "/etc/kubernetes", false),
            ("manifests-dir", "/etc/kubernetes/manifests", false),
            ("lock-dir", "/var/run/lock", false),
        ]
        .iter()
        .chain(cri)
        .map(|(n, p, ro)| ((*n).to_owned(), (*p).to_owned(), *ro))
        .collect()
    };
    assert_eq!(
        mounted(&default_options()),
        expected(&[("cri-socket-dir", "/run/containerd", true)])
    );
    let without_cri = options(&ManifestArgs {
        runtime_endpoint: String::new(),
        ..ManifestArgs::default()
    });
    assert_eq!(mounted(&without_cri), expected(&[]));
}

#[test]
fn a_changed_config_changes_the_pod_template() {
    let hash = |args: &ManifestArgs| {
        let objects = render(&options(args));
        let template = daemonset_of(&objects).spec.clone().unwrap().template;
        template.metadata.unwrap().annotations.unwrap()[CONFIG_HASH_ANNOTATION].clone()
    };
    let default = hash(&ManifestArgs::default());
    assert_eq!(default, hash(&ManifestArgs::default()));
    assert_ne!(
        default,
        hash(&ManifestArgs {
            grace_period: "5m".into(),
            ..ManifestArgs::default()
        })
    );
}

#[test]
fn kubernetes_versions_parse_as_operators_and_servers_write_them() {
    for (text, expected) in [
        ("1.20", (1, 20)),
        ("v1.20.2", (1, 20)),
        ("1.33", (1, 33)),
        ("v1.33.1+k3s1", (1, 33)),
        ("1.30-eks", (1, 30)),
    ] {
        let version: KubernetesVersion = text.parse().unwrap();
        assert_eq!((version.major, version.minor), expected, "{text}");
    }
    for bad in ["", "1", "one.two", "1."] {
        assert!(bad.parse::<KubernetesVersion>().is_err(), "{bad:?}");
    }
    assert_eq!(
        KubernetesVersion::from_version_info("1", "20+").unwrap(),
        KubernetesVersion::new(1, 20)
    );
    assert!(KubernetesVersion::new(1, 24) < KubernetesVersion::new(1, 25));
    assert!(!KubernetesVersion::new(1, 24).has_daemonset_max_surge());
    assert!(KubernetesVersion::new(1, 25).has_daemonset_max_surge());
    assert!(!KubernetesVersion::new(1, 32).kubelet_authorizes_nodes_pods());
    assert!(KubernetesVersion::NEWEST.kubelet_authorizes_nodes_pods());
}
