//! The one rule static pods (from files or the manifest URL) follow about API objects: they may
//! not reference any. A static pod runs without the API server (it may be the API server), and
//! its mirror pod would be refused by the API server's node restriction anyway. The kubelet's
//! file and HTTP sources reject such a pod while decoding it, with `static pods may not
//! reference <resource>`; [`api_reference`] names the resource as the kubelet's check does, in
//! the same order: the service account, then secrets, configMaps, resource claims, then the
//! volume types that need the API (persistent volume claims, CSI drivers ...).
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, Volume};
use std::collections::BTreeSet;

/// The resource (plural, as the kubelet names it) of the first API object `pod` references, or
/// `None` when it references none.
pub fn api_reference(pod: &Pod) -> Option<&'static str> {
    let spec = pod.spec.as_ref()?;
    if spec
        .service_account_name
        .as_deref()
        .is_some_and(|s| !s.is_empty())
        || spec
            .service_account
            .as_deref()
            .is_some_and(|s| !s.is_empty())
    {
        return Some("serviceaccounts");
    }
    if references_secrets(spec) {
        return Some("secrets");
    }
    if references_config_maps(spec) {
        return Some("configmaps");
    }
    if spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty()) {
        return Some("resourceclaims");
    }
    spec.volumes.iter().flatten().find_map(volume_reference)
}

fn containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
}

fn references_secrets(spec: &PodSpec) -> bool {
    let pull = spec
        .image_pull_secrets
        .as_ref()
        .is_some_and(|s| !s.is_empty());
    let env = containers(spec).any(|c| {
        c.env.iter().flatten().any(|e| {
            e.value_from
                .as_ref()
                .is_some_and(|v| v.secret_key_ref.is_some())
        }) || c.env_from.iter().flatten().any(|e| e.secret_ref.is_some())
    });
    let volumes = spec.volumes.iter().flatten().any(|v| {
        v.secret.is_some()
            || v.azure_file.is_some()
            || v.cephfs.as_ref().is_some_and(|c| c.secret_ref.is_some())
            || v.cinder.as_ref().is_some_and(|c| c.secret_ref.is_some())
            || v.flex_volume
                .as_ref()
                .is_some_and(|c| c.secret_ref.is_some())
            || v.rbd.as_ref().is_some_and(|c| c.secret_ref.is_some())
            || v.scale_io.is_some()
            || v.iscsi.as_ref().is_some_and(|c| c.secret_ref.is_some())
            || v.storageos.as_ref().is_some_and(|c| c.secret_ref.is_some())
            || v.csi
                .as_ref()
                .is_some_and(|c| c.node_publish_secret_ref.is_some())
            || v.projected
                .iter()
                .flat_map(|p| p.sources.iter().flatten())
                .any(|s| s.secret.is_some())
    });
    pull || env || volumes
}

fn references_config_maps(spec: &PodSpec) -> bool {
    let env = containers(spec).any(|c| {
        c.env.iter().flatten().any(|e| {
            e.value_from
                .as_ref()
                .is_some_and(|v| v.config_map_key_ref.is_some())
        }) || c
            .env_from
            .iter()
            .flatten()
            .any(|e| e.config_map_ref.is_some())
    });
    let volumes = spec.volumes.iter().flatten().any(|v| {
        v.config_map.is_some()
            || v.projected
                .iter()
                .flat_map(|p| p.sources.iter().flatten())
                .any(|s| s.config_map.is_some())
    });
    env || volumes
}

/// The kubelet's volume part of the check: the types that need an API object.
fn volume_reference(v: &Volume) -> Option<&'static str> {
    if v.config_map.is_some() {
        Some("configmaps (via configmap volumes)")
    } else if v.secret.is_some() {
        Some("secrets (via secret volumes)")
    } else if v.csi.is_some() {
        Some("csidrivers (via CSI volumes)")
    } else if v.glusterfs.is_some() {
        Some("endpoints (via glusterFS volumes)")
    } else if v.persistent_volume_claim.is_some() {
        Some("persistentvolumeclaims")
    } else if v.ephemeral.is_some() {
        Some("persistentvolumeclaims (via ephemeral volumes)")
    } else if v.azure_file.is_some() {
        Some("secrets (via azureFile volumes)")
    } else {
        v.projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten())
            .find_map(|s| {
                if s.config_map.is_some() {
                    Some("configmaps (via projected volumes)")
                } else if s.secret.is_some() {
                    Some("secrets (via projected volumes)")
                } else if s.service_account_token.is_some() {
                    Some("serviceaccounts (via projected volumes)")
                } else if s.cluster_trust_bundle.is_some() {
                    Some("clustertrustbundles")
                } else {
                    None
                }
            })
    }
}

/// The configMaps and secrets a pod names, each once.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Named {
    pub config_maps: BTreeSet<String>,
    pub secrets: BTreeSet<String>,
}

impl Named {
    pub fn is_empty(&self) -> bool {
        self.config_maps.is_empty() && self.secrets.is_empty()
    }
}

