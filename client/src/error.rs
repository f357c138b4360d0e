//! The client's error type: what a failed call lets the caller assume.
//!
//! Every [`Error`] answers one question first (STYLE rule 8): was the request definitely not
//! applied, or is the outcome unknown ([`Error::is_indeterminate`])? Retries, the `baton` exit
//! codes and the Jepsen `fail`/`info` split all hang on it. Each variant carries the server's
//! own message when there is one, and a TLS failure ([`Error::Tls`]) says what to fix. What
//! must never live here: HTTP status codes (the client reads the problem `code`, never the
//! status, except to classify a body-less 5xx) and session ids (messages come from the server,
//! which never puts one in a refusal).

use rustls::CertificateError;

use crate::api::{ErrorCode, HeldBy, Problem};

/// Where the TLS messages send the reader.
const TLS_GUIDE: &str = "see docs/security.md, \"TLS\"";

/// The result of a client call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a call failed, and what the caller may assume about it.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `LEASE_HELD`: a conflicting lease is live (possibly the caller's own). Not applied.
    #[error("LEASE_HELD: {message}")]
    Held {
        /// The lease in the way: holder, fence, remaining time.
        held_by: Box<HeldBy>,
        /// The server's message, e.g. `a is held by agent-b (fence 41) for 38s more`.
        message: String,
    },
    /// `LEASE_LOST`: the session or lease is gone; stop acting as holder. Not applied.
    #[error("LEASE_LOST: {message}")]
    Lost {
        /// The server's (or the guard's) message.
        message: String,
    },
    /// `STALE_FENCE`: the fence is not the live fence of that session. Not applied.
    #[error("STALE_FENCE: {message}")]
    StaleFence {
        /// The resource's live fence, when the server said.
        current: Option<u64>,
        /// The server's message.
        message: String,
    },
    /// `NOT_FOUND`: no such lease, session, key or member.
    #[error("NOT_FOUND: {message}")]
    NotFound {
        /// The server's message.
        message: String,
    },
    /// `INVALID_ARGUMENT`, or a request the client refused to send (a bad endpoint or
    /// duration). Not applied: fix the request.
    #[error("INVALID_ARGUMENT: {message}")]
    InvalidArgument {
        /// The server's or the client's message.
        message: String,
    },
    /// `PAYLOAD_TOO_LARGE`: a body or value over its limit. Not applied.
    #[error("PAYLOAD_TOO_LARGE: {message}")]
    PayloadTooLarge {
        /// The server's message.
        message: String,
    },
    /// `IDEMPOTENCY_KEY_REUSED`: the key was used for another request. Not applied.
    #[error("IDEMPOTENCY_KEY_REUSED: {message}")]
    IdempotencyKeyReused {
        /// The server's message.
        message: String,
    },
    /// The TLS handshake failed: the server's certificate was refused (a CA certificate served
    /// as the server's, an issuer this client does not trust, a name it does not carry, an
    /// expired one) or the endpoint does not speak TLS as it should. A configuration error:
    /// never retried, not applied; the message says what to fix.
    #[error("TLS: {message}")]
    Tls {
        /// What is wrong and what to do about it.
        message: String,
    },
    /// `UNAUTHENTICATED` or `PERMISSION_DENIED`. Not applied.
    #[error("{code}: {message}")]
    Denied {
        /// Which of the two.
        code: ErrorCode,
        /// The server's message.
        message: String,
    },
    /// Definitely not applied, and no node could take it within the retry budget: every
    /// endpoint refused the connection, or answered `NO_LEADER` or `RESOURCE_EXHAUSTED`; or a
    /// read (which has no effect) got no answer in time. Safe to retry later.
    #[error("{}: {message}", code.map_or("UNAVAILABLE", ErrorCode::as_str))]
    Unavailable {
        /// The last server code (`NO_LEADER`, `RESOURCE_EXHAUSTED`), if a server answered.
        code: Option<ErrorCode>,
        /// What happened, per endpoint.
        message: String,
    },
    /// The outcome is unknown: `OUTCOME_UNKNOWN`, `INTERNAL`, a timeout or a broken connection
    /// after a mutation was sent, or an answer to one that could not be read. The mutation may
    /// have been applied; retry it with the same idempotency key to find out. Reads are never
    /// indeterminate.
    #[error("{}: {message}", code.map_or("OUTCOME_UNKNOWN", ErrorCode::as_str))]
    Indeterminate {
        /// The server code (`OUTCOME_UNKNOWN`, `INTERNAL`), if a server answered.
        code: Option<ErrorCode>,
        /// What happened.
        message: String,
    },
}

