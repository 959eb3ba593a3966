//! The `RuntimeService` methods and their gRPC paths, for the client and for fake
//! runtimes that route requests by path.

/// The CRI API version a runtime speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ApiVersion {
    /// `runtime.v1` (Kubernetes ≥ 1.23, current runtimes).
    V1,
    /// `runtime.v1alpha2` (older runtimes, the hollow kubelet's fake runtime).
    V1alpha2,
}

impl ApiVersion {
    /// Both, in the order the client tries them.
    pub const ALL: [ApiVersion; 2] = [ApiVersion::V1, ApiVersion::V1alpha2];

    /// `v1` or `v1alpha2`.
    pub fn as_str(self) -> &'static str {
        match self {
            ApiVersion::V1 => "v1",
            ApiVersion::V1alpha2 => "v1alpha2",
        }
    }
}

impl std::fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `RuntimeService` methods this crate has messages for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// `Version(VersionRequest) returns (VersionResponse)`.
    Version,
    /// `ListPodSandbox(ListPodSandboxRequest) returns (ListPodSandboxResponse)`.
    ListPodSandbox,
    /// `ListContainers(ListContainersRequest) returns (ListContainersResponse)`.
    ListContainers,
    /// `StopContainer(StopContainerRequest) returns (StopContainerResponse)`.
    StopContainer,
    /// `StopPodSandbox(StopPodSandboxRequest) returns (StopPodSandboxResponse)`.
    StopPodSandbox,
}

/// `$api` × `$method` → `"/runtime.<api>.RuntimeService/<Method>"`, written out by the
/// macro so every path is a `&'static str` (tonic takes a static path).
macro_rules! paths {
    ($api:expr, $method:expr, [$($m:ident),*]) => {
        match ($api, $method) {
            $(
                (ApiVersion::V1, Method::$m) => concat!("/runtime.v1.RuntimeService/", stringify!($m)),
                (ApiVersion::V1alpha2, Method::$m) => {
                    concat!("/runtime.v1alpha2.RuntimeService/", stringify!($m))
                }
            )*
        }
    };
}

impl Method {
    /// Every method.
    pub const ALL: [Method; 5] = [
        Method::Version,
        Method::ListPodSandbox,
        Method::ListContainers,
        Method::StopContainer,
        Method::StopPodSandbox,
    ];

    /// The gRPC path, e.g. `/runtime.v1.RuntimeService/ListPodSandbox`.
    pub fn path(self, api: ApiVersion) -> &'static str {
        paths!(
            api,
            self,
            [
                Version,
                ListPodSandbox,
                ListContainers,
                StopContainer,
                StopPodSandbox
            ]
        )
    }

    /// The API version and method a gRPC path names; `None` for any other path.
    pub fn parse(path: &str) -> Option<(ApiVersion, Method)> {
        ApiVersion::ALL
            .into_iter()
            .flat_map(|api| Method::ALL.into_iter().map(move |m| (api, m)))
            .find(|(api, m)| m.path(*api) == path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(api: ApiVersion, method: Method, expected: &str) {
        assert_eq!(method.path(api), expected);
        assert_eq!(Method::parse(expected), Some((api, method)), "{expected}");
    }

    #[test]
    fn paths_name_the_package_service_and_method() {
        let cases = [
            (
                ApiVersion::V1,
                Method::Version,
                "/runtime.v1.RuntimeService/Version",
            ),
            (
                ApiVersion::V1,
                Method::ListPodSandbox,
                "/runtime.v1.RuntimeService/ListPodSandbox",
            ),
            (
                ApiVersion::V1,
                Method::ListContainers,
                "/runtime.v1.RuntimeService/ListContainers",
            ),
            (
                ApiVersion::V1,
                Method::StopContainer,
                "/runtime.v1.RuntimeService/StopContainer",
            ),
            (
                ApiVersion::V1,
                Method::StopPodSandbox,
                "/runtime.v1.RuntimeService/StopPodSandbox",
            ),
            (
                ApiVersion::V1alpha2,
                Method::Version,
                "/runtime.v1alpha2.RuntimeService/Version",
            ),
            (
                ApiVersion::V1alpha2,
                Method::ListPodSandbox,
                "/runtime.v1alpha2.RuntimeService/ListPodSandbox",
            ),
            (
                ApiVersion::V1alpha2,
                Method::ListContainers,
                "/runtime.v1alpha2.RuntimeService/ListContainers",
            ),
            (
                ApiVersion::V1alpha2,
                Method::StopContainer,
                "/runtime.v1alpha2.RuntimeService/StopContainer",
            ),
            (
                ApiVersion::V1alpha2,
                Method::StopPodSandbox,
                "/runtime.v1alpha2.RuntimeService/StopPodSandbox",
            ),
        ];
        for (api, method, expected) in cases {
            check(api, method, expected);
        }
    }

    #[test]
    fn other_paths_are_not_methods() {
        for path in [
            "",
            "/runtime.v1.RuntimeService/RunPodSandbox",
            "/runtime.v1.ImageService/ListImages",
            "/runtime.v2.RuntimeService/Version",
            "/runtime.v1.RuntimeService/Version/",
        ] {
            assert_eq!(Method::parse(path), None, "{path}");
        }
    }
}
