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
pub mod server;
pub mod stats;
pub mod status;
pub mod systemd;
pub mod trace;
pub mod volume;
pub mod work_queue;
