//! The `volume` entries of a pod's summary: for each volume with a directory of the pod's own
//! (emptyDir, configMap, secret, downwardAPI, projected), the bytes and inodes below it, as `du`
//! counts them, and the size and free space of the file system it is on; for a claim bound to a
//! local PersistentVolume, its file system's size, free space and use, with the claim
//! (`pvcRef`). A hostPath volume (or PersistentVolume) is the node's, not the pod's, and is not
//! measured (nor does the kubelet measure it).
//!
//! Walking a volume costs a `stat` per file, so the summary never waits for it: each pod's
//! volumes are measured on a blocking thread at most once a period (`--volume-stats-agg-period`,
//! one minute as the kubelet's), and the summary shows the last measurement.
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::volume::{Backing, ResolvedClaims, Source};
use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

/// One volume's use, with the kubelet's field names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStats {
    pub time: String,
    pub available_bytes: u64,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub inodes_free: u64,
    pub inodes: u64,
    pub inodes_used: u64,
    pub name: String,
    /// The claim of a persistentVolumeClaim volume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pvc_ref: Option<PvcRef>,
}

/// The claim a volume's stats are reported for (`pvcRef` in the summary; the labels of
/// `kubelet_volume_stats_*`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct PvcRef {
    pub name: String,
    pub namespace: String,
}

/// Measures the volumes of pod `uid` now (`pods_dir`: the agent's `<root>/pods`); a volume
/// whose directory is not there (not set up yet, or torn down) is left out. `claims`: the
/// pod's claims as the volume manager resolved them; a claim's local PersistentVolume is
/// measured as the kubelet measures it, from its file system alone (statfs: no walk of what may
/// be a large disk), and reported with its claim.
pub fn measure(
    pods_dir: &Path,
    uid: &str,
    pod: &Pod,
    claims: &HashMap<String, Source>,
    time: &str,
) -> Vec<VolumeStats> {
    let Some(volumes) = pod.spec.as_ref().and_then(|s| crate::volume::plan(s).ok()) else {
        return Vec::new();
    };
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    volumes
        .into_iter()
        .filter_map(|mut v| {
            let pvc_ref = match &v.source {
                // The node's, not the pod's: not measured (nor by the kubelet).
                Source::HostPath { .. } => return None,
                Source::Claim { claim, .. } => {
                    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
                    let claim = crate::volume::claim_name(pod_name, &v.name, claim.as_deref());
                    let resolved = claims.get(&v.name)?;
                    // A hostPath PersistentVolume: not measured either.
                    if !matches!(
                        resolved,
                        Source::Persistent {
                            backing: Backing::Local(_),
                            ..
                        }
                    ) {
                        return None;
                    }
                    v.source = resolved.clone();
                    Some(PvcRef {
                        name: claim,
                        namespace: namespace.to_owned(),
                    })
                }
                _ => None,
            };
            let dir = v.host_path(pods_dir, uid);
            if !dir.is_dir() {
                return None;
            }
            let fs = crate::cm::filesystem_stats(&dir).ok()?;
            let (used_bytes, inodes_used) = match pvc_ref {
                Some(_) => (fs.used_bytes, fs.inodes.saturating_sub(fs.inodes_free)),
                None => crate::eviction::disk_use(&dir),
            };
            Some(VolumeStats {
                time: time.to_owned(),
                available_bytes: fs.available_bytes,
                capacity_bytes: fs.capacity_bytes,
                used_bytes,
                inodes_free: fs.inodes_free,
                inodes: fs.inodes,
                inodes_used,
                name: v.name,
                pvc_ref,
            })
        })
        .collect()
}

#[derive(Default)]
struct State {
    /// Pod UID -> when its volumes were measured, and what was found.
    pods: HashMap<String, (Instant, Arc<[VolumeStats]>)>,
    /// A measurement is under way (the next request does not start another).
    measuring: bool,
}

