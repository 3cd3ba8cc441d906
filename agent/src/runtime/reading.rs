//! Reading what the runtime holds: full relists and one pod's state (the PLEG stores its reads
//! in the pod cache, [`crate::pod_cache`], for the pod's next sync; a sync takes them there).
use super::*;

impl Manager {
    pub fn new(deps: Deps) -> Self {
        let Deps {
            cri,
            cm,
            cfg,
            probes,
            api_objects,
            images,
            volumes,
            pod_cache,
        } = deps;
        Self {
            cri,
            cm,
            cfg,
            backoff: Arc::new(Mutex::new(Backoff::new(
                CRASH_BACKOFF_INITIAL,
                CRASH_BACKOFF_MAX,
            ))),
            probes,
            resize: Arc::default(),
            fresh: pod_cache,
            runtime_classes: runtime_class::RuntimeClasses::new(api_objects.clone()),
            api: api_objects,
            volumes,
            images,
        }
    }

    pub(super) fn fresh(&self) -> std::sync::MutexGuard<'_, pod_cache::Fresh> {
        self.fresh.lock()
    }

    /// Marks a mutation of pod `uid` (`kill`: stopping the whole pod; `container`: stopping
    /// that one container) until the returned guard drops.
    pub(super) fn mutating(&self, uid: &str, kill: bool, container: Option<&str>) -> Mutating {
        self.fresh.mutating(uid, kill, container)
    }

    /// Stores `state`, read from a start at `token`, for pod `uid`'s next sync (the store
    /// rejects it when the pod was mutated since `token`; `None`: not to be stored).
    pub(super) fn hand_over(
        &self,
        uid: &str,
        token: Option<pod_cache::ReadToken>,
        state: &PodState,
    ) {
        if let Some(token) = token {
            self.fresh()
                .store(uid, token, state.clone(), Instant::now());
        }
    }

    /// [`Manager::pod_state`], counted in `swiftlet_runtime_pod_state_reads_total` as `source`.
    pub async fn pod_state_counted(
        &self,
        uid: &str,
        source: &'static str,
    ) -> cri::Result<PodState> {
        self.count_read(source);
        self.pod_state(uid).await
    }

    /// A read of pod `uid` that a sync (or the status after it) uses itself, counted as
    /// `source`: stored reads older than it are not used after it.
    pub async fn pod_state_own_read(
        &self,
        uid: &str,
        source: &'static str,
    ) -> cri::Result<PodState> {
        // Kept for the pod's next resync while the kernel path keeps it current.
        let (seq, token) = self.fresh().own_read_of(uid);
        let state = self.pod_state_counted(uid, source).await?;
        let mut fresh = self.fresh();
        if let Some(token) = token {
            fresh.store_own(uid, token, &state, std::time::Instant::now());
        }
        fresh.used(uid, seq);
        Ok(state)
    }

    pub(super) fn count_read(&self, source: &'static str) {
        self.cri
            .metrics()
            .runtime_pod_state_reads_total
            .get_or_create(&crate::metrics::SourceLabel { source })
            .inc();
    }

    /// Pod `uid` has terminated: the configMaps and secrets only it named are no longer
    /// watched.
    pub fn release_api_objects(&self, uid: &str) {
        self.api.release_pod(uid);
    }

    /// How many configMaps and secrets are watched for the pods.
    pub fn watched_api_objects(&self) -> usize {
        self.api.watched()
    }

    pub fn cri(&self) -> &Cri {
        &self.cri
    }

    pub(super) fn cri_err(pod: &str) -> impl FnOnce(cri::Error) -> Error + '_ {
        move |source| Error::Cri {
            pod: pod.to_owned(),
            source,
        }
    }

    pub(super) fn dns_err(pod: &Pod) -> impl Fn(crate::dns::Error) -> Error + '_ {
        move |source| Error::Dns {
            pod: full_name(pod),
            source,
        }
    }

    /// The filters of this agent's sandboxes and containers matching `extra` labels too.
    fn filters(
        &self,
        extra: Option<(&str, &str)>,
    ) -> (api::PodSandboxFilter, api::ContainerFilter) {
        labels::node_filters(&self.cfg.node_name, extra)
    }

    /// This agent's sandboxes and containers matching `extra` labels, the containers listed
    /// briefly (their ids and states, by pod):
    /// what relists and pod reads need.
    async fn list_brief(
        &self,
        extra: Option<(&str, &str)>,
    ) -> cri::Result<HashMap<String, ListedPod>> {
        let (sandboxes, containers) = self.filters(extra);
        let (sandboxes, containers) = tokio::try_join!(
            self.cri.list_pod_sandbox(Some(sandboxes)),
            self.cri.list_containers_brief(Some(containers))
        )?;
        let pods =
            crate::pod::state::by_pod(sandboxes, containers, |c| c.labels.get(labels::POD_UID));
        Ok(pods
            .into_iter()
            .map(|(uid, (s, c))| (uid, (s, c.into_iter().map(|c| (c.id, c.state)).collect())))
            .collect())
    }

    /// Every pod this agent has in the runtime, by UID, its sandboxes and containers listed
    /// briefly (the PLEG's relist: two CRI calls).
    pub async fn relist(&self) -> cri::Result<HashMap<String, ListedPod>> {
        self.list_brief(None).await
    }

    /// A pod's state from what a relist listed of it (`listed`): only the statuses of its
    /// sandbox and containers are asked for (2 CRI calls fewer than [`Manager::pod_state`]);
    /// counted as `source`.
    pub async fn pod_state_listed(
        &self,
        uid: &str,
        (sandboxes, containers): ListedPod,
        source: &'static str,
    ) -> cri::Result<PodState> {
        self.count_read(source);
        self.state_of(uid, sandboxes, containers).await
    }

    /// Everything the runtime knows about one pod.
    pub async fn pod_state(&self, uid: &str) -> cri::Result<PodState> {
        let (sandboxes, listed) = self
            .list_brief(Some((labels::POD_UID, uid)))
            .await?
            .remove(uid)
            .unwrap_or_default();
        self.state_of(uid, sandboxes, listed).await
    }

    /// A pod's state from its listed sandboxes and containers: their statuses read.
    pub(super) async fn state_of(
        &self,
        uid: &str,
        mut sandboxes: Vec<api::PodSandbox>,
        listed: Vec<(String, i32)>,
    ) -> cri::Result<PodState> {
        sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
        let sandbox_status = match sandboxes.first() {
            Some(s) => match self.cri.pod_sandbox_status(&s.id).await {
                Ok(st) => st,
                Err(e) if e.is_not_found() => None,
                Err(e) => return Err(e),
            },
            None => None,
        };
        let reused = self
            .fresh()
            .reuse_statuses(uid, listed.iter().map(|(id, state)| (id.as_str(), *state)));
        let mut containers = Vec::with_capacity(listed.len());
        for ((id, _), known) in listed.iter().zip(reused) {
            if let Some(st) = known {
                containers.push(st);
                continue;
            }
            match self.cri.container_status(id).await {
                Ok(Some(st)) => containers.push(st),
                Ok(None) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        self.fresh().remember_statuses(uid, &containers);
        containers.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        let resize_error = self.overlay_resized(uid, &mut containers);
        Ok(PodState {
            sandboxes,
            sandbox_status,
            containers,
            resize_error,
        })
    }
}
