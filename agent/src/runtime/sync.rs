//! `sync_pod`: the kubelet's `SyncPod`, carrying out [`super::actions::compute_pod_actions`].
use super::*;
use k8s_openapi::api::core::v1::PodSpec;

impl Manager {
    /// Brings the runtime in line with the pod spec: [`actions::compute_pod_actions`], then the
    /// kills, the sandbox, init containers and app containers (the kubelet's `SyncPod`).
    /// `cancel` fires when the pod starts terminating: a postStart hook still running is
    /// abandoned then (its ExecSync or HTTP request dropped); every other CRI call is let finish.
    /// `superseded` fires when a newer spec of the pod is waiting: after its kills, the sync
    /// creates and starts nothing more for this spec (a container that the newer spec would kill
    /// again is never started; the next sync starts the newer one).
    pub async fn sync_pod(
        &self,
        pod: &Pod,
        cancel: &CancellationToken,
        superseded: &CancellationToken,
    ) -> Result<SyncOutcome> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let outcome =
            cri::with_pod(&uid, self.sync_pod_traced(pod, &uid, cancel, superseded)).await;
        if let Ok(o) = &outcome
            && o.from_nothing
            && let Some(state) = &o.state
        {
            // A new pod's start: what it created is all the pod has, known as of now (its
            // mutation ended). The PLEG's events for these very starts sync the pod again, and
            // its read of them, if it overlapped the start, is rejected: that sync takes this
            // instead of reading back what was just made.
            let token = self.fresh().token(&uid);
            self.hand_over(&uid, token, state);
        }
        outcome
    }

    /// The kubelet's `SyncPod`, step by step: refuse what cannot run ([`Self::refuse_early`]),
    /// read the pod ([`Self::state_for_sync`]) and compute its actions, kill what must go
    /// ([`Self::kill_step`]), resize in place, then, when something starts, set the volumes and
    /// the pod cgroup up, make sure of the sandbox ([`Self::ensure_sandbox`]) and start the init
    /// containers ([`Self::start_init_containers`]) and the app containers
    /// ([`Self::start_app_containers`]).
    pub(super) async fn sync_pod_traced(
        &self,
        pod: &Pod,
        uid: &str,
        cancel: &CancellationToken,
        superseded: &CancellationToken,
    ) -> Result<SyncOutcome> {
        let name = full_name(pod);
        let spec = self.refuse_early(pod, &name)?;
        // The configMaps and secrets it names are watched from now until it has terminated
        // (`release_api_objects`); a pod already registered costs a lookup.
        self.api.register_pod(pod).await;
        let state = self.state_for_sync(uid, &name).await?;
        let held_nothing = state.sandboxes.is_empty() && state.containers.is_empty();
        let actions = actions::compute_pod_actions_with(pod, &state, &self.probes);
        tracing::debug!(pod = %name, ?actions, "computed pod actions");
        let mut outcome = SyncOutcome {
            terminal: actions.terminal,
            ..Default::default()
        };
        // The sync changes what already runs: the state read before it is stale afterwards. A
        // new pod's actions say kill_pod too (the kubelet's computePodActions kills whenever it
        // creates a sandbox), but with nothing live the kill stops nothing.
        let kills_live = actions.kill_pod && state.anything_live();
        let stops = kills_live
            || !actions.containers_to_kill.is_empty()
            || !actions.containers_to_resize.is_empty();
        let starts = actions.create_sandbox
            || !actions.init_to_start.is_empty()
            || !actions.containers_to_start.is_empty();
        // From here on the runtime may change: a read that began before is stale.
        let _mutating = (stops || starts).then(|| self.mutating(uid, false, None));

        self.kill_step(pod, uid, &name, &state, &actions, kills_live)
            .await?;
        if !actions.kill_pod && !actions.containers_to_resize.is_empty() {
            self.resize_in_place(pod, uid, &name, &state, &actions.containers_to_resize)
                .await;
        }
        if starts && superseded.is_cancelled() {
            // A safe point: the kills are done, nothing is created for a spec already replaced.
            tracing::info!(pod = %name, "a newer spec is waiting: nothing started for this one");
            outcome.actions = actions;
            return Ok(outcome);
        }
        if !starts {
            if !actions.terminal && !actions.kill_pod {
                // As the kubelet remounts them at each sync: changed configMaps, secrets and
                // tokens reach the running pod's volumes.
                self.volumes.refresh(pod, uid, &name).await;
            }
            outcome.actions = actions;
            if !stops {
                outcome.state = Some(state);
            }
            return Ok(outcome);
        }

        // A new sandbox: the images its containers need are pulled while it is made.
        let prefetched = if actions.create_sandbox {
            self.images
                .prefetch(pod, &name, uid, &containers_to_start(spec, &actions))
        } else {
            crate::images::Prefetched::default()
        };
        // Before the sandbox, as the kubelet waits for a pod's volumes before creating it.
        self.volumes
            .set_up(pod, uid, &name)
            .await
            .map_err(|source| Error::Volume {
                pod: name.clone(),
                source,
            })?;
        outcome.volumes_set_up = Some(Instant::now());
        let cgroup = self
            .cm
            .ensure_pod_cgroup_async(pod, uid)
            .await
            .map_err(|source| Error::Cgroup {
                pod: name.clone(),
                source,
            })?;
        let mut after = (!stops).then(|| state.clone());
        let (sandbox_id, sandbox_config) = self
            .ensure_sandbox(pod, uid, &name, &actions, &cgroup, &mut after)
            .await?;
        // The sandbox's status as this sync knows it (the one just started, or the one read):
        // the containers' environments and /etc/hosts see its IPs, as the kubelet reads them
        // right after RunPodSandbox.
        let known_status = match &after {
            Some(a) => a.sandbox_status.as_ref(),
            None if !actions.create_sandbox => state.sandbox_status.as_ref(),
            None => None,
        };
        let pod_ips = self
            .pod_ips(pod, &name, &sandbox_id, known_status.cloned())
            .await?;
        let index = state.index();
        let target = StartTarget {
            pod,
            name: &name,
            uid,
            index: &index,
            sandbox_id: &sandbox_id,
            sandbox_config: &sandbox_config,
            pod_ips: &pod_ips,
            cancel,
            prefetched: &prefetched,
            qos: Self::qos_of(pod)?,
        };
        self.start_init_containers(&target, spec, &actions, superseded, &mut outcome)
            .await;
        self.start_app_containers(&target, spec, &actions, superseded, &mut outcome)
            .await;
        outcome.actions = actions;
        if let Some(mut after) =
            after.filter(|_| outcome.waiting.is_empty() && !outcome.start_failed)
        {
            // Newest first, as `pod_state` orders them.
            after
                .containers
                .splice(0..0, outcome.started.drain(..).rev());
            outcome.state = Some(after);
            outcome.from_nothing = held_nothing;
        }
        Ok(outcome)
    }

    /// What swiftlet cannot honour or the API server would have refused, found before anything
    /// is created: a field swiftlet cannot honour is never dropped. The pod's spec when none.
    fn refuse_early<'p>(&self, pod: &'p Pod, name: &str) -> Result<&'p PodSpec> {
        let spec = pod
            .spec
            .as_ref()
            .ok_or_else(|| Error::NoSpec(name.to_owned()))?;
        if let Some(what) = unsupported::check(pod) {
            return Err(Error::Unsupported {
                pod: name.to_owned(),
                what,
            });
        }
        hooks::check_pod(pod)?;
        security::check_pod(pod, &self.cfg.security).map_err(|refusal| Error::Refused {
            pod: name.to_owned(),
            refusal,
        })?;
        crate::dns::check(spec).map_err(Self::dns_err(pod))?;
        Ok(spec)
    }

    /// What the runtime holds for the pod, for this sync: nothing without asking when the
    /// runtime cannot hold anything of it, else the read the PLEG handed over, else a read now.
    async fn state_for_sync(&self, uid: &str, name: &str) -> Result<PodState> {
        let known_empty = self.fresh().known.holds_nothing(uid);
        let handed = if known_empty {
            None
        } else {
            self.fresh().take(uid, Instant::now())
        };
        Ok(match handed {
            Some((state, young)) => {
                self.count_read(if young { "handoff" } else { "current" });
                state
            }
            None if known_empty => PodState::default(),
            None => self
                .pod_state_own_read(uid, "sync")
                .await
                .map_err(Self::cri_err(name))?,
        })
    }

    /// The kills the actions ask for: the whole pod (a sandbox to recreate, a finished pod; its
    /// old QoS cgroup left when its class changed), or the containers to kill one by one.
    async fn kill_step(
        &self,
        pod: &Pod,
        uid: &str,
        name: &str,
        state: &PodState,
        actions: &actions::PodActions,
        kills_live: bool,
    ) -> Result<()> {
        if actions.kill_pod {
            if actions.create_sandbox && actions.sandbox_id.is_some() {
                tracing::info!(pod = %name, attempt = actions.attempt, "sandbox changed, killing the pod to recreate it");
            } else if actions.terminal {
                tracing::info!(pod = %name, "pod finished: stopping what is left");
            }
            if kills_live {
                let _killing = self.mutating(uid, true, None);
                self.stop_runtime_pod(name, state, grace_period_secs(pod), false)
                    .await?;
            }
            if actions.qos_changed {
                self.leave_old_qos_cgroup(pod, uid, name).await?;
            }
            return Ok(());
        }
        let started = Instant::now();
        for k in &actions.containers_to_kill {
            tracing::info!(pod = %name, container = %k.name, reason = k.reason, message = %k.message, "killing container");
            if let Some(st) = state.containers.iter().find(|c| c.id == k.id) {
                let _stopping = self.mutating(uid, false, Some(&st.id));
                let grace = k.grace.unwrap_or_else(|| grace_period_secs(pod));
                let pod_ip = hooks::sandbox_ip(state.sandbox_status.as_ref());
                self.kill_container(name, st, grace, started, pod_ip.as_deref())
                    .await?;
            }
        }
        Ok(())
    }

    /// The sandbox the containers start in: the pod's current one, or a new one created now
    /// (its RuntimeClass's handler resolved, its log directory made while the runtime runs it).
    /// A new sandbox is added to `after`, which becomes `None` when its status cannot be read.
    async fn ensure_sandbox(
        &self,
        pod: &Pod,
        uid: &str,
        name: &str,
        actions: &actions::PodActions,
        cgroup: &str,
        after: &mut Option<PodState>,
    ) -> Result<(String, api::PodSandboxConfig)> {
        if let (Some(id), false) = (&actions.sandbox_id, actions.create_sandbox) {
            let config = self.sandbox_config(pod, uid, actions.attempt, cgroup)?;
            return Ok((id.clone(), config));
        }
        let (config, warnings) =
            self.sandbox_config_and_warnings(pod, uid, actions.attempt, cgroup)?;
        for warning in &warnings {
            // The kubelet records these as events on the pod.
            tracing::warn!(pod = %name, %warning, "forming the pod's DNS configuration");
        }
        // Resolved when a sandbox is created, and only then (as the kubelet does): a class
        // whose handler changes later leaves this sandbox as it is.
        let class = pod
            .spec
            .as_ref()
            .and_then(|s| s.runtime_class_name.as_deref());
        let handler = self
            .runtime_classes
            .handler(class)
            .await
            .map_err(|source| Error::RuntimeClass {
                pod: name.to_owned(),
                source,
            })?;
        if !handler.is_empty() {
            tracing::info!(pod = %name, runtime_handler = %handler, "running pod with runtime handler");
        }
        self.fresh().known.created.insert(uid.to_owned());
        // The log directory is first needed by CreateContainer: it is made while containerd
        // runs the sandbox, after every other pod ready to start has sent its RunPodSandbox (the
        // yield puts this task behind them), not before this one's.
        let log_dir = PathBuf::from(&config.log_directory);
        let make_log_dir = async {
            tokio::task::yield_now().await;
            if let Err(e) = std::fs::create_dir_all(&log_dir) {
                tracing::warn!(pod = %name, dir = %log_dir.display(), %e, "creating pod log directory");
            }
        };
        let (id, ()) = tokio::join!(
            self.cri.run_pod_sandbox(config.clone(), handler),
            make_log_dir
        );
        let id = id.map_err(Self::cri_err(name))?;
        tracing::info!(pod = %name, sandbox = %id, attempt = actions.attempt, "sandbox started");
        if let Some(a) = after.as_mut()
            && !self.add_started_sandbox(pod, &id, &config, a).await
        {
            *after = None;
        }
        Ok((id, config))
    }

    /// Starts the init containers the actions name, in order: a regular one that fails stops
    /// the rest, a sidecar that fails does not. A sidecar just started with no app container to
    /// start asks for the next look at once (the next init container may go as soon as it runs).
    async fn start_init_containers(
        &self,
        target: &StartTarget<'_>,
        spec: &PodSpec,
        actions: &actions::PodActions,
        superseded: &CancellationToken,
        outcome: &mut SyncOutcome,
    ) {
        let inits = spec.init_containers.as_deref().unwrap_or_default();
        let mut sidecar_started = false;
        for &i in &actions.init_to_start {
            let Some(c) = inits.get(i) else { continue };
            if superseded.is_cancelled() {
                break;
            }
            let kind = if crate::pod::is_sidecar(c) {
                ContainerKind::Sidecar
            } else {
                ContainerKind::Init
            };
            match self.start_with_backoff(target, c, kind, outcome).await {
                Ok(started) => sidecar_started |= started && kind == ContainerKind::Sidecar,
                Err(()) if kind == ContainerKind::Sidecar => {}
                Err(()) => break,
            }
        }
        if sidecar_started && actions.containers_to_start.is_empty() {
            outcome.requeue(Duration::ZERO);
        }
    }

    /// Starts the app containers the actions name; a failure is recorded in the outcome and the
    /// others still start. A newer spec waiting leaves the rest to its sync.
    async fn start_app_containers(
        &self,
        target: &StartTarget<'_>,
        spec: &PodSpec,
        actions: &actions::PodActions,
        superseded: &CancellationToken,
        outcome: &mut SyncOutcome,
    ) {
        for &i in &actions.containers_to_start {
            if superseded.is_cancelled() {
                tracing::info!(pod = %target.name, "a newer spec is waiting: the remaining containers are left to its sync");
                break;
            }
            if let Some(c) = spec.containers.get(i) {
                let _ = self
                    .start_with_backoff(target, c, ContainerKind::App, outcome)
                    .await;
            }
        }
    }

    /// Adds the sandbox this sync just ran to `after`. Its status is read only for a pod-network
    /// pod (for the pod IP); a host-network sandbox's status holds nothing the pod status shows.
    /// False when that read failed: then `after` is not known.
    pub(super) async fn add_started_sandbox(
        &self,
        pod: &Pod,
        id: &str,
        config: &api::PodSandboxConfig,
        after: &mut PodState,
    ) -> bool {
        let created_at = now_nanos();
        after.sandboxes.insert(
            0,
            api::PodSandbox {
                id: id.to_owned(),
                metadata: config.metadata.clone(),
                state: api::PodSandboxState::SandboxReady as i32,
                created_at,
                labels: config.labels.clone(),
                annotations: config.annotations.clone(),
                ..Default::default()
            },
        );
        after.sandbox_status = if Self::host_network(pod) {
            Some(api::PodSandboxStatus {
                id: id.to_owned(),
                metadata: config.metadata.clone(),
                state: api::PodSandboxState::SandboxReady as i32,
                created_at,
                ..Default::default()
            })
        } else {
            self.cri.pod_sandbox_status(id).await.ok().flatten()
        };
        after.sandbox_status.is_some()
    }
}

impl Manager {
    /// The IPs of pod-network sandbox `sandbox_id` (its status's IP, then its additional IPs),
    /// from `known` when that is its status, else read; none for a host-network pod.
    async fn pod_ips(
        &self,
        pod: &Pod,
        name: &str,
        sandbox_id: &str,
        known: Option<api::PodSandboxStatus>,
    ) -> Result<Vec<String>> {
        if Self::host_network(pod) {
            return Ok(Vec::new());
        }
        let status = match known.filter(|s| s.id == sandbox_id) {
            Some(s) => Some(s),
            None => self
                .cri
                .pod_sandbox_status(sandbox_id)
                .await
                .map_err(Self::cri_err(name))?,
        };
        Ok(hooks::sandbox_ips(status.as_ref()))
    }
}

/// The init and app containers the actions start, in start order.
fn containers_to_start<'s>(spec: &'s PodSpec, actions: &actions::PodActions) -> Vec<&'s Container> {
    let inits = spec.init_containers.as_deref().unwrap_or_default();
    actions
        .init_to_start
        .iter()
        .filter_map(|&i| inits.get(i))
        .chain(
            actions
                .containers_to_start
                .iter()
                .filter_map(|&i| spec.containers.get(i)),
        )
        .collect()
}
