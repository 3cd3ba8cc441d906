//! A tiny blocking HTTP/1.0 GET client for the agent's loopback endpoints.
//!
//! HTTP/1.0 without keep-alive: the server closes the connection after the body, so the body is
//! everything after the header block (chunked encoding is decoded anyway, in case a server
//! answers with HTTP/1.1 framing).

use std::io::{Read, Write};
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
    let head = std::str::from_utf8(&raw[..header_end]).map_err(|_| "headers are not UTF-8")?;
    let mut lines = head.split("\r\n");
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
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding")
                && v.trim().eq_ignore_ascii_case("chunked")
        })
    });
    let body = &raw[header_end + 4..];
    let body = if chunked {
        decode_chunked(body)?
    } else {
        body.to_vec()
    };
    Ok(Response {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

fn decode_chunked(mut body: &[u8]) -> Result<Vec<u8>, &'static str> {
    let mut out = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("truncated chunk size")?;
        let size_text = std::str::from_utf8(&body[..line_end]).map_err(|_| "bad chunk size")?;
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| "bad chunk size")?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if body.len() < size {
            return Err("truncated chunk");
        }
        out.extend_from_slice(&body[..size]);
        body = body.get(size + 2..).ok_or("truncated chunk")?;
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
}
