//! Container log rotation: the kubelet's container log manager.
//!
//! The runtime writes each container's stdout and stderr into one CRI log file (its
//! `ContainerStatus.log_path`, `<pod-logs-dir>/<ns>_<name>_<uid>/<container>/<restart>.log`) and
//! never rotates it. Every `--container-log-monitor-interval` this module lists the running
//! containers of this node and, for each whose current log is at least `--container-log-max-size`
//! bytes, rotates it as the kubelet does (the log's path comes from the container's labels, the
//! layout of `pod::log_paths`; when no file is there the runtime's `ContainerStatus` says where):
//!
//! 1. the files beside it named `<log>.*` are read; leftovers of an unfinished rotation are
//!    removed (`.tmp` files of a compression cut short, and uncompressed files whose `.gz`
//!    exists);
//! 2. the oldest rotated files (by name, which sorts by their timestamp) are removed until at most
//!    `max-files - 2` remain: with the current file and the one about to be rotated, that makes
//!    `max-files`;
//! 3. every rotated file not yet compressed is gzip-compressed into `<file>.gz` (through
//!    `<file>.tmp`, renamed when complete), so only the newest rotated file is ever uncompressed;
//! 4. the current log is renamed `<log>.<YYYYmmdd-HHMMSS>` (local time) and the runtime is asked to
//!    reopen the container's log (CRI `ReopenContainerLog`), which creates a new current file. If
//!    the runtime refuses, the file is renamed back and the rotation is tried again next pass.
//!
//! A container whose log file is missing gets its log reopened. The pass runs on a task of its
//! own (file work on blocking threads), at most `--container-log-max-workers` containers at
//! once, so pod syncs never wait for it; a negative max size turns rotation off. Each pass is
//! timed in `swiftlet_container_log_rotation_pass_duration_seconds`, each rotation counted in
//! `swiftlet_container_log_rotations_total` and each failure in
//! `swiftlet_container_log_rotation_errors_total`.
//!
//! [`links`] makes and removes the links log shippers read in the containers directory.
pub mod links;

use crate::cri::Cri;
use crate::metrics::Metrics;
use crate::pod::labels;
use crate::pod::quantity::Quantity;
use crate::pod_cache::{PodCache, QuietListing};
use futures::StreamExt;
use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// `--container-log-max-size`'s default, the kubelet's.
pub const DEFAULT_MAX_SIZE: &str = "10Mi";
/// `--container-log-max-files`'s default, the kubelet's.
pub const DEFAULT_MAX_FILES: i64 = 5;
/// `--container-log-monitor-interval`'s default, the kubelet's.
pub const DEFAULT_MONITOR_INTERVAL: Duration = Duration::from_secs(10);
/// The shortest monitor interval the kubelet accepts.
pub const MIN_MONITOR_INTERVAL: Duration = Duration::from_secs(3);
/// `--container-log-max-workers`'s default, the kubelet's.
pub const DEFAULT_MAX_WORKERS: i64 = 1;
/// The format of a rotated log's suffix (the kubelet's `20060102-150405`, in local time).
pub const TIMESTAMP_FORMAT: &str = "%Y%m%d-%H%M%S";

const COMPRESSED: &str = ".gz";
const TEMPORARY: &str = ".tmp";

/// A setting of the rotation that cannot be used; each names the flag, its config field and the
/// value.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "--container-log-max-size (containerLogMaxSize) {value:?}: {reason} (use a quantity such as 10Mi; negative turns rotation off)"
    )]
    MaxSize { value: String, reason: String },
    #[error(
        "--container-log-max-files (containerLogMaxFiles) {0}: must be equal to or greater than 2"
    )]
    MaxFiles(i64),
    #[error(
        "--container-log-max-workers (containerLogMaxWorkers) {0}: must be equal to or greater than 1"
    )]
    MaxWorkers(i64),
    #[error(
        "--container-log-monitor-interval (containerLogMonitorInterval) {0:?}: must be equal to or greater than 3s"
    )]
    MonitorInterval(Duration),
}

