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
// Reserved for later probes, so that old agents report them as unknown rather than misreading
// them: 3 = process exec, 4 = process exit, 5 = CRI call marker.

/// Capacity of [`CgroupEvent::path`]. Longer paths are truncated by the kernel helper (and still
/// NUL-terminated), so at most `CGROUP_PATH_MAX - 1` bytes of path arrive.
pub const CGROUP_PATH_MAX: usize = 256;

/// Name of the ring-buffer map every probe writes to.
pub const MAP_EVENTS: &str = "EVENTS";
/// Name of the per-CPU `u64` array counting events the probes could not deliver. Indexes are in
/// [`lost`].
pub const MAP_LOST: &str = "LOST";
/// Byte size of the ring buffer (a power of two, a multiple of the page size).
pub const EVENTS_RING_BYTES: u32 = 256 * 1024;
/// The probes submit records without waking the reader (a wake-up costs about 5 µs of kernel time
/// per event on this VM, 20x the probe itself) until this much data is waiting; the agent
/// drains the ring on a short timer and on these forced wake-ups.
pub const WAKEUP_THRESHOLD_BYTES: u64 = EVENTS_RING_BYTES as u64 / 4;

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
    /// Number of valid bytes in `path` (no NUL).
    pub path_len: u32,
    /// Keeps `path` 8-byte aligned and the struct free of implicit padding.
    pub _pad: u32,
    /// The path relative to the hierarchy's mount point, e.g. `/kubepods/pod<uid>`.
    pub path: [u8; CGROUP_PATH_MAX],
}

/// A decoded event borrowing from the ring-buffer bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// `cgroup:cgroup_mkdir`.
    CgroupMkdir(CgroupRecord<'a>),
    /// `cgroup:cgroup_rmdir`.
    CgroupRmdir(CgroupRecord<'a>),
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
        other => Err(DecodeError::UnknownKind(other)),
    }
}

fn decode_cgroup<'a>(
    bytes: &'a [u8],
    header: &EventHeader,
) -> Result<CgroupRecord<'a>, DecodeError> {
    let expected = size_of::<CgroupEvent>();
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
    let path_len = read_u32(bytes, offset_of!(CgroupEvent, path_len))?;
    let len = usize::try_from(path_len)
        .ok()
        .filter(|&len| len <= CGROUP_PATH_MAX)
        .ok_or(DecodeError::PathTooLong { path_len })?;
    let start = offset_of!(CgroupEvent, path);
    let path = bytes
        .get(start..start + len)
        .ok_or(DecodeError::Truncated {
            needed: start + len,
            got: bytes.len(),
        })?;
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
        let bytes = cgroup_bytes(3, b"/a");
        assert_eq!(decode(&bytes), Err(DecodeError::UnknownKind(3)));
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
