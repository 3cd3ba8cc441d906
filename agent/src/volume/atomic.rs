//! The atomic writer: how the kubelet publishes the files of a configMap, secret, downwardAPI or
//! projected volume so that a container never sees half of an update.
//!
//! A volume directory holds:
//!
//! - `..<timestamp>.<random>`: a hidden directory with the payload's files (made fresh at each
//!   change, mode 0755);
//! - `..data`: a symlink to that directory, replaced in one `rename` of `..data_tmp` over it;
//! - for each top-level name of the payload, a symlink `name -> ..data/name`.
//!
//! A write whose payload equals what `..data` shows (the same paths with the same content, as
//! the kubelet compares them: modes are fixed by the pod's spec, and the pod's fsGroup changes
//! them after the write) changes nothing. After a
//! swap the previous timestamped directory and the user-visible names no longer in the payload
//! are removed. Payload paths are checked first: relative, no `..` component, not starting with
//! `..`, no empty path, segments of at most 255 bytes, paths of at most 4096.
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// The symlink the user-visible names go through.
pub const DATA_DIR: &str = "..data";
const DATA_DIR_TMP: &str = "..data_tmp";
const MAX_PATH: usize = 4096;
const MAX_SEGMENT: usize = 255;

/// One file of a payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProjection {
    pub data: Vec<u8>,
    /// Permission bits (`0o644`).
    pub mode: u32,
    /// Owner to give the file (a projected token's `fsUser`); `None`: the agent's.
    pub owner: Option<u32>,
}

/// What a volume shows: path (relative, `/`-separated) -> file.
pub type Payload = BTreeMap<String, FileProjection>;

/// Why a payload path is refused (the API server's rules for `items[].path`), or why a write
/// failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("an empty path")]
    EmptyPath,
    #[error("path {0:?} is longer than {MAX_PATH} bytes", MAX_PATH = MAX_PATH)]
    TooLong(String),
    #[error("path {0:?} must be relative")]
    NotRelative(String),
    #[error("path {0:?} must not contain '..'")]
    Backstep(String),
    #[error("path {0:?} has a segment longer than {MAX_SEGMENT} bytes", MAX_SEGMENT = MAX_SEGMENT)]
    LongSegment(String),
    #[error("path {0:?} must not start with '..'")]
    DotsFirst(String),
    #[error("path {0:?} names the volume itself")]
    Itself(String),
    /// `doing`: what failed (`reading`, `renaming over` ...), of `path`.
    #[error("{doing} {}: {source}", path.display())]
    Io {
        doing: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is in the way of the symlink the payload needs", .0.display())]
    InTheWay(PathBuf),
}

/// Why a payload path is refused (the API server's rules for `items[].path`).
pub fn check_path(path: &str) -> Result<(), Error> {
    if path.is_empty() {
        return Err(Error::EmptyPath);
    }
    if path.len() > MAX_PATH {
        return Err(Error::TooLong(path.to_owned()));
    }
    if path.starts_with('/') {
        return Err(Error::NotRelative(path.to_owned()));
    }
    for c in Path::new(path).components() {
        match c {
            Component::ParentDir => return Err(Error::Backstep(path.to_owned())),
            Component::Normal(s) if s.len() > MAX_SEGMENT => {
                return Err(Error::LongSegment(path.to_owned()));
            }
            Component::Normal(_) | Component::CurDir => {}
            _ => return Err(Error::NotRelative(path.to_owned())),
        }
    }
    if path.starts_with("..") {
        return Err(Error::DotsFirst(path.to_owned()));
    }
    if Path::new(path).components().all(|c| c == Component::CurDir) {
        return Err(Error::Itself(path.to_owned()));
    }
    Ok(())
}

/// `path` without `.` components and repeated slashes (what the kubelet's `path.Clean` leaves
/// of a checked path).
pub fn clean(path: &str) -> String {
    path.split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect::<Vec<_>>()
        .join("/")
}

fn first_component(path: &str) -> &str {
    path.split('/').next().unwrap_or(path)
}

