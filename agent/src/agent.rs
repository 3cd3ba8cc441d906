//! Wires the components together and runs them until shutdown.
use crate::cli::AgentConfig;
use crate::config::{self, Mux};
use crate::cri::Cri;
use crate::metrics::Metrics;
use crate::pod_workers::{PodWorkers, WorkerContext};
use crate::runtime::Manager;
use crate::status::StatusManager;
use crate::{cm, credentials, ebpf, kubelet, pleg, prober, runtime, server, trace};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Cri(#[from] crate::cri::Error),
    #[error("setting up the QoS cgroups: {0}")]
    Cgroups(#[from] cm::Error),
    #[error(transparent)]
    Ebpf(#[from] ebpf::Error),
    #[error(transparent)]
    Server(#[from] server::Error),
    #[error(transparent)]
    KubeletApi(#[from] server::kubelet_api::Error),
    #[error(transparent)]
    Trace(#[from] trace::server::Error),
    #[error(transparent)]
    Otlp(#[from] trace::otlp::Error),
    #[error("the kubelet API's token and access reviews need a client of --kubeconfig: {0}")]
    Webhook(#[source] config::api::Error),
    #[error("creating {path}: {source}")]
    Dir {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Runs the agent until `cancel` fires, then waits for its tasks to stop. Pods keep running.
pub async fn run(cfg: AgentConfig, cancel: CancellationToken) -> Result<(), Error> {
    // Probe workers created within one probe period of this spread their first probes.
    let started = tokio::time::Instant::now();
    let tracker = TaskTracker::new();
    let metrics = Metrics::new();
    metrics.set_node_name(&cfg.node_name);
    // The containers' log links go beside the pod logs (`logs::links`).
    let links_dir = crate::logs::links::dir_for(&cfg.pod_logs_dir);
    // The root directory holds the pods' directories: 0750 as the kubelet makes it (and each
    // pod's); the log directories stay readable by the node's log shippers.
    let made = [
        (&cfg.root_dir, crate::pod::pod_dirs(&cfg.root_dir)),
        (
            &cfg.pod_logs_dir,
            std::fs::create_dir_all(&cfg.pod_logs_dir),
        ),
        (&links_dir, std::fs::create_dir_all(&links_dir)),
    ];
    for (dir, made) in made {
        made.map_err(|source| Error::Dir {
            path: dir.clone(),
            source,
        })?;
    }
    // Each pod's state directory (volumes, termination messages, /etc/hosts) is below it.
    let pods_dir = cfg.root_dir.join("pods");
    match crate::pod::tighten_pod_dirs(&pods_dir) {
        Ok(0) => {}
        Ok(n) => tracing::info!(
            dir = %pods_dir.display(),
            n,
            "pod directories made 0750: other local users could read or write into them"
        ),
        Err(e) => {
            tracing::warn!(dir = %pods_dir.display(), %e, "tightening pod directories' modes")
        }
    }

    let cri = Cri::new(&cfg.container_runtime_endpoint, metrics.clone())?
        .with_request_timeout(cfg.runtime_request_timeout);
    let Some(version) = wait_for_runtime(&cri, &cfg.container_runtime_endpoint, &cancel).await
    else {
        tracing::info!("stopped before the container runtime answered");
        return Ok(());
    };
    tracing::info!(runtime = %version.runtime_name, version = %version.runtime_version, api = %version.runtime_api_version, "connected to the container runtime");

    let cm_config = cm::Config {
        cgroup_root: cfg.cgroup_root.clone(),
        cgroups_per_qos: cfg.cgroups_per_qos,
        mount: cm::CGROUP_MOUNT.into(),
        pod_pids_limit: cfg.pod_pids_limit,
    };
    let reported = cri.systemd_cgroup_driver().await.unwrap_or_else(|error| {
        tracing::warn!(%error, "asking the runtime for its cgroup driver");
        None
    });
    let (systemd_cgroups, note) = cgroup_driver(cfg.systemd_cgroups, reported);
    match note {
        Some(note) if reported.is_some() => tracing::warn!("{note}"),
        Some(note) => tracing::info!("{note}"),
        None => tracing::info!(systemd = systemd_cgroups, "cgroup driver"),
    }
    let cm = if systemd_cgroups {
        cm::ContainerManager::with_systemd(cm_config)?
    } else {
        cm::ContainerManager::new(cm_config)
    }
    .with_durations(metrics.kubelet.cgroup_manager_duration_seconds.clone());
    cm.start()?;
    // Node allocatable on kubepods: capacity less the reservations, or capacity when not
    // enforced (the kubelet writes both cases).
    let (mut cpu_millis, mut memory) = (
        cm::machine_cpus() * 1000,
        cm::machine_memory_bytes().unwrap_or(u64::MAX),
    );
    if cfg.enforce_node_allocatable {
        cpu_millis = cpu_millis.saturating_sub(cfg.node.reserved.cpu_millis);
        memory = memory.saturating_sub(cfg.node.reserved.memory);
    }
    cm.enforce_node_allocatable(cpu_millis, memory)?;

    // Unbounded: the one reader drains the probes' fixed-size ring buffer and the consumer does a
    // few map look-ups per event; a backlog is what the ring produced while the consumer waited
    // for a CPU, and events past the ring's size are lost (and counted) in the kernel instead.
    let (kernel_tx, kernel_rx) = tokio::sync::mpsc::unbounded_channel();
    let root = cfg.cgroup_root.trim_end_matches('/');
    let pod_root = if cfg.cgroups_per_qos {
        format!("{root}/kubepods")
    } else {
        format!("{root}/")
    };
    // The cgroups the agent follows (pods' and containers') are all below the pod root, in every
    // hierarchy: the probes report no other (a host making and removing cgroups of its own then
    // never wakes the agent). With the systemd driver the pod root is a slice.
    let cgroup_prefix = if systemd_cgroups {
        crate::pod::cgroup_name::slice_dir(&pod_root)
            .ok()
            .map(|dir| format!("/{dir}"))
    } else {
        Some(pod_root.clone())
    };
    let monitor = ebpf::Monitor::start(
        cfg.ebpf,
        ebpf::Config {
            pod_root: Some(pod_root),
            cgroup_prefix,
            events: Some(kernel_tx),
            cri_markers: true,
            classic_cgroup_tracepoints: false,
        },
        cancel.clone(),
    )?;
    // Pod startup timelines: agent marks + CRI uprobes + kernel events on one clock.
    let tracer = trace::Tracer::new(metrics.clone(), monitor.clone());
    if let Some((endpoint, per_million)) = &cfg.tracing {
        tracer.export_to(trace::otlp::start(
            endpoint,
            *per_million,
            &cfg.node_name,
            metrics.clone(),
            &tracker,
            cancel.clone(),
        )?);
    }
    // The probes' events feed the startup timelines and, for the PLEG's fast path, the exit
    // detector (only with the probes loaded: without them nothing reaches it).
    let (exits, fast_rx) = ebpf::exits::Exits::new(metrics.clone());
    let kernel_path = exits.kernel_path(monitor.clone());
    let adopt_below = monitor
        .as_ref()
        .and_then(|m| m.pod_cgroup_dir().map(Path::to_path_buf));
    tracker.spawn(dispatch_kernel_events(
        kernel_rx,
        exits,
        adopt_below,
        tracer.clone(),
        cancel.clone(),
    ));
    trace::server::start(
        &trace::server::socket_path(&cfg.root_dir),
        tracer.clone(),
        &tracker,
        cancel.clone(),
    )?;

    // Unbounded: one message per change of a probe result; each probe worker produces at most
    // one result per period, so the backlog is at most one per probe worker and period.
    let (probe_tx, probe_rx) = tokio::sync::mpsc::unbounded_channel();
    let probe_results = prober::Results::new(probe_tx);
    // Unbounded: one message per change of a watched object and pod naming it; the pod
    // workers coalesce the syncs they ask for.
    let (objects_tx, objects_rx) = tokio::sync::mpsc::unbounded_channel();
    // The API objects pods refer to (RuntimeClasses, configMaps, secrets, services, tokens),
    // read from --kubeconfig's API server through one client, built now.
    let api_objects = crate::api_objects::ApiObjects::reporting_changes(
        cfg.kubeconfig.clone(),
        objects_tx.clone(),
        metrics.rest_client_requests.clone(),
    );
    api_objects.warm_up();
    // The kubelet's check of --resolv-conf at its start: pods are given what can be used.
    for warning in cfg.dns.check_resolv_conf() {
        tracing::warn!(%warning, "checking the resolver configuration (--resolv-conf)");
    }
    // The image manager: pulls with the pods' and the node's credentials, one at a time per
    // image, and their back-offs; the runtime asks it for each container's image.
    let images = crate::images::Images::new(
        cri.clone(),
        api_objects.clone(),
        credentials::NodeFiles::kubelet_search(&cfg.root_dir),
        cfg.max_parallel_image_pulls,
    );
    // The pod cache: the PLEG writes its reads and the exits the kernel saw; the pods' syncs
    // take the reads and mark what they change; the container garbage collector reads it.
    let pod_cache = crate::pod_cache::PodCache::default();
    let container_gc = crate::container_gc::ContainerGc::new(
        cri.clone(),
        cfg.node_name.clone(),
        cfg.container_gc,
        pod_cache.clone(),
        links_dir,
    );
    let orphans =
        crate::orphans::Orphans::new(cm.clone(), cfg.pod_logs_dir.clone(), pods_dir.clone());
    let memory = memory_capacity();
    // The machine's facts, for the Node, for admission and for PersistentVolumes' node
    // affinity.
    let root = cfg.root_dir.clone();
    let machine = tokio::task::spawn_blocking(move || crate::node::status::Machine::read(&root))
        .await
        .unwrap_or_default();
    let (admission_tx, admission_rx) =
        tokio::sync::watch::channel(crate::node::admission_node(&cfg.node, &machine));
    let volumes = crate::volume::Manager::new(
        pods_dir.clone(),
        memory,
        api_objects.clone(),
        admission_rx.clone(),
    )
    .with_operations(metrics.kubelet.storage_operation_duration_seconds.clone());
    let resolved_claims = volumes.resolved_claims();
    let runtime = Manager::new(runtime::Deps {
        cri,
        cm,
        cfg: runtime::Config {
            node_name: cfg.node_name.clone(),
            node_ips: cfg.node.node_ips.clone(),
            pod_logs_dir: cfg.pod_logs_dir.clone(),
            pods_dir: pods_dir.clone(),
            security: runtime::security::Settings {
                seccomp_root: cfg.root_dir.join("seccomp"),
                seccomp_default: cfg.seccomp_default,
                allowed_unsafe_sysctls: cfg.allowed_unsafe_sysctls.clone(),
                apparmor: runtime::security::Settings::apparmor_enabled(),
            },
            memory_capacity: memory,
            dns: cfg.dns.clone(),
        },
        probes: probe_results.clone(),
        api_objects: api_objects.clone(),
        images,
        volumes,
        pod_cache: pod_cache.clone(),
    });
    // Container log rotation: a task of its own, beside the pods' syncs.
    tracker.spawn(
        crate::logs::LogManager::new(
            runtime.cri().clone(),
            cfg.container_logs.clone(),
            cfg.node_name.clone(),
            cfg.pod_logs_dir.clone(),
            metrics.clone(),
            pod_cache.clone(),
        )
        .run(cancel.clone()),
    );
    // Image garbage collection: a task of its own too; the eviction manager asks it to delete
    // the unused images under disk pressure.
    let (image_requests, image_requests_rx) = crate::images::gc::Requests::channel();
    tracker.spawn(
        crate::images::gc::ImageGc::new(runtime.cri().clone(), cfg.image_gc, metrics.clone())
            .run(image_requests_rx, cancel.clone()),
    );
    // The desired and rejected pods: the sync loop writes them, everyone else reads.
    let registry = crate::pod_registry::PodRegistry::new();
    let status = StatusManager::new(
        metrics.clone(),
        registry.reader(),
        probe_results.clone(),
        cm::node_ips(&cfg.node.node_ips),
    );
    let probes = prober::Manager::new(
        probe_results,
        prober::probe::Prober::new(runtime.cri().clone()),
        status.clone(),
        metrics.clone(),
        started,
        tracker.clone(),
        cancel.clone(),
    );

    // Sources -> mux. The API source keeps the mirror pods it sees apart (never run), for the
    // node's mirror pod management.
    let mirrors = config::api::MirrorPods::default();
    let mut mux = Mux::new();
    let rejections = config::file::Rejections::default();
    if let Some(path) = cfg.pod_manifest_path.clone() {
        let tx = mux.channel(config::FILE);
        let file_cfg = config::file::Config {
            path,
            node_name: cfg.node_name.clone(),
            check_frequency: cfg.file_check_frequency,
        };
        let errors = config::ErrorCounter::new(metrics.config_errors_total.clone(), config::FILE);
        tracker.spawn(config::file::watch(
            file_cfg,
            tx,
            rejections.clone(),
            errors,
            cancel.clone(),
        ));
    }
    if let Some(url) = cfg.manifest_url.clone() {
        let tx = mux.channel(config::HTTP);
        let http_cfg = config::http::Config {
            url,
            headers: cfg.manifest_url_headers.clone(),
            node_name: cfg.node_name.clone(),
            check_frequency: cfg.http_check_frequency,
            ca_file: cfg.manifest_url_ca_file.clone(),
        };
        let errors = config::ErrorCounter::new(metrics.config_errors_total.clone(), config::HTTP);
        tracker.spawn(config::http::watch(http_cfg, tx, errors, cancel.clone()));
    }
    if let Some(kubeconfig) = cfg.kubeconfig.clone() {
        let tx = mux.channel(config::API);
        let api_cfg = config::api::Config {
            kubeconfig,
            node_name: cfg.node_name.clone(),
            mirrors: mirrors.clone(),
            requests: metrics.rest_client_requests.clone(),
        };
        let errors = config::ErrorCounter::new(metrics.config_errors_total.clone(), config::API);
        tracker.spawn(config::api::watch(api_cfg, tx, errors, cancel.clone()));
    }
    let (config_rx, sources_ready) = mux.run(cancel.clone());

    // The runtime's health checks, a task of their own: the node status reads their record and
    // never waits for the runtime; the PLEG relists every period while a check fails.
    let (health_tx, health_rx) = crate::runtime_health::channel();
    tracker.spawn(crate::runtime_health::run(
        runtime.cri().clone(),
        health_tx,
        cancel.clone(),
    ));

    // PLEG, with the eBPF fast path: the exit detector reports containers' main-process exits
    // and container cgroups removed.
    let (pleg_tx, pleg_rx) = tokio::sync::mpsc::channel(1000);
    let runtime_pods = pleg::RuntimePods::default();
    let runtime_state = pleg::RuntimeState::default();
    let pleg = pleg::Pleg {
        runtime: runtime.clone(),
        cache: pod_cache.clone(),
        status: status.clone(),
        tx: pleg_tx,
        pods: runtime_pods.clone(),
        health: runtime_state.clone(),
        metrics: metrics.clone(),
        kernel: kernel_path,
        runtime_health: health_rx.clone(),
    };
    tracker.spawn(pleg.run(
        cfg.pleg_relist_period,
        cfg.pleg_safety_net_period,
        fast_rx,
        cancel.clone(),
    ));

    // Servers.
    let healthz = (cfg.healthz_port != 0)
        .then(|| SocketAddr::new(cfg.healthz_bind_address, cfg.healthz_port));
    let read_only =
        (cfg.read_only_port != 0).then(|| SocketAddr::from(([127, 0, 0, 1], cfg.read_only_port)));
    let stats = crate::stats::Provider::new(
        runtime.cm().clone(),
        runtime.cri().clone(),
        cfg.node_name.clone(),
        cfg.root_dir.clone(),
        pod_cache.clone(),
    )
    .with_volumes(cfg.volume_stats_agg_period, resolved_claims);
    let state = server::AppState {
        stats: Some(stats),
        health: runtime_state.clone(),
        sync_loop_threshold: pleg::sync_loop_threshold(cfg.sync_frequency),
        status: status.clone(),
        metrics: metrics.clone(),
        rejections,
        ebpf: monitor,
        tracer: tracer.clone(),
    };
    if let Some(api) = &cfg.kubelet_api {
        // Token and access reviews go to the API server of --kubeconfig (the flags refuse them
        // without one).
        let webhook = match (&cfg.kubeconfig, api.webhook.any()) {
            (Some(kubeconfig), true) => Some(server::webhook::Webhook::new(
                config::api::client(kubeconfig, &metrics.rest_client_requests)
                    .await
                    .map_err(Error::Webhook)?,
                cfg.node_name.clone(),
                api.webhook,
            )),
            _ => None,
        };
        let settings = server::kubelet_api::Settings {
            addr: api.addr,
            tls: api.tls.clone(),
            anonymous: api.anonymous,
            names: serving_names(&cfg.node_name, &cfg.node.node_ips),
            webhook,
            stream_idle_timeout: api.stream_idle_timeout,
        };
        server::kubelet_api::start(
            settings,
            state.clone(),
            runtime.cri().clone(),
            &tracker,
            cancel.clone(),
        )
        .await?;
    }
    server::start(healthz, read_only, state, &tracker, cancel.clone()).await?;
    // The eviction manager: an evicted pod is synced at once through the same channel as a
    // changed configMap's pods.
    let (pressure_tx, pressure_rx) = tokio::sync::watch::channel(Vec::new());
    let reclaim = {
        let gc = container_gc.clone();
        let finished = status.clone();
        let containers: crate::eviction::ReclaimFn = Arc::new(move || {
            let (gc, finished) = (gc.clone(), finished.clone());
            Box::pin(async move {
                // Finished pods that are still wanted lose their containers too.
                match gc
                    .collect_containers(&|uid| finished.is_terminal(uid))
                    .await
                {
                    Ok(c) => format!(
                        "{} dead container(s) and {} sandbox(es) removed",
                        c.containers, c.sandboxes
                    ),
                    Err(e) => format!("container collection failed: {e}"),
                }
            })
        });
        let images: crate::eviction::ReclaimFn = Arc::new(move || {
            let r = image_requests.clone();
            Box::pin(async move { r.delete_unused().await })
        });
        crate::eviction::Reclaim {
            containers: Some(containers),
            images: Some(images),
        }
    };
    let eviction = crate::eviction::Manager {
        cm: runtime.cm().clone(),
        cri: runtime.cri().clone(),
        reclaim,
        status: status.clone(),
        cfg: cfg.eviction.clone(),
        sync_now: objects_tx,
        pressure: pressure_tx,
    };
    tracker.spawn(eviction.run(cancel.clone()));

    // Cluster membership: the Node, its status and its Lease, when there is an API server.
    if let Some(kubeconfig) = cfg.kubeconfig.clone() {
        let inputs = crate::node::Inputs {
            runtime: health_rx,
            health: runtime_state.clone(),
            pressure: pressure_rx.clone(),
            metrics: metrics.clone(),
            status: status.clone(),
            mirrors: mirrors.clone(),
            admission: admission_tx,
        };
        tracker.spawn(crate::node::run(
            cfg.node.clone(),
            machine,
            kubeconfig,
            inputs,
            cancel.clone(),
        ));
    }

    // Sync loop and workers.
    // Unbounded: one message per pod worker that finished its pod, at most one per worker.
    let (done_tx, done_rx) = tokio::sync::mpsc::unbounded_channel();
    let ctx = WorkerContext {
        runtime,
        pod_cache,
        container_gc: container_gc.clone(),
        orphans,
        status: status.clone(),
        metrics: metrics.clone(),
        tracer: tracer.clone(),
        probes,
    };
    let workers = PodWorkers::new(ctx, done_tx, tracker.clone(), cancel.clone())
        .with_sync_frequency(cfg.sync_frequency);
    let sync_loop = kubelet::SyncLoop {
        config_rx,
        sources_ready,
        pleg_rx,
        done_rx,
        probe_rx,
        objects_rx,
        runtime_pods,
        runtime_state,
        workers,
        registry,
        status,
        metrics,
        tracer,
        max_pods: cfg.max_pods as usize,
        node: admission_rx,
        pressure: pressure_rx,
    };
    tracker.spawn(sync_loop.run(cancel.clone()));
    tracing::info!(node = %cfg.node_name, "swiftlet started");
    crate::systemd::notify("READY=1");

    cancel.cancelled().await;
    crate::systemd::notify("STOPPING=1");
    tracker.close();
    if tokio::time::timeout(Duration::from_secs(10), tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!("some tasks did not stop within 10 s");
    }
    tracing::info!("swiftlet stopped; pods keep running");
    Ok(())
}

/// What a self-signed kubelet API certificate is made for: the node name, `localhost`, the
/// node's IP and loopback.
/// The cgroup driver to use (true: systemd) from the configured one and the one the runtime
/// reports, with what to warn about. As the kubelet does, a runtime that reports its driver is
/// followed (pod cgroups and the runtime's container cgroups must be made by the same driver);
/// one that does not leaves the configured driver, which must then match the runtime's own.
fn cgroup_driver(configured: bool, reported: Option<bool>) -> (bool, Option<String>) {
    let name = |systemd: bool| if systemd { "systemd" } else { "cgroupfs" };
    match reported {
        Some(runtime) if runtime != configured => (
            runtime,
            Some(format!(
                "the container runtime uses the {} cgroup driver: using it, not the configured {}",
                name(runtime),
                name(configured)
            )),
        ),
        Some(runtime) => (runtime, None),
        None => (
            configured,
            Some(format!(
                "the container runtime does not report its cgroup driver (no CRI \
                 RuntimeConfig): using the configured {}, which must be the runtime's too",
                name(configured)
            ))
            .filter(|_| configured),
        ),
    }
}

fn serving_names(node: &str, node_ips: &[std::net::IpAddr]) -> Vec<String> {
    let mut names = vec![
        node.to_owned(),
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
    ];
    names.extend(cm::node_ips(node_ips).iter().map(ToString::to_string));
    names.dedup();
    names
}

/// The first delay between attempts to reach the container runtime at start-up.
const RUNTIME_WAIT_FIRST: Duration = Duration::from_millis(500);
/// Attempts to reach the runtime double their delay up to this.
const RUNTIME_WAIT_MAX: Duration = Duration::from_secs(5);

/// Asks the runtime for its version until it answers (a runtime that is down, or still
/// starting, when the agent starts is waited for: each failed attempt is logged with the
/// endpoint and the error, and the delay doubles from [`RUNTIME_WAIT_FIRST`] to
/// [`RUNTIME_WAIT_MAX`]). `None` when `cancel` fires first.
async fn wait_for_runtime(
    cri: &Cri,
    endpoint: &str,
    cancel: &CancellationToken,
) -> Option<k8s_cri::v1::VersionResponse> {
    let mut delay = RUNTIME_WAIT_FIRST;
    loop {
        let attempt = tokio::select! {
            () = cancel.cancelled() => return None,
            v = cri.version() => v,
        };
        match attempt {
            Ok(v) => return Some(v),
            Err(error) => {
                tracing::error!(%endpoint, %error, retry_in = ?delay, "the container runtime is not answering; waiting for it");
            }
        }
        tokio::select! {
            () = cancel.cancelled() => return None,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(RUNTIME_WAIT_MAX);
    }
}

/// The machine's memory, the base of Burstable containers' `oom_score_adj`.
fn memory_capacity() -> u64 {
    cm::machine_memory_bytes().unwrap_or_else(|| {
        tracing::warn!(
            "cannot read MemTotal from /proc/meminfo: Burstable containers get oom_score_adj 999"
        );
        u64::MAX
    })
}

/// Hands each event of the probes to the exit detector, then to the startup timelines, until
/// `cancel` fires or the probes' reader is gone.
async fn dispatch_kernel_events(
    mut events: tokio::sync::mpsc::UnboundedReceiver<ebpf::KernelEvent>,
    mut exits: ebpf::exits::Exits,
    adopt_below: Option<PathBuf>,
    tracer: trace::Tracer,
    cancel: CancellationToken,
) {
    // The containers already running (a restarted agent's) are followed before the events
    // queued since the probes were attached are taken.
    if let Some(root) = adopt_below {
        exits = match tokio::task::spawn_blocking(move || {
            let n = exits.adopt_running(&root);
            tracing::debug!(containers = n, "exit detector: running containers adopted");
            exits
        })
        .await
        {
            Ok(exits) => exits,
            Err(error) => {
                tracing::error!(%error, "adopting the running containers' cgroups failed");
                return;
            }
        };
    }
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            event = events.recv() => match event {
                Some(event) => {
                    exits.observe(&event);
                    tracer.kernel_event(&event);
                }
                None => return,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtimes_cgroup_driver_wins_and_a_silent_runtime_leaves_the_configured_one() {
        assert_eq!(cgroup_driver(false, Some(false)), (false, None));
        assert_eq!(cgroup_driver(true, Some(true)), (true, None));
        let (driver, note) = cgroup_driver(false, Some(true));
        assert!(driver);
        assert!(note.unwrap().contains("uses the systemd cgroup driver"));
        let (driver, note) = cgroup_driver(true, Some(false));
        assert!(!driver && note.is_some());
        // Silent (containerd 1.6): cgroupfs as before, quietly; systemd with a reminder.
        assert_eq!(cgroup_driver(false, None), (false, None));
        let (driver, note) = cgroup_driver(true, None);
        assert!(driver && note.unwrap().contains("must be the runtime's too"));
    }

    /// A runtime that is not there is waited for (not an error that ends the agent), and the
    /// wait ends when the agent is stopped.
    #[tokio::test]
    async fn a_missing_runtime_is_waited_for_until_cancelled() {
        let dir = tempfile::tempdir().unwrap();
        let endpoint = format!("unix://{}", dir.path().join("none.sock").display());
        let cri = Cri::new(&endpoint, Metrics::new()).unwrap();
        let cancel = CancellationToken::new();
        let waiting = tokio::spawn({
            let cancel = cancel.clone();
            async move { wait_for_runtime(&cri, &endpoint, &cancel).await }
        });
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert!(!waiting.is_finished(), "gave up on a runtime that is down");
        cancel.cancel();
        let got = tokio::time::timeout(Duration::from_secs(2), waiting)
            .await
            .expect("the wait did not end on cancel")
            .unwrap();
        assert!(got.is_none());
    }
}