/// How container logs are rotated (`--container-log-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Bytes at which a current log is rotated; `None`: rotation is off (a negative size).
    pub max_size: Option<u64>,
    /// Log files kept per container: the current one and `max_files - 1` rotated ones.
    pub max_files: usize,
    pub monitor_interval: Duration,
    /// Containers whose logs are looked at and rotated at once.
    pub max_workers: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            max_size: Some(10 << 20),
            max_files: 5,
            monitor_interval: DEFAULT_MONITOR_INTERVAL,
            max_workers: 1,
        }
    }
}

impl Policy {
    /// Checks the settings as the kubelet checks them: max files at least 2, max workers at
    /// least 1, the interval at least 3 s, the size a quantity (negative: rotation off).
    pub fn new(
        max_size: &str,
        max_files: i64,
        monitor_interval: Duration,
        max_workers: i64,
    ) -> Result<Self, Error> {
        let size_err = |reason: String| Error::MaxSize {
            value: max_size.to_owned(),
            reason,
        };
        let size = Quantity::parse(max_size).map_err(|e| size_err(e.to_string()))?;
        if size.nanos() % 1_000_000_000 != 0 {
            return Err(size_err("not a whole number of bytes".to_owned()));
        }
        let max_size = match u64::try_from(size.value()) {
            Ok(bytes) => Some(bytes),
            Err(_) if size.value() < 0 => None,
            Err(_) => return Err(size_err("too large".to_owned())),
        };
        let max_files = usize::try_from(max_files)
            .ok()
            .filter(|n| *n >= 2)
            .ok_or(Error::MaxFiles(max_files))?;
        let max_workers = usize::try_from(max_workers)
            .ok()
            .filter(|n| *n >= 1)
            .ok_or(Error::MaxWorkers(max_workers))?;
        if monitor_interval < MIN_MONITOR_INTERVAL {
            return Err(Error::MonitorInterval(monitor_interval));
        }
        Ok(Self {
            max_size,
            max_files,
            monitor_interval,
            max_workers,
        })
    }
}

/// What a rotation does to the files beside a container's current log before renaming it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Leftovers of unfinished rotations, then the oldest rotated files beyond the limit.
    pub remove: Vec<PathBuf>,
    /// Rotated files not yet compressed (each becomes `<file>.gz`).
    pub compress: Vec<PathBuf>,
}

/// Plans a rotation from the files named `<log>.*` (`rotated`) and the policy's `max_files`.
pub fn plan(rotated: &[PathBuf], max_files: usize) -> Plan {
    let names: HashSet<&Path> = rotated.iter().map(PathBuf::as_path).collect();
    let mut plan = Plan::default();
    let mut kept = Vec::new();
    for file in rotated {
        let text = file.as_os_str().to_string_lossy();
        let leftover = text.ends_with(TEMPORARY)
            || (!text.ends_with(COMPRESSED)
                && names.contains(with_suffix(file, COMPRESSED).as_path()));
        if leftover {
            plan.remove.push(file.clone());
        } else {
            kept.push(file.clone());
        }
    }
    kept.sort();
    let excess = kept.len().saturating_sub(max_files.saturating_sub(2));
    plan.remove.extend(kept.drain(..excess));
    plan.compress = kept
        .into_iter()
        .filter(|f| !f.as_os_str().to_string_lossy().ends_with(COMPRESSED))
        .collect();
    plan
}

/// `path` with `suffix` appended to its file name.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// The name a log rotated at `now` gets: `<log>.<YYYYmmdd-HHMMSS>`.
pub fn rotated_name(log: &Path, now: &jiff::Zoned) -> PathBuf {
    with_suffix(log, &format!(".{}", now.strftime(TIMESTAMP_FORMAT)))
}

/// The files beside `log` named `<log>.*`, sorted.
pub fn rotated_files(log: &Path) -> io::Result<Vec<PathBuf>> {
    let (Some(dir), Some(name)) = (log.parent(), log.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("log path {} has no directory or file name", log.display()),
        ));
    };
    let mut prefix = name.to_owned();
    prefix.push(".");
    let prefix = prefix.as_encoded_bytes();
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().as_encoded_bytes().starts_with(prefix))
        .map(|e| e.path())
        .collect();
    out.sort();
    Ok(out)
}

