//! Event layouts shared by the probes (`swiftlet-ebpf`) and the agent. Placeholder: the eBPF work
//! fills this in.
#![no_std]
