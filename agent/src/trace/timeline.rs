//! One pod's startup timeline and its breakdown into consecutive phases. Pure data: no clock, no
//! locks; [`super::Tracer`] feeds it.
//!
//! Every time is CLOCK_MONOTONIC nanoseconds, the clock of `bpf_ktime_get_ns`, so the agent's own
//! marks, the CRI calls (uprobes) and what the kernel saw (tracepoints) line up.
//!
//! The breakdown runs from "source seen" to "Running observed", or to a container's first exec when
//! that comes later (the runtime reports a container running once its init process runs, which
//! can precede the user process's `execve`). It is built from milestones sorted by time; **each
//! phase is named after the milestone that ends it**:
//!
//! | phase | ends when | observer |
//! |---|---|---|
//! | `admission` | the sync loop handed the pod to a worker | agent |
//! | `dispatch` | the pod worker started on it | agent |
//! | `volumes` | its volumes were set up (configMaps, secrets, tokens read and written) | agent |
//! | `pod_cgroup` | the pod cgroup directory was created (`cgroup_mkdir`) | kernel |
//! | `agent/RunPodSandbox` | the agent issued RunPodSandbox | cri |
//! | `sandbox_exec` | the sandbox's first process ran `execve` | kernel |
//! | `RunPodSandbox` | RunPodSandbox returned | cri |
//! | `agent/image/<c>` | the agent issued the container's image check (ImageStatus) | cri |
//! | `image/<c>` | the image check returned (after PullImage when the image was absent) | cri |
//! | `agent/CreateContainer/<c>` | the agent issued CreateContainer | cri |
//! | `CreateContainer/<c>` | CreateContainer returned | cri |
//! | `agent/StartContainer/<c>` | the agent issued StartContainer | cri |
//! | `exec/<c>` | the container's first process ran `execve` | kernel |
//! | `StartContainer/<c>` | StartContainer returned | cri |
//! | `running_observed` | the status manager saw the pod Running | agent |
//!
//! A milestone that was not observed (probes off, an event missed) is left out and its time goes
//! to the next phase, so the phases always add up to the end-to-end time.

use std::collections::HashMap;

/// Who observed a milestone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Observer {
    Agent,
    Cri,
    Kernel,
}

impl Observer {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Cri => "cri",
            Self::Kernel => "kernel",
        }
    }
}

/// One CRI call about this pod, from the uprobe markers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CriSpan {
    pub method: &'static str,
    pub begin_ns: u64,
    pub end_ns: Option<u64>,
    pub ok: Option<bool>,
}

/// A cgroup of this pod in which a process ran `execve`, in order of the first exec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecCgroup {
    pub cgroup_id: u64,
    /// When the cgroup was created (`cgroup_mkdir`), when seen: the sandbox's during
    /// RunPodSandbox, a container's during its StartContainer (the runtime creates the task then).
    pub created_ns: Option<u64>,
    /// The exec of the cgroup's own process: the first exec, unless the process that made it
    /// exited before another exec in the cgroup (then that later exec; see `Tracer`'s exec
    /// handling).
    pub first_exec_ns: u64,
    pub pid: u32,
    pub comm: String,
    /// When that process exited, and its exit code when known.
    pub exit: Option<(u64, Option<i32>)>,
}

/// Everything recorded about one pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodRecord {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    /// The spec's containers, in the order the agent starts them.
    pub containers: Vec<String>,
    pub source_seen_ns: Option<u64>,
    pub admitted_ns: Option<u64>,
    pub worker_started_ns: Option<u64>,
    /// When the worker's sync finished setting up the pod's volumes.
    pub volumes_ns: Option<u64>,
    pub pod_cgroup_ns: Option<u64>,
    pub pod_cgroup_removed_ns: Option<u64>,
    pub cri: Vec<CriSpan>,
    pub execs: Vec<ExecCgroup>,
    pub running_observed_ns: Option<u64>,
    /// Set once the phases went into the histograms.
    pub observed: bool,
}

/// A consecutive piece of the startup.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Phase {
    pub name: String,
    /// The name without the container, for metrics (`exec/app` -> `exec`).
    pub kind: String,
    pub start_ns: u64,
    pub end_ns: u64,
    pub observer: Observer,
}

