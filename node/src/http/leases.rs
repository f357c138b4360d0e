//! Session, lease and fence-check routes. Handlers parse the request into machine types, hand
//! writes to the proposer, and read through the linearizable path.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use baton_api::{
    AcquireRequest, CreateSessionRequest, EndSessionResponse, FenceCheckRequest,
    FenceCheckResponse, KeepaliveResponse, LeaseList, ListLeasesQuery, PageQuery, ReleaseRequest,
    ReleaseResponse,
};
use baton_raft_store::machine::{
    Grant, LeaseView, Namespace, NewSession, Rejection, ResourcePath, SessionId,
};
use tokio::time::Instant;

use super::convert;
use super::error::ApiError;
use super::extract::{read_path, write_path, ApiJson, ApiPath, ApiQuery, Ns, Write};
use super::{ApiAnswer, AppState};
use crate::service::{Acquired, LetGo};

/// A request's estimated share of a log entry, for bounding batches.
fn size_of(canonical: &[u8]) -> usize {
    canonical.len() + 64
}

fn parse_session_id(text: &str) -> Result<SessionId, ApiError> {
    SessionId::parse(text).map_err(ApiError::from_invalid)
}

#[utoipa::path(
    post,
    path = "/v1/sessions",
    tag = "sessions",
    summary = "Create a session",
    request_body = baton_api::CreateSessionRequest,
    responses(
        (status = 201, description = "The new session, with its secret id", body = baton_api::CreateSessionResponse)
    )
)]
pub async fn create_session(
    State(app): State<AppState>,
    write: Write,
    body: ApiJson<CreateSessionRequest>,
) -> Result<ApiAnswer, ApiError> {
    let mutation = write.mutation(&app, &[], &body.canonical, size_of(&body.canonical));
    let request = body.value;
    let session = NewSession {
        session_id: app.new_session_id(),
        holder: request.holder,
        ttl_ms: request.ttl_ms,
        labels: request.labels,
    };
    let created = app.create_session(mutation, session).await?;
    Ok(created.answer(
        StatusCode::CREATED,
        &convert::created_session(&created.value, created.clocks),
    ))
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/keepalive",
    tag = "sessions",
    summary = "Renew a session and every lease it holds",
    params(
        ("id" = String, Path, description = "The session id")
    ),
    responses(
        (status = 200, description = "Renewed", body = baton_api::KeepaliveResponse)
    )
)]
pub async fn keepalive(
    State(app): State<AppState>,
    write: Write,
    ApiPath(id): ApiPath<String>,
) -> Result<ApiAnswer, ApiError> {
    let session_id = parse_session_id(&id)?;
    let mutation = write.mutation(&app, &[&id], b"", 64);
    let renewed = app.keepalive(mutation, session_id).await?;
    Ok(renewed.answer(
        StatusCode::OK,
        &KeepaliveResponse {
            session_id: convert::session_id(session_id),
            expires_in_ms: renewed.value,
            expires_at: renewed.clocks.expires_at(renewed.value),
        },
    ))
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/release",
    tag = "sessions",
    summary = "Release one lease of a session, or leave the resource's line",
    params(
        ("id" = String, Path, description = "The session id")
    ),
    request_body = baton_api::ReleaseRequest,
    responses(
        (status = 200, description = "Released", body = baton_api::ReleaseResponse)
    )
)]
pub async fn release(
    State(app): State<AppState>,
    write: Write,
    ApiPath(id): ApiPath<String>,
    body: ApiJson<ReleaseRequest>,
) -> Result<ApiAnswer, ApiError> {
    let session_id = parse_session_id(&id)?;
    let resource = write_path(&body.value.resource)?;
    let mutation = write.mutation(&app, &[&id], &body.canonical, size_of(&body.canonical));
    let let_go = app.release(mutation, session_id, resource).await?;
    let (released, left_line) = match &let_go.value {
        LetGo::Released(resource) => (resource.to_string(), false),
        LetGo::LeftLine(resource) => (resource.to_string(), true),
    };
    Ok(let_go.answer(
        StatusCode::OK,
        &ReleaseResponse {
            released,
            left_line,
        },
    ))
}

