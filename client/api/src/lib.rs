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

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

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

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// The machine-readable error code of a [`Problem`], serialized as `"LEASE_HELD"` etc.
///
/// Statuses are the server's business; this enum only says what the caller may assume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    /// The request is malformed or out of limits: fix it.
    InvalidArgument,
    /// Credentials are missing or wrong.
    Unauthenticated,
    /// Credentials do not allow this.
    PermissionDenied,
    /// No such session, lease, key, queue, task or member.
    NotFound,
    /// Someone else (or the caller's own session) holds a conflicting lease; see `held_by`.
    LeaseHeld,
    /// The caller's session or lease is gone: stop acting as holder.
    LeaseLost,
    /// The token is not the live fence for that session: the write was refused.
    StaleFence,
    /// A body, value or payload is over its limit.
    PayloadTooLarge,
    /// The same `Idempotency-Key` was used for a different request.
    IdempotencyKeyReused,
    /// A quota was hit; retry after `retry_after_ms`.
    ResourceExhausted,
    /// No leader: definitely not applied; retry after `retry_after_ms`.
    NoLeader,
    /// May or may not have been applied; retry with the same `Idempotency-Key`.
    OutcomeUnknown,
    /// A server fault; details are in the server log, not the body.
    Internal,
}

impl ErrorCode {
    /// Every code, in the order docs/api.md lists them.
    pub const ALL: [ErrorCode; 13] = [
        ErrorCode::InvalidArgument,
        ErrorCode::Unauthenticated,
        ErrorCode::PermissionDenied,
        ErrorCode::NotFound,
        ErrorCode::LeaseHeld,
        ErrorCode::LeaseLost,
        ErrorCode::StaleFence,
        ErrorCode::PayloadTooLarge,
        ErrorCode::IdempotencyKeyReused,
        ErrorCode::ResourceExhausted,
        ErrorCode::NoLeader,
        ErrorCode::OutcomeUnknown,
        ErrorCode::Internal,
    ];

    /// The wire spelling, e.g. `"LEASE_HELD"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "INVALID_ARGUMENT",
            ErrorCode::Unauthenticated => "UNAUTHENTICATED",
            ErrorCode::PermissionDenied => "PERMISSION_DENIED",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::LeaseHeld => "LEASE_HELD",
            ErrorCode::LeaseLost => "LEASE_LOST",
            ErrorCode::StaleFence => "STALE_FENCE",
            ErrorCode::PayloadTooLarge => "PAYLOAD_TOO_LARGE",
            ErrorCode::IdempotencyKeyReused => "IDEMPOTENCY_KEY_REUSED",
            ErrorCode::ResourceExhausted => "RESOURCE_EXHAUSTED",
            ErrorCode::NoLeader => "NO_LEADER",
            ErrorCode::OutcomeUnknown => "OUTCOME_UNKNOWN",
            ErrorCode::Internal => "INTERNAL",
        }
    }

    /// True when the request may or may not have been applied: `OUTCOME_UNKNOWN`, and also
    /// `INTERNAL`, because a 500 may be raised after the write was applied. Every other code
    /// means "definitely not applied". Retries, exit codes and the Jepsen `fail`/`info` split
    /// depend on this.
    pub fn is_indeterminate(self) -> bool {
        matches!(self, ErrorCode::OutcomeUnknown | ErrorCode::Internal)
    }

    /// True when the same request may simply be sent again later (after `retry_after_ms`):
    /// `NO_LEADER` and `RESOURCE_EXHAUSTED`, both of which guarantee nothing was applied.
    pub fn is_retryable(self) -> bool {
        matches!(self, ErrorCode::NoLeader | ErrorCode::ResourceExhausted)
    }
}

/// What the caller of a request may assume from its answer (STYLE rule 8): the one
/// classification that the client's retries, the CLI's exit codes, the harness's `ok`/`fail`/
/// `info` and the tests all follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// A 2xx answer: the request took effect.
    Yes,
    /// Surely not applied: a refusal, `NO_LEADER`, a quota.
    No,
    /// May or may not have been applied: retry a mutation with the same `Idempotency-Key`.
    Unknown,
}

