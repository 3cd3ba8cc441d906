//! Setting volumes up before the pod's sandbox starts: emptyDir directories and tmpfs mounts,
//! hostPath type checks, subPath directories.
use super::atomic::{self, Payload};
use super::{
    Backing, EMPTY_DIR_PLUGIN, Error, HostPathType, LOCAL_PLUGIN, Result, Source, Volume, mountinfo,
};
use rustix::mount::MountFlags;
use std::collections::HashMap;
use std::ffi::CString;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// Why a volume could not be set up, or a subPath made or bound (the messages are the
/// kubelet's where it has one).
#[derive(Debug, thiserror::Error)]
pub enum SetUpError {
    /// `doing` (`creating directory`, `opening` ...) of `path` failed.
    #[error("{doing} {}: {source}", path.display())]
    Io {
        doing: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Path {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("reading the mount table: {0}")]
    MountTable(std::io::Error),
    #[error("{} is a {fs_type} mount, not the tmpfs it should be", dir.display())]
    NotTmpfs { dir: PathBuf, fs_type: String },
    #[error("fsGroup {gid} on {}: {source}", dir.display())]
    FsGroup {
        gid: i64,
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Write(#[from] atomic::Error),
    #[error("its files were not computed")]
    NotComputed,
    #[error("its claim is not resolved to a PersistentVolume yet")]
    Unresolved,
    #[error("local volume path {} does not exist: {source}", path.display())]
    LocalMissing {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "local volume path {} is not a directory (block device local volumes are not supported by swiftlet yet)",
        .0.display()
    )]
    LocalNotADirectory(PathBuf),
    #[error("hostPath {} doesn't exist", .0.display())]
    HostPathMissing(PathBuf),
    #[error(
        "hostPath type check failed, {} is not a {description}, unable to determine its type: {source}",
        path.display()
    )]
    HostPathUnknownType {
        path: PathBuf,
        description: &'static str,
        source: std::io::Error,
    },
    #[error("hostPath type check failed: {} is not a {description}, it's a {actual}", path.display())]
    HostPathType {
        path: PathBuf,
        description: &'static str,
        actual: &'static str,
    },
    #[error("must be a relative path without '..'")]
    NotRelative,
    #[error("{} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    #[error(
        "{} resolves to {}, outside the volume {}",
        path.display(),
        resolved.display(),
        root.display()
    )]
    Escapes {
        path: PathBuf,
        resolved: PathBuf,
        root: PathBuf,
    },
    #[error("{} is outside the volume", .0.display())]
    Outside(PathBuf),
    #[error("a path with a NUL byte")]
    NulByte,
    #[error("opening {} without following symlinks: {source}", path.display())]
    OpenNoFollow {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("binding {} to {}: {source}", from.display(), to.display())]
    Bind {
        from: PathBuf,
        to: PathBuf,
        source: std::io::Error,
    },
}

type SetUpResult<T> = std::result::Result<T, SetUpError>;

/// `doing` of `path` failed, for `map_err`.
fn io(doing: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SetUpError {
    let path = path.to_owned();
    move |source| SetUpError::Io {
        doing,
        path,
        source,
    }
}

/// An error about `path` itself, for `map_err`.
fn about(path: &Path) -> impl FnOnce(std::io::Error) -> SetUpError {
    let path = path.to_owned();
    move |source| SetUpError::Path { path, source }
}

/// What sizes and owns a pod's volumes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Context {
    /// The node's memory in bytes (a Memory emptyDir is at most this big).
    pub node_memory: u64,
    /// The pod cgroup's memory limit, when it has one.
    pub pod_memory_limit: Option<u64>,
    /// `securityContext.fsGroup`: emptyDirs are given to this group (setgid, group rwx), and a
    /// claim's writable local volume, every file of it, as the kubelet's volume ownership does.
    pub fs_group: Option<i64>,
    /// `securityContext.fsGroupChangePolicy: OnRootMismatch`: a claim's volume whose root has
    /// the group and permissions already is not walked.
    pub fs_group_on_root_mismatch: bool,
}

