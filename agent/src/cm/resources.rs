//! The pod cgroup's numbers from the pod's requests and limits (the kubelet's cm helpers):
//! cpu shares, CFS quota and period, memory limit, and a container's own CRI resources.
use super::Result;
use crate::pod::pod_qos;
use crate::pod::qos::QosClass;
use crate::pod::resources::pod_resources;
use k8s_openapi::api::core::v1::{Container, Pod};

pub(super) const MIN_SHARES: u64 = 2;
pub(super) const MAX_SHARES: u64 = 262_144;
const SHARES_PER_CPU: u64 = 1024;
pub(super) const QUOTA_PERIOD_US: u64 = 100_000;
pub(super) const MIN_QUOTA_US: u64 = 1000;

/// The pod cgroup's resource settings (`ResourceConfigForPod`, CFS limits enforced).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ResourceConfig {
    pub cpu_shares: u64,
    pub cpu_quota: Option<u64>,
    pub cpu_period: Option<u64>,
    pub memory_limit: Option<u64>,
}

pub fn milli_cpu_to_shares(m: u64) -> u64 {
    if m == 0 {
        return MIN_SHARES;
    }
    (m.saturating_mul(SHARES_PER_CPU) / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

pub fn milli_cpu_to_quota(m: u64, period: u64) -> u64 {
    if m == 0 {
        return 0;
    }
    (m.saturating_mul(period) / 1000).max(MIN_QUOTA_US)
}

/// The pod cgroup's settings from the pod's requests and limits (`crate::pod::resources`):
/// shares from the cpu requests; for Guaranteed pods the cpu quota and memory limit from the
/// limits; for Burstable ones the quota only when every container declares a cpu limit and the
/// memory limit only when every container declares one; BestEffort pods get the minimum shares.
pub fn resource_config_for_pod(pod: &Pod) -> Result<ResourceConfig> {
    let r = pod_resources(pod)?;
    let shares = milli_cpu_to_shares(r.requests.cpu_millis());
    let quota = milli_cpu_to_quota(r.limits.cpu_millis(), QUOTA_PERIOD_US);
    Ok(match pod_qos(pod)? {
        QosClass::Guaranteed => ResourceConfig {
            cpu_shares: shares,
            cpu_quota: Some(quota),
            cpu_period: Some(QUOTA_PERIOD_US),
            memory_limit: Some(r.limits.memory_bytes()),
        },
        QosClass::Burstable => ResourceConfig {
            cpu_shares: shares,
            cpu_quota: r.cpu_limits_declared.then_some(quota),
            cpu_period: r.cpu_limits_declared.then_some(QUOTA_PERIOD_US),
            memory_limit: r.memory_limits_declared.then_some(r.limits.memory_bytes()),
        },
        QosClass::BestEffort => ResourceConfig {
            cpu_shares: MIN_SHARES,
            ..Default::default()
        },
    })
}

/// The machine's memory in bytes (`MemTotal` of `/proc/meminfo`); `None` when it cannot be
/// read.
pub fn machine_memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// The resources part that a resize compares: "shares quota period memory".
pub fn resources_label(r: &k8s_cri::v1::LinuxContainerResources) -> String {
    format!(
        "{} {} {} {}",
        r.cpu_shares, r.cpu_quota, r.cpu_period, r.memory_limit_in_bytes
    )
}

/// The container's own cgroup limits (CPU shares, CFS quota, memory limit).
pub fn container_resources(c: &Container) -> Result<k8s_cri::v1::LinuxContainerResources> {
    let r = crate::pod::resources::requests_and_limits(c)?;
    // As the API server would: a limit without a request implies request = limit.
    let cpu_request = if r.requests.cpu.is_some() {
        r.requests
    } else {
        r.limits
    };
    let shares = milli_cpu_to_shares(cpu_request.cpu_millis());
    let cpu_limit = r.limits.cpu.is_some();
    let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    Ok(k8s_cri::v1::LinuxContainerResources {
        cpu_shares: as_i64(shares),
        cpu_quota: if cpu_limit {
            as_i64(milli_cpu_to_quota(r.limits.cpu_millis(), QUOTA_PERIOD_US))
        } else {
            0
        },
        cpu_period: if cpu_limit { QUOTA_PERIOD_US as i64 } else { 0 },
        memory_limit_in_bytes: as_i64(r.limits.memory_bytes()),
        ..Default::default()
    })
}
