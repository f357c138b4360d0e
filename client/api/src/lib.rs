//! The HTTP/JSON wire types of Baton's v1 API (docs/api.md): request bodies, query
//! strings, answers, events, the `application/problem+json` error body and its [`ErrorCode`]s.
//! This module is the client contract, shared by the server, the client library, the `baton`
//! command line and the Jepsen harness. What must never live here: log or state-machine types
//! (the log format is a durability contract kept in `raft-store`; convert by hand), HTTP types
//! or status codes (only `node`'s http module knows them), and any I/O.
//!
//! Conventions: request bodies and query strings refuse unknown fields, so a client typo is an
//! `INVALID_ARGUMENT` rather than a silently ignored option; answers accept unknown fields, so
//! an older client can talk to a newer server. Optional request fields are omitted when unset;
//! optional answer fields docs/api.md shows as `null` (`leader_id`, `next_cursor`, a kv `fence`,
//! a fence check's `fence`) are always present. Times are cluster-time milliseconds
//! (`*_ms`) or informational RFC 3339 UTC strings (`*_at`).
//!
//! One module per route family (`sessions`, `leases`, `kv`, `queues`, `txn`, `events`,
//! `cluster`, `auth`),
//! with `error` (the problem body, its codes, the outcome classifier), `common` (the pieces
//! several families share), `format` (RFC 3339, UUID v4) and `backup` (the backup file
//! `GET /v1/snapshot` answers); all of it is re-exported here.

use std::collections::BTreeMap;

mod auth;
mod backup;
mod cluster;
mod common;
mod error;
mod events;
mod format;
mod kv;
mod leases;
mod queues;
mod sessions;
mod txn;

pub use auth::*;
pub use backup::*;
pub use cluster::*;
pub use common::*;
pub use error::*;
pub use events::*;
pub use format::*;
pub use kv::*;
pub use leases::*;
pub use queues::*;
pub use sessions::*;
pub use txn::*;

/// Response header: the id of the node the answering node believes is leader.
pub const HEADER_LEADER: &str = "Baton-Leader";
/// Response header: the cluster time (ms) at which the answer was decided.
pub const HEADER_CLUSTER_TIME: &str = "Baton-Cluster-Time";
/// Request header: the namespace the request acts in; [`DEFAULT_NAMESPACE`] when absent.
pub const HEADER_NAMESPACE: &str = "Baton-Namespace";
/// Request header: makes a mutation apply at most once per namespace and key (docs/guarantees.md G8).
pub const HEADER_IDEMPOTENCY_KEY: &str = "Idempotency-Key";
/// Response header: `true` when the answer is the recorded first answer of an idempotent retry.
pub const HEADER_IDEMPOTENT_REPLAYED: &str = "Idempotent-Replayed";
/// The namespace used when a request names none.
pub const DEFAULT_NAMESPACE: &str = "default";
/// The content type of every error body ([`Problem`]).
pub const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";
/// Shortest accepted `Idempotency-Key`, in characters.
pub const IDEMPOTENCY_KEY_LEN_MIN: usize = 16;
/// Longest accepted `Idempotency-Key`, in characters.
pub const IDEMPOTENCY_KEY_LEN_MAX: usize = 255;

/// Free-form labels on sessions and leases (at most 16; values 1..128 chars).
pub type Labels = BTreeMap<String, String>;

#[cfg(test)]
mod tests;
