//! A compact, allocation-free serde serializer used only to fingerprint values: it writes a
//! self-delimiting binary encoding (type tags, length-prefixed strings, raw little-endian numbers)
//! into a reusable buffer, which is then hashed. Much cheaper than JSON (no escaping, no number
//! formatting), and only ever compared within one process.

use std::cell::RefCell;

use k8s_openapi::api::core::v1::Pod;
use serde::ser::{self, Serialize};
use xxhash_rust::xxh3::{xxh3_64, xxh3_128};

use super::LOCAL_ANNOTATIONS;

/// The two fingerprints of a pod the mux compares instead of deep structs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprints {
    /// Spec, labels, deletion timestamp and grace period, non-local annotations.
    pub semantic: u128,
    /// The status.
    pub status: u128,
}

/// The encoding buffer's size when a thread starts.
const SCRATCH_START: usize = 4096;
/// Largest encoding buffer a thread keeps between pods: one a huge pod grew (megabytes of env
/// vars encode to megabytes) is given back at once, not held by the thread for its life.
const SCRATCH_KEPT: usize = 64 * 1024;

thread_local! {
    /// Reused encoding buffer (ingestion happens on a few source tasks; no contention).
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(SCRATCH_START));
}

/// Fingerprints of `pod`: the fields the kubelet compares (`checkAndUpdatePod`), encoded and
/// hashed with 128-bit XXH3.
pub(crate) fn of_pod(pod: &Pod) -> Fingerprints {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            let fp = fingerprints(pod, &mut buf);
            if buf.capacity() > SCRATCH_KEPT {
                *buf = Vec::with_capacity(SCRATCH_START);
            }
            fp
        }
        // Only reachable through re-entrancy, which serialization never does; stay correct anyway.
        Err(_) => fingerprints(pod, &mut Vec::new()),
    })
}

/// Fingerprints of `pod`, encoding into `buf`.
pub(crate) fn fingerprints(pod: &Pod, buf: &mut Vec<u8>) -> Fingerprints {
    let m = &pod.metadata;
    buf.clear();
    write(buf, &pod.spec);
    write(buf, &m.labels);
    write(buf, &m.deletion_timestamp);
    write(buf, &m.deletion_grace_period_seconds);
    for (k, v) in m.annotations.iter().flatten() {
        if !LOCAL_ANNOTATIONS.contains(&k.as_str()) {
            write(buf, k);
            write(buf, v);
        }
    }
    let semantic = xxh3_128(buf);
    buf.clear();
    write(buf, &pod.status);
    Fingerprints {
        semantic,
        status: xxh3_128(buf),
    }
}

/// The hash the mux files a UID under.
pub(crate) fn uid_hash(uid: &str) -> u64 {
    xxh3_64(uid.as_bytes())
}

/// A 64-bit hash of a pod's full name (name, namespace); equal names give equal keys.
pub(crate) fn name_key(pod: &Pod) -> u64 {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let mut buf = Vec::with_capacity(name.len() + ns.len() + 8);
    buf.extend_from_slice(&(name.len() as u32).to_le_bytes());
    buf.extend_from_slice(name.as_bytes());
    buf.extend_from_slice(ns.as_bytes());
    xxh3_64(&buf)
}

/// The encoding buffer.
pub(crate) struct Sink<'a>(pub(crate) &'a mut Vec<u8>);

/// Never produced by the sink itself; serde requires an error type, and `Serialize` impls may
/// raise one through `ser::Error::custom` (e.g. a time that cannot be formatted).
#[derive(Debug, thiserror::Error)]
#[error("fingerprint serialization: {0}")]
pub(crate) struct Error(String);

impl ser::Error for Error {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        Error(msg.to_string())
    }
}

/// Writes `value`'s encoding into `buf` (appending).
pub(crate) fn write<T: Serialize + ?Sized>(buf: &mut Vec<u8>, value: &T) {
    let len = buf.len();
    if value.serialize(&mut Sink(buf)).is_err() {
        // Keep the fingerprint deterministic: a value that cannot be serialized contributes a
        // fixed marker instead of a partial encoding.
        buf.truncate(len);
        buf.push(T_ERR);
    }
}

const T_NONE: u8 = 0;
const T_SOME: u8 = 1;
const T_BOOL: u8 = 2;
const T_INT: u8 = 3;
const T_FLOAT: u8 = 4;
const T_STR: u8 = 5;
const T_BYTES: u8 = 6;
const T_UNIT: u8 = 7;
const T_SEQ: u8 = 8;
const T_MAP: u8 = 9;
const T_STRUCT: u8 = 10;
const T_VARIANT: u8 = 11;
const T_END: u8 = 12;
const T_ERR: u8 = 13;

impl Sink<'_> {
    #[inline]
    fn str(&mut self, s: &str) {
        self.0.push(T_STR);
        self.0.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.0.extend_from_slice(s.as_bytes());
    }
    #[inline]
    fn name(&mut self, s: &'static str) {
        self.0.push(s.len() as u8);
        self.0.extend_from_slice(s.as_bytes());
    }
}

