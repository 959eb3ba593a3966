//! The manifests against the agent that runs them: every registered strategy renders a
//! config the agent accepts, flags it would refuse are refused before rendering, the probes'
//! command lines parse, and the alerts read metrics it exports.

use std::time::Duration;

use ckpt_render::testing::*;

use ckpt_render::*;

use super::*;

fn options(args: &ManifestArgs) -> ManifestOptions {
    args.options(KubernetesVersion::NEWEST).unwrap()
}

fn default_options() -> ManifestOptions {
    options(&ManifestArgs::default())
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
        let warning = crate::config::check_config_file(config)
            .unwrap_or_else(|e| panic!("{name}: {}\n{config}", ckpt_core::error_chain(&e)));
        assert_eq!(warning, None, "render writes apiVersion and kind");
        let parsed: serde_json::Value = serde_saphyr::from_str(config).unwrap();
        assert_eq!(parsed["gc-strategy"], name);
        assert!(from_yaml(&to_yaml(&objects).unwrap()).is_ok(), "{name}");
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
        ManifestArgs {
            api_server: "http://127.0.0.1:8080".into(),
            ..ManifestArgs::default()
        },
        ManifestArgs {
            api_server: "https://".into(),
            ..ManifestArgs::default()
        },
        // The kubelet API without a choice about its certificate.
        ManifestArgs {
            kubelet_insecure: false,
            ..kubelet_args()
        },
        ManifestArgs {
            kubelet_ca: Some("ca.crt".into()),
            kubelet_insecure: false,
            ..kubelet_args()
        },
        // A kubelet choice without the kubelet API.
        ManifestArgs {
            kubelet_insecure: true,
            ..ManifestArgs::default()
        },
        ManifestArgs {
            lock_file: "pod-checkpointer.lock".into(),
            ..ManifestArgs::default()
        },
        // Its directory is mounted: never the host's root.
        ManifestArgs {
            lock_file: "/pod-checkpointer.lock".into(),
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
fn the_default_handoff_timeout_is_the_agents() {
    assert_eq!(
        crate::duration::parse_duration(DEFAULT_HANDOFF_TIMEOUT),
        Ok(ckpt_core::revisions::DEFAULT_HANDOFF_TIMEOUT)
    );
}

/// Exec probes that ask the agent of this pod, on the socket in this pod's emptyDir.
#[test]
fn probes_ask_the_agent_in_the_same_pod() {
    let objects = render(&default_options());
    let container = container_of(&objects);
    for (probe, flag) in [
        (container.liveness_probe.as_ref(), "--live"),
        (container.readiness_probe.as_ref(), "--ready"),
    ] {
        let probe = probe.unwrap();
        assert!(probe.http_get.is_none() && probe.tcp_socket.is_none());
        let command = probe.exec.as_ref().unwrap().command.clone().unwrap();
        assert_eq!(
            command,
            [
                "/pod-checkpointer",
                "health",
                flag,
                "--health-socket",
                "/run/pod-checkpointer-health/health.sock"
            ]
        );
        // The agent's own parser accepts the probe's command line.
        let cli = <crate::config::Cli as clap::Parser>::try_parse_from(&command);
        assert!(cli.is_ok(), "{command:?}");
    }
    let parsed: serde_json::Value = serde_saphyr::from_str(config_of(&objects)).unwrap();
    assert_eq!(
        parsed["health-socket"],
        "/run/pod-checkpointer-health/health.sock"
    );
    let spec = pod_spec_of(&objects);
    let health = spec
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == "health")
        .unwrap();
    assert!(
        health.empty_dir.is_some(),
        "a directory of this pod's own: {health:?}"
    );
}

/// Every metric an alert reads is one the agent exports (a renamed metric would leave an
/// alert that never fires), and every alert aggregates per node, but the one on
/// kube-state-metrics' DaemonSet status, per DaemonSet.
#[test]
fn alerts_read_only_metrics_the_agent_exports() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "eyJhbGciOiJSUzI1NiJ9.eyJleHAiOjEwMDAwMDAwMDB9.sig").unwrap();
    let health = crate::health::Health::new(Duration::from_secs(90)).with_kept_token(token);
    let exported: Vec<String> = health
        .render_metrics()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    let options = options(&ManifestArgs {
        prometheus: true,
        ..ManifestArgs::default()
    });
    assert!(!ALERTS.is_empty());
    for alert in ALERTS {
        let expr = alert_expr(alert, &options);
        let read: Vec<&str> = expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("pod_checkpointer_"))
            .collect();
        // kube-state-metrics' DaemonSet status: per DaemonSet, from its own job.
        if expr.contains("kube_daemonset_status_") {
            assert!(read.is_empty(), "{}: {expr}", alert.name);
            assert!(
                expr.contains(r#"namespace="kube-system", daemonset="pod-checkpointer""#),
                "{}: {expr}",
                alert.name
            );
            continue;
        }
        assert!(!read.is_empty() || expr.contains("up{"), "{}: {expr}", alert.name);
        for name in read {
            assert!(
                exported.iter().any(|e| e == name),
                "{}: {name} is not exported",
                alert.name
            );
        }
        assert!(expr.contains("by (node)"), "{}: {expr}", alert.name);
        assert!(
            expr.contains("job=\"kube-system/pod-checkpointer\""),
            "{}: {expr}",
            alert.name
        );
        // Without templates, the promtool test (xtask/tests/alerts.rs) can expect them verbatim.
        assert!(!alert.description.contains("{{"), "{}: no templates", alert.name);
    }
}
