//! The one error type of the HTTP API and the one table from error code to status.
//! Every refusal leaves as `application/problem+json` with a code of docs/api.md.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use baton_api::{
    ErrorCode, HeldBy, Problem, HEADER_CLUSTER_TIME, HEADER_LEADER, PROBLEM_CONTENT_TYPE,
};
use baton_raft_store::machine::{Invalid, Rejection};

use crate::proposer::ProposeError;

/// How long a caller should wait before retrying after `NO_LEADER` or overload.
const RETRY_AFTER_MS: u64 = 1_000;
/// The wait after a `NO_LEADER` that names the leader (a hand-over, say): it leads already.
const RETRY_AFTER_KNOWN_LEADER_MS: u64 = 20;

/// A refused or failed request, ready to be sent as problem+json.
#[derive(Debug)]
pub struct ApiError {
    pub problem: Box<Problem>,
    /// The cluster time the refusal was decided at, when it was decided by the machine.
    pub cluster_time_ms: Option<u64>,
    /// A wrong method is `INVALID_ARGUMENT` with 405 rather than the code's 400.
    method_not_allowed: bool,
    /// Set by `naming_leader`: `Baton-Leader` says the same as the body's `leader`.
    leader_named: bool,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        let mut problem = Problem::new(code, message);
        if matches!(code, ErrorCode::NoLeader | ErrorCode::ResourceExhausted) {
            problem.retry_after_ms = Some(RETRY_AFTER_MS);
        }
        ApiError {
            problem: Box::new(problem),
            cluster_time_ms: None,
            method_not_allowed: false,
            leader_named: false,
        }
    }

    /// Names `leader` (or none) as the leader, in the body and in `Baton-Leader` alike.
    pub fn naming_leader(mut self, leader: Option<u64>) -> ApiError {
        self.problem.leader = leader;
        self.leader_named = true;
        self
    }

    /// A route that exists, asked with a method it does not take: 405 with the code
    /// `INVALID_ARGUMENT` (the router adds `Allow`).
    pub fn method_not_allowed(message: impl Into<String>) -> ApiError {
        let mut error = ApiError::invalid(message);
        error.method_not_allowed = true;
        error
    }

    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::InvalidArgument, message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::NotFound, message)
    }

    pub fn internal(message: impl std::fmt::Display) -> ApiError {
        tracing::error!(error = %message, "internal error");
        ApiError::new(ErrorCode::Internal, "internal error: see the server log")
    }

    pub fn no_leader(leader: Option<u64>) -> ApiError {
        let mut error = ApiError::new(
            ErrorCode::NoLeader,
            "no leader is reachable right now; the request was not applied: retry after Retry-After",
        );
        error.problem.leader = leader;
        if leader.is_some() {
            // Retry-After stays whole seconds (at least 1); the body's figure is the one that
            // tells a client a leader is there to ask at once.
            error.problem.retry_after_ms = Some(RETRY_AFTER_KNOWN_LEADER_MS);
        }
        error
    }

    pub fn outcome_unknown(reason: impl std::fmt::Display) -> ApiError {
        ApiError::new(
            ErrorCode::OutcomeUnknown,
            format!("the request may or may not have been applied ({reason}); retry with the same Idempotency-Key"),
        )
    }

    /// Input refused while parsing a request, before anything was proposed.
    pub fn from_invalid(invalid: Invalid) -> ApiError {
        ApiError::invalid(invalid.0)
    }

    /// A refusal decided by the state machine at `cluster_time_ms`. `held_by` is the denial's
    /// lease, already in wire form.
    pub fn rejected(
        rejection: Rejection,
        held_by: Option<HeldBy>,
        cluster_time_ms: Option<u64>,
    ) -> ApiError {
        let code = match &rejection {
            Rejection::InvalidArgument(_) => ErrorCode::InvalidArgument,
            Rejection::NotFound(_) => ErrorCode::NotFound,
            Rejection::LeaseHeld { .. } => ErrorCode::LeaseHeld,
            Rejection::LeaseLost(_) => ErrorCode::LeaseLost,
            Rejection::StaleFence { .. } => ErrorCode::StaleFence,
            Rejection::PayloadTooLarge(_) => ErrorCode::PayloadTooLarge,
            Rejection::IdempotencyKeyReused(_) => ErrorCode::IdempotencyKeyReused,
            Rejection::ResourceExhausted(_) => ErrorCode::ResourceExhausted,
            Rejection::Unauthenticated(_) => ErrorCode::Unauthenticated,
            Rejection::PermissionDenied(_) => ErrorCode::PermissionDenied,
        };
        let mut error = ApiError::new(code, rejection.message());
        if let Rejection::StaleFence { current_fence, .. } = rejection {
            error.problem.current_fence = current_fence;
        }
        error.problem.held_by = held_by;
        error.cluster_time_ms = cluster_time_ms;
        error
    }
}

