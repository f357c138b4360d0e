//! The event stream: `GET /v1/events?after=REV&limit=N` answers the changes after a revision
//! in the request's namespace; with `Accept: text/event-stream` it keeps streaming them as they
//! are applied. A revision older than the kept window is refused (`NOT_FOUND`, re-list), never
//! silently skipped.
//!
//! Every node serves the streams that arrive at it from its own applied log, after a read
//! index (`Service::read_here`), so a stream starts where a linearizable read would and one
//! tenant's streams take only the slots of the node they arrive at: at most
//! `--event-streams-max` per node and `--event-streams-per-token-max` per token. A stream ends,
//! with an `error` message, when its token is revoked (it checks after every entry that may
//! have revoked it) or when the node has had no leader for the longest a request waits for one,
//! so that its reader resumes on another node.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use baton_api::{ErrorCode, EventsPage, EventsQuery, Problem};
use baton_raft_store::machine::{Caller, Event, Machine, Name, Namespace, Role};
use baton_raft_store::store::Watching;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::auth::TokenHash;
use super::convert;
use super::error::ApiError;
use super::extract::{ApiQuery, Ns, Token};
use super::{ApiAnswer, AppState};

/// Events read from the machine per step of a stream.
const STREAM_STEP_MAX: usize = 256;
/// How often an idle stream looks at whether its node still has a leader.
const LEADER_CHECK_INTERVAL: Duration = Duration::from_millis(500);

fn too_old(after: u64, revision: u64) -> ApiError {
    ApiError::not_found(format!(
        "revision {after} is older than the oldest event kept: re-list what you follow and resume from revision {revision}"
    ))
}

/// Whether a request asks for a stream (`Accept: text/event-stream`) rather than a page.
pub fn wants_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|accept| accept.contains("text/event-stream"))
}

/// The event streams open on this node: at most `--event-streams-max` in all, and with access
/// control at most `--event-streams-per-token-max` per token, so that one tenant cannot take
/// every slot.
#[derive(Debug)]
pub struct StreamSlots {
    node: Arc<Semaphore>,
    per_token_max: usize,
    per_token: Mutex<HashMap<Name, usize>>,
}

/// One open stream's slot, given back when the stream ends.
#[derive(Debug)]
struct StreamSlot {
    slots: Arc<StreamSlots>,
    token: Option<Name>,
    _node: OwnedSemaphorePermit,
}

impl StreamSlots {
    pub fn new(node_max: usize, per_token_max: usize) -> StreamSlots {
        StreamSlots {
            node: Arc::new(Semaphore::new(node_max)),
            per_token_max,
            per_token: Mutex::new(HashMap::new()),
        }
    }

    fn take(self: &Arc<Self>, token: Option<&Name>) -> Result<StreamSlot, ApiError> {
        let node = self.node.clone().try_acquire_owned().map_err(|_| {
            ApiError::new(
                ErrorCode::ResourceExhausted,
                "too many event streams are open on this node: retry after Retry-After, on another node, or page with ?after=",
            )
        })?;
        if let Some(token) = token {
            let mut per_token = self.lock();
            let open = per_token.entry(token.clone()).or_default();
            if *open >= self.per_token_max {
                return Err(ApiError::new(
                    ErrorCode::ResourceExhausted,
                    format!(
                        "token {token} has {} event streams open on this node, its most: close one, or page with ?after=",
                        self.per_token_max
                    ),
                ));
            }
            *open += 1;
        }
        Ok(StreamSlot {
            slots: Arc::clone(self),
            token: token.cloned(),
            _node: node,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Name, usize>> {
        // Counts only: nothing a panicking holder could leave half done.
        self.per_token
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        if let Some(token) = &self.token {
            let mut per_token = self.slots.lock();
            if let Some(open) = per_token.get_mut(token) {
                *open -= 1;
                if *open == 0 {
                    per_token.remove(token);
                }
            }
        }
    }
}

#[utoipa::path(
    get,
    path = "/v1/events",
    tag = "events",
    summary = "The changes after a revision: a page, or a server-sent event stream",
    params(
        baton_api::EventsQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "Resume a stream after this revision; wins over `after`"),
        ("Accept" = Option<String>, Header, description = "`text/event-stream` for a stream")
    ),
    responses(
        (status = 200, description = "A page of events (JSON), or a stream of them", body = baton_api::EventsPage)
    )
)]
pub async fn events(
    State(app): State<AppState>,
    Ns(namespace): Ns,
    Token(token): Token,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> Result<Response, ApiError> {
    let limit = app.page_limit(query.limit)?;
    // A browser's EventSource reconnects with its first URL and the last id it saw, so the
    // header wins over `after`.
    let last_event_id = match headers.get("last-event-id") {
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|text| text.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::invalid(
                        "Last-Event-ID must be the revision (a non-negative integer) of an event you received",
                    )
                })?,
        ),
        None => None,
    };
    let requested = last_event_id.or(query.after);
    let streaming = wants_stream(&headers);
    // Refused before the read index: a full node costs the leader nothing.
    let slot = streaming
        .then(|| {
            app.event_streams
                .take(token.as_ref().map(|(caller, _)| &caller.name))
        })
        .transpose()?;
    let page_of = |machine: &Machine| {
        let after = requested
            .unwrap_or_else(|| machine.oldest_event_revision(&namespace).saturating_sub(1));
        (
            machine
                .events_after(&namespace, after, limit)
                .map(|events| (after, events)),
            machine.revision(&namespace),
        )
    };
    // A page is answered by the leader (followers forward it); a stream by this node.
    let ((page, revision), clocks) = match streaming {
        true => app.read_here(page_of).await?,
        false => app.read(page_of).await?,
    };
    if let Some(requested) = requested.filter(|requested| *requested > revision) {
        return Err(ApiError::invalid(format!(
            "revision {requested} is beyond the latest, {revision}: resume from a revision you were given"
        )));
    }
    let Some((after, events)) = page else {
        return Err(too_old(requested.unwrap_or_default(), revision));
    };
    if let Some(slot) = slot {
        let reader = token.map(|(caller, hash)| Reader { caller, hash });
        return Ok(stream(app, namespace, after, slot, reader).into_response());
    }
    let next = events.last().map_or(after, |event| event.revision);
    let page = EventsPage {
        events: events.iter().map(convert::event).collect(),
        next,
    };
    Ok(ApiAnswer::new(StatusCode::OK, &page, clocks.cluster_ms).into_response())
}

