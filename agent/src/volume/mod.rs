//! Volumes, as the kubelet's volume manager sets them up for a pod before its sandbox starts:
//! `emptyDir` (a directory on the node's disk, or a tmpfs with `medium: Memory`) below
//! `<root-dir>/pods/<uid>/volumes/kubernetes.io~empty-dir/<name>`, and `hostPath` (used in place,
//! after the kubelet's type checks). Each container's `volumeMounts` become CRI mounts
//! ([`container_mounts`]: `readOnly`, `subPath` kept inside its volume, `mountPropagation`).
//! Once the pod has stopped, [`tear_down`] unmounts its tmpfs volumes and removes its volume
//! directories without ever following a symlink or crossing a mount point out of them; a
//! hostPath's content is never touched. `configMap`, `secret`, `downwardAPI` and `projected`
//! volumes ([`projection`]) are written by the atomic writer ([`atomic`]) from the API objects
//! they name, below `<root-dir>/pods/<uid>/volumes/kubernetes.io~<plugin>/<name>` (a tmpfs for
//! all but configMap), and rewritten at each pod sync ([`refresh`]). Every other volume type is
//! refused ([`unsupported`]).
pub mod atomic;
pub mod claims;
mod manager;
mod mountinfo;
mod ownership;
pub mod projection;
mod remove;
mod setup;
#[cfg(test)]
mod tests;
pub mod token;

use k8s_cri::v1 as api;
use k8s_openapi::api::core::v1::{Container, PodSpec, Volume as ApiVolume, VolumeMount};
use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};

pub use manager::{Manager, ResolvedClaims};
pub use mountinfo::{MountPoint, mount_points};
pub use remove::{remove_pod_dir, tear_down};
pub use setup::{Context, is_written, refresh, set_up};

/// The directory below `<pod>` where subPaths are bound (the kubelet's name).
pub const SUBPATHS_DIR: &str = "volume-subpaths";

/// The kubelet's directory name of the emptyDir plugin below `<pod>/volumes`.
pub const EMPTY_DIR_PLUGIN: &str = "kubernetes.io~empty-dir";

/// The kubelet's directory name of the local volume plugin below `<pod>/volumes`: a `local`
/// PersistentVolume is bind-mounted at `<plugin dir>/<pv name>`.
pub const LOCAL_PLUGIN: &str = "kubernetes.io~local-volume";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A volume could not be set up (a hostPath type mismatch, a failed mkdir or mount): the
    /// kubelet's `MountVolume.SetUp failed` message.
    #[error("MountVolume.SetUp failed for volume {volume:?} : {message}")]
    SetUp { volume: String, message: String },
    /// The spec asks for what cannot be done (a mount of a volume that does not exist, a subPath
    /// leaving its volume, Bidirectional propagation without privileged ...).
    #[error("{0}")]
    Invalid(String),
    /// Tearing down left something in place (a mount point that is not ours, a busy tmpfs).
    #[error("tearing down {}: {message}", path.display())]
    TearDown { path: PathBuf, message: String },
}

impl Error {
    /// The waiting reason of the pod's containers while this error holds: `ContainerCreating`
    /// while volumes cannot be set up (the kubelet's pod waits for its volumes so), else
    /// `CreateContainerConfigError` (the kubelet's reason for a mount it cannot make).
    pub fn reason(&self) -> &'static str {
        match self {
            Error::SetUp { .. } => "ContainerCreating",
            _ => "CreateContainerConfigError",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// hostPath's `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPathType {
    /// `""`: no check.
    Unset,
    DirectoryOrCreate,
    Directory,
    FileOrCreate,
    File,
    Socket,
    CharDevice,
    BlockDevice,
}

impl HostPathType {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "" => Self::Unset,
            "DirectoryOrCreate" => Self::DirectoryOrCreate,
            "Directory" => Self::Directory,
            "FileOrCreate" => Self::FileOrCreate,
            "File" => Self::File,
            "Socket" => Self::Socket,
            "CharDevice" => Self::CharDevice,
            "BlockDevice" => Self::BlockDevice,
            _ => return None,
        })
    }
}

