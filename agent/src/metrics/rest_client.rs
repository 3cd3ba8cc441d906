//! `rest_client_requests_total{code, host, method}`: every request the agent's API-server
//! clients send, by the HTTP status of the answer (`<error>` when none came), as the kubelet's
//! client counts them. Every client is built by [`client`], which puts the count in its stack.
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// One series' labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub code: String,
    pub host: String,
    pub method: String,
}

/// The counts, shared by every client built with them.
pub type Requests = Family<RequestLabels, Counter>;

/// An API-server client for `config` whose requests are counted in `requests`.
pub fn client(config: kube::Config, requests: &Requests) -> Result<kube::Client, kube::Error> {
    let host = config
        .cluster_url
        .authority()
        .map(|a| a.as_str().to_owned())
        .unwrap_or_default();
    let layer = CountLayer {
        requests: requests.clone(),
        host: host.into(),
    };
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&layer)
        .build())
}

struct CountLayer {
    requests: Requests,
    host: std::sync::Arc<str>,
}

impl<S> tower::Layer<S> for CountLayer {
    type Service = Count<S>;

    fn layer(&self, inner: S) -> Count<S> {
        Count {
            inner,
            requests: self.requests.clone(),
            host: self.host.clone(),
        }
    }
}

/// Counts each request `inner` answers (or fails).
#[derive(Clone)]
pub struct Count<S> {
    inner: S,
    requests: Requests,
    host: std::sync::Arc<str>,
}

impl<S, B, R> tower::Service<hyper::Request<B>> for Count<S>
where
    S: tower::Service<hyper::Request<B>, Response = hyper::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: hyper::Request<B>) -> Self::Future {
        let method = request.method().as_str().to_owned();
        let (requests, host) = (self.requests.clone(), self.host.clone());
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await;
            let code = match &answer {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "<error>".to_owned(),
            };
            requests
                .get_or_create(&RequestLabels {
                    code,
                    host: host.to_string(),
                    method,
                })
                .inc();
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer, Service, ServiceExt};

    #[tokio::test]
    async fn each_answer_and_failure_is_counted_by_code_host_and_method() {
        let requests = Requests::default();
        let layer = CountLayer {
            requests: requests.clone(),
            host: "10.0.0.1:6443".into(),
        };
        let mut svc = layer.layer(tower::service_fn(|r: hyper::Request<()>| async move {
            if r.uri().path() == "/fail" {
                return Err("connection reset");
            }
            let status = if r.method() == hyper::Method::PATCH {
                409
            } else {
                200
            };
            Ok(hyper::Response::builder().status(status).body(()).unwrap())
        }));
        for (method, path) in [("GET", "/"), ("GET", "/"), ("PATCH", "/"), ("PUT", "/fail")] {
            let request = hyper::Request::builder()
                .method(method)
                .uri(path)
                .body(())
                .unwrap();
            let _ = svc.ready().await.unwrap().call(request).await;
        }
        let count = |code: &str, method: &str| {
            requests
                .get_or_create(&RequestLabels {
                    code: code.into(),
                    host: "10.0.0.1:6443".into(),
                    method: method.into(),
                })
                .get()
        };
        assert_eq!(count("200", "GET"), 2);
        assert_eq!(count("409", "PATCH"), 1);
        assert_eq!(count("<error>", "PUT"), 1);
    }

    #[test]
    fn a_client_is_built_with_the_count_in_its_stack() {
        let config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // Building a client needs a runtime (its connections are spawned on it).
        let built = rt.block_on(async { client(config, &Requests::default()) });
        assert!(built.is_ok());
    }
}
