//! The node authorizer's rule for the storage objects a node reads, as kube-apiserver's
//! graph-based node authorizer applies it to a node's credentials (`system:node:<name>`): a
//! node may get a PersistentVolumeClaim only when a pod bound to it uses the claim (a
//! `persistentVolumeClaim` volume naming it, or a generic `ephemeral` volume, whose claim is
//! `<pod>-<volume>`), and a PersistentVolume only when such a claim is bound to it. Anything
//! else is 403 with the authorizer's reason.
use k8s_openapi::api::core::v1::Pod;

use super::Store;

/// What a GET of `path` by node `node` reads that the node authorizer guards: `Some(reason)`
/// when it refuses, `None` when it allows (or does not guard the path).
pub(super) fn refuses(s: &Store, node: &str, path: &str) -> Option<String> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let allowed = match parts.as_slice() {
        [
            "api",
            "v1",
            "namespaces",
            ns,
            "persistentvolumeclaims",
            name,
        ] => claims_of_node(s, node).any(|(n, c)| n == *ns && c == *name),
        ["api", "v1", "persistentvolumes", name] => claims_of_node(s, node).any(|(ns, claim)| {
            s.objects
                .get(&("persistentvolumeclaims".to_owned(), ns, claim))
                .is_some_and(|pvc| pvc["spec"]["volumeName"] == *name)
        }),
        _ => return None,
    };
    (!allowed).then(|| {
        let (resource, name) = (parts[parts.len() - 2], parts[parts.len() - 1]);
        format!(
            "{resource} \"{name}\" is forbidden: User \"system:node:{node}\" cannot get resource \
             \"{resource}\" in API group \"\": no relationship found between node '{node}' and \
             this object"
        )
    })
}

/// (namespace, claim) of every claim the pods bound to `node` use.
fn claims_of_node<'a>(s: &'a Store, node: &'a str) -> impl Iterator<Item = (String, String)> + 'a {
    s.pods
        .values()
        .filter(move |p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .flat_map(claims_of)
}

fn claims_of(pod: &Pod) -> Vec<(String, String)> {
    let ns = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let name = pod.metadata.name.clone().unwrap_or_default();
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| match (&v.persistent_volume_claim, &v.ephemeral) {
            (Some(c), _) => Some(c.claim_name.clone()),
            (None, Some(_)) => Some(format!("{name}-{}", v.name)),
            (None, None) => None,
        })
        .map(|claim| (ns.clone(), claim))
        .collect()
}
