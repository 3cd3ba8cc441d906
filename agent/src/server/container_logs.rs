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

/// How much of a log one read takes: a request holds at most this much of the file (and one
/// unfinished entry) however large the file is.
const READ_CHUNK: usize = 64 * 1024;

/// Where the last `n` lines of the `len` bytes of `file` begin, read backwards from the end
/// `chunk` bytes at a time: a `tailLines` request on a large log reads only its tail.
pub fn tail_offset(file: &std::fs::File, len: u64, n: u64, chunk: usize) -> std::io::Result<u64> {
    use std::os::unix::fs::FileExt;
    if n == 0 {
        return Ok(len);
    }
    let mut buf = vec![0; chunk.max(1)];
    let mut seen = 0u64;
    let mut end = len;
    let mut last = true;
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let part = &mut buf[..usize::try_from(end - start).unwrap_or(0)];
        file.read_exact_at(part, start)?;
        let mut upto = part.len();
        // A last line without its newline yet counts as a line: the file's final newline
        // ends the last line rather than starting a new one.
        if last && part.last() == Some(&b'\n') {
            upto -= 1;
        }
        last = false;
        for (i, &b) in part[..upto].iter().enumerate().rev() {
            if b == b'\n' {
                seen += 1;
                if seen == n {
                    return Ok(start + i as u64 + 1);
                }
            }
        }
        end = start;
    }
    Ok(0)
}

/// How often a followed log is read again for new entries.
const FOLLOW_POLL: Duration = Duration::from_millis(100);

/// How often a followed log asks whether its container still runs (a runtime call) while the
/// file has nothing new: the file itself is read every [`FOLLOW_POLL`]. The kubelet asks every
/// 5 s; one second ends a follow soon after its container stops for a tenth of the calls a
/// check at every poll made.
const STATE_CHECK_PERIOD: Duration = Duration::from_secs(1);

/// What a followed log needs from outside: whether its container still runs.
pub trait Liveness: Send + 'static {
    fn running(&self) -> impl std::future::Future<Output = bool> + Send;
}