/// Sets up every volume of pod `uid` (idempotent: a volume already set up is left as it is, so
/// a restarted container or agent finds its data). hostPath volumes are checked (and created for
/// the `...OrCreate` types) as the kubelet does. The files of configMap, secret, downwardAPI and
/// projected volumes are `payloads[volume name]` (computed before, so that a missing object
/// stops the set-up before anything is made), written by the atomic writer.
pub fn set_up(
    pods_dir: &Path,
    uid: &str,
    volumes: &[Volume],
    ctx: Context,
    payloads: &HashMap<String, Payload>,
) -> Result<()> {
    let mut mounts = None;
    for v in volumes {
        let fail = |e: SetUpError| Error::SetUp {
            volume: v.name.clone(),
            message: e.to_string(),
        };
        match &v.source {
            Source::EmptyDir { memory, size_limit } => {
                let size = memory.then(|| {
                    super::memory_size(ctx.node_memory, ctx.pod_memory_limit, *size_limit)
                });
                let dir = v.host_path(pods_dir, uid);
                volume_dir(&dir, size, &mut mounts, &v.name).map_err(fail)?;
                if let Some(gid) = ctx.fs_group {
                    give_to_fs_group(&dir, gid).map_err(|source| {
                        fail(SetUpError::FsGroup {
                            gid,
                            dir: dir.clone(),
                            source,
                        })
                    })?;
                }
            }
            Source::HostPath { path, kind }
            | Source::Persistent {
                backing: Backing::HostPath { path, kind },
                ..
            } => check_host_path(path, *kind).map_err(fail)?,
            Source::Persistent {
                backing: Backing::Local(from),
                read_only,
                ..
            } => {
                let dir = v.host_path(pods_dir, uid);
                let bound = local_volume(from, &dir, *read_only, &mut mounts).map_err(fail)?;
                // Once per bind, as the kubelet applies ownership when it mounts; never on a
                // read-only volume (nor does the kubelet).
                if let (true, false, Some(gid)) = (bound, *read_only, ctx.fs_group) {
                    super::ownership::own_volume(&dir, gid, ctx.fs_group_on_root_mismatch)
                        .map_err(|source| {
                            fail(SetUpError::FsGroup {
                                gid,
                                dir: dir.clone(),
                                source,
                            })
                        })?;
                }
            }
            Source::Claim { .. } => return Err(fail(SetUpError::Unresolved)),
            Source::Projection(p) => {
                let size = p
                    .kind
                    .memory()
                    .then(|| super::memory_size(ctx.node_memory, ctx.pod_memory_limit, None));
                let dir = v.host_path(pods_dir, uid);
                volume_dir(&dir, size, &mut mounts, &v.name).map_err(fail)?;
                match payloads.get(&v.name) {
                    Some(payload) => {
                        write_projection(&dir, payload, ctx.fs_group).map_err(fail)?;
                    }
                    // Written before: it keeps its files.
                    None if is_written_dir(&dir) => {}
                    None => return Err(fail(SetUpError::NotComputed)),
                }
            }
        }
    }
    Ok(())
}

/// Rewrites the configMap, secret, downwardAPI and projected volumes of pod `uid` that are set
/// up (their `..data` exists) with `payloads`, as the kubelet does at each pod sync; a volume
/// not set up is never made here. Returns the names of the volumes that changed. Blocking.
pub fn refresh(
    pods_dir: &Path,
    uid: &str,
    volumes: &[Volume],
    fs_group: Option<i64>,
    payloads: &HashMap<String, Payload>,
) -> Result<Vec<String>> {
    let mut changed = Vec::new();
    for v in volumes {
        let (Source::Projection(_), Some(payload)) = (&v.source, payloads.get(&v.name)) else {
            continue;
        };
        let dir = v.host_path(pods_dir, uid);
        if !is_written_dir(&dir) {
            continue;
        }
        let fail = |e: SetUpError| Error::SetUp {
            volume: v.name.clone(),
            message: e.to_string(),
        };
        if write_projection(&dir, payload, fs_group).map_err(fail)? {
            changed.push(v.name.clone());
        }
    }
    Ok(changed)
}

/// Whether the atomic writer has written volume directory `dir` (its `..data` is there).
fn is_written_dir(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir.join(atomic::DATA_DIR)).is_ok()
}

/// Whether volume `name` of pod `uid` is a configMap, secret, downwardAPI or projected volume
/// the atomic writer has written (it was set up before).
pub fn is_written(pods_dir: &Path, uid: &str, volumes: &[Volume], name: &str) -> bool {
    volumes.iter().any(|v| {
        v.name == name
            && matches!(v.source, Source::Projection(_))
            && is_written_dir(&v.host_path(pods_dir, uid))
    })
}

fn write_projection(dir: &Path, payload: &Payload, fs_group: Option<i64>) -> SetUpResult<bool> {
    let changed = atomic::write(dir, payload, |ts| match fs_group {
        Some(gid) => own_tree(ts, gid),
        None => Ok(()),
    })?;
    if changed {
        tracing::debug!(dir = %dir.display(), files = payload.len(), "volume files written");
    }
    Ok(changed)
}

