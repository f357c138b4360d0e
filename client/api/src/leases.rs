//! `/v1/leases` and `/v1/fence/check`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::common::owner_from_fields;
use crate::{Labels, LeaseMode, Owner, SessionId};

/// `POST /v1/leases` body: `resource`, either `session_id` or `holder` + `ttl_ms` (checked by
/// [`AcquireRequest::owner`]), and optional `mode` (with `limit` for `shared`), `max_hold_ms`,
/// `labels`, `reason` and `wait_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AcquireRequest {
    /// The path to claim.
    pub resource: String,
    /// An existing session to hold the lease; excludes `holder` and `ttl_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
    /// Holder of a session created with the lease; needs `ttl_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// TTL of a session created with the lease; needs `holder`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// `exclusive` (default), `subtree` or `shared`.
    #[serde(default)]
    pub mode: LeaseMode,
    /// With `shared` (and only then): how many may hold the path at once,
    /// 1..=`shared_limit_max` (1024 by default); every holder gives the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// Caps the lease's life even while keepalives continue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_hold_ms: Option<u64>,
    /// Labels on the lease.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: Labels,
    /// Why the caller wants the resource; free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Wait in the resource's line instead of being refused: 0..=60,000 ms. Granted within
    /// it answers 201; else 202 with the place in line, and the session stays in line (send
    /// the same acquire again to keep waiting, or release the resource to leave).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

/// The longest `wait_ms` of an acquire or a claim.
pub const WAIT_MS_MAX: u64 = 60_000;

/// `POST /v1/leases` answer 202: the acquire waits in the resource's line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Queued {
    /// Always `true`.
    pub queued: bool,
    /// The place in line: 1 is next.
    pub position: u32,
    /// The path waited for.
    pub resource: String,
    /// The waiting session (given, or created by this acquire): keep it alive while waiting.
    pub session_id: SessionId,
    /// Whether this acquire created the session.
    pub session_created: bool,
}

impl AcquireRequest {
    /// The lease's owner, or a message for `INVALID_ARGUMENT` when the body gives both
    /// `session_id` and `holder`/`ttl_ms`, or neither, or only one of `holder` and `ttl_ms`.
    pub fn owner(&self) -> Result<Owner<'_>, String> {
        owner_from_fields(
            self.session_id.as_ref(),
            self.holder.as_deref(),
            self.ttl_ms,
        )
    }
}

/// `POST /v1/leases` answer (201): the lease plus the `session_id` holding it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Grant {
    /// The claimed path.
    pub resource: String,
    /// The fence token of this grant.
    pub fence: u64,
    /// The session holding the lease (given, or created by this acquire).
    pub session_id: SessionId,
    /// The holder name.
    pub holder: String,
    /// `exclusive`, `subtree` or `shared`.
    pub mode: LeaseMode,
    /// A shared lease's limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// The lease's labels.
    #[serde(default)]
    pub labels: Labels,
    /// The lease's max hold, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_hold_ms: Option<u64>,
    /// Informational RFC 3339 UTC time of the grant.
    pub acquired_at: String,
    /// Deadline minus the cluster time the grant was applied at (docs/guarantees.md G7).
    pub expires_in_ms: u64,
    /// Informational RFC 3339 UTC deadline.
    pub expires_at: String,
}

impl Grant {
    /// The lease object, without the session id.
    pub fn into_lease(self) -> Lease {
        Lease {
            resource: self.resource,
            fence: self.fence,
            holder: self.holder,
            mode: self.mode,
            limit: self.limit,
            labels: self.labels,
            max_hold_ms: self.max_hold_ms,
            acquired_at: self.acquired_at,
            expires_in_ms: self.expires_in_ms,
            expires_at: self.expires_at,
            covering: false,
        }
    }
}