impl Applied {
    /// The classification of an answer with HTTP `status` and, when its body was a problem,
    /// its `code`. A problem's code decides ([`ErrorCode::is_indeterminate`]); an error without
    /// one (a proxy, a cut answer) is surely not applied for a 4xx and unknown for anything
    /// else.
    pub fn of_answer(status: u16, code: Option<ErrorCode>) -> Applied {
        match (status, code) {
            (200..=299, _) => Applied::Yes,
            (_, Some(code)) if code.is_indeterminate() => Applied::Unknown,
            (_, Some(_)) => Applied::No,
            (400..=499, None) => Applied::No,
            (_, None) => Applied::Unknown,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// The `application/problem+json` error body: `{code, message, held_by?, current_fence?,
/// leader?, retry_after_ms?}`. Unknown fields (e.g. RFC 9457 `type`/`title`) are tolerated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// What the caller may assume and do next.
    pub code: ErrorCode,
    /// One human-readable line, e.g. `repo/a.rs is held by agent-b (fence 41) for 38s more`.
    pub message: String,
    /// With `LEASE_HELD`: the lease in the way (never its session id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<HeldBy>,
    /// With `STALE_FENCE` or a fence-related refusal: the live fence of the resource, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_fence: Option<u64>,
    /// With `NO_LEADER` or `OUTCOME_UNKNOWN`: the leader's node id, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<u64>,
    /// With `NO_LEADER` or `RESOURCE_EXHAUSTED`: how long to wait before retrying.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

impl Problem {
    /// A problem with only a code and a message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Problem {
        Problem {
            code,
            message: message.into(),
            held_by: None,
            current_fence: None,
            leader: None,
            retry_after_ms: None,
        }
    }
}

impl fmt::Display for Problem {
    /// `LEASE_HELD: repo/a.rs is held by agent-b (fence 41) for 38s more`.
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Problem {}

// ---------------------------------------------------------------------------------------------
// Shared pieces
// ---------------------------------------------------------------------------------------------

/// A session id: a secret capability (docs/guarantees.md, "Vocabulary"). Serialized as a plain JSON string; its
/// `Debug` is redacted so that logging a request body never leaks it. Read it with
/// [`SessionId::as_str`] only where it must be sent or compared.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(transparent)]
pub struct SessionId(String);

impl SessionId {
    /// Wraps a session id string.
    pub fn new(id: impl Into<String>) -> SessionId {
        SessionId(id.into())
    }

    /// The id itself. Never log it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id itself, by value. Never log it.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("SessionId(<redacted>)")
    }
}

impl From<String> for SessionId {
    fn from(id: String) -> SessionId {
        SessionId(id)
    }
}

impl From<&str> for SessionId {
    fn from(id: &str) -> SessionId {
        SessionId(id.to_owned())
    }
}

/// A lease's kind: `exclusive` (that path) or `subtree` (that path and everything under it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LeaseMode {
    /// The path alone. The default.
    #[default]
    Exclusive,
    /// The path and every path below it.
    Subtree,
}

/// A fence as carried by a fenced kv write and shown by a kv read: `{resource, token}`.
/// It refuses unknown fields because it is part of request bodies; it is also a closed,
/// two-field shape in answers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FenceRef {
    /// The leased resource whose fence guards the write.
    pub resource: String,
    /// The fence token of that lease.
    pub token: u64,
}

/// Who will own a lease or task claim, as validated from a request's optional fields by
/// [`AcquireRequest::owner`] and [`ClaimRequest::owner`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner<'a> {
    /// An existing session, named by its id.
    Session(&'a SessionId),
    /// A new session created in the same write (none is created if the write is refused).
    NewSession {
        /// The new session's holder name.
        holder: &'a str,
        /// The new session's TTL.
        ttl_ms: u64,
    },
}

/// The proof a fenced kv write carries, as validated by [`KvPutRequest::fenced_by`] and
/// [`KvDeleteRequest::fenced_by`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FencedBy<'a> {
    /// The fence the write claims to hold.
    pub fence: &'a FenceRef,
    /// The session that must hold that fence.
    pub session_id: &'a SessionId,
}

// ---------------------------------------------------------------------------------------------
// Sessions
// ---------------------------------------------------------------------------------------------

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
    /// The resource to release; it is acquirable at once afterwards.
    pub resource: String,
}

/// `POST /v1/sessions/{id}/release` answer: `{released: resource}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReleaseResponse {
    /// The resource that was freed.
    pub released: String,
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
    /// Where the next page of leases starts (`?cursor=`), when there are more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `DELETE /v1/sessions/{id}` answer: `{released: [resource...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EndSessionResponse {
    /// Every resource the ended session held.
    pub released: Vec<String>,
}

// ---------------------------------------------------------------------------------------------
// Leases and fences
// ---------------------------------------------------------------------------------------------

/// `POST /v1/leases` body: `resource`, either `session_id` or `holder` + `ttl_ms` (checked by
/// [`AcquireRequest::owner`]), and optional `mode`, `max_hold_ms`, `labels`, `reason`.
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
    /// `exclusive` (default) or `subtree`.
    #[serde(default)]
    pub mode: LeaseMode,
    /// Caps the lease's life even while keepalives continue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_hold_ms: Option<u64>,
    /// Labels on the lease.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: Labels,
    /// Why the caller wants the resource; free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
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
    /// `exclusive` or `subtree`.
    pub mode: LeaseMode,
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
    /// `exclusive` or `subtree`.
    pub mode: LeaseMode,
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
    /// `exclusive` or `subtree`.
    pub mode: LeaseMode,
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
}

impl From<Lease> for HeldBy {
    fn from(lease: Lease) -> HeldBy {
        HeldBy {
            holder: lease.holder,
            resource: lease.resource,
            mode: lease.mode,
            fence: lease.fence,
            labels: lease.labels,
            acquired_at: lease.acquired_at,
            expires_in_ms: lease.expires_in_ms,
            expires_at: lease.expires_at,
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

// ---------------------------------------------------------------------------------------------
// Fenced key-value store
// ---------------------------------------------------------------------------------------------

/// `PUT /v1/kv/{*key}` body: `{value, fence?, session_id?}`; `fence` and `session_id` come
/// both or neither (checked by [`KvPutRequest::fenced_by`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KvPutRequest {
    /// The JSON value to store.
    pub value: Value,
    /// The fence the writer holds; the write applies only if it is live for `session_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<FenceRef>,
    /// The session that holds `fence`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
}

impl KvPutRequest {
    /// `Ok(None)` for an unconditional write, `Ok(Some(..))` for a fenced one, or a message for
    /// `INVALID_ARGUMENT` when only one of `fence` and `session_id` is given.
    pub fn fenced_by(&self) -> Result<Option<FencedBy<'_>>, String> {
        fenced_by_fields(self.fence.as_ref(), self.session_id.as_ref())
    }
}

/// `PUT /v1/kv/{*key}` answer: `{revision}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KvPutResponse {
    /// The revision of this write.
    pub revision: u64,
}

