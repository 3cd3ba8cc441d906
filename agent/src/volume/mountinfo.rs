//! The agent's mount table, read from `/proc/self/mountinfo`, and the two questions about one
//! path that the kernel answers without it (is it a mount root; is it a tmpfs).
use std::path::{Path, PathBuf};

/// One mount: where it is and its filesystem type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPoint {
    pub path: PathBuf,
    pub fs_type: String,
}

/// Every mount point of the agent's mount namespace, in the table's order (a later mount on the
/// same path hides an earlier one).
pub fn mount_points() -> std::io::Result<Vec<MountPoint>> {
    Ok(parse(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

/// The mount points of a mountinfo text. A line is `id parent major:minor root mount-point
/// options [optional fields...] - fs-type source super-options`; paths escape space, tab,
/// newline and backslash in octal (`\040`). Malformed lines are skipped.
pub(super) fn parse(text: &str) -> Vec<MountPoint> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let path = fields.get(4)?;
            let dash = fields.iter().position(|f| *f == "-")?;
            let fs_type = fields.get(dash + 1)?;
            Some(MountPoint {
                path: PathBuf::from(unescape(path)),
                fs_type: unescape(fs_type),
            })
        })
        .collect()
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let v = d.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                out.push(u8::try_from(v).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount points at or below `dir` (compared component by component), deepest first.
pub(super) fn below<'a>(mounts: &'a [MountPoint], dir: &Path) -> Vec<&'a MountPoint> {
    let mut found: Vec<&MountPoint> = mounts.iter().filter(|m| m.path.starts_with(dir)).collect();
    found.sort_by_key(|m| std::cmp::Reverse(m.path.components().count()));
    found
}

fn c_path(path: &Path) -> std::io::Result<std::ffi::CString> {
    std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(std::io::Error::other)
}

/// Whether `path` (not followed when a symlink) is the root of a mount, from statx's mount-root
/// attribute (Linux 5.8 and later) instead of the whole mount table; `None` when the kernel
/// does not say.
pub fn is_mount_root(path: &Path) -> std::io::Result<Option<bool>> {
    use rustix::fs::{AtFlags, CWD, StatxAttributes, StatxFlags};
    let c = c_path(path)?;
    let stx = match rustix::fs::statx(CWD, &c, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::empty()) {
        Ok(stx) => stx,
        // No statx in the kernel (before 4.11): glibc's statx falls back to fstatat, which has
        // no attributes to tell; rustix reports ENOSYS instead, so do as glibc does.
        Err(rustix::io::Errno::NOSYS) => {
            rustix::fs::statat(CWD, &c, AtFlags::SYMLINK_NOFOLLOW)?;
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    let bit = StatxAttributes::MOUNT_ROOT;
    Ok(stx
        .stx_attributes_mask
        .contains(bit)
        .then_some(stx.stx_attributes.contains(bit)))
}

/// Whether the file system that holds `path` is a tmpfs.
pub fn is_tmpfs(path: &Path) -> std::io::Result<bool> {
    let c = c_path(path)?;
    let st = rustix::fs::statfs(&c)?;
    Ok(st.f_type == libc::TMPFS_MAGIC as rustix::fs::FsWord)
}
