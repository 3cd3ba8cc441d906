//! A TCP relay on loopback that behaves like a network link between the node and a remote
//! server: every byte arrives half a round-trip time after it was sent (so a request and its
//! answer take one round trip, and so does opening a connection), and bytes are paced at a
//! per-connection rate and at a rate for all connections together (a server's per-stream limit
//! and the node's link). The bytes themselves pass unchanged (TLS goes through as it is).
//!
//! This machine's kernel has no `netem` queueing discipline, so the delay is made here, in user
//! space, on a thread of its own.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// What the link does to the bytes it carries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Round-trip time.
    pub rtt: Duration,
    /// Bytes a second one connection carries in one direction, at most.
    pub per_connection: f64,
    /// Bytes a second all connections carry together in one direction, at most.
    pub total: f64,
}

impl Shape {
    /// `RTT_MS,CONNECTION_MBIT,TOTAL_MBIT`, e.g. `10,200,1000`.
    pub fn parse(s: &str) -> Result<Shape, String> {
        let parts: Vec<f64> = s
            .split(',')
            .map(|p| p.trim().parse::<f64>())
            .collect::<Result<_, _>>()
            .map_err(|_| format!("{s:?}: expected RTT_MS,CONNECTION_MBIT,TOTAL_MBIT"))?;
        let [rtt, conn, total] =
            <[f64; 3]>::try_from(parts).map_err(|_| format!("{s:?}: expected three numbers"))?;
        if !(rtt >= 0.0 && conn > 0.0 && total > 0.0) {
            return Err(format!("{s:?}: the RTT must be >= 0 and the rates > 0"));
        }
        Ok(Shape {
            rtt: Duration::from_secs_f64(rtt / 1000.0),
            per_connection: conn * 1e6 / 8.0,
            total: total * 1e6 / 8.0,
        })
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RTT {} ms, {} Mbit/s a connection, {} Mbit/s in all",
            self.rtt.as_millis(),
            self.per_connection * 8.0 / 1e6,
            self.total * 8.0 / 1e6
        )
    }
}

/// The relay; it runs until the process ends.
#[derive(Debug)]
pub struct Link {
    /// Where clients connect.
    pub addr: SocketAddr,
}

/// Read size, and so the pacing's granularity.
const CHUNK: usize = 64 * 1024;
/// Chunks in flight one way on one connection (the link's buffer).
const IN_FLIGHT: usize = 64;

/// When the next byte may leave, for one pacing limit.
#[derive(Debug)]
struct Pacer {
    free_at: Option<Instant>,
    rate: f64,
}

impl Pacer {
    fn new(rate: f64) -> Pacer {
        Pacer {
            free_at: None,
            rate,
        }
    }
}

/// The time a chunk of `len` bytes ready at `ready` is delivered under both pacers, which are
/// advanced past it.
fn schedule(ready: Instant, len: usize, own: &mut Pacer, all: &Mutex<Pacer>) -> Instant {
    let mut all = all
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let start = [Some(ready), own.free_at, all.free_at]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(ready);
    own.free_at = Some(start + Duration::from_secs_f64(len as f64 / own.rate));
    all.free_at = Some(start + Duration::from_secs_f64(len as f64 / all.rate));
    start
}

async fn one_way(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    shape: Shape,
    all: Arc<Mutex<Pacer>>,
) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(IN_FLIGHT);
    let half = shape.rtt / 2;
    let reader = tokio::spawn(async move {
        loop {
            let mut buf = vec![0u8; CHUNK];
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    buf.truncate(n);
                    if tx.send((Instant::now() + half, buf)).await.is_err() {
                        break;
                    }
                }
            }
        }
    });
    let mut own = Pacer::new(shape.per_connection);
    while let Some((ready, buf)) = rx.recv().await {
        let at = schedule(ready, buf.len(), &mut own, &all);
        tokio::time::sleep_until(at).await;
        if to.write_all(&buf).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
    reader.abort();
}

