//! A small synchronous client for the hollow kubelet's fake container runtime (CRI
//! `runtime.v1alpha2` `RuntimeService` on a unix socket): which pod sandboxes and containers
//! exist, and stopping a pod the way a crash would (DESIGN §4: StopContainer, then
//! StopPodSandbox; with `restartPolicy: Never` the kubelet then leaves it dead).
//!
//! Hand-written on purpose. A unary gRPC call is one HTTP/2 stream with prior knowledge
//! ("h2c") carrying a length-prefixed protobuf message each way, so it needs only a handful
//! of frame types, literal HPACK request headers and a protobuf field walker. That keeps
//! xtask free of tonic and of the agent's crates, and keeps the suite's view of the runtime
//! independent of the agent's own CRI client (ckpt-watch), which is what is under test.
//! Response headers are not decoded (that would need HPACK's Huffman table): a call that
//! returns no message is reported as a gRPC error, whose details are in the hollow node's log.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};

/// The service every call goes to; kubemark 1.20's fake runtime speaks only v1alpha2.
const SERVICE: &str = "/runtime.v1alpha2.RuntimeService/";

/// The container labels the kubelet records a pod's namespace and name in.
const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";

/// A CRI runtime reached over a unix socket; every call opens its own connection.
#[derive(Clone, Debug)]
pub struct CriClient {
    socket: PathBuf,
    timeout: Duration,
}

/// A pod sandbox as the runtime lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sandbox {
    pub id: String,
    pub namespace: String,
    /// The pod's name; a static pod's is `<manifest name>-<node>`.
    pub name: String,
    /// `SANDBOX_READY` (as opposed to `SANDBOX_NOTREADY`, i.e. stopped).
    pub ready: bool,
}

/// A container as the runtime lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Container {
    pub id: String,
    pub sandbox_id: String,
    pub name: String,
    pub state: ContainerState,
    pub labels: BTreeMap<String, String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    Unknown,
}

/// What [`CriClient::stop_pod`] stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stopped {
    pub containers: usize,
    pub sandboxes: usize,
}