impl From<ProposeError> for ApiError {
    fn from(error: ProposeError) -> ApiError {
        match error {
            ProposeError::NotLeader { leader } => ApiError::no_leader(leader),
            ProposeError::Overloaded => ApiError::new(
                ErrorCode::ResourceExhausted,
                "the server is overloaded; the request was not applied: retry after Retry-After",
            ),
            ProposeError::Unknown(reason) => ApiError::outcome_unknown(reason),
        }
    }
}

/// The status of each code (docs/api.md). The only place that knows it.
pub fn status_of(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::InvalidArgument => StatusCode::BAD_REQUEST,
        ErrorCode::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorCode::PermissionDenied => StatusCode::FORBIDDEN,
        ErrorCode::NotFound => StatusCode::NOT_FOUND,
        ErrorCode::LeaseHeld | ErrorCode::LeaseLost | ErrorCode::StaleFence => StatusCode::CONFLICT,
        ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::IdempotencyKeyReused => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorCode::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        ErrorCode::NoLeader => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::OutcomeUnknown => StatusCode::GATEWAY_TIMEOUT,
        ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = if self.method_not_allowed {
            StatusCode::METHOD_NOT_ALLOWED
        } else {
            status_of(self.problem.code)
        };
        let body = serde_json::to_vec(&self.problem).expect("a problem always encodes as JSON");
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(PROBLEM_CONTENT_TYPE),
        );
        if let Some(retry_after_ms) = self.problem.retry_after_ms {
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from(retry_after_ms.div_ceil(1_000)),
            );
        }
        if let Some(cluster_time_ms) = self.cluster_time_ms {
            headers.insert(HEADER_CLUSTER_TIME, HeaderValue::from(cluster_time_ms));
        }
        if self.leader_named {
            let value = self
                .problem
                .leader
                .map(|id| id.to_string())
                .unwrap_or_default();
            if let Ok(value) = HeaderValue::from_str(&value) {
                headers.insert(HEADER_LEADER, value);
            }
        }
        if self.problem.code == ErrorCode::Unauthenticated {
            // RFC 6750: a 401 names the scheme it wants.
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_the_status_of_the_spec() {
        let table = [
            (ErrorCode::InvalidArgument, 400),
            (ErrorCode::Unauthenticated, 401),
            (ErrorCode::PermissionDenied, 403),
            (ErrorCode::NotFound, 404),
            (ErrorCode::LeaseHeld, 409),
            (ErrorCode::LeaseLost, 409),
            (ErrorCode::StaleFence, 409),
            (ErrorCode::PayloadTooLarge, 413),
            (ErrorCode::IdempotencyKeyReused, 422),
            (ErrorCode::ResourceExhausted, 429),
            (ErrorCode::NoLeader, 503),
            (ErrorCode::OutcomeUnknown, 504),
            (ErrorCode::Internal, 500),
        ];
        for (code, status) in table {
            assert_eq!(status_of(code).as_u16(), status, "{code}");
        }
    }

    #[test]
    fn retryable_refusals_carry_retry_after() {
        let response = ApiError::no_leader(Some(2)).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            PROBLEM_CONTENT_TYPE
        );
        // Named, the leader is asked again at once; unnamed, a second later.
        assert_eq!(
            ApiError::no_leader(Some(2)).problem.retry_after_ms,
            Some(20)
        );
        assert_eq!(
            ApiError::no_leader(None).problem.retry_after_ms,
            Some(1_000)
        );
    }
}
