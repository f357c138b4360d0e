//! `/v1/cluster` and `/v1/debug`: members, status, digests.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::common::default_true;

/// One cluster member: `{id, api_addr, peer_addr, voter}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Member {
    /// The node id given to `--id`.
    pub id: u64,
    /// The HTTP API address, `host:port`.
    pub api_addr: String,
    /// The Raft peer address, `host:port`.
    pub peer_addr: String,
    /// Whether it votes (false for a learner).
    pub voter: bool,
}

/// `GET /v1/cluster` answer, as seen by the answering node: `{node_id, leader_id, term,
/// commit_index, cluster_time_ms, revision, sessions, leases, members}`. Also the answer to
/// member add and remove.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClusterStatus {
    /// The answering node's id.
    pub node_id: u64,
    /// The leader's id, or `null` while there is none.
    pub leader_id: Option<u64>,
    /// The answering node's current term.
    pub term: u64,
    /// The answering node's commit index.
    pub commit_index: u64,
    /// The cluster time of the answering node's applied state.
    #[serde(default)]
    pub cluster_time_ms: u64,
    /// The revision of the request's namespace (`Baton-Namespace`) in the answering node's
    /// applied state; 0 when the request's token may not use that namespace, and in the
    /// answer to a member add or remove.
    #[serde(default)]
    pub revision: u64,
    /// Sessions in the applied state, every namespace, live or awaiting the sweep.
    #[serde(default)]
    pub sessions: u64,
    /// Leases (each shared holder counted) in the applied state, every namespace, live or
    /// awaiting the sweep.
    #[serde(default)]
    pub leases: u64,
    /// The membership the answering node knows.
    pub members: Vec<Member>,
}

/// `POST /v1/cluster/members` body: `{id, api_addr, peer_addr, voter?}`; adds a learner and,
/// when `voter` (default), promotes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddMemberRequest {
    /// The new node's id.
    pub id: u64,
    /// The new node's HTTP API address.
    pub api_addr: String,
    /// The new node's Raft peer address.
    pub peer_addr: String,
    /// Promote to voter once caught up. Default `true`.
    #[serde(default = "default_true")]
    pub voter: bool,
}

/// `GET /v1/debug/digest` answer: `{node_id, applied_index, cluster_time_ms, digest}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Digest {
    /// The answering node's id.
    pub node_id: u64,
    /// The index of the last entry applied to the state machine.
    pub applied_index: u64,
    /// The state machine's cluster time at that index.
    pub cluster_time_ms: u64,
    /// Lowercase hex hash of the whole state machine at that index.
    pub digest: String,
}
