//! Just enough of the kernel's BTF (`/sys/kernel/btf/vmlinux`) to find the byte offset of one
//! member of one struct, e.g. `task_struct::exit_code`, which the exit probe reads (the
//! `sched_process_exit` record does not carry the exit code). Reading the offset from BTF keeps the
//! probe correct across kernel builds without CO-RE relocations.
//!
//! Format (kernel `Documentation/bpf/btf.rst`): a header, then a type section of `btf_type`
//! records (12 bytes each, followed by kind-specific data), then a string section.

use std::path::{Path, PathBuf};

/// Where the running kernel publishes its BTF.
pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

const MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not BTF data ({problem})")]
    Format {
        path: PathBuf,
        problem: &'static str,
    },
    #[error("{path}: struct {name} not found")]
    NoStruct { path: PathBuf, name: String },
    #[error("{path}: struct {name} has no member {member}")]
    NoMember {
        path: PathBuf,
        name: String,
        member: String,
    },
    #[error("{path}: {name}::{member} is a bit field")]
    BitField {
        path: PathBuf,
        name: String,
        member: String,
    },
}

/// Byte offset of `member` in `struct name` according to the BTF file at `path`.
pub fn member_offset(path: &Path, name: &str, member: &str) -> Result<u32, Error> {
    member_offsets(path, &[(name, member)]).map(|v| v.first().copied().unwrap_or(0))
}