/// The configMaps and secrets `pod` names in its volumes (configMap, secret and projected),
/// its containers' `env` and `envFrom` and its `imagePullSecrets`: the objects the agent reads
/// for it while it exists.
pub fn named_objects(pod: &Pod) -> Named {
    let mut out = Named::default();
    let Some(spec) = pod.spec.as_ref() else {
        return out;
    };
    let mut config_map = |n: &str| {
        if !n.is_empty() {
            out.config_maps.insert(n.to_owned());
        }
    };
    let mut secrets = BTreeSet::new();
    let mut secret = |n: &str| {
        if !n.is_empty() {
            secrets.insert(n.to_owned());
        }
    };
    for s in spec.image_pull_secrets.iter().flatten() {
        secret(&s.name);
    }
    for c in containers(spec) {
        for v in c.env.iter().flatten().filter_map(|e| e.value_from.as_ref()) {
            if let Some(r) = &v.config_map_key_ref {
                config_map(&r.name);
            }
            if let Some(r) = &v.secret_key_ref {
                secret(&r.name);
            }
        }
        for e in c.env_from.iter().flatten() {
            if let Some(r) = &e.config_map_ref {
                config_map(&r.name);
            }
            if let Some(r) = &e.secret_ref {
                secret(&r.name);
            }
        }
    }
    for v in spec.volumes.iter().flatten() {
        if let Some(c) = &v.config_map {
            config_map(&c.name);
        }
        if let Some(n) = v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) {
            secret(n);
        }
        for p in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(c) = &p.config_map {
                config_map(&c.name);
            }
            if let Some(s) = &p.secret {
                secret(&s.name);
            }
        }
    }
    out.secrets = secrets;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        spec.as_object_mut()
            .expect("object")
            .entry("containers")
            .or_insert_with(|| json!([{"name": "c", "image": "i"}]));
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).expect("pod")
    }

    fn with_container(c: serde_json::Value) -> Pod {
        let mut c = c;
        c["name"] = json!("c");
        c["image"] = json!("i");
        pod(json!({"containers": [c]}))
    }

    #[test]
    fn each_kind_of_reference_is_named_as_the_kubelet_names_it() {
        let cases = [
            (
                pod(json!({"volumes": [{"name": "v", "configMap": {"name": "m"}}]})),
                "configmaps",
            ),
            (
                pod(json!({"volumes": [{"name": "v", "secret": {"secretName": "s"}}]})),
                "secrets",
            ),
            (
                pod(json!({"volumes": [{"name": "v", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "t"}}]}}]})),
                "serviceaccounts (via projected volumes)",
            ),
            (
                pod(json!({"volumes": [{"name": "v", "projected": {"sources": [
                    {"secret": {"name": "s"}}]}}]})),
                "secrets",
            ),
            (
                with_container(json!({"env": [{"name": "A", "valueFrom":
                    {"configMapKeyRef": {"name": "m", "key": "k"}}}]})),
                "configmaps",
            ),
            (
                with_container(json!({"env": [{"name": "A", "valueFrom":
                    {"secretKeyRef": {"name": "s", "key": "k"}}}]})),
                "secrets",
            ),
            (
                with_container(json!({"envFrom": [{"configMapRef": {"name": "m"}}]})),
                "configmaps",
            ),
            (
                with_container(json!({"envFrom": [{"secretRef": {"name": "s"}}]})),
                "secrets",
            ),
            (pod(json!({"serviceAccountName": "sa"})), "serviceaccounts"),
            (pod(json!({"imagePullSecrets": [{"name": "r"}]})), "secrets"),
            (
                pod(
                    json!({"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]}),
                ),
                "persistentvolumeclaims",
            ),
        ];
        for (p, want) in cases {
            assert_eq!(api_reference(&p), Some(want), "{:?}", p.spec);
        }
    }

    #[test]
    fn pods_without_references_pass() {
        let p = pod(json!({"volumes": [
            {"name": "e", "emptyDir": {}},
            {"name": "h", "hostPath": {"path": "/x"}},
            {"name": "d", "downwardAPI": {"items": [{"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]}},
            {"name": "p", "projected": {"sources": [{"downwardAPI": {"items": []}}]}},
        ]}));
        assert_eq!(api_reference(&p), None);
        let env = with_container(json!({"env": [{"name": "A", "value": "1"},
            {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}));
        assert_eq!(api_reference(&env), None);
    }

    #[test]
    fn named_objects_lists_each_config_map_and_secret_once() {
        let p = pod(json!({
            "imagePullSecrets": [{"name": "pull"}],
            "containers": [{"name": "c", "image": "i",
                "env": [
                    {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "env-cm", "key": "k"}}},
                    {"name": "B", "valueFrom": {"secretKeyRef": {"name": "env-s", "key": "k"}}},
                    {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                "envFrom": [{"configMapRef": {"name": "from-cm"}}, {"secretRef": {"name": "env-s"}}]}],
            "initContainers": [{"name": "i", "image": "i",
                "envFrom": [{"configMapRef": {"name": "init-cm"}}]}],
            "volumes": [
                {"name": "a", "configMap": {"name": "vol-cm"}},
                {"name": "b", "secret": {"secretName": "vol-s"}},
                {"name": "c", "projected": {"sources": [
                    {"configMap": {"name": "vol-cm"}},
                    {"secret": {"name": "proj-s"}},
                    {"serviceAccountToken": {"path": "t"}}]}},
                {"name": "d", "emptyDir": {}}],
        }));
        let n = named_objects(&p);
        assert_eq!(
            n.config_maps.iter().collect::<Vec<_>>(),
            ["env-cm", "from-cm", "init-cm", "vol-cm"]
        );
        assert_eq!(
            n.secrets.iter().collect::<Vec<_>>(),
            ["env-s", "proj-s", "pull", "vol-s"]
        );
        assert!(named_objects(&pod(json!({}))).is_empty());
    }
}
