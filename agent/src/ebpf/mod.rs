//! eBPF probes: loading them and reading what the kernel saw.
//!
//! [`Monitor::start`] loads the probes built from `agent-ebpf/` (embedded at build time), attaches
//! the `cgroup:cgroup_mkdir`/`cgroup_rmdir` and `sched:sched_process_exec`/`sched_process_exit`
//! tracepoints and the uprobes on the agent's own CRI markers ([`crate::cri`]), and spawns one
//! reader task ([`reader`]) that sleeps until the kernel wakes it for a record
//! (`tokio::io::unix::AsyncFd`), then drains the ring buffer at once and every [`GATHER`] while
//! records keep coming (the probes send no wake-ups meanwhile), until the cancellation token
//! fires.
//! Cgroup events are logged at debug level, kept in a bounded ring of recent events and broadcast
//! to subscribers; every event is also sent to the optional [`Config::events`] sink (the
//! startup timelines, and the exit detector [`exits`]).
//!
//! The cgroup probes report only cgroups whose path starts with [`Config::cgroup_prefix`] (the
//! agent's pod root), in the kernel: the rest of the host's cgroups never wake the reader.
//! The process probes only report tasks below the pod root cgroup (`<cgroup-root>/kubepods`) in
//! the cgroup2 hierarchy (on a hybrid host runc also places containers in
//! `/sys/fs/cgroup/unified`): the loader makes sure that directory exists and hands its cgroup id
//! (its inode number) and level to the probes. The exit code is read from `task_struct` at the
//! offset found in the kernel's BTF ([`btf`]).
//!
//! The probes need to know where the fields of the tracepoint record are; this module reads them
//! from the tracepoint's `format` file (mounting tracefs when it is missing and we are root) and
//! writes them into the probes' read-only globals before the verifier sees the program.

pub mod btf;
pub mod exits;
mod reader;
pub mod tracefs;

use std::{
    collections::VecDeque,
    fmt,
    str::FromStr,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, MapData, MapError, PerCpuArray, RingBuf},
    programs::{ProgramError, RawTracePoint, TracePoint, UProbe, uprobe::UProbeScope},
};
use std::path::{Path, PathBuf};
use swiftlet_ebpf_common as common;
use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::{broadcast, mpsc},
};
use tokio_util::sync::CancellationToken;

/// How many recent cgroup events [`Monitor::recent_cgroup_events`] keeps.
pub const RECENT_CAPACITY: usize = 4096;
/// Capacity of the broadcast channel behind [`Monitor::subscribe`]; slower subscribers see
/// `RecvError::Lagged`.
pub const BROADCAST_CAPACITY: usize = 1024;

/// How often a woken reader drains the ring buffer after its first drain, for as long as drains
/// find records (see [`reader`]). Records submitted meanwhile wake nobody, unless a quarter of the ring
/// (`WAKEUP_THRESHOLD_BYTES`) is waiting, which ends the wait at once. So this bounds how late an
/// event is delivered (its `ktime_ns` is taken in the kernel and is exact regardless).
pub const GATHER: std::time::Duration = std::time::Duration::from_millis(10);

/// The probe object built by `build.rs` (aya-build), aligned for the ELF parser; `None` in a
/// build without the `ebpf` feature.
#[cfg(feature = "ebpf")]
pub fn probe_object() -> Option<&'static [u8]> {
    Some(aya::include_bytes_aligned!(concat!(
        env!("OUT_DIR"),
        "/swiftlet-ebpf"
    )))
}

#[cfg(not(feature = "ebpf"))]
pub fn probe_object() -> Option<&'static [u8]> {
    None
}

/// Whether this binary carries the eBPF probes (the `ebpf` cargo feature).
pub const BUILT_IN: bool = cfg!(feature = "ebpf");