/// Writes `payload` into volume directory `dir` (which exists) as described in the module doc;
/// `prepare` runs on the new timestamped directory before it is swapped in (ownership for the
/// pod's fsGroup). Returns whether anything changed. Blocking.
pub fn write(
    dir: &Path,
    payload: &Payload,
    prepare: impl FnOnce(&Path) -> std::io::Result<()>,
) -> Result<bool, Error> {
    let mut cleaned = Payload::new();
    for (path, file) in payload {
        check_path(path)?;
        cleaned.insert(clean(path), file.clone());
    }
    let io = |doing: &'static str, p: &Path| {
        let path = p.to_owned();
        move |source: std::io::Error| Error::Io {
            doing,
            path,
            source,
        }
    };
    let data_link = dir.join(DATA_DIR);
    let old_ts = match std::fs::read_link(&data_link) {
        Ok(target) => Some(target),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io("reading", &data_link)(e)),
    };
    let old_paths = match &old_ts {
        Some(_) => listed_files(&data_link).map_err(io("listing", &data_link))?,
        None => BTreeSet::new(),
    };
    let new_tops: BTreeSet<&str> = cleaned.keys().map(|p| first_component(p)).collect();
    let stale_tops: BTreeSet<String> = old_paths
        .iter()
        .map(|p| first_component(p).to_owned())
        .filter(|t| !new_tops.contains(t.as_str()))
        .collect();
    if old_ts.is_some()
        && stale_tops.is_empty()
        && old_paths.len() == cleaned.len()
        && same_files(&data_link, &cleaned)
        && user_links_in_place(dir, &new_tops)
    {
        return Ok(false);
    }
    let ts = new_timestamp_dir(dir).map_err(io("making a timestamped directory in", dir))?;
    let written = write_payload(&ts, &cleaned).and_then(|()| prepare(&ts));
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&ts);
        return Err(io("writing", &ts)(e));
    }
    let ts_name = ts.file_name().map(PathBuf::from).unwrap_or_default();
    let tmp = dir.join(DATA_DIR_TMP);
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&ts_name, &tmp).map_err(io("making the symlink", &tmp))?;
    std::fs::rename(&tmp, &data_link).map_err(io("renaming over", &data_link))?;
    for top in &new_tops {
        let link = dir.join(top);
        let want = Path::new(DATA_DIR).join(top);
        match std::fs::read_link(&link) {
            Ok(t) if t == want => {}
            Ok(_) => {
                std::fs::remove_file(&link).map_err(io("removing", &link))?;
                std::os::unix::fs::symlink(&want, &link)
                    .map_err(io("making the symlink", &link))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::os::unix::fs::symlink(&want, &link)
                    .map_err(io("making the symlink", &link))?;
            }
            Err(_) => return Err(Error::InTheWay(link)),
        }
    }
    for top in &stale_tops {
        let link = dir.join(top);
        if std::fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink()) {
            std::fs::remove_file(&link).map_err(io("removing", &link))?;
        }
    }
    if let Some(old) = old_ts {
        let name = old.file_name().map(PathBuf::from).unwrap_or_default();
        // Only a timestamped directory of ours, right in the volume.
        if old.components().count() == 1 && name.to_string_lossy().starts_with("..") {
            let old = dir.join(name);
            std::fs::remove_dir_all(&old).map_err(io("removing", &old))?;
        }
    }
    Ok(true)
}

/// Every file below `dir` (followed if a symlink), as `/`-separated relative paths.
fn listed_files(dir: &Path) -> std::io::Result<BTreeSet<String>> {
    fn walk(base: &Path, rel: &str, out: &mut BTreeSet<String>) -> std::io::Result<()> {
        for entry in std::fs::read_dir(base.join(rel))? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if entry.file_type()?.is_dir() {
                walk(base, &path, out)?;
            } else {
                out.insert(path);
            }
        }
        Ok(())
    }
    let mut out = BTreeSet::new();
    walk(dir, "", &mut out)?;
    Ok(out)
}

fn same_files(data: &Path, payload: &Payload) -> bool {
    payload.iter().all(|(path, file)| {
        let p = data.join(path);
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            return false;
        };
        meta.is_file() && std::fs::read(&p).is_ok_and(|d| d == file.data)
    })
}

fn user_links_in_place(dir: &Path, tops: &BTreeSet<&str>) -> bool {
    tops.iter()
        .all(|t| std::fs::read_link(dir.join(t)).is_ok_and(|l| l == Path::new(DATA_DIR).join(t)))
}

