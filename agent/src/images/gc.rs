//! Image garbage collection, as the kubelet's image manager does it: every
//! `--image-gc-period` (5 minutes) the agent lists the runtime's images and containers, notes
//! when it first saw each image and when a container last used it, and reads how full the image
//! file system is (CRI `ImageFsInfo` names it; `statvfs` sizes it). At or above
//! `--image-gc-high-threshold` percent used (85), it removes images until the use would be at
//! `--image-gc-low-threshold` (80): least recently used first (never used before used, then the
//! first seen first), never an image a container of the runtime uses (running or not), never a
//! pinned image nor the runtime's sandbox image, never one first seen less than
//! `--image-minimum-gc-age` ago (2 minutes; the agent's start counts as first sight, so nothing
//! is removed in its first minutes). It runs on a task of its own, beside the pods' syncs.
use crate::cri::Cri;
use crate::metrics::Metrics;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

pub const DEFAULT_HIGH_THRESHOLD: i64 = 85;
pub const DEFAULT_LOW_THRESHOLD: i64 = 80;
pub const DEFAULT_MINIMUM_AGE: Duration = Duration::from_secs(120);
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(300);

/// A setting the kubelet would refuse.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("--image-gc-high-threshold ({0}) must be between 0 and 100")]
    High(i64),
    #[error("--image-gc-low-threshold ({0}) must be between 0 and 100")]
    Low(i64),
    #[error(
        "--image-gc-low-threshold ({low}) must be less than --image-gc-high-threshold ({high})"
    )]
    Order { low: i64, high: i64 },
    #[error("--image-gc-period must be at least 1s, not {0:?}")]
    Period(Duration),
    #[error(
        "--image-maximum-gc-age ({max:?}) must be greater than --image-minimum-gc-age ({min:?})"
    )]
    MaxAge { max: Duration, min: Duration },
}

/// When and how much to collect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    high: u64,
    low: u64,
    min_age: Duration,
    period: Duration,
    /// `--image-maximum-gc-age`: an image unused this long goes whatever the disk use.
    max_age: Option<Duration>,
}

impl Policy {
    /// Checks the settings as the kubelet checks them: both percentages in 0..=100, the low one
    /// below the high one.
    pub fn new(high: i64, low: i64, min_age: Duration, period: Duration) -> Result<Self, Error> {
        let percent =
            |v: i64, e: fn(i64) -> Error| u64::try_from(v).ok().filter(|v| *v <= 100).ok_or(e(v));
        let (h, l) = (percent(high, Error::High)?, percent(low, Error::Low)?);
        if l >= h {
            return Err(Error::Order { low, high });
        }
        if period < Duration::from_secs(1) {
            return Err(Error::Period(period));
        }
        Ok(Self {
            high: h,
            low: l,
            min_age,
            period,
            max_age: None,
        })
    }

    /// The same policy with `--image-maximum-gc-age` (zero: none, the default), which must
    /// exceed the minimum age.
    pub fn with_max_age(self, max_age: Duration) -> Result<Self, Error> {
        if max_age.is_zero() {
            return Ok(Self {
                max_age: None,
                ..self
            });
        }
        if max_age <= self.min_age {
            return Err(Error::MaxAge {
                max: max_age,
                min: self.min_age,
            });
        }
        Ok(Self {
            max_age: Some(max_age),
            ..self
        })
    }
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            high: DEFAULT_HIGH_THRESHOLD.unsigned_abs(),
            low: DEFAULT_LOW_THRESHOLD.unsigned_abs(),
            min_age: DEFAULT_MINIMUM_AGE,
            period: DEFAULT_PERIOD,
            max_age: None,
        }
    }
}

/// What a pass could not do.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error(transparent)]
    Cri(#[from] crate::cri::Error),
    #[error("the runtime names no image file system (ImageFsInfo)")]
    NoImageFs,
    #[error("sizing the image file system {path}: {source}")]
    Statvfs {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid capacity 0 on the image file system {0}")]
    NoCapacity(PathBuf),
}

/// What the agent knows of one image.
#[derive(Debug, Clone, Copy)]
struct Record {
    first_detected: Instant,
    /// When a container last used it (`None`: never, since the agent started).
    last_used: Option<Instant>,
    size: u64,
    pinned: bool,
}

/// One pass: how full the file system was, how much was to be freed, what went.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    pub usage_percent: u64,
    /// Bytes to free to reach the low threshold (0: below the high one).
    pub wanted: u64,
    /// Bytes freed in all, and of them by `--image-maximum-gc-age`.
    pub freed: u64,
    pub freed_by_age: u64,
    pub removed: Vec<String>,
}

