//! The container hash: decides whether a running container still matches its spec.
//!
//! Canonical encoding (stable across agent restarts and versions; changing it restarts every
//! running container on upgrade, which the pinned test below guards against). The restart-relevant
//! fields, in this fixed order, each prefixed by a one-byte tag:
//! name, image, command, args, workingDir, env (name, value, and valueFrom as JSON), ports
//! (containerPort, hostPort, hostIP, protocol, name), volumeMounts and securityContext (as JSON, only
//! when present: rare, so serde's cost is paid only then), stdin, tty. A string is its length
//! (u32 LE) then its bytes; an absent optional is the byte 0, a present one 1 then the value; a list
//! is its length (u32 LE) then its items. The bytes are hashed with `hash_bytes` below and stored
//! as 16 lower-case hex digits. Resources are deliberately left out: they are resized in place.
use k8s_openapi::api::core::v1::Container;

/// Appends the canonical encoding of the restart-relevant fields to `out`.
fn encode(c: &Container, out: &mut Vec<u8>) {
    fn str_(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    fn opt_str(out: &mut Vec<u8>, s: Option<&str>) {
        match s {
            None => out.push(0),
            Some(s) => {
                out.push(1);
                str_(out, s);
            }
        }
    }
    fn list<T>(out: &mut Vec<u8>, l: Option<&Vec<T>>, mut item: impl FnMut(&mut Vec<u8>, &T)) {
        match l {
            None => out.push(0),
            Some(l) => {
                out.push(1);
                out.extend_from_slice(&(l.len() as u32).to_le_bytes());
                for x in l {
                    item(out, x);
                }
            }
        }
    }
    fn json<T: serde::Serialize>(out: &mut Vec<u8>, v: Option<&T>) {
        match v.and_then(|v| serde_json::to_string(v).ok()) {
            None => out.push(0),
            Some(s) => {
                out.push(1);
                str_(out, &s);
            }
        }
    }
    fn opt_bool(out: &mut Vec<u8>, b: Option<bool>) {
        out.push(match b {
            None => 0,
            Some(false) => 1,
            Some(true) => 2,
        });
    }
    out.push(b'n');
    str_(out, &c.name);
    out.push(b'i');
    opt_str(out, c.image.as_deref());
    out.push(b'c');
    list(out, c.command.as_ref(), |o, s| str_(o, s));
    out.push(b'a');
    list(out, c.args.as_ref(), |o, s| str_(o, s));
    out.push(b'w');
    opt_str(out, c.working_dir.as_deref());
    out.push(b'e');
    list(out, c.env.as_ref(), |o, e| {
        str_(o, &e.name);
        opt_str(o, e.value.as_deref());
        json(o, e.value_from.as_ref());
    });
    out.push(b'p');
    list(out, c.ports.as_ref(), |o, p| {
        o.extend_from_slice(&p.container_port.to_le_bytes());
        o.extend_from_slice(&p.host_port.unwrap_or(0).to_le_bytes());
        opt_str(o, p.host_ip.as_deref());
        opt_str(o, p.protocol.as_deref());
        opt_str(o, p.name.as_deref());
    });
    out.push(b'v');
    json(out, c.volume_mounts.as_ref());
    out.push(b's');
    json(out, c.security_context.as_ref());
    out.push(b't');
    opt_bool(out, c.stdin);
    opt_bool(out, c.tty);
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

/// The serialisation buffer's size when a thread starts.
const BUF_START: usize = 1024;
/// Largest serialisation buffer a thread keeps between containers: one a huge container grew
/// (megabytes of env vars) is given back at once, not held by the thread for its life.
const BUF_KEPT: usize = 64 * 1024;

thread_local! {
    /// Reused serialisation buffer: hashing allocates nothing once warm.
    static BUF: std::cell::RefCell<Vec<u8>> =
        std::cell::RefCell::new(Vec::with_capacity(BUF_START));
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
    BUF.with_borrow_mut(|buf| {
        buf.clear();
        encode(c, buf);
        let hash = hash_bytes(buf);
        if buf.capacity() > BUF_KEPT {
            *buf = Vec::with_capacity(BUF_START);
        }
        hash
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;

    const PINNED: u64 = 0x2a05_5675_4cf9_8488;

    /// A container with `n` env vars of 70-byte values.
    fn with_env(n: usize) -> Container {
        Container {
            name: "big".into(),
            env: Some(
                (0..n)
                    .map(|i| k8s_openapi::api::core::v1::EnvVar {
                        name: format!("V{i:06}"),
                        value: Some("x".repeat(70)),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn a_huge_container_s_encoding_buffer_is_not_kept() {
        let big = with_env(10_000);
        let first = container_hash(&big);
        BUF.with_borrow(|b| assert!(b.capacity() <= BUF_KEPT, "{} kept", b.capacity()));
        // The hash does not depend on the buffer it was encoded in.
        assert_eq!(first, container_hash(&big));
        // A small container's buffer stays for the next one.
        container_hash(&with_env(3));
        BUF.with_borrow(|b| assert!(b.capacity() >= BUF_START));
    }

    #[test]
    fn stable_and_sensitive_to_restart_fields_only() {
        let c = Container {
            name: "a".into(),
            image: Some("img:1".into()),
            command: Some(vec!["sleep".into(), "1".into()]),
            ..Default::default()
        };
        // Pinned value: changing the encoding would restart every running container on upgrade.
        assert_eq!(container_hash(&c), PINNED);
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
        // Moving a word between command and args is a different container.
        let mut m = c.clone();
        m.command = Some(vec!["sleep".into()]);
        m.args = Some(vec!["1".into()]);
        assert_ne!(container_hash(&m), pinned);
        let mut e = c.clone();
        e.env = Some(vec![k8s_openapi::api::core::v1::EnvVar {
            name: "A".into(),
            value: Some("1".into()),
            ..Default::default()
        }]);
        assert_ne!(container_hash(&e), pinned);
    }
}
