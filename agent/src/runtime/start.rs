//! Starting containers: back-off, image pulls, sandbox and container configs.
use super::*;
use crate::images::ImageUser;
use futures::FutureExt;

/// Which instance of a container a config is for.
#[derive(Debug, Clone, Copy)]
pub(super) struct Instance {
    pub kind: ContainerKind,
    /// Its attempt: how often the container was started before.
    pub restart_count: u32,
    pub hash: u64,
}

/// What a container's config is made from besides its spec: the image's user, the environment
/// resolved for it (`Manager::container_env`) and the pod's IPs (its managed `/etc/hosts`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Inputs<'a> {
    pub image_user: &'a ImageUser,
    pub env: &'a [(String, String)],
    pub pod_ips: &'a [String],
    /// The pod's QoS class (for the container's `oom_score_adj`).
    pub qos: crate::pod::QosClass,
}

impl Manager {
    /// What the node offers a container without a limit, for the downward API.
    pub(super) fn allocatable(&self) -> env::Allocatable {
        cm::node_allocatable(self.cfg.memory_capacity, &self.cfg.pods_dir)
    }

    /// Starts one container unless it is in crash-loop back-off. `Ok(true)` when started,
    /// `Ok(false)` when backing off; `Err` when starting failed (recorded in `outcome`).
    pub(super) async fn start_with_backoff(
        &self,
        t: &StartTarget<'_>,
        c: &Container,
        kind: ContainerKind,
        outcome: &mut SyncOutcome,
    ) -> std::result::Result<bool, ()> {
        let hash = hash::container_hash(c);
        let instances = t.index.get(&c.name);
        let prev = instances.newest;
        // The kubelet's doBackOff: from the newest instance that exited, even when a newer one
        // was running (killed for a failed liveness probe, it backs off from its predecessor).
        let exited = instances.newest_exited;
        if let Some(prev) = exited {
            let key = format!("{}_{}_{}", t.uid, c.name, hash::hash_label(hash));
            let now = now_nanos();
            let mut backoffs = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(left) = backoffs.remaining(&key, prev.finished_at, now) {
                let delay = backoffs.delay(&key).unwrap_or(left);
                drop(backoffs);
                outcome.wait(
                    &c.name,
                    "CrashLoopBackOff",
                    format!(
                        "back-off {}s restarting failed container={} pod={}",
                        delay.as_secs(),
                        c.name,
                        t.name
                    ),
                    left,
                );
                return Ok(false);
            }
            backoffs.next(&key, prev.finished_at, now);
        }
        let restart_count = prev
            .and_then(|p| p.metadata.as_ref())
            .map_or(0, |m| m.attempt + 1);
        let result = self.start_container(t, c, kind, restart_count, hash).await;
        // The kubelet counts init and sidecar containers as `init_container`.
        let container_type = match kind {
            ContainerKind::App => "container",
            ContainerKind::Init | ContainerKind::Sidecar => "init_container",
        };
        self.cri
            .metrics()
            .container_start(container_type, result.as_ref().err().map(Error::reason));
        match result {
            Ok(started) => {
                outcome.started.push(started);
                Ok(true)
            }
            Err(e) => {
                tracing::warn!(pod = %t.name, container = %c.name, error = %e, "starting container");
                outcome.start_failed = true;
                let retry = e.retry_after();
                if let Error::PostStartHook {
                    restarts: false, ..
                } = e
                {
                    // Killed for good: the status shows how it ended, not a waiting reason.
                    outcome.requeue(Duration::ZERO);
                } else {
                    outcome.wait(&c.name, e.reason(), e.to_string(), retry);
                }
                Err(())
            }
        }
    }