/// Byte offsets of several `(struct, member)` pairs, reading the file once.
pub fn member_offsets(path: &Path, queries: &[(&str, &str)]) -> Result<Vec<u32>, Error> {
    let data = std::fs::read(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    queries
        .iter()
        .map(|&(name, member)| {
            parse_member_offset(&data, name, member).map_err(|e| e.at(path, name, member))
        })
        .collect()
}

/// Errors of [`parse_member_offset`], before the path is known.
#[derive(Debug, PartialEq, Eq)]
enum ParseError {
    Format(&'static str),
    NoStruct,
    NoMember,
    BitField,
}

impl ParseError {
    fn at(self, path: &Path, name: &str, member: &str) -> Error {
        let path = path.to_path_buf();
        let (name, member) = (name.to_owned(), member.to_owned());
        match self {
            Self::Format(problem) => Error::Format { path, problem },
            Self::NoStruct => Error::NoStruct { path, name },
            Self::NoMember => Error::NoMember { path, name, member },
            Self::BitField => Error::BitField { path, name, member },
        }
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    fn u32(&self, at: usize) -> Result<u32, ParseError> {
        self.bytes
            .get(at..at.saturating_add(4))
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(u32::from_ne_bytes)
            .ok_or(ParseError::Format("truncated"))
    }
}

/// Bytes of kind-specific data after a `btf_type` of `kind` with `vlen` entries.
fn extra_len(kind: u32, vlen: usize) -> Result<usize, ParseError> {
    Ok(match kind {
        // INT, VAR, DECL_TAG: one u32.
        1 | 14 | 17 => 4,
        // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG.
        2 | 7 | 8 | 9 | 10 | 11 | 12 | 16 | 18 => 0,
        // ARRAY: btf_array.
        3 => 12,
        // STRUCT, UNION, DATASEC, ENUM64: 12 bytes per entry.
        4 | 5 | 15 | 19 => 12 * vlen,
        // ENUM, FUNC_PROTO: 8 bytes per entry.
        6 | 13 => 8 * vlen,
        _ => return Err(ParseError::Format("unknown type kind")),
    })
}

fn parse_member_offset(data: &[u8], name: &str, member: &str) -> Result<u32, ParseError> {
    let r = Reader { bytes: data };
    let magic = data
        .get(0..2)
        .and_then(|b| <[u8; 2]>::try_from(b).ok())
        .map(u16::from_ne_bytes)
        .ok_or(ParseError::Format("truncated header"))?;
    if magic != MAGIC {
        return Err(ParseError::Format("bad magic or foreign byte order"));
    }
    let hdr_len = r.u32(4)? as usize;
    let type_off = r.u32(8)? as usize;
    let type_len = r.u32(12)? as usize;
    let str_off = r.u32(16)? as usize;
    let str_len = r.u32(20)? as usize;
    let types_start = hdr_len.saturating_add(type_off);
    let types_end = types_start.saturating_add(type_len);
    let strs_start = hdr_len.saturating_add(str_off);
    let strings = data
        .get(strs_start..strs_start.saturating_add(str_len))
        .ok_or(ParseError::Format("string section out of bounds"))?;
    if data.len() < types_end {
        return Err(ParseError::Format("type section out of bounds"));
    }
    let string_at = |off: u32| -> &[u8] {
        let rest = strings.get(off as usize..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        rest.get(..end).unwrap_or_default()
    };

    let mut at = types_start;
    while at < types_end {
        let name_off = r.u32(at)?;
        let info = r.u32(at + 4)?;
        let kind = (info >> 24) & 0x1f;
        let vlen = (info & 0xffff) as usize;
        let kind_flag = info >> 31 == 1;
        let members = at + 12;
        if kind == KIND_STRUCT && string_at(name_off) == name.as_bytes() {
            for i in 0..vlen {
                let m = members + 12 * i;
                if string_at(r.u32(m)?) != member.as_bytes() {
                    continue;
                }
                let raw = r.u32(m + 8)?;
                // With kind_flag the high 8 bits are a bit-field size and the low 24 the offset.
                let (bits, size) = if kind_flag {
                    (raw & 0x00ff_ffff, raw >> 24)
                } else {
                    (raw, 0)
                };
                if size != 0 || !bits.is_multiple_of(8) {
                    return Err(ParseError::BitField);
                }
                return Ok(bits / 8);
            }
            return Err(ParseError::NoMember);
        }
        at = members + extra_len(kind, vlen)?;
    }
    Err(ParseError::NoStruct)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny BTF blob: an `int`, then `struct task_struct { int state; int exit_code; }` and a
    /// struct with a bit field.
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0task_struct\0state\0exit_code\0bits\0flag\0".to_vec();
        let off = |s: &str| -> u32 {
            let needle = format!("\0{s}\0");
            strings
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .map(|p| p as u32 + 1)
                .expect("string present")
        };
        let mut types = Vec::new();
        let mut push = |v: u32| types.extend_from_slice(&v.to_ne_bytes());
        // [1] int: name, info (kind 1), size 4, then the int encoding.
        push(off("int"));
        push(1 << 24);
        push(4);
        push(32);
        // [2] struct task_struct, 2 members.
        push(off("task_struct"));
        push((4 << 24) | 2);
        push(8);
        push(off("state"));
        push(1);
        push(0);
        push(off("exit_code"));
        push(1);
        push(32);
        // [3] struct bits with kind_flag, one 1-bit member at bit 3.
        push(off("bits"));
        push((1 << 31) | (4 << 24) | 1);
        push(4);
        push(off("flag"));
        push(1);
        push((1 << 24) | 3);
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC.to_ne_bytes());
        b.push(1); // version
        b.push(0); // flags
        for v in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        b.extend_from_slice(&types);
        b.extend_from_slice(&strings);
        b
    }

    #[test]
    fn finds_a_member_offset() {
        assert_eq!(
            parse_member_offset(&blob(), "task_struct", "exit_code"),
            Ok(4)
        );
        assert_eq!(parse_member_offset(&blob(), "task_struct", "state"), Ok(0));
    }

    #[test]
    fn reports_missing_and_odd_members() {
        assert_eq!(
            parse_member_offset(&blob(), "task_struct", "pid"),
            Err(ParseError::NoMember)
        );
        assert_eq!(
            parse_member_offset(&blob(), "mm_struct", "pgd"),
            Err(ParseError::NoStruct)
        );
        assert_eq!(
            parse_member_offset(&blob(), "bits", "flag"),
            Err(ParseError::BitField)
        );
    }

    #[test]
    fn rejects_garbage_without_panicking() {
        assert!(matches!(
            parse_member_offset(b"", "a", "b"),
            Err(ParseError::Format(_))
        ));
        let mut cut = blob();
        cut.truncate(40);
        assert!(matches!(
            parse_member_offset(&cut, "task_struct", "exit_code"),
            Err(ParseError::Format(_))
        ));
        let mut bad = blob();
        bad[0] ^= 0xff;
        assert!(matches!(
            parse_member_offset(&bad, "task_struct", "exit_code"),
            Err(ParseError::Format(_))
        ));
    }

    #[test]
    fn the_running_kernel_has_task_struct_exit_code() {
        let path = Path::new(VMLINUX);
        if !path.exists() {
            eprintln!("skipping: {VMLINUX} is missing");
            return;
        }
        let offset = member_offset(path, "task_struct", "exit_code").expect("exit_code in BTF");
        assert!(offset > 0 && offset.is_multiple_of(4), "offset {offset}");
    }
}
