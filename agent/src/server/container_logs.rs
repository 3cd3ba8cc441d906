//! `/containerLogs`: a container's log file in the CRI format (`<time> <stream> <P|F> <text>`,
//! `P` for a piece of a line the next entry continues) turned back into the container's output,
//! with the kubelet's options: `tailLines`, `sinceSeconds`/`sinceTime`, `timestamps`,
//! `limitBytes`, `previous` and `follow`.
use std::path::PathBuf;
use std::time::Duration;

/// The options of one request, checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    pub tail_lines: Option<u64>,
    pub limit_bytes: Option<u64>,
    /// Entries older than this are left out.
    pub since: Option<jiff::Timestamp>,
}

/// Why a query option is refused; `name`: the option.
#[derive(Debug, thiserror::Error)]
pub enum BadOption {
    #[error("{name}: {value:?} is not a boolean")]
    NotBoolean { name: String, value: String },
    #[error("{name}: {value:?} is not an integer")]
    NotInteger { name: String, value: String },
    #[error("{0}: must not be negative")]
    Negative(String),
    #[error("{0}: must be greater than 0")]
    NotPositive(String),
    #[error("{name}: {value:?}: {source}")]
    Time {
        name: String,
        value: String,
        source: jiff::Error,
    },
}

fn flag(name: &str, value: &str) -> Result<bool, BadOption> {
    match value {
        "" | "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(BadOption::NotBoolean {
            name: name.to_owned(),
            value: value.to_owned(),
        }),
    }
}

impl Options {
    /// Reads the query string; a bad value is named.
    pub fn parse(query: &str, now: jiff::Timestamp) -> Result<Self, BadOption> {
        let mut o = Self::default();
        let number = |name: &str, v: &str| {
            v.parse::<i64>().map_err(|_| BadOption::NotInteger {
                name: name.to_owned(),
                value: v.to_owned(),
            })
        };
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            match &*k {
                "follow" => o.follow = flag(&k, &v)?,
                "previous" => o.previous = flag(&k, &v)?,
                "timestamps" => o.timestamps = flag(&k, &v)?,
                "tailLines" => {
                    let n = number(&k, &v)?;
                    o.tail_lines =
                        Some(u64::try_from(n).map_err(|_| BadOption::Negative(k.to_string()))?);
                }
                "limitBytes" => {
                    let n = number(&k, &v)?;
                    if n < 1 {
                        return Err(BadOption::NotPositive(k.to_string()));
                    }
                    o.limit_bytes = u64::try_from(n).ok();
                }
                "sinceSeconds" => {
                    let n = number(&k, &v)?;
                    if n < 1 {
                        return Err(BadOption::NotPositive(k.to_string()));
                    }
                    o.since = Some(
                        now.checked_sub(jiff::SignedDuration::from_secs(n))
                            .unwrap_or(jiff::Timestamp::MIN),
                    );
                }
                "sinceTime" => {
                    o.since = Some(v.parse().map_err(|source| BadOption::Time {
                        name: k.to_string(),
                        value: v.to_string(),
                        source,
                    })?);
                }
                _ => {}
            }
        }
        Ok(o)
    }
}

/// Turns CRI log bytes into output, entry by entry, across reads that split entries.
#[derive(Debug)]
pub struct Renderer {
    timestamps: bool,
    since: Option<jiff::Timestamp>,
    /// Bytes of output still allowed (`limitBytes`).
    remaining: Option<u64>,
    /// The start of an entry whose newline has not been read yet.
    pending: Vec<u8>,
}

impl Renderer {
    pub fn new(o: &Options) -> Self {
        Self {
            timestamps: o.timestamps,
            since: o.since,
            remaining: o.limit_bytes,
            pending: Vec::new(),
        }
    }

    /// Whether `limitBytes` is used up.
    pub fn done(&self) -> bool {
        self.remaining == Some(0)
    }