/// `GET /v1/kv/{*key}` answer: `{key, value, revision, fence}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KvEntry {
    /// The key.
    pub key: String,
    /// The stored JSON value.
    pub value: Value,
    /// The revision of the write that stored it.
    pub revision: u64,
    /// The fence that wrote it, or `null` for an unconditional write.
    pub fence: Option<FenceRef>,
}

/// `DELETE /v1/kv/{*key}` body: `{fence?, session_id?}`, both or neither (checked by
/// [`KvDeleteRequest::fenced_by`]). An absent body means an unconditional delete.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KvDeleteRequest {
    /// The fence the deleter holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<FenceRef>,
    /// The session that holds `fence`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
}

impl KvDeleteRequest {
    /// Same rule as [`KvPutRequest::fenced_by`].
    pub fn fenced_by(&self) -> Result<Option<FencedBy<'_>>, String> {
        fenced_by_fields(self.fence.as_ref(), self.session_id.as_ref())
    }
}

/// `DELETE /v1/kv/{*key}` answer: `{deleted, revision}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KvDeleteResponse {
    /// Whether the key existed.
    pub deleted: bool,
    /// The revision of the delete, or `null` when there was nothing to delete.
    pub revision: Option<u64>,
}

// ---------------------------------------------------------------------------------------------
// Work queues
// ---------------------------------------------------------------------------------------------

/// A task's state: `ready`, `claimed`, `done` or `dead`. Also the `state=` list filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    /// Claim-next could take it now (a lapsed claim counts as ready at once).
    Ready,
    /// Unclaimed, but held back by a dependency that is not done or by `not_before_ms`.
    Waiting,
    /// Claimed by a live lease.
    Claimed,
    /// Completed.
    Done,
    /// Its last attempt lapsed or failed, or it failed with `retry: false`.
    Dead,
}

/// `POST /v1/queues/{queue}/tasks` body: `{id?, payload, priority?, depends_on?, max_attempts?,
/// not_before_ms?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnqueueRequest {
    /// The task id, unique within its queue; generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The task's JSON payload.
    pub payload: Value,
    /// Higher is claimed first, then FIFO. Default 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: i32,
    /// Ids in the same queue that must be done before this task is ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// Attempts before the task is dead; the server's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// A delay: the task may be claimed only this many milliseconds (of cluster time) after it
    /// was enqueued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before_ms: Option<u64>,
}

/// The task object (enqueue answer (201), claim answer, complete/fail/release answers, lists).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Task {
    /// Unique within its queue.
    pub id: String,
    /// The queue's name.
    pub queue: String,
    /// The JSON payload given at enqueue.
    pub payload: Value,
    /// Higher is claimed first.
    #[serde(default)]
    pub priority: i32,
    /// Ids that must be done before this task is ready.
    #[serde(default)]
    pub depends_on: Vec<String>,
    /// Current state.
    pub state: TaskState,
    /// Attempts so far (0 before the first claim; a release does not count one).
    pub attempt: u32,
    /// Attempts allowed before the task is dead.
    pub max_attempts: u32,
    /// Cluster time (ms, as in `Baton-Cluster-Time`) from which the task may be claimed: its
    /// enqueue time plus its `not_before_ms` delay.
    pub ready_at_ms: u64,
    /// How many of `depends_on` are not done yet.
    #[serde(default)]
    pub waiting_on: u32,
    /// The note left by the last release, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The result given on completion, when done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The reason given by the last failure, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The fence of the live claim, when claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    /// The holder of the live claim, when claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// The revision of the enqueue, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enqueued_revision: Option<u64>,
}

/// `POST /v1/queues/{queue}/claim` body: `{session_id}` or `{holder, ttl_ms}` (checked by
/// [`ClaimRequest::owner`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// An existing session to hold the claim; excludes `holder` and `ttl_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
    /// Holder of a session created with the claim; needs `ttl_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// TTL of a session created with the claim; needs `holder`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

impl ClaimRequest {
    /// Same rule as [`AcquireRequest::owner`].
    pub fn owner(&self) -> Result<Owner<'_>, String> {
        owner_from_fields(
            self.session_id.as_ref(),
            self.holder.as_deref(),
            self.ttl_ms,
        )
    }
}

/// `POST /v1/queues/{queue}/claim` answer (200; an empty queue is 204 with no body):
/// `{task, fence, attempt, session_id, expires_in_ms, expires_at}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClaimResponse {
    /// The claimed task.
    pub task: Task,
    /// The claim's fence, needed to complete, fail or release it.
    pub fence: u64,
    /// This attempt's number, from 1.
    pub attempt: u32,
    /// The session holding the claim (given, or created by this claim).
    pub session_id: SessionId,
    /// Deadline minus the cluster time the claim was applied at (docs/guarantees.md G7).
    pub expires_in_ms: u64,
    /// Informational RFC 3339 UTC deadline.
    pub expires_at: String,
}

/// `POST /v1/queues/{queue}/tasks/{id}/complete` body: `{session_id, fence, result?}`.
/// Answer: the [`Task`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteRequest {
    /// The session holding the claim.
    pub session_id: SessionId,
    /// The claim's fence.
    pub fence: u64,
    /// A JSON result kept on the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

/// `POST /v1/queues/{queue}/tasks/{id}/fail` body: `{session_id, fence, reason, retry?}`.
/// Answer: the [`Task`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailRequest {
    /// The session holding the claim.
    pub session_id: SessionId,
    /// The claim's fence.
    pub fence: u64,
    /// Why it failed; kept on the task.
    pub reason: String,
    /// `true` (default): ready again while attempts remain; `false`: dead now.
    #[serde(default = "default_true")]
    pub retry: bool,
}

