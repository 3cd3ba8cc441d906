//! xtask library: shared with the integration tests (runtime fixture, images).