/// The tracepoints the probes attach to; the program names equal the tracepoint names.
const CGROUP_TRACEPOINTS: [&str; 2] = ["cgroup_mkdir", "cgroup_rmdir"];
/// The same probes as raw tracepoints (program, tracepoint): used when the kernel's BTF gives the
/// struct offsets they need; they skip the trace record the kernel assembles for the others.
const CGROUP_RAW_TRACEPOINTS: [(&str, &str); 2] = [
    ("cg_mkdir_raw", "cgroup_mkdir"),
    ("cg_rmdir_raw", "cgroup_rmdir"),
];
/// `(struct, member)` offsets the raw cgroup probes read, in the order of
/// [`RAW_CGROUP_GLOBALS`].
const RAW_CGROUP_FIELDS: [(&str, &str); 5] = [
    ("cgroup", "level"),
    ("cgroup", "kn"),
    ("cgroup", "root"),
    ("kernfs_node", "id"),
    ("cgroup_root", "hierarchy_id"),
];
const RAW_CGROUP_GLOBALS: [&str; 5] = [
    common::globals::CGRP_LEVEL_OFFSET,
    common::globals::CGRP_KN_OFFSET,
    common::globals::CGRP_ROOT_OFFSET,
    common::globals::KN_ID_OFFSET,
    common::globals::ROOT_HIERARCHY_ID_OFFSET,
];
const SCHED_TRACEPOINTS: [&str; 2] = ["sched_process_exec", "sched_process_exit"];
/// Uprobe programs and the agent symbols they attach to.
const CRI_UPROBES: [(&str, &str); 2] = [
    ("cri_begin", common::CRI_BEGIN_SYMBOL),
    ("cri_end", common::CRI_END_SYMBOL),
];

/// What the probes should watch besides cgroups.
#[derive(Debug, Default)]
pub struct Config {
    /// The cgroup (relative to each hierarchy's root, e.g. `/kubepods`) every pod cgroup lives
    /// below. The process probes report only tasks below it; `None` turns them off.
    pub pod_root: Option<String>,
    /// The path prefix (relative to each hierarchy's root, e.g. `/kubepods`) of the cgroups whose
    /// creation and removal the cgroup probes report; the kernel drops the others before they
    /// cost the agent anything. `None` (or a prefix longer than
    /// `swiftlet_ebpf_common::CGROUP_PREFIX_MAX`) reports every cgroup of the host.
    pub cgroup_prefix: Option<String>,
    /// Receives every decoded event (cgroup, process, CRI marker) in ring-buffer order.
    pub events: Option<mpsc::UnboundedSender<KernelEvent>>,
    /// Attach the uprobes on this binary's `swiftlet_cri_call_begin`/`_end` markers (a binary that
    /// never calls them, such as a test, may not contain them).
    pub cri_markers: bool,
    /// Use the classic `cgroup:*` tracepoints even when BTF allows the cheaper raw ones (for
    /// comparing the two).
    pub classic_cgroup_tracepoints: bool,
}

/// A process in a pod cgroup ran `execve` or exited.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ProcessEvent {
    /// CLOCK_MONOTONIC nanoseconds.
    pub ktime_ns: u64,
    pub pid: u32,
    pub tgid: u32,
    /// The task's cgroup2 id (its container's cgroup).
    pub cgroup_id: u64,
    pub comm: String,
    /// Exit only: the container-style exit code (the status, or 128 + the signal number), when
    /// the kernel's layout was known.
    pub exit_code: Option<i32>,
}

/// The agent entered a CRI call marker.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CriMark {
    /// CLOCK_MONOTONIC nanoseconds.
    pub ktime_ns: u64,
    pub method: &'static str,
    /// The pod UID the call was about (empty when none).
    pub uid: String,
    /// `None` for a begin marker; the call's outcome for an end marker.
    pub ok: Option<bool>,
}

/// Everything the probes report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelEvent {
    Cgroup(CgroupEvent),
    Exec(ProcessEvent),
    Exit(ProcessEvent),
    Cri(CriMark),
}

