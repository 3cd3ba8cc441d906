//! In-place resize of a running container's resources.
use super::*;

impl Manager {
    /// Puts the resources applied by in-place resizes over the create-time annotation of each
    /// container, forgets containers that are gone; returns the pod's resize error.
    pub(super) fn overlay_resized(
        &self,
        uid: &str,
        containers: &mut [api::ContainerStatus],
    ) -> Option<String> {
        let r = self.resize.lock().unwrap_or_else(|p| p.into_inner());
        if r.applied.is_empty() && r.errors.is_empty() {
            return None;
        }
        for c in containers.iter_mut() {
            if let Some(applied) = r.applied.get(&c.id) {
                c.annotations
                    .insert(labels::CONTAINER_RESOURCES.to_owned(), applied.clone());
            }
        }
        r.errors.get(uid).cloned()
    }

    /// After a QoS class change: the pod's cgroups under other classes go (the kubelet leaves
    /// the old one behind until the pod is deleted).
    pub(super) async fn leave_old_qos_cgroup(
        &self,
        pod: &Pod,
        uid: &str,
        name: &str,
    ) -> Result<()> {
        let err = |source| Error::Cgroup {
            pod: name.to_owned(),
            source,
        };
        let qos = crate::pod::pod_qos(pod).map_err(|e| err(e.into()))?;
        tracing::info!(pod = %name, qos = qos.as_str(), "QoS class changed: pod recreated under the new QoS cgroup");
        // Removing a cgroup kills what is left in it and retries with sleeps: a blocking thread.
        let (cm, uid) = (self.cm.clone(), uid.to_owned());
        match tokio::task::spawn_blocking(move || cm.destroy_pod_cgroups_except(&uid, Some(qos)))
            .await
        {
            Ok(r) => r.map_err(err),
            Err(e) => {
                tracing::warn!(pod = %name, %e, "removing the old QoS class's pod cgroup");
                Ok(())
            }
        }
    }

    /// In-place resize (KEP-1287): the pod cgroup and each container's resources through CRI
    /// `UpdateContainerResources`, no restart. A pod memory limit below what the pod uses now is
    /// refused. The outcome is kept for the status.
    pub(super) async fn resize_in_place(
        &self,
        pod: &Pod,
        uid: &str,
        name: &str,
        state: &PodState,
        indices: &[usize],
    ) {
        let result = self.try_resize(pod, uid, state, indices).await;
        let mut r = self.resize.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(applied) => {
                tracing::info!(pod = %name, containers = applied.len(), "resized in place");
                r.errors.remove(uid);
                let live: std::collections::HashSet<&str> =
                    state.containers.iter().map(|c| c.id.as_str()).collect();
                r.applied.retain(|id, _| live.contains(id.as_str()));
                r.applied.extend(applied);
            }
            Err(message) => {
                tracing::warn!(pod = %name, %message, "resize not done");
                r.errors.insert(uid.to_owned(), message);
            }
        }
    }

    pub(super) async fn try_resize(
        &self,
        pod: &Pod,
        uid: &str,
        state: &PodState,
        indices: &[usize],
    ) -> std::result::Result<Vec<(String, String)>, String> {
        let spec = pod.spec.as_ref().ok_or("no spec")?;
        let qos = crate::pod::pod_qos(pod).map_err(|e| e.to_string())?;
        let cgroup = self
            .cm
            .pod_cgroup_name(uid, qos)
            .map_err(|e| e.to_string())?;
        let rc = cm::resource_config_for_pod(pod).map_err(|e| e.to_string())?;
        if let Some(limit) = rc.memory_limit {
            let usage = self.cm.memory_usage(&cgroup).map_err(|e| e.to_string())?;
            if limit < usage {
                return Err(format!(
                    "pod memory limit {limit} is below the pod's current memory usage {usage}: resize refused"
                ));
            }
        }
        let mut updates = Vec::new();
        for &i in indices {
            let Some(c) = spec.containers.get(i) else {
                continue;
            };
            let Some(st) = state.newest(&c.name) else {
                continue;
            };
            updates.push((
                st.id.clone(),
                cm::container_resources(c).map_err(|e| e.to_string())?,
            ));
        }
        // First the pod cgroup's limits that grow, then the containers, then the pod cgroup's
        // limits that shrink: a parent's limit must hold its children's.
        let grown = self
            .cm
            .grown_config(&cgroup, &rc)
            .map_err(|e| format!("reading the pod cgroup: {e}"))?;
        self.cm
            .apply(&cgroup, &grown)
            .map_err(|e| format!("updating the pod cgroup: {e}"))?;
        let mut applied = Vec::new();
        for (id, res) in updates {
            let label = cm::resources_label(&res);
            self.cri
                .update_container_resources(&id, res)
                .await
                .map_err(|e| format!("UpdateContainerResources {id}: {e}"))?;
            applied.push((id, label));
        }
        self.cm
            .ensure_pod_cgroup_async(pod, uid)
            .await
            .map_err(|e| format!("updating the pod cgroup: {e}"))?;
        Ok(applied)
    }
}
