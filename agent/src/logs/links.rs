//! The container log links log shippers read: for every container the agent starts, as the
//! kubelet makes them, a symbolic link `<pod>_<namespace>_<container>-<container id>.log` in the
//! containers directory to the container's log file
//! (`<pod-logs-dir>/<namespace>_<pod>_<uid>/<container>/<restart count>.log`). Log shipper
//! DaemonSets tail `/var/log/containers/*.log` and read the pod, namespace, container and
//! container ID from the link's name.
//!
//! The containers directory is the pod logs dir's sibling `containers` ([`dir_for`]):
//! `/var/log/containers` for the default `/var/log/pods`.
//!
//! A link is made once the runtime started its container, when the log file exists; it goes with
//! its container (container garbage collection, a pod's removal). A link whose log file is gone
//! is left for the container garbage collector, which removes it unless its container still runs
//! (a rotation renames a running container's log for a moment). Each link is made and removed
//! relative to the opened directory, under a name checked to be one plain file name, so no name
//! leads out of it; an entry already there under the name is replaced, never followed. These are
//! a few system calls each, made on the caller's thread.
use k8s_cri::v1 as api;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// The longest file name Linux file systems take (ext4's limit).
pub const MAX_NAME_LEN: usize = 255;

/// What every link's name ends with.
const SUFFIX: &str = ".log";

/// The containers directory of pod logs dir `pod_logs_dir`: its sibling `containers`.
pub fn dir_for(pod_logs_dir: &Path) -> PathBuf {
    pod_logs_dir
        .parent()
        .unwrap_or(pod_logs_dir)
        .join("containers")
}

/// A part of a name that can stand in one file name without changing what it names.
fn plain(part: &str) -> bool {
    !part.is_empty() && !part.starts_with('.') && !part.contains(['/', '\0'])
}

/// The link's name for container `id`, named `container`, of pod `pod` in `namespace`:
/// `<pod>_<namespace>_<container>-<id>.log`. A name longer than [`MAX_NAME_LEN`] bytes has its
/// `<pod>_<namespace>_<container>` part cut to fit; the ID and the suffix stay whole. `None`
/// when a part is empty, starts with `.` or holds a `/` or a NUL, or the ID leaves no room.
pub fn link_name(pod: &str, namespace: &str, container: &str, id: &str) -> Option<String> {
    if ![pod, namespace, container, id].into_iter().all(plain) {
        return None;
    }
    let tail = format!("-{id}{SUFFIX}");
    let room = MAX_NAME_LEN.checked_sub(tail.len())?;
    let mut head = format!("{pod}_{namespace}_{container}");
    if head.len() > room {
        let mut end = room;
        while !head.is_char_boundary(end) {
            end -= 1;
        }
        head.truncate(end);
    }
    (!head.is_empty()).then(|| head + &tail)
}

/// The link's name of the container the runtime reports as `status` (its pod from its labels).
pub fn name_of(status: &api::ContainerStatus) -> Option<String> {
    let label = |key: &str| status.labels.get(key).map(String::as_str);
    link_name(
        label(crate::pod::labels::POD_NAME)?,
        label(crate::pod::labels::POD_NAMESPACE)?,
        &status.metadata.as_ref()?.name,
        &status.id,
    )
}

/// The container ID in a link's name (what follows its last `-`).
pub fn id_of(name: &str) -> Option<&str> {
    let (_, id) = name.strip_suffix(SUFFIX)?.rsplit_once('-')?;
    (!id.is_empty()).then_some(id)
}

/// `name` as a link's name, or an error saying why it is not one.
fn checked(name: &str) -> io::Result<&str> {
    if plain(name) && name.len() <= MAX_NAME_LEN && name.ends_with(SUFFIX) {
        Ok(name)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a container log link's name"),
        ))
    }
}

