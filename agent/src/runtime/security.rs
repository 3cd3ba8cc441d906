//! Security contexts: a pod's and a container's `securityContext` turned into what CRI is given,
//! as the kubelet turns them, and the checks a pod or a container must pass first.
//!
//! - The container's settings override the pod's for the user, group, non-root rule, SELinux
//!   options, seccomp and AppArmor profiles; capabilities, privileged, read-only root file system,
//!   privilege escalation and the proc mount are the container's own.
//! - Supplemental groups: the pod's `fsGroup` first, then its `supplementalGroups`.
//! - Seccomp: the container's profile, else the pod's, else `RuntimeDefault` with
//!   `--seccomp-default`, else `Unconfined` (the kubelet's default). Localhost profiles are files
//!   under `<root-dir>/seccomp`; a name that leaves that directory is refused. The sandbox always
//!   runs `RuntimeDefault`.
//! - `runAsNonRoot` is checked against the effective user, or the image's user when none is set,
//!   with the kubelet's messages (a container error, `CreateContainerConfigError`).
//! - Sysctls: the kubelet's safe set, plus `--allowed-unsafe-sysctls` patterns; a network sysctl
//!   with `hostNetwork` or an IPC one with `hostIPC` is refused (reason `SysctlForbidden`).
//! - What cannot be honoured here is refused, never dropped: AppArmor profiles other than
//!   `Unconfined` on a kernel without AppArmor, `procMount: Unmasked` (the runtime cannot be told
//!   to mask nothing), `supplementalGroupsPolicy: Strict` (the runtime cannot apply it), and user
//!   namespaces (`hostUsers: false`).
//!
//! Windows options are not looked at: they mean nothing on a Linux node (the kubelet ignores
//! them there too). `fsGroupChangePolicy` and `seLinuxChangePolicy` concern volumes.

use std::path::{Component, Path, PathBuf};

use k8s_cri::v1 as api;
use k8s_openapi::api::core::v1::{
    AppArmorProfile, Container, Pod, PodSecurityContext, SELinuxOptions, SeccompProfile,
    SecurityContext,
};

/// Paths of `/proc` and `/sys` hidden from a container (the default proc mount).
pub const DEFAULT_MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// Paths of `/proc` a container may read but not write (the default proc mount).
pub const DEFAULT_READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// Sysctls a pod may set without `--allowed-unsafe-sysctls`: namespaced, and without effect on
/// other pods (the kubelet's safe set on kernels from 4.15 on).
pub const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

/// The node's side of security: what the kubelet's flags and the kernel allow.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// Where Localhost seccomp profiles live (`<root-dir>/seccomp`).
    pub seccomp_root: PathBuf,
    /// `--seccomp-default`: containers without a profile run `RuntimeDefault`, not `Unconfined`.
    pub seccomp_default: bool,
    /// `--allowed-unsafe-sysctls`: names, or prefixes ending in `*`.
    pub allowed_unsafe_sysctls: Vec<String>,
    /// The kernel enforces AppArmor.
    pub apparmor: bool,
}

impl Settings {
    /// Whether AppArmor is enabled in this kernel (`/sys/module/apparmor/parameters/enabled`).
    pub fn apparmor_enabled() -> bool {
        std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
            .is_ok_and(|v| v.trim() == "Y")
    }
}

/// Why a pod or a container may not run as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Cannot be honoured on this node or runtime (yet).
    #[error("{0} is not supported yet")]
    Unsupported(String),
    /// A sysctl the node does not allow.
    #[error("forbidden sysctl: {0}")]
    Sysctl(String),
    /// AppArmor asked for on a kernel without it.
    #[error("Cannot enforce AppArmor: AppArmor is not enabled on the host")]
    AppArmor,
    /// A seccomp profile name that is not a relative path inside the profile directory.
    #[error("seccomp localhostProfile {0:?} must be a relative path inside the profile directory")]
    SeccompPath(String),
    /// The non-root rule is broken (the kubelet's messages).
    #[error("{0}")]
    NonRoot(String),
}

impl Refusal {
    /// The waiting reason the status shows.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Sysctl(_) => "SysctlForbidden",
            Refusal::AppArmor => "AppArmor",
            _ => "CreateContainerConfigError",
        }
    }
}

pub use crate::images::ImageUser;