/// The kubelet's volume ownership for a volume it mounts read-only: every file and directory
/// given to group `gid`, files get group (and owner) read, directories also search and setgid.
fn own_tree(dir: &Path, gid: i64) -> std::io::Result<()> {
    let gid = u32::try_from(gid).map_err(|_| std::io::Error::other("fsGroup out of range"))?;
    let meta = std::fs::symlink_metadata(dir)?;
    std::os::unix::fs::lchown(dir, None, Some(gid))?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let mode = meta.permissions().mode() & 0o7777;
    let mode = if meta.is_dir() {
        mode | 0o440 | 0o110 | 0o2000
    } else {
        mode | 0o440
    };
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(dir)? {
            own_tree(&entry?.path(), i64::from(gid))?;
        }
    }
    Ok(())
}

/// A volume's own directory ([`empty_dir`]), with a tmpfs of `size` mounted on it when `size`
/// is set (once: one already there is kept; another filesystem there is an error).
fn volume_dir(
    dir: &Path,
    size: Option<u64>,
    mounts: &mut Option<Vec<mountinfo::MountPoint>>,
    volume: &str,
) -> SetUpResult<()> {
    empty_dir(dir).map_err(about(dir))?;
    let Some(size) = size else { return Ok(()) };
    let dir = dir.canonicalize().map_err(about(dir))?;
    // The common answers without the mount table (which grows with every container on the
    // node): no mount here yet, or the tmpfs of an earlier set-up.
    let root = mountinfo::is_mount_root(&dir).map_err(about(&dir))?;
    match root {
        Some(false) => return tmpfs_on(&dir, size, volume),
        Some(true) if mountinfo::is_tmpfs(&dir).unwrap_or(false) => return Ok(()),
        _ => {}
    }
    if mounts.is_none() {
        *mounts = Some(mountinfo::mount_points().map_err(SetUpError::MountTable)?);
    }
    let mounted = mounts.iter().flatten().rev().find(|m| m.path == dir);
    match mounted {
        Some(m) if m.fs_type == "tmpfs" => Ok(()),
        Some(m) => Err(SetUpError::NotTmpfs {
            dir: dir.clone(),
            fs_type: m.fs_type.clone(),
        }),
        None => tmpfs_on(&dir, size, volume),
    }
}

/// A local PersistentVolume: directory `from` bound onto `dir` (made 0750 here), read-only when
/// `read_only`, as the kubelet's local volume plugin binds it. Once: a bind already on `dir` is
/// kept (a restarted container or agent finds it). True when bound now, false when it was bound
/// before.
fn local_volume(
    from: &Path,
    dir: &Path,
    read_only: bool,
    mounts: &mut Option<Vec<mountinfo::MountPoint>>,
) -> SetUpResult<bool> {
    let meta = std::fs::metadata(from).map_err(|source| SetUpError::LocalMissing {
        path: from.to_owned(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(SetUpError::LocalNotADirectory(from.to_owned()));
    }
    if let Some(parent) = dir.parent() {
        crate::pod::pod_dirs(parent).map_err(io("creating directory", parent))?;
    }
    match std::fs::DirBuilder::new().mode(0o750).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let m = std::fs::symlink_metadata(dir).map_err(about(dir))?;
            if !m.is_dir() {
                return Err(SetUpError::NotADirectory(dir.to_owned()));
            }
        }
        Err(e) => return Err(io("creating directory", dir)(e)),
    }
    let dir = dir.canonicalize().map_err(about(dir))?;
    let bound = match mountinfo::is_mount_root(&dir).map_err(about(&dir))? {
        Some(root) => root,
        None => {
            if mounts.is_none() {
                *mounts = Some(mountinfo::mount_points().map_err(SetUpError::MountTable)?);
            }
            mounts.iter().flatten().any(|m| m.path == dir)
        }
    };
    // Whatever file system the bind shows (the volume's own: ext4, xfs, a tmpfs ...), a mount
    // on this directory, which only the agent makes, is the bind of an earlier set-up.
    if bound {
        return Ok(false);
    }
    let cstr = |p: &Path| {
        use std::os::unix::ffi::OsStrExt;
        CString::new(p.as_os_str().as_bytes()).map_err(|_| SetUpError::NulByte)
    };
    let (source, target) = (cstr(from)?, cstr(&dir)?);
    let bind_err = |e: rustix::io::Errno| SetUpError::Bind {
        from: from.to_owned(),
        to: dir.clone(),
        source: e.into(),
    };
    rustix::mount::mount_bind(source.as_c_str(), target.as_c_str()).map_err(bind_err)?;
    if read_only {
        let ro = rustix::mount::mount_remount(
            target.as_c_str(),
            MountFlags::BIND | MountFlags::RDONLY,
            c"",
        );
        if let Err(e) = ro {
            // Never leave a writable bind of a volume that should be read-only.
            let _ = super::remove::unmount(&dir);
            return Err(bind_err(e));
        }
    }
    tracing::info!(from = %from.display(), dir = %dir.display(), read_only, "local volume bound");
    Ok(true)
}

