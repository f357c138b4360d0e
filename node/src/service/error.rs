//! The service's one error type: a refusal or a failure with its code of docs/api.md, the
//! problem that says it, and what decided it. How it leaves over HTTP is `http::error`'s.

use baton_api::{ErrorCode, HeldBy, Problem};
use baton_raft_store::machine::{Invalid, Rejection};

use baton_raft_store::proposer::ProposeError;

/// How long a caller should wait before retrying after `NO_LEADER` or overload.
const RETRY_AFTER_MS: u64 = 1_000;
/// The wait after a `NO_LEADER` that names the leader (a hand-over, say): it leads already.
const RETRY_AFTER_KNOWN_LEADER_MS: u64 = 20;

/// A refused or failed request: its problem, ready to be sent.
#[derive(Debug)]
pub struct ApiError {
    pub problem: Box<Problem>,
    /// The cluster time the refusal was decided at, when it was decided by the machine.
    pub cluster_time_ms: Option<u64>,
    /// A wrong method is `INVALID_ARGUMENT` with 405 rather than the code's 400.
    pub method_not_allowed: bool,
    /// Set by `naming_leader`: `Baton-Leader` says the same as the body's `leader`.
    pub leader_named: bool,
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
