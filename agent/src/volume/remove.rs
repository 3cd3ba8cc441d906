//! Tearing a pod's volumes down without destroying what is not the pod's: tmpfs volumes and
//! the binds of local PersistentVolumes are unmounted before anything is removed; any other mount point below the pod's directory (one a
//! Bidirectional container left, one an operator made) stops the removal; the removal itself
//! walks directories by file descriptor, never follows a symlink (a symlink is removed, not
//! what it points to) and never enters another filesystem. hostPath volumes live outside the
//! pod's directory and are never looked at.
use super::{Error, MountPoint, Result, mountinfo, setup, volumes_dir};
use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags, Stat};
use rustix::mount::UnmountFlags;
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

fn teardown_err(path: &Path) -> impl Fn(String) -> Error + '_ {
    move |message| Error::TearDown {
        path: path.to_owned(),
        message,
    }
}

/// Unmounts pod `uid`'s subPath binds, tmpfs volumes and local PersistentVolume binds and removes
/// `<pods_dir>/<uid>/volume-subpaths` and `<pods_dir>/<uid>/volumes`. Refuses (leaving
/// everything below in place) when a mount point there is not one swiftlet made. Nothing to do
/// is success. Blocking.
pub fn tear_down(pods_dir: &Path, uid: &str) -> Result<()> {
    // A subPath bind: exactly `<volume>/<container>/<index>` below the subpaths dir.
    let sub_paths = pods_dir.join(uid).join(super::SUBPATHS_DIR);
    unmount_ours_and_remove(&sub_paths, "subPath bind", |dir, m| {
        let up3 = m
            .path
            .parent()
            .and_then(Path::parent)
            .and_then(Path::parent);
        up3 == Some(dir)
    })?;
    // A Memory emptyDir, a secret, downwardAPI or projected volume: a tmpfs right on the
    // volume's directory. A local PersistentVolume: a bind (of any filesystem) right on its
    // directory below the local plugin's; unmounting it leaves the volume's content alone.
    unmount_ours_and_remove(&volumes_dir(pods_dir, uid), "volume mount", |dir, m| {
        let plugins = setup::tmpfs_plugin_dirs(dir);
        let parent = m.path.parent();
        let tmpfs = m.fs_type == "tmpfs" && parent.is_some_and(|p| plugins.iter().any(|d| d == p));
        tmpfs || parent == Some(setup::local_plugin_dir(dir).as_path())
    })
}

/// Unmounts the mount points below `dir` that `ours(canonical dir, mount)` says swiftlet made,
/// deepest first, then removes `dir`; any other mount point there stops it before anything is
/// unmounted or removed.
fn unmount_ours_and_remove(
    dir: &Path,
    what: &str,
    ours: impl Fn(&Path, &MountPoint) -> bool,
) -> Result<()> {
    let dir = match dir.canonicalize() {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(teardown_err(dir)(e.to_string())),
    };
    let err = teardown_err(&dir);
    let mounts =
        mountinfo::mount_points().map_err(|e| err(format!("reading the mount table: {e}")))?;
    let found = mountinfo::below(&mounts, &dir);
    if let Some(other) = found.iter().find(|m| !ours(&dir, m)) {
        return Err(Error::TearDown {
            path: other.path.clone(),
            message: format!(
                "a {} mount point swiftlet did not make is below {}: left in place",
                other.fs_type,
                dir.display()
            ),
        });
    }
    for m in found {
        unmount(&m.path).map_err(|e| Error::TearDown {
            path: m.path.clone(),
            message: format!("unmounting the {what}: {e}"),
        })?;
        tracing::info!(dir = %m.path.display(), "{what} unmounted");
    }
    remove_tree(&dir)
}

/// [`tear_down`], then the removal of the whole `<pods_dir>/<uid>` (termination message files
/// and volumes). Blocking.
pub fn remove_pod_dir(pods_dir: &Path, uid: &str) -> Result<()> {
    tear_down(pods_dir, uid)?;
    let dir = pods_dir.join(uid);
    match dir.canonicalize() {
        Ok(d) => remove_tree(&d),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(teardown_err(&dir)(e.to_string())),
    }
}

pub(super) fn unmount(path: &Path) -> std::io::Result<()> {
    umount(path, UnmountFlags::NOFOLLOW)
}

/// Detaches a subPath bind an old container instance may still hold.
pub(super) fn unmount_detached(path: &Path) -> std::io::Result<()> {
    umount(path, UnmountFlags::NOFOLLOW | UnmountFlags::DETACH)
}

/// umount2(2) of `path` with `flags` (UMOUNT_NOFOLLOW always: a symlink a pod put in the mount
/// point's place is not followed).
fn umount(path: &Path, flags: UnmountFlags) -> std::io::Result<()> {
    let target = CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    rustix::mount::unmount(target.as_c_str(), flags)?;
    Ok(())
}