fn tmpfs_on(dir: &Path, size: u64, volume: &str) -> SetUpResult<()> {
    mount_tmpfs(dir, size).map_err(io("mounting a tmpfs on", dir))?;
    tracing::info!(volume, dir = %dir.display(), size, "tmpfs mounted");
    Ok(())
}

/// An emptyDir's directory: made with mode 0777 whatever the umask (as the kubelet makes it).
/// One that exists is left as the pod left it.
fn empty_dir(dir: &Path) -> std::io::Result<()> {
    if let Some(parent) = dir.parent() {
        crate::pod::pod_dirs(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o777).create(dir) {
        Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if std::fs::symlink_metadata(dir)?.is_dir() {
                Ok(())
            } else {
                Err(std::io::Error::other("exists and is not a directory"))
            }
        }
        Err(e) => Err(e),
    }
}

/// Gives an emptyDir's root (the directory, or the tmpfs mounted on it) to the pod's `fsGroup`
/// as the kubelet's volume ownership does: that group, group rwx, setgid (files made in it get
/// the group). At each set-up, as the kubelet applies it at each mount.
fn give_to_fs_group(dir: &Path, gid: i64) -> std::io::Result<()> {
    let gid = u32::try_from(gid).map_err(|_| std::io::Error::other("fsGroup out of range"))?;
    std::os::unix::fs::chown(dir, None, Some(gid))?;
    let mode = std::fs::metadata(dir)?.permissions().mode() & 0o7777;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o2070))
}

/// mount(2) of a tmpfs on `dir`, `size` bytes big (0: the kernel's default size). The options
/// are always passed, an empty string when there are none.
pub(super) fn mount_tmpfs(dir: &Path, size: u64) -> std::io::Result<()> {
    let cstr = |s: &str| CString::new(s).map_err(std::io::Error::other);
    let target = cstr(&dir.to_string_lossy())?;
    let data = cstr(&if size > 0 {
        format!("size={size}")
    } else {
        String::new()
    })?;
    rustix::mount::mount(
        c"tmpfs",
        target.as_c_str(),
        c"tmpfs",
        MountFlags::empty(),
        data.as_c_str(),
    )?;
    Ok(())
}

/// The kubelet's name of a file type, for type mismatches.
fn type_name(t: std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "Directory"
    } else if t.is_file() {
        "File"
    } else if t.is_socket() {
        "Socket"
    } else if t.is_char_device() {
        "CharDevice"
    } else if t.is_block_device() {
        "BlockDevice"
    } else {
        "an unknown type"
    }
}

/// The kubelet's hostPath checks: `...OrCreate` makes a missing directory (0755) or empty file
/// (0644, its directory must exist); every other type must find what it names (symlinks
/// followed). Messages as the kubelet's.
pub(super) fn check_host_path(path: &Path, kind: HostPathType) -> SetUpResult<()> {
    let (expected, description) = match kind {
        HostPathType::Unset => return Ok(()),
        HostPathType::DirectoryOrCreate | HostPathType::Directory => ("Directory", "directory"),
        HostPathType::FileOrCreate | HostPathType::File => ("File", "file"),
        HostPathType::Socket => ("Socket", "socket file"),
        HostPathType::CharDevice => ("CharDevice", "character device"),
        HostPathType::BlockDevice => ("BlockDevice", "block device"),
    };
    let exists = std::fs::metadata(path).is_ok();
    if !exists {
        match kind {
            HostPathType::DirectoryOrCreate => {
                return std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(path)
                    .map_err(io("creating directory", path));
            }
            HostPathType::FileOrCreate => {
                return std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .mode(0o644)
                    .open(path)
                    .map(drop)
                    .map_err(io("creating file", path));
            }
            _ => return Err(SetUpError::HostPathMissing(path.to_owned())),
        }
    }
    let actual = std::fs::metadata(path)
        .map(|m| type_name(m.file_type()))
        .map_err(|source| SetUpError::HostPathUnknownType {
            path: path.to_owned(),
            description,
            source,
        })?;
    if actual == expected {
        Ok(())
    } else {
        Err(SetUpError::HostPathType {
            path: path.to_owned(),
            description,
            actual,
        })
    }
}

