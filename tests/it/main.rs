//! The one integration test binary (STYLE rule 12): every module starts real `batond`
//! processes through the harness in `tests/lib.rs` and talks to them over HTTP.

mod agents;
mod backup;
mod bad_input;
mod cli;
mod cli_fixes;
mod client;
mod client_queues;
mod connections;
mod console;
mod contract;
mod events;
mod expiry;
mod failover;
mod fencing;
mod forwarding;
mod hook;
mod leases;
mod line;
mod mcp;
mod membership;
mod process;
mod queues;
mod security;
mod semaphore;
mod time;
mod tls;
mod txn;
