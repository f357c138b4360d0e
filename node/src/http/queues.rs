//! Work-queue routes: enqueue, claim-next, complete, fail, release, counts and the task list.
//! Task ids not given by the client are drawn here, on the leader, and carried in the log.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use baton_api::{
    ClaimRequest, CompleteRequest, EnqueueRequest, FailRequest, ListTasksQuery, PageQuery,
    QueueCounts, QueueInfo, QueueList, TaskList, TaskReleaseRequest,
};
use baton_raft_store::machine::TaskCounts;
use baton_raft_store::machine::{Compensation, Name, SessionId, TaskFence, TaskSpec};

use openraft::async_runtime::WatchReceiver;
use tokio::time::Instant;

use super::convert;
use super::error::ApiError;
use super::extract::{read_name, write_name, ApiJson, ApiPath, ApiQuery, Ns, Write};
use super::{ApiAnswer, AppState};
use crate::service::TaskEnd;

fn task_claim(session_id: &baton_api::SessionId, fence: u64) -> Result<TaskFence, ApiError> {
    let session_id = SessionId::parse(session_id.as_str()).map_err(ApiError::from_invalid)?;
    Ok(TaskFence { session_id, fence })
}

/// A JSON value as the text the machine stores.
pub(super) fn json_text(value: &serde_json::Value) -> Result<String, ApiError> {
    serde_json::to_string(value).map_err(ApiError::internal)
}

/// Attempts of a task that does not say.
const DEFAULT_MAX_ATTEMPTS: u32 = 3;

/// A new task from its wire form (an enqueue's body or a transaction's `add_task`); the id is
/// generated when absent. Shapes are checked here, bounds by admission.
pub(super) fn task_spec(request: &EnqueueRequest) -> Result<TaskSpec, ApiError> {
    let task_id = match &request.id {
        Some(id) => write_name("task id", id)?,
        None => write_name("task id", &format!("{:032x}", rand::random::<u128>()))?,
    };
    let depends_on = request
        .depends_on
        .iter()
        .map(|id| write_name("dependency", id))
        .collect::<Result<Vec<_>, _>>()?;
    let on_dead = match &request.on_dead {
        Some(on_dead) => Some(Compensation {
            queue: write_name("on_dead queue", &on_dead.queue)?,
            payload: json_text(&on_dead.payload)?,
            max_attempts: on_dead.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS),
        }),
        None => None,
    };
    Ok(TaskSpec {
        task_id,
        payload: json_text(&request.payload)?,
        priority: request.priority,
        depends_on,
        max_attempts: request.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS),
        delay_ms: request.not_before_ms.unwrap_or(0),
        on_dead,
    })
}

#[utoipa::path(
    post,
    path = "/v1/queues/{queue}/tasks",
    tag = "queues",
    summary = "Add a task",
    params(
        ("queue" = String, Path, description = "The queue")
    ),
    request_body = baton_api::EnqueueRequest,
    responses(
        (status = 201, description = "The task", body = baton_api::Task)
    )
)]
pub async fn enqueue(
    State(app): State<AppState>,
    write: Write,
    ApiPath(queue_text): ApiPath<String>,
    body: ApiJson<EnqueueRequest>,
) -> Result<ApiAnswer, ApiError> {
    let queue = write_name("queue", &queue_text)?;
    let task = task_spec(&body.value)?;
    let size_bytes = body.canonical.len() + 256;
    let mutation = write.mutation(&app, &[&queue_text], &body.canonical, size_bytes);
    let enqueued = app.enqueue(mutation, queue, task).await?;
    Ok(enqueued.answer(StatusCode::CREATED, &convert::task(&enqueued.value)))
}

