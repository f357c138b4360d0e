//! Forwarding: a follower sends a leader route's HTTP request to the leader and relays its
//! answer, so any node answers any request. The writes the route table marks `Relayed` are the
//! exception: their handlers run on the follower, which relays their commands instead
//! (relay.rs); and so are event streams, which every node serves from its own applied log
//! (events.rs).
//!
//! The bounds (the API's contract): a forward to a leader that stops answering (paused, cut
//! off) gives up on it after twice the election timeout, by when a new leader has been elected,
//! and goes to the new one; no request waits longer than `Service::leader_wait` for a leader.
//! A request that asks the leader to hold it (`wait_ms`: an acquire or a claim that waits) has
//! that much longer.
//! What a failed forward may be answered with: a request that surely never reached a leader
//! (no connection) is tried again and, past the bound, `NO_LEADER`; a read that may have reached
//! one is re-sent (reads change nothing); a write that may have reached one is
//! `OUTCOME_UNKNOWN`, never `NO_LEADER`. Every error answered here names the same leader in
//! its body and in `Baton-Leader`.
//!
//! Never here: deciding anything about a request's content.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use baton_api::{ErrorCode, HEADER_IDEMPOTENCY_KEY, HEADER_NAMESPACE};
use futures_util::StreamExt;
use tokio::time::Instant;

use super::error::ApiError;
use super::routes::{self, Served};
use super::{AppState, BODY_BYTES_MAX};
use crate::service::{Leader, RECONNECT_PAUSE};

/// Marks a request a follower forwarded, so it is never forwarded twice.
const HEADER_FORWARDED: &str = "baton-forwarded";
/// The largest answer relayed from the leader: a full page of the largest list, with room.
const ANSWER_BYTES_MAX: usize = 16 << 20;
/// Request headers relayed to the leader.
const RELAYED_HEADERS: [&str; 6] = [
    "authorization",
    "content-type",
    "accept",
    HEADER_NAMESPACE,
    HEADER_IDEMPOTENCY_KEY,
    "last-event-id",
];

/// Why one attempt to forward failed.
enum Failure {
    /// The request surely did not reach the leader (no connection was made).
    NotDelivered,
    /// The request may have reached the leader; the reason.
    MaybeDelivered(String),
    /// Refused before sending (the body is too large, say).
    Refused(ApiError),
}

/// On a follower, sends the request to the leader and relays its answer (see the module docs).
pub async fn forward_unless_leader(
    State(app): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let served = request
        .extensions()
        .get::<MatchedPath>()
        .and_then(|pattern| routes::find(request.method(), pattern.as_str()))
        .map(|route| route.served);
    let Some(served @ (Served::Relayed | Served::Forwarded)) = served else {
        // A node-local route, the console, or no route at all: answered here.
        return next.run(request).await;
    };
    if app.is_leader() {
        return next.run(request).await;
    }
    if streams_events(&request) {
        // Served from this node's own applied log, after a read index (events.rs), so one
        // tenant's streams take this node's slots, not the leader's.
        return next.run(request).await;
    }
    if request.headers().contains_key(HEADER_FORWARDED) {
        // The sender took this node for the leader; it is not (any more).
        return with_leader(ApiError::no_leader(None), None);
    }
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, BODY_BYTES_MAX).await {
        Ok(body) => body,
        Err(_) => {
            let error = ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!("the request body is over {BODY_BYTES_MAX} bytes"),
            );
            return with_leader(error, app.leader());
        }
    };
    let waits = wait_asked(&parts, &body);
    if waits.is_none() && served == Served::Relayed {
        // The handler decides it here and relays the command (relay.rs).
        return next.run(Request::from_parts(parts, Body::from(body))).await;
    }
    let held = waits.unwrap_or(Duration::ZERO);
    let deadline = started + app.leader_wait() + held;
    let mut unanswered: Option<u64> = None;
    loop {
        let leader = match app.wait_for_leader(unanswered, deadline).await {
            Some(Leader::Me) => {
                return next.run(Request::from_parts(parts, Body::from(body))).await;
            }
            Some(Leader::Other { id, member }) => (id, member.api_addr),
            None => return with_leader(ApiError::no_leader(None), None),
        };
        let (leader_id, api_addr) = leader;
        let attempt_timeout = (app.election_timeout * 2 + held).min(deadline - Instant::now());
        match send(&app, &parts, body.clone(), &api_addr, attempt_timeout).await {
            Ok(response) => return response,
            Err(Failure::Refused(error)) => return with_leader(error, Some(leader_id)),
            Err(Failure::NotDelivered) => {
                tracing::debug!(leader_id, "the leader could not be reached; trying again");
                unanswered = None;
                tokio::time::sleep_until((Instant::now() + RECONNECT_PAUSE).min(deadline)).await;
            }
            Err(Failure::MaybeDelivered(reason)) if parts.method == Method::GET => {
                tracing::debug!(leader_id, %reason, "a read forwarded to the leader failed; re-sending it to the next leader");
                unanswered = Some(leader_id);
            }
            Err(Failure::MaybeDelivered(reason)) => {
                let error = ApiError::outcome_unknown(format!(
                    "forwarding to the leader, node {leader_id}, failed: {reason}"
                ));
                return with_leader(error, app.leader());
            }
        }
        if Instant::now() >= deadline {
            return with_leader(ApiError::no_leader(None), None);
        }
    }
}

/// Whether `request` opens an event stream (`GET /v1/events` with `Accept:
/// text/event-stream`), which any node serves itself.
fn streams_events(request: &Request) -> bool {
    request.method() == Method::GET
        && request.uri().path() == "/v1/events"
        && super::events::wants_stream(request.headers())
}