    /// Renders the complete entries of `bytes` (after what earlier calls left pending) into
    /// `out`.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        let mut rest = bytes;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            if self.pending.is_empty() {
                self.entry(&rest[..nl], out);
            } else {
                let mut line = std::mem::take(&mut self.pending);
                line.extend_from_slice(&rest[..nl]);
                self.entry(&line, out);
            }
            rest = &rest[nl + 1..];
            if self.done() {
                return;
            }
        }
        self.pending.extend_from_slice(rest);
    }

    fn entry(&mut self, line: &[u8], out: &mut Vec<u8>) {
        let mut fields = line.splitn(4, |&b| b == b' ');
        let (Some(time), Some(_stream), Some(tag), content) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return;
        };
        let partial = tag.split(|&b| b == b':').next() == Some(b"P");
        if let Some(since) = self.since {
            let at = std::str::from_utf8(time)
                .ok()
                .and_then(|t| t.parse::<jiff::Timestamp>().ok());
            if at.is_none_or(|at| at < since) {
                return;
            }
        }
        let start = out.len();
        if self.timestamps {
            out.extend_from_slice(time);
            out.push(b' ');
        }
        out.extend_from_slice(content.unwrap_or_default());
        if !partial {
            out.push(b'\n');
        }
        if let Some(left) = self.remaining.as_mut() {
            let written = (out.len() - start) as u64;
            if written >= *left {
                out.truncate(start + usize::try_from(*left).unwrap_or(usize::MAX));
                *left = 0;
            } else {
                *left -= written;
            }
        }
    }
}

/// Where the last `n` lines of `bytes` begin.
pub fn tail_start(bytes: &[u8], n: u64) -> usize {
    if n == 0 {
        return bytes.len();
    }
    let mut seen = 0u64;
    // A last line without its newline yet counts as a line.
    let end = if bytes.last() == Some(&b'\n') {
        bytes.len().saturating_sub(1)
    } else {
        bytes.len()
    };
    for (i, &b) in bytes[..end].iter().enumerate().rev() {
        if b == b'\n' {
            seen += 1;
            if seen == n {
                return i + 1;
            }
        }
    }
    0
}

/// How often a followed log is read again for new entries.
const FOLLOW_POLL: Duration = Duration::from_millis(100);

/// What a followed log needs from outside: whether its container still runs.
pub trait Liveness: Send + 'static {
    fn running(&self) -> impl std::future::Future<Output = bool> + Send;
}

