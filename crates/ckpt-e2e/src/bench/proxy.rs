//! Counting proxies between the agent and the node: the agent's only requests to the
//! container runtime and the kubelet go through them, so their counts are the agent's load on
//! those (the hollow kubelet talks to its fake runtime in-process and on the same socket, so
//! the runtime's side cannot tell the agent's calls apart).
//!
//! - CRI (gRPC, HTTP/2 over a unix socket): one call is one client-initiated stream, opened by
//!   one HEADERS frame, so the proxy counts HEADERS frames from the agent.
//! - kubelet (HTTP/1.1 GETs over TCP): one request is one header block, ended by an empty
//!   line, so the proxy counts `\r\n\r\n` from the agent.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;

use anyhow::Context;

/// A proxy running on background threads (for the rest of the process) and its count.
pub(crate) struct CountingProxy {
    requests: Arc<AtomicU64>,
    /// What to give the agent: `unix:///path` or `http://127.0.0.1:PORT`.
    pub(crate) endpoint: String,
}

impl CountingProxy {
    /// Requests the agent sent through the proxy so far.
    pub(crate) fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }

    /// A gRPC proxy listening on `listen` in front of the unix socket `upstream`.
    pub(crate) fn grpc_unix(listen: &Path, upstream: &Path) -> anyhow::Result<CountingProxy> {
        let _ = std::fs::remove_file(listen);
        let listener =
            UnixListener::bind(listen).with_context(|| format!("cannot listen on {}", listen.display()))?;
        let requests = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&requests);
        let upstream = upstream.to_owned();
        thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let upstream_path: PathBuf = upstream.clone();
                let counter = Arc::clone(&counter);
                thread::spawn(move || {
                    if let Ok(server) = UnixStream::connect(&upstream_path) {
                        let _ = relay(client, server, Http2Requests::default(), &counter);
                    }
                });
            }
        });
        Ok(CountingProxy {
            requests,
            endpoint: format!("unix://{}", listen.display()),
        })
    }

    /// An HTTP/1.1 proxy on a free loopback port in front of `upstream`.
    pub(crate) fn http_tcp(upstream: SocketAddr) -> anyhow::Result<CountingProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").context("cannot listen on loopback")?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let requests = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&requests);
        thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let counter = Arc::clone(&counter);
                thread::spawn(move || {
                    if let Ok(server) = TcpStream::connect(upstream) {
                        let _ = relay(client, server, Http1Requests::default(), &counter);
                    }
                });
            }
        });
        Ok(CountingProxy { requests, endpoint })
    }
}

/// A byte stream both ways, whose write half can be closed.
trait Duplex: Read + Write + Send + Sized + 'static {
    fn duplicate(&self) -> io::Result<Self>;
    fn close_write(&self);
}

impl Duplex for UnixStream {
    fn duplicate(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn close_write(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
}

impl Duplex for TcpStream {
    fn duplicate(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn close_write(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
}

/// Counts requests in the client's byte stream, fed in arbitrary chunks.
trait RequestCounter: Send + 'static {
    /// Requests completed (or begun) in `bytes`.
    fn feed(&mut self, bytes: &[u8]) -> u64;
}

/// Copies both ways until either side closes; counts the client's requests.
fn relay<S: Duplex>(
    mut client: S,
    mut server: S,
    mut counter: impl RequestCounter,
    count: &AtomicU64,
) -> io::Result<()> {
    let (mut server_reader, mut client_writer) = (server.duplicate()?, client.duplicate()?);
    let answers = thread::spawn(move || {
        let _ = io::copy(&mut server_reader, &mut client_writer);
        client_writer.close_write();
    });
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match client.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        count.fetch_add(counter.feed(&buf[..n]), Ordering::SeqCst);
        if server.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    server.close_write();
    let _ = answers.join();
    Ok(())
}

/// HTTP/2 with prior knowledge: the 24-byte connection preface, then frames of a 9-byte
/// header (24-bit length, type, flags, stream id) and a payload. Type 1 is HEADERS.
struct Http2Requests {
    preface_left: usize,
    header: Vec<u8>,
    payload_left: usize,
}

impl Default for Http2Requests {
    fn default() -> Self {
        Http2Requests {
            preface_left: b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".len(),
            header: Vec::with_capacity(9),
            payload_left: 0,
        }
    }
}

const HTTP2_HEADERS: u8 = 1;

impl RequestCounter for Http2Requests {
    fn feed(&mut self, mut bytes: &[u8]) -> u64 {
        let mut requests = 0;
        while !bytes.is_empty() {
            let skip = if self.preface_left > 0 {
                &mut self.preface_left
            } else if self.payload_left > 0 {
                &mut self.payload_left
            } else {
                let take = (9 - self.header.len()).min(bytes.len());
                self.header.extend_from_slice(&bytes[..take]);
                bytes = &bytes[take..];
                if self.header.len() == 9 {
                    let h = &self.header;
                    self.payload_left = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                    requests += u64::from(h[3] == HTTP2_HEADERS);
                    self.header.clear();
                }
                continue;
            };
            let take = (*skip).min(bytes.len());
            *skip -= take;
            bytes = &bytes[take..];
        }
        requests
    }
}

/// HTTP/1.1 requests without bodies (the agent only GETs): each ends with `\r\n\r\n`.
#[derive(Default)]
struct Http1Requests {
    /// How much of `\r\n\r\n` the stream ended with.
    matched: usize,
}

impl RequestCounter for Http1Requests {
    fn feed(&mut self, bytes: &[u8]) -> u64 {
        const END: &[u8] = b"\r\n\r\n";
        let mut requests = 0;
        for &b in bytes {
            self.matched = if b == END[self.matched] {
                self.matched + 1
            } else {
                usize::from(b == b'\r')
            };
            if self.matched == END.len() {
                requests += 1;
                self.matched = 0;
            }
        }
        requests
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, 0];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// Feeds `stream` in chunks of `chunk` bytes; the total count must not depend on it.
    fn check(counter: impl Fn() -> Box<dyn RequestCounter>, stream: &[u8], expected: u64) {
        for chunk in [1, 2, 7, 100, stream.len().max(1)] {
            let mut c = counter();
            let got: u64 = stream.chunks(chunk).map(|part| c.feed(part)).sum();
            assert_eq!(got, expected, "chunks of {chunk}");
        }
    }

    #[test]
    fn http2_counts_headers_frames_after_the_preface() {
        let mut stream = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        stream.extend(frame(4, 0, &[0; 12])); // SETTINGS
        stream.extend(frame(1, 1, &[1; 40])); // HEADERS: a call
        stream.extend(frame(0, 1, &[1; 300])); // DATA, whose bytes may look like headers
        stream.extend(frame(8, 0, &[0; 4])); // WINDOW_UPDATE
        stream.extend(frame(1, 3, &[])); // another call
        stream.extend(frame(6, 0, &[0; 8])); // PING
        check(|| Box::new(Http2Requests::default()), &stream, 2);
        check(|| Box::new(Http2Requests::default()), b"PRI * HTTP/2.0\r\n", 0);
    }

    #[test]
    fn http1_counts_header_blocks() {
        let one = b"GET /pods HTTP/1.1\r\nHost: x\r\n\r\n";
        let mut stream = one.to_vec();
        stream.extend_from_slice(b"GET /pods HTTP/1.1\r\r\nHost: y\r\n\r\n");
        check(|| Box::new(Http1Requests::default()), &stream, 2);
        check(|| Box::new(Http1Requests::default()), b"GET / HTTP/1.1\r\n", 0);
    }
}