/// A request to [`ImageGc::delete_unused`], answered on the channel it carries.
pub type Request = tokio::sync::oneshot::Sender<Result<Pass, PassError>>;
pub type RequestRx = tokio::sync::mpsc::Receiver<Request>;

/// The handle that sends [`Request`]s to the running collector.
#[derive(Debug, Clone)]
pub struct Requests(tokio::sync::mpsc::Sender<Request>);

impl Requests {
    pub fn channel() -> (Self, RequestRx) {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        (Self(tx), rx)
    }

    /// Deletes every unused image now and answers what was freed (a line for the log).
    pub async fn delete_unused(&self) -> String {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.0.send(tx).await.is_err() {
            return "the image collector has stopped".to_owned();
        }
        match rx.await {
            Ok(Ok(p)) => format!(
                "{} image(s) removed, {} bytes freed",
                p.removed.len(),
                p.freed
            ),
            Ok(Err(e)) => format!("image collection failed: {e}"),
            Err(_) => "the image collector has stopped".to_owned(),
        }
    }
}

pub struct ImageGc {
    cri: Cri,
    policy: Policy,
    metrics: Metrics,
    records: HashMap<String, Record>,
    /// The runtime's sandbox image, once read (see [`sandbox_image`]).
    sandbox_image: Option<String>,
}

impl ImageGc {
    pub fn new(cri: Cri, policy: Policy, metrics: Metrics) -> Self {
        Self {
            cri,
            policy,
            metrics,
            records: HashMap::new(),
            sandbox_image: None,
        }
    }

    /// Collects every `--image-gc-period`, the first time at once, until `cancel`; between
    /// passes it answers the eviction manager's requests to delete every unused image
    /// ([`Requests`]).
    pub async fn run(mut self, mut requests: RequestRx, cancel: CancellationToken) {
        let mut every = tokio::time::interval(self.policy.period);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                Some(reply) = requests.recv() => {
                    let _ = reply.send(self.delete_unused(Instant::now()).await);
                    continue;
                }
                _ = every.tick() => {}
            }
            match self.pass(Instant::now()).await {
                Ok(p) if p.freed - p.freed_by_age < p.wanted => tracing::warn!(
                    usage_percent = p.usage_percent,
                    removed = ?p.removed,
                    "image garbage collection: attempted to free {} bytes, but only found {} bytes eligible to free",
                    p.wanted,
                    p.freed - p.freed_by_age
                ),
                Ok(p) if !p.removed.is_empty() => tracing::info!(
                    usage_percent = p.usage_percent,
                    freed = p.freed,
                    removed = ?p.removed,
                    "image garbage collection freed space"
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "image garbage collection"),
            }
        }
    }

    /// Lists images and containers: records images seen for the first time, marks those a
    /// container uses (by image ID, tag or digest) as used now, forgets images gone. Answers
    /// the IDs of the images in use.
    async fn detect(&mut self, now: Instant) -> Result<HashSet<String>, PassError> {
        if self.sandbox_image.is_none() {
            self.sandbox_image = sandbox_image(&self.cri).await;
        }
        let images = self.cri.list_images().await?;
        let containers = self.cri.list_containers(None).await?;
        let named: HashSet<&str> = containers
            .iter()
            .flat_map(|c| {
                let spec = c.image.as_ref().map(|s| s.image.as_str());
                std::iter::once(c.image_ref.as_str()).chain(spec)
            })
            .chain(self.sandbox_image.as_deref())
            .filter(|s| !s.is_empty())
            .collect();
        let mut in_use = HashSet::new();
        for i in &images {
            let used = named.contains(i.id.as_str())
                || i.repo_tags.iter().any(|t| named.contains(t.as_str()))
                || i.repo_digests.iter().any(|d| named.contains(d.as_str()));
            let r = self.records.entry(i.id.clone()).or_insert(Record {
                first_detected: now,
                last_used: None,
                size: i.size,
                pinned: i.pinned,
            });
            r.size = i.size;
            r.pinned = i.pinned;
            if used {
                r.last_used = Some(now);
                in_use.insert(i.id.clone());
            }
        }
        let held: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        self.records.retain(|id, _| held.contains(id.as_str()));
        Ok(in_use)
    }

    /// One collection at `now` (see the module documentation).
    pub async fn pass(&mut self, now: Instant) -> Result<Pass, PassError> {
        let started = Instant::now();
        let in_use = self.detect(now).await?;
        let mut pass = Pass::default();
        if let Some(max_age) = self.policy.max_age {
            for (id, r) in unused_longer_than(&self.records, &in_use, now, max_age) {
                self.remove(
                    &mut pass,
                    id,
                    r,
                    "unused longer than --image-maximum-gc-age",
                )
                .await;
            }
            pass.freed_by_age = pass.freed;
        }
        let fs = self.cri.image_fs_info().await?;
        let mount = fs
            .image_filesystems
            .iter()
            .find_map(|f| f.fs_id.as_ref().map(|id| PathBuf::from(&id.mountpoint)))
            .ok_or(PassError::NoImageFs)?;
        let (capacity, available) =
            crate::cm::filesystem_space(&mount).map_err(|source| PassError::Statvfs {
                path: mount.clone(),
                source,
            })?;
        if capacity == 0 {
            return Err(PassError::NoCapacity(mount));
        }
        let available = available.min(capacity);
        let usage_percent = 100 - available.saturating_mul(100) / capacity;
        pass.usage_percent = usage_percent;
        pass.wanted = 0;
        if usage_percent >= self.policy.high {
            pass.wanted =
                (capacity.saturating_mul(100 - self.policy.low) / 100).saturating_sub(available);
            self.free(&mut pass, now, &in_use).await;
        }
        self.metrics
            .image_gc_pass_duration_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(pass)
    }

    /// Removes every image no container uses that is older than `--image-minimum-gc-age`,
    /// whatever the disk use (the kubelet's `DeleteUnusedImages`, run under disk pressure
    /// before pods are evicted).
    pub async fn delete_unused(&mut self, now: Instant) -> Result<Pass, PassError> {
        let in_use = self.detect(now).await?;
        let mut pass = Pass {
            wanted: u64::MAX,
            ..Pass::default()
        };
        self.free(&mut pass, now, &in_use).await;
        Ok(pass)
    }

    /// Removes eligible images, least recently used first, until `pass.wanted` bytes are freed.
    async fn free(&mut self, pass: &mut Pass, now: Instant, in_use: &HashSet<String>) {
        let candidates = eviction_order(&self.records, in_use, now, self.policy.min_age);
        for (id, r) in candidates {
            if pass.freed - pass.freed_by_age >= pass.wanted {
                break;
            }
            self.remove(
                pass,
                id,
                r,
                "the image file system is above the high threshold",
            )
            .await;
        }
    }

    /// Removes one image, counting it in `pass` and the metrics.
    async fn remove(&mut self, pass: &mut Pass, id: String, r: Record, why: &'static str) {
        match self.cri.remove_image(&id).await {
            Ok(()) => {
                tracing::info!(image = %id, size = r.size, why, "image removed by garbage collection");
                self.records.remove(&id);
                pass.freed += r.size;
                pass.removed.push(id);
                self.metrics.image_gc_removed_total.inc();
                self.metrics.image_gc_freed_bytes_total.inc_by(r.size);
            }
            Err(e) => tracing::warn!(image = %id, error = %e, "removing an image"),
        }
    }
}