use std::os::unix::fs::OpenOptionsExt;

/// The host path of `sub` inside volume directory `base`, made as the kubelet makes a subPath:
/// what exists is resolved (symlinks followed) and must stay inside the volume; what is missing
/// is created as directories with the volume's mode. A container can change the volume while
/// this runs, so every missing directory is made and chmodded through descriptors opened from
/// the volume's root without following a symlink (`mkdirat`, `openat` with `O_NOFOLLOW`,
/// `fchmod`): a directory swapped for a symlink is refused, never chmodded through. `sub` was
/// checked to be relative without `..`.
pub(super) fn sub_path(base: &Path, sub: &str) -> SetUpResult<PathBuf> {
    sub_path_watched(base, sub, &mut |_| {})
}

/// [`sub_path`], calling `made` with each directory it made before opening it (a test widens
/// the window a container has to swap it there).
pub(super) fn sub_path_watched(
    base: &Path,
    sub: &str,
    made: &mut dyn FnMut(&Path),
) -> SetUpResult<PathBuf> {
    use rustix::fs::{Mode, OFlags};
    use rustix::io::Errno;
    let root = base.canonicalize().map_err(io("volume path", base))?;
    let mode = std::fs::metadata(&root)
        .map_err(io("volume path", &root))?
        .permissions()
        .mode()
        & 0o7777;
    let mut names = Vec::new();
    for comp in Path::new(sub).components() {
        match comp {
            Component::Normal(n) => names.push(n),
            Component::CurDir => continue,
            _ => return Err(SetUpError::NotRelative),
        }
    }
    let mut cur = root.clone();
    let mut names = names.into_iter().peekable();
    while let Some(name) = names.peek() {
        let next = cur.join(name);
        match std::fs::symlink_metadata(&next) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
            Err(e) => return Err(about(&next)(e)),
            Ok(_) => {
                let resolved = next.canonicalize().map_err(about(&next))?;
                if !resolved.starts_with(&root) {
                    return Err(SetUpError::Escapes {
                        path: next,
                        resolved,
                        root,
                    });
                }
                cur = resolved;
                names.next();
            }
        }
    }
    if names.peek().is_none() {
        return Ok(cur);
    }
    let existing = cur.strip_prefix(&root).unwrap_or(Path::new("")).to_owned();
    let mut dir = open_beneath(&root, &existing)?;
    for name in names {
        let parent = cur.clone();
        cur.push(name);
        let made_here = match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(mode)) {
            Ok(()) => true,
            Err(Errno::EXIST) => false,
            Err(Errno::NOTDIR) => return Err(SetUpError::NotADirectory(parent)),
            Err(e) => return Err(io("creating", &cur)(e.into())),
        };
        if made_here {
            made(&cur);
        }
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let next = rustix::fs::openat(&dir, name, flags, Mode::empty()).map_err(|e| {
            SetUpError::OpenNoFollow {
                path: cur.clone(),
                source: e.into(),
            }
        })?;
        if made_here {
            // mkdir(2) applies the umask and drops the set-group-ID bit: set the mode as asked.
            rustix::fs::fchmod(&next, Mode::from_raw_mode(mode))
                .map_err(|e| io("chmodding", &cur)(e.into()))?;
        }
        dir = next;
    }
    Ok(cur)
}

/// `rel` (components without `..`) under directory `root`, opened one component at a time with
/// `O_PATH | O_NOFOLLOW`: a symlink anywhere on the way is refused, never followed.
fn open_beneath(root: &Path, rel: &Path) -> SetUpResult<std::os::fd::OwnedFd> {
    use rustix::fs::{CWD, FileType, Mode, OFlags};
    use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let open = |at: BorrowedFd<'_>, name: &std::ffi::CStr| -> std::io::Result<OwnedFd> {
        let fd = rustix::fs::openat(
            at,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let st = rustix::fs::fstat(&fd)?;
        if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
            return Err(std::io::Error::other("is a symlink"));
        }
        Ok(fd)
    };
    let cstr = |b: &[u8]| CString::new(b).map_err(|_| SetUpError::NulByte);
    let mut fd = open(CWD, &cstr(root.as_os_str().as_bytes())?).map_err(io("opening", root))?;
    let mut at = root.to_owned();
    for comp in rel.components() {
        at.push(comp);
        fd = open(fd.as_fd(), &cstr(comp.as_os_str().as_bytes())?).map_err(|source| {
            SetUpError::OpenNoFollow {
                path: at.clone(),
                source,
            }
        })?;
    }
    Ok(fd)
}