fn open_dir(dir: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Whether `name` in `dir` is a symbolic link (not followed).
fn is_link(dir: &OwnedFd, name: &str) -> io::Result<bool> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(FileType::from_raw_mode(st.st_mode) == FileType::Symlink),
        Err(Errno::NOENT) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Whether `name` in `dir` is a symbolic link to nothing.
fn is_dangling(dir: &OwnedFd, name: &str) -> io::Result<bool> {
    if !is_link(dir, name)? {
        return Ok(false);
    }
    match rustix::fs::statat(dir, name, AtFlags::empty()) {
        Ok(_) => Ok(false),
        Err(Errno::NOENT) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// Links `name` in `dir` to `target` (a container's log file), replacing what is there under that
/// name (a link is replaced, not followed; a directory is not replaced: an error). `Ok(false)`,
/// and no link, when `target` does not exist.
pub fn create(dir: &Path, name: &str, target: &Path) -> io::Result<bool> {
    let name = checked(name)?;
    match std::fs::metadata(target) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        _ => {}
    }
    let dir = open_dir(dir)?;
    match rustix::fs::symlinkat(target, &dir, name) {
        Err(Errno::EXIST) => {
            rustix::fs::unlinkat(&dir, name, AtFlags::empty())?;
            rustix::fs::symlinkat(target, &dir, name)?;
        }
        made => made?,
    }
    Ok(true)
}

/// Removes link `name` from `dir`, if it is there (and is a link: any other entry stays); true
/// when one was removed.
pub fn remove(dir: &Path, name: &str) -> io::Result<bool> {
    remove_if(dir, name, is_link)
}

/// Removes link `name` from `dir` if it is there and leads to nothing; true when it was removed.
pub fn remove_if_dangling(dir: &Path, name: &str) -> io::Result<bool> {
    remove_if(dir, name, is_dangling)
}

fn remove_if(
    dir: &Path,
    name: &str,
    due: fn(&OwnedFd, &str) -> io::Result<bool>,
) -> io::Result<bool> {
    let name = checked(name)?;
    let dir = match open_dir(dir) {
        Ok(dir) => dir,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    if !due(&dir, name)? {
        return Ok(false);
    }
    match rustix::fs::unlinkat(&dir, name, AtFlags::empty()) {
        Ok(()) => Ok(true),
        Err(Errno::NOENT) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The names of the links in `dir` (entries named `*.log`) that lead to nothing; none when `dir`
/// does not exist.
pub fn dangling(dir: &Path) -> io::Result<Vec<String>> {
    let fd = match open_dir(dir) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in rustix::fs::Dir::read_from(&fd)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        if checked(name).is_ok() && is_dangling(&fd, name)? {
            out.push(name.to_owned());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn the_containers_directory_is_the_pod_logs_dirs_sibling() {
        assert_eq!(
            dir_for(Path::new("/var/log/pods")),
            Path::new("/var/log/containers")
        );
        assert_eq!(dir_for(Path::new("/")), Path::new("/containers"));
    }

    #[test]
    fn a_link_is_named_after_the_pod_and_the_container() {
        let name = link_name("web", "default", "main", ID).unwrap();
        assert_eq!(name, format!("web_default_main-{ID}.log"));
        assert_eq!(id_of(&name), Some(ID));
        for (pod, ns, container, id) in [
            ("", "ns", "c", ID),
            ("../x", "ns", "c", ID),
            (".x", "ns", "c", ID),
            ("p", "a/b", "c", ID),
            ("p", "ns", "c\0", ID),
            ("p", "ns", "c", ""),
            ("p", "ns", "c", "../../etc"),
        ] {
            assert_eq!(
                link_name(pod, ns, container, id),
                None,
                "{pod} {ns} {container} {id}"
            );
        }
    }

    #[test]
    fn a_name_past_255_bytes_loses_the_end_of_its_pod_part_never_the_id() {
        let pod = "p".repeat(253);
        let name = link_name(&pod, "ns", "c", ID).unwrap();
        assert_eq!(name.len(), MAX_NAME_LEN);
        let tail = format!("-{ID}.log");
        assert!(name.ends_with(&tail), "{name}");
        assert_eq!(
            &name[..MAX_NAME_LEN - tail.len()],
            &pod[..MAX_NAME_LEN - tail.len()]
        );
        assert_eq!(id_of(&name), Some(ID));
        // Exactly 255 bytes: nothing is cut.
        let pod = "p".repeat(MAX_NAME_LEN - "_ns_c".len() - tail.len());
        assert_eq!(
            link_name(&pod, "ns", "c", ID).unwrap(),
            format!("{pod}_ns_c{tail}")
        );
        // A cut never splits a character.
        let pod = format!("x{}", "é".repeat(120));
        let name = link_name(&pod, "ns", "c", ID).unwrap();
        assert!(name.len() <= MAX_NAME_LEN && name.ends_with(&tail));
        // An ID that leaves no room for the rest makes no name.
        assert_eq!(link_name("p", "ns", "c", &"i".repeat(251)), None);
    }

    #[test]
    fn a_link_is_made_replaced_and_removed_inside_its_directory_only() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("containers");
        std::fs::create_dir(&dir).unwrap();
        let log = root.path().join("0.log");
        let name = link_name("web", "default", "main", ID).unwrap();
        // No log file yet: no link.
        assert!(!create(&dir, &name, &log).unwrap());
        assert!(!dir.join(&name).exists());
        std::fs::write(&log, "out\n").unwrap();
        assert!(create(&dir, &name, &log).unwrap());
        assert_eq!(std::fs::read_link(dir.join(&name)).unwrap(), log);
        assert_eq!(std::fs::read_to_string(dir.join(&name)).unwrap(), "out\n");
        // A link already there is replaced, and what it led to is left alone.
        let elsewhere = root.path().join("elsewhere");
        std::fs::write(&elsewhere, "keep").unwrap();
        std::fs::remove_file(dir.join(&name)).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.join(&name)).unwrap();
        assert!(create(&dir, &name, &log).unwrap());
        assert_eq!(std::fs::read_link(dir.join(&name)).unwrap(), log);
        assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "keep");
        // Names that would leave the directory are refused.
        for bad in ["../escape.log", ".hidden.log", "a/b.log", "no-suffix"] {
            assert!(create(&dir, bad, &log).is_err(), "{bad}");
            assert!(remove(&dir, bad).is_err(), "{bad}");
        }
        assert!(!root.path().join("escape.log").exists());
        // A file that is not a link is not removed; the link is, once.
        std::fs::write(dir.join("plain.log"), "x").unwrap();
        assert!(!remove(&dir, "plain.log").unwrap());
        assert!(remove(&dir, &name).unwrap());
        assert!(!remove(&dir, &name).unwrap());
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "out\n");
        // No directory: nothing to remove.
        assert!(!remove(&root.path().join("none"), &name).unwrap());
    }

    #[test]
    fn dangling_links_are_found_and_removed_and_no_other_entry() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("containers");
        std::fs::create_dir(&dir).unwrap();
        let (live, gone) = (root.path().join("live.log"), root.path().join("gone.log"));
        std::fs::write(&live, "x").unwrap();
        std::fs::write(&gone, "x").unwrap();
        let live_link = link_name("p", "ns", "live", ID).unwrap();
        let gone_link = link_name("p", "ns", "gone", ID).unwrap();
        assert!(create(&dir, &live_link, &live).unwrap());
        assert!(create(&dir, &gone_link, &gone).unwrap());
        std::fs::remove_file(&gone).unwrap();
        // Not links, or not named *.log: never listed.
        std::fs::write(dir.join("file.log"), "x").unwrap();
        std::os::unix::fs::symlink(&gone, dir.join("other")).unwrap();
        assert_eq!(dangling(&dir).unwrap(), std::slice::from_ref(&gone_link));
        assert!(!remove_if_dangling(&dir, &live_link).unwrap());
        assert!(remove_if_dangling(&dir, &gone_link).unwrap());
        assert!(dangling(&dir).unwrap().is_empty());
        assert!(dir.join(&live_link).exists() && dir.join("file.log").exists());
        assert!(dangling(&root.path().join("none")).unwrap().is_empty());
    }
}
