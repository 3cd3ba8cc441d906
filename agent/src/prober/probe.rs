//! Running one probe: the probe's [`Handler`] through [`crate::handler`], with the probe's
//! timeout.
use super::{Handler, ProbeResult};
use crate::cri::Cri;
use std::future::Future;
use std::time::Duration;

pub use crate::handler::Target;

/// Runs probes. [`Prober`] is the real one; worker tests use a fake.
pub trait Runner: Send + Sync + 'static {
    /// The result with a short message saying why.
    fn run(
        &self,
        handler: &Handler,
        target: &Target,
        timeout: Duration,
    ) -> impl Future<Output = (ProbeResult, String)> + Send;
}

pub struct Prober {
    cri: Cri,
}

impl Prober {
    pub fn new(cri: Cri) -> Self {
        Self { cri }
    }
}

impl Runner for Prober {
    async fn run(
        &self,
        handler: &Handler,
        target: &Target,
        timeout: Duration,
    ) -> (ProbeResult, String) {
        crate::handler::run(&self.cri, handler, target, timeout).await
    }
}
