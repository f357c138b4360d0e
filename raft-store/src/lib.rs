//! Baton's replicated state: the openraft storage (log segment files and small state files)
//! around the pure lease state machine, which lives in its own crate (`baton-machine`,
//! re-exported here as `machine`) so that the compiler keeps it free of I/O; and the proposer,
//! which turns commands into the log's entries (`batond` and the simulator both run it).
pub use baton_machine as machine;
pub mod proposer;
pub mod store;