impl Phase {
    pub fn ms(&self) -> f64 {
        self.end_ns.saturating_sub(self.start_ns) as f64 / 1e6
    }
}

/// A point in the pod's life outside the startup breakdown (or the raw events behind it).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Mark {
    pub name: String,
    pub at_ns: u64,
    pub observer: Observer,
    pub detail: String,
}

struct Milestone {
    at: u64,
    name: String,
    kind: String,
    observer: Observer,
}

/// The container at `index` (its spec name when known).
fn container_name(containers: &[String], index: usize) -> String {
    containers
        .get(index)
        .cloned()
        .unwrap_or_else(|| format!("#{index}"))
}

impl PodRecord {
    pub fn new(uid: &str) -> Self {
        Self {
            uid: uid.to_owned(),
            ..Default::default()
        }
    }

    /// What the record takes in memory: itself, its key in the tracer's map (a copy of the UID)
    /// and every buffer it owns, by capacity.
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        let strings = self.uid.capacity() * 2 + self.name.capacity() + self.namespace.capacity();
        let containers = self.containers.capacity() * size_of::<String>()
            + self.containers.iter().map(String::capacity).sum::<usize>();
        let execs = self.execs.capacity() * size_of::<ExecCgroup>()
            + self.execs.iter().map(|e| e.comm.capacity()).sum::<usize>();
        size_of::<Self>()
            + size_of::<String>()
            + strings
            + containers
            + self.cri.capacity() * size_of::<CriSpan>()
            + execs
    }

    /// The first call of `method` (the pod's first start; restarts come later).
    fn first_calls(&self, method: &str) -> impl Iterator<Item = &CriSpan> {
        self.cri.iter().filter(move |s| s.method == method)
    }

    /// Assigns exec cgroups by when each cgroup was created (its first exec when the creation was
    /// not seen; an exec can land after the CRI call that caused it returned, a creation cannot):
    /// the one created before the first StartContainer is the sandbox's; container `k` gets the
    /// first unassigned cgroup created after its StartContainer began. Returns (sandbox exec,
    /// per-container exec).
    fn assign_execs(&self) -> (Option<&ExecCgroup>, Vec<Option<&ExecCgroup>>) {
        let starts: Vec<&CriSpan> = self
            .first_calls("StartContainer")
            .take(self.containers.len().max(1))
            .collect();
        let first_start = starts.first().map(|s| s.begin_ns);
        let born = |e: &ExecCgroup| e.created_ns.unwrap_or(e.first_exec_ns);
        let sandbox = self
            .execs
            .iter()
            .find(|e| first_start.is_none_or(|t| born(e) < t));
        let mut used: Vec<u64> = sandbox.iter().map(|e| e.cgroup_id).collect();
        let mut per_container = Vec::new();
        for start in &starts {
            let found = self
                .execs
                .iter()
                .find(|e| born(e) >= start.begin_ns && !used.contains(&e.cgroup_id));
            if let Some(e) = found {
                used.push(e.cgroup_id);
            }
            per_container.push(found);
        }
        (sandbox, per_container)
    }

    fn milestones(&self) -> Vec<Milestone> {
        let mut out = Vec::new();
        let mut push = |at: Option<u64>, name: String, kind: &str, observer| {
            if let Some(at) = at {
                out.push(Milestone {
                    at,
                    name,
                    kind: kind.to_owned(),
                    observer,
                });
            }
        };
        push(
            self.admitted_ns,
            "admission".into(),
            "admission",
            Observer::Agent,
        );
        push(
            self.worker_started_ns,
            "dispatch".into(),
            "dispatch",
            Observer::Agent,
        );
        push(
            self.volumes_ns,
            "volumes".into(),
            "volumes",
            Observer::Agent,
        );
        push(
            self.pod_cgroup_ns,
            "pod_cgroup".into(),
            "pod_cgroup",
            Observer::Kernel,
        );
        if let Some(sandbox) = self.first_calls("RunPodSandbox").next() {
            push(
                Some(sandbox.begin_ns),
                "agent/RunPodSandbox".into(),
                "agent/RunPodSandbox",
                Observer::Cri,
            );
            push(
                sandbox.end_ns,
                "RunPodSandbox".into(),
                "RunPodSandbox",
                Observer::Cri,
            );
        }
        let (sandbox_exec, execs) = self.assign_execs();
        push(
            sandbox_exec.map(|e| e.first_exec_ns),
            "sandbox_exec".into(),
            "sandbox_exec",
            Observer::Kernel,
        );
        let n = self.containers.len().max(1);
        // A container's image check (ImageStatus, PullImage when absent) is the CRI calls of
        // that kind begun after the previous container's CreateContainer and before its own.
        let mut after = 0;
        for (i, span) in self.first_calls("CreateContainer").take(n).enumerate() {
            let c = container_name(&self.containers, i);
            let check: Vec<&CriSpan> = self
                .cri
                .iter()
                .filter(|s| {
                    matches!(s.method, "ImageStatus" | "PullImage")
                        && s.begin_ns >= after
                        && s.begin_ns <= span.begin_ns
                })
                .collect();
            after = span.begin_ns;
            push(
                check.iter().map(|s| s.begin_ns).min(),
                format!("agent/image/{c}"),
                "agent/image",
                Observer::Cri,
            );
            push(
                check.iter().filter_map(|s| s.end_ns).max(),
                format!("image/{c}"),
                "image",
                Observer::Cri,
            );
            push(
                Some(span.begin_ns),
                format!("agent/CreateContainer/{c}"),
                "agent/CreateContainer",
                Observer::Cri,
            );
            push(
                span.end_ns,
                format!("CreateContainer/{c}"),
                "CreateContainer",
                Observer::Cri,
            );
        }
        for (i, span) in self.first_calls("StartContainer").take(n).enumerate() {
            let c = container_name(&self.containers, i);
            push(
                Some(span.begin_ns),
                format!("agent/StartContainer/{c}"),
                "agent/StartContainer",
                Observer::Cri,
            );
            push(
                span.end_ns,
                format!("StartContainer/{c}"),
                "StartContainer",
                Observer::Cri,
            );
            push(
                execs.get(i).copied().flatten().map(|e| e.first_exec_ns),
                format!("exec/{c}"),
                "exec",
                Observer::Kernel,
            );
        }
        push(
            self.running_observed_ns,
            "running_observed".into(),
            "running_observed",
            Observer::Agent,
        );
        // Stable: equal times keep the causal order they were pushed in.
        out.sort_by_key(|m| m.at);
        out
    }

    /// Consecutive phases from source seen to the last milestone (Running observed once seen).
    pub fn breakdown(&self) -> Vec<Phase> {
        let milestones = self.milestones();
        let Some(start) = self
            .source_seen_ns
            .or_else(|| milestones.first().map(|m| m.at))
        else {
            return Vec::new();
        };
        let mut phases = Vec::with_capacity(milestones.len());
        let mut at = start;
        for m in milestones {
            // A milestone before the start (clock conversion of `config.seen`) is a zero phase.
            let end = m.at.max(at);
            phases.push(Phase {
                name: m.name,
                kind: m.kind,
                start_ns: at,
                end_ns: end,
                observer: m.observer,
            });
            at = end;
        }
        phases
    }

    /// Source seen to the end of the breakdown (Running observed or a later first exec), in ms,
    /// once Running was observed.
    pub fn e2e_ms(&self) -> Option<f64> {
        self.e2e_ms_of(&self.breakdown())
    }

    /// [`Self::e2e_ms`] from this record's [`Self::breakdown`], already computed.
    pub fn e2e_ms_of(&self, phases: &[Phase]) -> Option<f64> {
        let (first, last) = (phases.first()?, phases.last()?);
        self.running_observed_ns?;
        Some(last.end_ns.saturating_sub(first.start_ns) as f64 / 1e6)
    }

    /// The agent's own share of the start, in ms: end-to-end minus the time some CRI call for
    /// this pod was in flight (the union of its spans within the breakdown), once Running was
    /// observed. Scheduling delays between calls, file and cgroup work, the status update: all
    /// count as the agent's; a container's exec seen after Running does not.
    pub fn agent_ms(&self) -> Option<f64> {
        self.agent_ms_of(&self.breakdown())
    }

    /// [`Self::agent_ms`] from this record's [`Self::breakdown`], already computed.
    pub fn agent_ms_of(&self, phases: &[Phase]) -> Option<f64> {
        let running = self.running_observed_ns?;
        let start = phases.first()?.start_ns;
        let end = running.max(start);
        let mut spans: Vec<(u64, u64)> = self
            .cri
            .iter()
            .filter_map(|s| Some((s.begin_ns.max(start), s.end_ns?.min(end))))
            .filter(|(b, e)| b < e)
            .collect();
        spans.sort_unstable();
        let (mut in_cri, mut covered_to) = (0, start);
        for (b, e) in spans {
            let b = b.max(covered_to);
            if e > b {
                in_cri += e - b;
                covered_to = e;
            }
        }
        Some((end - start).saturating_sub(in_cri) as f64 / 1e6)
    }

    /// True once every phase the observers can see has been seen: Running observed, and with
    /// `kernel` (probes loaded) the pod cgroup, and each container's StartContainer return and
    /// first exec.
    pub fn complete(&self, kernel: bool) -> bool {
        if self.running_observed_ns.is_none() {
            return false;
        }
        if !kernel {
            return true;
        }
        let n = self.containers.len();
        let (_, execs) = self.assign_execs();
        let started = self
            .first_calls("StartContainer")
            .take(n)
            .filter(|s| s.end_ns.is_some())
            .count();
        self.pod_cgroup_ns.is_some() && started == n && execs.iter().flatten().count() == n
    }

    /// Raw points: CRI calls (including later ones), execs, exits, cgroup removal.
    pub fn marks(&self) -> Vec<Mark> {
        let mut out = Vec::new();
        for span in &self.cri {
            out.push(Mark {
                name: format!("{}:begin", span.method),
                at_ns: span.begin_ns,
                observer: Observer::Cri,
                detail: String::new(),
            });
            if let Some(end) = span.end_ns {
                out.push(Mark {
                    name: format!("{}:end", span.method),
                    at_ns: end,
                    observer: Observer::Cri,
                    detail: match span.ok {
                        Some(false) => "failed".into(),
                        _ => "ok".into(),
                    },
                });
            }
        }
        let (sandbox, execs) = self.assign_execs();
        let mut names: HashMap<u64, String> = HashMap::new();
        if let Some(s) = sandbox {
            names.insert(s.cgroup_id, "sandbox".into());
        }
        for (i, e) in execs.iter().enumerate() {
            if let Some(e) = e {
                names.insert(e.cgroup_id, container_name(&self.containers, i));
            }
        }
        for e in &self.execs {
            let who = names
                .get(&e.cgroup_id)
                .cloned()
                .unwrap_or_else(|| format!("cgroup {}", e.cgroup_id));
            out.push(Mark {
                name: format!("first_exec/{who}"),
                at_ns: e.first_exec_ns,
                observer: Observer::Kernel,
                detail: format!("pid {} {}", e.pid, e.comm),
            });
            if let Some((at, code)) = e.exit {
                out.push(Mark {
                    name: format!("exit/{who}"),
                    at_ns: at,
                    observer: Observer::Kernel,
                    detail: code
                        .map_or_else(|| "exit code unknown".into(), |c| format!("exit code {c}")),
                });
            }
        }
        if let Some(at) = self.pod_cgroup_removed_ns {
            out.push(Mark {
                name: "pod_cgroup_removed".into(),
                at_ns: at,
                observer: Observer::Kernel,
                detail: String::new(),
            });
        }
        out.sort_by_key(|m| m.at_ns);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn span(method: &'static str, begin: u64, end: u64) -> CriSpan {
        CriSpan {
            method,
            begin_ns: begin * MS,
            end_ns: Some(end * MS),
            ok: Some(true),
        }
    }

    fn exec(cgroup_id: u64, at: u64) -> ExecCgroup {
        ExecCgroup {
            cgroup_id,
            created_ns: None,
            first_exec_ns: at * MS,
            pid: cgroup_id as u32,
            comm: "x".into(),
            exit: None,
        }
    }

    /// A full single-container start, milestones in the order they happen.
    fn full() -> PodRecord {
        PodRecord {
            uid: "u".into(),
            name: "p".into(),
            namespace: "default".into(),
            containers: vec!["app".into()],
            source_seen_ns: Some(100 * MS),
            admitted_ns: Some(101 * MS),
            worker_started_ns: Some(102 * MS),
            volumes_ns: Some(102 * MS + MS / 2),
            pod_cgroup_ns: Some(103 * MS),
            cri: vec![
                span("RunPodSandbox", 104, 150),
                span("ImageStatus", 151, 152),
                span("CreateContainer", 152, 157),
                // StartContainer returns before the exec is seen: runc start does not wait.
                span("StartContainer", 158, 190),
            ],
            execs: vec![exec(7, 120), exec(8, 195)],
            running_observed_ns: Some(200 * MS),
            ..Default::default()
        }
    }

    #[test]
    fn phases_are_consecutive_and_sum_to_e2e() {
        let pod = full();
        let phases = pod.breakdown();
        let names: Vec<&str> = phases.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "admission",
                "dispatch",
                "volumes",
                "pod_cgroup",
                "agent/RunPodSandbox",
                "sandbox_exec",
                "RunPodSandbox",
                "agent/image/app",
                "image/app",
                "agent/CreateContainer/app",
                "CreateContainer/app",
                "agent/StartContainer/app",
                "StartContainer/app",
                "exec/app",
                "running_observed",
            ]
        );
        for pair in phases.windows(2) {
            assert_eq!(pair[0].end_ns, pair[1].start_ns, "consecutive");
        }
        let sum: f64 = phases.iter().map(Phase::ms).sum();
        let e2e = pod.e2e_ms().expect("running");
        assert!(
            (sum - e2e).abs() < 1e-9 && (e2e - 100.0).abs() < 1e-9,
            "{sum} {e2e}"
        );
        let exec = phases.iter().find(|p| p.name == "exec/app").expect("exec");
        assert_eq!(
            (exec.kind.as_str(), exec.observer),
            ("exec", Observer::Kernel)
        );
        assert_eq!(exec.ms(), 5.0);
        assert!(pod.complete(true));
    }

    #[test]
    fn agent_time_is_e2e_minus_the_union_of_cri_calls() {
        let mut pod = full();
        // 100 ms end to end, 46 + 1 + 5 + 32 ms in CRI calls.
        assert_eq!(pod.agent_ms(), Some(16.0));
        // An image check overlapping CreateContainer adds only its uncovered 1 ms.
        pod.cri[1] = span("ImageStatus", 150, 153);
        assert_eq!(pod.agent_ms(), Some(15.0));
        // Waiting for an exec after Running was observed is not the agent's.
        pod.execs[1].first_exec_ns = 205 * MS;
        assert_eq!(pod.agent_ms(), Some(15.0));
        pod.running_observed_ns = None;
        assert_eq!(pod.agent_ms(), None);
    }

    #[test]
    fn each_containers_image_check_is_its_own_phase_and_includes_a_pull() {
        let mut pod = full();
        pod.containers = vec!["a".into(), "b".into()];
        // a's process ran before its StartContainer returned, so no milestone splits b's check.
        pod.execs[1].first_exec_ns = 189 * MS;
        // b's image was absent: ImageStatus found nothing, PullImage fetched it.
        pod.cri.push(span("ImageStatus", 191, 192));
        pod.cri.push(span("PullImage", 192, 260));
        pod.cri.push(span("CreateContainer", 261, 262));
        pod.cri.push(span("StartContainer", 263, 264));
        pod.running_observed_ns = Some(270 * MS);
        let phases = pod.breakdown();
        let ms = |n: &str| {
            phases
                .iter()
                .find(|p| p.name == n)
                .unwrap_or_else(|| panic!("{n} missing"))
                .ms()
        };
        // a: RunPodSandbox returned at 150, its ImageStatus ran 151-152, CreateContainer at 152.
        assert_eq!(ms("agent/image/a"), 1.0);
        assert_eq!(ms("image/a"), 1.0);
        assert_eq!(ms("agent/CreateContainer/a"), 0.0);
        // b: the check began at 191 (after a's StartContainer returned at 190), the pull ended
        // at 260, CreateContainer began at 261.
        assert_eq!(ms("agent/image/b"), 1.0);
        assert_eq!(ms("image/b"), 69.0);
        assert_eq!(ms("agent/CreateContainer/b"), 1.0);
        let image = phases.iter().find(|p| p.name == "image/b").expect("image");
        assert_eq!(
            (image.kind.as_str(), image.observer),
            ("image", Observer::Cri)
        );
        let sum: f64 = phases.iter().map(Phase::ms).sum();
        assert!((sum - 170.0).abs() < 1e-9, "{sum}");
    }

    #[test]
    fn an_exec_after_running_observed_ends_the_breakdown() {
        let mut pod = full();
        pod.execs[1].first_exec_ns = 205 * MS;
        let phases = pod.breakdown();
        assert_eq!(phases.last().map(|p| p.name.as_str()), Some("exec/app"));
        assert_eq!(pod.e2e_ms(), Some(105.0));
        let sum: f64 = phases.iter().map(Phase::ms).sum();
        assert!((sum - 105.0).abs() < 1e-9);
    }

    #[test]
    fn missing_milestones_fold_into_the_next_phase() {
        let mut pod = full();
        pod.pod_cgroup_ns = None;
        pod.execs.clear();
        let phases = pod.breakdown();
        assert!(
            phases
                .iter()
                .all(|p| p.name != "pod_cgroup" && p.kind != "exec")
        );
        let sum: f64 = phases.iter().map(Phase::ms).sum();
        assert!((sum - 100.0).abs() < 1e-9);
        assert!(!pod.complete(true), "kernel phases are missing");
        assert!(
            pod.complete(false),
            "without probes the agent marks are all there is"
        );
    }

    #[test]
    fn not_running_has_no_e2e() {
        let mut pod = full();
        pod.running_observed_ns = None;
        assert_eq!(pod.e2e_ms(), None);
        assert!(!pod.complete(false));
        assert!(PodRecord::new("x").breakdown().is_empty());
    }

    #[test]
    fn a_milestone_before_the_source_is_a_zero_phase() {
        let mut pod = full();
        pod.source_seen_ns = Some(101 * MS + MS / 2);
        let phases = pod.breakdown();
        assert_eq!(phases[0].ms(), 0.0);
        assert!(phases.windows(2).all(|w| w[0].end_ns == w[1].start_ns));
    }

    #[test]
    fn execs_go_to_sandbox_then_containers_in_start_order() {
        let mut pod = full();
        pod.containers = vec!["a".into(), "b".into()];
        pod.cri.push(span("CreateContainer", 191, 192));
        pod.cri.push(span("StartContainer", 193, 196));
        pod.execs.push(exec(9, 197));
        let names: Vec<String> = pod.breakdown().into_iter().map(|p| p.name).collect();
        let pos = |n: &str| names.iter().position(|x| x == n).expect(n);
        assert!(pos("exec/a") < pos("exec/b"));
        assert!(pos("StartContainer/b") < pos("exec/b"));
        let marks = pod.marks();
        assert!(marks.iter().any(|m| m.name == "first_exec/sandbox"));
        assert!(marks.iter().any(|m| m.name == "first_exec/b"));
    }

    /// The pause process may exec after StartContainer began (runc start does not wait for the
    /// exec); its cgroup was still created during RunPodSandbox, so it stays the sandbox's.
    #[test]
    fn a_late_sandbox_exec_is_still_the_sandbox() {
        let mut pod = full();
        pod.execs = vec![
            ExecCgroup {
                created_ns: Some(130 * MS),
                ..exec(7, 170)
            },
            ExecCgroup {
                created_ns: Some(165 * MS),
                ..exec(8, 195)
            },
        ];
        let (sandbox, execs) = pod.assign_execs();
        assert_eq!(sandbox.map(|e| e.cgroup_id), Some(7));
        assert_eq!(execs[0].map(|e| e.cgroup_id), Some(8));
        // Without the creation times the late pause exec would be taken for the container's.
        for e in &mut pod.execs {
            e.created_ns = None;
        }
        let (_, execs) = pod.assign_execs();
        assert_eq!(execs[0].map(|e| e.cgroup_id), Some(7));
    }
}
