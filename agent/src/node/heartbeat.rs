//! The heartbeats' own API client: the Lease renewals and the Node status writes go through a
//! client apart from the agent's other API traffic, as the kubelet keeps them, so that a
//! connection that dies without closing (a load balancer failing over, a NAT entry dropped: the
//! peer never answers and never resets) cannot stall them until the Lease expires and the node's
//! pods are evicted while they run.
//!
//! - Every heartbeat request is bounded by the heartbeat timeout: the shorter of
//!   `--node-status-update-frequency` and the Lease duration (10 s by default), the kubelet's.
//! - After a failure that follows another (a timeout or any error), the client is built anew: a
//!   new connection pool, so the next request dials a new connection instead of queueing on a
//!   dead one; the old pool's connections close when its last request ends. Counted in
//!   `swiftlet_node_api_requests_total{operation="reconnect"}`.
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::config::api::TimedOut;
use crate::metrics::Metrics;

/// How long a heartbeat request may take: the shorter of the status update frequency and the
/// Lease duration.
pub fn timeout(status_update_frequency: Duration, lease_duration: Duration) -> Duration {
    status_update_frequency.min(lease_duration)
}

/// The heartbeat client; cheap to clone (the clones share the client and its failure count).
#[derive(Clone)]
pub struct Heartbeats {
    config: kube::Config,
    timeout: Duration,
    state: Arc<Mutex<State>>,
    metrics: Metrics,
}

struct State {
    client: kube::Client,
    /// Failed requests since the last that succeeded.
    failures: u32,
}

impl Heartbeats {
    /// A heartbeat client of the API server `config` names, its requests bounded by `timeout`.
    pub fn new(
        mut config: kube::Config,
        timeout: Duration,
        metrics: Metrics,
    ) -> Result<Self, kube::Error> {
        // Dialling is bounded too (the whole request is, below).
        config.connect_timeout = Some(timeout);
        let client =
            crate::metrics::rest_client::client(config.clone(), &metrics.rest_client_requests)?;
        Ok(Self {
            config,
            timeout,
            state: Arc::new(Mutex::new(State {
                client,
                failures: 0,
            })),
            metrics,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current client (for building an `Api`).
    pub fn client(&self) -> kube::Client {
        self.state().client.clone()
    }

    /// Runs `request` with the current client, bounded by the heartbeat timeout (a timeout is a
    /// `kube::Error::Service` holding [`TimedOut`]). A failure right after another makes a new
    /// client for the requests after it.
    pub async fn request<T, F, Fut>(&self, request: F) -> Result<T, kube::Error>
    where
        F: FnOnce(kube::Client) -> Fut,
        Fut: Future<Output = Result<T, kube::Error>>,
    {
        let result = match tokio::time::timeout(self.timeout, request(self.client())).await {
            Ok(r) => r,
            Err(_) => Err(kube::Error::Service(Box::new(TimedOut(self.timeout)))),
        };
        match &result {
            Ok(_) => self.state().failures = 0,
            // An answer from the server (a 409, a 404) shows the connection works.
            Err(kube::Error::Api(_)) => self.state().failures = 0,
            Err(error) => self.failed(error),
        }
        result
    }

    fn failed(&self, error: &kube::Error) {
        let mut state = self.state();
        state.failures += 1;
        if state.failures < 2 {
            return;
        }
        match crate::metrics::rest_client::client(
            self.config.clone(),
            &self.metrics.rest_client_requests,
        ) {
            Ok(client) => {
                state.client = client;
                self.metrics.node_api_request("reconnect", "ok");
                tracing::warn!(
                    failures = state.failures,
                    %error,
                    "heartbeats failed repeatedly: closing their API connections and dialling anew"
                );
            }
            Err(e) => {
                self.metrics.node_api_request("reconnect", "error");
                tracing::warn!(error = %e, "rebuilding the heartbeat client failed");
            }
        }
    }
}

/// Whether `e` is a heartbeat request's timeout.
pub fn is_timeout(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Service(inner) if inner.is::<TimedOut>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeout_is_the_shorter_of_the_status_frequency_and_the_lease() {
        let s = Duration::from_secs;
        assert_eq!(timeout(s(10), s(40)), s(10));
        assert_eq!(timeout(s(60), s(40)), s(40));
    }

    /// A server that accepts connections and never answers: every request times out, and
    /// from the second failure on each failure dials anew (a new connection each time).
    #[tokio::test]
    async fn a_silent_server_times_out_and_each_repeated_failure_dials_anew() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(conn);
            }
        });
        let url: hyper::Uri = format!("http://{addr}").parse().expect("uri");
        let config = kube::Config::new(url);
        let metrics = Metrics::new();
        let hb =
            Heartbeats::new(config, Duration::from_millis(200), metrics.clone()).expect("a client");
        let get_node = || {
            hb.request(|c| async move {
                kube::Api::<k8s_openapi::api::core::v1::Node>::all(c)
                    .get("n")
                    .await
            })
        };
        for _ in 0..3 {
            let r = get_node().await;
            assert!(r.as_ref().is_err_and(is_timeout), "{r:?}");
        }
        // The first request's connection is stuck; the second failure and the third each
        // replaced the client, so the third and a fourth request dialled new connections.
        let _ = get_node().await;
        let dialled = accepted.load(std::sync::atomic::Ordering::SeqCst);
        assert!(dialled >= 3, "{dialled} connections");
        let text = metrics.encode();
        assert!(
            text.contains(r#"operation="reconnect",result="ok"} 3"#),
            "{text}"
        );
    }
}