fn pod_sc(pod: &Pod) -> Option<&PodSecurityContext> {
    pod.spec.as_ref()?.security_context.as_ref()
}

/// The checks of the whole pod, before its sandbox is created.
pub fn check_pod(pod: &Pod, settings: &Settings) -> Result<(), Refusal> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(());
    };
    if spec.host_users == Some(false) {
        return Err(Refusal::Unsupported(
            "user namespaces (hostUsers: false)".into(),
        ));
    }
    let psc = spec.security_context.as_ref();
    if psc
        .and_then(|s| s.supplemental_groups_policy.as_deref())
        .is_some_and(|p| p != "Merge")
    {
        return Err(Refusal::Unsupported(
            "supplementalGroupsPolicy other than Merge (the runtime cannot apply it)".into(),
        ));
    }
    for sysctl in psc.and_then(|s| s.sysctls.as_ref()).into_iter().flatten() {
        check_sysctl(
            &dotted(&sysctl.name),
            spec.host_network.unwrap_or(false),
            spec.host_ipc.unwrap_or(false),
            settings,
        )?;
    }
    let pod_profile = psc.and_then(|s| s.seccomp_profile.as_ref());
    seccomp(pod_profile, settings)?;
    let pod_apparmor = psc.and_then(|s| s.app_armor_profile.as_ref());
    apparmor(pod_apparmor.map(|p| p.type_.as_str()), settings)?;
    let all = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers);
    for c in all {
        let csc = c.security_context.as_ref();
        let profile = apparmor_of(pod, c);
        apparmor(profile.as_ref().map(|p| p.type_.as_str()), settings)?;
        if csc.and_then(|s| s.proc_mount.as_deref()) == Some("Unmasked") {
            return Err(Refusal::Unsupported(format!(
                "container {}: procMount Unmasked",
                c.name
            )));
        }
        seccomp(csc.and_then(|s| s.seccomp_profile.as_ref()), settings)?;
    }
    Ok(())
}

/// Sysctl names may be written with `/` as the separator (`net/ipv4/tcp_syncookies`); the
/// runtime wants dots. When the first separator is a `/`, slashes and dots swap (a dot inside a
/// component, as in an interface name, becomes a `/`).
fn dotted(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes()[i] == b'/' => name
            .chars()
            .map(|c| match c {
                '/' => '.',
                '.' => '/',
                c => c,
            })
            .collect(),
        _ => name.to_owned(),
    }
}

fn check_sysctl(
    name: &str,
    host_network: bool,
    host_ipc: bool,
    settings: &Settings,
) -> Result<(), Refusal> {
    let allowed = SAFE_SYSCTLS.contains(&name)
        || settings
            .allowed_unsafe_sysctls
            .iter()
            .any(|p| match p.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => p == name,
            });
    if !allowed {
        return Err(Refusal::Sysctl(format!(
            "{name:?} is not in the safe set and not allowed by --allowed-unsafe-sysctls"
        )));
    }
    let ipc = ["kernel.shm", "kernel.msg", "kernel.sem", "fs.mqueue."]
        .iter()
        .any(|p| name.starts_with(p));
    if host_network && name.starts_with("net.") {
        return Err(Refusal::Sysctl(format!(
            "{name:?} not allowed with host net enabled"
        )));
    }
    if host_ipc && ipc {
        return Err(Refusal::Sysctl(format!(
            "{name:?} not allowed with host ipc enabled"
        )));
    }
    Ok(())
}

/// The annotation that named a container's AppArmor profile before the field existed:
/// `container.apparmor.security.beta.kubernetes.io/<container>`.
pub const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// The AppArmor profile container `c` of `pod` runs with, as the kubelet picks it: the
/// container's field, else its annotation (static pods never had the annotation turned into the
/// field by the API server), else the pod's field. An annotation value other than
/// `runtime/default`, `unconfined` or `localhost/<profile>` is ignored, as the kubelet does.
fn apparmor_of(pod: &Pod, c: &Container) -> Option<AppArmorProfile> {
    let container = c.security_context.as_ref();
    if let Some(p) = container.and_then(|s| s.app_armor_profile.as_ref()) {
        return Some(p.clone());
    }
    let profile = |type_: &str, localhost: Option<&str>| AppArmorProfile {
        type_: type_.to_owned(),
        localhost_profile: localhost.map(str::to_owned),
    };
    let key = format!("{APPARMOR_ANNOTATION_PREFIX}{}", c.name);
    let annotated = pod.metadata.annotations.as_ref().and_then(|a| a.get(&key));
    let from_annotation = annotated.and_then(|v| match v.as_str() {
        "runtime/default" => Some(profile("RuntimeDefault", None)),
        "unconfined" => Some(profile("Unconfined", None)),
        v => v
            .strip_prefix("localhost/")
            .map(|name| profile("Localhost", Some(name))),
    });
    from_annotation.or_else(|| pod_sc(pod)?.app_armor_profile.clone())
}

