//! Nothing in a pod spec is silently ignored. Every field of the v1 `PodSpec`, `Container`,
//! `SecurityContext` and `PodSecurityContext` is listed here with what swiftlet does with it:
//! implements it, has no use for it on a node (with the reason), or refuses a pod that sets it,
//! before anything is created in the runtime, with a reason naming the field. A unit test walks
//! the fields of the k8s-openapi types and fails on any field missing from these tables, so a
//! field added by a newer API version cannot slip through unnoticed.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

/// What swiftlet does with one field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Applied as the kubelet applies it.
    Implemented,
    /// Means nothing on a node (the reason says why); the kubelet does not act on it either.
    NotForTheNode(&'static str),
    /// A pod that sets it (to a value that needs work swiftlet cannot do yet) is refused by
    /// [`check`], naming the field.
    Refused,
}

const SCHEDULING: Use = Use::NotForTheNode("scheduling: decided before the pod reaches the node");

/// `PodSpec`.
pub const POD_SPEC: &[(&str, Use)] = &[
    ("activeDeadlineSeconds", Use::Implemented),
    ("affinity", SCHEDULING),
    (
        "automountServiceAccountToken",
        Use::NotForTheNode(
            "the API server's service account admission turns it into a projected volume, which swiftlet writes",
        ),
    ),
    ("containers", Use::Implemented),
    // The pod's resolv.conf, formed as the kubelet forms it (`crate::dns`).
    ("dnsConfig", Use::Implemented),
    ("dnsPolicy", Use::Implemented),
    // Service link variables (`runtime::env`), from the API server's services.
    ("enableServiceLinks", Use::Implemented),
    ("ephemeralContainers", Use::Refused),
    // Entries of the pod's managed /etc/hosts (`crate::dns::hosts`).
    ("hostAliases", Use::Implemented),
    ("hostIPC", Use::Implemented),
    ("hostNetwork", Use::Implemented),
    ("hostPID", Use::Implemented),
    ("hostUsers", Use::Implemented),
    ("hostname", Use::Implemented),
    ("imagePullSecrets", Use::Implemented),
    ("initContainers", Use::Implemented),
    ("nodeName", SCHEDULING),
    ("nodeSelector", SCHEDULING),
    ("os", Use::Refused),
    ("overhead", Use::Implemented),
    ("preemptionPolicy", SCHEDULING),
    ("priority", SCHEDULING),
    ("priorityClassName", SCHEDULING),
    ("readinessGates", Use::Refused),
    ("resourceClaims", Use::Refused),
    ("resources", Use::Refused),
    ("restartPolicy", Use::Implemented),
    ("runtimeClassName", Use::Implemented),
    ("schedulerName", SCHEDULING),
    ("schedulingGates", SCHEDULING),
    ("securityContext", Use::Implemented),
    (
        "serviceAccount",
        Use::NotForTheNode("the deprecated alias of serviceAccountName"),
    ),
    // The account whose tokens projected serviceAccountToken sources request.
    ("serviceAccountName", Use::Implemented),
    ("setHostnameAsFQDN", Use::Refused),
    ("shareProcessNamespace", Use::Implemented),
    // The pod's FQDN in its managed /etc/hosts (`crate::dns::hosts`).
    ("subdomain", Use::Implemented),
    ("terminationGracePeriodSeconds", Use::Implemented),
    ("tolerations", SCHEDULING),
    ("topologySpreadConstraints", SCHEDULING),
    // emptyDir, hostPath, configMap, secret, downwardAPI, projected (configMap, secret,
    // downwardAPI and serviceAccountToken sources), persistentVolumeClaim and ephemeral (their
    // claim bound to a local or hostPath PersistentVolume) are implemented (`crate::volume`); every other type (and
    // projected clusterTrustBundle) is refused by `volume::unsupported`, naming it.
    ("volumes", Use::Refused),
];

/// `Container` (app, init and sidecar containers alike).
pub const CONTAINER: &[(&str, Use)] = &[
    ("args", Use::Implemented),
    ("command", Use::Implemented),
    // value, and valueFrom's fieldRef, resourceFieldRef, configMapKeyRef and secretKeyRef
    // (`runtime::env`).
    ("env", Use::Implemented),
    ("envFrom", Use::Implemented),
    ("image", Use::Implemented),
    ("imagePullPolicy", Use::Implemented),
    // postStart and preStop (exec, httpGet, sleep; tcpSocket, kept by the API for compatibility
    // only, fails when run as in the kubelet) are implemented (`runtime::hooks`); stopSignal is
    // refused.
    ("lifecycle", Use::Refused),
    ("livenessProbe", Use::Implemented),
    ("name", Use::Implemented),
    ("ports", Use::Implemented),
    ("readinessProbe", Use::Implemented),
    // NotRequired (in-place) is implemented; RestartContainer is refused.
    ("resizePolicy", Use::Refused),
    // requests and limits are implemented; claims are refused.
    ("resources", Use::Refused),
    ("restartPolicy", Use::Implemented),
    ("securityContext", Use::Implemented),
    ("startupProbe", Use::Implemented),
    ("stdin", Use::Implemented),
    ("stdinOnce", Use::Implemented),
    ("terminationMessagePath", Use::Implemented),
    ("terminationMessagePolicy", Use::Implemented),
    ("tty", Use::Implemented),
    ("volumeDevices", Use::Refused),
    // readOnly, subPath and mountPropagation are implemented; subPathExpr and recursiveReadOnly
    // are refused.
    ("volumeMounts", Use::Refused),
    ("workingDir", Use::Implemented),
];