/// What backs one volume.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// `emptyDir`; `memory`: a tmpfs (`medium: Memory`), `size_limit` in bytes.
    EmptyDir {
        memory: bool,
        size_limit: Option<u64>,
    },
    /// `hostPath`: an absolute path on the node.
    HostPath { path: PathBuf, kind: HostPathType },
    /// `configMap`, `secret`, `downwardAPI`, `projected`: files the agent writes.
    Projection(projection::Projection),
    /// `persistentVolumeClaim` (or a generic `ephemeral` volume) not resolved yet: the claim's
    /// name (`None` for an ephemeral volume, whose claim is named after the pod and the volume,
    /// see [`claim_name`]) and the volume's `readOnly`. The volume manager resolves it through
    /// the API ([`claims`]) into a [`Source::Persistent`] before anything is set up.
    Claim {
        claim: Option<String>,
        read_only: bool,
    },
    /// The PersistentVolume a claim is bound to: its name, whether it is mounted read-only
    /// (the claim volume's `readOnly`, or a PV that allows only `ReadOnlyMany`), and what backs
    /// it.
    Persistent {
        pv: String,
        read_only: bool,
        backing: Backing,
    },
}

/// The claim a claim volume of pod `pod_name` uses: the one it names, or for an ephemeral volume
/// `<pod name>-<volume name>` (the name the API's ephemeral volume controller gives the claim
/// it makes for the pod).
pub fn claim_name(pod_name: &str, volume: &str, claim: Option<&str>) -> String {
    claim.map_or_else(|| format!("{pod_name}-{volume}"), str::to_owned)
}

/// What backs a PersistentVolume swiftlet can use.
#[derive(Debug, Clone, PartialEq)]
pub enum Backing {
    /// `local`: a directory of the node, bind-mounted at
    /// `<pod>/volumes/kubernetes.io~local-volume/<pv>` as the kubelet mounts it.
    Local(PathBuf),
    /// `hostPath`: used in place, after the type checks of a hostPath volume.
    HostPath { path: PathBuf, kind: HostPathType },
}

/// One of `spec.volumes`, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Volume {
    pub name: String,
    pub source: Source,
}

/// `<pods_dir>/<uid>/volumes`.
pub fn volumes_dir(pods_dir: &Path, uid: &str) -> PathBuf {
    pods_dir.join(uid).join("volumes")
}

impl Volume {
    /// The kubelet's name of the volume plugin that sets it up (`kubernetes.io/empty-dir` ...),
    /// as `storage_operation_duration_seconds` labels it.
    pub fn plugin(&self) -> &'static str {
        match &self.source {
            Source::EmptyDir { .. } => "kubernetes.io/empty-dir",
            Source::HostPath { .. }
            | Source::Persistent {
                backing: Backing::HostPath { .. },
                ..
            } => "kubernetes.io/host-path",
            Source::Persistent {
                backing: Backing::Local(_),
                ..
            } => "kubernetes.io/local-volume",
            Source::Projection(p) => p.kind.plugin(),
            Source::Claim { .. } => "",
        }
    }

    /// Where the volume is on the node: its directory below the pod's volumes, or the hostPath.
    /// A claim not resolved yet has no place: its would-be directory below the local plugin's
    /// is named after the pod's volume, where nothing is ever made.
    pub fn host_path(&self, pods_dir: &Path, uid: &str) -> PathBuf {
        match &self.source {
            Source::EmptyDir { .. } => volumes_dir(pods_dir, uid)
                .join(EMPTY_DIR_PLUGIN)
                .join(&self.name),
            Source::HostPath { path, .. }
            | Source::Persistent {
                backing: Backing::HostPath { path, .. },
                ..
            } => path.clone(),
            Source::Persistent {
                pv,
                backing: Backing::Local(_),
                ..
            } => volumes_dir(pods_dir, uid).join(LOCAL_PLUGIN).join(pv),
            Source::Claim { .. } => volumes_dir(pods_dir, uid)
                .join(LOCAL_PLUGIN)
                .join(format!("{}.unresolved", self.name)),
            Source::Projection(p) => volumes_dir(pods_dir, uid)
                .join(p.kind.plugin_dir())
                .join(&self.name),
        }
    }
}

/// What of the pod's volumes swiftlet cannot honour yet, naming the volume and what it asks
/// for; `None` when every volume is an emptyDir (on disk without `sizeLimit`, or in memory) or a
/// hostPath, a configMap, secret, downwardAPI or projected volume (but for projected
/// clusterTrustBundle sources).
pub fn unsupported(spec: &PodSpec) -> Option<String> {
    spec.volumes
        .iter()
        .flatten()
        .find_map(|v| unsupported_source(v).map(|what| format!("volume {:?}: {what}", v.name)))
}

