//! The static-pod file source: a directory (or one file) of manifests, watched with inotify and
//! rescanned every `check_frequency`, sent to the mux as a SET of every good pod after each change.
//!
//! Reading rules (kubelet `file.go`, with the stricter name filter swiftlet documents):
//! - A directory: every entry directly in it whose name does not start with `.` and ends in
//!   `.yaml`, `.yml` or `.json` (case-insensitive), in name order. Sub-directories and other
//!   non-regular files are skipped.
//! - A single file: that file, whatever its name.
//! - A missing path: an empty SET (so the source still becomes seen), then retried every second
//!   (or every `check_frequency` if shorter) until it appears.
//! - Symlinks: a name that resolves to a regular file is read, like the kubelet does (this keeps
//!   ConfigMap-style `..data` symlink layouts working); a symlink to anything else is skipped. Only
//!   names found directly in the directory are ever opened: nothing is recursed into or joined
//!   from file content. Changes to a symlink's target outside the directory are seen at the next
//!   rescan, not through inotify.
//!
//! An inotify event only says which name to look at again; what the file system holds then decides
//! the outcome (present and parsable: the pod is added or updated; gone: removed). Events are
//! coalesced for [`DEBOUNCE`] so the write, close and rename of one save are handled together.
//! A SET is sent only when the set of good pods (by file name and content) changed, and always
//! once at start.
//!
//! A bad file is logged (`warn`) with its path and reason, listed in the [`Rejections`] map until
//! it is fixed or deleted, and counted once per distinct (file, content); the other pods are
//! untouched. Two files defining the same pod full name: the first by file name wins, the later
//! one is rejected.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::{OsStr, OsString};
use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, ModifyKind};
use notify::{EventKind, RecursiveMode, Watcher as _};
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, mpsc};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::manifest::{self, MAX_POD_BYTES};
use super::{ErrorCounter, SourceUpdate, StoredPod};

/// The `reason` label of a pod whose full name an earlier file already defines.
pub const DUPLICATE_NAME: &str = "duplicate_name";

/// The kubelet's default `--file-check-frequency`.
pub const DEFAULT_CHECK_FREQUENCY: Duration = Duration::from_secs(20);
/// How long events are coalesced before the directory is looked at.
pub const DEBOUNCE: Duration = Duration::from_millis(3);
/// How often a missing path or a failed watch is retried (capped by `check_frequency`).
pub const WATCH_RETRY: Duration = Duration::from_secs(1);

/// Configuration of the file source.
#[derive(Debug, Clone)]
pub struct Config {
    /// A directory of manifests or a single manifest file.
    pub path: PathBuf,
    /// The node name pods are bound to (also part of their names and UIDs).
    pub node_name: String,
    /// Full rescan period (kubelet default 20 s).
    pub check_frequency: Duration,
}

impl Config {
    /// A config with the default check frequency.
    pub fn new(path: impl Into<PathBuf>, node_name: impl Into<String>) -> Self {
        Config {
            path: path.into(),
            node_name: node_name.into(),
            check_frequency: DEFAULT_CHECK_FREQUENCY,
        }
    }
}

/// The files currently rejected, with the reason.
pub type Rejections = Arc<std::sync::RwLock<BTreeMap<PathBuf, String>>>;

/// Runs the file source until `cancel` fires or the mux's receiver is gone.
pub async fn watch(
    cfg: Config,
    tx: mpsc::Sender<SourceUpdate>,
    rejections: Rejections,
    errors: ErrorCounter,
    cancel: CancellationToken,
) {
    let check_frequency = cfg.check_frequency.max(Duration::from_millis(1));
    let retry = WATCH_RETRY.min(check_frequency);
    let mut source = Source {
        cfg,
        files: BTreeMap::new(),
        last_sent: None,
        rejections,
        errors,
        racy: RACY_WINDOW,
        reads: 0,
    };
    let shared = Arc::new(Shared::default());
    let mut watch: Option<ActiveWatch> = None;
    let mut next_retry = Instant::now();
    let mut rescan = tokio::time::interval(check_frequency);
    rescan.set_missed_tick_behavior(MissedTickBehavior::Delay);

    loop {
        let mut scan_all = false;
        let mut names = None;
        if watch.is_none() && Instant::now() >= next_retry {
            watch = ActiveWatch::start(&source.cfg.path, &shared);
            next_retry = Instant::now() + retry;
            // Events before the watch existed are lost: look at everything.
            scan_all = watch.is_some();
        }
        if !scan_all {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                _ = shared.notify.notified() => {
                    tokio::time::sleep(DEBOUNCE).await;
                    let pending = shared.take();
                    if pending.broken {
                        watch = None;
                        next_retry = Instant::now();
                    }
                    if pending.rescan {
                        scan_all = true;
                    } else {
                        names = Some(pending.names);
                    }
                }
                _ = rescan.tick() => scan_all = true,
                _ = tokio::time::sleep_until(next_retry), if watch.is_none() => continue,
            }
        }
        // Directory walks, file reads and the parse of files up to 3 MiB block: they run on a
        // blocking thread, which hands the source back with what to send.
        let Some((back, update)) = super::off_thread(source, "file", move |source| {
            if scan_all {
                source.scan();
            } else if let Some(names) = &names {
                source.refresh_names(names);
            }
            source.publish()
        })
        .await
        else {
            return;
        };
        source = back;
        let Some(update) = update else {
            continue;
        };
        if !super::send(&tx, update, &cancel).await {
            return;
        }
    }
}

