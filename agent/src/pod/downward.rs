//! The downward API's resource values, shared by container environments
//! (`valueFrom.resourceFieldRef`) and downwardAPI volumes (`resourceFieldRef` items), computed
//! as the kubelet computes them.
use super::quantity::Quantity;
use k8s_openapi::api::core::v1::{Container, Pod, ResourceFieldSelector};

/// Why a `resourceFieldRef` has no value.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("container {0} not found")]
    ContainerNotFound(String),
    /// `what`: the quantity's place (`resourceFieldRef divisor`, `node allocatable` ...).
    #[error("{what}: {source}")]
    Quantity {
        what: String,
        source: super::quantity::Error,
    },
    #[error("unsupported container resource: {0}")]
    UnsupportedResource(String),
    #[error("the node's allocatable resources are not known")]
    NoAllocatable,
    #[error("the node's ephemeral-storage capacity is not known")]
    NoEphemeralStorage,
}

/// What the node offers a container without a limit (the kubelet's node allocatable; here the
/// machine's capacity, nothing being reserved).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocatable {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    /// `None`: the root directory's filesystem size could not be read.
    pub ephemeral_storage_bytes: Option<u64>,
}

/// A `resourceFieldRef` (of an env var's `valueFrom`, or of a downwardAPI volume item): the amount divided by `divisor` (default 1), rounded up; a
/// limit that is unset (or zero) is the node's allocatable amount.
pub fn resource_field_ref(
    r: &ResourceFieldSelector,
    pod: &Pod,
    own: &Container,
    allocatable: Option<&Allocatable>,
) -> Result<String, Error> {
    let c = match r.container_name.as_deref().filter(|n| !n.is_empty()) {
        None => own,
        Some(name) => {
            super::container(pod, name).ok_or_else(|| Error::ContainerNotFound(name.to_owned()))?
        }
    };
    let parse = |what: &str, text: &str| {
        Quantity::parse_amount(text).map_err(|source| Error::Quantity {
            what: what.to_owned(),
            source,
        })
    };
    let divisor = match &r.divisor {
        Some(d) => parse("resourceFieldRef divisor", &d.0)?,
        None => Quantity::ZERO,
    };
    let divisor = if divisor.is_zero() {
        parse("resourceFieldRef divisor", "1")?
    } else {
        divisor
    };
    let (kind, resource) = r
        .resource
        .split_once('.')
        .filter(|(k, _)| *k == "limits" || *k == "requests")
        .ok_or_else(|| Error::UnsupportedResource(r.resource.clone()))?;
    let cpu = resource == "cpu";
    if !cpu
        && resource != "memory"
        && resource != "ephemeral-storage"
        && !resource.starts_with("hugepages-")
    {
        return Err(Error::UnsupportedResource(r.resource.clone()));
    }
    let set = c.resources.as_ref().and_then(|res| {
        if kind == "limits" {
            res.limits.as_ref()
        } else {
            res.requests.as_ref()
        }
    });
    let declared = set
        .and_then(|m| m.get(resource))
        .map(|q| {
            parse(
                &format!("container {:?} resources.{kind}.{resource}", c.name),
                &q.0,
            )
        })
        .transpose()?
        .filter(|q| !q.is_zero());
    let amount = match declared {
        Some(q) => q,
        None if kind == "limits" => {
            let node = allocatable.ok_or(Error::NoAllocatable)?;
            let text = match resource {
                "cpu" => format!("{}m", node.cpu_millis),
                "memory" => node.memory_bytes.to_string(),
                "ephemeral-storage" => node
                    .ephemeral_storage_bytes
                    .ok_or(Error::NoEphemeralStorage)?
                    .to_string(),
                // No huge pages are allocatable here.
                _ => "0".to_owned(),
            };
            parse("node allocatable", &text)?
        }
        None => Quantity::ZERO,
    };
    let (n, d) = if cpu {
        (amount.milli_value(), divisor.milli_value())
    } else {
        (amount.value(), divisor.value())
    };
    // Both are positive or zero, d at least 1.
    Ok(((n + d - 1) / d).to_string())
}
