//! The quick form of the fault-injection suite (`cargo xtask chaos` runs the long one): a few
//! rounds of each scenario with a fixed seed, so a regression fails CI reproducibly.
use swiftlet_tests::Runtime;
use swiftlet_tests::chaos;

/// kill -9 of the agent during manifest churn: after every restart the invariant (each desired
/// pod running once, nothing left of gone pods) holds within the convergence timeout.
#[test]
fn kill9_during_churn_converges_every_round() {
    let Some(rt) = Runtime::shared() else { return };
    let outcome = chaos::kill9_churn(rt, 20261125, 4, 6);
    assert!(
        outcome.passed(),
        "seed {}: {:#?}",
        outcome.seed,
        outcome.violations
    );
    assert_eq!(outcome.faults, 4);
    assert_eq!(outcome.converge_ms.len(), 4);
}