impl CriClient {
    /// A client for `socket` (a path, or `unix:///path`); nothing is dialled yet.
    pub fn new(socket: &str) -> CriClient {
        let path = socket.strip_prefix("unix://").unwrap_or(socket);
        CriClient {
            socket: PathBuf::from(path),
            timeout: Duration::from_secs(5),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Every pod sandbox, ready or stopped.
    pub fn sandboxes(&self) -> anyhow::Result<Vec<Sandbox>> {
        // An empty ListPodSandboxRequest: no filter.
        let response = self.call("ListPodSandbox", &[])?;
        let mut sandboxes = Vec::new();
        for field in pb::Fields::new(&response) {
            if let (1, pb::Value::Bytes(item)) = field? {
                sandboxes.push(decode_sandbox(item)?);
            }
        }
        Ok(sandboxes)
    }

    /// Every container, in any state.
    pub fn containers(&self) -> anyhow::Result<Vec<Container>> {
        let response = self.call("ListContainers", &[])?;
        let mut containers = Vec::new();
        for field in pb::Fields::new(&response) {
            if let (1, pb::Value::Bytes(item)) = field? {
                containers.push(decode_container(item)?);
            }
        }
        Ok(containers)
    }

    /// The pods (`namespace/name`) that have a ready sandbox: what the kubelet runs.
    pub fn running_pods(&self) -> anyhow::Result<BTreeSet<String>> {
        Ok(self
            .sandboxes()?
            .into_iter()
            .filter(|s| s.ready)
            .map(|s| format!("{}/{}", s.namespace, s.name))
            .collect())
    }

    /// Whether the pod has a ready sandbox.
    pub fn is_running(&self, namespace: &str, name: &str) -> anyhow::Result<bool> {
        Ok(self
            .sandboxes()?
            .iter()
            .any(|s| s.ready && s.namespace == namespace && s.name == name))
    }

    /// Stops a pod like a crash: `StopContainer` (no grace) for each of its containers that
    /// has not exited, then `StopPodSandbox` for each of its ready sandboxes. Fails when the
    /// runtime runs nothing of that pod.
    pub fn stop_pod(&self, namespace: &str, name: &str) -> anyhow::Result<Stopped> {
        let sandboxes: Vec<Sandbox> = self
            .sandboxes()?
            .into_iter()
            .filter(|s| s.namespace == namespace && s.name == name)
            .collect();
        let sandbox_ids: BTreeSet<&str> = sandboxes.iter().map(|s| s.id.as_str()).collect();
        let containers: Vec<Container> = self
            .containers()?
            .into_iter()
            .filter(|c| {
                sandbox_ids.contains(c.sandbox_id.as_str())
                    || (c.labels.get(LABEL_POD_NAMESPACE).map(String::as_str) == Some(namespace)
                        && c.labels.get(LABEL_POD_NAME).map(String::as_str) == Some(name))
            })
            .filter(|c| c.state != ContainerState::Exited)
            .collect();
        let ready: Vec<&Sandbox> = sandboxes.iter().filter(|s| s.ready).collect();
        if containers.is_empty() && ready.is_empty() {
            bail!(
                "the runtime at {} runs nothing of pod {namespace}/{name}",
                self.socket.display()
            );
        }
        for container in &containers {
            // StopContainerRequest { container_id = 1, timeout = 2 (0: no grace, omitted) }
            let mut request = Vec::new();
            pb::put_string(&mut request, 1, &container.id);
            self.call("StopContainer", &request)
                .with_context(|| format!("cannot stop container {} of {namespace}/{name}", container.name))?;
        }
        for sandbox in &ready {
            // StopPodSandboxRequest { pod_sandbox_id = 1 }
            let mut request = Vec::new();
            pb::put_string(&mut request, 1, &sandbox.id);
            self.call("StopPodSandbox", &request)
                .with_context(|| format!("cannot stop the sandbox of {namespace}/{name}"))?;
        }
        Ok(Stopped {
            containers: containers.len(),
            sandboxes: ready.len(),
        })
    }

    /// One unary call of `method` with an encoded request; returns the encoded response.
    fn call(&self, method: &str, request: &[u8]) -> anyhow::Result<Vec<u8>> {
        let path = format!("{SERVICE}{method}");
        let mut stream = UnixStream::connect(&self.socket)
            .with_context(|| format!("cannot connect to the CRI socket {}", self.socket.display()))?;
        stream.set_read_timeout(Some(self.timeout))?;
        stream.set_write_timeout(Some(self.timeout))?;
        h2::unary(&mut stream, &path, request).with_context(|| format!("CRI call {path} failed"))
    }
}

fn decode_sandbox(bytes: &[u8]) -> anyhow::Result<Sandbox> {
    // PodSandbox { id = 1, metadata = 2 { name = 1, uid = 2, namespace = 3 }, state = 3 }
    let mut sandbox = Sandbox {
        id: String::new(),
        namespace: String::new(),
        name: String::new(),
        // proto3 leaves the zero value (SANDBOX_READY) off the wire.
        ready: true,
    };
    for field in pb::Fields::new(bytes) {
        match field? {
            (1, pb::Value::Bytes(b)) => sandbox.id = pb::string(b)?,
            (2, pb::Value::Bytes(metadata)) => {
                for field in pb::Fields::new(metadata) {
                    match field? {
                        (1, pb::Value::Bytes(b)) => sandbox.name = pb::string(b)?,
                        (3, pb::Value::Bytes(b)) => sandbox.namespace = pb::string(b)?,
                        _ => {}
                    }
                }
            }
            (3, pb::Value::Varint(state)) => sandbox.ready = state == 0,
            _ => {}
        }
    }
    Ok(sandbox)
}

fn decode_container(bytes: &[u8]) -> anyhow::Result<Container> {
    // Container { id = 1, pod_sandbox_id = 2, metadata = 3 { name = 1 }, state = 6,
    //             labels = 8 (map<string, string>) }
    let mut container = Container {
        id: String::new(),
        sandbox_id: String::new(),
        name: String::new(),
        state: ContainerState::Created,
        labels: BTreeMap::new(),
    };
    for field in pb::Fields::new(bytes) {
        match field? {
            (1, pb::Value::Bytes(b)) => container.id = pb::string(b)?,
            (2, pb::Value::Bytes(b)) => container.sandbox_id = pb::string(b)?,
            (3, pb::Value::Bytes(metadata)) => {
                for field in pb::Fields::new(metadata) {
                    if let (1, pb::Value::Bytes(b)) = field? {
                        container.name = pb::string(b)?;
                    }
                }
            }
            (6, pb::Value::Varint(state)) => {
                container.state = match state {
                    0 => ContainerState::Created,
                    1 => ContainerState::Running,
                    2 => ContainerState::Exited,
                    _ => ContainerState::Unknown,
                }
            }
            (8, pb::Value::Bytes(entry)) => {
                let (key, value) = pb::map_entry(entry)?;
                container.labels.insert(key, value);
            }
            _ => {}
        }
    }
    Ok(container)
}

/// Just enough HTTP/2 (RFC 9113) for one unary gRPC call per connection.
mod h2 {
    use super::*;

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    const DATA: u8 = 0x0;
    const HEADERS: u8 = 0x1;
    const RST_STREAM: u8 = 0x3;
    const SETTINGS: u8 = 0x4;
    const PING: u8 = 0x6;
    const GOAWAY: u8 = 0x7;
    const WINDOW_UPDATE: u8 = 0x8;

    const FLAG_END_STREAM: u8 = 0x1;
    const FLAG_ACK: u8 = 0x1;
    const FLAG_END_HEADERS: u8 = 0x4;
    const FLAG_PADDED: u8 = 0x8;

    const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
    const DEFAULT_WINDOW: u32 = 65_535;
    const MAX_WINDOW: u32 = 0x7fff_ffff;
    /// Far above anything a runtime sends (the default maximum frame size is 16 KiB).
    const MAX_FRAME_LEN: usize = 16 << 20;

    /// The client's only stream.
    const STREAM: u32 = 1;

    pub(super) fn unary(stream: &mut UnixStream, path: &str, message: &[u8]) -> anyhow::Result<Vec<u8>> {
        let mut out = PREFACE.to_vec();
        // The largest receive windows allowed, so the server never waits for WINDOW_UPDATEs.
        let mut settings = SETTINGS_INITIAL_WINDOW_SIZE.to_be_bytes().to_vec();
        settings.extend(MAX_WINDOW.to_be_bytes());
        out.extend(frame(SETTINGS, 0, 0, &settings));
        out.extend(frame(
            WINDOW_UPDATE,
            0,
            0,
            &(MAX_WINDOW - DEFAULT_WINDOW).to_be_bytes(),
        ));
        out.extend(frame(HEADERS, FLAG_END_HEADERS, STREAM, &request_headers(path)));
        out.extend(frame(DATA, FLAG_END_STREAM, STREAM, &grpc_frame(message)));
        stream.write_all(&out).context("cannot send the request")?;

        let mut body = Vec::new();
        loop {
            let (kind, flags, stream_id, payload) = read_frame(stream)?;
            match kind {
                SETTINGS if flags & FLAG_ACK == 0 => stream.write_all(&frame(SETTINGS, FLAG_ACK, 0, &[]))?,
                PING if flags & FLAG_ACK == 0 => stream.write_all(&frame(PING, FLAG_ACK, 0, &payload))?,
                GOAWAY => {
                    let code = payload.get(4..8).map(be_u32).unwrap_or(0);
                    if code != 0 {
                        bail!("the runtime closed the connection (HTTP/2 error code {code})");
                    }
                }
                RST_STREAM if stream_id == STREAM => {
                    bail!(
                        "the runtime reset the call (HTTP/2 error code {})",
                        be_u32(&payload)
                    )
                }
                DATA if stream_id == STREAM => {
                    body.extend_from_slice(unpadded(flags, &payload)?);
                    if flags & FLAG_END_STREAM != 0 {
                        break;
                    }
                }
                // Response headers or trailers; only the end of the stream matters.
                HEADERS if stream_id == STREAM && flags & FLAG_END_STREAM != 0 => break,
                _ => {}
            }
        }
        grpc_message(&body)
    }

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
        let mut out = len.to_be_bytes()[1..].to_vec();
        out.push(kind);
        out.push(flags);
        out.extend(stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn read_frame(stream: &mut UnixStream) -> anyhow::Result<(u8, u8, u32, Vec<u8>)> {
        let mut header = [0u8; 9];
        stream
            .read_exact(&mut header)
            .context("the runtime closed the connection or did not answer in time")?;
        let len = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        anyhow::ensure!(len <= MAX_FRAME_LEN, "HTTP/2 frame of {len} bytes");
        let mut payload = vec![0u8; len];
        stream
            .read_exact(&mut payload)
            .context("truncated HTTP/2 frame")?;
        let stream_id = be_u32(&header[5..9]) & 0x7fff_ffff;
        Ok((header[3], header[4], stream_id, payload))
    }

    /// A DATA frame's payload without its padding.
    fn unpadded(flags: u8, payload: &[u8]) -> anyhow::Result<&[u8]> {
        if flags & FLAG_PADDED == 0 {
            return Ok(payload);
        }
        let (&pad, rest) = payload.split_first().context("empty padded frame")?;
        rest.get(..rest.len().saturating_sub(usize::from(pad)))
            .filter(|_| usize::from(pad) <= rest.len())
            .context("bad padding")
    }

    /// The request's header block: each a literal without indexing, with a new name.
    pub(super) fn request_headers(path: &str) -> Vec<u8> {
        let headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ];
        let mut block = Vec::new();
        for (name, value) in headers {
            block.push(0x00);
            hpack_string(&mut block, name);
            hpack_string(&mut block, value);
        }
        block
    }

    /// An HPACK string literal, not Huffman-coded: a 7-bit-prefix length, then the bytes.
    fn hpack_string(out: &mut Vec<u8>, value: &str) {
        hpack_integer(out, 7, 0x00, value.len());
        out.extend_from_slice(value.as_bytes());
    }

    /// An HPACK integer with an `prefix_bits` prefix in a first byte that starts with `high`.
    pub(super) fn hpack_integer(out: &mut Vec<u8>, prefix_bits: u32, high: u8, value: usize) {
        let max_prefix = (1usize << prefix_bits) - 1;
        if value < max_prefix {
            out.push(high | value as u8);
            return;
        }
        out.push(high | max_prefix as u8);
        let mut rest = value - max_prefix;
        while rest >= 0x80 {
            out.push((rest & 0x7f) as u8 | 0x80);
            rest >>= 7;
        }
        out.push(rest as u8);
    }

    /// A gRPC length-prefixed message: not compressed, big-endian length.
    pub(super) fn grpc_frame(message: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8];
        out.extend(u32::try_from(message.len()).unwrap_or(u32::MAX).to_be_bytes());
        out.extend_from_slice(message);
        out
    }

    /// The one message of a unary response; an error status comes without one.
    pub(super) fn grpc_message(body: &[u8]) -> anyhow::Result<Vec<u8>> {
        let Some((header, rest)) = body.split_at_checked(5) else {
            bail!("the runtime answered with a gRPC error status and no message (see the hollow node's log)");
        };
        anyhow::ensure!(header[0] == 0, "compressed gRPC responses are not supported");
        let len = be_u32(&header[1..5]) as usize;
        rest.get(..len)
            .map(<[u8]>::to_vec)
            .context("truncated gRPC message")
    }

    fn be_u32(bytes: &[u8]) -> u32 {
        bytes.iter().take(4).fold(0, |acc, b| acc << 8 | u32::from(*b))
    }
}

/// Just enough protobuf: writing strings, walking fields, reading strings and map entries.
mod pb {
    use anyhow::{Context, bail};