async fn relay(
    client: TcpStream,
    target: SocketAddr,
    shape: Shape,
    pacers: [Arc<Mutex<Pacer>>; 2],
) {
    // Opening the connection takes a round trip.
    tokio::time::sleep(shape.rtt).await;
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let [up, down] = pacers;
    tokio::join!(one_way(cr, sw, shape, up), one_way(sr, cw, shape, down));
}

impl Link {
    /// A relay on 127.0.0.1 and a free port to `target`, shaped by `shape`.
    ///
    /// # Errors
    /// When the thread, its runtime or the listening socket cannot be made.
    pub fn start(target: SocketAddr, shape: Shape) -> std::io::Result<Link> {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("link".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(std_listener) else {
                        return;
                    };
                    let pacers = [
                        Arc::new(Mutex::new(Pacer::new(shape.total))),
                        Arc::new(Mutex::new(Pacer::new(shape.total))),
                    ];
                    while let Ok((client, _)) = listener.accept().await {
                        tokio::spawn(relay(client, target, shape, pacers.clone()));
                    }
                });
            })?;
        Ok(Link { addr })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn echo_server() -> SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let mut s = s.unwrap();
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 65536];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    #[test]
    fn shapes_parse_from_milliseconds_and_megabits() {
        let s = Shape::parse("10,200,1000").unwrap();
        assert_eq!(s.rtt, Duration::from_millis(10));
        assert_eq!(s.per_connection, 25e6);
        assert_eq!(s.total, 125e6);
        assert!(Shape::parse("10,200").is_err());
        assert!(Shape::parse("10,0,5").is_err());
        assert!(Shape::parse("x,1,1").is_err());
    }

    #[test]
    fn a_round_trip_takes_the_rtt_and_bytes_keep_to_the_rate() {
        let shape = Shape::parse("40,8,100").unwrap(); // 1 MB/s a connection
        let link = Link::start(echo_server(), shape).unwrap();
        let start = std::time::Instant::now();
        let mut s = std::net::TcpStream::connect(link.addr).unwrap();
        s.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        s.read_exact(&mut got).unwrap();
        let first = start.elapsed();
        assert_eq!(&got, b"ping");
        // Connection set-up (one RTT) and the echo (one RTT), nothing near the pacing.
        assert!(first >= Duration::from_millis(80), "{first:?}");
        assert!(first < Duration::from_millis(1000), "{first:?}");
        // 500 KB each way at 1 MB/s: at least half a second.
        let data = vec![7u8; 500_000];
        let start = std::time::Instant::now();
        let mut writer = s.try_clone().unwrap();
        let sender = std::thread::spawn(move || writer.write_all(&data).unwrap());
        let mut back = vec![0u8; 500_000];
        s.read_exact(&mut back).unwrap();
        sender.join().unwrap();
        let took = start.elapsed();
        assert!(back.iter().all(|&b| b == 7));
        assert!(took >= Duration::from_millis(450), "{took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
    }

    #[test]
    fn connections_share_the_total_rate() {
        // 8 Mbit/s a connection, 8 Mbit/s in all: two connections at once take twice as long.
        let shape = Shape::parse("0,8,8").unwrap();
        let link = Link::start(echo_server(), shape).unwrap();
        let run = |n: usize| {
            let start = std::time::Instant::now();
            let handles: Vec<_> = (0..n)
                .map(|_| {
                    let addr = link.addr;
                    std::thread::spawn(move || {
                        let mut s = std::net::TcpStream::connect(addr).unwrap();
                        let mut w = s.try_clone().unwrap();
                        let t = std::thread::spawn(move || w.write_all(&[1u8; 300_000]).unwrap());
                        let mut back = vec![0u8; 300_000];
                        s.read_exact(&mut back).unwrap();
                        t.join().unwrap();
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            start.elapsed()
        };
        let one = run(1);
        let two = run(2);
        assert!(
            two.as_secs_f64() > one.as_secs_f64() * 1.5,
            "{one:?} vs {two:?}"
        );
    }
}