/// Removes directory `dir` (an absolute path without symlinks) and everything in it, refusing
/// when the mount table has a mount point at or below it, and never leaving its filesystem.
pub(super) fn remove_tree(dir: &Path) -> Result<()> {
    let err = teardown_err(dir);
    let mounts =
        mountinfo::mount_points().map_err(|e| err(format!("reading the mount table: {e}")))?;
    refuse_mount_points(&mounts, dir)?;
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return Err(err("not a directory that can be removed".into()));
    };
    let parent = open_dir(CWD, &cstring(parent.as_os_str().as_bytes())?, false)
        .map_err(|e| err(format!("opening its parent: {e}")))?;
    let name = cstring(name.as_bytes())?;
    let top = match open_dir(parent.as_fd(), &name, true) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
        Err(e) => return Err(err(format!("opening it: {e}"))),
    };
    let dev = stat_fd(&top).map_err(|e| err(e.to_string()))?.st_dev;
    remove_contents(&top, dev, dir)?;
    drop(top);
    unlink_at(parent.as_fd(), &name, AtFlags::REMOVEDIR).map_err(|e| err(e.to_string()))
}

fn refuse_mount_points(mounts: &[MountPoint], dir: &Path) -> Result<()> {
    match mountinfo::below(mounts, dir).first() {
        Some(m) => Err(Error::TearDown {
            path: m.path.clone(),
            message: format!("still a {} mount point: nothing removed", m.fs_type),
        }),
        None => Ok(()),
    }
}

fn cstring(b: &[u8]) -> Result<CString> {
    CString::new(b).map_err(|_| Error::Invalid("a path with a NUL byte".into()))
}

/// Opens directory `name` relative to `at` (openat(2) with O_RDONLY | O_DIRECTORY | O_CLOEXEC);
/// with `nofollow` (O_NOFOLLOW), a symlink there is an error.
fn open_dir(at: BorrowedFd<'_>, name: &CStr, nofollow: bool) -> std::io::Result<OwnedFd> {
    let mut flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    if nofollow {
        flags |= OFlags::NOFOLLOW;
    }
    Ok(rustix::fs::openat(at, name, flags, Mode::empty())?)
}

/// fstat(2) of an open descriptor.
fn stat_fd(fd: &OwnedFd) -> std::io::Result<Stat> {
    Ok(rustix::fs::fstat(fd)?)
}

/// fstatat(2) of `name` relative to `at` with AT_SYMLINK_NOFOLLOW: a symlink is described, not
/// what it points to.
fn lstat_at(at: BorrowedFd<'_>, name: &CStr) -> std::io::Result<Stat> {
    Ok(rustix::fs::statat(at, name, AtFlags::SYMLINK_NOFOLLOW)?)
}

/// unlinkat(2) of `name` relative to `at`; `flags` is AT_REMOVEDIR for a directory.
fn unlink_at(at: BorrowedFd<'_>, name: &CStr, flags: AtFlags) -> std::io::Result<()> {
    Ok(rustix::fs::unlinkat(at, name, flags)?)
}

/// Removes what directory `dir` (open, on device `dev`) holds; `shown` is its path, for errors.
fn remove_contents(dir: &OwnedFd, dev: u64, shown: &Path) -> Result<()> {
    let err = teardown_err(shown);
    // The directory as opened, whatever its path has become since.
    let entries = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))
        .map_err(|e| err(format!("listing: {e}")))?;
    for entry in entries {
        let entry = entry.map_err(|e| err(format!("listing: {e}")))?;
        let file = entry.file_name();
        let path: PathBuf = shown.join(&file);
        let name = cstring(file.as_bytes())?;
        let st = match lstat_at(dir.as_fd(), &name) {
            Ok(st) => st,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(teardown_err(&path)(e.to_string())),
        };
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            let sub = open_dir(dir.as_fd(), &name, true)
                .map_err(|e| teardown_err(&path)(format!("opening: {e}")))?;
            let sub_dev = stat_fd(&sub)
                .map_err(|e| teardown_err(&path)(e.to_string()))?
                .st_dev;
            if sub_dev != dev || st.st_dev != dev {
                return Err(teardown_err(&path)(
                    "another filesystem is mounted here: nothing below it removed".into(),
                ));
            }
            remove_contents(&sub, dev, &path)?;
            drop(sub);
            unlink_at(dir.as_fd(), &name, AtFlags::REMOVEDIR)
                .map_err(|e| teardown_err(&path)(e.to_string()))?;
        } else {
            // A file, socket or symlink: the entry itself goes, never what a symlink names.
            unlink_at(dir.as_fd(), &name, AtFlags::empty())
                .map_err(|e| teardown_err(&path)(e.to_string()))?;
        }
    }
    Ok(())
}
