//! eBPF datapath (filled by the datapath issue).