    pub(super) enum Value<'a> {
        Varint(u64),
        Bytes(&'a [u8]),
        /// A fixed 32- or 64-bit value (not used by the messages read here).
        Fixed,
    }

    pub(super) fn put_varint(out: &mut Vec<u8>, mut value: u64) {
        while value >= 0x80 {
            out.push((value & 0x7f) as u8 | 0x80);
            value >>= 7;
        }
        out.push(value as u8);
    }

    /// A string field (proto3: the empty string is left off the wire).
    pub(super) fn put_string(out: &mut Vec<u8>, field: u32, value: &str) {
        if value.is_empty() {
            return;
        }
        put_varint(out, u64::from(field) << 3 | 2);
        put_varint(out, value.len() as u64);
        out.extend_from_slice(value.as_bytes());
    }

    pub(super) fn string(bytes: &[u8]) -> anyhow::Result<String> {
        String::from_utf8(bytes.to_vec()).context("a protobuf string is not UTF-8")
    }

    /// A `map<string, string>` entry: { key = 1, value = 2 }.
    pub(super) fn map_entry(bytes: &[u8]) -> anyhow::Result<(String, String)> {
        let (mut key, mut value) = (String::new(), String::new());
        for field in Fields::new(bytes) {
            match field? {
                (1, Value::Bytes(b)) => key = string(b)?,
                (2, Value::Bytes(b)) => value = string(b)?,
                _ => {}
            }
        }
        Ok((key, value))
    }

