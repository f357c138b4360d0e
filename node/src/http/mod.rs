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
mod convert;
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
mod service;
mod txn;

use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use baton_api::{HEADER_CLUSTER_TIME, HEADER_IDEMPOTENT_REPLAYED, HEADER_LEADER};
use baton_raft_store::machine::{Limits, Machine, NewSession, Owner, Rejection, SessionId};
use baton_raft_store::store::{MachineHandle, Raft};
use openraft::async_runtime::WatchReceiver;
use openraft::{Instant as _, ReadPolicy};
use serde::Serialize;

use crate::clock::NodeClock;
use crate::metrics::Metrics;
use crate::network::LeaderContact;
use crate::proposer::Proposer;

pub use auth::bootstrap as bootstrap_token;
pub use convert::Clocks;
pub use error::ApiError;
pub use events::StreamSlots;
pub use relay::{routes as relay_routes, Relay};

/// The largest request body accepted (docs/guarantees.md, "Limits").
pub const BODY_BYTES_MAX: usize = 1 << 20;

/// What every handler shares. Cheap to clone.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

pub struct Shared {
    pub node_id: u64,
    pub raft: Raft,
    pub machine: MachineHandle,
    pub proposer: Proposer,
    pub clock: Arc<NodeClock>,
    pub forwarder: reqwest::Client,
    /// A follower's relay of writes to the leader (relay.rs).
    pub relay: Relay,
    pub metrics: Metrics,
    pub clock_control: bool,
    /// The event streams open on this node (`--event-streams-max`, and per token
    /// `--event-streams-per-token-max`).
    pub event_streams: Arc<events::StreamSlots>,
    /// The election timeout (`--election-timeout-ms`): a forward to a leader that stops
    /// answering gives up on it after twice this.
    pub election_timeout: Duration,
    /// When this node last heard from its leader (the peer router keeps it).
    pub leader_contact: LeaderContact,
    /// `--auth`: requests need a token (see `auth.rs`).
    pub auth: bool,
    /// `https` with --tls-cert: how a follower reaches the leader's client API.
    pub api_scheme: &'static str,
    /// The highest cluster time this node has put in an answer, so an answer it makes up
    /// itself never shows an earlier one.
    pub cluster_time_shown: AtomicU64,
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

    /// The longest any request waits for a leader: twice the election timeout (by then a
    /// paused or cut-off leader has been replaced) plus a second to reach the new one.
    pub fn leader_wait(&self) -> Duration {
        self.election_timeout * 2 + Duration::from_secs(1)
    }

    /// Runs `check` on the limits of the applied state (validating input at the edge), under
    /// the read lock and without copying them. A poisoned lock means an apply panicked: the
    /// node is stopping, and nothing here may guess at limits.
    pub fn with_limits<T>(&self, check: impl FnOnce(&Limits) -> T) -> T {
        self.machine
            .read(|machine, _| check(machine.limits()))
            .expect("the applied state is readable: an apply panicked and the node is stopping")
    }

    /// A list's page size: `requested`, or the largest allowed when absent.
    pub fn page_limit(&self, requested: Option<u32>) -> Result<usize, ApiError> {
        let page_max = self.with_limits(|limits| limits.list_page_max);
        let limit = requested.map_or(page_max, |limit| limit as usize);
        if limit == 0 || limit > page_max {
            return Err(ApiError::invalid(format!("limit must be 1..={page_max}")));
        }
        Ok(limit)
    }

    /// Who an acquire or a claim is for: the named session, or a new one drawn here.
    pub fn owner(&self, owner: Result<baton_api::Owner<'_>, String>) -> Result<Owner, ApiError> {
        match owner.map_err(ApiError::invalid)? {
            baton_api::Owner::Session(id) => Ok(Owner::Session(
                SessionId::parse(id.as_str()).map_err(ApiError::from_invalid)?,
            )),
            baton_api::Owner::NewSession { holder, ttl_ms } => Ok(Owner::NewSession(NewSession {
                session_id: self.new_session_id(),
                holder: holder.to_owned(),
                ttl_ms,
                labels: Default::default(),
            })),
        }
    }

