//! The kubelet's volume ownership for a writable volume a pod's `fsGroup` applies to: every file
//! and directory of it is given to the group, files get group read and write, directories also
//! search and setgid (what is made in them later gets the group). With `fsGroupChangePolicy:
//! OnRootMismatch` a volume whose root has the group, those permissions and setgid already is
//! left as it is, however large.
//!
//! A pod can write into the volume while it is walked (another pod sharing the claim, or this
//! one's previous instance), so nothing here follows a symlink: directories are opened from
//! their parent's descriptor with `O_NOFOLLOW`, every other file is opened `O_PATH |
//! O_NOFOLLOW` and changed through that descriptor, and a symlink only has its own group
//! changed. A file swapped for a symlink after it was looked at is never reached through it. The
//! walk stays on the volume's file system (a mount point inside it is not entered).
use rustix::fd::{AsFd, AsRawFd, OwnedFd};
use rustix::fs::{AtFlags, CWD, FileType, Gid, Mode, OFlags, Stat};
use std::path::Path;

/// Group read and write (a read-only volume gets read only: the kubelet's masks).
const RW: u32 = 0o660;
/// Group (and owner) search on directories.
const EXEC: u32 = 0o110;
const SETGID: u32 = 0o2000;
/// Deeper than this is refused rather than walked (each level holds a descriptor).
const MAX_DEPTH: usize = 512;

/// Gives volume `dir` to group `gid` as above; `on_root_mismatch`: skip it when its root is
/// right already. Blocking: a large volume takes a while.
pub fn own_volume(dir: &Path, gid: i64, on_root_mismatch: bool) -> std::io::Result<()> {
    let gid = u32::try_from(gid)
        .ok()
        .filter(|g| *g != u32::MAX)
        .ok_or_else(|| std::io::Error::other("fsGroup out of range"))?;
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let root = rustix::fs::open(dir, flags, Mode::empty())?;
    let st = rustix::fs::fstat(&root)?;
    if on_root_mismatch && !root_mismatch(&st, gid) {
        tracing::debug!(dir = %dir.display(), gid, "volume ownership: the root is right, not walked");
        return Ok(());
    }
    let started = std::time::Instant::now();
    let mut changed = 0usize;
    own_dir(&root, &st, Gid::from_raw(gid), 0, &mut changed)?;
    tracing::info!(dir = %dir.display(), gid, files = changed, took_ms = started.elapsed().as_millis() as u64, "volume given to the fsGroup");
    Ok(())
}

/// Whether the volume's root lacks the group, group read-write-search or setgid (the kubelet's
/// test for `OnRootMismatch`).
fn root_mismatch(st: &Stat, gid: u32) -> bool {
    let want = RW | EXEC;
    st.st_gid != gid || st.st_mode & want != want || st.st_mode & SETGID == 0
}

/// The mode `st`'s file gets: its own, with group read-write, and for a directory search and
/// setgid.
fn wanted_mode(st: &Stat) -> Mode {
    let dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
    let extra = if dir { RW | EXEC | SETGID } else { RW };
    Mode::from_raw_mode((st.st_mode & 0o7777) | extra)
}

/// Changes directory `dir` (open, `st` its stat) and everything below it on its file system.
fn own_dir(
    dir: &OwnedFd,
    st: &Stat,
    gid: Gid,
    depth: usize,
    changed: &mut usize,
) -> std::io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(std::io::Error::other(format!(
            "the volume is nested deeper than {MAX_DEPTH} directories"
        )));
    }
    rustix::fs::fchown(dir, None, Some(gid))?;
    rustix::fs::fchmod(dir, wanted_mode(st))?;
    *changed += 1;
    for entry in rustix::fs::Dir::read_from(dir)? {
        let name = entry?.file_name().to_owned();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        let kid = match rustix::fs::statat(dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(s) => s,
            // Gone meanwhile.
            Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => return Err(e.into()),
        };
        match FileType::from_raw_mode(kid.st_mode) {
            FileType::Symlink => {
                // Its own group only; what it points to is not the volume's.
                let flags = AtFlags::SYMLINK_NOFOLLOW;
                match rustix::fs::chownat(dir, name.as_c_str(), None, Some(gid), flags) {
                    Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                    Err(e) => return Err(e.into()),
                }
                *changed += 1;
            }
            FileType::Directory if kid.st_dev == st.st_dev => {
                let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                let sub = match rustix::fs::openat(dir, name.as_c_str(), flags, Mode::empty()) {
                    Ok(fd) => fd,
                    // Swapped for a symlink or a file, or gone, meanwhile: not walked.
                    Err(
                        rustix::io::Errno::NOENT
                        | rustix::io::Errno::LOOP
                        | rustix::io::Errno::NOTDIR,
                    ) => continue,
                    Err(e) => return Err(e.into()),
                };
                let sub_st = rustix::fs::fstat(&sub)?;
                if sub_st.st_dev == st.st_dev {
                    own_dir(&sub, &sub_st, gid, depth + 1, changed)?;
                }
            }
            // A mount point inside the volume: not the volume's.
            FileType::Directory => {}
            _ => {
                let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                let file = match rustix::fs::openat(dir, name.as_c_str(), flags, Mode::empty()) {
                    Ok(fd) => fd,
                    Err(rustix::io::Errno::NOENT) => continue,
                    Err(e) => return Err(e.into()),
                };
                own_file(&file, gid)?;
                *changed += 1;
            }
        }
    }
    Ok(())
}

