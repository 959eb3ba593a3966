//! A plain-thread HTTP GET on the agent's health port, for tests that must not ask from
//! the runtime the agent runs on (or have none).

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

/// `(status code, body)` of `GET path` on `127.0.0.1:port`, or `None` if nothing answers
/// within `timeout`.
pub(crate) fn get(port: u16, path: &str, timeout: Duration) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Some((status, body))
}
