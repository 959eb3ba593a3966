//! A TCP proxy that breaks the network between a client and a server on demand.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// What the network between the client and the server does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetFault {
    /// Bytes pass both ways.
    Pass,
    /// Nothing passes and nothing is closed: the connections open now and those accepted
    /// while it holds go silent for good (a dropped route, a peer that lost power). The
    /// client's bytes are read and dropped, so the proxy sees the client close.
    Blackhole,
    /// Every open connection is reset (`RST`), and every new one as soon as it is accepted.
    Reset,
    /// The server's bytes reach the client at this many bytes per second, in slices of a
    /// tenth of it (a slow body); the client's pass as usual.
    Slow(u32),
}

/// The proxy's state as the connections see it.
#[derive(Clone, Copy, Debug)]
struct Weather {
    fault: NetFault,
    /// Bumped by [`FaultProxy::half_open`]: connections opened before the bump are dead.
    silenced: u64,
}

#[derive(Debug)]
struct Counts {
    accepted: AtomicU64,
    open: AtomicU64,
}

/// A TCP proxy on `127.0.0.1:<random port>` in front of one upstream address, with a
/// [`NetFault`] to apply and [`FaultProxy::half_open`] to silence the open connections.
/// It counts the connections it accepted and those still open, so a test can check that
/// a client's connections stay bounded whatever the network does. Dropping it closes
/// everything.
#[derive(Debug)]
pub struct FaultProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    weather: watch::Sender<Weather>,
    counts: Arc<Counts>,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// A proxy to `upstream`, passing bytes until told otherwise.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let (weather, _) = watch::channel(Weather {
            fault: NetFault::Pass,
            silenced: 0,
        });
        let counts = Arc::new(Counts {
            accepted: AtomicU64::new(0),
            open: AtomicU64::new(0),
        });
        let task = {
            let weather = weather.clone();
            let counts = Arc::clone(&counts);
            tokio::spawn(async move {
                let mut connections = JoinSet::new();
                while let Ok((client, _)) = listener.accept().await {
                    counts.accepted.fetch_add(1, Ordering::SeqCst);
                    counts.open.fetch_add(1, Ordering::SeqCst);
                    let weather = weather.subscribe();
                    let counts = Arc::clone(&counts);
                    connections.spawn(async move {
                        relay(client, upstream, weather).await;
                        counts.open.fetch_sub(1, Ordering::SeqCst);
                    });
                    while connections.try_join_next().is_some() {}
                }
            })
        };
        FaultProxy {
            addr,
            weather,
            counts,
            task,
        }
    }

    /// `http://<addr>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Applies `fault` from now on (to the open connections too).
    pub fn set(&self, fault: NetFault) {
        self.weather.send_modify(|w| w.fault = fault);
    }

    /// Silences every connection open now, for good, without closing it; new connections
    /// pass as [`FaultProxy::set`] says (a NAT entry or a load balancer's flow lost: the
    /// client holds a half-open connection and hears nothing more on it).
    pub fn half_open(&self) {
        self.weather.send_modify(|w| w.silenced += 1);
    }

    /// How many connections it accepted so far.
    pub fn accepted(&self) -> u64 {
        self.counts.accepted.load(Ordering::SeqCst)
    }

    /// How many connections are open now (silenced ones included, until the client
    /// closes them).
    pub fn open(&self) -> u64 {
        self.counts.open.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // The accept task owns the connections: aborting it closes them.
        self.task.abort();
    }
}

/// Relays one connection until either side closes or the weather kills it.
async fn relay(mut client: TcpStream, upstream: SocketAddr, mut weather: watch::Receiver<Weather>) {
    let first = *weather.borrow_and_update();
    let born = first.silenced;
    match first.fault {
        NetFault::Reset => return reset(client),
        NetFault::Blackhole => return swallow(client).await,
        NetFault::Pass | NetFault::Slow(_) => {}
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return reset(client);
    };
    let mut to_server = vec![0u8; 16 * 1024];
    let mut to_client = vec![0u8; 16 * 1024];
    loop {
        let now = *weather.borrow_and_update();
        if now.silenced != born || now.fault == NetFault::Blackhole {
            drop(server);
            return swallow(client).await;
        }
        let slice = match now.fault {
            NetFault::Reset => return reset(client),
            NetFault::Slow(bytes_per_sec) => Some((bytes_per_sec as usize / 10).clamp(1, to_client.len())),
            NetFault::Pass | NetFault::Blackhole => None,
        };
        let (mut client_read, mut client_write) = client.split();
        let (mut server_read, mut server_write) = server.split();
        let room = slice.unwrap_or(to_client.len());
        tokio::select! {
            changed = weather.changed() => if changed.is_err() {
                return;
            },
            n = client_read.read(&mut to_server) => match n {
                Ok(n) if n > 0 => {
                    if server_write.write_all(&to_server[..n]).await.is_err() {
                        return;
                    }
                }
                _ => return,
            },
            n = server_read.read(&mut to_client[..room]) => match n {
                Ok(n) if n > 0 => {
                    if client_write.write_all(&to_client[..n]).await.is_err() {
                        return;
                    }
                    if slice.is_some() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                _ => return,
            },
        }
    }
}

/// Closes with `RST` instead of `FIN`.
fn reset(client: TcpStream) {
    let _ = client.set_zero_linger();
}

/// Reads and drops what the client sends until it closes; never answers.
async fn swallow(mut client: TcpStream) {
    let mut sink = vec![0u8; 16 * 1024];
    while matches!(client.read(&mut sink).await, Ok(n) if n > 0) {}
}
