//! The error body of every refusal, its codes, and the one outcome classifier.

use std::fmt;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::HeldBy;

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