#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}",
    tag = "sessions",
    summary = "End a session, releasing everything it holds",
    params(
        ("id" = String, Path, description = "The session id")
    ),
    responses(
        (status = 200, description = "Ended", body = baton_api::EndSessionResponse)
    )
)]
pub async fn end_session(
    State(app): State<AppState>,
    write: Write,
    ApiPath(id): ApiPath<String>,
) -> Result<ApiAnswer, ApiError> {
    let session_id = parse_session_id(&id)?;
    let mutation = write.mutation(&app, &[&id], b"", 64);
    let ended = app.end_session(mutation, session_id).await?;
    Ok(ended.answer(
        StatusCode::OK,
        &EndSessionResponse {
            released: ended.value.iter().map(ToString::to_string).collect(),
        },
    ))
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{id}",
    tag = "sessions",
    summary = "A session and a page of its leases",
    params(
        ("id" = String, Path, description = "The session id"),
        baton_api::PageQuery
    ),
    responses(
        (status = 200, description = "The session", body = baton_api::SessionInfo)
    )
)]
pub async fn get_session(
    State(app): State<AppState>,
    Ns(namespace): Ns,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> Result<ApiAnswer, ApiError> {
    let session_id = parse_session_id(&id)?;
    let limit = app.page_limit(query.limit)?;
    let (session, clocks) = app
        .read(|machine| machine.session(&namespace, session_id, query.cursor.as_deref(), limit))
        .await?;
    let (view, leases) = session
        .ok_or_else(|| ApiError::not_found("no live session with this id: it ended or expired"))?;
    Ok(ApiAnswer::new(
        StatusCode::OK,
        &convert::session_info(&view, &leases, clocks),
        clocks.cluster_ms,
    ))
}

#[utoipa::path(
    post,
    path = "/v1/leases",
    tag = "leases",
    summary = "Acquire a lease in one conditional write",
    request_body = baton_api::AcquireRequest,
    responses(
        (status = 201, description = "Granted, with its fence", body = baton_api::Grant),
        (status = 202, description = "With `wait_ms`: not granted within it; the session waits in the resource's line", body = baton_api::Queued)
    )
)]
pub async fn acquire(
    State(app): State<AppState>,
    write: Write,
    body: ApiJson<AcquireRequest>,
) -> Result<ApiAnswer, ApiError> {
    let request = &body.value;
    let resource = write_path(&request.resource)?;
    let owner = app.owner(request.owner())?;
    let mut labels = request.labels.clone();
    if let Some(reason) = &request.reason {
        labels.insert("reason".to_owned(), reason.clone());
    }
    let mutation = write.mutation(&app, &[], &body.canonical, size_of(&body.canonical));
    let mode = convert::mode_from_wire(request.mode, request.limit).map_err(ApiError::invalid)?;
    let deadline = match request.wait_ms {
        Some(wait_ms) => Some(Instant::now() + wait_duration(wait_ms)?),
        None => None,
    };
    let namespace = mutation.namespace.clone();
    let acquired = app
        .acquire(
            mutation,
            resource,
            mode,
            owner,
            request.max_hold_ms,
            labels,
            deadline.is_some(),
        )
        .await?;
    let queued = match &acquired.value {
        Acquired::Granted(grant) => {
            return Ok(acquired.answer(StatusCode::CREATED, &convert::grant(grant, acquired.clocks)))
        }
        Acquired::Queued(queued) => queued,
    };
    let deadline = deadline.expect("only a waiting acquire is queued");
    let (session_id, resource) = (queued.session_id, queued.resource.clone());
    match wait_in_line(&app, &namespace, &resource, session_id, deadline).await? {
        InLine::Granted(lease, cluster_ms) => {
            let grant = Grant {
                lease,
                session_id,
                session_created: queued.session_created,
            };
            Ok(ApiAnswer::new(
                StatusCode::CREATED,
                &convert::grant(&grant, app.clocks(cluster_ms)),
                cluster_ms,
            ))
        }
        InLine::Waiting(position, cluster_ms) => Ok(ApiAnswer::new(
            StatusCode::ACCEPTED,
            &baton_api::Queued {
                queued: true,
                position,
                resource: resource.to_string(),
                session_id: convert::session_id(session_id),
                session_created: queued.session_created,
            },
            cluster_ms,
        )),
    }
}

/// `wait_ms` within 0..=60,000, as a duration.
pub fn wait_duration(wait_ms: u64) -> Result<Duration, ApiError> {
    if wait_ms > baton_api::WAIT_MS_MAX {
        return Err(ApiError::invalid(format!(
            "wait_ms must be 0..={}, got {wait_ms}",
            baton_api::WAIT_MS_MAX
        )));
    }
    Ok(Duration::from_millis(wait_ms))
}

/// Where a waiting acquire stands after its wait.
enum InLine {
    /// Granted (at this cluster time).
    Granted(LeaseView, u64),
    /// Still waiting, at this place.
    Waiting(u32, u64),
}

