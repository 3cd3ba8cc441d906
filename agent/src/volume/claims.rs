//! PersistentVolumeClaims, resolved as the kubelet's volume manager resolves them before it
//! mounts anything: the claim is read from the API (for a generic ephemeral volume, the claim
//! `<pod>-<volume>`, which must be controlled by the pod) and must be bound (phase `Bound`, a
//! `spec.volumeName`) and not being deleted; the PersistentVolume it names is read and must
//! point back at the claim (`spec.claimRef.uid`); its `volumeMode` must be `Filesystem`; its
//! required node affinity must match this node's labels; and it must be a type swiftlet can
//! mount (`local` or `hostPath`). Each failure is the kubelet's message, and the pod waits
//! (`ContainerCreating`) with it until the claim and the volume are right.
//!
//! [`resolve`] reads the two objects; [`check_claim`] and [`persistent_source`] decide from
//! them, without the API.
use super::{Backing, Error, HostPathType, Source, has_backsteps};
use crate::api_objects::ApiObjects;
use crate::pod::admission;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use std::path::PathBuf;

/// What a pod's claim volume asks for.
#[derive(Debug, Clone, Copy)]
pub struct Wanted<'a> {
    /// The pod's namespace.
    pub namespace: &'a str,
    /// The pod's name (for messages).
    pub pod: &'a str,
    /// The pod's volume.
    pub volume: &'a str,
    /// `persistentVolumeClaim.claimName`.
    pub claim: &'a str,
    /// `persistentVolumeClaim.readOnly`.
    pub read_only: bool,
    /// Whether a container mounts it (`volumeMounts`).
    pub mounted: bool,
    /// For an ephemeral volume, the pod's UID: its claim must be controlled by the pod.
    pub owner: Option<&'a str>,
}

/// Reads the claim and its PersistentVolume and resolves them ([`check_claim`],
/// [`persistent_source`]) for `node`.
pub async fn resolve(
    api: &ApiObjects,
    wanted: Wanted<'_>,
    node: &admission::Node,
) -> Result<Source, Error> {
    let (ns, claim) = (wanted.namespace, wanted.claim);
    let set_up = |message: String| Error::SetUp {
        volume: wanted.volume.to_owned(),
        message: format!("error processing PVC {ns}/{claim}: {message}"),
    };
    let pvc = api.persistent_volume_claim(ns, claim).await.map_err(|e| {
        set_up(format!(
            "failed to fetch PVC {ns}/{claim} from API server: {e}"
        ))
    })?;
    if let Some(uid) = wanted.owner {
        check_owner(ns, claim, &pvc, wanted.pod, uid).map_err(set_up)?;
    }
    let pv_name = check_claim(ns, claim, &pvc).map_err(set_up)?;
    let pv = api.persistent_volume(pv_name).await.map_err(|e| {
        set_up(format!(
            "failed to fetch PV {pv_name:?} from API server: {e}"
        ))
    })?;
    let claim_uid = pvc.metadata.uid.as_deref().unwrap_or_default();
    persistent_source(wanted, &pv, claim_uid, node)
}

/// An ephemeral volume's claim `ns/name` must be controlled by its pod (`pod`, UID `uid`), as
/// the ephemeral volume controller makes it: else the kubelet's reason.
pub fn check_owner(
    ns: &str,
    name: &str,
    pvc: &PersistentVolumeClaim,
    pod: &str,
    uid: &str,
) -> Result<(), String> {
    let controlled = pvc
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid);
    if controlled {
        Ok(())
    } else {
        Err(format!(
            "PVC {ns}/{name} was not created for pod {ns}/{pod} (pod is not owner)"
        ))
    }
}

/// The name of the PersistentVolume claim `ns/name` is bound to, or the kubelet's reason why it
/// cannot be used yet.
pub fn check_claim<'a>(
    ns: &str,
    name: &str,
    pvc: &'a PersistentVolumeClaim,
) -> Result<&'a str, String> {
    if pvc.metadata.deletion_timestamp.is_some() {
        return Err(format!(
            "can't start pod because PVC {ns}/{name} is being deleted"
        ));
    }
    let phase = pvc
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default();
    let volume = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .unwrap_or_default();
    if phase != "Bound" || volume.is_empty() {
        return Err(format!(
            "PVC {ns}/{name} has non-bound phase ({phase:?}) or empty pvc.Spec.VolumeName ({volume:?})"
        ));
    }
    Ok(volume)
}