/// Where the subPath mount `index` of container `container` of volume `volume` is bound:
/// `<pods_dir>/<uid>/volume-subpaths/<volume>/<container>/<index>` (the kubelet's place).
pub(super) fn sub_path_target(
    pods_dir: &Path,
    uid: &str,
    volume: &str,
    container: &str,
    index: usize,
) -> PathBuf {
    pods_dir
        .join(uid)
        .join(super::SUBPATHS_DIR)
        .join(volume)
        .join(container)
        .join(index.to_string())
}

/// Binds `resolved` (a path inside volume `base` that [`sub_path`] resolved and checked) onto
/// `target`, as the kubelet does: the path is opened one component at a time from the volume's
/// root without following any symlink (one put in place since the check is refused), and what
/// was opened, by its file descriptor, is what gets mounted. The runtime then mounts `target`,
/// which no container can redirect. A bind left on `target` by an earlier instance of the
/// container is replaced.
pub(super) fn bind_sub_path(base: &Path, resolved: &Path, target: &Path) -> SetUpResult<()> {
    use std::os::fd::AsRawFd;
    let root = base.canonicalize().map_err(io("volume path", base))?;
    let rel = resolved
        .strip_prefix(&root)
        .map_err(|_| SetUpError::Outside(resolved.to_owned()))?;
    let fd = open_beneath(&root, rel)?;
    let cstr = |b: &[u8]| CString::new(b).map_err(|_| SetUpError::NulByte);
    use std::os::unix::ffi::OsStrExt;
    let is_dir = std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(about(resolved))?
        .is_dir();
    prepare_target(target, is_dir).map_err(about(target))?;
    let source = cstr(format!("/proc/self/fd/{}", fd.as_raw_fd()).as_bytes())?;
    let dest = cstr(target.as_os_str().as_bytes())?;
    // mount(source, dest, NULL, MS_BIND, NULL).
    rustix::mount::mount_bind(source.as_c_str(), dest.as_c_str()).map_err(|e| SetUpError::Bind {
        from: resolved.to_owned(),
        to: target.to_owned(),
        source: e.into(),
    })
}

/// Makes `target` an unmounted directory (`dir`) or empty file to bind onto: a bind an earlier
/// container instance left there is detached first (what it showed stays in the volume).
fn prepare_target(target: &Path, dir: bool) -> std::io::Result<()> {
    if let Some(parent) = target.parent() {
        crate::pod::pod_dirs(parent)?;
    }
    let canonical = target.parent().map(|p| p.canonicalize()).transpose()?;
    let full = canonical.map(|p| p.join(target.file_name().unwrap_or_default()));
    let mounts = mountinfo::mount_points()?;
    for _ in mounts.iter().filter(|m| Some(&m.path) == full.as_ref()) {
        super::remove::unmount_detached(target)?;
    }
    match std::fs::symlink_metadata(target) {
        Ok(m) if m.is_dir() == dir && !m.file_type().is_symlink() => return Ok(()),
        Ok(m) if m.is_dir() => std::fs::remove_dir(target)?,
        Ok(_) => std::fs::remove_file(target)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    if dir {
        std::fs::DirBuilder::new().mode(0o750).create(target)
    } else {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o640)
            .open(target)
            .map(drop)
    }
}

/// The plugin directory of a pod's volumes dir where local PersistentVolumes are bound (for
/// tear-down).
pub(super) fn local_plugin_dir(volumes_dir: &Path) -> PathBuf {
    volumes_dir.join(LOCAL_PLUGIN)
}

/// The plugin directories of a pod's volumes dir whose volumes may be a tmpfs (for tear-down).
pub(super) fn tmpfs_plugin_dirs(volumes_dir: &Path) -> Vec<PathBuf> {
    let written = super::projection::Kind::ALL
        .into_iter()
        .filter(|k| k.memory())
        .map(|k| volumes_dir.join(k.plugin_dir()));
    std::iter::once(volumes_dir.join(EMPTY_DIR_PLUGIN))
        .chain(written)
        .collect()
}