impl<'a, 'b> ser::Serializer for &'a mut Sink<'b> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.0.extend_from_slice(&[T_BOOL, u8::from(v)]);
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<(), Error> {
        self.serialize_i64(v.into())
    }
    fn serialize_i16(self, v: i16) -> Result<(), Error> {
        self.serialize_i64(v.into())
    }
    fn serialize_i32(self, v: i32) -> Result<(), Error> {
        self.serialize_i64(v.into())
    }
    fn serialize_i64(self, v: i64) -> Result<(), Error> {
        self.0.push(T_INT);
        self.0.extend_from_slice(&v.to_le_bytes());
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> Result<(), Error> {
        self.serialize_u64(v.into())
    }
    fn serialize_u16(self, v: u16) -> Result<(), Error> {
        self.serialize_u64(v.into())
    }
    fn serialize_u32(self, v: u32) -> Result<(), Error> {
        self.serialize_u64(v.into())
    }
    fn serialize_u64(self, v: u64) -> Result<(), Error> {
        self.0.push(T_INT);
        self.0.extend_from_slice(&v.to_le_bytes());
        Ok(())
    }
    fn serialize_f32(self, v: f32) -> Result<(), Error> {
        self.serialize_f64(v.into())
    }
    fn serialize_f64(self, v: f64) -> Result<(), Error> {
        self.0.push(T_FLOAT);
        self.0.extend_from_slice(&v.to_bits().to_le_bytes());
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), Error> {
        self.str(v.encode_utf8(&mut [0; 4]));
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), Error> {
        self.str(v);
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Error> {
        self.0.push(T_BYTES);
        self.0.extend_from_slice(&(v.len() as u64).to_le_bytes());
        self.0.extend_from_slice(v);
        Ok(())
    }
    fn serialize_none(self) -> Result<(), Error> {
        self.0.push(T_NONE);
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        self.0.push(T_SOME);
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Error> {
        self.0.push(T_UNIT);
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        self.0.push(T_VARIANT);
        self.name(variant);
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.0.push(T_VARIANT);
        self.name(variant);
        value.serialize(self)
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self, Error> {
        self.0.push(T_SEQ);
        Ok(self)
    }
    fn serialize_tuple(self, _len: usize) -> Result<Self, Error> {
        self.0.push(T_SEQ);
        Ok(self)
    }
    fn serialize_tuple_struct(self, _name: &'static str, _len: usize) -> Result<Self, Error> {
        self.0.push(T_SEQ);
        Ok(self)
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Self, Error> {
        self.0.push(T_VARIANT);
        self.name(variant);
        self.0.push(T_SEQ);
        Ok(self)
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self, Error> {
        self.0.push(T_MAP);
        Ok(self)
    }
    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Self, Error> {
        self.0.push(T_STRUCT);
        Ok(self)
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Self, Error> {
        self.0.push(T_VARIANT);
        self.name(variant);
        self.0.push(T_STRUCT);
        Ok(self)
    }
}

macro_rules! seq_like {
    ($($tr:ident :: $m:ident),*) => {$(
        impl ser::$tr for &mut Sink<'_> {
            type Ok = ();
            type Error = Error;
            fn $m<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
                value.serialize(&mut **self)
            }
            fn end(self) -> Result<(), Error> {
                self.0.push(T_END);
                Ok(())
            }
        }
    )*};
}
seq_like!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

impl ser::SerializeMap for &mut Sink<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        key.serialize(&mut **self)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        value.serialize(&mut **self)
    }
    fn end(self) -> Result<(), Error> {
        self.0.push(T_END);
        Ok(())
    }
}

macro_rules! struct_like {
    ($($tr:ident),*) => {$(
        impl ser::$tr for &mut Sink<'_> {
            type Ok = ();
            type Error = Error;
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<(), Error> {
                self.name(key);
                value.serialize(&mut **self)
            }
            fn end(self) -> Result<(), Error> {
                self.0.push(T_END);
                Ok(())
            }
        }
    )*};
}
struct_like!(SerializeStruct, SerializeStructVariant);

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_huge_pod_s_encoding_buffer_is_not_kept() {
        let env = (0..10_000)
            .map(|i| k8s_openapi::api::core::v1::EnvVar {
                name: format!("V{i:06}"),
                value: Some("x".repeat(70)),
                ..Default::default()
            })
            .collect();
        let pod = Pod {
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                containers: vec![k8s_openapi::api::core::v1::Container {
                    name: "big".into(),
                    env: Some(env),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let first = of_pod(&pod);
        SCRATCH.with_borrow(|b| assert!(b.capacity() <= SCRATCH_KEPT, "{} kept", b.capacity()));
        assert_eq!(first, of_pod(&pod));
        assert_eq!(first, fingerprints(&pod, &mut Vec::new()));
    }

    fn enc<T: Serialize + ?Sized>(v: &T) -> Vec<u8> {
        let mut b = Vec::new();
        write(&mut b, v);
        b
    }

    #[test]
    fn encoding_is_unambiguous() {
        assert_ne!(enc(&("ab", "c")), enc(&("a", "bc")));
        assert_ne!(enc(&Some("")), enc(&None::<&str>));
        assert_ne!(enc(&vec![vec![1u8], vec![]]), enc(&vec![vec![], vec![1u8]]));
        let a: BTreeMap<&str, &str> = [("k", "v")].into();
        let b: BTreeMap<&str, &str> = [("kv", "")].into();
        assert_ne!(enc(&a), enc(&b));
        assert_eq!(enc(&a), enc(&a.clone()));
        assert_ne!(enc(&1i64), enc(&1.0f64));
    }
}