/// State shared with the notify callback thread.
#[derive(Default)]
struct Shared {
    pending: Mutex<Pending>,
    notify: Notify,
}

#[derive(Default)]
struct Pending {
    names: BTreeSet<OsString>,
    rescan: bool,
    broken: bool,
}

impl Shared {
    fn take(&self) -> Pending {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        // Plain sets and flags: still consistent after a panic elsewhere.
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn on_event(&self, watched: &Path, res: notify::Result<notify::Event>) {
        let mut p = self.lock();
        match res {
            Ok(ev) => {
                if ev.need_rescan() {
                    p.rescan = true;
                }
                let relevant = match ev.kind {
                    // Our own reads open files; only a close after writing matters.
                    EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
                    EventKind::Access(_) => false,
                    _ => true,
                };
                if !relevant && !p.rescan {
                    return;
                }
                for path in &ev.paths {
                    if path == watched {
                        p.rescan = true;
                        if matches!(
                            ev.kind,
                            EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_))
                        ) {
                            p.broken = true;
                        }
                    } else if let (Some(name), true) =
                        (path.file_name(), path.parent() == Some(watched))
                    {
                        p.names.insert(name.to_owned());
                    }
                }
            }
            Err(e) => {
                tracing::warn!(path = %watched.display(), error = %e, "static pod watch failed; restarting it");
                p.broken = true;
                p.rescan = true;
            }
        }
        drop(p);
        self.notify.notify_one();
    }
}

struct ActiveWatch {
    _watcher: notify::RecommendedWatcher,
}

impl ActiveWatch {
    /// Watches the directory (or a single file's parent directory, so atomic replaces are seen).
    fn start(path: &Path, shared: &Arc<Shared>) -> Option<Self> {
        let dir = match Target::of(path) {
            Target::Dir(d) => d,
            Target::File { dir, .. } => dir,
            Target::Missing => return None,
        };
        let cb_shared = shared.clone();
        let watched = dir.clone();
        let result = notify::recommended_watcher(move |res| cb_shared.on_event(&watched, res))
            .and_then(|mut w| w.watch(&dir, RecursiveMode::NonRecursive).map(|()| w));
        match result {
            Ok(w) => Some(ActiveWatch { _watcher: w }),
            Err(e) => {
                tracing::warn!(path = %dir.display(), error = %e, "cannot watch static pod path; relying on rescans and retrying");
                None
            }
        }
    }
}

/// What the configured path is right now.
enum Target {
    Dir(PathBuf),
    File { dir: PathBuf, name: OsString },
    Missing,
}

impl Target {
    fn of(path: &Path) -> Target {
        match std::fs::metadata(path) {
            Ok(m) if m.is_dir() => Target::Dir(path.to_path_buf()),
            Ok(m) if m.is_file() => match path.file_name() {
                Some(name) => {
                    let dir = match path.parent() {
                        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                        _ => PathBuf::from("."),
                    };
                    Target::File {
                        dir,
                        name: name.to_owned(),
                    }
                }
                None => Target::Missing,
            },
            Ok(_) => {
                tracing::warn!(path = %path.display(), "static pod path is neither a directory nor a regular file");
                Target::Missing
            }
            Err(e) => {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %path.display(), error = %e, "cannot stat static pod path");
                }
                Target::Missing
            }
        }
    }
}

