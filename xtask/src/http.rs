//! Tiny blocking HTTP GET clients for the agent's loopback endpoints.
//!
//! [`get`]: HTTP/1.0 without keep-alive: the server closes the connection after the body, so the
//! body is everything after the header block (chunked encoding is decoded anyway, in case a
//! server answers with HTTP/1.1 framing).
//!
//! [`KeepAlive`]: HTTP/1.1 on one kept connection, for pollers: a new loopback connection costs
//! the agent several times what answering from its cache does.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Errors of an HTTP GET, carrying the address and path.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Connecting, writing or reading failed.
    #[error("GET http://{addr}{path}: {source}")]
    Io {
        addr: SocketAddr,
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The response could not be parsed.
    #[error("GET http://{addr}{path}: malformed response: {reason}")]
    Malformed {
        addr: SocketAddr,
        path: String,
        reason: &'static str,
    },
}

/// A parsed response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code (200, 404 ...).
    pub status: u16,
    /// The body as text (lossily decoded as UTF-8).
    pub body: String,
}

/// `GET path` from `addr` with `timeout` for connecting and for each read/write.
pub fn get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<Response, Error> {
    let io = |source| Error::Io {
        addr,
        path: path.to_owned(),
        source,
    };
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(io)?;
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(io)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(io)?;
    parse_response(&raw).map_err(|reason| Error::Malformed {
        addr,
        path: path.to_owned(),
        reason,
    })
}