impl Error {
    /// True when the request may or may not have been applied ([`Error::Indeterminate`]);
    /// every other error means "definitely not applied".
    pub fn is_indeterminate(&self) -> bool {
        matches!(self, Error::Indeterminate { .. })
    }

    /// The code shown in `error[CODE]: ...` lines: the wire code, or `UNAVAILABLE` /
    /// `OUTCOME_UNKNOWN` when no server gave one.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Held { .. } => ErrorCode::LeaseHeld.as_str(),
            Error::Lost { .. } => ErrorCode::LeaseLost.as_str(),
            Error::StaleFence { .. } => ErrorCode::StaleFence.as_str(),
            Error::NotFound { .. } => ErrorCode::NotFound.as_str(),
            Error::InvalidArgument { .. } => ErrorCode::InvalidArgument.as_str(),
            Error::PayloadTooLarge { .. } => ErrorCode::PayloadTooLarge.as_str(),
            Error::IdempotencyKeyReused { .. } => ErrorCode::IdempotencyKeyReused.as_str(),
            Error::Tls { .. } => "TLS",
            Error::Denied { code, .. } => code.as_str(),
            Error::Unavailable { code, .. } => code.map_or("UNAVAILABLE", ErrorCode::as_str),
            Error::Indeterminate { code, .. } => code.map_or("OUTCOME_UNKNOWN", ErrorCode::as_str),
        }
    }

    /// The message alone, without the code.
    pub fn message(&self) -> &str {
        match self {
            Error::Held { message, .. }
            | Error::Lost { message }
            | Error::StaleFence { message, .. }
            | Error::NotFound { message }
            | Error::InvalidArgument { message }
            | Error::PayloadTooLarge { message }
            | Error::IdempotencyKeyReused { message }
            | Error::Tls { message }
            | Error::Denied { message, .. }
            | Error::Unavailable { message, .. }
            | Error::Indeterminate { message, .. } => message,
        }
    }

    /// The error as a problem body (what `baton --json` prints for a refusal).
    pub fn to_problem(&self) -> serde_json::Value {
        let mut problem = serde_json::json!({"code": self.code(), "message": self.message()});
        match self {
            Error::Held { held_by, .. } => {
                problem["held_by"] = serde_json::to_value(held_by).unwrap_or_default();
            }
            Error::StaleFence {
                current: Some(current),
                ..
            } => {
                problem["current_fence"] = (*current).into();
            }
            _ => {}
        }
        problem
    }

    /// The [`Error::Tls`] a failed request stands for, when TLS is what failed: the rustls
    /// error is looked for along `error`'s sources (an I/O error carries it inside).
    pub(crate) fn from_tls(error: &(dyn std::error::Error + 'static)) -> Option<Error> {
        let mut cause = Some(error);
        while let Some(current) = cause {
            if let Some(tls) = current.downcast_ref::<rustls::Error>() {
                return Some(Error::Tls {
                    message: tls_message(tls),
                });
            }
            // An I/O error's `source` skips the error it wraps: look inside it instead.
            cause = match current
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::get_ref)
            {
                Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
                None => current.source(),
            };
        }
        None
    }

    /// The error a server's problem body stands for.
    pub(crate) fn from_problem(problem: Problem) -> Error {
        let message = problem.message;
        match problem.code {
            ErrorCode::LeaseHeld => match problem.held_by {
                Some(held_by) => Error::Held {
                    held_by: Box::new(held_by),
                    message,
                },
                // A LEASE_HELD without `held_by` breaks the contract; the refusal stands.
                None => Error::Indeterminate {
                    code: None,
                    message: format!("LEASE_HELD without held_by: {message}"),
                },
            },
            ErrorCode::LeaseLost => Error::Lost { message },
            ErrorCode::StaleFence => Error::StaleFence {
                current: problem.current_fence,
                message,
            },
            ErrorCode::NotFound => Error::NotFound { message },
            ErrorCode::InvalidArgument => Error::InvalidArgument { message },
            ErrorCode::PayloadTooLarge => Error::PayloadTooLarge { message },
            ErrorCode::IdempotencyKeyReused => Error::IdempotencyKeyReused { message },
            code @ (ErrorCode::Unauthenticated | ErrorCode::PermissionDenied) => {
                Error::Denied { code, message }
            }
            code @ (ErrorCode::NoLeader | ErrorCode::ResourceExhausted) => Error::Unavailable {
                code: Some(code),
                message,
            },
            code @ (ErrorCode::OutcomeUnknown | ErrorCode::Internal) => Error::Indeterminate {
                code: Some(code),
                message,
            },
        }
    }
}