/// How long the leader may hold a request on purpose before answering: the `wait_ms` of an
/// acquire's or a claim's body (at most `WAIT_MS_MAX`), if it has one. No other body is read.
fn wait_asked(parts: &Parts, body: &Bytes) -> Option<Duration> {
    #[derive(serde::Deserialize)]
    struct Waits {
        wait_ms: Option<u64>,
    }
    let path = parts.uri.path();
    let waits = parts.method == Method::POST && (path == "/v1/leases" || path.ends_with("/claim"));
    if !waits {
        return None;
    }
    serde_json::from_slice::<Waits>(body)
        .ok()
        .and_then(|waits| waits.wait_ms)
        .map(|wait_ms| Duration::from_millis(wait_ms.min(baton_api::WAIT_MS_MAX)))
}

/// One attempt: the request to `api_addr`, its answer relayed. An event stream is relayed as
/// it comes and has no timeout; any other answer is read whole (bounded) first, so a cut
/// becomes a failure instead of a truncated body.
async fn send(
    app: &AppState,
    parts: &Parts,
    body: Bytes,
    api_addr: &str,
    timeout: Duration,
) -> Result<Response, Failure> {
    let path_and_query = parts.uri.path_and_query().map_or("/", |path| path.as_str());
    let path_and_query = forwardable(path_and_query).map_err(Failure::Refused)?;
    let url = format!("{}://{api_addr}{path_and_query}", app.api_scheme);
    let method = reqwest::Method::from_bytes(parts.method.as_str().as_bytes())
        .map_err(|error| Failure::Refused(ApiError::internal(error)))?;
    let streaming = parts
        .headers
        .get(header::ACCEPT)
        .and_then(|accept| accept.to_str().ok())
        .is_some_and(|accept| accept.contains("text/event-stream"));
    let mut outgoing = app.forwarder.request(method, url).body(body);
    if !streaming {
        outgoing = outgoing.timeout(timeout);
    }
    for name in RELAYED_HEADERS {
        if let Some(value) = parts.headers.get(name) {
            outgoing = outgoing.header(name, value.as_bytes());
        }
    }
    outgoing = outgoing.header(HEADER_FORWARDED, app.node_id.to_string());
    let answer = outgoing.send().await.map_err(|error| {
        if error.is_connect() {
            Failure::NotDelivered
        } else {
            Failure::MaybeDelivered(error.to_string())
        }
    })?;
    let status = StatusCode::from_u16(answer.status().as_u16())
        .map_err(|error| Failure::Refused(ApiError::internal(error)))?;
    let mut headers = HeaderMap::new();
    for (name, value) in answer.headers() {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_str().as_bytes()),
            HeaderValue::from_bytes(value.as_bytes()),
        ) {
            headers.insert(name, value);
        }
    }
    headers.remove(header::CONTENT_LENGTH);
    headers.remove(header::TRANSFER_ENCODING);
    let body = if streaming && status.is_success() {
        Body::from_stream(answer.bytes_stream())
    } else {
        Body::from(read_bounded(answer).await?)
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    Ok(response)
}

/// The request target as it must reach the leader. The URL library that sends it resolves
/// `.` and `..` segments (also percent-encoded ones) and reads `\\` as `/`, which would hand the
/// leader another name than the client sent: a dot segment is refused here, as the leader would
/// refuse it, and a backslash travels percent-encoded.
fn forwardable(path_and_query: &str) -> Result<String, ApiError> {
    let (path, query) = path_and_query
        .split_once('?')
        .map_or((path_and_query, None), |(path, query)| (path, Some(query)));
    for segment in path.split('/') {
        let decoded = segment.to_ascii_lowercase().replace("%2e", ".");
        if decoded == "." || decoded == ".." {
            return Err(ApiError::invalid(format!(
                "the path {path:?} has a {decoded:?} segment: names are compared as exact bytes, so name the resource without '.' or '..'"
            )));
        }
    }
    let mut forwarded = path.replace('\\', "%5C");
    if let Some(query) = query {
        forwarded.push('?');
        forwarded.push_str(&query.replace('\\', "%5C"));
    }
    Ok(forwarded)
}

/// The whole answer, at most `ANSWER_BYTES_MAX` bytes.
async fn read_bounded(answer: reqwest::Response) -> Result<Vec<u8>, Failure> {
    let mut body = Vec::new();
    let mut chunks = answer.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|error| {
            Failure::MaybeDelivered(format!("the leader's answer was cut off: {error}"))
        })?;
        if body.len() + chunk.len() > ANSWER_BYTES_MAX {
            return Err(Failure::MaybeDelivered(format!(
                "the leader's answer is over {ANSWER_BYTES_MAX} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// An error answered by this node, naming the same leader (or none) in its body and in
/// `Baton-Leader`.
fn with_leader(error: ApiError, leader: Option<u64>) -> Response {
    error.naming_leader(leader).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_segments_are_refused_before_a_url_library_resolves_them() {
        for path in [
            "/v1/kv/a/../b",
            "/v1/kv/a/./b",
            "/v1/kv/a/%2E%2E/b",
            "/v1/kv/a/%2e./b",
            "/v1/leases/..",
        ] {
            assert!(forwardable(path).is_err(), "{path}");
        }
    }

    #[test]
    fn other_paths_travel_unchanged_but_for_backslashes() {
        assert_eq!(
            forwardable("/v1/kv/a/.env/..b?x=1").unwrap(),
            "/v1/kv/a/.env/..b?x=1"
        );
        assert_eq!(forwardable("/v1/kv/a%2Fb").unwrap(), "/v1/kv/a%2Fb");
        assert_eq!(
            forwardable("/v1/kv/a\\b?p=c\\d").unwrap(),
            "/v1/kv/a%5Cb?p=c%5Cd"
        );
    }
}