/// What backs PersistentVolume `pv` for the claim whose UID is `claim_uid`, checked as the
/// kubelet checks it: bound to that claim, `Filesystem` mode, node affinity matching `node`'s
/// labels (as the kubelet matches it: on labels alone, so a `matchFields` term never matches),
/// and a `local` or `hostPath` volume without mount options.
pub fn persistent_source(
    wanted: Wanted<'_>,
    pv: &PersistentVolume,
    claim_uid: &str,
    node: &admission::Node,
) -> Result<Source, Error> {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    let processing = |message: String| Error::SetUp {
        volume: wanted.volume.to_owned(),
        message: format!(
            "error processing PVC {}/{}: {message}",
            wanted.namespace, wanted.claim
        ),
    };
    let failed = |message: String| Error::SetUp {
        volume: wanted.volume.to_owned(),
        message,
    };
    let Some(spec) = pv.spec.as_ref() else {
        return Err(processing(format!(
            "found PV object {name:?} without a spec"
        )));
    };
    let Some(claim_ref) = spec.claim_ref.as_ref() else {
        return Err(processing(format!(
            "found PV object {name:?} but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim"
        )));
    };
    let bound_to = claim_ref.uid.as_deref().unwrap_or_default();
    if bound_to != claim_uid {
        return Err(processing(format!(
            "found PV object {name:?} but its pv.Spec.ClaimRef.UID ({bound_to:?}) does not point to claim.UID ({claim_uid:?})"
        )));
    }
    if !super::is_dns_subdomain(name) {
        return Err(processing(format!(
            "PV name {name:?} is not an object name"
        )));
    }
    let mode = spec.volume_mode.as_deref().unwrap_or("Filesystem");
    if mode != "Filesystem" {
        return Err(if wanted.mounted {
            processing(format!(
                "Volume {:?} has volumeMode {mode:?}, but is specified in volumeMounts for pod {}/{}",
                wanted.volume, wanted.namespace, wanted.pod
            ))
        } else {
            processing(format!(
                "PV {name:?} has volumeMode {mode:?}: raw block volumes are not supported by swiftlet yet"
            ))
        });
    }
    let required = spec
        .node_affinity
        .as_ref()
        .and_then(|a| a.required.as_ref());
    if let Some(selector) = required {
        let labels_only = admission::Node {
            labels: node.labels.clone(),
            ..Default::default()
        };
        if !admission::node_selector_matches(selector, &labels_only) {
            return Err(failed(format!(
                "MountVolume.NodeAffinity check failed for PV {name:?}: no matching NodeSelectorTerms"
            )));
        }
    }
    if spec.mount_options.as_ref().is_some_and(|o| !o.is_empty()) {
        return Err(failed(format!(
            "PV {name:?}: mount options are not supported for this volume type"
        )));
    }
    let backing = match (&spec.local, &spec.host_path) {
        (Some(l), None) => Backing::Local(
            checked_path(&l.path)
                .map_err(|why| failed(format!("PV {name:?}: local.path {:?} {why}", l.path)))?,
        ),
        (None, Some(h)) => {
            let kind = HostPathType::parse(h.type_.as_deref().unwrap_or("")).ok_or_else(|| {
                failed(format!(
                    "PV {name:?}: hostPath.type {:?} is not a type",
                    h.type_
                ))
            })?;
            let path = checked_path(&h.path)
                .map_err(|why| failed(format!("PV {name:?}: hostPath.path {:?} {why}", h.path)))?;
            Backing::HostPath { path, kind }
        }
        _ => {
            return Err(failed(format!(
                "PV {name:?}: {} PersistentVolumes are not supported by swiftlet yet (local and hostPath are)",
                pv_type(pv)
            )));
        }
    };
    // A volume that only allows reading is mounted read-only, whatever the pod says.
    let modes = spec.access_modes.as_deref().unwrap_or_default();
    let read_only_many = !modes.is_empty() && modes.iter().all(|m| m == "ReadOnlyMany");
    Ok(Source::Persistent {
        pv: name.to_owned(),
        read_only: wanted.read_only || read_only_many,
        backing,
    })
}

