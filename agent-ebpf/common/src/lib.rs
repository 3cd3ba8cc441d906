//! Event layouts shared by the probes (`swiftlet-ebpf`) and the agent.
//!
//! Every record the probes put on the ring buffer starts with an [`EventHeader`]; its `kind` says
//! which struct follows and its `len` says how many bytes the whole record holds. The probes write
//! these `#[repr(C)]` structs directly into ring-buffer memory; the agent never casts the bytes it
//! reads back into these types (the bytes may be unaligned and could be truncated). It calls
//! [`decode`], which checks sizes and reads each field at its `offset_of!` position.
//!
//! Byte order: the probes are compiled for the host's endianness (`bpfel` on little-endian hosts,
//! `bpfeb` on big-endian ones), so the decoder reads native-endian integers.
#![cfg_attr(not(test), no_std)]

use core::mem::{offset_of, size_of};

/// `kind` of a [`CgroupEvent`] from the `cgroup:cgroup_mkdir` tracepoint.
pub const KIND_CGROUP_MKDIR: u32 = 1;
/// `kind` of a [`CgroupEvent`] from the `cgroup:cgroup_rmdir` tracepoint.
pub const KIND_CGROUP_RMDIR: u32 = 2;
/// `kind` of a [`ProcessEvent`] from `sched:sched_process_exec` (a process in a pod cgroup ran
/// `execve`).
pub const KIND_PROCESS_EXEC: u32 = 3;
/// `kind` of a [`ProcessEvent`] from `sched:sched_process_exit` (a thread-group leader in a pod
/// cgroup exited).
pub const KIND_PROCESS_EXIT: u32 = 4;
/// `kind` of a [`CriEvent`]: the agent entered its `swiftlet_cri_call_begin` marker (uprobe).
pub const KIND_CRI_BEGIN: u32 = 5;
/// `kind` of a [`CriEvent`]: the agent entered its `swiftlet_cri_call_end` marker (uprobe).
pub const KIND_CRI_END: u32 = 6;

/// Capacity of [`ProcessEvent::comm`] (the kernel's `TASK_COMM_LEN`).
pub const COMM_LEN: usize = 16;
/// Capacity of [`CriEvent::uid`]: a Kubernetes UID is 36 bytes, a static pod's 32.
pub const CRI_UID_MAX: usize = 64;

/// CRI methods the agent's markers name, by index (the `method` argument of the markers and
/// [`CriEvent::method`]), and `swiftlet::cri::METHODS`. Append only: the index is the wire value.
pub const CRI_METHODS: [&str; 25] = [
    "Version",
    "RunPodSandbox",
    "StopPodSandbox",
    "RemovePodSandbox",
    "PodSandboxStatus",
    "ListPodSandbox",
    "CreateContainer",
    "StartContainer",
    "StopContainer",
    "RemoveContainer",
    "ListContainers",
    "ContainerStatus",
    "ImageStatus",
    "PullImage",
    "ExecSync",
    "ReopenContainerLog",
    "UpdateContainerResources",
    "ListImages",
    "RemoveImage",
    "ImageFsInfo",
    "Status",
    "Exec",
    "Attach",
    "PortForward",
    "ListContainerStats",
];

/// What [`cri_method_name`] says for an index outside [`CRI_METHODS`].
pub const CRI_METHOD_OTHER: &str = "Other";

/// The index of `name` in [`CRI_METHODS`] (`u32::MAX` when unknown, as the agent's markers pass).
pub fn cri_method_index(name: &str) -> u32 {
    let mut i = 0;
    while i < CRI_METHODS.len() {
        if CRI_METHODS[i].len() == name.len() && CRI_METHODS[i].as_bytes() == name.as_bytes() {
            return i as u32;
        }
        i += 1;
    }
    u32::MAX
}

/// The name of CRI method `index` ([`CRI_METHOD_OTHER`] when out of range).
pub fn cri_method_name(index: u32) -> &'static str {
    CRI_METHODS
        .get(index as usize)
        .copied()
        .unwrap_or(CRI_METHOD_OTHER)
}

/// Names of the uprobe target symbols in the agent binary.
pub const CRI_BEGIN_SYMBOL: &str = "swiftlet_cri_call_begin";
/// See [`CRI_BEGIN_SYMBOL`].
pub const CRI_END_SYMBOL: &str = "swiftlet_cri_call_end";
/// Name of the one-entry `u64` array holding the cgroup2 id of the cgroup every pod lives below
/// (`<cgroup-root>/kubepods`); 0 means "not known yet" and lets no process event through.
pub const MAP_POD_ROOT: &str = "POD_ROOT";