fn apparmor(type_: Option<&str>, settings: &Settings) -> Result<(), Refusal> {
    match type_ {
        None | Some("Unconfined") => Ok(()),
        Some(_) if !settings.apparmor => Err(Refusal::AppArmor),
        Some("RuntimeDefault" | "Localhost") => Ok(()),
        Some(other) => Err(Refusal::Unsupported(format!(
            "appArmorProfile type {other:?}"
        ))),
    }
}

/// The CRI seccomp profile for `profile` (the effective one), or the node's default.
fn seccomp(
    profile: Option<&SeccompProfile>,
    settings: &Settings,
) -> Result<Option<api::SecurityProfile>, Refusal> {
    use api::security_profile::ProfileType;
    let Some(profile) = profile else {
        let t = if settings.seccomp_default {
            ProfileType::RuntimeDefault
        } else {
            ProfileType::Unconfined
        };
        return Ok(Some(api::SecurityProfile {
            profile_type: t as i32,
            localhost_ref: String::new(),
        }));
    };
    let (t, localhost_ref) = match profile.type_.as_str() {
        "RuntimeDefault" => (ProfileType::RuntimeDefault, String::new()),
        "Unconfined" => (ProfileType::Unconfined, String::new()),
        "Localhost" => {
            let name = profile.localhost_profile.as_deref().unwrap_or_default();
            (
                ProfileType::Localhost,
                inside(&settings.seccomp_root, name)
                    .ok_or_else(|| Refusal::SeccompPath(name.to_owned()))?
                    .to_string_lossy()
                    .into_owned(),
            )
        }
        other => {
            return Err(Refusal::Unsupported(format!(
                "seccompProfile type {other:?}"
            )));
        }
    };
    Ok(Some(api::SecurityProfile {
        profile_type: t as i32,
        localhost_ref,
    }))
}

/// `root/name` when `name` is a non-empty relative path that stays inside `root`.
fn inside(root: &Path, name: &str) -> Option<PathBuf> {
    let path = Path::new(name);
    let plain = path.components().all(|c| matches!(c, Component::Normal(_)));
    (!name.is_empty() && plain).then(|| root.join(path))
}

/// The CRI AppArmor profile, and the same in the older string form (`runtime/default`,
/// `unconfined`, `localhost/<profile>`) that runtimes before CRI's profile field read, as the
/// kubelet sends both.
fn apparmor_profile(profile: Option<&AppArmorProfile>) -> (Option<api::SecurityProfile>, String) {
    use api::security_profile::ProfileType;
    let Some(profile) = profile else {
        return (None, String::new());
    };
    let name = profile.localhost_profile.clone().unwrap_or_default();
    let (t, old) = match profile.type_.as_str() {
        "RuntimeDefault" => (ProfileType::RuntimeDefault, "runtime/default".to_owned()),
        "Localhost" => (ProfileType::Localhost, format!("localhost/{name}")),
        _ => (ProfileType::Unconfined, "unconfined".to_owned()),
    };
    let localhost_ref = if t == ProfileType::Localhost {
        name
    } else {
        String::new()
    };
    (
        Some(api::SecurityProfile {
            profile_type: t as i32,
            localhost_ref,
        }),
        old,
    )
}

fn selinux(o: Option<&SELinuxOptions>) -> Option<api::SeLinuxOption> {
    o.map(|o| api::SeLinuxOption {
        user: o.user.clone().unwrap_or_default(),
        role: o.role.clone().unwrap_or_default(),
        r#type: o.type_.clone().unwrap_or_default(),
        level: o.level.clone().unwrap_or_default(),
    })
}