/// Removes a container's log and every file rotated from it (`<log>` and `<log>.*`), as the
/// kubelet does before it removes a container; returns how many files went. A directory that is
/// gone already is no error.
pub fn remove_container_logs(log: &Path) -> io::Result<usize> {
    let mut files = match rotated_files(log) {
        Ok(files) => files,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    files.push(log.to_owned());
    let mut removed = 0;
    for file in files {
        if file.symlink_metadata().is_ok() {
            remove_file(&file)?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Compresses `file` into `<file>.gz` through `<file>.tmp` (same permissions), then removes
/// `file`. A failure leaves `file` as it was and removes the temporary file.
pub fn compress(file: &Path) -> io::Result<()> {
    let tmp = with_suffix(file, TEMPORARY);
    let result = (|| {
        let mut input = std::fs::File::open(file)?;
        let mode = input.metadata()?.permissions();
        let out = private_file(&tmp)?;
        out.set_permissions(mode)?;
        let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
        io::copy(&mut input, &mut gz)?;
        gz.finish()?.sync_all()?;
        std::fs::rename(&tmp, with_suffix(file, COMPRESSED))
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(io::Error::new(
            e.kind(),
            format!("compressing {}: {e}", file.display()),
        ));
    }
    remove_file(file)
}

/// A new file at `path`, readable by its owner only from the moment it exists (a leftover at
/// `path` is removed first, never reused with its mode): the log text written into it is never
/// readable by others on the way.
fn private_file(path: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    remove_file(path)?;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// Removes a file; one already gone is no error.
fn remove_file(file: &Path) -> io::Result<()> {
    match std::fs::remove_file(file) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io::Error::new(
            e.kind(),
            format!("removing {}: {e}", file.display()),
        )),
        _ => Ok(()),
    }
}

/// The file half of a rotation of `log` (see the module documentation): cleans up, removes the
/// excess, compresses, and renames `log` to `rotated`, which is returned. Reopening the log is
/// the caller's. A `rotated` that exists already (two rotations within a second) is an error and
/// nothing is renamed.
pub fn rotate_files(log: &Path, max_files: usize, rotated: PathBuf) -> io::Result<PathBuf> {
    let plan = plan(&rotated_files(log)?, max_files);
    for file in &plan.remove {
        remove_file(file)?;
    }
    for file in &plan.compress {
        compress(file)?;
    }
    if rotated.exists() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists already", rotated.display()),
        ));
    }
    std::fs::rename(log, &rotated).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("renaming {} to {}: {e}", log.display(), rotated.display()),
        )
    })?;
    Ok(rotated)
}

