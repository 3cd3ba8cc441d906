//! Shared fixture for the integration tests: a private containerd and images.