#[utoipa::path(
    post,
    path = "/v1/queues/{queue}/claim",
    tag = "queues",
    summary = "Claim the best ready task",
    params(
        ("queue" = String, Path, description = "The queue")
    ),
    request_body = baton_api::ClaimRequest,
    responses(
        (status = 200, description = "Claimed, with its fence", body = baton_api::ClaimResponse),
        (status = 204, description = "No task is ready; nothing changed")
    )
)]
pub async fn claim(
    State(app): State<AppState>,
    write: Write,
    ApiPath(queue_text): ApiPath<String>,
    body: ApiJson<ClaimRequest>,
) -> Result<Response, ApiError> {
    let queue = write_name("queue", &queue_text)?;
    let owner = app.owner(body.value.owner())?;
    let deadline = match body.value.wait_ms {
        Some(wait_ms) => Some(Instant::now() + super::leases::wait_duration(wait_ms)?),
        None => None,
    };
    let namespace = write.namespace.clone();
    let mutation = write.mutation(&app, &[&queue_text], &body.canonical, 256);
    // An empty queue changes nothing (never recorded), so claiming again is safe; with
    // `wait_ms` the claim is made again whenever this node's applied state shows a ready task.
    // It looks again when an applied entry had an event on the queue (`watch_queue`), and, while
    // the queue holds tasks back (a delay or a dependency, which end without an event of the
    // queue's), after every applied entry.
    let watching = app.machine.watch_queue(&namespace, &queue);
    let mut applied = app.raft.metrics();
    let claimed = loop {
        // Before the claim and each read, so a change applied in between is not missed.
        let mut changed = Box::pin(watching.changed());
        applied.borrow_and_update();
        let claimed = app
            .claim(mutation.clone(), queue.clone(), owner.clone())
            .await?;
        let Some(deadline) = deadline.filter(|_| claimed.value.is_none()) else {
            break claimed;
        };
        let ready = loop {
            let counts = app
                .machine
                .read(|machine, _| machine.queue_counts(&namespace, &queue))
                .map_err(ApiError::internal)?;
            if counts.ready > 0 || Instant::now() >= deadline {
                break counts.ready > 0;
            }
            let held_back = counts.waiting > 0;
            let woken = tokio::time::timeout_at(deadline, async {
                tokio::select! {
                    () = &mut changed => true,
                    result = applied.changed(), if held_back => result.is_ok(),
                }
            })
            .await;
            if !matches!(woken, Ok(true)) {
                break false;
            }
            changed = Box::pin(watching.changed());
            applied.borrow_and_update();
        };
        if !ready {
            break claimed;
        }
    };
    match &claimed.value {
        Some(task) => Ok(claimed
            .answer(StatusCode::OK, &convert::claimed(task, claimed.clocks))
            .into_response()),
        None => {
            let mut response = StatusCode::NO_CONTENT.into_response();
            response.headers_mut().insert(
                baton_api::HEADER_CLUSTER_TIME,
                axum::http::HeaderValue::from(claimed.cluster_time_ms),
            );
            Ok(response)
        }
    }
}

/// The task routes share one shape: the queue and task from the path, the claim that proves
/// the caller holds the task, then propose `end` and answer with the task.
async fn end_task<T>(
    app: &AppState,
    write: Write,
    (queue_text, id_text): (String, String),
    body: &ApiJson<T>,
    (session_id, fence): (&baton_api::SessionId, u64),
    end: TaskEnd,
    size_bytes: usize,
) -> Result<ApiAnswer, ApiError> {
    let queue = write_name("queue", &queue_text)?;
    let task_id = write_name("task id", &id_text)?;
    let claim = task_claim(session_id, fence)?;
    let mutation = write.mutation(app, &[&queue_text, &id_text], &body.canonical, size_bytes);
    let ended = app.end_task(mutation, queue, task_id, claim, end).await?;
    Ok(ended.answer(StatusCode::OK, &convert::task(&ended.value)))
}

#[utoipa::path(
    post,
    path = "/v1/queues/{queue}/tasks/{id}/complete",
    tag = "queues",
    summary = "Complete a claimed task",
    params(
        ("queue" = String, Path, description = "The queue"),
        ("id" = String, Path, description = "The task id")
    ),
    request_body = baton_api::CompleteRequest,
    responses(
        (status = 200, description = "The task", body = baton_api::Task)
    )
)]
pub async fn complete(
    State(app): State<AppState>,
    write: Write,
    ApiPath(task): ApiPath<(String, String)>,
    body: ApiJson<CompleteRequest>,
) -> Result<ApiAnswer, ApiError> {
    let request = &body.value;
    let result = request.result.as_ref().map(json_text).transpose()?;
    let size_bytes = result.as_ref().map_or(0, String::len) + 256;
    let end = TaskEnd::Complete { result };
    let claim = (&request.session_id, request.fence);
    end_task(&app, write, task, &body, claim, end, size_bytes).await
}

#[utoipa::path(
    post,
    path = "/v1/queues/{queue}/tasks/{id}/fail",
    tag = "queues",
    summary = "Fail this attempt of a claimed task",
    params(
        ("queue" = String, Path, description = "The queue"),
        ("id" = String, Path, description = "The task id")
    ),
    request_body = baton_api::FailRequest,
    responses(
        (status = 200, description = "The task", body = baton_api::Task)
    )
)]
pub async fn fail(
    State(app): State<AppState>,
    write: Write,
    ApiPath(task): ApiPath<(String, String)>,
    body: ApiJson<FailRequest>,
) -> Result<ApiAnswer, ApiError> {
    let request = &body.value;
    let end = TaskEnd::Fail {
        reason: request.reason.clone(),
        retry: request.retry,
    };
    let size_bytes = request.reason.len() + 256;
    let claim = (&request.session_id, request.fence);
    end_task(&app, write, task, &body, claim, end, size_bytes).await
}