/// The public lease object (`GET /v1/leases/{*resource}`, lists, session gets): `{resource,
/// fence, holder, mode, labels, acquired_at, expires_in_ms, expires_at}`. Never a session id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Lease {
    /// The claimed path.
    pub resource: String,
    /// The lease's fence token.
    pub fence: u64,
    /// The holder name.
    pub holder: String,
    /// `exclusive`, `subtree` or `shared` (then this is one of its holders).
    pub mode: LeaseMode,
    /// A shared lease's limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// The lease's labels.
    #[serde(default)]
    pub labels: Labels,
    /// The lease's max hold, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_hold_ms: Option<u64>,
    /// Informational RFC 3339 UTC time of the grant.
    pub acquired_at: String,
    /// Deadline minus the cluster time of the read.
    pub expires_in_ms: u64,
    /// Informational RFC 3339 UTC deadline.
    pub expires_at: String,
    /// True when this is a subtree lease on an ancestor of the path asked for, which covers it
    /// (`resource` is then the lease's own path). Absent otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub covering: bool,
}

/// The lease in the way of a `LEASE_HELD` refusal: `{holder, resource, mode, fence, labels,
/// acquired_at, expires_in_ms, expires_at}`. It has no session id field, by construction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HeldBy {
    /// The holder name.
    pub holder: String,
    /// The conflicting lease's path (may be an ancestor or descendant of the one asked for).
    pub resource: String,
    /// `exclusive`, `subtree` or `shared`.
    pub mode: LeaseMode,
    /// A shared lease's limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// The conflicting lease's fence token.
    pub fence: u64,
    /// The conflicting lease's labels.
    #[serde(default)]
    pub labels: Labels,
    /// Informational RFC 3339 UTC time of the grant.
    pub acquired_at: String,
    /// Deadline minus the cluster time of the refusal.
    pub expires_in_ms: u64,
    /// Informational RFC 3339 UTC deadline.
    pub expires_at: String,
    /// For a shared lease: up to ten of its live holders, oldest grant first (this object is
    /// the first of them, or the caller's own hold).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<SharedHolder>,
    /// For a shared lease: how many hold it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holders_total: Option<u32>,
}

/// One holder of a shared lease, as a `LEASE_HELD` refusal lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SharedHolder {
    /// The holder name.
    pub holder: String,
    /// Its fence token.
    pub fence: u64,
    /// Informational RFC 3339 UTC time of its grant.
    pub acquired_at: String,
    /// Its deadline minus the cluster time of the refusal.
    pub expires_in_ms: u64,
    /// Informational RFC 3339 UTC deadline.
    pub expires_at: String,
}

impl From<Lease> for HeldBy {
    fn from(lease: Lease) -> HeldBy {
        HeldBy {
            holder: lease.holder,
            resource: lease.resource,
            mode: lease.mode,
            limit: lease.limit,
            fence: lease.fence,
            labels: lease.labels,
            acquired_at: lease.acquired_at,
            expires_in_ms: lease.expires_in_ms,
            expires_at: lease.expires_at,
            holders: Vec::new(),
            holders_total: None,
        }
    }
}

/// `GET /v1/sessions/{id}?limit=&cursor=` query: a page of the session's leases.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// Page size; at most the list page limit (default 1,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

/// `GET /v1/leases?prefix=&limit=&cursor=` query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListLeasesQuery {
    /// Only leases whose resource starts with this path prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// Page size; at most the list page limit (default 1,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

/// `GET /v1/leases` answer: `{leases, next_cursor}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LeaseList {
    /// One page of live leases, in resource order.
    pub leases: Vec<Lease>,
    /// Cursor of the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// `POST /v1/fence/check` body: `{resource, fence}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FenceCheckRequest {
    /// The resource to check.
    pub resource: String,
    /// The token to check.
    pub fence: u64,
}

/// `POST /v1/fence/check` answer: `{current, fence}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FenceCheckResponse {
    /// Whether the token is the live fence of the resource.
    pub current: bool,
    /// The resource's live fence, or `null` when no lease is live.
    pub fence: Option<u64>,
}