/// Capacity of [`CgroupEvent::path`]. Longer paths are truncated by the kernel helper (and still
/// NUL-terminated), so at most `CGROUP_PATH_MAX - 1` bytes of path arrive.
pub const CGROUP_PATH_MAX: usize = 256;

/// Words (8 bytes each, little-endian) of the cgroup path prefix the cgroup probes compare with
/// (see [`cgroup_prefix_words`]).
pub const CGROUP_PREFIX_WORDS: usize = 16;
/// The longest cgroup path prefix the cgroup probes can filter on; an agent with a longer one
/// leaves them unfiltered.
pub const CGROUP_PREFIX_MAX: usize = CGROUP_PREFIX_WORDS * 8;

/// `prefix` as the cgroup probes' `CGROUP_PREFIX` global holds it: its bytes packed into
/// little-endian words, zero-padded; `None` when it is empty or longer than
/// [`CGROUP_PREFIX_MAX`] (no filter).
pub fn cgroup_prefix_words(prefix: &[u8]) -> Option<[u64; CGROUP_PREFIX_WORDS]> {
    if prefix.is_empty() || prefix.len() > CGROUP_PREFIX_MAX {
        return None;
    }
    let mut words = [0u64; CGROUP_PREFIX_WORDS];
    for (i, byte) in prefix.iter().enumerate() {
        words[i / 8] |= u64::from(*byte) << (8 * (i % 8));
    }
    Some(words)
}

/// Whether the first `len` bytes of `path` (as words read from the kernel, see
/// [`cgroup_prefix_words`]) equal the first `len` bytes of `prefix`: the test the cgroup probes
/// make before they record a cgroup's creation or removal. `len` 0 lets every path through.
#[inline(always)]
pub fn starts_with_prefix(
    path: &[u64; CGROUP_PREFIX_WORDS],
    prefix: &[u64; CGROUP_PREFIX_WORDS],
    len: usize,
) -> bool {
    let mut i = 0;
    while i < CGROUP_PREFIX_WORDS {
        let done = i * 8;
        if done >= len {
            return true;
        }
        let left = len - done;
        let mask = if left >= 8 {
            u64::MAX
        } else {
            (1u64 << (8 * left)) - 1
        };
        if (path[i] ^ prefix[i]) & mask != 0 {
            return false;
        }
        i += 1;
    }
    true
}

/// Name of the ring-buffer map every probe writes to.
pub const MAP_EVENTS: &str = "EVENTS";
/// Name of the per-CPU `u64` array counting events the probes could not deliver. Indexes are in
/// [`lost`].
pub const MAP_LOST: &str = "LOST";
/// Byte size of the ring buffer (a power of two, a multiple of the page size).
pub const EVENTS_RING_BYTES: u32 = 256 * 1024;
/// The probes wake a sleeping reader for the first record after its last drain, a polling one
/// never (a wake-up costs the probe 5-8 µs on this VM, 20-40x its own work), and either once
/// this much data is waiting.
pub const WAKEUP_THRESHOLD_BYTES: u64 = EVENTS_RING_BYTES as u64 / 4;
/// Name of the one-entry `u32` array the agent's reader sets to 1 while it polls the ring buffer
/// (records need no wake-up) and to 0 before it sleeps (a record wakes it).
pub const MAP_READER: &str = "READER";

/// Indexes into the [`MAP_LOST`] per-CPU array.
pub mod lost {
    /// `bpf_ringbuf_reserve` failed: the ring buffer was full.
    pub const RINGBUF_FULL: u32 = 0;
    /// A field of the tracepoint record could not be read; the event was discarded.
    pub const READ_FAILED: u32 = 1;
    /// Number of counters (the map's `max_entries`).
    pub const COUNT: u32 = 2;
}