/// Why one container's log was not rotated.
#[derive(Debug, thiserror::Error)]
pub enum RotateError {
    #[error(transparent)]
    Cri(#[from] crate::cri::Error),
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("a blocking task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// The running containers a pass looks at: (container id, where its log is when its labels
/// say).
type Running = Arc<[(String, Option<PathBuf>)]>;

/// The rotation task: one per agent.
pub struct LogManager {
    cri: Cri,
    policy: Policy,
    node_name: String,
    pod_logs_dir: PathBuf,
    metrics: Metrics,
    /// The running containers, listed again only when they may have changed (see
    /// [`LogManager::running`]).
    listed: QuietListing<Running>,
}

impl LogManager {
    /// Rotates the logs of the containers of node `node_name` (the agent's own, by their
    /// `swiftlet.io/node-name` label) below `pod_logs_dir`.
    pub fn new(
        cri: Cri,
        policy: Policy,
        node_name: String,
        pod_logs_dir: PathBuf,
        metrics: Metrics,
        pod_cache: PodCache,
    ) -> Self {
        Self {
            cri,
            policy,
            node_name,
            pod_logs_dir,
            metrics,
            listed: QuietListing::new(pod_cache),
        }
    }

    /// Where the runtime writes `c`'s log, from its pod and container labels and its restart
    /// count annotation (the layout the agent gave the runtime); `None` when one is missing.
    pub fn log_path(&self, c: &k8s_cri::v1::Container) -> Option<PathBuf> {
        let label = |key: &str| c.labels.get(key).map(String::as_str);
        let dir = crate::pod::log_paths::pod_log_dir(
            &self.pod_logs_dir,
            label(labels::POD_NAMESPACE)?,
            label(labels::POD_NAME)?,
            label(labels::POD_UID)?,
        );
        let restarts = c
            .annotations
            .get(labels::CONTAINER_RESTART_COUNT)?
            .parse()
            .ok()?;
        Some(dir.join(crate::pod::log_paths::container_log(
            label(labels::CONTAINER_NAME)?,
            restarts,
        )))
    }

    /// Runs a pass every monitor interval until `cancel` fires. Returns at once when rotation
    /// is off.
    pub async fn run(self, cancel: CancellationToken) {
        if self.policy.max_size.is_none() {
            tracing::info!("container log rotation is off (negative --container-log-max-size)");
            return;
        }
        tracing::info!(policy = ?self.policy, "rotating container logs");
        let mut tick = tokio::time::interval(self.policy.monitor_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            let pass = tokio::select! {
                () = cancel.cancelled() => return,
                pass = self.pass() => pass,
            };
            if let Err(error) = pass {
                tracing::warn!(%error, "container log rotation: listing the running containers");
            }
        }
    }

    /// This node's running containers: the last listing while the pod cache shows that nothing
    /// started, stopped or exited since it began (the kernel path trusted all along), else a
    /// new `ListContainers`. An idle node's pass then asks the runtime nothing.
    async fn running(&self) -> crate::cri::Result<Running> {
        self.listed
            .get(async {
                let filter = k8s_cri::v1::ContainerFilter {
                    state: Some(k8s_cri::v1::ContainerStateValue {
                        state: k8s_cri::v1::ContainerState::ContainerRunning.into(),
                    }),
                    label_selector: [(labels::NODE_NAME.to_owned(), self.node_name.clone())].into(),
                    ..Default::default()
                };
                let listed = self.cri.list_containers(Some(filter)).await?;
                Ok(listed
                    .iter()
                    .map(|c| (c.id.clone(), self.log_path(c)))
                    .collect())
            })
            .await
    }

    /// One pass over this node's running containers; returns how many logs were rotated.
    pub async fn pass(&self) -> crate::cri::Result<usize> {
        let start = Instant::now();
        let rotated = match self.running().await {
            Ok(containers) => {
                // Every log's size in one blocking call (not a thread hand-off per container);
                // the ones known to be under the limit are done.
                let small = self.logs_under_limit(&containers).await;
                let due: Vec<(String, Option<PathBuf>)> = containers
                    .iter()
                    .filter(|(id, _)| !small.contains(id))
                    .cloned()
                    .collect();
                let rotated = futures::stream::iter(due)
                    .map(|(id, log)| async move {
                        match self.rotate_if_due(&id, log).await {
                            Ok(rotated) => usize::from(rotated),
                            Err(error) => {
                                self.metrics.container_log_rotation_errors_total.inc();
                                tracing::warn!(container = %id, %error, "rotating a container's log");
                                0
                            }
                        }
                    })
                    .buffer_unordered(self.policy.max_workers)
                    .fold(0, |n, r| async move { n + r })
                    .await;
                Ok(rotated)
            }
            Err(e) => Err(e),
        };
        self.metrics
            .container_log_rotation_pass_duration_seconds
            .observe(start.elapsed().as_secs_f64());
        rotated
    }

    /// The IDs of `containers` whose log is where [`Self::log_path`] says and smaller than the
    /// rotation size (a failed look counts as not known to be).
    async fn logs_under_limit(&self, containers: &Running) -> HashSet<String> {
        let Some(max_size) = self.policy.max_size else {
            return HashSet::new();
        };
        let logs = containers.clone();
        blocking(move || {
            logs.iter()
                .filter(|(_, log)| {
                    log.as_ref().is_some_and(
                        |log| matches!(size_of(log), Ok(Some(size)) if size < max_size),
                    )
                })
                .map(|(id, _)| id.clone())
                .collect()
        })
        .await
        .unwrap_or_default()
    }

    /// Looks at container `id`'s log and rotates it if it is due; true when it was rotated. When
    /// the runtime fails to reopen the log, the rotated file is renamed back and the runtime's
    /// error returned.
    ///
    /// `known` is where the log should be (from the container's labels, see
    /// [`LogManager::log_path`]); without it, or when no file is there, the runtime is asked
    /// (CRI `ContainerStatus`), so a steady pass costs one `ListContainers` and a `stat` per
    /// container.
    pub async fn rotate_if_due(
        &self,
        id: &str,
        known: Option<PathBuf>,
    ) -> Result<bool, RotateError> {
        let Some(max_size) = self.policy.max_size else {
            return Ok(false);
        };
        let mut size = match &known {
            Some(log) => stat(log.clone()).await?,
            None => None,
        };
        let mut log = known.unwrap_or_default();
        if size.is_none() {
            let Some(status) = self.cri.container_status(id).await? else {
                return Ok(false);
            };
            if status.log_path.is_empty() {
                return Ok(false);
            }
            log = PathBuf::from(status.log_path);
            size = stat(log.clone()).await?;
        }
        let size = match size {
            Some(size) => size,
            None => {
                // Removed by someone else: the runtime writes nowhere until it reopens it.
                self.cri.reopen_container_log(id).await?;
                tracing::info!(container = %id, log = %log.display(), "reopened a container log that was missing");
                return Ok(false);
            }
        };
        if size < max_size {
            return Ok(false);
        }
        let max_files = self.policy.max_files;
        let target = rotated_name(&log, &jiff::Zoned::now());
        let rotated = blocking({
            let log = log.clone();
            move || rotate_files(&log, max_files, target)
        })
        .await??;
        if let Err(e) = self.cri.reopen_container_log(id).await {
            // Renamed back, so the next pass tries again (as the kubelet does).
            let back = blocking({
                let (rotated, log) = (rotated.clone(), log.clone());
                move || std::fs::rename(rotated, log)
            })
            .await?;
            if let Err(error) = back {
                tracing::error!(container = %id, rotated = %rotated.display(), %error, "renaming a rotated log back after the runtime failed to reopen it");
            }
            return Err(e.into());
        }
        self.metrics.container_log_rotations_total.inc();
        tracing::debug!(container = %id, log = %log.display(), size, "rotated a container log");
        Ok(true)
    }
}

/// The size of file `path`; `None` when there is no such file.
async fn stat(path: PathBuf) -> Result<Option<u64>, RotateError> {
    Ok(blocking(move || size_of(&path)).await??)
}

/// The size of file `path`; `None` when there is no such file. Blocking.
fn size_of(path: &Path) -> io::Result<Option<u64>> {
    match std::fs::metadata(path) {
        Ok(meta) => Ok(Some(meta.len())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Runs file work on a blocking thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    tokio::task::spawn_blocking(f).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn paths(dir: &Path, names: &[&str]) -> Vec<PathBuf> {
        names.iter().map(|n| dir.join(n)).collect()
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        out.sort();
        out
    }

    fn gunzip(path: &Path) -> String {
        let mut out = String::new();
        flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
            .read_to_string(&mut out)
            .unwrap();
        out
    }

    #[test]
    fn plan_removes_leftovers_and_the_oldest_and_compresses_the_rest() {
        let d = Path::new("/l");
        let rotated = paths(
            d,
            &[
                "0.log.20240101-000003",
                "0.log.20240101-000001.gz",
                "0.log.20240101-000002",
                "0.log.20240101-000002.gz",
                "0.log.20240101-000003.tmp",
                "0.log.20240101-000004",
            ],
        );
        // max 4 files: the current, the one about to be rotated, and 2 rotated ones.
        let p = plan(&rotated, 4);
        assert_eq!(
            p.remove,
            paths(
                d,
                &[
                    // 000002 was compressed already; the .tmp is an unfinished compression.
                    "0.log.20240101-000002",
                    "0.log.20240101-000003.tmp",
                    // The oldest beyond max-files - 2.
                    "0.log.20240101-000001.gz",
                    "0.log.20240101-000002.gz",
                ]
            )
        );
        assert_eq!(
            p.compress,
            paths(d, &["0.log.20240101-000003", "0.log.20240101-000004"])
        );
        // max-files 2: no rotated file is kept beside the one about to be rotated.
        let p = plan(&rotated, 2);
        assert!(p.compress.is_empty());
        assert_eq!(p.remove.len(), rotated.len());
        // Nothing there: nothing to do.
        assert_eq!(plan(&[], 5), Plan::default());
    }

    #[test]
    fn rotation_renames_compresses_and_keeps_max_files() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        let other = dir.path().join("1.log.20200101-000000"); // another restart's: not ours
        std::fs::write(&other, "x").unwrap();
        let mut rotations = Vec::new();
        for i in 1..=5 {
            std::fs::write(&log, format!("line {i}\n")).unwrap();
            let target = with_suffix(&log, &format!(".20240101-00000{i}"));
            rotations.push(rotate_files(&log, 3, target.clone()).unwrap());
            assert_eq!(rotations.last(), Some(&target));
            assert!(!log.exists(), "the current log was renamed");
        }
        // 3 files: the current one (the runtime's to create), 2 rotated; the newest uncompressed.
        assert_eq!(
            names(dir.path()),
            [
                "0.log.20240101-000004.gz",
                "0.log.20240101-000005",
                "1.log.20200101-000000",
            ]
        );
        assert_eq!(
            gunzip(&dir.path().join("0.log.20240101-000004.gz")),
            "line 4\n"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("0.log.20240101-000005")).unwrap(),
            "line 5\n"
        );
        // A second rotation within the same second loses nothing: the earlier file is
        // compressed before the name is reused.
        std::fs::write(&log, "line 6\n").unwrap();
        let same = dir.path().join("0.log.20240101-000005");
        rotate_files(&log, 3, same.clone()).unwrap();
        assert_eq!(std::fs::read_to_string(&same).unwrap(), "line 6\n");
        assert_eq!(gunzip(&with_suffix(&same, COMPRESSED)), "line 5\n");
    }

    #[test]
    fn leftovers_of_an_unfinished_rotation_are_cleaned_up() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("2.log");
        std::fs::write(&log, "now\n").unwrap();
        for (name, body) in [
            ("2.log.20240101-000001", "half\n"),
            ("2.log.20240101-000001.gz", ""),
            ("2.log.20240101-000002.tmp", "cut"),
            ("2.log.20240101-000002", "two\n"),
        ] {
            std::fs::write(dir.path().join(name), body).unwrap();
        }
        rotate_files(&log, 5, dir.path().join("2.log.20240101-000003")).unwrap();
        assert_eq!(
            names(dir.path()),
            [
                "2.log.20240101-000001.gz",
                "2.log.20240101-000002.gz",
                "2.log.20240101-000003",
            ]
        );
        assert_eq!(
            gunzip(&dir.path().join("2.log.20240101-000002.gz")),
            "two\n"
        );
    }

    #[test]
    fn compression_keeps_the_mode_and_a_failure_leaves_the_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        // The compressed text goes into a file readable by its owner only from its creation,
        // never into a leftover with the leftover's mode.
        let scratch = tempfile::tempdir().unwrap();
        let tmp = scratch.path().join("0.log.tmp");
        std::fs::write(&tmp, "left over").unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o666)).unwrap();
        let fresh = private_file(&tmp).unwrap().metadata().unwrap();
        assert_eq!(
            (fresh.permissions().mode() & 0o777, fresh.len()),
            (0o600, 0)
        );
        let file = dir.path().join("0.log.20240101-000001");
        std::fs::write(&file, "a\nb\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
        compress(&file).unwrap();
        let gz = with_suffix(&file, COMPRESSED);
        assert_eq!(
            std::fs::metadata(&gz).unwrap().permissions().mode() & 0o777,
            0o640
        );
        assert_eq!(gunzip(&gz), "a\nb\n");
        assert!(!file.exists());
        let missing = dir.path().join("nothing");
        let err = compress(&missing).unwrap_err();
        assert!(err.to_string().contains("nothing"), "{err}");
        assert_eq!(names(dir.path()), ["0.log.20240101-000001.gz"]);
    }