/// Follows this node's applied state until `session_id` holds `resource` or `deadline`
/// passes. It reads the state again only when an applied entry changed the path (its grant,
/// its leaving the line and every move of its position are events on the path); a grant seen
/// applied here is committed.
async fn wait_in_line(
    app: &AppState,
    namespace: &Namespace,
    resource: &ResourcePath,
    session_id: SessionId,
    deadline: Instant,
) -> Result<InLine, ApiError> {
    let watching = app.machine.watch(namespace, resource);
    loop {
        // Before the read, so a change applied between the read and the wait is not missed.
        let changed = watching.changed();
        let (lease, position, cluster_ms) = app
            .machine
            .read(|machine, _| {
                (
                    machine.lease_of(namespace, resource, session_id),
                    machine.line_position(namespace, resource, session_id),
                    machine.time_ms(),
                )
            })
            .map_err(ApiError::internal)?;
        let position = match (lease, position) {
            (Some(lease), _) => return Ok(InLine::Granted(lease, cluster_ms)),
            (None, Some(position)) => position,
            (None, None) => {
                let gone = Rejection::LeaseLost(format!(
                    "the session is no longer in the line of {resource}: it ended, expired or left the line"
                ));
                return Err(app.refusal(gone, app.clocks(cluster_ms)));
            }
        };
        if Instant::now() >= deadline {
            return Ok(InLine::Waiting(position, cluster_ms));
        }
        // At the deadline, one last read answers with the place as it stands.
        let _ = tokio::time::timeout_at(deadline, changed).await;
    }
}

#[utoipa::path(
    get,
    path = "/v1/leases/{resource}",
    tag = "leases",
    summary = "The live lease on a path, or the subtree lease covering it",
    params(
        ("resource" = String, Path, description = "The path (its segments joined by /)")
    ),
    responses(
        (status = 200, description = "The lease", body = baton_api::Lease)
    )
)]
pub async fn get_lease(
    State(app): State<AppState>,
    Ns(namespace): Ns,
    ApiPath(resource): ApiPath<String>,
) -> Result<ApiAnswer, ApiError> {
    let resource = read_path(&app, &resource)?;
    let (covering, clocks) = app
        .read(|machine| machine.covering_lease(&namespace, &resource))
        .await?;
    let (lease, covering) = covering.ok_or_else(|| {
        ApiError::not_found(format!(
            "{resource} has no live lease, and no subtree lease covers it"
        ))
    })?;
    let mut answer = convert::lease(&lease, clocks);
    answer.covering = covering;
    Ok(ApiAnswer::new(StatusCode::OK, &answer, clocks.cluster_ms))
}

#[utoipa::path(
    get,
    path = "/v1/leases",
    tag = "leases",
    summary = "Live leases, optionally under a prefix",
    params(
        baton_api::ListLeasesQuery
    ),
    responses(
        (status = 200, description = "A page of leases", body = baton_api::LeaseList)
    )
)]
pub async fn list_leases(
    State(app): State<AppState>,
    Ns(namespace): Ns,
    ApiQuery(query): ApiQuery<ListLeasesQuery>,
) -> Result<ApiAnswer, ApiError> {
    let limit = app.page_limit(query.limit)?;
    let prefix = query.prefix.unwrap_or_default();
    let (page, clocks) = app
        .read(|machine| machine.leases(&namespace, &prefix, query.cursor.as_deref(), limit))
        .await?;
    let list = LeaseList {
        leases: page
            .items
            .iter()
            .map(|lease| convert::lease(lease, clocks))
            .collect(),
        next_cursor: page.next_cursor,
    };
    Ok(ApiAnswer::new(StatusCode::OK, &list, clocks.cluster_ms))
}

#[utoipa::path(
    post,
    path = "/v1/fence/check",
    tag = "leases",
    summary = "Whether a token is the live fence of a resource",
    request_body = baton_api::FenceCheckRequest,
    responses(
        (status = 200, description = "The verdict", body = baton_api::FenceCheckResponse)
    )
)]
pub async fn fence_check(
    State(app): State<AppState>,
    Ns(namespace): Ns,
    body: ApiJson<FenceCheckRequest>,
) -> Result<ApiAnswer, ApiError> {
    let resource = read_path(&app, &body.value.resource)?;
    let fence = body.value.fence;
    let (status, clocks) = app
        .read(|machine| machine.fence_status(&namespace, &resource, fence))
        .await?;
    let answer = FenceCheckResponse {
        current: status.current,
        fence: status.live_fence,
    };
    Ok(ApiAnswer::new(StatusCode::OK, &answer, clocks.cluster_ms))
}