/// Names of the read-only globals through which the agent tells the cgroup probes where the
/// fields of the `cgroup_mkdir`/`cgroup_rmdir` record are (read from the tracepoint's `format`).
pub mod globals {
    /// Offset of `int root` (the hierarchy id).
    pub const CGROUP_ROOT_OFFSET: &str = "CGROUP_ROOT_OFFSET";
    /// Offset of `int level`.
    pub const CGROUP_LEVEL_OFFSET: &str = "CGROUP_LEVEL_OFFSET";
    /// Offset of `u64 id` (the cgroup id).
    pub const CGROUP_ID_OFFSET: &str = "CGROUP_ID_OFFSET";
    /// Offset of `__data_loc char[] path`.
    pub const CGROUP_PATH_OFFSET: &str = "CGROUP_PATH_OFFSET";
    /// cgroup2 level of the pod root cgroup (see `MAP_POD_ROOT`): the process probes compare the
    /// current task's ancestor at this level with it.
    pub const POD_ROOT_LEVEL: &str = "POD_ROOT_LEVEL";
    /// Byte offset of `exit_code` in `struct task_struct`, read from the kernel's BTF; 0 when
    /// unknown (the exit probe then reports no exit code).
    pub const TASK_EXIT_CODE_OFFSET: &str = "TASK_EXIT_CODE_OFFSET";
    /// `[u64; CGROUP_PREFIX_WORDS]`: the path prefix (relative to each hierarchy's root) of the
    /// cgroups the cgroup probes report, packed by `cgroup_prefix_words`.
    pub const CGROUP_PREFIX: &str = "CGROUP_PREFIX";
    /// `u32`: how many bytes of `CGROUP_PREFIX` are compared; 0 reports every cgroup.
    pub const CGROUP_PREFIX_LEN: &str = "CGROUP_PREFIX_LEN";
    /// Offsets for the raw-tracepoint cgroup probes, from BTF: `cgroup::level`, `cgroup::kn`,
    /// `cgroup::root`, `kernfs_node::id`, `cgroup_root::hierarchy_id`.
    pub const CGRP_LEVEL_OFFSET: &str = "CGRP_LEVEL_OFFSET";
    pub const CGRP_KN_OFFSET: &str = "CGRP_KN_OFFSET";
    pub const CGRP_ROOT_OFFSET: &str = "CGRP_ROOT_OFFSET";
    pub const KN_ID_OFFSET: &str = "KN_ID_OFFSET";
    pub const ROOT_HIERARCHY_ID_OFFSET: &str = "ROOT_HIERARCHY_ID_OFFSET";
}

/// The header every event starts with.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventHeader {
    /// One of the `KIND_*` constants.
    pub kind: u32,
    /// Size in bytes of the whole record, header included.
    pub len: u32,
    /// `bpf_ktime_get_ns()` when the probe fired (CLOCK_MONOTONIC, nanoseconds).
    pub ktime_ns: u64,
}

/// A cgroup directory was created or removed (in any hierarchy: with cgroup v1 the same path shows
/// up once per mounted hierarchy, told apart by `hierarchy_id`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CgroupEvent {
    /// `kind` is [`KIND_CGROUP_MKDIR`] or [`KIND_CGROUP_RMDIR`].
    pub header: EventHeader,
    /// Depth of the cgroup below its hierarchy's root (the root is 0).
    pub level: u32,
    /// The hierarchy id (`root` in the tracepoint).
    pub hierarchy_id: u32,
    /// The kernel's cgroup id (the cgroup directory's inode number on cgroup2).
    pub cgroup_id: u64,
    /// Number of bytes of `path` the probe copied: the path ends at the first NUL among them, or
    /// at `path_len` when there is none (the probes copy the whole field in one go, word by word,
    /// rather than a string byte by byte).
    pub path_len: u32,
    /// Keeps `path` 8-byte aligned and the struct free of implicit padding.
    pub _pad: u32,
    /// The path relative to the hierarchy's mount point, e.g. `/kubepods/pod<uid>`.
    pub path: [u8; CGROUP_PATH_MAX],
}

/// `exit_code` of a [`ProcessEvent`] when the kernel's `task_struct` layout is unknown.
pub const EXIT_CODE_UNKNOWN: u32 = u32::MAX;

/// A process in a pod cgroup ran `execve` or (thread-group leader) exited.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessEvent {
    /// `kind` is [`KIND_PROCESS_EXEC`] or [`KIND_PROCESS_EXIT`].
    pub header: EventHeader,
    /// Thread id (`pid` in kernel terms).
    pub pid: u32,
    /// Process id (`tgid`).
    pub tgid: u32,
    /// The task's cgroup2 id (its container's cgroup in the unified hierarchy).
    pub cgroup_id: u64,
    /// Exit only: the raw `task_struct::exit_code` (`status << 8`, or the signal number in the
    /// low 7 bits), or [`EXIT_CODE_UNKNOWN`]. 0 for exec.
    pub exit_code: u32,
    /// Keeps the struct free of implicit padding.
    pub _pad: u32,
    /// The task's command name (NUL-padded): after exec, the new program's.
    pub comm: [u8; COMM_LEN],
}

