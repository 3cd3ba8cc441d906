//! Stopping containers and pods: preStop hooks, grace periods, the order of kills.
use super::*;

/// A pod stop with at least this many containers logs its progress every this many stopped.
const PROGRESS_EVERY: usize = 100;

impl Manager {
    pub(super) async fn stop_container(&self, pod: &str, id: &str, grace: i64) -> Result<()> {
        match self.cri.stop_container(id, grace.max(MIN_GRACE_SECS)).await {
            Err(e) if !e.is_not_found() => Err(Self::cri_err(pod)(e)),
            _ => Ok(()),
        }
    }

    /// Stops one container within what is left of `grace` seconds counted from `since`: its
    /// preStop hook (from the container's annotations, with `pod_ip`, the pod's IP when it has
    /// one) first, then StopContainer with the whole seconds that remain (at least 2).
    pub(super) async fn kill_container(
        &self,
        pod: &str,
        st: &api::ContainerStatus,
        grace: i64,
        since: Instant,
        pod_ip: Option<&str>,
    ) -> Result<()> {
        let name = st.metadata.as_ref().map_or("", |m| m.name.as_str());
        let left = |since: Instant| {
            Duration::from_secs(grace.max(0).unsigned_abs()).saturating_sub(since.elapsed())
        };
        if st.state == api::ContainerState::ContainerRunning as i32
            && let Some(handler) = st
                .annotations
                .get(labels::PRE_STOP_HANDLER)
                .and_then(|j| serde_json::from_str::<LifecycleHandler>(j).ok())
            && !left(since).is_zero()
        {
            self.pre_stop(pod, st, pod_ip, &handler, left(since)).await;
        }
        // Whole seconds elapsed are taken off the grace period, as the kubelet does.
        let remaining = grace - i64::try_from(since.elapsed().as_secs()).unwrap_or(i64::MAX);
        tracing::debug!(pod, container = name, remaining, "stopping container");
        self.stop_container(pod, &st.id, remaining).await
    }

    /// Runs a preStop hook, waiting at most `budget`. Failures are logged (the kubelet's
    /// FailedPreStopHook): the container is stopped anyway.
    pub(super) async fn pre_stop(
        &self,
        pod: &str,
        st: &api::ContainerStatus,
        pod_ip: Option<&str>,
        handler: &LifecycleHandler,
        budget: Duration,
    ) {
        let container = st.metadata.as_ref().map_or("", |m| m.name.as_str());
        let started = Instant::now();
        // Validated when the container was created; the bound on sleep is the budget here.
        let hook = match hooks::Hook::parse(handler, i64::MAX) {
            Ok(hook) => hook,
            Err(e) => {
                tracing::warn!(pod, container, error = %e, "preStop hook not run");
                return;
            }
        };
        let uid = st.labels.get(labels::POD_UID).map_or("", String::as_str);
        let run = hooks::HookRun {
            pod: format!("{pod}({uid})"),
            container,
            target: crate::handler::Target {
                container_id: st.id.clone(),
                pod_ip: pod_ip.map(str::to_owned),
                ports: hooks::ports_of(st),
            },
            exec_timeout_secs: i64::try_from(budget.as_secs().max(1)).unwrap_or(i64::MAX),
        };
        match tokio::time::timeout(budget, self.run_hook(&hook, &run)).await {
            Ok(Ok(())) => {}
            Ok(Err(message)) => {
                tracing::warn!(pod, container, reason = "FailedPreStopHook", %message, "preStop hook failed")
            }
            Err(_) => tracing::warn!(
                pod,
                container,
                ?budget,
                "preStop hook did not finish within the grace period"
            ),
        }
        tracing::info!(pod, container, elapsed = ?started.elapsed(), "preStop hook done");
    }