/// Streams the log at `path`: what is there (after `tailLines`), then, with `follow`, what is
/// written until the container has stopped and the file is drained. Chunks go to `tx`; the
/// stream ends early when the receiver is gone or `limitBytes` is used up. The file is read
/// [`READ_CHUNK`] bytes at a time (`tailLines` from the end), so a request holds little of it.
pub async fn stream(
    path: PathBuf,
    opts: Options,
    alive: impl Liveness,
    tx: tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>,
) {
    use std::os::unix::fs::MetadataExt;
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let mut renderer = Renderer::new(&opts);
    let opened = {
        let (path, tail) = (path.clone(), opts.tail_lines);
        tokio::task::spawn_blocking(move || -> std::io::Result<(std::fs::File, u64)> {
            let file = std::fs::File::open(&path)?;
            let len = file.metadata()?.len();
            let start = match tail {
                Some(n) => tail_offset(&file, len, n, READ_CHUNK)?,
                None => 0,
            };
            Ok((file, start))
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
    };
    let mut file = match opened {
        Ok((file, start)) => {
            let mut file = tokio::fs::File::from_std(file);
            match file.seek(std::io::SeekFrom::Start(start)).await {
                Ok(_) => Some(file),
                Err(e) => return fail(&tx, &path, e).await,
            }
        }
        Err(e) => return fail(&tx, &path, e).await,
    };
    let mut buf = vec![0; READ_CHUNK];
    let mut stopped = false;
    let mut checked: Option<tokio::time::Instant> = None;
    loop {
        let got = match file.as_mut() {
            Some(f) => f.read(&mut buf).await.unwrap_or(0),
            None => 0,
        };
        if got > 0 {
            let mut out = Vec::new();
            renderer.feed(&buf[..got], &mut out);
            if !out.is_empty() && tx.send(Ok(out.into())).await.is_err() || renderer.done() {
                return;
            }
            continue;
        }
        if !opts.follow || stopped {
            return;
        }
        // Rotated: the open file was drained; continue with the new one from its start.
        let now = tokio::fs::metadata(&path).await;
        let rotated = match (file.as_ref(), now) {
            (Some(f), Ok(now)) => f.metadata().await.is_ok_and(|m| m.ino() != now.ino()),
            (None, _) => true,
            (Some(_), Err(_)) => false,
        };
        if rotated {
            file = tokio::fs::File::open(&path).await.ok();
            continue;
        }
        // The container stopping is checked before the last read, so what it wrote before
        // stopping is read.
        if checked.is_none_or(|at| at.elapsed() >= STATE_CHECK_PERIOD) {
            checked = Some(tokio::time::Instant::now());
            if !alive.running().await {
                stopped = true;
                continue;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(FOLLOW_POLL) => {}
            () = tx.closed() => return,
        }
    }
}

/// Sends `tx` the error of reading the log at `path`.
async fn fail(
    tx: &tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>,
    path: &std::path::Path,
    e: std::io::Error,
) {
    let e = std::io::Error::new(e.kind(), format!("reading {}: {e}", path.display()));
    let _ = tx.send(Err(e)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "2026-11-26T10:00:00.000000001Z stdout F one\n\
                       2026-11-26T10:00:01.000000000Z stderr P tw\n\
                       2026-11-26T10:00:01.500000000Z stderr F o\n\
                       garbage\n\
                       2026-11-26T10:00:02.000000000Z stdout F three\n";

    /// [`tail_offset`] of `bytes` written to a file.
    fn tail(bytes: &[u8], n: u64, chunk: usize) -> usize {
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, bytes).unwrap();
        let at = tail_offset(&f, bytes.len() as u64, n, chunk).unwrap();
        usize::try_from(at).unwrap()
    }

    fn render(o: &Options, chunks: &[&[u8]]) -> String {
        let mut r = Renderer::new(o);
        let mut out = Vec::new();
        for c in chunks {
            r.feed(c, &mut out);
        }
        String::from_utf8(out).unwrap()
    }

    /// A container whose state is asked for: running for its first `runs` answers, with the
    /// time of each question.
    struct Asked {
        runs: usize,
        at: std::sync::Arc<std::sync::Mutex<Vec<tokio::time::Instant>>>,
    }

    impl Liveness for Asked {
        async fn running(&self) -> bool {
            let mut at = self.at.lock().unwrap();
            at.push(tokio::time::Instant::now());
            at.len() <= self.runs
        }
    }

    /// Following a quiet log asks for the container's state once per [`STATE_CHECK_PERIOD`],
    /// not at every read, and ends once it stopped, with what it wrote.
    #[tokio::test(start_paused = true)]
    async fn a_followed_log_asks_for_its_containers_state_once_a_period() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        std::fs::write(&path, LOG).unwrap();
        let at = std::sync::Arc::default();
        let alive = Asked {
            runs: 3,
            at: std::sync::Arc::clone(&at),
        };
        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        let opts = Options {
            follow: true,
            ..Options::default()
        };
        let task = tokio::spawn(stream(path, opts, alive, tx));
        let mut out = Vec::new();
        while let Some(chunk) = rx.recv().await {
            out.extend_from_slice(&chunk.unwrap());
        }
        task.await.unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "one\ntwo\nthree\n");
        let at = at.lock().unwrap();
        assert_eq!(at.len(), 4, "asked until the answer was 'stopped'");
        for pair in at.windows(2) {
            assert!(pair[1] - pair[0] >= STATE_CHECK_PERIOD, "{at:?}");
        }
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
            &bytes[tail(bytes, 1, READ_CHUNK)..],
            b"2026-11-26T10:00:02.000000000Z stdout F three\n"
        );
        assert_eq!(tail(bytes, 0, READ_CHUNK), bytes.len());
        assert_eq!(tail(bytes, 100, READ_CHUNK), 0);
        assert_eq!(tail(b"a\nb", 1, 1), 2, "an unfinished last line counts");
        // Read backwards in chunks of any size, the tail starts where the lines say.
        for text in [bytes, b"a\nb", b"\n\n\n", b"", b"x\n"] {
            let body = text.strip_suffix(b"\n").unwrap_or(text);
            let starts: Vec<usize> = std::iter::once(0)
                .chain((0..body.len()).filter(|&i| body[i] == b'\n').map(|i| i + 1))
                .collect();
            for n in 1..=8 {
                let want = starts.len().checked_sub(n).map_or(0, |i| starts[i]);
                for chunk in 1..=text.len() + 1 {
                    assert_eq!(
                        tail(text, n as u64, chunk),
                        want,
                        "{text:?} n={n} chunk={chunk}"
                    );
                }
            }
        }
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
