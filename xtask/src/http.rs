//! Blocking HTTP GETs of the agent's loopback endpoints, through `ureq`.
//!
//! A [`Client`] keeps its connections open between requests (HTTP/1.1 keep-alive, connecting
//! again when the server closed one): pollers use one, because a new loopback connection costs
//! the agent several times what answering from its cache does. [`get`] is a one-off request.
//!
//! Every status is an answer here (a 404 is a [`Response`], not an error): callers decide what a
//! status means. No proxy is consulted: these endpoints are always on loopback.

use std::net::SocketAddr;
use std::time::Duration;

/// The largest body read (the agent's `/pods` with hundreds of pods stays far below it).
const MAX_BODY: u64 = 64 << 20;

/// A failed GET (connecting, sending, reading, or a body that is too large), with the URL.
#[derive(Debug, thiserror::Error)]
#[error("GET {url}: {source}")]
pub struct Error {
    url: String,
    #[source]
    source: ureq::Error,
}

/// A response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code (200, 404 ...).
    pub status: u16,
    /// The body as text (lossily decoded as UTF-8).
    pub body: String,
}

/// A GET client of one loopback server that reuses its connections.
#[derive(Debug, Clone)]
pub struct Client {
    addr: SocketAddr,
    agent: ureq::Agent,
}

impl Client {
    /// A client of `addr`; `timeout` bounds each whole request (connecting, sending, reading).
    pub fn new(addr: SocketAddr, timeout: Duration) -> Self {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .proxy(None)
            .build()
            .into();
        Client { addr, agent }
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `GET path` (`path` starts with `/`).
    pub fn get(&self, path: &str) -> Result<Response, Error> {
        let url = format!("http://{}{path}", self.addr);
        let fail = |source| Error {
            url: url.clone(),
            source,
        };
        let mut response = self.agent.get(&url).call().map_err(fail)?;
        let status = response.status().as_u16();
        let body = response
            .body_mut()
            .with_config()
            .limit(MAX_BODY)
            .lossy_utf8(true)
            .read_to_string()
            .map_err(fail)?;
        Ok(Response { status, body })
    }
}

/// `GET path` from `addr` on a connection of its own; `timeout` bounds the whole request.
pub fn get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<Response, Error> {
    Client::new(addr, timeout).get(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::net::{TcpListener, TcpStream};

    /// Reads one request head off `conn`; its request line, or `None` at end of stream.
    fn request_line(conn: &mut BufReader<TcpStream>) -> Option<String> {
        let mut first = String::new();
        if conn.read_line(&mut first).ok()? == 0 {
            return None;
        }
        let mut line = String::new();
        while conn.read_line(&mut line).ok()? > 0 && line != "\r\n" {
            line.clear();
        }
        Some(first.trim_end().to_owned())
    }

    #[test]
    fn one_connection_serves_several_requests_and_a_closed_one_is_replaced() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let mut lines = Vec::new();
            // First connection: a sized and a chunked answer, then a 404 after which the server
            // closes the connection.
            let (conn, _) = listener.accept().unwrap();
            let mut conn = BufReader::new(conn);
            let answers: [&[u8]; 3] = [
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nsec\r\n3\r\nond\r\n0\r\n\r\n",
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\nConnection: close\r\n\r\nnah",
            ];
            for answer in answers {
                lines.push(request_line(&mut conn).unwrap());
                conn.get_mut().write_all(answer).unwrap();
            }
            drop(conn);
            // The client comes back on a new connection.
            let (conn, _) = listener.accept().unwrap();
            let mut conn = BufReader::new(conn);
            lines.push(request_line(&mut conn).unwrap());
            conn.get_mut()
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                .unwrap();
            lines
        });
        let client = Client::new(addr, Duration::from_secs(5));
        let answers: Vec<(u16, String)> = ["/pods", "/pods", "/missing", "/healthz"]
            .iter()
            .map(|path| {
                let r = client.get(path).unwrap();
                (r.status, r.body)
            })
            .collect();
        assert_eq!(
            answers,
            [
                (200, "first".to_owned()),
                (200, "second".to_owned()),
                (404, "nah".to_owned()),
                (200, "ok".to_owned()),
            ]
        );
        let lines = server.join().unwrap();
        assert_eq!(
            lines,
            [
                "GET /pods HTTP/1.1",
                "GET /pods HTTP/1.1",
                "GET /missing HTTP/1.1",
                "GET /healthz HTTP/1.1"
            ],
            "three requests on the first connection, the fourth on a second one"
        );
    }

    #[test]
    fn a_refused_connection_names_the_url() {
        // Bind and drop a listener: nothing accepts on its port afterwards.
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let err = get(addr, "/healthz", Duration::from_secs(2)).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("GET http://{addr}/healthz: ")),
            "{text}"
        );
    }
}