/// Parses a raw HTTP/1.x response (status line, headers, body).
pub fn parse_response(raw: &[u8]) -> Result<Response, &'static str> {
    let header_end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no end of headers")?;
    let head = parse_head(&raw[..header_end])?;
    let body = &raw[header_end + 4..];
    let body = if head.framing == Framing::Chunked {
        read_chunked(&mut &body[..]).map_err(|_| "bad chunked body")?
    } else {
        body.to_vec()
    };
    Ok(Response {
        status: head.status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// A GET client that keeps its connection open between requests (HTTP/1.1), connecting again
/// when the server closed it.
pub struct KeepAlive {
    addr: SocketAddr,
    timeout: Duration,
    conn: Option<BufReader<TcpStream>>,
}

impl KeepAlive {
    /// A client of `addr`; `timeout` bounds connecting and each read or write.
    pub fn new(addr: SocketAddr, timeout: Duration) -> Self {
        KeepAlive {
            addr,
            timeout,
            conn: None,
        }
    }

    /// `GET path`. A kept connection that fails is dropped and the request sent once more on a
    /// new one (the server may have closed it while idle; a GET may be repeated).
    pub fn get(&mut self, path: &str) -> Result<Response, Error> {
        if self.conn.is_some()
            && let Ok(r) = self.get_once(path)
        {
            return Ok(r);
        }
        self.conn = None;
        self.get_once(path)
    }

    fn get_once(&mut self, path: &str) -> Result<Response, Error> {
        let (addr, timeout) = (self.addr, self.timeout);
        let io = |source| Error::Io {
            addr,
            path: path.to_owned(),
            source,
        };
        let malformed = |reason| Error::Malformed {
            addr,
            path: path.to_owned(),
            reason,
        };
        let conn = match &mut self.conn {
            Some(c) => c,
            None => {
                let stream = TcpStream::connect_timeout(&addr, timeout).map_err(io)?;
                stream.set_read_timeout(Some(timeout)).map_err(io)?;
                stream.set_write_timeout(Some(timeout)).map_err(io)?;
                stream.set_nodelay(true).map_err(io)?;
                self.conn.insert(BufReader::new(stream))
            }
        };
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n");
        conn.get_mut().write_all(request.as_bytes()).map_err(io)?;
        let head = read_head(conn).map_err(io)?;
        let parsed = parse_head(&head).map_err(malformed)?;
        let body = match parsed.framing {
            Framing::Length(n) => {
                let mut body = vec![0; n];
                conn.read_exact(&mut body).map_err(io)?;
                body
            }
            Framing::Chunked => read_chunked(conn).map_err(io)?,
            Framing::UntilClose => {
                let mut body = Vec::new();
                conn.read_to_end(&mut body).map_err(io)?;
                body
            }
        };
        if parsed.close || parsed.framing == Framing::UntilClose {
            self.conn = None;
        }
        Ok(Response {
            status: parsed.status,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }
}

/// How a kept-alive response's body ends.
#[derive(Debug, PartialEq, Eq)]
enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

struct Head {
    status: u16,
    framing: Framing,
    /// The server closes the connection after this response.
    close: bool,
}

/// The status line and headers, up to and including the empty line.
fn read_head(conn: &mut impl BufRead) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::new();
    loop {
        let start = head.len();
        if conn.read_until(b'\n', &mut head)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if head[start..] == *b"\r\n" || head[start..] == *b"\n" {
            return Ok(head);
        }
    }
}

fn parse_head(head: &[u8]) -> Result<Head, &'static str> {
    let text = std::str::from_utf8(head).map_err(|_| "headers are not UTF-8")?;
    let mut lines = text.lines();
    let status_line = lines.next().ok_or("no status line")?;
    let mut parts = status_line.split_whitespace();
    let version = parts.next().ok_or("no HTTP version")?;
    if !version.starts_with("HTTP/1.") {
        return Err("not an HTTP/1.x response");
    }
    let status = parts
        .next()
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or("bad status code")?;
    let (mut framing, mut close) = (Framing::UntilClose, version == "HTTP/1.0");
    for (k, v) in lines.filter_map(|l| l.split_once(':')) {
        let (k, v) = (k.trim(), v.trim());
        if k.eq_ignore_ascii_case("content-length") && framing != Framing::Chunked {
            framing = Framing::Length(v.parse().map_err(|_| "bad content-length")?);
        } else if k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked") {
            framing = Framing::Chunked;
        } else if k.eq_ignore_ascii_case("connection") {
            close = v.eq_ignore_ascii_case("close");
        }
    }
    Ok(Head {
        status,
        framing,
        close,
    })
}

/// A chunked body read off a connection (or a buffer), through the empty line after the last
/// chunk.
fn read_chunked(conn: &mut impl BufRead) -> std::io::Result<Vec<u8>> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let mut out = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        conn.read_line(&mut line)?;
        let size = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size, 16).map_err(|_| bad("bad chunk size"))?;
        if size == 0 {
            // Trailers, if any, then the empty line.
            loop {
                line.clear();
                if conn.read_line(&mut line)? == 0 || line.trim().is_empty() {
                    return Ok(out);
                }
            }
        }
        let start = out.len();
        out.resize(start + size, 0);
        conn.read_exact(&mut out[start..])?;
        let mut crlf = [0u8; 2];
        conn.read_exact(&mut crlf)?;
        if crlf != *b"\r\n" {
            return Err(bad("chunk not followed by CRLF"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn parses_plain_and_chunked_responses() {
        let plain =
            parse_response(b"HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\n\r\nnah").unwrap();
        assert_eq!(plain.status, 404);
        assert_eq!(plain.body, "nah");
        let chunked = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(chunked.body, "abcde");
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse_response(b"SSH-2.0 hi\r\n\r\n").is_err());
    }

    #[test]
    fn gets_from_a_loopback_server() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut buf = [0u8; 1024];
            let n = conn.read(&mut buf).unwrap();
            let request = String::from_utf8_lossy(&buf[..n]).into_owned();
            conn.write_all(b"HTTP/1.0 200 OK\r\n\r\nok").unwrap();
            request
        });
        let response = get(addr, "/healthz", Duration::from_secs(5)).unwrap();
        assert_eq!(response.status, 200);
        assert_eq!(response.body, "ok");
        let request = server.join().unwrap();
        assert!(
            request.starts_with("GET /healthz HTTP/1.0\r\n"),
            "{request}"
        );
    }

    #[test]
    fn keep_alive_uses_one_connection_and_reconnects_when_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let mut accepted = 0;
            // First connection: a sized and a chunked answer, then the server closes it.
            let (conn, _) = listener.accept().unwrap();
            accepted += 1;
            let mut reader = BufReader::new(conn);
            let answers: [&[u8]; 2] = [
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nsec\r\n3\r\nond\r\n0\r\n\r\n",
            ];
            for answer in answers {
                let head = read_head(&mut reader).unwrap();
                assert!(head.starts_with(b"GET /pods HTTP/1.1\r\n"));
                reader.get_mut().write_all(answer).unwrap();
            }
            drop(reader);
            // The client finds the connection closed and comes back on a new one.
            let (conn, _) = listener.accept().unwrap();
            accepted += 1;
            let mut reader = BufReader::new(conn);
            read_head(&mut reader).unwrap();
            reader
                .get_mut()
                .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\n\r\nnah")
                .unwrap();
            accepted
        });
        let mut client = KeepAlive::new(addr, Duration::from_secs(5));
        let bodies: Vec<(u16, String)> = (0..3)
            .map(|_| {
                let r = client.get("/pods").unwrap();
                (r.status, r.body)
            })
            .collect();
        assert_eq!(
            bodies,
            [
                (200, "first".to_owned()),
                (200, "second".to_owned()),
                (404, "nah".to_owned())
            ]
        );
        assert_eq!(
            server.join().unwrap(),
            2,
            "two connections for three requests"
        );
    }
}