/// The pod's groups: `fsGroup` first, then `supplementalGroups`.
fn supplemental_groups(psc: Option<&PodSecurityContext>) -> Vec<i64> {
    let Some(psc) = psc else {
        return Vec::new();
    };
    psc.fs_group
        .into_iter()
        .chain(psc.supplemental_groups.iter().flatten().copied())
        .collect()
}

/// The sandbox's security context and sysctls (checked by [`check_pod`] before).
pub fn sandbox(
    pod: &Pod,
    namespace_options: api::NamespaceOption,
) -> (
    api::LinuxSandboxSecurityContext,
    std::collections::HashMap<String, String>,
) {
    use api::security_profile::ProfileType;
    let psc = pod_sc(pod);
    let all = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers));
    let privileged = all
        .clone()
        .any(|c| c.security_context.as_ref().and_then(|s| s.privileged) == Some(true));
    let sysctls = psc
        .and_then(|s| s.sysctls.as_ref())
        .into_iter()
        .flatten()
        .map(|s| (dotted(&s.name), s.value.clone()))
        .collect();
    let sc = api::LinuxSandboxSecurityContext {
        namespace_options: Some(namespace_options),
        selinux_options: selinux(psc.and_then(|s| s.se_linux_options.as_ref())),
        run_as_user: psc
            .and_then(|s| s.run_as_user)
            .map(|value| api::Int64Value { value }),
        run_as_group: psc
            .and_then(|s| s.run_as_group)
            .map(|value| api::Int64Value { value }),
        supplemental_groups: supplemental_groups(psc),
        privileged,
        // The pause container needs nothing the runtime's default profile forbids.
        seccomp: Some(api::SecurityProfile {
            profile_type: ProfileType::RuntimeDefault as i32,
            localhost_ref: String::new(),
        }),
        ..Default::default()
    };
    (sc, sysctls)
}

/// The container's security context: the pod's settings with the container's on top, checked
/// against the non-root rule. `image` is the image's user, used when neither says who to run as.
pub fn container(
    pod: &Pod,
    c: &Container,
    image: &ImageUser,
    namespace_options: api::NamespaceOption,
    settings: &Settings,
) -> Result<api::LinuxContainerSecurityContext, Refusal> {
    let psc = pod_sc(pod);
    let csc: Option<&SecurityContext> = c.security_context.as_ref();
    let run_as_user = csc
        .and_then(|s| s.run_as_user)
        .or(psc.and_then(|s| s.run_as_user));
    let run_as_group = csc
        .and_then(|s| s.run_as_group)
        .or(psc.and_then(|s| s.run_as_group));
    let non_root = csc
        .and_then(|s| s.run_as_non_root)
        .or(psc.and_then(|s| s.run_as_non_root))
        .unwrap_or(false);
    if non_root {
        verify_non_root(pod, c, run_as_user, image)?;
    }
    let privileged = csc.and_then(|s| s.privileged).unwrap_or(false);
    let profile = csc
        .and_then(|s| s.seccomp_profile.as_ref())
        .or(psc.and_then(|s| s.seccomp_profile.as_ref()));
    let (apparmor, apparmor_profile) = apparmor_profile(apparmor_of(pod, c).as_ref());
    let se_linux = csc
        .and_then(|s| s.se_linux_options.as_ref())
        .or(psc.and_then(|s| s.se_linux_options.as_ref()));
    let capabilities = csc
        .and_then(|s| s.capabilities.as_ref())
        .map(|caps| api::Capability {
            add_capabilities: caps.add.clone().unwrap_or_default(),
            drop_capabilities: caps.drop.clone().unwrap_or_default(),
            add_ambient_capabilities: Vec::new(),
        });
    // The string form of the AppArmor profile is deprecated in CRI but is the one containerd
    // 1.6 reads; both are sent, as the kubelet sends them.
    #[allow(deprecated)]
    let mut sc = api::LinuxContainerSecurityContext {
        capabilities,
        privileged,
        namespace_options: Some(namespace_options),
        selinux_options: selinux(se_linux),
        run_as_user: run_as_user.map(|value| api::Int64Value { value }),
        run_as_group: run_as_group.map(|value| api::Int64Value { value }),
        readonly_rootfs: csc
            .and_then(|s| s.read_only_root_filesystem)
            .unwrap_or(false),
        supplemental_groups: supplemental_groups(psc),
        no_new_privs: csc
            .and_then(|s| s.allow_privilege_escalation)
            .is_some_and(|allow| !allow),
        masked_paths: DEFAULT_MASKED_PATHS.iter().map(|&p| p.to_owned()).collect(),
        readonly_paths: DEFAULT_READONLY_PATHS
            .iter()
            .map(|&p| p.to_owned())
            .collect(),
        seccomp: seccomp(profile, settings)?,
        apparmor,
        apparmor_profile,
        ..Default::default()
    };
    // A group alone is refused by the runtime: name the image's user with it, as the kubelet
    // does whenever the pod names no user.
    if sc.run_as_user.is_none() && sc.run_as_group.is_some() {
        match (&image.uid, image.username.as_str()) {
            (Some(uid), _) => sc.run_as_user = Some(api::Int64Value { value: *uid }),
            (None, "") => sc.run_as_user = Some(api::Int64Value { value: 0 }),
            (None, name) => sc.run_as_username = name.to_owned(),
        }
    }
    Ok(sc)
}