/// The token a stream was opened with, checked again as the stream goes on.
#[derive(Debug)]
struct Reader {
    caller: Caller,
    hash: TokenHash,
}

impl Reader {
    /// Why this token may no longer read `namespace`'s events, if it may not.
    fn refused(&self, machine: &Machine, namespace: &Namespace) -> Option<Box<Problem>> {
        let name = &self.caller.name;
        let Some(now) = machine.auth().authenticate(&self.hash.0) else {
            return Some(
                ApiError::new(
                    ErrorCode::Unauthenticated,
                    format!("token {name} was revoked: this stream ends"),
                )
                .problem,
            );
        };
        let allowed = now.role == Role::Admin || now.scope.allows(namespace);
        (!allowed).then(|| {
            ApiError::new(
                ErrorCode::PermissionDenied,
                format!("token {name} may no longer read namespace {namespace}: this stream ends"),
            )
            .problem
        })
    }
}

struct Follow {
    app: AppState,
    namespace: Namespace,
    after: u64,
    ready: VecDeque<Event>,
    _slot: StreamSlot,
    reader: Option<Reader>,
    /// Woken after every applied entry that recorded an event or may have revoked a token.
    watching: Watching,
    /// Since when this node has known no leader, if it knows none.
    leaderless_since: Option<Instant>,
    finished: bool,
}

/// The last message of a stream that ends: an `error` with the problem.
fn ending(problem: &Problem) -> SseEvent {
    let data = serde_json::to_string(problem).unwrap_or_default();
    SseEvent::default().event("error").data(data)
}

/// Streams the namespace's events after `after` as this node applies them. Each SSE event has
/// `id` = its revision, so a client that reconnects with `Last-Event-ID` (to any node) resumes
/// exactly after the last event it saw.
fn stream(
    app: AppState,
    namespace: Namespace,
    after: u64,
    slot: StreamSlot,
    reader: Option<Reader>,
) -> impl IntoResponse {
    let watching = app.machine.watch_events();
    let follow = Follow {
        app,
        namespace,
        after,
        ready: VecDeque::new(),
        _slot: slot,
        reader,
        watching,
        leaderless_since: None,
        finished: false,
    };
    let events = futures_util::stream::unfold(follow, |mut follow| async move {
        loop {
            if follow.finished {
                return None;
            }
            if let Some(event) = follow.ready.pop_front() {
                let data = serde_json::to_string(&convert::event(&event)).unwrap_or_default();
                let sse = SseEvent::default()
                    .id(event.revision.to_string())
                    .event("change")
                    .data(data);
                return Some((Ok::<_, Infallible>(sse), follow));
            }
            // Before the read, so an event applied between the read and the wait is not missed.
            let changed = follow.watching.changed();
            let read = follow.app.machine.read(|machine, _| {
                let refused = follow
                    .reader
                    .as_ref()
                    .and_then(|reader| reader.refused(machine, &follow.namespace));
                (
                    refused,
                    machine.events_after(&follow.namespace, follow.after, STREAM_STEP_MAX),
                    machine.revision(&follow.namespace),
                )
            });
            match read {
                Ok((Some(problem), _, _)) => {
                    drop(changed);
                    follow.finished = true;
                    return Some((Ok(ending(&problem)), follow));
                }
                Ok((None, Some(events), _)) if !events.is_empty() => {
                    follow.after = events.last().map_or(follow.after, |event| event.revision);
                    follow.ready.extend(events);
                }
                Ok((None, Some(_), _)) => {
                    if tokio::time::timeout(LEADER_CHECK_INTERVAL, changed)
                        .await
                        .is_err()
                    {
                        if let Some(problem) = follow.leaderless() {
                            follow.finished = true;
                            return Some((Ok(ending(&problem)), follow));
                        }
                    }
                }
                Ok((None, None, revision)) => {
                    drop(changed);
                    follow.finished = true;
                    let problem = too_old(follow.after, revision).problem;
                    return Some((Ok(ending(&problem)), follow));
                }
                Err(_) => return None,
            }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}

impl Follow {
    /// `NO_LEADER` once this node has known no leader for as long as a request waits for one:
    /// it is cut off, and what it streams would fall behind without end.
    fn leaderless(&mut self) -> Option<Box<Problem>> {
        if self.app.leader().is_some() {
            self.leaderless_since = None;
            return None;
        }
        let since = *self.leaderless_since.get_or_insert_with(Instant::now);
        (since.elapsed() >= self.app.leader_wait()).then(|| {
            ApiError::new(
                ErrorCode::NoLeader,
                "this node has had no leader for too long: resume with Last-Event-ID on another node",
            )
            .problem
        })
    }
}
