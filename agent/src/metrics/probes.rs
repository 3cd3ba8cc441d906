//! `/metrics/probes`: the kubelet's prober metrics, one series per container and probe kind
//! (`prober_probe_total{probe_type,result,container,pod,namespace,pod_uid}` and
//! `prober_probe_duration_seconds{probe_type,container,pod,namespace}`), in a registry of their
//! own because they are served at their own path. A probe worker's series are removed when it
//! stops, as the kubelet removes them, so a node's churn does not grow the page.
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::Arc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultSeries {
    probe_type: &'static str,
    result: &'static str,
    container: String,
    pod: String,
    namespace: String,
    pod_uid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DurationSeries {
    probe_type: &'static str,
    container: String,
    pod: String,
    namespace: String,
}

/// The three results of `prober_probe_total`.
const RESULTS: [&str; 3] = ["successful", "failed", "unknown"];

fn duration_histogram() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ])
}

/// The prober metrics and their registry. Cloning shares them.
#[derive(Clone)]
pub struct ProbeMetrics {
    registry: Arc<Registry>,
    total: Family<ResultSeries, Counter>,
    duration: Family<DurationSeries, Histogram, fn() -> Histogram>,
}

impl Default for ProbeMetrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let total = Family::<ResultSeries, Counter>::default();
        registry.register(
            "prober_probe",
            "Cumulative number of a liveness, readiness or startup probe for a container by result",
            total.clone(),
        );
        let duration = Family::<DurationSeries, Histogram, fn() -> Histogram>::new_with_constructor(
            duration_histogram,
        );
        registry.register(
            "prober_probe_duration_seconds",
            "Duration in seconds for a probe response",
            duration.clone(),
        );
        Self {
            registry: Arc::new(registry),
            total,
            duration,
        }
    }
}

/// Which container and probe a worker's series are of.
#[derive(Clone, Debug)]
pub struct ProbeTarget {
    /// `Liveness`, `Readiness` or `Startup`.
    pub probe_type: &'static str,
    pub container: String,
    pub pod: String,
    pub namespace: String,
    pub pod_uid: String,
}

impl ProbeTarget {
    fn result(&self, result: &'static str) -> ResultSeries {
        ResultSeries {
            probe_type: self.probe_type,
            result,
            container: self.container.clone(),
            pod: self.pod.clone(),
            namespace: self.namespace.clone(),
            pod_uid: self.pod_uid.clone(),
        }
    }

    fn duration(&self) -> DurationSeries {
        DurationSeries {
            probe_type: self.probe_type,
            container: self.container.clone(),
            pod: self.pod.clone(),
            namespace: self.namespace.clone(),
        }
    }
}

impl ProbeMetrics {
    /// Counts one probe run of `target` with `result` (`successful`, `failed`, `unknown`) that
    /// took `secs`; its duration is recorded, as the kubelet records it, for successful and
    /// unknown runs (a failed one may have waited out its timeout).
    pub fn observe(&self, target: &ProbeTarget, result: &'static str, secs: f64) {
        self.total.get_or_create(&target.result(result)).inc();
        if result != "failed" {
            self.duration
                .get_or_create(&target.duration())
                .observe(secs);
        }
    }

    /// Removes `target`'s series (its worker stopped).
    pub fn forget(&self, target: &ProbeTarget) {
        for result in RESULTS {
            self.total.remove(&target.result(result));
        }
        self.duration.remove(&target.duration());
    }

    /// The text exposition of the prober metrics.
    pub fn encode(&self) -> String {
        super::encode_registry(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probes_series_carry_the_kubelets_labels_and_go_with_its_worker() {
        let m = ProbeMetrics::default();
        let target = ProbeTarget {
            probe_type: "Readiness",
            container: "web".into(),
            pod: "shop".into(),
            namespace: "prod".into(),
            pod_uid: "u-1".into(),
        };
        m.observe(&target, "successful", 0.002);
        m.observe(&target, "successful", 0.003);
        m.observe(&target, "failed", 1.0);
        let text = m.encode();
        assert!(
            text.contains(
                "prober_probe_total{probe_type=\"Readiness\",result=\"successful\",\
                 container=\"web\",pod=\"shop\",namespace=\"prod\",pod_uid=\"u-1\"} 2"
            ),
            "{text}"
        );
        assert!(text.contains("result=\"failed\""), "{text}");
        assert!(
            text.contains(
                "prober_probe_duration_seconds_count{probe_type=\"Readiness\",\
                 container=\"web\",pod=\"shop\",namespace=\"prod\"} 2"
            ),
            "{text}"
        );
        m.forget(&target);
        let text = m.encode();
        assert!(!text.contains("shop"), "{text}");
    }
}