/// `SecurityContext` (per container): applied or refused by `runtime::security`.
pub const SECURITY_CONTEXT: &[(&str, Use)] = &[
    ("allowPrivilegeEscalation", Use::Implemented),
    ("appArmorProfile", Use::Implemented),
    ("capabilities", Use::Implemented),
    ("privileged", Use::Implemented),
    ("procMount", Use::Implemented),
    ("readOnlyRootFilesystem", Use::Implemented),
    ("runAsGroup", Use::Implemented),
    ("runAsNonRoot", Use::Implemented),
    ("runAsUser", Use::Implemented),
    ("seLinuxOptions", Use::Implemented),
    ("seccompProfile", Use::Implemented),
    ("windowsOptions", Use::NotForTheNode("Windows only")),
];

/// `PodSecurityContext`: applied or refused by `runtime::security`.
pub const POD_SECURITY_CONTEXT: &[(&str, Use)] = &[
    ("appArmorProfile", Use::Implemented),
    ("fsGroup", Use::Implemented),
    // `OnRootMismatch` skips the ownership walk of a claim's volume whose root is right
    // already (`volume::ownership`); an emptyDir's root alone is given to the fsGroup at each
    // set-up either way.
    ("fsGroupChangePolicy", Use::Implemented),
    ("runAsGroup", Use::Implemented),
    ("runAsNonRoot", Use::Implemented),
    ("runAsUser", Use::Implemented),
    (
        "seLinuxChangePolicy",
        Use::NotForTheNode(
            "the runtime relabels emptyDir mounts (CRI selinux_relabel, as the kubelet asks); hostPath is never relabelled",
        ),
    ),
    ("seLinuxOptions", Use::Implemented),
    ("seccompProfile", Use::Implemented),
    ("supplementalGroups", Use::Implemented),
    ("supplementalGroupsPolicy", Use::Implemented),
    ("sysctls", Use::Implemented),
    ("windowsOptions", Use::NotForTheNode("Windows only")),
];

/// The first field of `pod` that swiftlet cannot honour, as `field (why)`; `None` when every
/// field it sets is implemented or means nothing on a node.
pub fn check(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    check_spec(spec).or_else(|| {
        let init = spec.init_containers.iter().flatten();
        spec.containers
            .iter()
            .chain(init)
            .find_map(|c| check_container(c).map(|what| format!("container {}: {what}", c.name)))
    })
}

fn non_empty<T>(v: &Option<Vec<T>>) -> bool {
    v.as_ref().is_some_and(|v| !v.is_empty())
}

fn check_spec(spec: &PodSpec) -> Option<String> {
    let refused = |what: &str| Some(what.to_owned());
    if non_empty(&spec.ephemeral_containers) {
        return refused("spec.ephemeralContainers");
    }
    if let Some(os) = &spec.os
        && os.name != "linux"
    {
        return Some(format!("spec.os.name {:?} on a Linux node", os.name));
    }
    if non_empty(&spec.readiness_gates) {
        return refused("spec.readinessGates");
    }
    if non_empty(&spec.resource_claims) {
        return refused("spec.resourceClaims");
    }
    if spec.resources.is_some() {
        return refused("spec.resources (pod-level resources)");
    }
    if spec.set_hostname_as_fqdn == Some(true) {
        return refused("spec.setHostnameAsFQDN");
    }
    crate::volume::unsupported(spec).map(|what| format!("spec.volumes: {what}"))
}