/// `..<UTC time>.<random>`, mode 0755, in `dir`.
fn new_timestamp_dir(dir: &Path) -> std::io::Result<PathBuf> {
    let stamp = jiff::Timestamp::now()
        .strftime("..%Y_%m_%d_%H_%M_%S.")
        .to_string();
    for _ in 0..16 {
        let path = dir.join(format!("{stamp}{}", fastrand::u32(..)));
        match std::fs::DirBuilder::new().mode(0o755).create(&path) {
            Ok(()) => {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
                return Ok(path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other("no free name"))
}

fn write_payload(ts: &Path, payload: &Payload) -> std::io::Result<()> {
    for (path, file) in payload {
        let full = ts.join(path);
        if let Some(parent) = full.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)?;
        }
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(file.mode)
            .open(&full)
            .and_then(|mut f| std::io::Write::write_all(&mut f, &file.data))?;
        std::fs::set_permissions(&full, std::fs::Permissions::from_mode(file.mode))?;
        if let Some(uid) = file.owner {
            std::os::unix::fs::chown(&full, Some(uid), None)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(data: &str, mode: u32) -> FileProjection {
        FileProjection {
            data: data.as_bytes().to_vec(),
            mode,
            owner: None,
        }
    }

    fn payload(items: &[(&str, &str, u32)]) -> Payload {
        items
            .iter()
            .map(|(p, d, m)| ((*p).to_owned(), file(d, *m)))
            .collect()
    }

    fn ts_dirs(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("..") && n != DATA_DIR)
            .collect();
        v.sort();
        v
    }

    #[test]
    fn files_go_through_data_to_a_timestamped_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = payload(&[("a", "one", 0o644), ("sub/b", "two", 0o400)]);
        assert!(write(dir.path(), &p, |_| Ok(())).expect("write"));
        let data = std::fs::read_link(dir.path().join(DATA_DIR)).expect("..data");
        assert!(data.to_string_lossy().starts_with("..2"), "{data:?}");
        assert_eq!(ts_dirs(dir.path()), [data.to_string_lossy().into_owned()]);
        assert_eq!(
            std::fs::read_link(dir.path().join("a")).expect("a"),
            Path::new("..data/a")
        );
        assert_eq!(
            std::fs::read_link(dir.path().join("sub")).expect("sub"),
            Path::new("..data/sub")
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("sub/b")).expect("b"),
            "two"
        );
        let mode = |p: &str| {
            std::fs::metadata(dir.path().join(p))
                .expect("stat")
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!((mode("a"), mode("sub/b")), (0o644, 0o400));
        let ts_mode = std::fs::metadata(dir.path().join(&data))
            .expect("ts")
            .permissions()
            .mode();
        assert_eq!(ts_mode & 0o7777, 0o755);
    }

    #[test]
    fn an_unchanged_rewrite_does_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = payload(&[("a", "one", 0o644)]);
        assert!(write(dir.path(), &p, |_| Ok(())).expect("first"));
        let before = std::fs::read_link(dir.path().join(DATA_DIR)).expect("..data");
        let mut prepared = false;
        let changed = write(dir.path(), &p, |_| {
            prepared = true;
            Ok(())
        })
        .expect("again");
        assert!(!changed && !prepared, "an unchanged payload is not written");
        let after = std::fs::read_link(dir.path().join(DATA_DIR)).expect("..data");
        assert_eq!(before, after);
        // A content change is a change.
        let p = payload(&[("a", "two", 0o644)]);
        assert!(write(dir.path(), &p, |_| Ok(())).expect("content"));
    }

    #[test]
    fn a_change_swaps_data_and_removes_the_old_directory_and_names() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(
            dir.path(),
            &payload(&[("a", "one", 0o644), ("gone", "x", 0o644)]),
            |_| Ok(()),
        )
        .expect("first");
        let first = std::fs::read_link(dir.path().join(DATA_DIR)).expect("..data");
        // An open handle on the old file keeps reading the old content.
        let held = std::fs::File::open(dir.path().join("a")).expect("open");
        assert!(
            write(
                dir.path(),
                &payload(&[("a", "two", 0o644), ("new", "y", 0o644)]),
                |_| Ok(())
            )
            .expect("second")
        );
        let second = std::fs::read_link(dir.path().join(DATA_DIR)).expect("..data");
        assert_ne!(first, second);
        assert_eq!(ts_dirs(dir.path()), [second.to_string_lossy().into_owned()]);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("a")).expect("a"),
            "two"
        );
        assert!(std::fs::symlink_metadata(dir.path().join("gone")).is_err());
        assert_eq!(
            std::fs::read_to_string(dir.path().join("new")).expect("new"),
            "y"
        );
        assert!(!dir.path().join(DATA_DIR_TMP).exists());
        drop(held);
    }

    #[test]
    fn paths_leaving_the_volume_are_refused_and_nothing_is_written() {
        for bad in ["../x", "a/../../x", "/etc/passwd", "..x", "", "a/../b", "."] {
            let dir = tempfile::tempdir().expect("tempdir");
            let e = write(dir.path(), &payload(&[(bad, "x", 0o644)]), |_| Ok(())).expect_err(bad);
            let e = e.to_string();
            assert!(e.contains("path") || e.contains("empty"), "{bad}: {e}");
            assert_eq!(
                std::fs::read_dir(dir.path()).expect("list").count(),
                0,
                "{bad}: nothing written"
            );
        }
        assert!(check_path(&"a".repeat(256)).is_err());
        assert!(check_path("./a/b").is_ok());
        assert_eq!(clean("./a//b"), "a/b");
    }

    #[test]
    fn an_empty_payload_is_an_empty_volume() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(write(dir.path(), &Payload::new(), |_| Ok(())).expect("write"));
        assert!(dir.path().join(DATA_DIR).is_dir());
        assert!(!write(dir.path(), &Payload::new(), |_| Ok(())).expect("again"));
    }
}