    #[test]
    fn rotated_names_carry_the_kubelets_timestamp() {
        let at: jiff::Zoned = "2024-03-05T07:08:09+00:00[UTC]".parse().unwrap();
        assert_eq!(
            rotated_name(Path::new("/var/log/pods/ns_p_u/c/0.log"), &at),
            PathBuf::from("/var/log/pods/ns_p_u/c/0.log.20240305-070809")
        );
        // Sorting by name sorts by time.
        let later: jiff::Zoned = "2024-12-01T00:00:00+00:00[UTC]".parse().unwrap();
        assert!(rotated_name(Path::new("0.log"), &at) < rotated_name(Path::new("0.log"), &later));
    }

    #[test]
    fn policy_is_checked_as_the_kubelet_checks_it() {
        let ten = Duration::from_secs(10);
        let p = Policy::new(DEFAULT_MAX_SIZE, 5, ten, 1).unwrap();
        assert_eq!(p, Policy::default());
        assert_eq!(
            Policy::new("64Ki", 2, ten, 1).unwrap().max_size,
            Some(65536)
        );
        assert_eq!(
            Policy::new("1M", 2, ten, 1).unwrap().max_size,
            Some(1_000_000)
        );
        assert_eq!(Policy::new("-1", 5, ten, 1).unwrap().max_size, None);
        for (size, what) in [("ten", "malformed"), ("0.5", "whole number")] {
            let err = Policy::new(size, 5, ten, 1).unwrap_err();
            assert!(matches!(err, Error::MaxSize { .. }), "{err}");
            assert!(err.to_string().contains(what), "{err}");
            assert!(
                err.to_string().contains("--container-log-max-size"),
                "{err}"
            );
        }
        let err = Policy::new("10Mi", 1, ten, 1).unwrap_err();
        assert!(matches!(err, Error::MaxFiles(1)), "{err}");
        assert!(
            err.to_string().contains("equal to or greater than 2"),
            "{err}"
        );
        assert!(matches!(
            Policy::new("10Mi", 5, ten, 0),
            Err(Error::MaxWorkers(0))
        ));
        let err = Policy::new("10Mi", 5, Duration::from_secs(2), 1).unwrap_err();
        assert!(matches!(err, Error::MonitorInterval(_)), "{err}");
        assert!(err.to_string().contains("3s"), "{err}");
    }