    /// The leader this node is in touch with: itself while a quorum acknowledged it within
    /// twice the election timeout, or the leader whose appends it accepted within that time.
    /// With pre-vote, a node cut off from the others goes on naming its last leader; contact,
    /// not the name, says whether it still has one.
    pub fn leader(&self) -> Option<u64> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow_watched();
        let leader = metrics.current_leader?;
        let recent = self.election_timeout * 2;
        let in_touch = if leader == self.node_id {
            // A lone voter is its own quorum (openraft reports no acknowledgement then).
            let alone = metrics
                .membership_config
                .membership()
                .voter_ids()
                .all(|voter| voter == self.node_id);
            metrics.state.is_leader()
                && (alone
                    || metrics
                        .last_quorum_acked
                        .as_ref()
                        .is_some_and(|acked| acked.elapsed() < recent))
        } else {
            self.leader_contact.within(recent)
        };
        in_touch.then_some(leader)
    }

    fn is_leader(&self) -> bool {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow_watched();
        metrics.state.is_leader() && metrics.current_leader == Some(self.node_id)
    }

    /// A fresh session id: 128 random bits, chosen here on the leader and carried in the log.
    pub fn new_session_id(&self) -> SessionId {
        SessionId(rand::random())
    }

    pub fn clocks(&self, cluster_ms: u64) -> Clocks {
        Clocks {
            wall_ms: self.clock.wall_ms(),
            cluster_ms,
        }
    }

    /// Runs `query` on the applied state after a read index: linearizable (G1). On the leader
    /// only (followers forward reads); `read_here` is the same on any node.
    pub async fn read<T>(
        &self,
        query: impl FnOnce(&Machine) -> T,
    ) -> Result<(T, Clocks), ApiError> {
        self.read_index_here().await?;
        self.query(query)
    }

    /// On the leader: confirms leadership and waits until the applied state holds every write
    /// acknowledged before the call; the read index, the log index a linearizable read must see
    /// applied.
    async fn read_index_here(&self) -> Result<u64, ApiError> {
        // A leader restored after a restart may not yet know which of its entries are
        // committed: it answers reads only once it has applied its whole takeover log.
        let term = self.raft.metrics().borrow_watched().current_term;
        if !self
            .proposer
            .wait_leader_ready(term, self.leader_wait())
            .await
        {
            return Err(ApiError::no_leader(None));
        }
        // ReadIndex: leadership confirmed by a quorum after the read arrived. Lease reads would
        // skip that round trip, but are safe only if no pause outlasts the lease, and Baton's
        // fault model has pauses (a SIGSTOP, a GC) of any length (docs/guarantees.md, G1).
        let read_index = self.raft.ensure_linearizable(ReadPolicy::ReadIndex);
        match tokio::time::timeout(self.leader_wait(), read_index).await {
            Ok(Ok(read_log_id)) => Ok(read_log_id.index()),
            Ok(Err(error)) => {
                tracing::debug!(%error, "read index refused");
                Err(ApiError::no_leader(
                    self.leader().filter(|id| *id != self.node_id),
                ))
            }
            Err(_) => Err(ApiError::no_leader(None)),
        }
    }

    /// `query` on this node's applied state as it is now, at its cluster time.
    fn query<T>(&self, query: impl FnOnce(&Machine) -> T) -> Result<(T, Clocks), ApiError> {
        let (value, cluster_ms) = self
            .machine
            .read(|machine, _| (query(machine), machine.time_ms()))
            .map_err(ApiError::internal)?;
        Ok((value, self.clocks(cluster_ms)))
    }

    /// A machine refusal as an API error, with the denial's lease in wire form.
    pub fn refusal(&self, rejection: Rejection, clocks: Clocks) -> ApiError {
        let held_by = match &rejection {
            Rejection::LeaseHeld {
                held_by,
                holders,
                holders_total,
                ..
            } => Some(convert::held_by(held_by, holders, *holders_total, clocks)),
            _ => None,
        };
        ApiError::rejected(rejection, held_by, Some(clocks.cluster_ms))
    }
}

impl<T> service::Committed<T> {
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