/// Container-style exit code from a raw `task_struct::exit_code`.
pub fn exit_code(raw: u32) -> Option<i32> {
    if raw == common::EXIT_CODE_UNKNOWN {
        return None;
    }
    let signal = raw & 0x7f;
    Some(if signal != 0 {
        128 + signal as i32
    } else {
        ((raw >> 8) & 0xff) as i32
    })
}

fn process_event(r: &common::ProcessRecord<'_>) -> ProcessEvent {
    ProcessEvent {
        ktime_ns: r.ktime_ns,
        pid: r.pid,
        tgid: r.tgid,
        cgroup_id: r.cgroup_id,
        comm: String::from_utf8_lossy(r.comm).into_owned(),
        exit_code: exit_code(r.exit_code),
    }
}

fn cri_mark(r: &common::CriRecord<'_>, end: bool) -> CriMark {
    CriMark {
        ktime_ns: r.ktime_ns,
        method: common::cri_method_name(r.method),
        uid: String::from_utf8_lossy(r.uid).into_owned(),
        ok: end.then_some(r.ok),
    }
}

/// Whether to run the eBPF probes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Load them if this machine allows; otherwise warn and carry on without.
    #[default]
    Auto,
    /// Load them or fail.
    On,
    /// Do not load them.
    Off,
}

/// `Mode` was not one of `auto`, `on`, `off`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid eBPF mode {0:?}: expected \"auto\", \"on\" or \"off\"")]
pub struct ParseModeError(pub String);

impl FromStr for Mode {
    type Err = ParseModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "on" => Ok(Self::On),
            "off" => Ok(Self::Off),
            other => Err(ParseModeError(other.to_owned())),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::On => "on",
            Self::Off => "off",
        })
    }
}

/// Which tracepoint produced a [`CgroupEvent`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum CgroupEventKind {
    #[serde(rename = "cgroup_mkdir")]
    Mkdir,
    #[serde(rename = "cgroup_rmdir")]
    Rmdir,
}

impl fmt::Display for CgroupEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Mkdir => "cgroup_mkdir",
            Self::Rmdir => "cgroup_rmdir",
        })
    }
}

/// A cgroup directory the kernel created or removed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CgroupEvent {
    pub kind: CgroupEventKind,
    /// Path relative to the hierarchy's mount point, e.g. `/kubepods/burstable/pod<uid>`. With
    /// cgroup v1 the same path is reported once per hierarchy (see `hierarchy_id`).
    pub path: String,
    /// Depth below the hierarchy root (a top-level directory is 1).
    pub level: u32,
    /// CLOCK_MONOTONIC nanoseconds when the tracepoint fired.
    pub ktime_ns: u64,
    /// The kernel's hierarchy id (`root` in the tracepoint); tells v1 hierarchies apart.
    pub hierarchy_id: u32,
    /// The kernel's cgroup id.
    pub cgroup_id: u64,
}

