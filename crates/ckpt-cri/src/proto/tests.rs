//! Golden bytes for every message, so that a wrong field number or wire type cannot pass
//! unnoticed on both the client and the fake runtime that share these structs.
//!
//! Each expected encoding is written out by hand from the field numbers and types in
//! `k8s.io/cri-api` `pkg/apis/runtime/v1/api.proto` and
//! `pkg/apis/runtime/v1alpha2/api.proto` (identical for these messages; e.g.
//! `message Container { string id = 1; string pod_sandbox_id = 2; ContainerMetadata
//! metadata = 3; ImageSpec image = 4; string image_ref = 5; ContainerState state = 6;
//! int64 created_at = 7; map<string, string> labels = 8; map<string, string> annotations
//! = 9; }`). A key byte is `field << 3 | wire type` (0 varint, 2 length-delimited); a map
//! entry is a length-delimited message with the key as field 1 and the value as field 2;
//! proto3 leaves zero values off the wire, but a present sub-message is sent even when
//! empty.

use std::collections::BTreeMap;
use std::fmt::Debug;

use prost::Message;

use super::*;

/// One message: its encoding, and whether the hand-written bytes decode back to it.
struct Case {
    name: &'static str,
    encoded: Vec<u8>,
    expected: Vec<u8>,
    decoded_back: Result<(), String>,
}

fn case<M: Message + Default + PartialEq + Debug>(name: &'static str, value: M, expected: &[&[u8]]) -> Case {
    let expected = expected.concat();
    let decoded_back = match M::decode(expected.as_slice()) {
        Ok(decoded) if decoded == value => Ok(()),
        Ok(decoded) => Err(format!("decodes to {decoded:?}, not {value:?}")),
        Err(e) => Err(format!("does not decode: {e}")),
    };
    Case {
        name,
        encoded: value.encode_to_vec(),
        expected,
        decoded_back,
    }
}

fn check(case: Case) {
    assert_eq!(
        case.encoded, case.expected,
        "{}: encoding (left) differs from the golden bytes (right)",
        case.name
    );
    if let Err(why) = case.decoded_back {
        panic!("{}: the golden bytes {why}", case.name);
    }
}