fn check_container(c: &Container) -> Option<String> {
    if c.lifecycle
        .as_ref()
        .is_some_and(|l| l.stop_signal.is_some())
    {
        return Some("lifecycle.stopSignal".to_owned());
    }
    if let Some(p) = c
        .resize_policy
        .iter()
        .flatten()
        .find(|p| p.restart_policy != "NotRequired")
    {
        return Some(format!(
            "resizePolicy {} {} (resizes are done in place)",
            p.resource_name, p.restart_policy
        ));
    }
    if c.resources.as_ref().is_some_and(|r| non_empty(&r.claims)) {
        return Some("resources.claims".to_owned());
    }
    if non_empty(&c.volume_devices) {
        return Some("volumeDevices".to_owned());
    }
    crate::volume::unsupported_mount(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::{self, Visitor};

    /// A deserializer that only records the field names a type asks for.
    struct FieldNames(std::cell::RefCell<Vec<&'static str>>);

    #[derive(Debug)]
    struct Stop;

    impl std::fmt::Display for Stop {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("field names recorded")
        }
    }

    impl std::error::Error for Stop {}

    impl de::Error for Stop {
        fn custom<T: std::fmt::Display>(_: T) -> Self {
            Stop
        }
    }

    impl<'de> de::Deserializer<'de> for &FieldNames {
        type Error = Stop;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            self.0.borrow_mut().extend_from_slice(fields);
            Err(Stop)
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }

    /// The field names of `T` as its (k8s-openapi) deserializer declares them.
    fn fields_of<T: for<'de> serde::Deserialize<'de>>() -> Vec<&'static str> {
        let names = FieldNames(std::cell::RefCell::default());
        let _ = T::deserialize(&names);
        names.0.into_inner()
    }

    fn assert_covers(type_name: &str, fields: &[&str], table: &[(&str, Use)]) {
        assert!(!fields.is_empty(), "{type_name}: no fields recorded");
        for f in fields {
            let n = table.iter().filter(|(name, _)| name == f).count();
            assert_eq!(
                n, 1,
                "{type_name}.{f} is listed {n} times: say what swiftlet does with it"
            );
        }
        for (name, _) in table {
            assert!(
                fields.contains(name),
                "{type_name}.{name} is not a field of the type"
            );
        }
    }

    #[test]
    fn every_field_of_the_pod_spec_is_implemented_not_for_the_node_or_refused() {
        use k8s_openapi::api::core::v1;
        assert_covers("PodSpec", &fields_of::<v1::PodSpec>(), POD_SPEC);
        assert_covers("Container", &fields_of::<v1::Container>(), CONTAINER);
        assert_covers(
            "SecurityContext",
            &fields_of::<v1::SecurityContext>(),
            SECURITY_CONTEXT,
        );
        assert_covers(
            "PodSecurityContext",
            &fields_of::<v1::PodSecurityContext>(),
            POD_SECURITY_CONTEXT,
        );
    }

    fn pod(spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        let obj = spec.as_object_mut().expect("an object");
        obj.entry("containers")
            .or_insert_with(|| serde_json::json!([{"name": "c", "image": "x"}]));
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
            .expect("a pod")
    }

    fn container(fields: serde_json::Value) -> Pod {
        let mut c = serde_json::json!({"name": "c", "image": "x"});
        for (k, v) in fields.as_object().expect("an object") {
            c[k] = v.clone();
        }
        pod(serde_json::json!({ "containers": [c] }))
    }

    #[test]
    fn every_refused_field_is_refused_naming_it() {
        use serde_json::json;
        let pod_cases = [
            (
                "ephemeralContainers",
                json!({"ephemeralContainers": [{"name": "e", "image": "x"}]}),
            ),
            ("os", json!({"os": {"name": "windows"}})),
            (
                "readinessGates",
                json!({"readinessGates": [{"conditionType": "x"}]}),
            ),
            ("resourceClaims", json!({"resourceClaims": [{"name": "r"}]})),
            ("resources", json!({"resources": {"limits": {"cpu": "1"}}})),
            ("setHostnameAsFQDN", json!({"setHostnameAsFQDN": true})),
            (
                "volumes",
                json!({"volumes": [{"name": "v", "csi": {"driver": "d"}}]}),
            ),
        ];
        for (field, spec) in &pod_cases {
            let why =
                check(&pod(spec.clone())).unwrap_or_else(|| panic!("{field} was not refused"));
            assert!(why.contains(field), "{field}: {why}");
        }
        let container_cases = [
            (
                "lifecycle.stopSignal",
                json!({"lifecycle": {"postStart": {"exec": {"command": ["true"]}}, "stopSignal": "SIGUSR1"}}),
            ),
            (
                "resizePolicy",
                json!({"resizePolicy": [{"resourceName": "memory", "restartPolicy": "RestartContainer"}]}),
            ),
            (
                "resources.claims",
                json!({"resources": {"claims": [{"name": "r"}]}}),
            ),
            (
                "volumeDevices",
                json!({"volumeDevices": [{"name": "v", "devicePath": "/dev/x"}]}),
            ),
            (
                "volumeMounts",
                json!({"volumeMounts": [{"name": "v", "mountPath": "/v", "subPathExpr": "$(X)"}]}),
            ),
        ];
        for (field, fields) in &container_cases {
            let why = check(&container(fields.clone()))
                .unwrap_or_else(|| panic!("{field} was not refused"));
            assert!(
                why.contains(field) && why.starts_with("container c:"),
                "{field}: {why}"
            );
        }
        // Every refused field of the tables has a case above.
        for (name, u) in POD_SPEC {
            let covered = pod_cases.iter().any(|(f, _)| f == name);
            assert!(
                *u != Use::Refused || covered,
                "no refusal case for spec.{name}"
            );
        }
        for (name, u) in CONTAINER {
            let covered = container_cases.iter().any(|(f, _)| f.starts_with(name));
            assert!(
                *u != Use::Refused || covered,
                "no refusal case for container {name}"
            );
        }
    }

    #[test]
    fn what_is_implemented_passes() {
        use serde_json::json;
        let ok = pod(json!({
            "activeDeadlineSeconds": 30,
            "enableServiceLinks": false,
            "dnsPolicy": "None",
            "dnsConfig": {"nameservers": ["1.1.1.1"], "searches": ["a.example"], "options": [{"name": "ndots", "value": "2"}]},
            "hostAliases": [{"ip": "10.0.0.1", "hostnames": ["db.local"]}],
            "hostname": "h",
            "subdomain": "s",
            "imagePullSecrets": [{"name": "regcred"}],
            "runtimeClassName": "kata",
            "overhead": {"cpu": "100m", "memory": "32Mi"},
            "os": {"name": "linux"},
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"operator": "Exists"}],
            "initContainers": [{
                "name": "i", "image": "x",
                "lifecycle": {"postStart": {"sleep": {"seconds": 1}}, "preStop": {"tcpSocket": {"port": 1}}},
            }],
            "containers": [{
                "name": "c", "image": "x",
                "env": [
                    {"name": "A", "value": "1"},
                    {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "m", "key": "k"}}},
                ],
                "envFrom": [{"configMapRef": {"name": "m"}, "prefix": "M_"}, {"secretRef": {"name": "s"}}],
                "lifecycle": {
                    "postStart": {"exec": {"command": ["true"]}},
                    "preStop": {"httpGet": {"port": "web", "path": "/stop"}},
                },
                "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}],
                "resources": {"limits": {"cpu": "1"}},
                "volumeMounts": [
                    {"name": "scratch", "mountPath": "/s", "subPath": "a", "readOnly": true},
                    {"name": "mem", "mountPath": "/m", "recursiveReadOnly": "Disabled"},
                    {"name": "host", "mountPath": "/h", "mountPropagation": "HostToContainer"},
                ],
            }],
            "volumes": [
                {"name": "scratch", "emptyDir": {}},
                {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
                {"name": "host", "hostPath": {"path": "/var/log", "type": "Directory"}},
                {"name": "cm", "configMap": {"name": "m", "items": [{"key": "k", "path": "p"}]}},
                {"name": "s", "secret": {"secretName": "s", "defaultMode": 0o400}},
                {"name": "d", "downwardAPI": {"items": [
                    {"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]}},
                {"name": "p", "projected": {"sources": [
                    {"configMap": {"name": "m"}}, {"secret": {"name": "s"}},
                    {"serviceAccountToken": {"path": "token"}}]}},
            ],
        }));
        assert_eq!(check(&ok), None);
    }

    #[test]
    fn every_other_volume_type_is_refused_naming_it() {
        use serde_json::json;
        let cases = [
            (
                "projected source clusterTrustBundle",
                json!({"projected": {"sources": [{"clusterTrustBundle": {"name": "b", "path": "b"}}]}}),
            ),
            ("csi", json!({"csi": {"driver": "d"}})),
            ("image", json!({"image": {"reference": "x"}})),
            ("nfs", json!({"nfs": {"server": "s", "path": "/"}})),
            (
                "emptyDir medium \"HugePages\"",
                json!({"emptyDir": {"medium": "HugePages"}}),
            ),
        ];
        for (what, source) in cases {
            let mut v = json!({"name": "v"});
            for (k, val) in source.as_object().expect("an object") {
                v[k] = val.clone();
            }
            let why = check(&pod(json!({ "volumes": [v] })))
                .unwrap_or_else(|| panic!("{what} was not refused"));
            assert!(
                why.starts_with("spec.volumes: volume \"v\"") && why.contains(what),
                "{what}: {why}"
            );
        }
        let why = check(&container(json!({"volumeMounts": [
            {"name": "v", "mountPath": "/v", "recursiveReadOnly": "Enabled"}
        ]})))
        .expect("refused");
        assert!(why.contains("recursiveReadOnly"), "{why}");
    }
}
