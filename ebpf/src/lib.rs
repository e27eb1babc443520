//! placeholder until the datapath issue lands