/// What failed while loading or attaching the probes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the eBPF monitor must be started inside a tokio runtime")]
    NoRuntime,
    #[error(
        "this swiftlet was built without its eBPF probes (cargo feature `ebpf` off); rebuild \
         with the default features, or run with --ebpf auto or off"
    )]
    NotBuilt,
    #[error("tracefs: {0}")]
    Tracefs(#[from] tracefs::Error),
    #[error("cgroup_mkdir and cgroup_rmdir have different record layouts ({mkdir:?} vs {rmdir:?})")]
    LayoutMismatch {
        mkdir: tracefs::CgroupLayout,
        rmdir: tracefs::CgroupLayout,
    },
    #[error("loading the eBPF object: {0}")]
    Load(#[source] aya::EbpfError),
    #[error("eBPF program {name} is not in the object")]
    MissingProgram { name: &'static str },
    #[error("eBPF program {name}: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("eBPF map {name} is not in the object")]
    MissingMap { name: &'static str },
    #[error("eBPF map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: MapError,
    },
    #[error("registering the ring buffer with tokio: {0}")]
    AsyncFd(#[source] std::io::Error),
    #[error("eBPF uprobe {name} on {symbol} in this binary: {source}")]
    Uprobe {
        name: &'static str,
        symbol: &'static str,
        #[source]
        source: Box<ProgramError>,
    },
    #[error("no cgroup2 hierarchy is mounted (needed to follow pod processes)")]
    NoCgroup2,
    #[error("pod root cgroup {path}: {source}")]
    PodRoot {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// State shared between the reader task and every [`Monitor`] handle.
#[derive(Debug)]
struct Shared {
    recent: Mutex<VecDeque<CgroupEvent>>,
    tx: broadcast::Sender<CgroupEvent>,
    seen: AtomicU64,
    /// Records the agent could not decode (counted as lost).
    undecodable: AtomicU64,
    /// The reader's drains, and those that found no record (see [`Monitor::reader_drains`]).
    drains: AtomicU64,
    empty_drains: AtomicU64,
    /// Times the kernel woke the reader (see [`Monitor::reader_wakeups`]).
    wakeups: AtomicU64,
    /// Set when the reader task ended (cancelled, or the ring could not be polled).
    reader_stopped: AtomicBool,
    sink: Option<mpsc::UnboundedSender<KernelEvent>>,
}

impl Shared {
    fn new(sink: Option<mpsc::UnboundedSender<KernelEvent>>) -> Self {
        let (tx, _) = broadcast::channel(BROADCAST_CAPACITY);
        Self {
            recent: Mutex::new(VecDeque::with_capacity(RECENT_CAPACITY)),
            tx,
            seen: AtomicU64::new(0),
            undecodable: AtomicU64::new(0),
            drains: AtomicU64::new(0),
            empty_drains: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
            reader_stopped: AtomicBool::new(false),
            sink,
        }
    }

    fn forward(&self, event: KernelEvent) {
        if let Some(sink) = &self.sink {
            // A closed sink (the timeline stopped) is fine.
            let _ = sink.send(event);
        }
    }

    /// Decodes one ring-buffer record and hands it out.
    fn record(&self, bytes: &[u8]) {
        let event = match common::decode(bytes) {
            Ok(common::Event::CgroupMkdir(r)) => cgroup_event(CgroupEventKind::Mkdir, &r),
            Ok(common::Event::CgroupRmdir(r)) => cgroup_event(CgroupEventKind::Rmdir, &r),
            Ok(other) => {
                self.seen.fetch_add(1, Ordering::Relaxed);
                let event = match other {
                    common::Event::Exec(r) => KernelEvent::Exec(process_event(&r)),
                    common::Event::Exit(r) => KernelEvent::Exit(process_event(&r)),
                    common::Event::CriBegin(r) => KernelEvent::Cri(cri_mark(&r, false)),
                    common::Event::CriEnd(r) => KernelEvent::Cri(cri_mark(&r, true)),
                    common::Event::CgroupMkdir(_) | common::Event::CgroupRmdir(_) => return,
                };
                tracing::trace!(?event, "eBPF event");
                self.forward(event);
                return;
            }
            Err(error) => {
                self.undecodable.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%error, len = bytes.len(), "undecodable eBPF event");
                return;
            }
        };
        self.seen.fetch_add(1, Ordering::Relaxed);
        match event.kind {
            CgroupEventKind::Mkdir => tracing::debug!(
                path = %event.path,
                level = event.level,
                hierarchy_id = event.hierarchy_id,
                "cgroup_mkdir"
            ),
            CgroupEventKind::Rmdir => tracing::debug!(
                path = %event.path,
                level = event.level,
                hierarchy_id = event.hierarchy_id,
                "cgroup_rmdir"
            ),
        }
        {
            let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
            if recent.len() >= RECENT_CAPACITY {
                recent.pop_front();
            }
            recent.push_back(event.clone());
        }
        self.forward(KernelEvent::Cgroup(event.clone()));
        // No subscribers is fine.
        let _ = self.tx.send(event);
    }
}

fn cgroup_event(kind: CgroupEventKind, r: &common::CgroupRecord<'_>) -> CgroupEvent {
    CgroupEvent {
        kind,
        path: String::from_utf8_lossy(r.path).into_owned(),
        level: r.level,
        ktime_ns: r.ktime_ns,
        hierarchy_id: r.hierarchy_id,
        cgroup_id: r.cgroup_id,
    }
}

/// A handle on the running probes. Cheap to clone.
#[derive(Clone)]
pub struct Monitor {
    shared: Arc<Shared>,
    lost: Arc<PerCpuArray<MapData, u64>>,
    /// The cgroup2 directory every pod lives below, when the process probes are loaded.
    pod_root: Option<PathBuf>,
}

impl fmt::Debug for Monitor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Monitor")
            .field("events_seen", &self.events_seen())
            .finish_non_exhaustive()
    }
}

impl Monitor {
    /// Off -> `Ok(None)`. Auto -> loads what it can; on failure logs a warning (with the reason)
    /// and returns `Ok(None)`. On -> a failure is `Err(Error)` naming what failed.
    ///
    /// Must be called inside a tokio runtime (the reader task is spawned on it). The probes stay
    /// attached until `cancel` fires.
    pub fn start(
        mode: Mode,
        config: Config,
        cancel: CancellationToken,
    ) -> Result<Option<Monitor>, Error> {
        match mode {
            Mode::Off => Ok(None),
            Mode::On => Self::load(config, cancel).map(Some),
            Mode::Auto => match Self::load(config, cancel) {
                Ok(monitor) => Ok(Some(monitor)),
                Err(error) => {
                    tracing::warn!(
                        %error,
                        "eBPF probes unavailable; running without them (set the eBPF mode to \
                         \"on\" to make this fatal)"
                    );
                    Ok(None)
                }
            },
        }
    }

    /// The most recent cgroup events, oldest first (at most [`RECENT_CAPACITY`]).
    pub fn recent_cgroup_events(&self) -> Vec<CgroupEvent> {
        let recent = self
            .shared
            .recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        recent.iter().cloned().collect()
    }

    /// Every cgroup event from now on (the channel holds [`BROADCAST_CAPACITY`]).
    pub fn subscribe(&self) -> broadcast::Receiver<CgroupEvent> {
        self.shared.tx.subscribe()
    }

    /// Events decoded since start.
    pub fn events_seen(&self) -> u64 {
        self.shared.seen.load(Ordering::Relaxed)
    }

    /// How often the reader drained the ring buffer since start, and how many of those drains
    /// found no record. The reader drains only after the kernel woke it for a record and for as
    /// long as records keep coming; each burst ends with one drain that finds nothing.
    pub fn reader_drains(&self) -> (u64, u64) {
        (
            self.shared.drains.load(Ordering::Relaxed),
            self.shared.empty_drains.load(Ordering::Relaxed),
        )
    }

    /// How many times the kernel woke the reader for records (each wake-up costs the probe that
    /// sent it several microseconds: see [`reader`]).
    pub fn reader_wakeups(&self) -> u64 {
        self.shared.wakeups.load(Ordering::Relaxed)
    }

    /// False once the reader task has ended: no event reaches the agent any more.
    pub fn reader_running(&self) -> bool {
        !self.shared.reader_stopped.load(Ordering::Relaxed)
    }

    /// The cgroup2 directory every pod cgroup is below, when the process probes are loaded
    /// (without them container exits are not seen).
    pub fn pod_cgroup_dir(&self) -> Option<&Path> {
        self.pod_root.as_deref()
    }

    /// Events that never reached the agent: the probes' loss counters (ring buffer full, record
    /// unreadable), summed over CPUs, plus records the agent could not decode.
    pub fn events_lost(&self) -> u64 {
        let mut total = self.shared.undecodable.load(Ordering::Relaxed);
        for index in 0..common::lost::COUNT {
            match self.lost.get(&index, 0) {
                Ok(per_cpu) => total = total.saturating_add(per_cpu.iter().sum::<u64>()),
                Err(error) => tracing::debug!(%error, index, "reading the eBPF loss counter"),
            }
        }
        total
    }

    fn load(config: Config, cancel: CancellationToken) -> Result<Monitor, Error> {
        let object = probe_object().ok_or(Error::NotBuilt)?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        raise_memlock_rlimit();

        let tracefs = tracefs::ensure_mounted()?;
        let layout = tracefs::cgroup_layout(&tracefs, "cgroup_mkdir")?;
        let rmdir = tracefs::cgroup_layout(&tracefs, "cgroup_rmdir")?;
        if layout != rmdir {
            return Err(Error::LayoutMismatch {
                mkdir: layout,
                rmdir,
            });
        }

        // Without a cgroup2 hierarchy (a pure cgroup v1 host) the process probes cannot tell pod
        // processes apart: the cgroup and CRI probes still load.
        let pod_root = match config.pod_root.as_deref().map(pod_root_cgroup).transpose() {
            Ok(root) => root,
            Err(error) => {
                tracing::warn!(%error, "process exec/exit probes off");
                None
            }
        };
        let exit_code_offset =
            match btf::member_offset(Path::new(btf::VMLINUX), "task_struct", "exit_code") {
                Ok(offset) => offset,
                Err(error) => {
                    tracing::warn!(%error, "exit codes will not be reported by the eBPF probes");
                    0
                }
            };
        let root_level = pod_root.as_ref().map_or(0, |r| r.level);
        let raw_offsets = match btf::member_offsets(Path::new(btf::VMLINUX), &RAW_CGROUP_FIELDS) {
            Ok(_) if config.classic_cgroup_tracepoints => None,
            Ok(offsets) => Some(offsets),
            Err(error) => {
                tracing::info!(%error, "cgroup probes use classic tracepoints");
                None
            }
        };

        let prefix = config.cgroup_prefix.as_deref().unwrap_or_default();
        let prefix_words = common::cgroup_prefix_words(prefix.as_bytes());
        if prefix_words.is_none() && !prefix.is_empty() {
            tracing::warn!(
                prefix,
                max = common::CGROUP_PREFIX_MAX,
                "cgroup prefix too long for the probes: every cgroup of the host is reported"
            );
        }
        let prefix_len = prefix_words.map_or(0u32, |_| prefix.len() as u32);
        let prefix_words = prefix_words.unwrap_or_default();
        let mut loader = EbpfLoader::new();
        loader
            .override_global(common::globals::CGROUP_PREFIX, &prefix_words, true)
            .override_global(common::globals::CGROUP_PREFIX_LEN, &prefix_len, true);
        if let Some(offsets) = &raw_offsets {
            for (name, offset) in RAW_CGROUP_GLOBALS.iter().zip(offsets) {
                loader.override_global(name, offset, true);
            }
        }
        let mut ebpf = loader
            .override_global(common::globals::CGROUP_ROOT_OFFSET, &layout.root, true)
            .override_global(common::globals::CGROUP_LEVEL_OFFSET, &layout.level, true)
            .override_global(common::globals::CGROUP_ID_OFFSET, &layout.id, true)
            .override_global(common::globals::CGROUP_PATH_OFFSET, &layout.path, true)
            .override_global(common::globals::POD_ROOT_LEVEL, &root_level, true)
            .override_global(
                common::globals::TASK_EXIT_CODE_OFFSET,
                &exit_code_offset,
                true,
            )
            .load(object)
            .map_err(Error::Load)?;
        if raw_offsets.is_some() {
            for (name, tracepoint) in CGROUP_RAW_TRACEPOINTS {
                attach_raw_tracepoint(&mut ebpf, name, &[tracepoint])?;
            }
        } else {
            for name in CGROUP_TRACEPOINTS {
                attach_tracepoint(&mut ebpf, name, "cgroup", &[name])?;
            }
        }
        if let Some(root) = &pod_root {
            let mut map: Array<_, u64> = Array::try_from(
                ebpf.map_mut(common::MAP_POD_ROOT)
                    .ok_or(Error::MissingMap {
                        name: common::MAP_POD_ROOT,
                    })?,
            )
            .map_err(|source| Error::Map {
                name: common::MAP_POD_ROOT,
                source,
            })?;
            map.set(0, root.id, 0).map_err(|source| Error::Map {
                name: common::MAP_POD_ROOT,
                source,
            })?;
            for name in SCHED_TRACEPOINTS {
                attach_tracepoint(&mut ebpf, name, "sched", &[name])?;
            }
        }
        if config.cri_markers {
            let exe = PathBuf::from("/proc/self/exe");
            for (name, symbol) in CRI_UPROBES {
                attach_uprobe(&mut ebpf, name, &[symbol], &exe)?;
            }
        }

        let events = take_map(&mut ebpf, common::MAP_EVENTS)?;
        let events = RingBuf::try_from(events).map_err(|source| Error::Map {
            name: common::MAP_EVENTS,
            source,
        })?;
        let reader_flag = take_map(&mut ebpf, common::MAP_READER)?;
        let reader_flag = Array::try_from(reader_flag).map_err(|source| Error::Map {
            name: common::MAP_READER,
            source,
        })?;
        let wakeups = reader::Wakeups::new(reader_flag, &events);
        let lost = take_map(&mut ebpf, common::MAP_LOST)?;
        let lost = PerCpuArray::try_from(lost).map_err(|source| Error::Map {
            name: common::MAP_LOST,
            source,
        })?;

        let events = {
            let _entered = runtime.enter();
            // SAFETY: the RingBuf owns the map's file descriptor (an `OwnedFd` inside `MapData`),
            // which stays open and unchanged until the `AsyncFd` drops it; we never swap it out
            // (the reader's only `get_mut` use is `reader::drain`, which reads records).
            unsafe { AsyncFd::register_with_interest(events, Interest::READABLE) }
                .map_err(|e| Error::AsyncFd(e.into_parts().1))?
        };
        let shared = Arc::new(Shared::new(config.events));
        runtime.spawn(reader::read_events(
            events,
            wakeups,
            ebpf,
            Arc::clone(&shared),
            cancel,
        ));
        // Loading parsed the kernel's BTF (several MiB, freed again by now); glibc keeps freed
        // heap pages mapped, so hand them back or they count in the agent's RSS forever.
        crate::memory::trim_now();
        tracing::info!(
            raw_cgroup_tracepoints = raw_offsets.is_some(),
            process_probes = pod_root.is_some(),
            pod_root = ?pod_root,
            cgroup_prefix = prefix,
            exit_code_offset,
            cri_markers = config.cri_markers,
            tracefs = %tracefs.display(),
            "eBPF probes attached"
        );
        Ok(Monitor {
            shared,
            lost: Arc::new(lost),
            pod_root: pod_root.map(|r| r.dir),
        })
    }
}

/// The loaded-or-not program `name` as a `P` (tracepoint, raw tracepoint, ...).
fn program<'a, P>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut P, Error>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(Error::MissingProgram { name })?
        .try_into()
        .map_err(|source| Error::Program { name, source })
}

/// Loads tracepoint program `name` of `ebpf` and attaches it to each of `points` in `category`.
/// Public for the benches, which attach the probe object's no-op programs where ours attach.
pub fn attach_tracepoint(
    ebpf: &mut Ebpf,
    name: &'static str,
    category: &str,
    points: &[&str],
) -> Result<(), Error> {
    let program: &mut TracePoint = program(ebpf, name)?;
    let err = |source| Error::Program { name, source };
    program.load().map_err(err)?;
    for point in points {
        program.attach(category, point).map_err(err)?;
    }
    Ok(())
}

/// Loads raw tracepoint program `name` and attaches it to each of `points`.
pub fn attach_raw_tracepoint(
    ebpf: &mut Ebpf,
    name: &'static str,
    points: &[&str],
) -> Result<(), Error> {
    let program: &mut RawTracePoint = program(ebpf, name)?;
    let err = |source| Error::Program { name, source };
    program.load().map_err(err)?;
    for point in points {
        program.attach(point).map_err(err)?;
    }
    Ok(())
}

/// Loads uprobe program `name` and attaches it to each of `symbols` of `target`, for this
/// process only.
pub fn attach_uprobe(
    ebpf: &mut Ebpf,
    name: &'static str,
    symbols: &[&'static str],
    target: &Path,
) -> Result<(), Error> {
    let err = |symbol: &'static str| {
        move |source| Error::Uprobe {
            name,
            symbol,
            source: Box::new(source),
        }
    };
    let first = symbols.first().copied().unwrap_or(name);
    let program: &mut UProbe = ebpf
        .program_mut(name)
        .ok_or(Error::MissingProgram { name })?
        .try_into()
        .map_err(err(first))?;
    program.load().map_err(err(first))?;
    // The uprobe filter matches on the address space, so every thread of this process fires it
    // and other processes running the same binary (other agents) do not.
    for symbol in symbols {
        program
            .attach(*symbol, target, UProbeScope::CallingProcess)
            .map_err(err(symbol))?;
    }
    Ok(())
}

/// The cgroup2 directory every pod lives below, its id and level.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PodRoot {
    dir: PathBuf,
    id: u64,
    level: u32,
}

