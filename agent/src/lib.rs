//! swiftlet: a node agent that does the kubelet's job, measured.