/// The kubelet's non-root check: the effective user, else the image's, must not be root, and
/// a non-numeric image user cannot be verified.
fn verify_non_root(
    pod: &Pod,
    c: &Container,
    run_as_user: Option<i64>,
    image: &ImageUser,
) -> Result<(), Refusal> {
    let who = format!(
        "pod: \"{}_{}({})\", container: {}",
        pod.metadata.name.as_deref().unwrap_or_default(),
        crate::pod::namespace(pod),
        pod.metadata.uid.as_deref().unwrap_or_default(),
        c.name
    );
    if let Some(uid) = run_as_user {
        return if uid == 0 {
            Err(Refusal::NonRoot(format!(
                "container's runAsUser breaks non-root policy ({who})"
            )))
        } else {
            Ok(())
        };
    }
    match (image.uid, image.username.as_str()) {
        (Some(0), _) | (None, "") => Err(Refusal::NonRoot(format!(
            "container has runAsNonRoot and image will run as root ({who})"
        ))),
        (None, name) => Err(Refusal::NonRoot(format!(
            "container has runAsNonRoot and image has non-numeric user ({name}), cannot verify user is non-root ({who})"
        ))),
        (Some(_), _) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Capabilities, PodSpec, Sysctl};

    fn pod(psc: PodSecurityContext, csc: Option<SecurityContext>) -> Pod {
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                security_context: Some(psc),
                containers: vec![Container {
                    name: "c".into(),
                    security_context: csc,
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn settings() -> Settings {
        Settings {
            seccomp_root: PathBuf::from("/var/lib/swiftlet/seccomp"),
            ..Default::default()
        }
    }

    fn ns() -> api::NamespaceOption {
        api::NamespaceOption::default()
    }

    fn sc_of(p: &Pod, image: &ImageUser) -> Result<api::LinuxContainerSecurityContext, Refusal> {
        let c = &p.spec.as_ref().unwrap().containers[0];
        container(p, c, image, ns(), &settings())
    }

    #[test]
    fn the_container_overrides_the_pod_and_everything_reaches_cri() {
        let p = pod(
            PodSecurityContext {
                run_as_user: Some(1000),
                run_as_group: Some(3000),
                fs_group: Some(2000),
                supplemental_groups: Some(vec![4000, 4001]),
                se_linux_options: Some(SELinuxOptions {
                    level: Some("s0:c1".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            Some(SecurityContext {
                run_as_user: Some(1001),
                read_only_root_filesystem: Some(true),
                allow_privilege_escalation: Some(false),
                capabilities: Some(Capabilities {
                    add: Some(vec!["NET_ADMIN".into()]),
                    drop: Some(vec!["ALL".into()]),
                }),
                ..Default::default()
            }),
        );
        let sc = sc_of(&p, &ImageUser::default()).unwrap();
        assert_eq!(sc.run_as_user.map(|v| v.value), Some(1001));
        assert_eq!(sc.run_as_group.map(|v| v.value), Some(3000));
        assert_eq!(sc.supplemental_groups, [2000, 4000, 4001]);
        assert!(sc.readonly_rootfs && sc.no_new_privs && !sc.privileged);
        let caps = sc.capabilities.unwrap();
        assert_eq!(
            (caps.add_capabilities, caps.drop_capabilities),
            (vec!["NET_ADMIN".to_owned()], vec!["ALL".to_owned()])
        );
        assert_eq!(sc.selinux_options.unwrap().level, "s0:c1");
        assert_eq!(sc.masked_paths.len(), DEFAULT_MASKED_PATHS.len());
        assert!(sc.readonly_paths.contains(&"/proc/sys".to_owned()));
        // No profile anywhere: Unconfined, the kubelet's default.
        assert_eq!(
            sc.seccomp.unwrap().profile_type,
            api::security_profile::ProfileType::Unconfined as i32
        );
        // Privilege escalation left unset is not forbidden.
        let plain = pod(PodSecurityContext::default(), None);
        let sc = sc_of(&plain, &ImageUser::default()).unwrap();
        assert!(!sc.no_new_privs && sc.run_as_user.is_none());
    }

    #[test]
    fn run_as_non_root_is_checked_against_the_effective_or_the_image_user() {
        let non_root = |user: Option<i64>| {
            pod(
                PodSecurityContext {
                    run_as_non_root: Some(true),
                    run_as_user: user,
                    ..Default::default()
                },
                None,
            )
        };
        let root_image = ImageUser {
            uid: Some(0),
            username: String::new(),
        };
        let err = sc_of(&non_root(None), &root_image).unwrap_err();
        assert_eq!(
            err.to_string(),
            "container has runAsNonRoot and image will run as root (pod: \"p_ns(u1)\", container: c)"
        );
        assert_eq!(err.reason(), "CreateContainerConfigError");
        // An image without any user runs as root too.
        assert!(sc_of(&non_root(None), &ImageUser::default()).is_err());
        let named = ImageUser {
            uid: None,
            username: "nginx".into(),
        };
        let err = sc_of(&non_root(None), &named).unwrap_err().to_string();
        assert!(err.contains("image has non-numeric user (nginx)"), "{err}");
        let err = sc_of(&non_root(Some(0)), &root_image)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("container's runAsUser breaks non-root policy"),
            "{err}"
        );
        // A non-root user set by the pod, or by the image, passes.
        assert!(sc_of(&non_root(Some(1000)), &root_image).is_ok());
        let user_image = ImageUser {
            uid: Some(65534),
            username: String::new(),
        };
        assert!(sc_of(&non_root(None), &user_image).is_ok());
        // The container may lift the pod's rule.
        let mut lifted = non_root(None);
        lifted.spec.as_mut().unwrap().containers[0].security_context = Some(SecurityContext {
            run_as_non_root: Some(false),
            ..Default::default()
        });
        assert!(sc_of(&lifted, &root_image).is_ok());
    }

    #[test]
    fn a_group_without_a_user_takes_the_images_user() {
        let p = pod(
            PodSecurityContext {
                run_as_group: Some(3000),
                ..Default::default()
            },
            None,
        );
        let image = |uid: Option<i64>, name: &str| ImageUser {
            uid,
            username: name.into(),
        };
        let sc = sc_of(&p, &image(Some(7), "")).unwrap();
        assert_eq!(sc.run_as_user.map(|v| v.value), Some(7));
        let sc = sc_of(&p, &image(None, "")).unwrap();
        assert_eq!(sc.run_as_user.map(|v| v.value), Some(0));
        let sc = sc_of(&p, &image(None, "www")).unwrap();
        assert_eq!((sc.run_as_user, sc.run_as_username.as_str()), (None, "www"));
    }

    #[test]
    fn seccomp_profiles_and_their_paths() {
        use api::security_profile::ProfileType;
        let with = |t: &str, name: Option<&str>| {
            pod(
                PodSecurityContext {
                    seccomp_profile: Some(SeccompProfile {
                        type_: t.into(),
                        localhost_profile: name.map(str::to_owned),
                    }),
                    ..Default::default()
                },
                None,
            )
        };
        let sc = sc_of(&with("RuntimeDefault", None), &ImageUser::default()).unwrap();
        assert_eq!(
            sc.seccomp.unwrap().profile_type,
            ProfileType::RuntimeDefault as i32
        );
        let sc = sc_of(
            &with("Localhost", Some("profiles/a.json")),
            &ImageUser::default(),
        )
        .unwrap()
        .seccomp
        .unwrap();
        assert_eq!(
            (sc.profile_type, sc.localhost_ref.as_str()),
            (
                ProfileType::Localhost as i32,
                "/var/lib/swiftlet/seccomp/profiles/a.json"
            )
        );
        for bad in ["../../etc/passwd", "/etc/x.json", "a/../../b", ""] {
            let p = with("Localhost", Some(bad));
            assert_eq!(
                check_pod(&p, &settings()),
                Err(Refusal::SeccompPath(bad.to_owned())),
                "{bad}"
            );
        }
        let mut s = settings();
        s.seccomp_default = true;
        let plain = pod(PodSecurityContext::default(), None);
        let c = &plain.spec.as_ref().unwrap().containers[0];
        let sc = container(&plain, c, &ImageUser::default(), ns(), &s).unwrap();
        assert_eq!(
            sc.seccomp.unwrap().profile_type,
            ProfileType::RuntimeDefault as i32
        );
    }

    #[test]
    fn sysctls_are_checked_against_the_safe_set_and_the_host_namespaces() {
        let with = |names: &[&str]| {
            pod(
                PodSecurityContext {
                    sysctls: Some(
                        names
                            .iter()
                            .map(|n| Sysctl {
                                name: (*n).into(),
                                value: "1".into(),
                            })
                            .collect(),
                    ),
                    ..Default::default()
                },
                None,
            )
        };
        let s = settings();
        assert_eq!(
            check_pod(
                &with(&["kernel.shm_rmid_forced", "net/ipv4/tcp_syncookies"]),
                &s
            ),
            Ok(())
        );
        let err = check_pod(&with(&["kernel.msgmax"]), &s).unwrap_err();
        assert_eq!(err.reason(), "SysctlForbidden");
        assert!(
            err.to_string()
                .starts_with("forbidden sysctl: \"kernel.msgmax\"")
        );
        let mut allowing = settings();
        allowing.allowed_unsafe_sysctls = vec!["kernel.msg*".into()];
        assert_eq!(check_pod(&with(&["kernel.msgmax"]), &allowing), Ok(()));
        let refusal = |p: &Pod| check_pod(p, &s).unwrap_err().to_string();
        let mut host_net = with(&["net.ipv4.tcp_syncookies"]);
        host_net.spec.as_mut().unwrap().host_network = Some(true);
        assert!(refusal(&host_net).contains("host net"));
        let mut host_ipc = with(&["kernel.shm_rmid_forced"]);
        host_ipc.spec.as_mut().unwrap().host_ipc = Some(true);
        assert!(refusal(&host_ipc).contains("host ipc"));
        assert_eq!(
            dotted("net/ipv4/conf/eno2.100/rp_filter"),
            "net.ipv4.conf.eno2/100.rp_filter"
        );
        assert_eq!(
            dotted("net.ipv4.conf.eno2/100.rp_filter"),
            "net.ipv4.conf.eno2/100.rp_filter"
        );
        // The sandbox gets them with dots.
        let (_, sysctls) = sandbox(&with(&["net/ipv4/tcp_syncookies"]), ns());
        assert_eq!(
            sysctls.get("net.ipv4.tcp_syncookies").map(String::as_str),
            Some("1")
        );
    }

    #[test]
    fn what_cannot_be_honoured_is_refused() {
        let s = settings();
        let mut p = pod(PodSecurityContext::default(), None);
        p.spec.as_mut().unwrap().host_users = Some(false);
        assert!(matches!(check_pod(&p, &s), Err(Refusal::Unsupported(_))));
        let p = pod(
            PodSecurityContext {
                supplemental_groups_policy: Some("Strict".into()),
                ..Default::default()
            },
            None,
        );
        assert!(matches!(check_pod(&p, &s), Err(Refusal::Unsupported(_))));
        let p = pod(
            PodSecurityContext::default(),
            Some(SecurityContext {
                proc_mount: Some("Unmasked".into()),
                ..Default::default()
            }),
        );
        assert!(matches!(check_pod(&p, &s), Err(Refusal::Unsupported(_))));
        let apparmor = |t: &str| {
            pod(
                PodSecurityContext {
                    app_armor_profile: Some(k8s_openapi::api::core::v1::AppArmorProfile {
                        type_: t.into(),
                        localhost_profile: None,
                    }),
                    ..Default::default()
                },
                None,
            )
        };
        assert_eq!(
            check_pod(&apparmor("RuntimeDefault"), &s),
            Err(Refusal::AppArmor)
        );
        assert_eq!(check_pod(&apparmor("Unconfined"), &s), Ok(()));
        let mut with_apparmor = settings();
        with_apparmor.apparmor = true;
        assert_eq!(
            check_pod(&apparmor("RuntimeDefault"), &with_apparmor),
            Ok(())
        );
    }

    /// The container's field, else its annotation, else the pod's field; the runtime gets the
    /// profile in both CRI forms.
    #[test]
    fn apparmor_comes_from_the_field_then_the_annotation_then_the_pod() {
        use api::security_profile::ProfileType;
        let field = |t: &str, name: Option<&str>| AppArmorProfile {
            type_: t.into(),
            localhost_profile: name.map(str::to_owned),
        };
        let mut s = settings();
        s.apparmor = true;
        let run = |p: &Pod| {
            let c = &p.spec.as_ref().unwrap().containers[0];
            let sc = container(p, c, &ImageUser::default(), ns(), &s).unwrap();
            #[allow(deprecated)]
            let old = sc.apparmor_profile;
            (sc.apparmor.map(|a| (a.profile_type, a.localhost_ref)), old)
        };
        let annotated = |value: &str, psc: PodSecurityContext, csc: Option<SecurityContext>| {
            let mut p = pod(psc, csc);
            p.metadata.annotations = Some(
                [(format!("{APPARMOR_ANNOTATION_PREFIX}c"), value.to_owned())]
                    .into_iter()
                    .collect(),
            );
            p
        };
        let pod_level = PodSecurityContext {
            app_armor_profile: Some(field("Unconfined", None)),
            ..Default::default()
        };
        assert_eq!(
            run(&pod(pod_level.clone(), None)),
            (
                Some((ProfileType::Unconfined as i32, String::new())),
                "unconfined".into()
            )
        );
        let p = annotated("localhost/k8s-nginx", pod_level.clone(), None);
        assert_eq!(
            run(&p),
            (
                Some((ProfileType::Localhost as i32, "k8s-nginx".into())),
                "localhost/k8s-nginx".into()
            ),
            "the annotation wins over the pod's field"
        );
        let own = Some(SecurityContext {
            app_armor_profile: Some(field("RuntimeDefault", None)),
            ..Default::default()
        });
        let p = annotated("localhost/k8s-nginx", pod_level.clone(), own);
        assert_eq!(
            run(&p),
            (
                Some((ProfileType::RuntimeDefault as i32, String::new())),
                "runtime/default".into()
            ),
            "the container's field wins over its annotation"
        );
        let p = annotated("something/else", pod_level, None);
        assert_eq!(run(&p).1, "unconfined", "an unknown value is ignored");
        assert_eq!(
            run(&pod(PodSecurityContext::default(), None)),
            (None, String::new())
        );
        // On a kernel without AppArmor an annotation asking for a profile is refused.
        let p = annotated("runtime/default", PodSecurityContext::default(), None);
        assert_eq!(check_pod(&p, &settings()), Err(Refusal::AppArmor));
        assert_eq!(check_pod(&p, &s), Ok(()));
    }

    #[test]
    fn the_sandbox_carries_the_pods_user_groups_and_privilege() {
        let mut p = pod(
            PodSecurityContext {
                run_as_user: Some(1000),
                fs_group: Some(2000),
                supplemental_groups: Some(vec![4000]),
                ..Default::default()
            },
            Some(SecurityContext {
                privileged: Some(true),
                ..Default::default()
            }),
        );
        let (sc, _) = sandbox(&p, ns());
        assert_eq!(sc.run_as_user.map(|v| v.value), Some(1000));
        assert_eq!(sc.supplemental_groups, [2000, 4000]);
        assert!(sc.privileged);
        assert_eq!(
            sc.seccomp.unwrap().profile_type,
            api::security_profile::ProfileType::RuntimeDefault as i32
        );
        p.spec.as_mut().unwrap().containers[0].security_context = None;
        assert!(!sandbox(&p, ns()).0.privileged);
    }
}