/// An absolute path without `..`, or why not.
fn checked_path(path: &str) -> Result<PathBuf, &'static str> {
    if !path.starts_with('/') {
        return Err("is not an absolute path");
    }
    if has_backsteps(path) {
        return Err("must not contain '..'");
    }
    Ok(PathBuf::from(path))
}

/// The type of a PersistentVolume swiftlet cannot mount, by its field name.
fn pv_type(pv: &PersistentVolume) -> &'static str {
    let Some(s) = pv.spec.as_ref() else {
        return "untyped";
    };
    let set = [
        ("csi", s.csi.is_some()),
        ("nfs", s.nfs.is_some()),
        ("iscsi", s.iscsi.is_some()),
        ("fc", s.fc.is_some()),
        ("rbd", s.rbd.is_some()),
        ("cephfs", s.cephfs.is_some()),
        ("glusterfs", s.glusterfs.is_some()),
        ("flexVolume", s.flex_volume.is_some()),
        ("awsElasticBlockStore", s.aws_elastic_block_store.is_some()),
        ("gcePersistentDisk", s.gce_persistent_disk.is_some()),
        ("azureDisk", s.azure_disk.is_some()),
        ("azureFile", s.azure_file.is_some()),
        ("cinder", s.cinder.is_some()),
        ("vsphereVolume", s.vsphere_volume.is_some()),
        (
            "local and hostPath",
            s.local.is_some() && s.host_path.is_some(),
        ),
    ];
    set.into_iter()
        .find(|(_, on)| *on)
        .map_or("untyped or other", |(t, _)| t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pvc(v: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(v).unwrap()
    }

    fn pv(v: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(v).unwrap()
    }

    const WANTED: Wanted<'static> = Wanted {
        namespace: "default",
        pod: "db",
        volume: "data",
        claim: "data",
        read_only: false,
        mounted: true,
        owner: None,
    };

    fn node() -> admission::Node {
        admission::Node {
            name: "n1".into(),
            labels: [("kubernetes.io/hostname".to_owned(), "n1".to_owned())].into(),
            ..Default::default()
        }
    }

    fn local_pv(extra: serde_json::Value) -> PersistentVolume {
        let mut v = json!({
            "metadata": {"name": "pv-1"},
            "spec": {
                "claimRef": {"namespace": "default", "name": "data", "uid": "u-1"},
                "local": {"path": "/mnt/disks/one"},
                "accessModes": ["ReadWriteOnce"],
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}
                ]}]}},
            },
        });
        for (k, x) in extra.as_object().unwrap() {
            v["spec"][k] = x.clone();
        }
        pv(v)
    }

    fn message(e: Error) -> String {
        e.to_string()
    }

    #[test]
    fn a_claim_is_used_only_once_bound_and_while_not_being_deleted() {
        let pending = pvc(json!({"metadata": {"name": "data"}, "status": {"phase": "Pending"}}));
        assert_eq!(
            check_claim("default", "data", &pending).unwrap_err(),
            "PVC default/data has non-bound phase (\"Pending\") or empty pvc.Spec.VolumeName (\"\")"
        );
        let bound = pvc(
            json!({"metadata": {"name": "data"}, "spec": {"volumeName": "pv-1"},
            "status": {"phase": "Bound"}}),
        );
        assert_eq!(check_claim("default", "data", &bound), Ok("pv-1"));
        let going = pvc(json!({"metadata": {"name": "data",
            "deletionTimestamp": "2026-12-07T00:00:00Z"}, "spec": {"volumeName": "pv-1"},
            "status": {"phase": "Bound"}}));
        assert_eq!(
            check_claim("default", "data", &going).unwrap_err(),
            "can't start pod because PVC default/data is being deleted"
        );
    }

    #[test]
    fn an_ephemeral_volumes_claim_must_be_the_pods_own() {
        let owned = |uid: &str, controller: bool| {
            pvc(
                json!({"metadata": {"name": "web-scratch", "ownerReferences": [{
                    "apiVersion": "v1", "kind": "Pod", "name": "web", "uid": uid,
                    "controller": controller,
                }]}}),
            )
        };
        assert_eq!(
            check_owner("default", "web-scratch", &owned("p-1", true), "web", "p-1"),
            Ok(())
        );
        let want = "PVC default/web-scratch was not created for pod default/web (pod is not owner)";
        for other in [owned("p-2", true), owned("p-1", false), pvc(json!({}))] {
            assert_eq!(
                check_owner("default", "web-scratch", &other, "web", "p-1").unwrap_err(),
                want
            );
        }
    }

    #[test]
    fn a_local_volume_bound_to_the_claim_and_this_node_is_mounted_from_its_path() {
        let got = persistent_source(WANTED, &local_pv(json!({})), "u-1", &node()).unwrap();
        assert_eq!(
            got,
            Source::Persistent {
                pv: "pv-1".into(),
                read_only: false,
                backing: Backing::Local("/mnt/disks/one".into()),
            }
        );
        // Read-only when the pod says so, or when the volume allows nothing else.
        let ro = Wanted {
            read_only: true,
            ..WANTED
        };
        let got = persistent_source(ro, &local_pv(json!({})), "u-1", &node()).unwrap();
        assert!(matches!(
            got,
            Source::Persistent {
                read_only: true,
                ..
            }
        ));
        let rox = local_pv(json!({"accessModes": ["ReadOnlyMany"]}));
        let got = persistent_source(WANTED, &rox, "u-1", &node()).unwrap();
        assert!(matches!(
            got,
            Source::Persistent {
                read_only: true,
                ..
            }
        ));
    }

    #[test]
    fn a_volume_of_another_claim_node_mode_or_type_is_refused_with_the_reason() {
        let other_claim =
            message(persistent_source(WANTED, &local_pv(json!({})), "u-2", &node()).unwrap_err());
        assert!(
            other_claim
                .contains("pv.Spec.ClaimRef.UID (\"u-1\") does not point to claim.UID (\"u-2\")"),
            "{other_claim}"
        );
        let unbound = local_pv(json!({"claimRef": null}));
        let e = message(persistent_source(WANTED, &unbound, "u-1", &node()).unwrap_err());
        assert!(e.contains("nil pv.Spec.ClaimRef"), "{e}");

        let elsewhere = admission::Node {
            labels: [("kubernetes.io/hostname".to_owned(), "n2".to_owned())].into(),
            ..node()
        };
        let e = message(
            persistent_source(WANTED, &local_pv(json!({})), "u-1", &elsewhere).unwrap_err(),
        );
        assert!(
            e.contains("NodeAffinity check failed for PV \"pv-1\": no matching NodeSelectorTerms"),
            "{e}"
        );
        // As the kubelet matches a volume's affinity: on labels alone.
        let by_name = local_pv(json!({"nodeAffinity": {"required": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
        ]}}}));
        assert!(persistent_source(WANTED, &by_name, "u-1", &node()).is_err());

        let block = local_pv(json!({"volumeMode": "Block"}));
        let e = message(persistent_source(WANTED, &block, "u-1", &node()).unwrap_err());
        assert!(
            e.contains("Volume \"data\" has volumeMode \"Block\", but is specified in volumeMounts for pod default/db"),
            "{e}"
        );
        let nfs = local_pv(json!({"local": null, "nfs": {"server": "s", "path": "/x"}}));
        let e = message(persistent_source(WANTED, &nfs, "u-1", &node()).unwrap_err());
        assert!(e.contains("nfs PersistentVolumes are not supported"), "{e}");
        let relative = local_pv(json!({"local": {"path": "disks/../one"}}));
        let e = message(persistent_source(WANTED, &relative, "u-1", &node()).unwrap_err());
        assert!(e.contains("is not an absolute path"), "{e}");
        let options = local_pv(json!({"mountOptions": ["noatime"]}));
        let e = message(persistent_source(WANTED, &options, "u-1", &node()).unwrap_err());
        assert!(e.contains("mount options are not supported"), "{e}");
    }

    #[test]
    fn a_host_path_volume_keeps_its_type() {
        let h = local_pv(json!({"local": null,
            "hostPath": {"path": "/srv/data", "type": "DirectoryOrCreate"}}));
        let got = persistent_source(WANTED, &h, "u-1", &node()).unwrap();
        assert_eq!(
            got,
            Source::Persistent {
                pv: "pv-1".into(),
                read_only: false,
                backing: Backing::HostPath {
                    path: "/srv/data".into(),
                    kind: HostPathType::DirectoryOrCreate,
                },
            }
        );
    }
}
