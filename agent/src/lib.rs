//! swiftlet: a node agent that does the kubelet's job, measured.
//!
//! Data flow (docs/architecture.md): sources (`config::file`) -> `config::Mux` -> the sync loop (`kubelet`)
//! -> one pod worker per pod (`pod_workers`) -> `runtime::Manager` (CRI through `cri::Cri`) and
//! `cm` (pod cgroups) -> `status::StatusManager` -> `/pods`. `pleg` relists the runtime; `ebpf`
//! records what the kernel saw.
pub mod agent;
pub mod api_objects;
pub mod backoff;
pub mod cli;
pub mod cm;
pub mod config;
pub mod container_gc;
pub mod credentials;
pub mod cri;
pub mod dns;
pub mod ebpf;
pub mod eviction;
pub mod handler;
pub mod images;
pub mod kubelet;
pub mod logs;
pub mod memory;
pub mod metrics;
pub mod node;
pub mod orphans;
pub mod pleg;
pub mod pod;
pub mod pod_cache;
pub mod pod_registry;
pub mod pod_workers;
pub mod prober;
pub mod runtime;
pub mod runtime_health;
pub mod server;
pub mod stats;
pub mod status;
pub mod systemd;
pub mod trace;
pub mod volume;
pub mod work_queue;

/// The version swiftlet reports as the Node's `kubeletVersion` and for `--version`:
/// `v1.<minor>.0+swiftlet-<crate version>`. Tools compare `kubeletVersion` with the control
/// plane's version (kubectl's skew warning, kubeadm upgrades, the cluster autoscaler), so it
/// names the Kubernetes version whose API swiftlet is built against (the k8s-openapi version
/// feature of the workspace's Cargo.toml, read at build time by `build.rs`), with swiftlet's
/// own version as semantic-version build metadata after the `+`.
pub const VERSION: &str = env!("SWIFTLET_VERSION");

#[cfg(test)]
mod tests {
    /// The `v1_<minor>` feature the workspace enables on k8s-openapi.
    fn k8s_openapi_minor(manifest: &str) -> Option<u32> {
        let line = manifest
            .lines()
            .find(|l| l.trim_start().starts_with("k8s-openapi"))?;
        let feature = line.split('"').find_map(|s| s.strip_prefix("v1_"))?;
        feature.parse().ok()
    }

    #[test]
    fn the_version_is_the_kubernetes_api_version_with_swiftlets_as_build_metadata() {
        let manifest = include_str!("../../Cargo.toml");
        let minor = k8s_openapi_minor(manifest).expect("a v1_<minor> feature on k8s-openapi");
        assert_eq!(
            super::VERSION,
            format!("v1.{minor}.0+swiftlet-{}", env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(
            k8s_openapi_minor(r#"k8s-openapi = { version = "0.29", features = ["v1_35"] }"#),
            Some(35)
        );
    }
}