fn map(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
    entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn messages_encode_as_the_upstream_proto_says() {
    let cases = [
        // VersionRequest { string version = 1; }
        case(
            "VersionRequest",
            VersionRequest {
                version: "0.1.0".into(),
            },
            &[&[0x0a, 5], b"0.1.0"],
        ),
        // VersionResponse { string version = 1; string runtime_name = 2;
        //                   string runtime_version = 3; string runtime_api_version = 4; }
        case(
            "VersionResponse",
            VersionResponse {
                version: "0.1.0".into(),
                runtime_name: "containerd".into(),
                runtime_version: "v1.7.0".into(),
                runtime_api_version: "v1".into(),
            },
            &[
                &[0x0a, 5],
                b"0.1.0",
                &[0x12, 10],
                b"containerd",
                &[0x1a, 6],
                b"v1.7.0",
                &[0x22, 2],
                b"v1",
            ],
        ),
        // PodSandboxMetadata { string name = 1; string uid = 2; string namespace = 3;
        //                      uint32 attempt = 4; }
        case(
            "PodSandboxMetadata",
            PodSandboxMetadata {
                name: "web".into(),
                uid: "u1".into(),
                namespace: "ns".into(),
                attempt: 2,
            },
            &[
                &[0x0a, 3],
                b"web",
                &[0x12, 2],
                b"u1",
                &[0x1a, 2],
                b"ns",
                &[0x20, 2],
            ],
        ),
        // PodSandboxStateValue { PodSandboxState state = 1; }
        // enum PodSandboxState { SANDBOX_READY = 0; SANDBOX_NOTREADY = 1; }
        case(
            "PodSandboxStateValue SANDBOX_READY",
            PodSandboxStateValue { state: SANDBOX_READY },
            &[],
        ),
        case(
            "PodSandboxStateValue SANDBOX_NOTREADY",
            PodSandboxStateValue {
                state: SANDBOX_NOTREADY,
            },
            &[&[0x08, 1]],
        ),
        // PodSandboxFilter { string id = 1; PodSandboxStateValue state = 2;
        //                    map<string, string> label_selector = 3; }
        case(
            "PodSandboxFilter",
            PodSandboxFilter {
                id: "sb".into(),
                state: Some(PodSandboxStateValue {
                    state: SANDBOX_NOTREADY,
                }),
                label_selector: map(&[("app", "web")]),
            },
            &[
                &[0x0a, 2],
                b"sb",
                &[0x12, 2, 0x08, 1],
                &[0x1a, 10, 0x0a, 3],
                b"app",
                &[0x12, 3],
                b"web",
            ],
        ),
        // ListPodSandboxRequest { PodSandboxFilter filter = 1; }: the agent's "ready
        // sandboxes" filter is a present filter holding a present, empty state value.
        case(
            "ListPodSandboxRequest ready",
            ListPodSandboxRequest {
                filter: Some(PodSandboxFilter {
                    state: Some(PodSandboxStateValue { state: SANDBOX_READY }),
                    ..Default::default()
                }),
            },
            &[&[0x0a, 2, 0x12, 0]],
        ),
        case("ListPodSandboxRequest all", ListPodSandboxRequest::default(), &[]),
        // PodSandbox { string id = 1; PodSandboxMetadata metadata = 2;
        //              PodSandboxState state = 3; int64 created_at = 4;
        //              map<string, string> labels = 5; map<string, string> annotations = 6; }
        case(
            "PodSandbox",
            PodSandbox {
                id: "sb1".into(),
                metadata: Some(PodSandboxMetadata {
                    name: "web".into(),
                    namespace: "ns".into(),
                    ..Default::default()
                }),
                state: SANDBOX_NOTREADY,
                created_at: 300,
                labels: map(&[("k", "v")]),
                annotations: map(&[("a", "b")]),
            },
            &[
                &[0x0a, 3],
                b"sb1",
                &[0x12, 9, 0x0a, 3],
                b"web",
                &[0x1a, 2],
                b"ns",
                &[0x18, 1],
                // 300 = 0b10_0101100: low seven bits with the continuation bit, then 2
                &[0x20, 0xac, 0x02],
                &[0x2a, 6, 0x0a, 1, b'k', 0x12, 1, b'v'],
                &[0x32, 6, 0x0a, 1, b'a', 0x12, 1, b'b'],
            ],
        ),
        // ListPodSandboxResponse { repeated PodSandbox items = 1; }
        case(
            "ListPodSandboxResponse",
            ListPodSandboxResponse {
                items: vec![
                    PodSandbox {
                        id: "a".into(),
                        ..Default::default()
                    },
                    PodSandbox {
                        id: "b".into(),
                        state: SANDBOX_NOTREADY,
                        ..Default::default()
                    },
                ],
            },
            &[&[0x0a, 3, 0x0a, 1, b'a'], &[0x0a, 5, 0x0a, 1, b'b', 0x18, 1]],
        ),
        // ContainerMetadata { string name = 1; uint32 attempt = 2; }
        case(
            "ContainerMetadata",
            ContainerMetadata {
                name: "c0".into(),
                attempt: 1,
            },
            &[&[0x0a, 2], b"c0", &[0x10, 1]],
        ),
        // ContainerStateValue { ContainerState state = 1; }
        // enum ContainerState { CONTAINER_CREATED = 0; CONTAINER_RUNNING = 1;
        //                       CONTAINER_EXITED = 2; CONTAINER_UNKNOWN = 3; }
        case(
            "ContainerStateValue CONTAINER_CREATED",
            ContainerStateValue {
                state: CONTAINER_CREATED,
            },
            &[],
        ),
        case(
            "ContainerStateValue CONTAINER_RUNNING",
            ContainerStateValue {
                state: CONTAINER_RUNNING,
            },
            &[&[0x08, 1]],
        ),
        case(
            "ContainerStateValue CONTAINER_EXITED",
            ContainerStateValue {
                state: CONTAINER_EXITED,
            },
            &[&[0x08, 2]],
        ),
        case(
            "ContainerStateValue CONTAINER_UNKNOWN",
            ContainerStateValue {
                state: CONTAINER_UNKNOWN,
            },
            &[&[0x08, 3]],
        ),
        // ContainerFilter { string id = 1; ContainerStateValue state = 2;
        //                   string pod_sandbox_id = 3; map<string, string> label_selector = 4; }
        case(
            "ContainerFilter",
            ContainerFilter {
                id: "c".into(),
                state: Some(ContainerStateValue {
                    state: CONTAINER_RUNNING,
                }),
                pod_sandbox_id: "sb".into(),
                label_selector: map(&[("k", "v")]),
            },
            &[
                &[0x0a, 1, b'c'],
                &[0x12, 2, 0x08, 1],
                &[0x1a, 2],
                b"sb",
                &[0x22, 6, 0x0a, 1, b'k', 0x12, 1, b'v'],
            ],
        ),
        // ListContainersRequest { ContainerFilter filter = 1; }
        case(
            "ListContainersRequest running",
            ListContainersRequest {
                filter: Some(ContainerFilter {
                    state: Some(ContainerStateValue {
                        state: CONTAINER_RUNNING,
                    }),
                    ..Default::default()
                }),
            },
            &[&[0x0a, 4, 0x12, 2, 0x08, 1]],
        ),
        case("ListContainersRequest all", ListContainersRequest::default(), &[]),
        // Container: see the module docs; field 4 (image) is not modelled.
        case(
            "Container",
            Container {
                id: "c1".into(),
                pod_sandbox_id: "sb1".into(),
                metadata: Some(ContainerMetadata {
                    name: "c0".into(),
                    attempt: 0,
                }),
                image_ref: "img".into(),
                state: CONTAINER_RUNNING,
                created_at: 1,
                labels: map(&[("k", "v")]),
                annotations: map(&[("a", "b")]),
            },
            &[
                &[0x0a, 2],
                b"c1",
                &[0x12, 3],
                b"sb1",
                &[0x1a, 4, 0x0a, 2],
                b"c0",
                &[0x2a, 3],
                b"img",
                &[0x30, 1],
                &[0x38, 1],
                &[0x42, 6, 0x0a, 1, b'k', 0x12, 1, b'v'],
                &[0x4a, 6, 0x0a, 1, b'a', 0x12, 1, b'b'],
            ],
        ),
        // ListContainersResponse { repeated Container containers = 1; }
        case(
            "ListContainersResponse",
            ListContainersResponse {
                containers: vec![Container {
                    id: "x".into(),
                    state: CONTAINER_EXITED,
                    ..Default::default()
                }],
            },
            &[&[0x0a, 5, 0x0a, 1, b'x', 0x30, 2]],
        ),
        // StopContainerRequest { string container_id = 1; int64 timeout = 2; }
        case(
            "StopContainerRequest",
            StopContainerRequest {
                container_id: "c1".into(),
                timeout: 10,
            },
            &[&[0x0a, 2], b"c1", &[0x10, 10]],
        ),
        // StopContainerResponse {}
        case("StopContainerResponse", StopContainerResponse {}, &[]),
        // StopPodSandboxRequest { string pod_sandbox_id = 1; }
        case(
            "StopPodSandboxRequest",
            StopPodSandboxRequest {
                pod_sandbox_id: "sb1".into(),
            },
            &[&[0x0a, 3], b"sb1"],
        ),
        // StopPodSandboxResponse {}
        case("StopPodSandboxResponse", StopPodSandboxResponse {}, &[]),
    ];
    for c in cases {
        check(c);
    }
}

/// Which pod a listed sandbox or container belongs to.
mod pod_identity {
    use super::*;

    fn check(sandbox: &PodSandbox, container: &Container, expected: Option<(&str, &str)>) {
        assert_eq!(sandbox.pod(), expected, "{sandbox:?}");
        // A container has no metadata naming its pod: only the labels count.
        let from_labels = labels_pod(&sandbox.labels);
        assert_eq!(container.pod(), from_labels, "{container:?}");
    }

    #[test]
    fn metadata_first_then_the_kubelet_labels() {
        let labels = map(&[(LABEL_POD_NAMESPACE, "ns-l"), (LABEL_POD_NAME, "name-l")]);
        let metadata = |namespace: &str, name: &str| {
            Some(PodSandboxMetadata {
                name: name.into(),
                namespace: namespace.into(),
                ..Default::default()
            })
        };
        let cases = [
            (metadata("ns", "web"), BTreeMap::new(), Some(("ns", "web"))),
            (metadata("ns", "web"), labels.clone(), Some(("ns", "web"))),
            (metadata("", "web"), labels.clone(), Some(("ns-l", "name-l"))),
            (None, labels.clone(), Some(("ns-l", "name-l"))),
            (None, map(&[(LABEL_POD_NAMESPACE, "ns-l")]), None),
            (
                None,
                map(&[(LABEL_POD_NAMESPACE, "ns-l"), (LABEL_POD_NAME, "")]),
                None,
            ),
            (metadata("ns", ""), BTreeMap::new(), None),
        ];
        for (metadata, labels, expected) in cases {
            let sandbox = PodSandbox {
                metadata,
                labels: labels.clone(),
                ..Default::default()
            };
            let container = Container {
                labels,
                ..Default::default()
            };
            check(&sandbox, &container, expected);
        }
    }
}