/// What a TLS failure means for whoever configured the client, and what to do.
fn tls_message(error: &rustls::Error) -> String {
    let advice = match error {
        rustls::Error::InvalidCertificate(certificate) => match certificate {
            CertificateError::Other(other) if other.to_string().contains("CaUsedAsEndEntity") => {
                "the server's certificate is a CA certificate, not a server certificate: sign a \
                 server certificate with that CA and serve it instead"
                    .to_owned()
            }
            CertificateError::UnknownIssuer => "the server's certificate is not signed by a CA \
                 this client trusts: trust the cluster's CA (baton --ca-file or BATON_CA_FILE, \
                 ClientBuilder::ca_certificates)"
                .to_owned(),
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                "the server's certificate does not carry the name or address this client \
                 connects to: connect by a name it carries, or reissue it with this one"
                    .to_owned()
            }
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. } => "the server's certificate is \
                 expired or not valid yet: renew it (and check the clocks of both machines)"
                .to_owned(),
            _ => "the server's certificate was refused: serve a server certificate signed by \
                 the CA this client trusts"
                .to_owned(),
        },
        _ => "the TLS handshake failed: is the endpoint an https:// Baton node, and does the \
              client trust its CA?"
            .to_owned(),
    };
    format!("{advice}; {TLS_GUIDE} ({error})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_server_code_keeps_its_meaning() {
        for code in ErrorCode::ALL {
            let problem = Problem {
                held_by: None,
                ..Problem::new(code, "the server's words")
            };
            let error = Error::from_problem(problem);
            assert!(error.message().contains("the server's words"), "{code}");
            assert_eq!(
                error.is_indeterminate(),
                code.is_indeterminate() || code == ErrorCode::LeaseHeld,
                "{code}: {error:?}"
            );
            if code != ErrorCode::LeaseHeld {
                assert_eq!(error.code(), code.as_str());
                assert_eq!(error.to_string(), format!("{code}: the server's words"));
            }
        }
    }

    #[test]
    fn a_tls_failure_says_what_is_wrong_and_what_to_do() {
        let ca_as_server =
            rustls::Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(
                std::sync::Arc::new(std::io::Error::other("CaUsedAsEndEntity")),
            )));
        let cases = [
            (ca_as_server, "is a CA certificate"),
            (
                rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
                "--ca-file",
            ),
            (
                rustls::Error::InvalidCertificate(CertificateError::NotValidForName),
                "does not carry the name",
            ),
            (
                rustls::Error::InvalidCertificate(CertificateError::Expired),
                "renew it",
            ),
            (
                rustls::Error::InvalidCertificate(CertificateError::BadSignature),
                "was refused",
            ),
            (
                rustls::Error::General("x".to_owned()),
                "the TLS handshake failed",
            ),
        ];
        for (tls, expected) in cases {
            // As reqwest hands it over: inside an I/O error, inside another error.
            let wrapped = std::io::Error::other(tls);
            let outer = std::io::Error::other(wrapped);
            let error = Error::from_tls(&outer).expect("a TLS error");
            assert_eq!(error.code(), "TLS");
            assert!(!error.is_indeterminate());
            assert!(error.message().contains(expected), "{error}");
            assert!(error.message().contains("docs/security.md"), "{error}");
        }
        let plain = std::io::Error::other("connection refused");
        assert!(Error::from_tls(&plain).is_none());
    }
}