/// Makes sure `<cgroup2 mount>/<pod_root>` exists (runc would create it with the first pod
/// anyway) and returns its cgroup id: on cgroup2 a cgroup's id is its directory's inode number.
fn pod_root_cgroup(pod_root: &str) -> Result<PodRoot, Error> {
    use std::os::unix::fs::MetadataExt as _;
    let mount = cgroup2_mount().ok_or(Error::NoCgroup2)?;
    let relative: PathBuf = pod_root
        .split('/')
        .filter(|c| !c.is_empty() && *c != "." && *c != "..")
        .collect();
    let level = relative.components().count() as u32;
    let dir = mount.join(&relative);
    std::fs::create_dir_all(&dir).map_err(|source| Error::PodRoot {
        path: dir.clone(),
        source,
    })?;
    let id = std::fs::metadata(&dir)
        .map_err(|source| Error::PodRoot {
            path: dir.clone(),
            source,
        })?
        .ino();
    Ok(PodRoot { dir, id, level })
}

/// Where the cgroup2 hierarchy is mounted (`/sys/fs/cgroup` on pure v2 hosts,
/// `/sys/fs/cgroup/unified` on hybrid ones), from `/proc/self/mountinfo`.
fn cgroup2_mount() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    cgroup2_mount_in(&text)
}

fn cgroup2_mount_in(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // `<id> <parent> <maj:min> <root> <mount point> <options> ... - <fstype> <source> ...`
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        left.split_whitespace().nth(4).map(PathBuf::from)
    })
}

fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<aya::maps::Map, Error> {
    ebpf.take_map(name).ok_or(Error::MissingMap { name })
}

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; newer ones to the memory cgroup.
/// Raising the limit needs CAP_SYS_RESOURCE, which this agent may lack: failure is not an error.
fn raise_memlock_rlimit() {
    use rustix::process::{Resource, Rlimit};
    // `None` is RLIM_INFINITY.
    let unlimited = Rlimit {
        current: None,
        maximum: None,
    };
    if let Err(e) = rustix::process::setrlimit(Resource::Memlock, unlimited) {
        tracing::debug!(
            error = %std::io::Error::from(e),
            "could not raise RLIMIT_MEMLOCK (fine on kernels >= 5.11)"
        );
    }
}

#[cfg(test)]
mod tests;