/// The last measurement of each pod's volumes. Cheap to clone; clones share it.
#[derive(Clone)]
pub struct Volumes {
    period: Duration,
    state: Arc<Mutex<State>>,
    /// The claims the volume manager resolved.
    claims: ResolvedClaims,
}

impl Volumes {
    /// Measures each pod's volumes at most once every `period` (zero: never); a claim's volume
    /// as `claims` resolved it.
    pub fn new(period: Duration, claims: ResolvedClaims) -> Self {
        Self {
            period,
            state: Arc::default(),
            claims,
        }
    }

    /// The last measurement of every volume of a claim, of every pod.
    pub fn of_claims(&self) -> Vec<VolumeStats> {
        self.state()
            .pods
            .values()
            .flat_map(|(_, v)| v.iter())
            .filter(|v| v.pvc_ref.is_some())
            .cloned()
            .collect()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The last measurement of `uid`'s volumes (empty before the first).
    pub fn of(&self, uid: &str) -> Arc<[VolumeStats]> {
        self.state()
            .pods
            .get(uid)
            .map_or_else(|| Arc::from([]), |(_, v)| v.clone())
    }

    /// Forgets the pods not in `pods`, and starts measuring, on a blocking thread, those of
    /// `pods` never measured or last measured a period ago (unless a measurement is under way).
    /// Answers at once; only the pods due are copied.
    pub fn refresh(&self, pods_dir: &Path, pods: &[super::PodEntry]) {
        if self.period.is_zero() {
            return;
        }
        let due: Vec<(String, Arc<Pod>)> = {
            let mut state = self.state();
            let live: std::collections::HashSet<&str> =
                pods.iter().map(|p| p.uid.as_str()).collect();
            state.pods.retain(|uid, _| live.contains(uid.as_str()));
            if state.measuring {
                return;
            }
            let due: Vec<_> = pods
                .iter()
                .filter(|p| {
                    state
                        .pods
                        .get(&p.uid)
                        .is_none_or(|(at, _)| at.elapsed() >= self.period)
                })
                .map(|p| (p.uid.clone(), p.pod.clone()))
                .collect();
            if due.is_empty() {
                return;
            }
            state.measuring = true;
            due
        };
        let (this, pods_dir) = (self.clone(), pods_dir.to_owned());
        let measure_all = move || {
            let time = super::rfc3339(&jiff::Timestamp::now());
            for (uid, pod) in due {
                let claims = this.claims.of(&uid);
                let found: Arc<[VolumeStats]> =
                    measure(&pods_dir, &uid, &pod, &claims, &time).into();
                this.state().pods.insert(uid, (Instant::now(), found));
            }
            this.state().measuring = false;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(measure_all)),
            Err(_) => measure_all(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(volumes: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {"containers": [{"name": "c", "image": "i"}], "volumes": volumes}
        }))
        .expect("valid pod")
    }

    #[test]
    fn a_volumes_use_is_what_its_directory_holds() {
        let root = tempfile::tempdir().expect("tempdir");
        let pods_dir = root.path();
        let p = pod(serde_json::json!([
            {"name": "data", "emptyDir": {}},
            {"name": "later", "emptyDir": {}},
            {"name": "node", "hostPath": {"path": "/"}}
        ]));
        let data = pods_dir.join("u/volumes/kubernetes.io~empty-dir/data");
        std::fs::create_dir_all(data.join("sub")).expect("mkdir");
        std::fs::write(data.join("sub/f"), vec![7u8; 256 << 10]).expect("write");
        let found = measure(pods_dir, "u", &p, &HashMap::new(), "2026-12-07T00:00:00Z");
        let names: Vec<&str> = found.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(
            names,
            ["data"],
            "not set up and hostPath volumes are left out"
        );
        let v = &found[0];
        assert!(v.used_bytes >= 256 << 10, "{v:?}");
        assert_eq!(v.inodes_used, 3, "the directory, sub and f: {v:?}");
        assert!(
            v.capacity_bytes >= v.available_bytes && v.capacity_bytes > 0,
            "{v:?}"
        );
        assert!(v.inodes >= v.inodes_free, "{v:?}");
        assert_eq!(v.time, "2026-12-07T00:00:00Z");
    }