/// Changes the file open (`O_PATH`) as `file`: its group through the descriptor, its mode
/// through the descriptor's `/proc` link (what was opened, never a path looked up again). A
/// symlink swapped in before the open was opened as the link itself and only has its group
/// changed.
fn own_file(file: &OwnedFd, gid: Gid) -> std::io::Result<()> {
    rustix::fs::chownat(file.as_fd(), c"", None, Some(gid), AtFlags::EMPTY_PATH)?;
    let st = rustix::fs::fstat(file)?;
    if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
        return Ok(());
    }
    let link = format!("/proc/self/fd/{}", file.as_raw_fd());
    rustix::fs::chmodat(CWD, link.as_str(), wanted_mode(&st), AtFlags::empty())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn root() -> bool {
        if rustix::process::geteuid().is_root() {
            return true;
        }
        eprintln!("skipped: changing a file's group needs root");
        false
    }

    #[test]
    fn every_file_gets_the_group_and_no_symlink_is_followed() {
        if !root() {
            return;
        }
        let vol = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        let secret = outside.path().join("secret");
        std::fs::write(&secret, "x").expect("write");
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let d = vol.path();
        std::fs::create_dir_all(d.join("a/b")).expect("mkdir");
        std::fs::write(d.join("a/b/f"), "data").expect("write");
        std::fs::set_permissions(d.join("a/b/f"), std::fs::Permissions::from_mode(0o600))
            .expect("chmod");
        std::os::unix::fs::symlink(&secret, d.join("a/link")).expect("symlink");
        std::os::unix::fs::symlink(outside.path(), d.join("dirlink")).expect("symlink");

        own_volume(d, 4321, false).expect("owned");
        for (path, mode) in [
            (d.to_owned(), 0o2770),
            (d.join("a"), 0o2770),
            (d.join("a/b"), 0o2770),
            (d.join("a/b/f"), 0o660),
        ] {
            let m = std::fs::metadata(&path).expect("stat");
            assert_eq!(m.gid(), 4321, "{}", path.display());
            assert_eq!(m.mode() & mode, mode, "{}: {:o}", path.display(), m.mode());
        }
        assert_eq!(
            std::fs::symlink_metadata(d.join("a/link"))
                .expect("lstat")
                .gid(),
            4321,
            "the link itself"
        );
        // What the links point to is untouched.
        let s = std::fs::metadata(&secret).expect("stat");
        assert_eq!((s.gid(), s.mode() & 0o7777), (0, 0o600));
        assert_eq!(std::fs::metadata(outside.path()).expect("stat").gid(), 0);
    }

    #[test]
    fn on_root_mismatch_a_right_root_is_not_walked_and_a_wrong_one_is() {
        if !root() {
            return;
        }
        let vol = tempfile::tempdir().expect("tempdir");
        let d = vol.path();
        std::fs::write(d.join("f"), "data").expect("write");
        // The root right already: the file below is left as it is.
        std::os::unix::fs::chown(d, None, Some(4321)).expect("chown");
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o2770)).expect("chmod");
        own_volume(d, 4321, true).expect("owned");
        assert_eq!(std::fs::metadata(d.join("f")).expect("stat").gid(), 0);
        // Always: walked.
        own_volume(d, 4321, false).expect("owned");
        assert_eq!(std::fs::metadata(d.join("f")).expect("stat").gid(), 4321);
        // Another group at the root: walked even on root mismatch.
        own_volume(d, 5000, true).expect("owned");
        assert_eq!(std::fs::metadata(d.join("f")).expect("stat").gid(), 5000);
    }
}