    /// Stops every live container within the grace period (app and init containers in parallel,
    /// then sidecars one at a time in reverse start order), then the sandboxes: the ready ones, or
    /// with `remove` every one, removed as well.
    pub(super) async fn stop_runtime_pod(
        &self,
        name: &str,
        state: &PodState,
        grace: i64,
        remove: bool,
    ) -> Result<()> {
        let since = Instant::now();
        let live = |c: &&api::ContainerStatus| is_live(c);
        let is_sidecar = |c: &&api::ContainerStatus| {
            c.annotations
                .get(labels::CONTAINER_TYPE)
                .map(String::as_str)
                == Some(ContainerKind::Sidecar.as_str())
        };
        let uid = cri::current_pod();
        let pod_ip = hooks::sandbox_ip(state.sandbox_status.as_ref());
        let mut stops = tokio::task::JoinSet::new();
        for c in state
            .containers
            .iter()
            .filter(live)
            .filter(|c| !is_sidecar(c))
        {
            let (this, name, st, uid) = (self.clone(), name.to_owned(), c.clone(), uid.clone());
            let pod_ip = pod_ip.clone();
            stops.spawn(async move {
                let kill = this.kill_container(&name, &st, grace, since, pod_ip.as_deref());
                match uid {
                    Some(uid) => cri::with_pod(&uid, kill).await,
                    None => kill.await,
                }
            });
        }
        // Every stop runs at once (the kubelet's goroutine per container): each container's
        // grace period counts from `since`, so the whole pod is down within one grace period
        // however many containers it has. Progress goes to the log every PROGRESS_EVERY stops.
        let total = stops.len();
        if total >= PROGRESS_EVERY {
            tracing::info!(pod = %name, containers = total, grace, "stopping containers");
        }
        let mut first_err = None;
        let mut stopped = 0;
        while let Some(res) = stops.join_next().await {
            stopped += 1;
            if let Ok(Err(e)) = res {
                first_err.get_or_insert(e);
            }
            if total >= PROGRESS_EVERY && (stopped % PROGRESS_EVERY == 0 || stopped == total) {
                tracing::info!(pod = %name, stopped, of = total, elapsed = ?since.elapsed(), "containers stopped");
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        let mut sidecars: Vec<&api::ContainerStatus> = state
            .containers
            .iter()
            .filter(live)
            .filter(is_sidecar)
            .collect();
        sidecars.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        for c in sidecars {
            self.kill_container(name, c, grace, since, pod_ip.as_deref())
                .await?;
        }
        for s in &state.sandboxes {
            let ready = s.state == api::PodSandboxState::SandboxReady as i32;
            if ready || remove {
                self.ignore_not_found(name, self.cri.stop_pod_sandbox(&s.id).await)?;
            }
            if remove {
                self.ignore_not_found(name, self.cri.remove_pod_sandbox(&s.id).await)?;
            }
        }
        Ok(())
    }

    pub(super) fn ignore_not_found(&self, pod: &str, r: cri::Result<()>) -> Result<()> {
        match r {
            Err(e) if !e.is_not_found() => Err(Self::cri_err(pod)(e)),
            _ => Ok(()),
        }
    }

    /// Terminates a pod: containers within `grace` seconds (preStop hooks inside it, sidecars
    /// last), then its sandboxes (stopped and removed), then its cgroup and log directory, and
    /// forgets its back-offs. Works from the UID alone (hooks and order come from the containers'
    /// annotations), so orphans can be killed too.
    pub async fn kill_pod(&self, name: &str, uid: &str, grace: i64) -> Result<()> {
        let killing = self.mutating(uid, true, None);
        let result = cri::with_pod(uid, self.kill_pod_traced(name, uid, grace)).await;
        drop(killing);
        if result.is_ok() {
            self.fresh().forget(uid);
        }
        result
    }

    /// Stops a pod that finished (Succeeded or Failed) without removing anything: its containers
    /// stay for their status and logs, as the kubelet leaves them to container GC. Removal comes
    /// with `kill_pod` once no source wants the pod.
    pub async fn stop_pod(&self, name: &str, uid: &str, grace: i64) -> Result<()> {
        let _killing = self.mutating(uid, true, None);
        let state = self
            .pod_state_counted(uid, "kill")
            .await
            .map_err(Self::cri_err(name))?;
        self.stop_runtime_pod(name, &state, grace, false).await?;
        // Nothing will run in the pod again: its volumes go (a hostPath is left as it is).
        self.volumes.tear_down(uid, name).await;
        Ok(())
    }

    /// [`Manager::kill_pod`] for a known pod: the grace period is `grace_override`, else the pod's
    /// deletion grace period, else its `terminationGracePeriodSeconds`, else 30 s (at least 2 s).
    pub async fn kill_pod_for(&self, pod: &Pod, grace_override: Option<i64>) -> Result<()> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let grace = grace_override
            .unwrap_or_else(|| grace_period_secs(pod))
            .max(MIN_GRACE_SECS);
        self.kill_pod(&full_name(pod), &uid, grace).await
    }

    pub(super) async fn kill_pod_traced(&self, name: &str, uid: &str, grace: i64) -> Result<()> {
        let state = self
            .pod_state_counted(uid, "kill")
            .await
            .map_err(Self::cri_err(name))?;
        self.stop_runtime_pod(name, &state, grace, true).await?;
        // Without the spec (orphans) the QoS class is unknown: try the pod's place under each.
        self.cm
            .destroy_pod_cgroups_async(uid)
            .await
            .map_err(|source| Error::Cgroup {
                pod: name.to_owned(),
                source,
            })?;
        let dirs: Vec<PathBuf> = state
            .sandboxes
            .iter()
            .filter_map(|s| s.metadata.as_ref())
            .map(|m| {
                crate::pod::log_paths::pod_log_dir(
                    &self.cfg.pod_logs_dir,
                    &m.namespace,
                    &m.name,
                    &m.uid,
                )
            })
            .collect();
        // The containers' log links go with them (one the read missed is left dangling, for the
        // container garbage collector).
        let links: Vec<String> = state
            .containers
            .iter()
            .filter_map(crate::logs::links::name_of)
            .collect();
        let links_dir = crate::logs::links::dir_for(&self.cfg.pod_logs_dir);
        // A log directory can hold many files: removed on a blocking thread. The pod's own
        // directory (volumes, termination message files) goes once its volumes are torn down;
        // what cannot be torn down is left for housekeeping's orphan pass to try again.
        let pod = name.to_owned();
        let (pods_dir, pod_uid) = (self.cfg.pods_dir.clone(), uid.to_owned());
        let removed = tokio::task::spawn_blocking(move || {
            for link in links {
                if let Err(e) = crate::logs::links::remove(&links_dir, &link) {
                    tracing::warn!(%pod, %link, %e, "removing a container's log link");
                }
            }
            for dir in dirs {
                if let Err(e) = std::fs::remove_dir_all(&dir)
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    tracing::warn!(%pod, dir = %dir.display(), %e, "removing pod log directory");
                }
            }
            if let Err(e) = crate::volume::remove_pod_dir(&pods_dir, &pod_uid) {
                tracing::warn!(%pod, error = %e, "removing the pod's directory");
            }
        });
        if let Err(e) = removed.await {
            tracing::warn!(pod = %name, %e, "removing pod log directories");
        }
        self.backoff
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .forget_prefix(&format!("{uid}_"));
        self.images.forget_pod(uid);
        self.volumes.forget(uid);
        self.fresh().known.created.remove(uid);
        self.resize
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .forget_pod(uid, state.containers.iter().map(|c| c.id.as_str()));
        Ok(())
    }
}
