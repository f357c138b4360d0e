//! The event stream: `GET /v1/events?after=REV&limit=N` answers the changes after a revision
//! in the request's namespace; with `Accept: text/event-stream` it keeps streaming them as they
//! are applied. A revision older than the kept window is refused (`NOT_FOUND`, re-list), never
//! silently skipped.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use baton_api::{ErrorCode, EventsPage, EventsQuery};
use baton_raft_store::machine::{Event, Namespace};
use baton_raft_store::store::Watching;

use super::convert;
use super::error::ApiError;
use super::extract::{ApiQuery, Ns};
use super::{ApiAnswer, AppState};

/// Events read from the machine per step of a stream.
const STREAM_STEP_MAX: usize = 256;

fn too_old(after: u64, revision: u64) -> ApiError {
    ApiError::not_found(format!(
        "revision {after} is older than the oldest event kept: re-list what you follow and resume from revision {revision}"
    ))
}

#[utoipa::path(
    get,
    path = "/v1/events",
    tag = "events",
    summary = "The changes after a revision: a page, or a server-sent event stream",
    params(
        ("Baton-Namespace" = Option<String>, Header, description = "The namespace; `default` when absent"),
        baton_api::EventsQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "Resume a stream after this revision; wins over `after`"),
        ("Accept" = Option<String>, Header, description = "`text/event-stream` for a stream")
    ),
    responses(
        (status = 200, description = "A page of events (JSON), or a stream of them", body = baton_api::EventsPage),
        (status = "4XX", description = "Refused, nothing changed: see the problem's code", body = baton_api::Problem, content_type = "application/problem+json"),
        (status = "5XX", description = "NO_LEADER (surely not applied), OUTCOME_UNKNOWN (maybe applied) or INTERNAL", body = baton_api::Problem, content_type = "application/problem+json")
    )
)]
pub async fn events(
    State(app): State<AppState>,
    Ns(namespace): Ns,
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
    let ((page, revision), clocks) = app
        .read(|machine| {
            let after =
                requested.unwrap_or_else(|| machine.oldest_event_revision().saturating_sub(1));
            (
                machine
                    .events_after(after, limit)
                    .map(|events| (after, events)),
                machine.revision(),
            )
        })
        .await?;
    if let Some(requested) = requested.filter(|requested| *requested > revision) {
        return Err(ApiError::invalid(format!(
            "revision {requested} is beyond the latest, {revision}: resume from a revision you were given"
        )));
    }
    let Some((after, events)) = page else {
        return Err(too_old(requested.unwrap_or_default(), revision));
    };
    let streaming = headers
        .get(header::ACCEPT)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|accept| accept.contains("text/event-stream"));
    if streaming {
        let permit = app.event_streams.clone().try_acquire_owned().map_err(|_| {
            ApiError::new(
                ErrorCode::ResourceExhausted,
                "too many event streams are open on this node: retry after Retry-After, or page with ?after=",
            )
        })?;
        return Ok(stream(app, namespace, after, permit).into_response());
    }
    let next = events.last().map_or(after, |event| event.revision);
    let page = EventsPage {
        events: events
            .iter()
            .filter(|event| event.namespace == namespace)
            .map(convert::event)
            .collect(),
        next,
    };
    Ok(ApiAnswer::new(StatusCode::OK, &page, clocks.cluster_ms).into_response())
}

struct Follow {
    app: AppState,
    namespace: Namespace,
    after: u64,
    ready: VecDeque<Event>,
    /// Held while the stream is open: one of `--event-streams-max`.
    _permit: tokio::sync::OwnedSemaphorePermit,
    /// Woken after every applied entry that recorded an event.
    watching: Watching,
    finished: bool,
}

/// Streams the namespace's events after `after` as they are applied on this node, which is
/// the leader (followers forward). Each SSE event has `id` = its revision, so a client that
/// reconnects with `Last-Event-ID` resumes exactly after the last event it saw.
fn stream(
    app: AppState,
    namespace: Namespace,
    after: u64,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> impl IntoResponse {
    let watching = app.machine.watch_events();
    let follow = Follow {
        app,
        namespace,
        after,
        ready: VecDeque::new(),
        _permit: permit,
        watching,
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
                (
                    machine.events_after(follow.after, STREAM_STEP_MAX),
                    machine.revision(),
                )
            });
            match read {
                Ok((Some(events), _)) if !events.is_empty() => {
                    follow.after = events.last().map_or(follow.after, |event| event.revision);
                    let namespace = follow.namespace.clone();
                    follow.ready.extend(
                        events
                            .into_iter()
                            .filter(|event| event.namespace == namespace),
                    );
                }
                Ok((Some(_), _)) => changed.await,
                Ok((None, revision)) => {
                    drop(changed);
                    follow.finished = true;
                    let problem = too_old(follow.after, revision).problem;
                    let data = serde_json::to_string(&problem).unwrap_or_default();
                    return Some((Ok(SseEvent::default().event("error").data(data)), follow));
                }
                Err(_) => return None,
            }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}