/// `POST /v1/queues/{queue}/tasks/{id}/release` body: `{session_id, fence, note?}`; no
/// attempt is counted. Answer: the [`Task`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskReleaseRequest {
    /// The session holding the claim.
    pub session_id: SessionId,
    /// The claim's fence.
    pub fence: u64,
    /// A note that stays on the task for the next claimer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Task counts by state: `{ready, claimed, done, dead}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QueueCounts {
    /// Tasks claim-next could take now.
    pub ready: u64,
    /// Unclaimed tasks held back by a dependency or by `not_before_ms`.
    pub waiting: u64,
    /// Tasks under a live claim.
    pub claimed: u64,
    /// Completed tasks.
    pub done: u64,
    /// Dead tasks.
    pub dead: u64,
}

/// `GET /v1/queues/{queue}` answer: `{queue, counts}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QueueInfo {
    /// The queue's name.
    pub queue: String,
    /// Its tasks by state.
    pub counts: QueueCounts,
}

/// `GET /v1/queues/{queue}/tasks?state=&limit=&cursor=` query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListTasksQuery {
    /// Only tasks in this state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<TaskState>,
    /// Page size; at most the list page limit (default 1,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

/// `GET /v1/queues/{queue}/tasks` answer: `{tasks, next_cursor}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TaskList {
    /// One page of tasks.
    pub tasks: Vec<Task>,
    /// Cursor of the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// Events
// ---------------------------------------------------------------------------------------------

/// `GET /v1/events?after=&limit=` query.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Only events with a revision greater than this; from the start when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<u64>,
    /// Page size; at most the list page limit (default 1,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// `GET /v1/events` answer: `{events, next}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EventsPage {
    /// Events in revision order.
    pub events: Vec<Event>,
    /// The revision to pass as `after` next time.
    pub next: u64,
}

/// One state change: `{revision, namespace, cluster_time_ms, kind: {type, ...}}`. Also the
/// `data` of one SSE message.
///
/// `kind` is nested rather than flattened so its own fields (a kv write's `revision`) never
/// collide with the event's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Event {
    /// The event's revision; strictly increasing.
    pub revision: u64,
    /// The namespace the change happened in.
    pub namespace: String,
    /// The cluster time the change was applied at.
    pub cluster_time_ms: u64,
    /// What changed.
    pub kind: EventKind,
}

/// What changed, tagged by `type` (`granted`, `released`, `expired`, `kv_written`,
/// `kv_deleted`, `task_enqueued`, `task_claimed`, `task_completed`, `task_failed`,
/// `task_released`, `task_dead`). Never carries a session id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// A lease was granted.
    Granted {
        /// The claimed path.
        resource: String,
        /// The holder name.
        holder: String,
        /// The grant's fence.
        fence: u64,
        /// `exclusive` or `subtree`.
        mode: LeaseMode,
    },
    /// A lease was released by its session (directly or by ending the session).
    Released {
        /// The freed path.
        resource: String,
        /// The released lease's fence.
        fence: u64,
    },
    /// A lease expired (its session lapsed or its max hold passed).
    Expired {
        /// The freed path.
        resource: String,
        /// The expired lease's fence.
        fence: u64,
    },
    /// A kv key was written.
    KvWritten {
        /// The key.
        key: String,
        /// The key's new revision.
        revision: u64,
        /// The fence token the write carried, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fence: Option<u64>,
    },
    /// A kv key was deleted.
    KvDeleted {
        /// The key.
        key: String,
    },
    /// A task was enqueued.
    TaskEnqueued(TaskChange),
    /// A task was claimed.
    TaskClaimed(TaskChange),
    /// A task was completed.
    TaskCompleted(TaskChange),
    /// A task attempt failed (it is ready again or dead; a `task_dead` follows if dead).
    TaskFailed(TaskChange),
    /// A task claim was released without counting an attempt.
    TaskReleased(TaskChange),
    /// A task became dead.
    TaskDead(TaskChange),
    /// A claim lapsed with its session (expired or ended); the task is ready again or dead.
    TaskExpired(TaskChange),
    /// An event type this client does not know (sent by a newer server). Never sent.
    #[serde(other)]
    Unknown,
}

/// The fields of every `task_*` event: `{queue, task_id, fence?, attempt?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TaskChange {
    /// The queue's name.
    pub queue: String,
    /// The task's id.
    pub task_id: String,
    /// The claim's fence, for claim-related events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    /// The attempt number, for claim-related events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// For `task_failed`: whether the task went back to ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<bool>,
}

// ---------------------------------------------------------------------------------------------
// Cluster and debug
// ---------------------------------------------------------------------------------------------

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
/// commit_index, members}`. Also the answer to member add and remove.
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

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn owner_from_fields<'a>(
    session_id: Option<&'a SessionId>,
    holder: Option<&'a str>,
    ttl_ms: Option<u64>,
) -> Result<Owner<'a>, String> {
    match (session_id, holder, ttl_ms) {
        (Some(session_id), None, None) => Ok(Owner::Session(session_id)),
        (None, Some(holder), Some(ttl_ms)) => Ok(Owner::NewSession { holder, ttl_ms }),
        (Some(_), _, _) => Err("give either session_id, or holder and ttl_ms, not both".to_owned()),
        (None, None, None) => Err("give either session_id, or holder and ttl_ms".to_owned()),
        (None, Some(_), None) => Err("holder needs ttl_ms to create a session".to_owned()),
        (None, None, Some(_)) => Err("ttl_ms needs holder to create a session".to_owned()),
    }
}

