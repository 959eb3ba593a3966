//! The client against `ckpt-testkit`'s fake runtime: negotiation, fallback, timeouts,
//! reconnection, and stopping a pod.

use std::time::Duration;

use ckpt_cri::{ApiVersion, Error, RuntimeClient, Stopped, proto};
use ckpt_testkit::FakeCri;

const TIMEOUT: Duration = Duration::from_secs(2);

fn client(fake: &FakeCri) -> RuntimeClient {
    RuntimeClient::new(&fake.endpoint(), TIMEOUT).unwrap()
}

#[tokio::test]
async fn negotiates_v1_when_served() {
    let fake = FakeCri::start(true, true);
    let cri = client(&fake);
    let (api, version) = cri.version().await.unwrap();
    assert_eq!(api, ApiVersion::V1);
    assert_eq!(
        (version.runtime_name.as_str(), version.runtime_version.as_str()),
        ("fake", "1.0")
    );
    assert_eq!(
        fake.calls(),
        vec![
            "/runtime.v1.RuntimeService/Version",
            "/runtime.v1.RuntimeService/Version"
        ]
    );
}

#[tokio::test]
async fn falls_back_to_v1alpha2_and_caches_the_choice() {
    let fake = FakeCri::start(false, true);
    let cri = client(&fake);
    assert_eq!(cri.api().await.unwrap(), ApiVersion::V1alpha2);
    cri.list_pod_sandbox(None).await.unwrap();
    cri.list_containers(None).await.unwrap();
    let calls = fake.calls();
    assert_eq!(
        calls[..2],
        [
            "/runtime.v1.RuntimeService/Version",
            "/runtime.v1alpha2.RuntimeService/Version"
        ]
    );
    assert_eq!(
        calls[2..],
        [
            "/runtime.v1alpha2.RuntimeService/ListPodSandbox",
            "/runtime.v1alpha2.RuntimeService/ListContainers"
        ]
    );
    assert_eq!(cri.version().await.unwrap().0, ApiVersion::V1alpha2);
}

#[tokio::test]
async fn a_runtime_serving_neither_version_is_unsupported() {
    let fake = FakeCri::start(false, false);
    let err = client(&fake).list_pod_sandbox(None).await.unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
}

#[tokio::test]
async fn lists_pass_the_filter_to_the_runtime() {
    let fake = FakeCri::start(true, false);
    fake.add_pod("ns", "up", proto::SANDBOX_READY, &[proto::CONTAINER_RUNNING]);
    fake.add_pod("ns", "down", proto::SANDBOX_NOTREADY, &[proto::CONTAINER_EXITED]);
    let cri = client(&fake);
    let ready = proto::PodSandboxFilter {
        state: Some(proto::PodSandboxStateValue {
            state: proto::SANDBOX_READY,
        }),
        ..Default::default()
    };
    let sandboxes = cri.list_pod_sandbox(Some(ready)).await.unwrap();
    let pods: Vec<_> = sandboxes.iter().filter_map(|s| s.pod()).collect();
    assert_eq!(pods, [("ns", "up")]);
    let exited = proto::ContainerFilter {
        state: Some(proto::ContainerStateValue {
            state: proto::CONTAINER_EXITED,
        }),
        ..Default::default()
    };
    let containers = cri.list_containers(Some(exited)).await.unwrap();
    let pods: Vec<_> = containers.iter().filter_map(|c| c.pod()).collect();
    assert_eq!(pods, [("ns", "down")]);
    assert_eq!(cri.list_containers(None).await.unwrap().len(), 2);
}

#[tokio::test]
async fn stop_pod_stops_its_live_containers_then_its_ready_sandboxes() {
    let fake = FakeCri::start(false, true);
    fake.add_pod(
        "ns",
        "victim",
        proto::SANDBOX_READY,
        &[
            proto::CONTAINER_RUNNING,
            proto::CONTAINER_RUNNING,
            proto::CONTAINER_EXITED,
        ],
    );
    fake.add_pod(
        "ns",
        "bystander",
        proto::SANDBOX_READY,
        &[proto::CONTAINER_RUNNING],
    );
    let cri = client(&fake);
    assert_eq!(
        cri.stop_pod("ns", "victim").await.unwrap(),
        Stopped {
            containers: 2,
            sandboxes: 1
        }
    );
    let stops: Vec<String> = fake.calls().into_iter().filter(|c| c.contains("/Stop")).collect();
    assert_eq!(
        stops,
        [
            "/runtime.v1alpha2.RuntimeService/StopContainer",
            "/runtime.v1alpha2.RuntimeService/StopContainer",
            "/runtime.v1alpha2.RuntimeService/StopPodSandbox"
        ]
    );
    let sandboxes = cri.list_pod_sandbox(None).await.unwrap();
    let ready: Vec<_> = sandboxes
        .iter()
        .filter(|s| s.state == proto::SANDBOX_READY)
        .filter_map(|s| s.pod())
        .collect();
    assert_eq!(ready, [("ns", "bystander")]);

    // A stopped pod, and one the runtime never heard of, have nothing left to stop.
    for name in ["victim", "nobody"] {
        let err = cri.stop_pod("ns", name).await.unwrap_err();
        assert!(matches!(err, Error::PodNotRunning { .. }), "{err}");
        assert!(err.to_string().contains(&format!("ns/{name}")), "{err}");
    }
}

#[tokio::test]
async fn a_vanished_runtime_is_an_error_and_a_new_one_is_renegotiated() {
    let fake = FakeCri::start(true, false);
    let cri = client(&fake);
    assert_eq!(cri.api().await.unwrap(), ApiVersion::V1);
    fake.stop();
    let err = cri.list_pod_sandbox(None).await.unwrap_err();
    assert!(matches!(err, Error::Call { .. } | Error::Timeout { .. }), "{err}");
    assert!(
        err.to_string().contains(&fake.socket.display().to_string()),
        "{err}"
    );

    // An older runtime comes up on the same socket: the client renegotiates.
    let replacement = FakeCri::start_at(&fake.socket, false, true);
    replacement.add_pod("ns", "p", proto::SANDBOX_READY, &[]);
    assert_eq!(cri.list_pod_sandbox(None).await.unwrap().len(), 1);
    assert_eq!(cri.api().await.unwrap(), ApiVersion::V1alpha2);
}

#[tokio::test]
async fn a_runtime_that_never_answers_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("hung.sock");
    // Bound but never accepted: the connection sits in the backlog.
    let _listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let cri = RuntimeClient::new(socket.to_str().unwrap(), Duration::from_millis(200)).unwrap();
    let started = tokio::time::Instant::now();
    let err = cri.list_pod_sandbox(None).await.unwrap_err();
    assert!(matches!(err, Error::Timeout { .. } | Error::Call { .. }), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}