/// The agent entered one of its CRI call markers.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CriEvent {
    /// `kind` is [`KIND_CRI_BEGIN`] or [`KIND_CRI_END`].
    pub header: EventHeader,
    /// Index into [`CRI_METHODS`].
    pub method: u32,
    /// End only: 1 when the call succeeded, 0 when it failed.
    pub ok: u32,
    /// The calling thread.
    pub pid: u32,
    /// Number of valid bytes in `uid` (0: the call is not about one pod).
    pub uid_len: u32,
    /// The pod UID, as passed by the agent.
    pub uid: [u8; CRI_UID_MAX],
}

/// A decoded event borrowing from the ring-buffer bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// `cgroup:cgroup_mkdir`.
    CgroupMkdir(CgroupRecord<'a>),
    /// `cgroup:cgroup_rmdir`.
    CgroupRmdir(CgroupRecord<'a>),
    /// `sched:sched_process_exec`.
    Exec(ProcessRecord<'a>),
    /// `sched:sched_process_exit`.
    Exit(ProcessRecord<'a>),
    /// `swiftlet_cri_call_begin`.
    CriBegin(CriRecord<'a>),
    /// `swiftlet_cri_call_end`.
    CriEnd(CriRecord<'a>),
}

/// The fields of a [`ProcessEvent`], read safely.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessRecord<'a> {
    pub ktime_ns: u64,
    pub pid: u32,
    pub tgid: u32,
    pub cgroup_id: u64,
    pub exit_code: u32,
    /// The command name up to its first NUL.
    pub comm: &'a [u8],
}

/// The fields of a [`CriEvent`], read safely.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CriRecord<'a> {
    pub ktime_ns: u64,
    pub method: u32,
    pub ok: bool,
    pub pid: u32,
    /// The pod UID bytes (empty when the call is not about one pod).
    pub uid: &'a [u8],
}

/// The fields of a [`CgroupEvent`], read safely.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CgroupRecord<'a> {
    pub ktime_ns: u64,
    pub level: u32,
    pub hierarchy_id: u32,
    pub cgroup_id: u64,
    /// The path bytes (not necessarily UTF-8, no NUL).
    pub path: &'a [u8],
}

/// Why bytes from the ring buffer are not a valid event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the header or the event's struct needs.
    Truncated { needed: usize, got: usize },
    /// The header names a kind this agent does not know.
    UnknownKind(u32),
    /// The header's `len` disagrees with the size of its kind's struct.
    BadLength {
        kind: u32,
        len: u32,
        expected: usize,
    },
    /// `path_len` is larger than the path buffer.
    PathTooLong { path_len: u32 },
    /// `uid_len` is larger than the UID buffer.
    UidTooLong { uid_len: u32 },
}

impl core::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Truncated { needed, got } => {
                write!(f, "event truncated: needed {needed} bytes, got {got}")
            }
            Self::UnknownKind(kind) => write!(f, "unknown event kind {kind}"),
            Self::BadLength {
                kind,
                len,
                expected,
            } => write!(
                f,
                "event kind {kind} says it is {len} bytes long, expected {expected}"
            ),
            Self::PathTooLong { path_len } => {
                write!(f, "cgroup path length {path_len} exceeds {CGROUP_PATH_MAX}")
            }
            Self::UidTooLong { uid_len } => {
                write!(f, "pod UID length {uid_len} exceeds {CRI_UID_MAX}")
            }
        }
    }
}

