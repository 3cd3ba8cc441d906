//! How pod and container cgroups are named, for both cgroup drivers.
//!
//! The container manager names cgroups as paths (`/kubepods/burstable/pod<uid>`, the cgroupfs
//! spelling). With the systemd driver each path is a slice unit whose name joins the path's
//! components with `-` (each component's own `-` becomes `_`): the path above is the unit
//! `kubepods-burstable-pod<uid with _>.slice`, which systemd places at
//! `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice`. containerd
//! (runc) puts a container of such a pod in the scope `cri-containerd-<id>.scope` below it.
//!
//! Readers of cgroup paths (the eBPF exits, the startup trace, housekeeping) recognise both
//! spellings through [`pod_uid_of`] and [`container_id_of`].
use std::borrow::Cow;

/// A slice's unit name suffix.
pub const SLICE: &str = ".slice";
/// A scope's unit name suffix.
pub const SCOPE: &str = ".scope";
/// The prefix containerd gives a container's scope with the systemd driver.
pub const CONTAINERD_SCOPE_PREFIX: &str = "cri-containerd-";

/// A cgroup path that has no systemd spelling.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cgroup {0:?} has no systemd slice name (components may hold only letters, digits, '-', \
     ':' and '.', and no '_', which the slice name uses for '-')"
)]
pub struct NoSliceName(pub String);

/// The pod UID in one path component naming a pod cgroup: `pod<uid>` (cgroupfs) or
/// `<parent>-pod<uid>.slice` (systemd, `_` in the UID standing for `-`).
pub fn pod_uid_of(component: &str) -> Option<Cow<'_, str>> {
    if let Some(stem) = component.strip_suffix(SLICE) {
        let last = stem.rsplit('-').next()?;
        let uid = last.strip_prefix("pod").filter(|u| !u.is_empty())?;
        return Some(if uid.contains('_') {
            Cow::Owned(uid.replace('_', "-"))
        } else {
            Cow::Borrowed(uid)
        });
    }
    component
        .strip_prefix("pod")
        .filter(|u| !u.is_empty())
        .map(Cow::Borrowed)
}

/// The container ID in the component naming a container's cgroup below its pod's: the ID
/// itself (cgroupfs) or `<prefix>-<id>.scope` (systemd; IDs hold no `-`). A containerd scope
/// name cut short (the eBPF probes carry a path's first 255 bytes) gives the ID's beginning.
pub fn container_id_of(component: &str) -> &str {
    if let Some(rest) = component.strip_prefix(CONTAINERD_SCOPE_PREFIX) {
        return rest.strip_suffix(SCOPE).unwrap_or(rest);
    }
    match component.strip_suffix(SCOPE) {
        Some(stem) => stem.rsplit('-').next().unwrap_or(stem),
        None => component,
    }
}

/// The component naming a container's cgroup below its pod's with the given driver.
pub fn container_cgroup(id: &str, systemd: bool) -> Cow<'_, str> {
    if systemd {
        Cow::Owned(format!("{CONTAINERD_SCOPE_PREFIX}{id}{SCOPE}"))
    } else {
        Cow::Borrowed(id)
    }
}

/// The components of a cgroup path, each escaped for a unit name.
fn escaped(path: &str) -> Result<Vec<String>, NoSliceName> {
    let bad = || NoSliceName(path.to_owned());
    path.split('/')
        .filter(|c| !c.is_empty())
        .map(|c| {
            let ok = c != "."
                && c != ".."
                && c.chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '-' | ':' | '.'));
            if ok {
                Ok(c.replace('-', "_"))
            } else {
                Err(bad())
            }
        })
        .collect()
}

/// The slice unit of cgroup path `path`: `/` is `-.slice`, `/a/b-c` is `a-b_c.slice`.
pub fn slice_unit(path: &str) -> Result<String, NoSliceName> {
    let parts = escaped(path)?;
    if parts.is_empty() {
        return Ok(format!("-{SLICE}"));
    }
    Ok(format!("{}{SLICE}", parts.join("-")))
}

/// Where systemd puts the slice of cgroup path `path`, relative to the cgroup root: each
/// ancestor's slice in turn (`/a/b` is `a.slice/a-b.slice`; `/` is empty).
pub fn slice_dir(path: &str) -> Result<String, NoSliceName> {
    let parts = escaped(path)?;
    let mut out = String::new();
    for i in 0..parts.len() {
        if i > 0 {
            out.push('/');
        }
        out.push_str(&parts[..=i].join("-"));
        out.push_str(SLICE);
    }
    Ok(out)
}

/// The parent slice unit of cgroup path `path` (`-.slice` for a top-level one).
pub fn parent_slice_unit(path: &str) -> Result<String, NoSliceName> {
    let trimmed = path.trim_end_matches('/');
    let parent = trimmed.rsplit_once('/').map_or("", |(p, _)| p);
    slice_unit(parent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_become_slices_as_the_kubelet_names_them() {
        let uid = "0a1b-2c";
        let path = format!("/kubepods/burstable/pod{uid}");
        assert_eq!(
            slice_unit(&path).unwrap(),
            "kubepods-burstable-pod0a1b_2c.slice"
        );
        assert_eq!(
            slice_dir(&path).unwrap(),
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0a1b_2c.slice"
        );
        assert_eq!(
            parent_slice_unit(&path).unwrap(),
            "kubepods-burstable.slice"
        );
        assert_eq!(
            slice_dir("/swiftlet-test/kubepods").unwrap(),
            "swiftlet_test.slice/swiftlet_test-kubepods.slice"
        );
        assert_eq!(slice_unit("/").unwrap(), "-.slice");
        assert_eq!(slice_dir("/").unwrap(), "");
        assert_eq!(parent_slice_unit("/kubepods").unwrap(), "-.slice");
        for bad in ["/a/../b", "/a_b", "/a b", "/a/./b"] {
            assert_eq!(slice_unit(bad), Err(NoSliceName(bad.to_owned())), "{bad}");
        }
    }

    #[test]
    fn pod_and_container_names_read_back_in_both_spellings() {
        assert_eq!(pod_uid_of("pod0a1b-2c").as_deref(), Some("0a1b-2c"));
        assert_eq!(
            pod_uid_of("kubepods-burstable-pod0a1b_2c.slice").as_deref(),
            Some("0a1b-2c")
        );
        assert_eq!(pod_uid_of("pod0a1b_2c.slice").as_deref(), Some("0a1b-2c"));
        for not_a_pod in [
            "kubepods",
            "kubepods.slice",
            "kubepods-besteffort.slice",
            "pod",
            "kubepods-pod.slice",
            "cri-containerd-abc.scope",
        ] {
            assert_eq!(pod_uid_of(not_a_pod), None, "{not_a_pod}");
        }
        let id = "4f2a9c";
        let scope = container_cgroup(id, true);
        assert_eq!(scope, "cri-containerd-4f2a9c.scope");
        assert_eq!(container_id_of(&scope), id);
        assert_eq!(container_id_of(&container_cgroup(id, false)), id);
        assert_eq!(container_id_of("cri-containerd-4f2a"), "4f2a");
        assert_eq!(container_id_of("crio-4f2a9c.scope"), id);
    }
}