/// What of container `c`'s `volumeMounts` swiftlet cannot honour yet (`subPathExpr`,
/// `recursiveReadOnly`), naming the mount.
pub fn unsupported_mount(c: &Container) -> Option<String> {
    c.volume_mounts.iter().flatten().find_map(|m| {
        let what = if m.sub_path_expr.as_deref().is_some_and(|e| !e.is_empty()) {
            "subPathExpr"
        } else if m
            .recursive_read_only
            .as_deref()
            .is_some_and(|r| r != "Disabled")
        {
            "recursiveReadOnly"
        } else {
            return None;
        };
        Some(format!("volumeMounts {:?}: {what}", m.name))
    })
}

/// The volume types of the v1 `Volume`, by their field name, but for those swiftlet has
/// (emptyDir, hostPath, configMap, secret, downwardAPI, projected, persistentVolumeClaim,
/// ephemeral).
fn other_type(v: &ApiVolume) -> Option<&'static str> {
    let set = [
        ("awsElasticBlockStore", v.aws_elastic_block_store.is_some()),
        ("azureDisk", v.azure_disk.is_some()),
        ("azureFile", v.azure_file.is_some()),
        ("cephfs", v.cephfs.is_some()),
        ("cinder", v.cinder.is_some()),
        ("csi", v.csi.is_some()),
        ("fc", v.fc.is_some()),
        ("flexVolume", v.flex_volume.is_some()),
        ("flocker", v.flocker.is_some()),
        ("gcePersistentDisk", v.gce_persistent_disk.is_some()),
        ("gitRepo", v.git_repo.is_some()),
        ("glusterfs", v.glusterfs.is_some()),
        ("image", v.image.is_some()),
        ("iscsi", v.iscsi.is_some()),
        ("nfs", v.nfs.is_some()),
        ("photonPersistentDisk", v.photon_persistent_disk.is_some()),
        ("portworxVolume", v.portworx_volume.is_some()),
        ("quobyte", v.quobyte.is_some()),
        ("rbd", v.rbd.is_some()),
        ("scaleIO", v.scale_io.is_some()),
        ("storageos", v.storageos.is_some()),
        ("vsphereVolume", v.vsphere_volume.is_some()),
    ];
    set.into_iter().find(|(_, s)| *s).map(|(name, _)| name)
}

fn unsupported_source(v: &ApiVolume) -> Option<String> {
    if let Some(t) = other_type(v) {
        return Some(format!("type {t}"));
    }
    let trust_bundle = v
        .projected
        .iter()
        .flat_map(|p| p.sources.iter().flatten())
        .any(|s| s.cluster_trust_bundle.is_some());
    if trust_bundle {
        return Some("projected source clusterTrustBundle".to_owned());
    }
    let e = v.empty_dir.as_ref()?;
    match e.medium.as_deref().unwrap_or("") {
        "" | "Memory" => None,
        other => Some(format!("emptyDir medium {other:?}")),
    }
}

/// The pod's emptyDir volumes on disk that set `sizeLimit`: (name, limit in bytes, directory).
/// The eviction manager enforces the limits (a limit that does not parse is left out: the
/// volume's set-up refuses it).
pub fn disk_size_limits(pods_dir: &Path, uid: &str, spec: &PodSpec) -> Vec<(String, u64, PathBuf)> {
    spec.volumes
        .iter()
        .flatten()
        .filter_map(|v| {
            let e = v.empty_dir.as_ref()?;
            if !e.medium.as_deref().unwrap_or("").is_empty() {
                return None;
            }
            let q = crate::pod::quantity::Quantity::parse(&e.size_limit.as_ref()?.0).ok()?;
            let limit = u64::try_from(q.value()).ok()?;
            let dir = volumes_dir(pods_dir, uid)
                .join(EMPTY_DIR_PLUGIN)
                .join(&v.name);
            Some((v.name.clone(), limit, dir))
        })
        .collect()
}

/// A DNS-1123 label: what the API allows as a volume name (so a name is one path component).
fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-';
    let end = |c: Option<&u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    !b.is_empty() && b.len() <= 63 && b.iter().all(inner) && end(b.first()) && end(b.last())
}