fn read_u32(bytes: &[u8], at: usize) -> Result<u32, DecodeError> {
    let field = bytes
        .get(at..at + 4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .ok_or(DecodeError::Truncated {
            needed: at + 4,
            got: bytes.len(),
        })?;
    Ok(u32::from_ne_bytes(field))
}

fn read_u64(bytes: &[u8], at: usize) -> Result<u64, DecodeError> {
    let field = bytes
        .get(at..at + 8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .ok_or(DecodeError::Truncated {
            needed: at + 8,
            got: bytes.len(),
        })?;
    Ok(u64::from_ne_bytes(field))
}

/// Reads the header at the start of `bytes`.
pub fn decode_header(bytes: &[u8]) -> Result<EventHeader, DecodeError> {
    if bytes.len() < size_of::<EventHeader>() {
        return Err(DecodeError::Truncated {
            needed: size_of::<EventHeader>(),
            got: bytes.len(),
        });
    }
    Ok(EventHeader {
        kind: read_u32(bytes, offset_of!(EventHeader, kind))?,
        len: read_u32(bytes, offset_of!(EventHeader, len))?,
        ktime_ns: read_u64(bytes, offset_of!(EventHeader, ktime_ns))?,
    })
}

/// Decodes one ring-buffer record. Extra bytes after the record (ring-buffer padding) are ignored.
pub fn decode(bytes: &[u8]) -> Result<Event<'_>, DecodeError> {
    let header = decode_header(bytes)?;
    match header.kind {
        KIND_CGROUP_MKDIR => decode_cgroup(bytes, &header).map(Event::CgroupMkdir),
        KIND_CGROUP_RMDIR => decode_cgroup(bytes, &header).map(Event::CgroupRmdir),
        KIND_PROCESS_EXEC => decode_process(bytes, &header).map(Event::Exec),
        KIND_PROCESS_EXIT => decode_process(bytes, &header).map(Event::Exit),
        KIND_CRI_BEGIN => decode_cri(bytes, &header).map(Event::CriBegin),
        KIND_CRI_END => decode_cri(bytes, &header).map(Event::CriEnd),
        other => Err(DecodeError::UnknownKind(other)),
    }
}

/// Checks that the header's `len` is `expected` and that `bytes` hold that many.
fn check_len(bytes: &[u8], header: &EventHeader, expected: usize) -> Result<(), DecodeError> {
    if usize::try_from(header.len).ok() != Some(expected) {
        return Err(DecodeError::BadLength {
            kind: header.kind,
            len: header.len,
            expected,
        });
    }
    if bytes.len() < expected {
        return Err(DecodeError::Truncated {
            needed: expected,
            got: bytes.len(),
        });
    }
    Ok(())
}

fn decode_process<'a>(
    bytes: &'a [u8],
    header: &EventHeader,
) -> Result<ProcessRecord<'a>, DecodeError> {
    check_len(bytes, header, size_of::<ProcessEvent>())?;
    let start = offset_of!(ProcessEvent, comm);
    let comm = bytes
        .get(start..start + COMM_LEN)
        .ok_or(DecodeError::Truncated {
            needed: start + COMM_LEN,
            got: bytes.len(),
        })?;
    let end = comm.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
    Ok(ProcessRecord {
        ktime_ns: header.ktime_ns,
        pid: read_u32(bytes, offset_of!(ProcessEvent, pid))?,
        tgid: read_u32(bytes, offset_of!(ProcessEvent, tgid))?,
        cgroup_id: read_u64(bytes, offset_of!(ProcessEvent, cgroup_id))?,
        exit_code: read_u32(bytes, offset_of!(ProcessEvent, exit_code))?,
        comm: comm.get(..end).unwrap_or(comm),
    })
}

fn decode_cri<'a>(bytes: &'a [u8], header: &EventHeader) -> Result<CriRecord<'a>, DecodeError> {
    check_len(bytes, header, size_of::<CriEvent>())?;
    let uid_len = read_u32(bytes, offset_of!(CriEvent, uid_len))?;
    let len = usize::try_from(uid_len)
        .ok()
        .filter(|&len| len <= CRI_UID_MAX)
        .ok_or(DecodeError::UidTooLong { uid_len })?;
    let start = offset_of!(CriEvent, uid);
    let uid = bytes
        .get(start..start + len)
        .ok_or(DecodeError::Truncated {
            needed: start + len,
            got: bytes.len(),
        })?;
    Ok(CriRecord {
        ktime_ns: header.ktime_ns,
        method: read_u32(bytes, offset_of!(CriEvent, method))?,
        ok: read_u32(bytes, offset_of!(CriEvent, ok))? != 0,
        pid: read_u32(bytes, offset_of!(CriEvent, pid))?,
        uid,
    })
}

