//! `/v1/sessions`: create, keep alive, end, release.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{Labels, Lease, SessionId};

/// `POST /v1/sessions` body: `{holder, ttl_ms, labels?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSessionRequest {
    /// The agent's public name.
    pub holder: String,
    /// Session TTL; each keepalive resets the deadline to now + `ttl_ms`.
    pub ttl_ms: u64,
    /// Labels on the session.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: Labels,
}

/// `POST /v1/sessions` answer (201): `{session_id, holder, ttl_ms, expires_in_ms, expires_at}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreateSessionResponse {
    /// The new session's secret id.
    pub session_id: SessionId,
    /// The holder name given.
    pub holder: String,
    /// The TTL granted.
    pub ttl_ms: u64,
    /// Deadline minus the cluster time the write was applied at (docs/guarantees.md G7).
    pub expires_in_ms: u64,
    /// Informational RFC 3339 UTC deadline.
    pub expires_at: String,
}

/// `POST /v1/sessions/{id}/keepalive` answer: `{session_id, expires_in_ms, expires_at}`.
/// The request has no body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KeepaliveResponse {
    /// The renewed session.
    pub session_id: SessionId,
    /// New deadline minus the cluster time the renewal was applied at (docs/guarantees.md G7).
    pub expires_in_ms: u64,
    /// Informational RFC 3339 UTC deadline.
    pub expires_at: String,
}

/// `POST /v1/sessions/{id}/release` body: `{resource}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    /// The resource to release (it is acquirable at once afterwards), or whose line to leave.
    pub resource: String,
}

/// `POST /v1/sessions/{id}/release` answer: `{released: resource}`, or `{released: resource,
/// left_line: true}` when the session was waiting in its line rather than holding it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReleaseResponse {
    /// The resource that was freed, or whose line the session left.
    pub released: String,
    /// The session left the resource's line (it held no lease on it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub left_line: bool,
}

/// `GET /v1/sessions/{id}` answer: the session and its leases.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SessionInfo {
    /// The session's id (the caller sent it in the path).
    pub session_id: SessionId,
    /// The holder name.
    pub holder: String,
    /// The session's TTL.
    pub ttl_ms: u64,
    /// The session's labels.
    #[serde(default)]
    pub labels: Labels,
    /// Deadline minus the cluster time of the read.
    pub expires_in_ms: u64,
    /// Informational RFC 3339 UTC deadline.
    pub expires_at: String,
    /// A page of the live leases the session holds, in path order.
    #[serde(default)]
    pub leases: Vec<Lease>,
    /// Where the next page of leases starts (`?cursor=`); `null` on the last page.
    pub next_cursor: Option<String>,
}

/// `DELETE /v1/sessions/{id}` answer: `{released: [resource...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EndSessionResponse {
    /// Every resource the ended session held.
    pub released: Vec<String>,
}