    /// The fields of one message, in wire order.
    pub(super) struct Fields<'a> {
        rest: &'a [u8],
    }

    impl<'a> Fields<'a> {
        pub(super) fn new(bytes: &'a [u8]) -> Fields<'a> {
            Fields { rest: bytes }
        }

        fn varint(&mut self) -> anyhow::Result<u64> {
            let mut value = 0u64;
            for shift in (0..64).step_by(7) {
                let (&byte, rest) = self.rest.split_first().context("truncated varint")?;
                self.rest = rest;
                value |= u64::from(byte & 0x7f) << shift;
                if byte < 0x80 {
                    return Ok(value);
                }
            }
            bail!("varint longer than 10 bytes")
        }

        fn take(&mut self, len: usize) -> anyhow::Result<&'a [u8]> {
            let (taken, rest) = self
                .rest
                .split_at_checked(len)
                .context("truncated protobuf field")?;
            self.rest = rest;
            Ok(taken)
        }

        fn field(&mut self) -> anyhow::Result<(u32, Value<'a>)> {
            let key = self.varint()?;
            let number = u32::try_from(key >> 3).context("protobuf field number out of range")?;
            let value = match key & 7 {
                0 => Value::Varint(self.varint()?),
                1 => self.take(8).map(|_| Value::Fixed)?,
                2 => {
                    let len = usize::try_from(self.varint()?).context("protobuf length out of range")?;
                    Value::Bytes(self.take(len)?)
                }
                5 => self.take(4).map(|_| Value::Fixed)?,
                wire => bail!("unsupported protobuf wire type {wire}"),
            };
            Ok((number, value))
        }
    }