fn decode_cgroup<'a>(
    bytes: &'a [u8],
    header: &EventHeader,
) -> Result<CgroupRecord<'a>, DecodeError> {
    check_len(bytes, header, size_of::<CgroupEvent>())?;
    let path_len = read_u32(bytes, offset_of!(CgroupEvent, path_len))?;
    let len = usize::try_from(path_len)
        .ok()
        .filter(|&len| len <= CGROUP_PATH_MAX)
        .ok_or(DecodeError::PathTooLong { path_len })?;
    let start = offset_of!(CgroupEvent, path);
    let copied = bytes
        .get(start..start + len)
        .ok_or(DecodeError::Truncated {
            needed: start + len,
            got: bytes.len(),
        })?;
    let path = copied
        .iter()
        .position(|&b| b == 0)
        .map_or(copied, |nul| &copied[..nul]);
    Ok(CgroupRecord {
        ktime_ns: header.ktime_ns,
        level: read_u32(bytes, offset_of!(CgroupEvent, level))?,
        hierarchy_id: read_u32(bytes, offset_of!(CgroupEvent, hierarchy_id))?,
        cgroup_id: read_u64(bytes, offset_of!(CgroupEvent, cgroup_id))?,
        path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds the bytes a probe would write, field by field (not by casting a struct).
    fn cgroup_bytes(kind: u32, path: &[u8]) -> Vec<u8> {
        let mut b = vec![0xAAu8; size_of::<CgroupEvent>()];
        let mut put = |at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
        put(offset_of!(EventHeader, kind), &kind.to_ne_bytes());
        put(
            offset_of!(EventHeader, len),
            &(size_of::<CgroupEvent>() as u32).to_ne_bytes(),
        );
        put(
            offset_of!(EventHeader, ktime_ns),
            &123_456_789u64.to_ne_bytes(),
        );
        put(offset_of!(CgroupEvent, level), &3u32.to_ne_bytes());
        put(offset_of!(CgroupEvent, hierarchy_id), &7u32.to_ne_bytes());
        put(
            offset_of!(CgroupEvent, cgroup_id),
            &0xdead_beefu64.to_ne_bytes(),
        );
        put(
            offset_of!(CgroupEvent, path_len),
            &(path.len() as u32).to_ne_bytes(),
        );
        put(offset_of!(CgroupEvent, path), path);
        b
    }

    /// What the kernel hands the probe: the path's bytes, then whatever follows in its buffer.
    fn path_words(path: &[u8]) -> [u64; CGROUP_PREFIX_WORDS] {
        let mut bytes = [0x5Au8; CGROUP_PREFIX_MAX];
        let n = path.len().min(CGROUP_PREFIX_MAX - 1);
        bytes[..n].copy_from_slice(&path[..n]);
        bytes[n] = 0;
        let mut words = [0u64; CGROUP_PREFIX_WORDS];
        for (i, w) in words.iter_mut().enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
            *w = u64::from_le_bytes(b);
        }
        words
    }

    #[test]
    fn the_cgroup_filter_passes_the_pod_roots_subtree_only() {
        let prefix = b"/swiftlet-test-node-1234-0/kubepods";
        let words = cgroup_prefix_words(prefix).expect("short enough");
        let under = |path: &[u8]| starts_with_prefix(&path_words(path), &words, prefix.len());
        assert!(under(b"/swiftlet-test-node-1234-0/kubepods"));
        assert!(under(
            b"/swiftlet-test-node-1234-0/kubepods/burstable/podu1/c1"
        ));
        // The systemd spelling of the same root starts with it too.
        assert!(under(b"/swiftlet-test-node-1234-0/kubepods.slice/x.slice"));
        assert!(!under(b"/swiftlet-test-node-1234-0"));
        assert!(!under(b"/swiftlet-test-node-1234-0/kubepod"));
        assert!(!under(b"/system.slice/cron.service"));
        assert!(!under(b"/user.slice/user-0.slice/session-1.scope"));
        assert!(!under(b""));
        // Every length a path can match (the kernel's copy ends in a NUL), the last byte off.
        let long = [b'a'; CGROUP_PREFIX_MAX];
        for len in 1..CGROUP_PREFIX_MAX {
            let words = cgroup_prefix_words(&long[..len]).expect("fits");
            let mut path = [b'a'; CGROUP_PREFIX_MAX - 1];
            assert!(starts_with_prefix(&path_words(&path), &words, len), "{len}");
            path[len - 1] = b'b';
            assert!(
                !starts_with_prefix(&path_words(&path), &words, len),
                "{len}"
            );
        }
        assert_eq!(cgroup_prefix_words(b""), None);
        assert_eq!(cgroup_prefix_words(&[b'a'; CGROUP_PREFIX_MAX + 1]), None);
        // Length 0: no filter.
        assert!(starts_with_prefix(
            &path_words(b"/x"),
            &[0; CGROUP_PREFIX_WORDS],
            0
        ));
    }

    #[test]
    fn layout_is_stable() {
        assert_eq!(size_of::<EventHeader>(), 16);
        assert_eq!(offset_of!(CgroupEvent, level), 16);
        assert_eq!(offset_of!(CgroupEvent, path), 40);
        assert_eq!(size_of::<CgroupEvent>(), 40 + CGROUP_PATH_MAX);
        assert_eq!(size_of::<CgroupEvent>() % 8, 0);
    }

    #[test]
    fn decodes_a_mkdir_event() {
        let bytes = cgroup_bytes(KIND_CGROUP_MKDIR, b"/kubepods/podabc");
        let event = decode(&bytes).expect("valid event");
        assert_eq!(
            event,
            Event::CgroupMkdir(CgroupRecord {
                ktime_ns: 123_456_789,
                level: 3,
                hierarchy_id: 7,
                cgroup_id: 0xdead_beef,
                path: b"/kubepods/podabc",
            })
        );
    }

    /// The probes copy the whole path field: the path ends at the first NUL, whatever an earlier,
    /// longer path left after it; with no NUL the whole field is the (cut) path.
    #[test]
    fn a_whole_field_copy_ends_at_the_nul() {
        let mut field = [b'z'; CGROUP_PATH_MAX];
        field[..17].copy_from_slice(b"/kubepods/podabc\0");
        let bytes = cgroup_bytes(KIND_CGROUP_MKDIR, &field);
        match decode(&bytes) {
            Ok(Event::CgroupMkdir(r)) => assert_eq!(r.path, b"/kubepods/podabc"),
            other => panic!("unexpected {other:?}"),
        }
        let long = [b'a'; CGROUP_PATH_MAX];
        match decode(&cgroup_bytes(KIND_CGROUP_RMDIR, &long)) {
            Ok(Event::CgroupRmdir(r)) => assert_eq!(r.path, &long[..]),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn decodes_rmdir_from_unaligned_bytes_with_trailing_padding() {
        let mut shifted = vec![0u8];
        shifted.extend(cgroup_bytes(KIND_CGROUP_RMDIR, b"/x"));
        shifted.extend([0u8; 8]);
        match decode(&shifted[1..]) {
            Ok(Event::CgroupRmdir(r)) => assert_eq!(r.path, b"/x"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn rejects_truncated_bytes() {
        let bytes = cgroup_bytes(KIND_CGROUP_MKDIR, b"/a");
        assert_eq!(
            decode(&bytes[..10]),
            Err(DecodeError::Truncated {
                needed: 16,
                got: 10
            })
        );
        assert_eq!(
            decode(&bytes[..bytes.len() - 1]),
            Err(DecodeError::Truncated {
                needed: bytes.len(),
                got: bytes.len() - 1
            })
        );
        assert!(matches!(decode(&[]), Err(DecodeError::Truncated { .. })));
    }

    #[test]
    fn rejects_unknown_kind() {
        let bytes = cgroup_bytes(99, b"/a");
        assert_eq!(decode(&bytes), Err(DecodeError::UnknownKind(99)));
    }

    fn process_bytes(kind: u32, comm: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; size_of::<ProcessEvent>()];
        let mut put = |at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
        put(offset_of!(EventHeader, kind), &kind.to_ne_bytes());
        put(
            offset_of!(EventHeader, len),
            &(size_of::<ProcessEvent>() as u32).to_ne_bytes(),
        );
        put(offset_of!(EventHeader, ktime_ns), &42u64.to_ne_bytes());
        put(offset_of!(ProcessEvent, pid), &11u32.to_ne_bytes());
        put(offset_of!(ProcessEvent, tgid), &10u32.to_ne_bytes());
        put(offset_of!(ProcessEvent, cgroup_id), &77u64.to_ne_bytes());
        put(
            offset_of!(ProcessEvent, exit_code),
            &(3u32 << 8).to_ne_bytes(),
        );
        put(offset_of!(ProcessEvent, comm), comm);
        b
    }

    fn cri_bytes(kind: u32, uid_len: u32, uid: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; size_of::<CriEvent>()];
        let mut put = |at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
        put(offset_of!(EventHeader, kind), &kind.to_ne_bytes());
        put(
            offset_of!(EventHeader, len),
            &(size_of::<CriEvent>() as u32).to_ne_bytes(),
        );
        put(offset_of!(EventHeader, ktime_ns), &5u64.to_ne_bytes());
        put(offset_of!(CriEvent, method), &7u32.to_ne_bytes());
        put(offset_of!(CriEvent, ok), &1u32.to_ne_bytes());
        put(offset_of!(CriEvent, pid), &99u32.to_ne_bytes());
        put(offset_of!(CriEvent, uid_len), &uid_len.to_ne_bytes());
        put(offset_of!(CriEvent, uid), uid);
        b
    }

    #[test]
    fn process_and_cri_layouts_are_stable() {
        assert_eq!(size_of::<ProcessEvent>(), 56);
        assert_eq!(offset_of!(ProcessEvent, comm), 40);
        assert_eq!(size_of::<CriEvent>(), 32 + CRI_UID_MAX);
        assert_eq!(size_of::<CriEvent>() % 8, 0);
    }

    #[test]
    fn decodes_exec_exit_and_cri_events() {
        let exec = process_bytes(KIND_PROCESS_EXEC, b"sleep\0\0\0");
        match decode(&exec) {
            Ok(Event::Exec(r)) => {
                assert_eq!((r.pid, r.tgid, r.cgroup_id, r.ktime_ns), (11, 10, 77, 42));
                assert_eq!(r.comm, b"sleep");
            }
            other => panic!("unexpected {other:?}"),
        }
        // A full 16-byte comm has no NUL.
        let exit = process_bytes(KIND_PROCESS_EXIT, b"0123456789abcdef");
        match decode(&exit) {
            Ok(Event::Exit(r)) => {
                assert_eq!(r.exit_code, 3 << 8);
                assert_eq!(r.comm, b"0123456789abcdef");
            }
            other => panic!("unexpected {other:?}"),
        }
        let uid = b"0b5f1c6e-1111-2222-3333-444455556666";
        let mut shifted = vec![0u8; 3];
        shifted.extend(cri_bytes(KIND_CRI_END, uid.len() as u32, uid));
        match decode(&shifted[3..]) {
            Ok(Event::CriEnd(r)) => {
                assert_eq!((r.method, r.ok, r.pid, r.ktime_ns), (7, true, 99, 5));
                assert_eq!(r.uid, uid);
                assert_eq!(cri_method_name(r.method), "StartContainer");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn rejects_bad_process_and_cri_events() {
        let bytes = cri_bytes(KIND_CRI_BEGIN, 65, b"");
        assert_eq!(decode(&bytes), Err(DecodeError::UidTooLong { uid_len: 65 }));
        let bytes = cri_bytes(KIND_CRI_BEGIN, 1, b"x");
        assert!(matches!(
            decode(&bytes[..bytes.len() - 1]),
            Err(DecodeError::Truncated { .. })
        ));
        // A process record claiming the cgroup kind's length.
        let mut bytes = process_bytes(KIND_PROCESS_EXEC, b"x");
        bytes[offset_of!(EventHeader, len)..][..4]
            .copy_from_slice(&(size_of::<CgroupEvent>() as u32).to_ne_bytes());
        assert!(matches!(decode(&bytes), Err(DecodeError::BadLength { .. })));
    }

    #[test]
    fn cri_method_indexes_round_trip() {
        for (i, name) in CRI_METHODS.iter().enumerate() {
            assert_eq!(cri_method_index(name), i as u32);
        }
        assert_eq!(cri_method_index("NoSuchCall"), u32::MAX);
        assert_eq!(cri_method_name(cri_method_index("NoSuchCall")), "Other");
        assert_eq!(cri_method_name(1000), "Other");
    }

    #[test]
    fn rejects_bad_len_and_path_len() {
        let mut bytes = cgroup_bytes(KIND_CGROUP_MKDIR, b"/a");
        bytes[offset_of!(EventHeader, len)..][..4].copy_from_slice(&17u32.to_ne_bytes());
        assert!(matches!(
            decode(&bytes),
            Err(DecodeError::BadLength { len: 17, .. })
        ));

        let mut bytes = cgroup_bytes(KIND_CGROUP_MKDIR, b"/a");
        bytes[offset_of!(CgroupEvent, path_len)..][..4].copy_from_slice(&999u32.to_ne_bytes());
        assert_eq!(
            decode(&bytes),
            Err(DecodeError::PathTooLong { path_len: 999 })
        );
    }
}