/// A directory entry worth reading: not hidden, a manifest extension.
fn is_candidate(name: &OsStr) -> bool {
    if name.as_encoded_bytes().first() == Some(&b'.') {
        return false;
    }
    Path::new(name)
        .extension()
        .and_then(OsStr::to_str)
        .is_some_and(|e| {
            ["yaml", "yml", "json"]
                .iter()
                .any(|x| e.eq_ignore_ascii_case(x))
        })
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum ContentKey {
    Bytes([u8; 32]),
    TooLarge(u64),
    ReadError(String),
}

struct FileState {
    key: ContentKey,
    /// The parsed pod, kept (and re-sent) as long as the file's content is unchanged.
    outcome: Result<StoredPod, String>,
    /// The duplicate-name reason already reported for this content.
    dup_reported: Option<String>,
    /// While the file does not parse: the last pod it parsed to (and that content's key), still
    /// published. A file rewritten in place (truncated, then written) is seen empty or half
    /// written for a moment; that must not kill its pod. See [`Source::refresh`].
    last_good: Option<(ContentKey, StoredPod)>,
    /// When the current (broken) content was first read.
    since: Instant,
    /// The file's [`Stamp`] before its content was read, when it can be trusted.
    stamp: Option<Stamp>,
}

/// How recent a change may be for a file's stamp to be trusted: a file written twice within
/// one tick of the file system's clock keeps its times and maybe its size, so a stamp taken
/// that soon after a change may not show the next one, and the file is read again at every
/// look until its last change is older than this.
const RACY_WINDOW: Duration = Duration::from_secs(2);

/// What tells that a file's content is the one read before without reading it again: the same
/// inode, size, and modification and change times (a write, a truncation, a rename over the name
/// or a symlink retargeted all change one). Rescans of an unchanged directory then cost one
/// `stat` per manifest instead of an open, a read and a hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    /// The stamp of the regular file `path` resolves to, unless it changed within `racy` (or
    /// its change time is in the future).
    fn of(path: &Path, racy: Duration) -> Option<Stamp> {
        use std::os::unix::fs::MetadataExt as _;
        let m = std::fs::metadata(path).ok()?;
        if !m.is_file() {
            return None;
        }
        let changed = std::time::UNIX_EPOCH
            + Duration::new(
                u64::try_from(m.ctime()).ok()?,
                u32::try_from(m.ctime_nsec()).ok()?,
            );
        let age = std::time::SystemTime::now().duration_since(changed).ok()?;
        (age >= racy).then(|| Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

struct Source {
    cfg: Config,
    /// Keyed by file name inside the directory, so iteration is name order.
    files: BTreeMap<OsString, FileState>,
    /// (file name, content) of the pods in the last SET sent.
    last_sent: Option<Vec<(OsString, ContentKey)>>,
    rejections: Rejections,
    errors: ErrorCounter,
    /// [`RACY_WINDOW`], shorter in tests.
    racy: Duration,
    /// Manifests read, for the tests.
    reads: u64,
}

enum Loaded {
    Gone,
    NotRegular,
    TooLarge(u64),
    Failed(std::io::Error),
    Bytes(Vec<u8>),
}

fn load(path: &Path) -> Loaded {
    use std::io::ErrorKind;
    // Follows symlinks: only a name resolving to a regular file is opened.
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => return Loaded::NotRegular,
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => return Loaded::Gone,
        Err(e) => return Loaded::Failed(e),
    }
    // O_NONBLOCK: should the name have been swapped for a FIFO meanwhile, opening cannot block;
    // the fstat below then rejects it.
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Loaded::Gone,
        Err(e) => return Loaded::Failed(e),
    };
    let meta = match file.metadata() {
        Ok(m) => m,
        Err(e) => return Loaded::Failed(e),
    };
    if !meta.is_file() {
        return Loaded::NotRegular;
    }
    if meta.len() > MAX_POD_BYTES {
        return Loaded::TooLarge(meta.len());
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    if let Err(e) = file.take(MAX_POD_BYTES + 1).read_to_end(&mut bytes) {
        return Loaded::Failed(e);
    }
    let len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if len > MAX_POD_BYTES {
        return Loaded::TooLarge(len);
    }
    Loaded::Bytes(bytes)
}

impl Source {
    /// Looks at every name again.
    fn scan(&mut self) {
        match Target::of(&self.cfg.path) {
            Target::Missing => self.files.clear(),
            Target::File { dir, name } => {
                self.files.retain(|n, _| *n == name);
                self.refresh(&dir, &name);
            }
            Target::Dir(dir) => {
                let entries = match std::fs::read_dir(&dir) {
                    Ok(rd) => rd,
                    Err(e) => {
                        tracing::warn!(path = %dir.display(), error = %e, "cannot list static pod directory");
                        self.files.clear();
                        return;
                    }
                };
                let mut names = BTreeSet::new();
                for entry in entries {
                    match entry {
                        Ok(e) if is_candidate(&e.file_name()) => {
                            names.insert(e.file_name());
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(path = %dir.display(), error = %e, "cannot read static pod directory entry");
                        }
                    }
                }
                self.files.retain(|n, _| names.contains(n));
                for name in &names {
                    self.refresh(&dir, name);
                }
            }
        }
    }

    /// Looks again at the names inotify reported.
    fn refresh_names(&mut self, names: &BTreeSet<OsString>) {
        match Target::of(&self.cfg.path) {
            Target::Missing => self.files.clear(),
            Target::File { dir, name } => {
                if names.contains(&name) {
                    self.refresh(&dir, &name);
                }
            }
            Target::Dir(dir) => {
                for name in names.iter().filter(|n| is_candidate(n)) {
                    self.refresh(&dir, name);
                }
            }
        }
    }

    /// Re-reads one file, re-parsing only if its content changed.
    fn refresh(&mut self, dir: &Path, name: &OsStr) {
        let path = dir.join(name);
        let stamp = Stamp::of(&path, self.racy);
        if let Some(state) = self.files.get_mut(name)
            && stamp.is_some()
            && state.stamp == stamp
        {
            Self::unchanged(state, &path, self.cfg.check_frequency);
            return;
        }
        self.reads += 1;
        let loaded = load(&path);
        let key = match &loaded {
            Loaded::Gone => {
                self.files.remove(name);
                return;
            }
            Loaded::NotRegular => {
                tracing::debug!(path = %path.display(), "skipping non-regular static pod entry");
                self.files.remove(name);
                return;
            }
            Loaded::TooLarge(n) => ContentKey::TooLarge(*n),
            Loaded::Failed(e) => ContentKey::ReadError(e.to_string()),
            Loaded::Bytes(b) => ContentKey::Bytes(Sha256::digest(b).into()),
        };
        // A read error is not a content: the file is read again at the next look.
        let stamp = stamp.filter(|_| !matches!(key, ContentKey::ReadError(_)));
        if let Some(state) = self.files.get_mut(name)
            && state.key == key
        {
            state.stamp = stamp;
            Self::unchanged(state, &path, self.cfg.check_frequency);
            return;
        }
        let outcome = match loaded {
            Loaded::Bytes(b) => manifest::parse(&path, &b, &self.cfg.node_name).map(StoredPod::new),
            Loaded::TooLarge(n) => Err(manifest::too_large(&path, n, MAX_POD_BYTES)),
            Loaded::Failed(source) => Err(manifest::Error::Read {
                path: path.clone(),
                source,
            }),
            Loaded::Gone | Loaded::NotRegular => return,
        }
        .map_err(|e| {
            tracing::warn!(path = %path.display(), reason = %e, "rejected static pod manifest");
            self.errors.inc(e.reason());
            e.to_string()
        });
        // A file that stops parsing keeps the pod it last parsed to, for now.
        let last_good = match (&outcome, self.files.remove(name)) {
            (Ok(_), _) | (Err(_), None) => None,
            (Err(_), Some(previous)) => match previous.outcome {
                Ok(pod) => Some((previous.key, pod)),
                Err(_) => previous.last_good,
            },
        };
        if last_good.is_some() {
            tracing::info!(path = %path.display(), "keeping the pod of the manifest's last good content until it parses again or stays broken for a rescan period");
        }
        self.files.insert(
            name.to_owned(),
            FileState {
                stamp,
                key,
                outcome,
                dup_reported: None,
                last_good,
                since: Instant::now(),
            },
        );
    }

    /// A file found with the same content as before. A broken file that still holds its last
    /// good pod gives it up once it has stayed broken for a whole rescan period: that is a
    /// deliberate edit, not a write caught half-way.
    fn unchanged(state: &mut FileState, path: &Path, check_frequency: Duration) {
        if state.last_good.is_some() && state.since.elapsed() >= check_frequency {
            tracing::warn!(path = %path.display(), after = ?state.since.elapsed(), "static pod manifest still does not parse: removing its pod");
            state.last_good = None;
        }
    }

    /// Updates the rejections and returns a SET if the good pods changed since the last one sent.
    fn publish(&mut self) -> Option<SourceUpdate> {
        let dir = match Target::of(&self.cfg.path) {
            Target::File { dir, .. } => dir,
            _ => self.cfg.path.clone(),
        };
        let mut owners: HashMap<(String, String), PathBuf> = HashMap::new();
        let mut pods = Vec::new();
        let mut ident = Vec::new();
        let mut rejected = BTreeMap::new();
        for (name, st) in &mut self.files {
            let path = dir.join(name);
            let (key, pod) = match (&mut st.outcome, &st.last_good) {
                (Ok(pod), _) => (st.key.clone(), pod.hand_over()),
                (Err(reason), Some((key, pod))) => {
                    rejected.insert(path.clone(), reason.clone());
                    (key.clone(), pod.clone())
                }
                (Err(reason), None) => {
                    rejected.insert(path, reason.clone());
                    continue;
                }
            };
            let full = (
                pod.metadata().namespace.clone().unwrap_or_default(),
                pod.metadata().name.clone().unwrap_or_default(),
            );
            if let Some(first) = owners.get(&full) {
                let reason = format!(
                    "{}: duplicate pod {}/{}: already defined by {}",
                    path.display(),
                    full.0,
                    full.1,
                    first.display()
                );
                if st.dup_reported.as_ref() != Some(&reason) {
                    tracing::warn!(path = %path.display(), reason = %reason, "rejected static pod manifest");
                    self.errors.inc(DUPLICATE_NAME);
                    st.dup_reported = Some(reason.clone());
                }
                rejected.insert(path, reason);
                continue;
            }
            st.dup_reported = None;
            owners.insert(full, path);
            pods.push(pod);
            ident.push((name.clone(), key));
        }
        {
            let mut r = self
                .rejections
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if *r != rejected {
                *r = rejected;
            }
        }
        if self.last_sent.as_ref() == Some(&ident) {
            return None;
        }
        self.last_sent = Some(ident);
        Some(SourceUpdate::Set(pods))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: &str = "node1";
    /// Upper bound for anything to arrive; tests finish as soon as it does.
    const WAIT: Duration = Duration::from_secs(5);

    use crate::config::test_manifest as manifest;

    /// Writes atomically (dotfile + rename), so no half-written content is ever seen.
    fn put(path: &Path, content: impl AsRef<[u8]>) {
        let name = path.file_name().expect("file name").to_string_lossy();
        let tmp = path.with_file_name(format!(".{name}.tmp"));
        std::fs::write(&tmp, content).expect("write");
        std::fs::rename(&tmp, path).expect("rename");
    }

    struct Harness {
        rx: mpsc::Receiver<SourceUpdate>,
        rejections: Rejections,
        errors: ErrorCounter,
        cancel: CancellationToken,
        task: tokio::task::JoinHandle<()>,
    }

    impl Harness {
        fn start(path: &Path, check_frequency: Duration) -> Harness {
            let (tx, rx) = mpsc::channel(16);
            let rejections = Rejections::default();
            let errors = ErrorCounter::detached(crate::config::FILE);
            let cancel = CancellationToken::new();
            let cfg = Config {
                path: path.to_path_buf(),
                node_name: NODE.to_owned(),
                check_frequency,
            };
            let task = tokio::spawn(watch(
                cfg,
                tx,
                rejections.clone(),
                errors.clone(),
                cancel.clone(),
            ));
            Harness {
                rx,
                rejections,
                errors,
                cancel,
                task,
            }
        }

        /// Next SET, as sorted pod names.
        async fn next(&mut self) -> Vec<String> {
            let update = tokio::time::timeout(WAIT, self.rx.recv())
                .await
                .expect("a SET in time")
                .expect("source running");
            let SourceUpdate::Set(pods) = update else {
                panic!("file source sends only SETs");
            };
            let mut names: Vec<String> = pods
                .iter()
                .map(|p| p.metadata().name.clone().unwrap_or_default())
                .collect();
            names.sort();
            names
        }

        /// Waits for a SET with exactly these pod names (skipping intermediate ones).
        async fn until(&mut self, want: &[&str]) {
            let deadline = Instant::now() + WAIT;
            loop {
                let got = tokio::time::timeout_at(deadline, self.next())
                    .await
                    .unwrap_or_else(|_| panic!("no SET with {want:?} in time"));
                if got == want {
                    return;
                }
            }
        }

        /// Asserts that no SET arrives within `d`.
        async fn quiet(&mut self, d: Duration) {
            if let Ok(Some(SourceUpdate::Set(pods))) = tokio::time::timeout(d, self.rx.recv()).await
            {
                let names: Vec<_> = pods.iter().map(|p| p.metadata().name.clone()).collect();
                panic!("unexpected SET {names:?}");
            }
        }

        fn rejected(&self) -> BTreeMap<PathBuf, String> {
            self.rejections.read().expect("lock").clone()
        }

        async fn stop(self) {
            self.cancel.cancel();
            tokio::time::timeout(WAIT, self.task)
                .await
                .expect("stops on cancel")
                .expect("no panic");
        }
    }

    fn source(path: &Path, racy: Duration) -> Source {
        Source {
            cfg: Config {
                path: path.to_path_buf(),
                node_name: NODE.to_owned(),
                check_frequency: DEFAULT_CHECK_FREQUENCY,
            },
            files: BTreeMap::new(),
            last_sent: None,
            rejections: Rejections::default(),
            errors: ErrorCounter::detached(crate::config::FILE),
            racy,
            reads: 0,
        }
    }

    #[test]
    fn a_rescan_reads_only_the_manifests_that_changed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        std::fs::write(d.join("a.yaml"), manifest("a", "busybox:1")).expect("write");
        std::fs::write(d.join("b.yaml"), manifest("b", "busybox:1")).expect("write");
        let mut s = source(d, Duration::ZERO);
        s.scan();
        assert_eq!(s.reads, 2);
        let key_a = s.files[OsStr::new("a.yaml")].key.clone();
        s.scan();
        s.scan();
        assert_eq!(s.reads, 2, "nothing changed: nothing read");

        // Rewritten in place, and renamed over: each is read again.
        std::fs::write(d.join("a.yaml"), manifest("a", "busybox:22")).expect("write");
        s.scan();
        assert_eq!(s.reads, 3);
        assert!(
            s.files[OsStr::new("a.yaml")].key != key_a,
            "the new content"
        );
        std::fs::write(d.join(".b"), manifest("b", "busybox:2")).expect("write");
        std::fs::rename(d.join(".b"), d.join("b.yaml")).expect("mv");
        s.scan();
        assert_eq!(s.reads, 4);
        s.scan();
        assert_eq!(s.reads, 4);
    }

    #[test]
    fn a_manifest_changed_just_now_is_read_at_every_look() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a.yaml"), manifest("a", "x")).expect("write");
        let mut s = source(dir.path(), Duration::from_secs(3600));
        s.scan();
        s.scan();
        assert_eq!(s.reads, 2, "a stamp this recent is not trusted");
    }

    #[tokio::test]
    async fn add_modify_delete() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut h = Harness::start(dir.path(), DEFAULT_CHECK_FREQUENCY);
        assert_eq!(h.next().await, Vec::<String>::new(), "first SET, empty");

        std::fs::write(dir.path().join("a.yaml"), manifest("a", "busybox:1")).expect("write");
        h.until(&["a-node1"]).await;
        std::fs::write(dir.path().join("b.json"), 
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"b"},"spec":{"containers":[{"name":"c","image":"x"}]}}"#)
            .expect("write");
        h.until(&["a-node1", "b-node1"]).await;

        // Modify: a new SET whose pod has the new image and a new UID.
        std::fs::write(dir.path().join("a.yaml"), manifest("a", "busybox:2")).expect("write");
        let deadline = Instant::now() + WAIT;
        loop {
            let Ok(Some(SourceUpdate::Set(pods))) =
                tokio::time::timeout_at(deadline, h.rx.recv()).await
            else {
                panic!("no SET with the new image");
            };
            let image = pods
                .iter()
                .find(|p| p.metadata().name.as_deref() == Some("a-node1"))
                .and_then(|p| {
                    p.pod().whole().ok()?.spec.as_ref()?.containers[0]
                        .image
                        .clone()
                });
            if image.as_deref() == Some("busybox:2") {
                break;
            }
        }

        std::fs::remove_file(dir.path().join("a.yaml")).expect("rm");
        h.until(&["b-node1"]).await;
        // Rename out of the candidate names: removed.
        std::fs::rename(dir.path().join("b.json"), dir.path().join("b.json.bak")).expect("mv");
        h.until(&[]).await;
        // Atomic replace (write a dotfile, rename over): one pod appears.
        std::fs::write(dir.path().join(".tmp"), manifest("c", "x:1")).expect("write");
        std::fs::rename(dir.path().join(".tmp"), dir.path().join("c.yml")).expect("mv");
        h.until(&["c-node1"]).await;
        assert!(h.rejected().is_empty());
        h.stop().await;
    }

    #[tokio::test]
    async fn dotfiles_other_extensions_and_subdirectories_ignored() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a.yaml"), manifest("a", "x")).expect("write");
        let mut h = Harness::start(dir.path(), DEFAULT_CHECK_FREQUENCY);
        assert_eq!(h.next().await, vec!["a-node1"]);

        std::fs::write(dir.path().join(".hidden.yaml"), manifest("h", "x")).expect("write");
        std::fs::write(dir.path().join("notes.txt"), manifest("t", "x")).expect("write");
        let sub = dir.path().join("sub.yaml");
        std::fs::create_dir(&sub).expect("mkdir");
        std::fs::write(sub.join("s.yaml"), manifest("s", "x")).expect("write");
        // A symlink to a directory named like a manifest: skipped.
        std::os::unix::fs::symlink(&sub, dir.path().join("link.yaml")).expect("symlink");
        // None of that changes the SET; a later good file proves events were processed.
        std::fs::write(dir.path().join("z.yaml"), manifest("z", "x")).expect("write");
        h.until(&["a-node1", "z-node1"]).await;
        h.quiet(Duration::from_millis(100)).await;
        assert!(h.rejected().is_empty(), "{:?}", h.rejected());
        h.stop().await;
    }

    #[tokio::test]
    async fn symlink_to_regular_file_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        let target = outside.path().join("real.yaml");
        std::fs::write(&target, manifest("l", "x")).expect("write");
        std::os::unix::fs::symlink(&target, dir.path().join("l.yaml")).expect("symlink");
        let mut h = Harness::start(dir.path(), DEFAULT_CHECK_FREQUENCY);
        assert_eq!(h.next().await, vec!["l-node1"]);
        h.stop().await;
    }

    #[tokio::test]
    async fn bad_file_reported_once_and_recovered() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("good.yaml"), manifest("good", "x")).expect("write");
        let bad = dir.path().join("bad.yaml");
        std::fs::write(&bad, "kind: Pod\napiVersion: v1\nmetadata: [oops\n").expect("write");
        // Fast rescans, to show they do not recount the same failure.
        let mut h = Harness::start(dir.path(), Duration::from_millis(20));
        assert_eq!(h.next().await, vec!["good-node1"], "other pods untouched");
        let rejected = h.rejected();
        let reason = rejected.get(&bad).expect("bad file listed");
        assert!(reason.contains("bad.yaml"), "{reason}");
        assert_eq!(h.errors.total(), 1);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(h.errors.total(), 1, "counted once per (file, content)");

        // Different bad content: a new failure.
        put(&bad, "kind: Pod\napiVersion: v1\nmetadata: {name: b}\n");
        let deadline = Instant::now() + WAIT;
        while h.errors.total() < 2 {
            assert!(Instant::now() < deadline, "second failure not counted");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let reason = h.rejected().get(&bad).cloned().expect("still listed");
        assert!(reason.contains("spec.containers"), "{reason}");

        put(&bad, manifest("fixed", "x"));
        h.until(&["fixed-node1", "good-node1"]).await;
        assert!(h.rejected().is_empty());
        assert_eq!(h.errors.total(), 2);
        assert_eq!(h.errors.get("syntax"), 1);
        assert_eq!(h.errors.get("no_containers"), 1);

        // A bad file that is deleted leaves the rejections.
        std::fs::write(dir.path().join("worse.yaml"), b"\xff\xfe").expect("write");
        let deadline = Instant::now() + WAIT;
        while h.rejected().is_empty() {
            assert!(Instant::now() < deadline, "not rejected");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        std::fs::remove_file(dir.path().join("worse.yaml")).expect("rm");
        let deadline = Instant::now() + WAIT;
        while !h.rejected().is_empty() {
            assert!(Instant::now() < deadline, "rejection not cleared");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        h.stop().await;
    }

    #[tokio::test]
    async fn a_file_caught_half_written_keeps_its_pod_until_it_stays_broken() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.yaml");
        let full = manifest("a", "x:1");
        std::fs::write(&path, &full).expect("write");
        let period = Duration::from_millis(500);
        let mut h = Harness::start(dir.path(), period);
        assert_eq!(h.next().await, vec!["a-node1"]);
        // Rewritten in place as `cat > file` does: empty, half, then whole again. Each state
        // is seen (the pauses outlast the debounce), none drops the pod.
        for part in ["", &full[..full.len() / 2]] {
            std::fs::write(&path, part).expect("write");
            let deadline = Instant::now() + WAIT;
            while h.errors.total() < if part.is_empty() { 1 } else { 2 } {
                assert!(Instant::now() < deadline, "the broken content was not read");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        assert!(h.rejected().contains_key(&path), "the rejection shows");
        std::fs::write(&path, &full).expect("write");
        // Nothing changed for the pod: no SET at all, and the rejection goes.
        h.quiet(Duration::from_millis(300)).await;
        assert!(h.rejected().is_empty());
        // Broken and left broken: the pod goes once a rescan finds it still broken a period
        // later.
        let broken_at = Instant::now();
        std::fs::write(&path, "kind: Pod\nmetadata: [oops\n").expect("write");
        h.until(&[]).await;
        assert!(broken_at.elapsed() >= period, "{:?}", broken_at.elapsed());
        h.stop().await;
    }

    #[tokio::test]
    async fn duplicate_full_name_first_file_wins() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("1.yaml"), manifest("same", "one")).expect("write");
        std::fs::write(dir.path().join("2.yaml"), manifest("same", "two")).expect("write");
        let mut h = Harness::start(dir.path(), Duration::from_millis(20));
        let SourceUpdate::Set(pods) = tokio::time::timeout(WAIT, h.rx.recv())
            .await
            .expect("in time")
            .expect("running")
        else {
            panic!("not a SET");
        };
        assert_eq!(pods.len(), 1);
        let image = pods[0]
            .pod()
            .whole()
            .expect("whole")
            .spec
            .as_ref()
            .and_then(|s| s.containers[0].image.clone());
        assert_eq!(image.as_deref(), Some("one"));
        let reason = h
            .rejected()
            .get(&dir.path().join("2.yaml"))
            .cloned()
            .expect("listed");
        assert!(
            reason.contains("duplicate") && reason.contains("1.yaml"),
            "{reason}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(h.errors.total(), 1);
        assert_eq!(h.errors.get(DUPLICATE_NAME), 1);
        // The first goes away: the second takes over.
        std::fs::remove_file(dir.path().join("1.yaml")).expect("rm");
        let deadline = Instant::now() + WAIT;
        loop {
            let Ok(Some(SourceUpdate::Set(pods))) =
                tokio::time::timeout_at(deadline, h.rx.recv()).await
            else {
                panic!("no SET with the second pod");
            };
            let image = pods.first().and_then(|p| {
                p.pod().whole().ok()?.spec.as_ref()?.containers[0]
                    .image
                    .clone()
            });
            if image.as_deref() == Some("two") {
                break;
            }
        }
        assert!(h.rejected().is_empty());
        h.stop().await;
    }

    #[tokio::test]
    async fn missing_dir_gives_empty_set_then_pods() {
        let parent = tempfile::tempdir().expect("tempdir");
        let dir = parent.path().join("manifests");
        let mut h = Harness::start(&dir, Duration::from_millis(50));
        assert_eq!(h.next().await, Vec::<String>::new());
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::write(dir.join("a.yaml"), manifest("a", "x")).expect("write");
        h.until(&["a-node1"]).await;
        // Directory removed: pods gone; re-created: watched again.
        std::fs::remove_dir_all(&dir).expect("rm -r");
        h.until(&[]).await;
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::write(dir.join("b.yaml"), manifest("b", "x")).expect("write");
        h.until(&["b-node1"]).await;
        h.stop().await;
    }

    #[tokio::test]
    async fn single_file_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("pod.manifest");
        std::fs::write(&file, manifest("one", "x:1")).expect("write");
        std::fs::write(dir.path().join("other.yaml"), manifest("other", "x")).expect("write");
        let mut h = Harness::start(&file, DEFAULT_CHECK_FREQUENCY);
        assert_eq!(h.next().await, vec!["one-node1"]);
        // Replaced atomically: still seen (the parent directory is watched).
        std::fs::write(dir.path().join(".new"), manifest("two", "x:1")).expect("write");
        std::fs::rename(dir.path().join(".new"), &file).expect("mv");
        h.until(&["two-node1"]).await;
        std::fs::remove_file(&file).expect("rm");
        h.until(&[]).await;
        h.stop().await;
    }

    #[tokio::test]
    async fn too_large_file_rejected_without_reading() {
        let dir = tempfile::tempdir().expect("tempdir");
        let big = dir.path().join("big.yaml");
        let f = std::fs::File::create(&big).expect("create");
        f.set_len(MAX_POD_BYTES + 1).expect("set_len");
        let mut h = Harness::start(dir.path(), DEFAULT_CHECK_FREQUENCY);
        assert_eq!(h.next().await, Vec::<String>::new());
        let reason = h.rejected().get(&big).cloned().expect("listed");
        assert!(reason.contains("limit"), "{reason}");
        h.stop().await;
    }

    #[tokio::test]
    async fn stops_when_mux_is_gone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let h = Harness::start(dir.path(), Duration::from_millis(10));
        let Harness { rx, task, .. } = h;
        drop(rx);
        std::fs::write(dir.path().join("a.yaml"), manifest("a", "x")).expect("write");
        tokio::time::timeout(WAIT, task)
            .await
            .expect("stops")
            .expect("no panic");
    }

    #[test]
    fn candidates() {
        for ok in ["a.yaml", "a.yml", "a.json", "A.YAML", "x.y.yaml"] {
            assert!(is_candidate(OsStr::new(ok)), "{ok}");
        }
        for no in [".a.yaml", "a.txt", "yaml", "a.yaml~", "a.yaml.swp", ".."] {
            assert!(!is_candidate(OsStr::new(no)), "{no}");
        }
    }
}