    pub(super) async fn start_container(
        &self,
        t: &StartTarget<'_>,
        container: &Container,
        kind: ContainerKind,
        restart_count: u32,
        hash: u64,
    ) -> Result<api::ContainerStatus> {
        let image = container.image.clone().unwrap_or_default();
        let target = crate::images::For {
            pod: t.pod,
            name: t.name,
            uid: t.uid,
            container,
        };
        let (image_ref, image_user) = self.images.ensure(target, &image, t.prefetched).await?;
        let instance = Instance {
            kind,
            restart_count,
            hash,
        };
        let env = self
            .container_env(t.pod, t.uid, container, t.pod_ips)
            .await?;
        let inputs = Inputs {
            image_user: &image_user,
            env: &env,
            pod_ips: t.pod_ips,
            qos: t.qos,
        };
        let config = self.container_config(t.pod, t.uid, container, instance, &inputs)?;
        drop(env);
        // What the status below needs, kept before the config goes to the runtime: not a copy
        // of the whole config (its environment, mounts and devices). Of the mounts only the
        // termination message file's: when the kernel sees the container exit before the
        // runtime records it, its status is this one marked exited, and the message is read
        // from that mount (without it a pod that ended so showed no message).
        let message_path = config.annotations.get(labels::TERMINATION_MESSAGE_PATH);
        let kept = api::ContainerConfig {
            metadata: config.metadata.clone(),
            image: config.image.clone(),
            labels: config.labels.clone(),
            annotations: config.annotations.clone(),
            log_path: config.log_path.clone(),
            mounts: config
                .mounts
                .iter()
                .filter(|m| Some(&m.container_path) == message_path)
                .cloned()
                .collect(),
            ..Default::default()
        };
        let id = self
            .cri
            .create_container(t.sandbox_id, config, t.sandbox_config.clone())
            .await
            .map_err(Self::cri_err(t.name))?;
        let config = kept;
        let created_at = now_nanos();
        self.cri
            .start_container(&id)
            .await
            .map_err(Self::cri_err(t.name))?;
        tracing::info!(pod = %t.name, container = %container.name, id = %id, restart_count, kind = kind.as_str(), "container started");
        self.link_log(t, &container.name, &id, &config.log_path);
        // What ContainerStatus would say now (StartContainer returned: the container runs). The
        // next relist replaces it with the runtime's own answer.
        let started = api::ContainerStatus {
            id,
            metadata: config.metadata,
            state: api::ContainerState::ContainerRunning as i32,
            created_at,
            started_at: now_nanos(),
            image: config.image,
            image_ref,
            labels: config.labels,
            annotations: config.annotations,
            log_path: config.log_path,
            mounts: config.mounts,
            ..Default::default()
        };
        // Before the sync goes on (the next init container waits for it) and before the status
        // can show the container Running: the worker writes the status after the sync.
        self.post_start(t, container, kind, &started).await?;
        Ok(started)
    }

    /// Links the started container's log into the containers directory for log shippers
    /// (`logs::links`), as the kubelet does once a container started; a failure is logged and
    /// the container runs on.
    fn link_log(&self, t: &StartTarget<'_>, container: &str, id: &str, log_path: &str) {
        use crate::logs::links;
        let Some(sandbox) = t.sandbox_config.metadata.as_ref() else {
            return;
        };
        let Some(name) = links::link_name(&sandbox.name, &sandbox.namespace, container, id) else {
            tracing::warn!(pod = %t.name, container, id, "no log link: its names make no file name");
            return;
        };
        let log = std::path::Path::new(&t.sandbox_config.log_directory).join(log_path);
        let dir = links::dir_for(&self.cfg.pod_logs_dir);
        if let Err(error) = links::create(&dir, &name, &log) {
            tracing::warn!(pod = %t.name, container, link = %dir.join(&name).display(), %error, "linking the container's log");
        }
    }

