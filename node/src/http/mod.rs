//! The client HTTP API of docs/api.md: routing, the shared `AppState`, and the middleware
//! every answer passes through (forwarding to the leader, `Baton-Leader` and
//! `Baton-Cluster-Time` headers, request metrics).
//!
//! Writes become `Command`s for the proposer; reads are linearizable (a read index on the
//! leader, then the applied state) and answered at the applied state's cluster time. A follower
//! forwards every non-local request to the leader, so any node answers any request. This module
//! tree is the only place that knows HTTP status codes (`error::status_of`).

mod auth;
mod cluster;
mod console;
mod error;
mod events;
mod extract;
mod forward;
mod kv;
mod leases;
mod openapi;
mod queues;
mod relay;
mod routes;
mod txn;

use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use baton_api::{HEADER_CLUSTER_TIME, HEADER_IDEMPOTENT_REPLAYED, HEADER_LEADER};
use serde::Serialize;

use crate::metrics::Metrics;

pub use auth::bootstrap as bootstrap_token;
pub use error::ApiError;
pub use events::StreamSlots;
pub use relay::routes as relay_routes;

use crate::service::{convert, Committed, Service};

/// The largest request body accepted (docs/guarantees.md, "Limits").
pub const BODY_BYTES_MAX: usize = 1 << 20;

/// What every handler shares. Cheap to clone.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

pub struct Shared {
    /// The operations themselves (`crate::service`), which every handler calls.
    pub service: Service,
    pub forwarder: reqwest::Client,
    pub metrics: Metrics,
    pub clock_control: bool,
    /// The event streams open on this node (`--event-streams-max`, and per token
    /// `--event-streams-per-token-max`).
    pub event_streams: Arc<events::StreamSlots>,
    /// `--auth`: requests need a token (see `auth.rs`).
    pub auth: bool,
    /// `https` with --tls-cert: how a follower reaches the leader's client API.
    pub api_scheme: &'static str,
    /// The highest cluster time this node has put in an answer, so an answer it makes up
    /// itself never shows an earlier one.
    pub cluster_time_shown: AtomicU64,
}

impl Deref for Shared {
    type Target = Service;

    fn deref(&self) -> &Service {
        &self.service
    }
}

impl Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl AppState {
    pub fn new(shared: Shared) -> AppState {
        AppState(Arc::new(shared))
    }
}

impl<T> Committed<T> {
    /// The answer to a committed mutation: decided at its entry's cluster time, and marked as
    /// a replay when it is the recorded first answer of a retry.
    pub fn answer<B: Serialize>(&self, status: StatusCode, body: &B) -> ApiAnswer {
        ApiAnswer::new(status, body, self.cluster_time_ms).replayed(self.replayed)
    }
}

/// A successful JSON answer with the cluster time it was decided at.
#[derive(Debug)]
pub struct ApiAnswer {
    status: StatusCode,
    body: Vec<u8>,
    /// When the answer was decided; none for an answer about this node only, which shows the
    /// latest cluster time the node knows (see `observe`).
    cluster_time_ms: Option<u64>,
    replayed: bool,
}

impl ApiAnswer {
    pub fn new<T: Serialize>(status: StatusCode, body: &T, cluster_time_ms: u64) -> ApiAnswer {
        ApiAnswer {
            status,
            body: serde_json::to_vec(body).expect("wire types always encode as JSON"),
            cluster_time_ms: Some(cluster_time_ms),
            replayed: false,
        }
    }

    /// An answer about this node (a node-local route), decided at no cluster time of its own.
    pub fn local<T: Serialize>(status: StatusCode, body: &T) -> ApiAnswer {
        ApiAnswer {
            status,
            body: serde_json::to_vec(body).expect("wire types always encode as JSON"),
            cluster_time_ms: None,
            replayed: false,
        }
    }

    fn replayed(mut self, replayed: bool) -> ApiAnswer {
        self.replayed = replayed;
        self
    }
}

impl IntoResponse for ApiAnswer {
    fn into_response(self) -> Response {
        let mut response = (self.status, self.body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(cluster_time_ms) = self.cluster_time_ms {
            headers.insert(HEADER_CLUSTER_TIME, HeaderValue::from(cluster_time_ms));
        }
        if self.replayed {
            headers.insert(HEADER_IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        }
        response
    }
}

/// The API router: the route table's routes (`routes.rs`) and the console's.
pub fn router(app: AppState) -> Router {
    let routes = routes::router()
        .merge(console::routes())
        .fallback(unknown_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(from_fn_with_state(
            app.clone(),
            forward::forward_unless_leader,
        ));
    // Without --auth the check would pass every request: no layer at all, rather than one that
    // boxes every request's future to do nothing.
    let routes = if app.auth {
        routes.layer(from_fn_with_state(app.clone(), auth::authenticate))
    } else {
        routes
    };
    routes
        .layer(from_fn_with_state(app.clone(), observe))
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
        .with_state(app)
}

async fn unknown_route(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!("no route for {method} {}", uri.path()))
}

async fn wrong_method(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::method_not_allowed(format!(
        "{} does not take {method}: see the Allow header",
        uri.path()
    ))
}

/// Adds `Baton-Leader` and `Baton-Cluster-Time` to every answer that lacks them, and records
/// the request in the metrics by route pattern (never the raw path: it may hold a session id).
async fn observe(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    // A clone of the matched path shares its text: the route is not copied per request.
    let route = request.extensions().get::<MatchedPath>().cloned();
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    let method = request.method().clone();
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    if !headers.contains_key(HEADER_LEADER) {
        let leader = app
            .leader()
            .map_or(HeaderValue::from_static(""), HeaderValue::from);
        headers.insert(HEADER_LEADER, leader);
    }
    // A relayed or decided answer carries its own cluster time; an answer this node made up
    // (a local route, or an error before anything was decided) shows the latest it knows, never
    // less than one it has already shown: a follower's applied state trails the leader's times
    // that it relayed.
    let decided = headers
        .get(HEADER_CLUSTER_TIME)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
    match decided {
        Some(time_ms) => {
            app.cluster_time_shown.fetch_max(time_ms, Ordering::Relaxed);
        }
        None => {
            let local_ms = app
                .machine
                .read(|machine, _| machine.time_ms())
                .unwrap_or_default();
            let shown_ms = app
                .cluster_time_shown
                .fetch_max(local_ms, Ordering::Relaxed);
            headers.insert(
                HEADER_CLUSTER_TIME,
                HeaderValue::from(local_ms.max(shown_ms)),
            );
        }
    }
    app.metrics.observe(
        route,
        &method,
        response.status().as_u16(),
        started.elapsed(),
    );
    tracing::debug!(%method, %route, status = response.status().as_u16(), "request");
    response
}