fn fenced_by_fields<'a>(
    fence: Option<&'a FenceRef>,
    session_id: Option<&'a SessionId>,
) -> Result<Option<FencedBy<'a>>, String> {
    match (fence, session_id) {
        (Some(fence), Some(session_id)) => Ok(Some(FencedBy { fence, session_id })),
        (None, None) => Ok(None),
        (Some(_), None) => Err("fence needs the session_id that holds it".to_owned()),
        (None, Some(_)) => Err("session_id is only used with a fence; give both".to_owned()),
    }
}

fn default_true() -> bool {
    true
}

fn is_zero(value: &i32) -> bool {
    *value == 0
}

// ---------------------------------------------------------------------------------------------
// Formats every side writes the same way
// ---------------------------------------------------------------------------------------------

/// Milliseconds since the Unix epoch as `2026-11-30T02:48:59.123Z`.
pub fn rfc3339(epoch_ms: i64) -> String {
    let days = epoch_ms.div_euclid(86_400_000);
    let ms_of_day = epoch_ms.rem_euclid(86_400_000);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second, millis) = (
        ms_of_day / 3_600_000,
        ms_of_day / 60_000 % 60,
        ms_of_day / 1_000 % 60,
        ms_of_day % 1_000,
    );
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{millis:03}Z")
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// 128 random bits as a UUIDv4 (`xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx`, version and variant
/// bits set): the intended form of an `Idempotency-Key`. The caller draws the bits.
pub fn uuid_v4(bits: u128) -> String {
    let bits = (bits & !(0xf << 76) & !(0x3 << 62)) | (0x4 << 76) | (0x2 << 62);
    let hex = format!("{bits:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::DeserializeOwned;
    use serde_json::json;

    /// A round-trip check for one type, picked per table row.
    type RoundTrip = fn(&Value);
    /// An unknown-field check for one request type: true when the body is refused.
    type Refuses = fn(Value) -> bool;
    /// `(session_id, holder, ttl_ms)` of an acquire or claim body.
    type Fields<'a> = (Option<&'a str>, Option<&'a str>, Option<u64>);
    /// The owner, or a fragment of the refusal message.
    type Expected<'a> = Result<Owner<'a>, &'static str>;

    /// Parses `json` as `T`, serializes it back and checks nothing was lost or added.
    fn round_trip<T>(json: &Value)
    where
        T: Serialize + DeserializeOwned + PartialEq + fmt::Debug,
    {
        let parsed: T = serde_json::from_value(json.clone())
            .unwrap_or_else(|error| panic!("parse {json}: {error}"));
        let written = serde_json::to_value(&parsed).unwrap();
        assert_eq!(&written, json);
        let reparsed: T = serde_json::from_value(written).unwrap();
        assert_eq!(reparsed, parsed);
    }

    fn lease_json() -> Value {
        json!({
            "resource": "repo/src/auth.rs", "fence": 41, "holder": "agent-b",
            "mode": "subtree", "labels": {"pr": "12"},
            "acquired_at": "2025-01-01T00:00:00Z", "expires_in_ms": 38000,
            "expires_at": "2025-01-01T00:00:38Z"
        })
    }

    fn task_json() -> Value {
        json!({
            "id": "t1", "queue": "build", "payload": {"cmd": "make"}, "priority": 5,
            "depends_on": ["t0"], "state": "claimed", "attempt": 1, "max_attempts": 3,
            "ready_at_ms": 1500, "waiting_on": 0, "fence": 42, "holder": "agent-a"
        })
    }

    #[test]
    fn formats_rfc3339_in_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_796_006_939_123), "2026-11-30T02:48:59.123Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn uuids_carry_version_4_and_the_rfc_variant() {
        for bits in [0, u128::MAX, 0x0123_4567_89ab_cdef_0123_4567_89ab_cdef] {
            let uuid = uuid_v4(bits);
            assert_eq!(uuid.len(), 36, "{uuid}");
            assert_eq!(&uuid[14..15], "4", "{uuid}");
            assert!("89ab".contains(&uuid[19..20]), "{uuid}");
        }
        assert_eq!(uuid_v4(0), "00000000-0000-4000-8000-000000000000");
        assert_eq!(uuid_v4(u128::MAX), "ffffffff-ffff-4fff-bfff-ffffffffffff");
    }

    #[test]
    fn an_answer_is_applied_surely_not_or_unknown() {
        assert_eq!(Applied::of_answer(201, None), Applied::Yes);
        assert_eq!(Applied::of_answer(204, None), Applied::Yes);
        assert_eq!(
            Applied::of_answer(503, Some(ErrorCode::NoLeader)),
            Applied::No
        );
        assert_eq!(
            Applied::of_answer(429, Some(ErrorCode::ResourceExhausted)),
            Applied::No
        );
        assert_eq!(
            Applied::of_answer(409, Some(ErrorCode::LeaseHeld)),
            Applied::No
        );
        assert_eq!(
            Applied::of_answer(504, Some(ErrorCode::OutcomeUnknown)),
            Applied::Unknown
        );
        assert_eq!(
            Applied::of_answer(500, Some(ErrorCode::Internal)),
            Applied::Unknown
        );
        assert_eq!(Applied::of_answer(404, None), Applied::No);
        assert_eq!(Applied::of_answer(502, None), Applied::Unknown);
    }

    #[test]
    fn bodies_round_trip() {
        let cases: Vec<(&str, RoundTrip, Value)> = vec![
            (
                "create session",
                round_trip::<CreateSessionRequest>,
                json!({"holder": "agent-a", "ttl_ms": 30000, "labels": {"team": "x"}}),
            ),
            (
                "session created",
                round_trip::<CreateSessionResponse>,
                json!({"session_id": "s1", "holder": "agent-a", "ttl_ms": 30000,
                       "expires_in_ms": 30000, "expires_at": "2025-01-01T00:00:30Z"}),
            ),
            (
                "keepalive",
                round_trip::<KeepaliveResponse>,
                json!({"session_id": "s1", "expires_in_ms": 30000,
                       "expires_at": "2025-01-01T00:00:30Z"}),
            ),
            (
                "release",
                round_trip::<ReleaseRequest>,
                json!({"resource": "a/b"}),
            ),
            (
                "released",
                round_trip::<ReleaseResponse>,
                json!({"released": "a/b"}),
            ),
            (
                "session ended",
                round_trip::<EndSessionResponse>,
                json!({"released": ["a", "b"]}),
            ),
            (
                "session info",
                round_trip::<SessionInfo>,
                json!({"session_id": "s1", "holder": "agent-b", "ttl_ms": 30000, "labels": {},
                       "expires_in_ms": 1000, "expires_at": "2025-01-01T00:00:01Z",
                       "leases": [lease_json()]}),
            ),
            (
                "acquire with session",
                round_trip::<AcquireRequest>,
                json!({"resource": "a/b", "session_id": "s1", "mode": "exclusive"}),
            ),
            (
                "acquire with new session",
                round_trip::<AcquireRequest>,
                json!({"resource": "a", "holder": "agent-a", "ttl_ms": 5000, "mode": "subtree",
                       "max_hold_ms": 60000, "labels": {"k": "v"}, "reason": "refactor"}),
            ),
            (
                "grant",
                round_trip::<Grant>,
                json!({"resource": "a", "fence": 7, "session_id": "s1", "holder": "agent-a",
                       "mode": "exclusive", "labels": {}, "max_hold_ms": 60000,
                       "acquired_at": "2025-01-01T00:00:00Z", "expires_in_ms": 5000,
                       "expires_at": "2025-01-01T00:00:05Z"}),
            ),
            ("lease", round_trip::<Lease>, lease_json()),
            ("held by", round_trip::<HeldBy>, lease_json()),
            (
                "lease list",
                round_trip::<LeaseList>,
                json!({"leases": [lease_json()], "next_cursor": null}),
            ),
            (
                "list leases query",
                round_trip::<ListLeasesQuery>,
                json!({"prefix": "repo/", "limit": 10, "cursor": "c"}),
            ),
            (
                "fence check",
                round_trip::<FenceCheckRequest>,
                json!({"resource": "a", "fence": 3}),
            ),
            (
                "fence checked",
                round_trip::<FenceCheckResponse>,
                json!({"current": false, "fence": null}),
            ),
            (
                "kv put fenced",
                round_trip::<KvPutRequest>,
                json!({"value": {"n": 1}, "fence": {"resource": "a", "token": 3},
                       "session_id": "s1"}),
            ),
            (
                "kv put plain",
                round_trip::<KvPutRequest>,
                json!({"value": null}),
            ),
            (
                "kv put answer",
                round_trip::<KvPutResponse>,
                json!({"revision": 9}),
            ),
            (
                "kv entry",
                round_trip::<KvEntry>,
                json!({"key": "k", "value": [1, 2], "revision": 9,
                       "fence": {"resource": "a", "token": 3}}),
            ),
            ("kv delete", round_trip::<KvDeleteRequest>, json!({})),
            (
                "kv deleted",
                round_trip::<KvDeleteResponse>,
                json!({"deleted": true, "revision": 10}),
            ),
            (
                "enqueue",
                round_trip::<EnqueueRequest>,
                json!({"id": "t1", "payload": "x", "priority": -1, "depends_on": ["t0"],
                       "max_attempts": 3, "not_before_ms": 1000}),
            ),
            (
                "enqueue minimal",
                round_trip::<EnqueueRequest>,
                json!({"payload": {}}),
            ),
            ("task", round_trip::<Task>, task_json()),
            (
                "claim new session",
                round_trip::<ClaimRequest>,
                json!({"holder": "agent-a", "ttl_ms": 5000}),
            ),
            (
                "claimed",
                round_trip::<ClaimResponse>,
                json!({"task": task_json(), "fence": 42, "attempt": 1, "session_id": "s1",
                       "expires_in_ms": 5000, "expires_at": "2025-01-01T00:00:05Z"}),
            ),
            (
                "complete",
                round_trip::<CompleteRequest>,
                json!({"session_id": "s1", "fence": 42, "result": {"ok": true}}),
            ),
            (
                "fail",
                round_trip::<FailRequest>,
                json!({"session_id": "s1", "fence": 42, "reason": "oom", "retry": false}),
            ),
            (
                "task release",
                round_trip::<TaskReleaseRequest>,
                json!({"session_id": "s1", "fence": 42, "note": "half done"}),
            ),
            (
                "queue info",
                round_trip::<QueueInfo>,
                json!({"queue": "build", "counts": {"ready": 1, "waiting": 4, "claimed": 2, "done": 3,
                       "dead": 0}}),
            ),
            (
                "list tasks query",
                round_trip::<ListTasksQuery>,
                json!({"state": "dead", "limit": 5}),
            ),
            (
                "task list",
                round_trip::<TaskList>,
                json!({"tasks": [task_json()], "next_cursor": "t1"}),
            ),
            (
                "events query",
                round_trip::<EventsQuery>,
                json!({"after": 17}),
            ),
            (
                "events page",
                round_trip::<EventsPage>,
                json!({"events": [
                    {"revision": 18, "namespace": "default", "cluster_time_ms": 500,
                     "kind": {"type": "granted", "resource": "a", "holder": "h", "fence": 4,
                              "mode": "exclusive"}},
                    {"revision": 19, "namespace": "default", "cluster_time_ms": 501,
                     "kind": {"type": "expired", "resource": "a", "fence": 4}},
                    {"revision": 20, "namespace": "default", "cluster_time_ms": 502,
                     "kind": {"type": "kv_written", "key": "k", "revision": 20,
                              "fence": 5}},
                    {"revision": 21, "namespace": "default", "cluster_time_ms": 503,
                     "kind": {"type": "task_claimed", "queue": "q", "task_id": "t1",
                              "fence": 6, "attempt": 1}},
                    {"revision": 22, "namespace": "default", "cluster_time_ms": 504,
                     "kind": {"type": "task_enqueued", "queue": "q", "task_id": "t2"}}
                 ], "next": 22}),
            ),
            (
                "cluster status",
                round_trip::<ClusterStatus>,
                json!({"node_id": 1, "leader_id": null, "term": 3, "commit_index": 40,
                       "members": [{"id": 1, "api_addr": "127.0.0.1:7420",
                                    "peer_addr": "127.0.0.1:7520", "voter": true}]}),
            ),
            (
                "add member",
                round_trip::<AddMemberRequest>,
                json!({"id": 4, "api_addr": "h:1", "peer_addr": "h:2", "voter": false}),
            ),
            (
                "digest",
                round_trip::<Digest>,
                json!({"node_id": 2, "applied_index": 40, "cluster_time_ms": 9000,
                       "digest": "00ff"}),
            ),
            (
                "problem",
                round_trip::<Problem>,
                json!({"code": "LEASE_HELD", "message": "a is held by agent-b",
                       "held_by": lease_json(), "current_fence": 41}),
            ),
        ];
        for (name, check, json) in cases {
            eprintln!("case: {name}");
            check(&json);
        }
    }

    #[test]
    fn error_codes_use_their_spec_spelling() {
        assert_eq!(
            serde_json::to_string(&ErrorCode::LeaseHeld).unwrap(),
            r#""LEASE_HELD""#
        );
        for code in ErrorCode::ALL {
            let written = serde_json::to_value(code).unwrap();
            assert_eq!(written, json!(code.as_str()));
            assert_eq!(code.to_string(), code.as_str());
            assert_eq!(serde_json::from_value::<ErrorCode>(written).unwrap(), code);
        }
        assert!(serde_json::from_value::<ErrorCode>(json!("lease_held")).is_err());
    }

    #[test]
    fn only_unknown_outcomes_are_indeterminate() {
        let indeterminate: Vec<ErrorCode> = ErrorCode::ALL
            .into_iter()
            .filter(|code| code.is_indeterminate())
            .collect();
        assert_eq!(
            indeterminate,
            [ErrorCode::OutcomeUnknown, ErrorCode::Internal]
        );
        let retryable: Vec<ErrorCode> = ErrorCode::ALL
            .into_iter()
            .filter(|code| code.is_retryable())
            .collect();
        assert_eq!(
            retryable,
            [ErrorCode::ResourceExhausted, ErrorCode::NoLeader]
        );
    }

    #[test]
    fn requests_refuse_unknown_fields() {
        let cases: Vec<(&str, Refuses, Value)> = vec![
            (
                "acquire",
                |json| serde_json::from_value::<AcquireRequest>(json).is_err(),
                json!({"resource": "a", "session_id": "s", "ttl": 5}),
            ),
            (
                "create session",
                |json| serde_json::from_value::<CreateSessionRequest>(json).is_err(),
                json!({"holder": "h", "ttl_ms": 1000, "label": {}}),
            ),
            (
                "kv put",
                |json| serde_json::from_value::<KvPutRequest>(json).is_err(),
                json!({"value": 1, "fence": {"resource": "a", "token": 1, "x": 0},
                       "session_id": "s"}),
            ),
            (
                "claim",
                |json| serde_json::from_value::<ClaimRequest>(json).is_err(),
                json!({"session": "s"}),
            ),
            (
                "enqueue",
                |json| serde_json::from_value::<EnqueueRequest>(json).is_err(),
                json!({"payload": 1, "prio": 2}),
            ),
            (
                "list leases query",
                |json| serde_json::from_value::<ListLeasesQuery>(json).is_err(),
                json!({"prefx": "a"}),
            ),
        ];
        for (name, refused, json) in cases {
            assert!(refused(json), "{name} accepted an unknown field");
        }
    }

    #[test]
    fn answers_tolerate_unknown_fields_and_event_types() {
        let mut problem = json!({"code": "NO_LEADER", "message": "election", "status": 503,
                                 "type": "about:blank", "retry_after_ms": 250});
        let parsed: Problem = serde_json::from_value(problem.clone()).unwrap();
        assert_eq!(parsed.retry_after_ms, Some(250));
        problem["code"] = json!("OUTCOME_UNKNOWN");
        assert!(serde_json::from_value::<Problem>(problem)
            .unwrap()
            .code
            .is_indeterminate());

        let event: Event = serde_json::from_value(json!({
            "revision": 1, "namespace": "default", "cluster_time_ms": 2, "shard": 0,
            "kind": {"type": "lease_migrated", "resource": "a"}
        }))
        .unwrap();
        assert_eq!(event.kind, EventKind::Unknown);
    }

    #[test]
    fn held_by_never_carries_a_session_id() {
        let grant = Grant {
            resource: "a".to_owned(),
            fence: 1,
            session_id: SessionId::new("secret-session"),
            holder: "agent-b".to_owned(),
            mode: LeaseMode::Exclusive,
            labels: Labels::new(),
            max_hold_ms: None,
            acquired_at: "2025-01-01T00:00:00Z".to_owned(),
            expires_in_ms: 1000,
            expires_at: "2025-01-01T00:00:01Z".to_owned(),
        };
        let mut problem = Problem::new(ErrorCode::LeaseHeld, "a is held by agent-b");
        problem.held_by = Some(HeldBy::from(grant.clone().into_lease()));
        let written = serde_json::to_string(&problem).unwrap();
        assert!(!written.contains("session_id"), "{written}");
        assert!(!written.contains("secret-session"), "{written}");
        // A stray session_id in a held_by is ignored, never surfaced.
        let mut held_by = lease_json();
        held_by["session_id"] = json!("secret-session");
        let parsed: HeldBy = serde_json::from_value(held_by).unwrap();
        assert!(!serde_json::to_string(&parsed)
            .unwrap()
            .contains("secret-session"));
        // Debug output of a body never shows the id either.
        assert!(!format!("{grant:?}").contains("secret-session"));
    }

    #[test]
    fn unset_optional_fields_are_omitted() {
        let written =
            serde_json::to_value(Problem::new(ErrorCode::NotFound, "no lease a")).unwrap();
        assert_eq!(
            written,
            json!({"code": "NOT_FOUND", "message": "no lease a"})
        );

        let acquire = AcquireRequest {
            resource: "a".to_owned(),
            session_id: Some(SessionId::new("s1")),
            holder: None,
            ttl_ms: None,
            mode: LeaseMode::default(),
            max_hold_ms: None,
            labels: Labels::new(),
            reason: None,
        };
        assert_eq!(
            serde_json::to_value(&acquire).unwrap(),
            json!({"resource": "a", "session_id": "s1", "mode": "exclusive"})
        );

        let parsed: AcquireRequest =
            serde_json::from_value(json!({"resource": "a", "session_id": "s1"})).unwrap();
        assert_eq!(parsed, acquire);
        let add: AddMemberRequest =
            serde_json::from_value(json!({"id": 2, "api_addr": "a", "peer_addr": "p"})).unwrap();
        assert!(add.voter);
        let fail: FailRequest =
            serde_json::from_value(json!({"session_id": "s", "fence": 1, "reason": "r"})).unwrap();
        assert!(fail.retry);
        assert!(
            serde_json::from_value::<KvPutRequest>(json!({})).is_err(),
            "value is required"
        );
    }

    #[test]
    fn owner_is_a_session_or_a_new_session_never_both() {
        let session = SessionId::new("s1");
        let cases: Vec<(Fields<'_>, Expected<'_>)> = vec![
            ((Some("s1"), None, None), Ok(Owner::Session(&session))),
            (
                (None, Some("h"), Some(5000)),
                Ok(Owner::NewSession {
                    holder: "h",
                    ttl_ms: 5000,
                }),
            ),
            ((Some("s1"), Some("h"), Some(5000)), Err("not both")),
            ((Some("s1"), None, Some(5000)), Err("not both")),
            ((None, None, None), Err("give either")),
            ((None, Some("h"), None), Err("needs ttl_ms")),
            ((None, None, Some(5000)), Err("needs holder")),
        ];
        for ((session_id, holder, ttl_ms), expected) in cases {
            let acquire = AcquireRequest {
                resource: "a".to_owned(),
                session_id: session_id.map(SessionId::from),
                holder: holder.map(str::to_owned),
                ttl_ms,
                mode: LeaseMode::Exclusive,
                max_hold_ms: None,
                labels: Labels::new(),
                reason: None,
            };
            let claim = ClaimRequest {
                session_id: acquire.session_id.clone(),
                holder: acquire.holder.clone(),
                ttl_ms,
            };
            for owner in [acquire.owner(), claim.owner()] {
                match (&owner, &expected) {
                    (Ok(owner), Ok(expected)) => assert_eq!(owner, expected),
                    (Err(message), Err(fragment)) => {
                        assert!(message.contains(fragment), "{message}")
                    }
                    _ => panic!("{session_id:?} {holder:?} {ttl_ms:?}: got {owner:?}"),
                }
            }
        }
    }

    #[test]
    fn kv_fence_and_session_come_both_or_neither() {
        let fence = json!({"resource": "a", "token": 3});
        let cases = [
            (json!({"value": 1}), Ok(false)),
            (
                json!({"value": 1, "fence": fence, "session_id": "s"}),
                Ok(true),
            ),
            (
                json!({"value": 1, "fence": fence}),
                Err("needs the session_id"),
            ),
            (json!({"value": 1, "session_id": "s"}), Err("give both")),
        ];
        for (body, expected) in cases {
            let put: KvPutRequest = serde_json::from_value(body.clone()).unwrap();
            let mut delete_body = body;
            delete_body.as_object_mut().unwrap().remove("value");
            let delete: KvDeleteRequest = serde_json::from_value(delete_body).unwrap();
            for fenced_by in [put.fenced_by(), delete.fenced_by()] {
                match (fenced_by, expected) {
                    (Ok(fenced_by), Ok(is_fenced)) => {
                        assert_eq!(fenced_by.is_some(), is_fenced);
                        if let Some(fenced_by) = fenced_by {
                            assert_eq!(fenced_by.fence.token, 3);
                            assert_eq!(fenced_by.session_id.as_str(), "s");
                        }
                    }
                    (Err(message), Err(fragment)) => {
                        assert!(message.contains(fragment), "{message}")
                    }
                    (got, _) => panic!("got {got:?}, expected {expected:?}"),
                }
            }
        }
    }
}