/// The images no container uses and the runtime does not pin that also pass `keep_if`.
fn removable(
    records: &HashMap<String, Record>,
    in_use: &HashSet<String>,
    keep_if: impl Fn(&Record) -> bool,
) -> Vec<(String, Record)> {
    records
        .iter()
        .filter(|(id, r)| !in_use.contains(*id) && !r.pinned && keep_if(r))
        .map(|(id, r)| (id.clone(), *r))
        .collect()
}

/// The removable images whose last use (or, never used, their first sight) is more than
/// `max_age` before `now`.
fn unused_longer_than(
    records: &HashMap<String, Record>,
    in_use: &HashSet<String>,
    now: Instant,
    max_age: Duration,
) -> Vec<(String, Record)> {
    let mut out = removable(records, in_use, |r| {
        now.saturating_duration_since(r.last_used.unwrap_or(r.first_detected)) > max_age
    });
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The images that may be removed at `now`, in the order they go: not in use, not pinned, first
/// seen at least `min_age` ago; never used before used, then least recently used, then first
/// seen first (the kubelet's order).
fn eviction_order(
    records: &HashMap<String, Record>,
    in_use: &HashSet<String>,
    now: Instant,
    min_age: Duration,
) -> Vec<(String, Record)> {
    let mut candidates = removable(records, in_use, |r| {
        now.saturating_duration_since(r.first_detected) >= min_age
    });
    candidates.sort_by(|a, b| {
        (a.1.last_used, a.1.first_detected, &a.0).cmp(&(b.1.last_used, b.1.first_detected, &b.0))
    });
    candidates
}

/// The image the runtime runs sandboxes from, which counts as in use (the kubelet keeps its
/// `--pod-infra-container-image` the same way): the image containerd names in its CRI
/// configuration (`Status` with `verbose`: `config.sandboxImage`). Runtimes that mark the image
/// `pinned` are covered by that too. `None` (logged) when the runtime does not say.
async fn sandbox_image(cri: &Cri) -> Option<String> {
    let info = match cri.status(true).await {
        Ok(s) => s.info,
        Err(e) => {
            tracing::warn!(error = %e, "asking the runtime for its sandbox image");
            return None;
        }
    };
    let image = info
        .get("config")
        .and_then(|c| serde_json::from_str::<serde_json::Value>(c).ok())
        .and_then(|c| c["sandboxImage"].as_str().map(str::to_owned))
        .filter(|i| !i.is_empty());
    if image.is_none() {
        tracing::warn!("the runtime does not name its sandbox image: only a pinned one is kept");
    }
    image
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_settings_are_checked_as_the_kubelet_checks_them() {
        let m = DEFAULT_MINIMUM_AGE;
        let p = DEFAULT_PERIOD;
        assert_eq!(
            Policy::new(85, 80, m, p).expect("defaults"),
            Policy::default()
        );
        assert!(Policy::new(100, 0, m, p).is_ok());
        let e = Policy::new(101, 80, m, p).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--image-gc-high-threshold (101) must be between 0 and 100"
        );
        assert!(matches!(Policy::new(85, -1, m, p), Err(Error::Low(-1))));
        let e = Policy::new(80, 80, m, p).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--image-gc-low-threshold (80) must be less than --image-gc-high-threshold (80)"
        );
        assert!(matches!(
            Policy::new(85, 80, m, Duration::from_millis(10)),
            Err(Error::Period(_))
        ));
    }

    #[test]
    fn images_go_never_used_first_then_least_recently_used_and_never_in_use_pinned_or_young() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let record = |first: u64, used: Option<u64>, pinned: bool| Record {
            first_detected: at(first),
            last_used: used.map(at),
            size: 1,
            pinned,
        };
        let records: HashMap<String, Record> = [
            ("used-late", record(0, Some(50), false)),
            ("used-early", record(0, Some(20), false)),
            ("never-used-late", record(30, None, false)),
            ("never-used-early", record(10, None, false)),
            ("in-use", record(0, Some(90), false)),
            ("pinned", record(0, None, true)),
            ("young", record(95, None, false)),
        ]
        .into_iter()
        .map(|(id, r)| (id.to_owned(), r))
        .collect();
        let in_use = HashSet::from(["in-use".to_owned()]);
        let order: Vec<String> =
            eviction_order(&records, &in_use, at(100), Duration::from_secs(60))
                .into_iter()
                .map(|(id, _)| id)
                .collect();
        assert_eq!(
            order,
            [
                "never-used-early",
                "never-used-late",
                "used-early",
                "used-late"
            ]
        );
    }

    #[test]
    fn statvfs_sizes_a_file_system() {
        let (capacity, available) =
            crate::cm::filesystem_space(std::path::Path::new("/")).expect("statvfs /");
        assert!(
            capacity > 0 && available <= capacity,
            "{capacity} {available}"
        );
        assert!(crate::cm::filesystem_space(std::path::Path::new("/nonexistent/x")).is_err());
    }

    #[test]
    fn the_maximum_age_takes_unused_images_by_their_last_use() {
        let p = Policy::default();
        assert_eq!(p.with_max_age(Duration::ZERO).unwrap().max_age, None);
        let e = p.with_max_age(Duration::from_secs(60)).unwrap_err();
        assert!(e.to_string().contains("must be greater than"), "{e}");
        assert!(p.with_max_age(Duration::from_secs(121)).is_ok());
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let record = |first: u64, used: Option<u64>, pinned: bool| Record {
            first_detected: at(first),
            last_used: used.map(at),
            size: 1,
            pinned,
        };
        let records: HashMap<String, Record> = [
            ("never-used-old", record(0, None, false)),
            ("used-long-ago", record(0, Some(10), false)),
            ("used-lately", record(0, Some(95), false)),
            ("in-use", record(0, Some(0), false)),
            ("pinned", record(0, None, true)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let in_use: HashSet<String> = ["in-use".to_owned()].into();
        let old: Vec<String> =
            unused_longer_than(&records, &in_use, at(100), Duration::from_secs(60))
                .into_iter()
                .map(|(id, _)| id)
                .collect();
        assert_eq!(old, ["never-used-old", "used-long-ago"]);
    }
}