/// A DNS-1123 subdomain: what the API allows as the name of a claim or a PersistentVolume (so
/// a name is one path component, never `.` or `..`).
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Whether `path` has a `..` component (the API's "must not contain '..'").
fn has_backsteps(path: &str) -> bool {
    Path::new(path)
        .components()
        .any(|c| c == Component::ParentDir)
}

/// The pod's volumes, checked as the API server and the kubelet check them. Unsupported types
/// should have been refused first ([`unsupported`]): they are an error here too.
pub fn plan(spec: &PodSpec) -> Result<Vec<Volume>> {
    let mut names = HashSet::new();
    let mut out = Vec::new();
    for v in spec.volumes.iter().flatten() {
        let bad = |why: String| Error::Invalid(format!("spec.volumes {:?}: {why}", v.name));
        if !is_dns_label(&v.name) {
            return Err(bad(
                "the name must be a DNS label (lower-case letters, digits and '-', at most 63)"
                    .into(),
            ));
        }
        if !names.insert(v.name.as_str()) {
            return Err(bad("the name is used twice".into()));
        }
        let types = [
            v.empty_dir.is_some(),
            v.host_path.is_some(),
            v.config_map.is_some(),
            v.secret.is_some(),
            v.downward_api.is_some(),
            v.projected.is_some(),
            v.persistent_volume_claim.is_some(),
            v.ephemeral.is_some(),
            other_type(v).is_some(),
        ];
        if types.iter().filter(|t| **t).count() > 1 {
            return Err(bad("more than one volume type is set".into()));
        }
        if let Some(p) = projection::plan(v).map_err(|e| bad(e.to_string()))? {
            out.push(Volume {
                name: v.name.clone(),
                source: Source::Projection(p),
            });
            continue;
        }
        let source = match (&v.empty_dir, &v.host_path) {
            (Some(e), None) => {
                let size_limit = match &e.size_limit {
                    None => None,
                    Some(q) => Some(
                        crate::pod::quantity::Quantity::parse(&q.0)
                            .ok()
                            .filter(|q| q.value() >= 0)
                            .map(|q| u64::try_from(q.value()).unwrap_or(u64::MAX))
                            .ok_or_else(|| {
                                bad(format!("emptyDir.sizeLimit {:?} is not a quantity", q.0))
                            })?,
                    ),
                };
                Source::EmptyDir {
                    memory: e.medium.as_deref() == Some("Memory"),
                    size_limit,
                }
            }
            (None, Some(h)) => {
                let kind = HostPathType::parse(h.type_.as_deref().unwrap_or(""))
                    .ok_or_else(|| bad(format!("hostPath.type {:?} is not a type", h.type_)))?;
                if has_backsteps(&h.path) {
                    return Err(bad(format!(
                        "invalid HostPath `{}`: must not contain '..'",
                        h.path
                    )));
                }
                if !h.path.starts_with('/') {
                    return Err(bad(format!(
                        "hostPath.path {:?} is not an absolute path",
                        h.path
                    )));
                }
                Source::HostPath {
                    path: PathBuf::from(&h.path),
                    kind,
                }
            }
            (None, None) => match (&v.persistent_volume_claim, &v.ephemeral, other_type(v)) {
                (Some(c), None, None) => {
                    if !is_dns_subdomain(&c.claim_name) {
                        return Err(bad(format!(
                            "persistentVolumeClaim.claimName {:?} is not an object name",
                            c.claim_name
                        )));
                    }
                    Source::Claim {
                        claim: Some(c.claim_name.clone()),
                        read_only: c.read_only.unwrap_or(false),
                    }
                }
                (None, Some(_), None) => Source::Claim {
                    claim: None,
                    read_only: false,
                },
                (_, _, Some(t)) => return Err(bad(format!("{t} volumes are not supported yet"))),
                (None, None, None) => return Err(bad("no volume type is set".into())),
                (Some(_), Some(_), None) => {
                    return Err(bad("more than one volume type is set".into()));
                }
            },
            (Some(_), Some(_)) => return Err(bad("more than one volume type is set".into())),
        };
        out.push(Volume {
            name: v.name.clone(),
            source,
        });
    }
    Ok(out)
}

/// The size of a Memory emptyDir's tmpfs, as the kubelet sizes it: the node's memory, lowered to
/// the pod's memory limit when it has one, lowered to `sizeLimit` when that is smaller (zero
/// counts as unset).
pub fn memory_size(
    node_memory: u64,
    pod_memory_limit: Option<u64>,
    size_limit: Option<u64>,
) -> u64 {
    let lower = |size: u64, to: Option<u64>| match to {
        Some(l) if l > 0 && l <= size => l,
        _ => size,
    };
    lower(lower(node_memory, pod_memory_limit), size_limit)
}

/// What a container's `volumeMounts` ask for, checked against the volumes: each mount names a
/// volume of the pod, mount paths are not used twice, a subPath is relative without `..`, and
/// Bidirectional propagation is for privileged containers only (as the API requires).
pub fn check_mounts(volumes: &[Volume], c: &Container) -> Result<()> {
    let mut paths = HashSet::new();
    for m in c.volume_mounts.iter().flatten() {
        let bad = |why: String| {
            Error::Invalid(format!(
                "container {}: volumeMount {:?} at {:?}: {why}",
                c.name, m.name, m.mount_path
            ))
        };
        if !volumes.iter().any(|v| v.name == m.name) {
            return Err(Error::Invalid(format!(
                "cannot find volume {:?} to mount into container {:?}",
                m.name, c.name
            )));
        }
        if m.mount_path.is_empty() {
            return Err(bad("mountPath is empty".into()));
        }
        if !paths.insert(m.mount_path.trim_end_matches('/')) {
            return Err(bad("mountPath is used twice".into()));
        }
        if let Some(sub) = m.sub_path.as_deref() {
            if sub.starts_with('/') {
                return Err(bad(format!("subPath {sub:?} must be a relative path")));
            }
            if has_backsteps(sub) {
                return Err(bad(format!("subPath {sub:?} must not contain '..'")));
            }
        }
        propagation(m, privileged(c)).map_err(bad)?;
    }
    Ok(())
}

fn privileged(c: &Container) -> bool {
    c.security_context
        .as_ref()
        .and_then(|s| s.privileged)
        .unwrap_or(false)
}

/// A mount's `mountPropagation` as CRI propagation.
fn propagation(
    m: &VolumeMount,
    privileged: bool,
) -> std::result::Result<api::MountPropagation, String> {
    match m.mount_propagation.as_deref().unwrap_or("None") {
        "None" => Ok(api::MountPropagation::PropagationPrivate),
        "HostToContainer" => Ok(api::MountPropagation::PropagationHostToContainer),
        "Bidirectional" if privileged => Ok(api::MountPropagation::PropagationBidirectional),
        "Bidirectional" => {
            Err("Bidirectional mount propagation is available only to privileged containers".into())
        }
        other => Err(format!("invalid mountPropagation {other:?}")),
    }
}

/// The CRI mounts of container `c`'s `volumeMounts`, in their order: each volume's host path
/// (see [`Volume::host_path`]), or for a subPath the path inside it (created as a directory with
/// the volume's mode when missing; symlinks followed only while they stay inside the volume),
/// bound by file descriptor below `<pod>/volume-subpaths` as the kubelet binds it, so that no
/// symlink swapped in after the check can redirect the runtime's mount. The volumes must have
/// been set up ([`set_up`]). Blocking (mounts).
pub fn container_mounts(
    pods_dir: &Path,
    uid: &str,
    volumes: &[Volume],
    c: &Container,
) -> Result<Vec<api::Mount>> {
    check_mounts(volumes, c)?;
    let mut out = Vec::new();
    for (index, m) in c.volume_mounts.iter().flatten().enumerate() {
        let Some(v) = volumes.iter().find(|v| v.name == m.name) else {
            continue; // checked above
        };
        if let Source::Claim { .. } = &v.source {
            return Err(Error::Invalid(format!(
                "volume {:?}: its claim is not resolved to a PersistentVolume yet",
                v.name
            )));
        }
        let base = v.host_path(pods_dir, uid);
        let host = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            None => base,
            Some(sub) => {
                let target = setup::sub_path_target(pods_dir, uid, &v.name, &c.name, index);
                setup::sub_path(&base, sub)
                    .and_then(|resolved| setup::bind_sub_path(&base, &resolved, &target))
                    .map_err(|why| {
                        Error::Invalid(format!(
                            "container {}: volumeMount {:?}: subPath {sub:?}: {why}",
                            c.name, m.name
                        ))
                    })?;
                target
            }
        };
        let propagation = propagation(m, privileged(c)).map_err(Error::Invalid)?;
        out.push(api::Mount {
            container_path: m.mount_path.clone(),
            host_path: host.to_string_lossy().into_owned(),
            // The kubelet mounts the volumes its atomic writer makes read-only, whatever the
            // mount says, and a claim's volume read-only when the claim says so.
            readonly: m.read_only.unwrap_or(false)
                || matches!(
                    v.source,
                    Source::Projection(_)
                        | Source::Persistent {
                            read_only: true,
                            ..
                        }
                ),
            propagation: propagation as i32,
            // The kubelet asks the runtime to relabel the volumes that support it (emptyDir,
            // local PersistentVolumes and the volumes it writes), never a hostPath.
            selinux_relabel: !matches!(
                v.source,
                Source::HostPath { .. }
                    | Source::Persistent {
                        backing: Backing::HostPath { .. },
                        ..
                    }
            ),
            ..Default::default()
        });
    }
    Ok(out)
}