    impl<'a> Iterator for Fields<'a> {
        type Item = anyhow::Result<(u32, Value<'a>)>;

        fn next(&mut self) -> Option<Self::Item> {
            if self.rest.is_empty() {
                return None;
            }
            let field = self.field();
            if field.is_err() {
                // Stop after the first error rather than re-reading garbage.
                self.rest = &[];
            }
            Some(field)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(fields: &[(u32, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (number, bytes) in fields {
            pb::put_varint(&mut out, u64::from(*number) << 3 | 2);
            pb::put_varint(&mut out, bytes.len() as u64);
            out.extend_from_slice(bytes);
        }
        out
    }

    fn varint_field(number: u32, value: u64) -> Vec<u8> {
        let mut out = Vec::new();
        pb::put_varint(&mut out, u64::from(number) << 3);
        pb::put_varint(&mut out, value);
        out
    }

    #[test]
    fn sandboxes_decode_with_ready_as_the_default_state() {
        let metadata = message(&[(1, b"kube-apiserver-node-1"), (2, b"uid"), (3, b"kube-system")]);
        let ready = message(&[(1, b"sb1"), (2, &metadata)]);
        let mut stopped = message(&[(1, b"sb2"), (2, &metadata)]);
        stopped.extend(varint_field(3, 1));
        let sandbox = decode_sandbox(&ready).unwrap();
        assert_eq!(
            sandbox,
            Sandbox {
                id: "sb1".into(),
                namespace: "kube-system".into(),
                name: "kube-apiserver-node-1".into(),
                ready: true
            }
        );
        assert!(!decode_sandbox(&stopped).unwrap().ready);
    }

    #[test]
    fn containers_decode_with_state_and_labels() {
        let metadata = message(&[(1, b"apiserver")]);
        let label = message(&[(1, b"io.kubernetes.pod.name"), (2, b"kube-apiserver")]);
        let mut bytes = message(&[(1, b"c1"), (2, b"sb1"), (3, &metadata), (4, b"image")]);
        bytes.extend(varint_field(6, 2));
        bytes.extend(varint_field(7, 1_700_000_000));
        bytes.extend(message(&[(8, &label)]));
        let container = decode_container(&bytes).unwrap();
        assert_eq!(container.id, "c1");
        assert_eq!(container.sandbox_id, "sb1");
        assert_eq!(container.name, "apiserver");
        assert_eq!(container.state, ContainerState::Exited);
        assert_eq!(container.labels[LABEL_POD_NAME], "kube-apiserver");
    }

    #[test]
    fn truncated_protobuf_is_an_error_not_a_panic() {
        let bytes = message(&[(1, b"abcdef")]);
        assert!(decode_sandbox(&bytes[..4]).is_err());
        assert!(decode_container(&[0xff; 11]).is_err());
    }

    #[test]
    fn strings_encode_as_length_delimited_fields() {
        let mut out = Vec::new();
        pb::put_string(&mut out, 1, "abc");
        pb::put_string(&mut out, 2, "");
        assert_eq!(out, [0x0a, 3, b'a', b'b', b'c']);
    }

    #[test]
    fn hpack_integers_use_the_prefix_then_continuation_bytes() {
        // RFC 7541 C.1.1 and C.1.2: 10 and 1337 with a 5-bit prefix.
        let mut out = Vec::new();
        h2::hpack_integer(&mut out, 5, 0, 10);
        assert_eq!(out, [10]);
        out.clear();
        h2::hpack_integer(&mut out, 5, 0, 1337);
        assert_eq!(out, [31, 154, 10]);
    }

    #[test]
    fn request_headers_are_literals_with_new_names() {
        let block = h2::request_headers("/runtime.v1alpha2.RuntimeService/ListPodSandbox");
        assert_eq!(&block[..9], b"\x00\x07:method");
        assert_eq!(&block[9..14], b"\x04POST");
        let text = String::from_utf8_lossy(&block);
        assert!(text.contains("application/grpc"));
    }

    #[test]
    fn grpc_messages_are_length_prefixed() {
        let framed = h2::grpc_frame(b"hello");
        assert_eq!(framed, b"\x00\x00\x00\x00\x05hello");
        assert_eq!(h2::grpc_message(&framed).unwrap(), b"hello");
        assert_eq!(h2::grpc_message(b"\x00\x00\x00\x00\x00").unwrap(), b"");
        assert!(h2::grpc_message(b"").is_err(), "no message: an error status");
        assert!(h2::grpc_message(b"\x00\x00\x00\x00\x09short").is_err());
    }
}