    pub(super) fn pod_labels(&self, pod: &Pod, uid: &str) -> HashMap<String, String> {
        HashMap::from([
            (
                labels::POD_NAME.to_owned(),
                pod.metadata.name.clone().unwrap_or_default(),
            ),
            (
                labels::POD_NAMESPACE.to_owned(),
                pod.metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into()),
            ),
            (labels::POD_UID.to_owned(), uid.to_owned()),
            (labels::NODE_NAME.to_owned(), self.cfg.node_name.clone()),
        ])
    }

    pub(super) fn host_network(pod: &Pod) -> bool {
        pod.spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false)
    }

    pub(super) fn namespace_options(pod: &Pod) -> api::NamespaceOption {
        let spec = pod.spec.as_ref();
        let share_pid = spec
            .and_then(|s| s.share_process_namespace)
            .unwrap_or(false);
        api::NamespaceOption {
            network: if Self::host_network(pod) {
                api::NamespaceMode::Node
            } else {
                api::NamespaceMode::Pod
            } as i32,
            pid: if spec.and_then(|s| s.host_pid).unwrap_or(false) {
                api::NamespaceMode::Node
            } else if share_pid {
                api::NamespaceMode::Pod
            } else {
                api::NamespaceMode::Container
            } as i32,
            ipc: if spec.and_then(|s| s.host_ipc).unwrap_or(false) {
                api::NamespaceMode::Node
            } else {
                api::NamespaceMode::Pod
            } as i32,
            ..Default::default()
        }
    }

    /// The pod's sandbox config (see [`Manager::sandbox_config_and_warnings`]).
    pub fn sandbox_config(
        &self,
        pod: &Pod,
        uid: &str,
        attempt: u32,
        cgroup_parent: &str,
    ) -> Result<api::PodSandboxConfig> {
        self.sandbox_config_and_warnings(pod, uid, attempt, cgroup_parent)
            .map(|(config, _)| config)
    }

    /// The pod's sandbox config, with its hostname and DNS configuration (`crate::dns`), and
    /// what forming the DNS configuration warned about (limits trimmed, no cluster DNS).
    pub(super) fn sandbox_config_and_warnings(
        &self,
        pod: &Pod,
        uid: &str,
        attempt: u32,
        cgroup_parent: &str,
    ) -> Result<(api::PodSandboxConfig, Vec<String>)> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let spec = pod.spec.as_ref();
        let dns_err = Self::dns_err(pod);
        // Host-network pods share the node's UTS namespace: the runtime refuses to set a hostname.
        let hostname = if Self::host_network(pod) {
            String::new()
        } else {
            crate::dns::hostname_and_domain(pod, &self.cfg.dns.cluster_domain)
                .map_err(&dns_err)?
                .0
        };
        let dns = self.cfg.dns.pod_dns(pod).map_err(&dns_err)?;
        let mut labels = pod
            .metadata
            .labels
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect::<HashMap<_, _>>();
        labels.extend(self.pod_labels(pod, uid));
        let mut annotations: HashMap<String, String> = pod
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        if let Ok(qos) = crate::pod::pod_qos(pod) {
            annotations.insert(labels::POD_QOS_CLASS.to_owned(), qos.as_str().to_owned());
        }
        let port_mappings = spec
            .map(|s| s.containers.as_slice())
            .unwrap_or_default()
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .filter(|p| p.host_port.is_some_and(|h| h > 0))
            .map(|p| api::PortMapping {
                protocol: match p.protocol.as_deref() {
                    Some("UDP") => api::Protocol::Udp,
                    Some("SCTP") => api::Protocol::Sctp,
                    _ => api::Protocol::Tcp,
                } as i32,
                container_port: p.container_port,
                host_port: p.host_port.unwrap_or_default(),
                host_ip: p.host_ip.clone().unwrap_or_default(),
            })
            .collect();
        let (security_context, sysctls) = security::sandbox(pod, Self::namespace_options(pod));
        let config = api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: name.clone(),
                uid: uid.to_owned(),
                namespace: namespace.clone(),
                attempt,
            }),
            hostname,
            log_directory: crate::pod::log_paths::pod_log_dir(
                &self.cfg.pod_logs_dir,
                &namespace,
                &name,
                uid,
            )
            .to_string_lossy()
            .into_owned(),
            dns_config: Some(dns.config),
            port_mappings,
            labels,
            annotations,
            linux: Some(api::LinuxPodSandboxConfig {
                // Validated with the name: the pod's cgroup is the driver's.
                cgroup_parent: self
                    .cm
                    .runtime_cgroup_parent(cgroup_parent)
                    .unwrap_or_else(|_| cgroup_parent.to_owned()),
                security_context: Some(security_context),
                sysctls,
                ..Default::default()
            }),
            windows: None,
        };
        Ok((config, dns.warnings))
    }

    /// The requests a new pod's first start sends, built as its sync builds them: the sandbox
    /// config (its pod cgroup named, not created) and each regular container's config (attempt
    /// 0), in start order. The `pod_startup` bench's CRI floor issues exactly these, so that
    /// containerd is asked for the same work by the floor as by swiftlet.
    pub fn first_start_requests(
        &self,
        pod: &Pod,
        uid: &str,
    ) -> Result<(api::PodSandboxConfig, Vec<api::ContainerConfig>)> {
        let qos = Self::qos_of(pod)?;
        let cgroup = self
            .cm
            .pod_cgroup_name(uid, qos)
            .map_err(|source| Error::Cgroup {
                pod: full_name(pod),
                source,
            })?;
        let containers = pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .map(|c| {
                let instance = Instance {
                    kind: ContainerKind::App,
                    restart_count: 0,
                    hash: hash::container_hash(c),
                };
                // Before any sandbox: no pod IPs. Without an API server nothing is waited for.
                let env = self
                    .container_env(pod, uid, c, &[])
                    .now_or_never()
                    .ok_or_else(|| Error::Env {
                        pod: full_name(pod),
                        container: c.name.clone(),
                        source: Box::new(env::Error::Invalid {
                            name: "*".into(),
                            reason: env::Invalid::FirstStart,
                        }),
                    })??;
                // A pod without a security context needs nothing from the image; its IP is
                // not known before its sandbox runs.
                let inputs = Inputs {
                    image_user: &ImageUser::default(),
                    env: &env,
                    pod_ips: &[],
                    qos,
                };
                self.container_config(pod, uid, c, instance, &inputs)
            })
            .collect::<Result<_>>()?;
        Ok((self.sandbox_config(pod, uid, 0, &cgroup)?, containers))
    }

    /// Container `c`'s environment ([`env::build`]): the configMaps and secrets it names
    /// through the API server, the services from the API objects' services store
    /// ([`env::services`]), the pod's IPs (the node's for a host-network pod), the node's
    /// addresses and allocatable resources when a variable needs them.
    pub(super) async fn container_env(
        &self,
        pod: &Pod,
        uid: &str,
        c: &Container,
        pod_ips: &[String],
    ) -> Result<Vec<(String, String)>> {
        let err = |source| Error::Env {
            pod: full_name(pod),
            container: c.name.clone(),
            source: Box::new(source),
        };
        let services = if !self.api.has_api_server() {
            None
        } else if crate::pod::is_static(pod) {
            let (services, problem) = env::services_for_static_pod(&self.api, pod).await;
            if let Some(why) = problem {
                tracing::warn!(
                    pod = %full_name(pod),
                    container = c.name,
                    reason = %why,
                    "a static pod starts without service variables: the services have not \
                     been read yet"
                );
            }
            services
        } else {
            Some(env::services(&self.api, pod).await.map_err(err)?)
        };
        let host_network = Self::host_network(pod);
        let host_ips = if host_network || env::needs_host_ips(c) {
            cm::node_ips(&self.cfg.node_ips)
        } else {
            Vec::new()
        };
        let ctx = env::Context {
            pod_ips: if host_network {
                host_ips.iter().map(ToString::to_string).collect()
            } else {
                pod_ips.to_vec()
            },
            host_ips,
            allocatable: env::needs_allocatable(c).then(|| self.allocatable()),
        };
        env::build(&self.api, services.as_deref(), &ctx, pod, uid, c)
            .await
            .map_err(err)
    }

    /// The pod's QoS class, or the error of its first resource list that does not parse.
    pub(super) fn qos_of(pod: &Pod) -> Result<crate::pod::QosClass> {
        crate::pod::pod_qos(pod).map_err(|source| Error::Cgroup {
            pod: full_name(pod),
            source: source.into(),
        })
    }

    pub(super) fn container_config(
        &self,
        pod: &Pod,
        uid: &str,
        c: &Container,
        instance: Instance,
        inputs: &Inputs<'_>,
    ) -> Result<api::ContainerConfig> {
        let Instance {
            kind,
            restart_count,
            hash,
        } = instance;
        let Inputs {
            image_user,
            env,
            pod_ips,
            qos,
        } = *inputs;
        let name = full_name(pod);
        let security_context = security::container(
            pod,
            c,
            image_user,
            Self::namespace_options(pod),
            &self.cfg.security,
        )
        .map_err(|refusal| Error::Refused {
            pod: name.clone(),
            refusal,
        })?;
        let envs: Vec<api::KeyValue> = env
            .iter()
            .map(|(key, value)| api::KeyValue {
                key: key.clone(),
                value: value.clone(),
            })
            .collect();
        let mut labels = self.pod_labels(pod, uid);
        labels.insert(labels::CONTAINER_NAME.to_owned(), c.name.clone());
        let mut annotations = HashMap::from([
            (labels::CONTAINER_TYPE.to_owned(), kind.as_str().to_owned()),
            (labels::CONTAINER_HASH.to_owned(), hash::hash_label(hash)),
            (
                labels::CONTAINER_RESTART_COUNT.to_owned(),
                restart_count.to_string(),
            ),
            (
                labels::POD_TERMINATION_GRACE_PERIOD.to_owned(),
                grace_period_secs(pod).to_string(),
            ),
            (
                labels::TERMINATION_MESSAGE_PATH.to_owned(),
                c.termination_message_path
                    .clone()
                    .unwrap_or_else(|| "/dev/termination-log".into()),
            ),
        ]);
        if let Some(pre_stop) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref())
            && let Ok(json) = serde_json::to_string(pre_stop)
        {
            annotations.insert(labels::PRE_STOP_HANDLER.to_owned(), json);
        }
        if let Some(ports) = hooks::ports_annotation(c) {
            annotations.insert(labels::CONTAINER_PORTS.to_owned(), ports);
        }
        let mut resources = cm::container_resources(c).map_err(|source| Error::Cgroup {
            pod: name.clone(),
            source,
        })?;
        resources.oom_score_adj =
            crate::pod::qos::container_oom_score_adj(pod, qos, c, self.cfg.memory_capacity)
                .map_err(|source| Error::Cgroup {
                    pod: name.clone(),
                    source: source.into(),
                })?;
        annotations.insert(
            labels::CONTAINER_RESOURCES.to_owned(),
            cm::resources_label(&resources),
        );
        let mut mounts = self
            .volumes
            .mounts(pod, uid, c)
            .map_err(|source| Error::Volume {
                pod: name.clone(),
                source,
            })?;
        mounts.extend(
            self.termination_message_mount(uid, c, restart_count)
                .map_err(|source| Error::TerminationMessage {
                    pod: name.clone(),
                    container: c.name.clone(),
                    source,
                })?,
        );
        mounts.extend(self.etc_hosts_mount(pod, uid, c, pod_ips)?);
        Ok(api::ContainerConfig {
            metadata: Some(api::ContainerMetadata {
                name: c.name.clone(),
                attempt: restart_count,
            }),
            image: Some(cri::image_spec(c.image.as_deref().unwrap_or_default())),
            command: env::expand_all(c.command.as_deref().unwrap_or_default(), env),
            args: env::expand_all(c.args.as_deref().unwrap_or_default(), env),
            working_dir: c.working_dir.clone().unwrap_or_default(),
            envs,
            labels,
            annotations,
            log_path: crate::pod::log_paths::container_log(&c.name, restart_count),
            mounts,
            stdin: c.stdin.unwrap_or(false),
            stdin_once: c.stdin_once.unwrap_or(false),
            tty: c.tty.unwrap_or(false),
            linux: Some(api::LinuxContainerConfig {
                resources: Some(resources),
                security_context: Some(security_context),
            }),
            ..Default::default()
        })
    }

    /// The termination message file of one container instance, as the kubelet makes it: an empty
    /// file `<root-dir>/pods/<uid>/containers/<name>/<attempt>`, writable by any user the
    /// container runs as, mounted read-write at `terminationMessagePath`. The status reads it
    /// when the container has exited.
    fn termination_message_mount(
        &self,
        uid: &str,
        c: &Container,
        attempt: u32,
    ) -> std::io::Result<Option<api::Mount>> {
        use std::os::unix::fs::PermissionsExt;
        let Some(path) = c
            .termination_message_path
            .as_deref()
            .filter(|p| !p.is_empty())
        else {
            return Ok(None);
        };
        let dir = self.cfg.pods_dir.join(uid).join("containers").join(&c.name);
        crate::pod::pod_dirs(&dir)?;
        let file = dir.join(attempt.to_string());
        std::fs::File::create(&file)?;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666))?;
        Ok(Some(api::Mount {
            container_path: path.to_owned(),
            host_path: file.to_string_lossy().into_owned(),
            ..Default::default()
        }))
    }

    /// The pod's managed `/etc/hosts` (`crate::dns::hosts`), written now (before the container
    /// is created) and mounted at `/etc/hosts`; nothing when the container mounts something
    /// there itself, or when a pod-network pod's IP is not known.
    fn etc_hosts_mount(
        &self,
        pod: &Pod,
        uid: &str,
        c: &Container,
        pod_ips: &[String],
    ) -> Result<Option<api::Mount>> {
        use crate::dns::hosts;
        if hosts::mounted_by(c) {
            return Ok(None);
        }
        let dns_err = Self::dns_err(pod);
        let Some(content) = hosts::content(&self.cfg.dns, pod, pod_ips).map_err(&dns_err)? else {
            return Ok(None);
        };
        let path = hosts::path(&self.cfg.pods_dir, uid);
        hosts::write(&path, &content).map_err(&dns_err)?;
        Ok(Some(api::Mount {
            container_path: hosts::CONTAINER_PATH.to_owned(),
            host_path: path.to_string_lossy().into_owned(),
            selinux_relabel: true,
            ..Default::default()
        }))
    }
}