#[utoipa::path(
    post,
    path = "/v1/queues/{queue}/tasks/{id}/release",
    operation_id = "release_task",
    tag = "queues",
    summary = "Give a claimed task back without counting an attempt",
    params(
        ("queue" = String, Path, description = "The queue"),
        ("id" = String, Path, description = "The task id")
    ),
    request_body = baton_api::TaskReleaseRequest,
    responses(
        (status = 200, description = "The task", body = baton_api::Task)
    )
)]
pub async fn release(
    State(app): State<AppState>,
    write: Write,
    ApiPath(task): ApiPath<(String, String)>,
    body: ApiJson<TaskReleaseRequest>,
) -> Result<ApiAnswer, ApiError> {
    let request = &body.value;
    let end = TaskEnd::Release {
        note: request.note.clone(),
    };
    let size_bytes = request.note.as_ref().map_or(0, String::len) + 256;
    let claim = (&request.session_id, request.fence);
    end_task(&app, write, task, &body, claim, end, size_bytes).await
}

#[utoipa::path(
    get,
    path = "/v1/queues/{queue}",
    tag = "queues",
    summary = "A queue's task counts by state",
    params(
        ("queue" = String, Path, description = "The queue")
    ),
    responses(
        (status = 200, description = "The counts", body = baton_api::QueueInfo)
    )
)]
pub async fn counts(
    State(app): State<AppState>,
    Ns(namespace): Ns,
    ApiPath(queue_text): ApiPath<String>,
) -> Result<ApiAnswer, ApiError> {
    let queue = read_name(&app, "queue", &queue_text)?;
    let (counts, clocks) = app
        .read(|machine| machine.queue_counts(&namespace, &queue))
        .await?;
    Ok(ApiAnswer::new(
        StatusCode::OK,
        &queue_info(&queue, &counts),
        clocks.cluster_ms,
    ))
}

fn queue_info(queue: &Name, counts: &TaskCounts) -> QueueInfo {
    QueueInfo {
        queue: queue.to_string(),
        counts: QueueCounts {
            ready: counts.ready,
            waiting: counts.waiting,
            claimed: counts.claimed,
            done: counts.done,
            dead: counts.dead,
        },
    }
}

#[utoipa::path(
    get,
    path = "/v1/queues",
    tag = "queues",
    summary = "The namespace's queues, each with its task counts",
    params(
        baton_api::PageQuery
    ),
    responses(
        (status = 200, description = "A page of queues in name order", body = baton_api::QueueList)
    )
)]
pub async fn list_queues(
    State(app): State<AppState>,
    Ns(namespace): Ns,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> Result<ApiAnswer, ApiError> {
    let limit = app.page_limit(query.limit)?;
    let (page, clocks) = app
        .read(|machine| machine.queues(&namespace, query.cursor.as_deref(), limit))
        .await?;
    let list = QueueList {
        queues: page
            .items
            .iter()
            .map(|(queue, counts)| queue_info(queue, counts))
            .collect(),
        next_cursor: page.next_cursor,
    };
    Ok(ApiAnswer::new(StatusCode::OK, &list, clocks.cluster_ms))
}

#[utoipa::path(
    get,
    path = "/v1/queues/{queue}/tasks",
    tag = "queues",
    summary = "A page of a queue's tasks",
    params(
        ("queue" = String, Path, description = "The queue"),
        baton_api::ListTasksQuery
    ),
    responses(
        (status = 200, description = "A page of tasks", body = baton_api::TaskList)
    )
)]
pub async fn list(
    State(app): State<AppState>,
    Ns(namespace): Ns,
    ApiPath(queue_text): ApiPath<String>,
    ApiQuery(query): ApiQuery<ListTasksQuery>,
) -> Result<ApiAnswer, ApiError> {
    let queue = read_name(&app, "queue", &queue_text)?;
    let limit = app.page_limit(query.limit)?;
    let state = query.state.map(convert::task_state_from_wire);
    let (page, clocks) = app
        .read(|machine| machine.tasks(&namespace, &queue, state, query.cursor.as_deref(), limit))
        .await?;
    let list = TaskList {
        tasks: page.items.iter().map(convert::task).collect(),
        next_cursor: page.next_cursor,
    };
    Ok(ApiAnswer::new(StatusCode::OK, &list, clocks.cluster_ms))
}