    #[tokio::test]
    async fn a_containers_log_path_comes_from_its_labels() {
        let cri = Cri::new("unix:///nonexistent/cri.sock", Metrics::new()).unwrap();
        let m = LogManager::new(
            cri,
            Policy::default(),
            "node".into(),
            "/var/log/pods".into(),
            Metrics::new(),
            PodCache::default(),
        );
        let mut c = k8s_cri::v1::Container {
            labels: [
                (labels::POD_NAMESPACE, "ns"),
                (labels::POD_NAME, "web"),
                (labels::POD_UID, "u-1"),
                (labels::CONTAINER_NAME, "main"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .into(),
            annotations: [(labels::CONTAINER_RESTART_COUNT.to_owned(), "2".to_owned())].into(),
            ..Default::default()
        };
        assert_eq!(
            m.log_path(&c),
            Some(PathBuf::from("/var/log/pods/ns_web_u-1/main/2.log"))
        );
        // Without its restart count (or any label) the runtime is asked instead.
        c.annotations.clear();
        assert_eq!(m.log_path(&c), None);
    }

    #[test]
    fn a_removed_containers_logs_go_with_it_and_no_other() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "1.log",
            "1.log.20240101-000001.gz",
            "1.log.20240101-000002",
            "2.log",
            "10.log",
        ] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        assert_eq!(remove_container_logs(&dir.path().join("1.log")).unwrap(), 3);
        assert_eq!(names(dir.path()), ["10.log", "2.log"]);
        // Nothing left, or no directory at all: nothing to do.
        assert_eq!(remove_container_logs(&dir.path().join("1.log")).unwrap(), 0);
        assert_eq!(
            remove_container_logs(&dir.path().join("gone/0.log")).unwrap(),
            0
        );
    }

    #[test]
    fn only_files_named_after_the_log_are_its_rotated_files() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "0.log",
            "0.log.1",
            "0.log.2.gz",
            "0.logx",
            "10.log.1",
            "1.log.1",
        ] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        assert_eq!(
            rotated_files(&dir.path().join("0.log")).unwrap(),
            paths(dir.path(), &["0.log.1", "0.log.2.gz"])
        );
        let err = rotated_files(&dir.path().join("none/0.log")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}
