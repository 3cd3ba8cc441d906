//! The example manifests (`examples/pods/*.yaml`) are valid pods using the local images, and
//! together they cover what the demo promises to show.

use k8s_openapi::api::core::v1::Pod;

fn examples() -> Vec<(String, Pod)> {
    let dir = xtask::workspace_root().join("examples/pods");
    let mut out: Vec<(String, Pod)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| {
            let text = std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
            let pod: Pod = serde_saphyr::from_str(&text)
                .unwrap_or_else(|e| panic!("{} is not a Pod: {e}", p.display()));
            (p.display().to_string(), pod)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn example_pods_are_valid_and_use_local_images() {
    let pods = examples();
    assert!((3..=6).contains(&pods.len()), "{} examples", pods.len());
    let mut names = std::collections::BTreeSet::new();
    for (path, pod) in &pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        assert!(!name.is_empty(), "{path}: no metadata.name");
        assert!(names.insert(name), "{path}: duplicate pod name");
        let spec = pod.spec.as_ref().unwrap();
        for c in &spec.containers {
            assert_eq!(c.image.as_deref(), Some(xtask::BUSYBOX_IMAGE), "{path}");
            let policy = c.image_pull_policy.as_deref();
            assert!(
                matches!(policy, Some("Never" | "IfNotPresent")),
                "{path}: imagePullPolicy {policy:?} would pull from a registry"
            );
        }
    }
    let specs: Vec<_> = pods.iter().map(|(_, p)| p.spec.as_ref().unwrap()).collect();
    assert!(
        specs.iter().any(|s| s.containers.len() >= 2),
        "a multi-container pod"
    );
    assert!(
        specs.iter().any(|s| s.host_network == Some(true)),
        "a hostNetwork pod"
    );
    assert!(
        specs.iter().any(|s| s.host_network != Some(true)
            && s.containers.iter().any(|c| c
                .command
                .iter()
                .flatten()
                .any(|a| a.contains("httpd")))),
        "a pod-network pod running httpd"
    );
    assert!(
        specs.iter().any(|s| s.containers.iter().any(|c| c
            .resources
            .as_ref()
            .is_some_and(|r| r.requests.is_some() && r.limits.is_some()))),
        "a pod with requests and limits"
    );
    let volumes = |s: &&k8s_openapi::api::core::v1::PodSpec| {
        let vs = s.volumes.iter().flatten();
        vs.clone().any(|v| v.empty_dir.is_some()) && vs.clone().any(|v| v.host_path.is_some())
    };
    assert!(
        specs.iter().any(volumes),
        "a pod with emptyDir and hostPath volumes"
    );
}