    #[test]
    fn a_claims_local_volume_is_measured_from_its_file_system_and_named_with_its_claim() {
        let root = tempfile::tempdir().expect("tempdir");
        let pods_dir = root.path();
        let p = pod(serde_json::json!([
            {"name": "data", "persistentVolumeClaim": {"claimName": "db"}},
            {"name": "logs", "persistentVolumeClaim": {"claimName": "logs"}},
            {"name": "later", "persistentVolumeClaim": {"claimName": "later"}},
        ]));
        let claims = HashMap::from([
            (
                "data".to_owned(),
                Source::Persistent {
                    pv: "pv-1".into(),
                    read_only: false,
                    backing: Backing::Local("/mnt/disks/one".into()),
                },
            ),
            (
                "logs".to_owned(),
                Source::Persistent {
                    pv: "pv-2".into(),
                    read_only: false,
                    backing: Backing::HostPath {
                        path: "/".into(),
                        kind: crate::volume::HostPathType::Unset,
                    },
                },
            ),
        ]);
        // Where the local volume is bound.
        let bound = pods_dir.join("u/volumes/kubernetes.io~local-volume/pv-1");
        std::fs::create_dir_all(&bound).expect("mkdir");
        let found = measure(pods_dir, "u", &p, &claims, "2026-12-07T00:00:00Z");
        assert_eq!(
            found.len(),
            1,
            "hostPath and unresolved claims left out: {found:?}"
        );
        let v = &found[0];
        assert_eq!(v.name, "data");
        assert_eq!(
            v.pvc_ref,
            Some(PvcRef {
                name: "db".into(),
                namespace: "default".into()
            })
        );
        let fs = crate::cm::filesystem_stats(&bound).expect("statvfs");
        assert_eq!(v.capacity_bytes, fs.capacity_bytes);
        assert!(
            v.used_bytes > 0,
            "the file system's use, not the directory's: {v:?}"
        );
        assert_eq!(v.inodes_used, v.inodes - v.inodes_free);
        let json = serde_json::to_value(v).expect("json");
        assert_eq!(json["pvcRef"]["name"], "db");
    }

    #[test]
    fn volumes_are_measured_once_a_period_and_forgotten_with_their_pod() {
        let root = tempfile::tempdir().expect("tempdir");
        let pods_dir = root.path();
        let p = Arc::new(pod(serde_json::json!([{"name": "data", "emptyDir": {}}])));
        let entry = || {
            vec![crate::stats::PodEntry {
                uid: "u".into(),
                pod: p.clone(),
                start_time: None,
            }]
        };
        let data = pods_dir.join("u/volumes/kubernetes.io~empty-dir/data");
        std::fs::create_dir_all(&data).expect("mkdir");
        let volumes = Volumes::new(Duration::from_secs(3600), ResolvedClaims::default());
        assert!(volumes.of("u").is_empty(), "nothing before the first");
        // Outside a runtime the measurement is made in place.
        volumes.refresh(pods_dir, &entry());
        let first = volumes.of("u");
        assert_eq!(first.len(), 1);
        std::fs::write(data.join("f"), vec![1u8; 1 << 20]).expect("write");
        volumes.refresh(pods_dir, &entry());
        assert_eq!(volumes.of("u"), first, "not again within the period");
        let now = Volumes::new(Duration::from_nanos(1), ResolvedClaims::default());
        now.refresh(pods_dir, &entry());
        assert!(now.of("u")[0].used_bytes >= 1 << 20);
        volumes.refresh(pods_dir, &[]);
        assert!(volumes.of("u").is_empty(), "forgotten");
        let off = Volumes::new(Duration::ZERO, ResolvedClaims::default());
        off.refresh(pods_dir, &entry());
        assert!(off.of("u").is_empty(), "a zero period measures nothing");
    }
}