/// Streams the log at `path`: what is there (after `tailLines`), then, with `follow`, what is
/// written until the container has stopped and the file is drained. Chunks go to `tx`; the
/// stream ends early when the receiver is gone or `limitBytes` is used up.
pub async fn stream(
    path: PathBuf,
    opts: Options,
    alive: impl Liveness,
    tx: tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>,
) {
    use std::os::unix::fs::MetadataExt;
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let mut renderer = Renderer::new(&opts);
    let first = match tokio::fs::read(&path).await {
        Ok(b) => b,
        Err(e) => {
            let _ = tx
                .send(Err(std::io::Error::new(
                    e.kind(),
                    format!("reading {}: {e}", path.display()),
                )))
                .await;
            return;
        }
    };
    let start = opts.tail_lines.map_or(0, |n| tail_start(&first, n));
    let mut out = Vec::new();
    renderer.feed(&first[start..], &mut out);
    if !out.is_empty() && tx.send(Ok(out.into())).await.is_err() {
        return;
    }
    if !opts.follow || renderer.done() {
        return;
    }
    let mut offset = first.len() as u64;
    let mut file = None;
    let mut stopped_and_drained = false;
    while !stopped_and_drained {
        // The container stopping is checked before the last read, so what it wrote before
        // stopping is read.
        let stopped = !alive.running().await;
        if file.is_none() {
            file = tokio::fs::File::open(&path).await.ok();
        }
        let mut got = Vec::new();
        if let Some(f) = file.as_mut()
            && f.seek(std::io::SeekFrom::Start(offset)).await.is_ok()
        {
            let _ = f.read_to_end(&mut got).await;
        }
        offset += got.len() as u64;
        let mut out = Vec::new();
        renderer.feed(&got, &mut out);
        if !out.is_empty() && tx.send(Ok(out.into())).await.is_err() {
            return;
        }
        if renderer.done() {
            return;
        }
        // Rotated: the open file was drained; continue with the new one from its start.
        let rotated = match (file.as_ref(), tokio::fs::metadata(&path).await) {
            (Some(f), Ok(now)) => f.metadata().await.is_ok_and(|m| m.ino() != now.ino()),
            _ => false,
        };
        if rotated {
            file = None;
            offset = 0;
            continue;
        }
        stopped_and_drained = stopped && got.is_empty();
        if !stopped_and_drained {
            tokio::select! {
                () = tokio::time::sleep(FOLLOW_POLL) => {}
                () = tx.closed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "2026-11-26T10:00:00.000000001Z stdout F one\n\
                       2026-11-26T10:00:01.000000000Z stderr P tw\n\
                       2026-11-26T10:00:01.500000000Z stderr F o\n\
                       garbage\n\
                       2026-11-26T10:00:02.000000000Z stdout F three\n";

    fn render(o: &Options, chunks: &[&[u8]]) -> String {
        let mut r = Renderer::new(o);
        let mut out = Vec::new();
        for c in chunks {
            r.feed(c, &mut out);
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn entries_become_the_containers_output_whatever_the_reads_split() {
        let o = Options::default();
        assert_eq!(render(&o, &[LOG.as_bytes()]), "one\ntwo\nthree\n");
        let bytes = LOG.as_bytes();
        for cut in 0..bytes.len() {
            assert_eq!(
                render(&o, &[&bytes[..cut], &bytes[cut..]]),
                "one\ntwo\nthree\n"
            );
        }
        let ts = Options {
            timestamps: true,
            ..Options::default()
        };
        assert!(
            render(&ts, &[bytes]).starts_with("2026-11-26T10:00:00.000000001Z one\n"),
            "{}",
            render(&ts, &[bytes])
        );
    }

    #[test]
    fn tail_since_and_limit_cut_as_the_kubelet_does() {
        let bytes = LOG.as_bytes();
        assert_eq!(
            &bytes[tail_start(bytes, 1)..],
            b"2026-11-26T10:00:02.000000000Z stdout F three\n"
        );
        assert_eq!(tail_start(bytes, 0), bytes.len());
        assert_eq!(tail_start(bytes, 100), 0);
        assert_eq!(tail_start(b"a\nb", 1), 2, "an unfinished last line counts");
        let now: jiff::Timestamp = "2026-11-26T10:00:03Z".parse().unwrap();
        let o = Options::parse("sinceSeconds=2", now).unwrap();
        assert_eq!(render(&o, &[bytes]), "two\nthree\n");
        // Entry by entry: a line's older piece is left out.
        let o = Options::parse("sinceTime=2026-11-26T10:00:01.2Z", now).unwrap();
        assert_eq!(render(&o, &[bytes]), "o\nthree\n");
        let o = Options::parse("sinceTime=2026-11-26T10:00:01Z&limitBytes=5", now).unwrap();
        assert_eq!(render(&o, &[bytes]), "two\nt");
        let mut r = Renderer::new(&o);
        r.feed(bytes, &mut Vec::new());
        assert!(r.done());
    }

    #[test]
    fn bad_options_are_named() {
        let now = jiff::Timestamp::UNIX_EPOCH;
        let parsed = Options::parse("follow=true&tailLines=3&previous=1&timestamps", now).unwrap();
        assert_eq!(
            parsed,
            Options {
                follow: true,
                previous: true,
                timestamps: true,
                tail_lines: Some(3),
                ..Options::default()
            }
        );
        for (q, named) in [
            ("tailLines=-1", "tailLines"),
            ("tailLines=x", "tailLines"),
            ("limitBytes=0", "limitBytes"),
            ("sinceSeconds=0", "sinceSeconds"),
            ("sinceTime=yesterday", "sinceTime"),
            ("follow=maybe", "follow"),
        ] {
            let e = Options::parse(q, now).unwrap_err().to_string();
            assert!(e.contains(named), "{q}: {e}");
        }
    }
}
