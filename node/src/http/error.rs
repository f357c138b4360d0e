//! How the service's one error type (`ApiError`) leaves over HTTP, and the one table from error
//! code to status. Every refusal leaves as `application/problem+json` with a code of docs/api.md.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use baton_api::{ErrorCode, HEADER_CLUSTER_TIME, HEADER_LEADER, PROBLEM_CONTENT_TYPE};

pub use crate::service::ApiError;

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
