//! `POST /v1/txn`: a transaction (the outbox) — compares, then the `success` or the `failure`
//! ops, applied in one log entry, all or nothing (the machine's txn.rs).

use axum::extract::State;
use axum::http::StatusCode;
use baton_api::{CompareKind, TxnOpResult, TxnRequest, TxnResponse};
use baton_raft_store::machine::{Compare, SessionId, Txn, TxnOp};

use super::convert;
use super::error::ApiError;
use super::extract::{write_name, write_path, ApiJson, Write};
use super::queues::{json_text, task_spec};
use super::{ApiAnswer, AppState};
use crate::service::TxnResult;

fn compare(compare: &baton_api::TxnCompare) -> Result<Compare, ApiError> {
    Ok(match compare.kind().map_err(ApiError::invalid)? {
        CompareKind::Fence(fence) => Compare::Fence {
            resource: write_path(&fence.resource)?,
            fence: fence.token,
        },
        CompareKind::KvRevision { key, revision } => Compare::KvRevision {
            key: write_path(key)?,
            revision,
        },
    })
}

fn op(op: &baton_api::TxnOp) -> Result<TxnOp, ApiError> {
    Ok(match op {
        baton_api::TxnOp::Put { key, value } => TxnOp::Put {
            key: write_path(key)?,
            value: json_text(value)?,
        },
        baton_api::TxnOp::Delete { key } => TxnOp::Delete {
            key: write_path(key)?,
        },
        baton_api::TxnOp::Release { resource } => TxnOp::Release {
            resource: write_path(resource)?,
        },
        baton_api::TxnOp::AddTask { queue, task } => TxnOp::AddTask {
            queue: write_name("queue", queue)?,
            task: task_spec(task)?,
        },
        baton_api::TxnOp::CompleteTask {
            queue,
            id,
            fence,
            result,
        } => TxnOp::CompleteTask {
            queue: write_name("queue", queue)?,
            task_id: write_name("task id", id)?,
            fence: *fence,
            result: result.as_ref().map(json_text).transpose()?,
        },
        baton_api::TxnOp::FailTask {
            queue,
            id,
            fence,
            reason,
            retry,
        } => TxnOp::FailTask {
            queue: write_name("queue", queue)?,
            task_id: write_name("task id", id)?,
            fence: *fence,
            reason: reason.clone(),
            retry: *retry,
        },
    })
}

#[utoipa::path(
    post,
    path = "/v1/txn",
    tag = "txn",
    summary = "Compare, then apply a list of ops atomically",
    description = "If every compare holds, the `success` ops run, else the `failure` ops. An op \
                   that would be refused refuses the whole transaction with its code and \
                   changes nothing. At most `txn_ops_max` (64) compares and as many ops; an op \
                   may name a key, a resource or a task only once.",
    request_body = baton_api::TxnRequest,
    responses(
        (status = 200, description = "Applied: whether the compares held, one result per op run", body = baton_api::TxnResponse)
    )
)]
pub async fn txn(
    State(app): State<AppState>,
    write: Write,
    body: ApiJson<TxnRequest>,
) -> Result<ApiAnswer, ApiError> {
    let request = &body.value;
    let session_id = request
        .session_id
        .as_ref()
        .map(|id| SessionId::parse(id.as_str()).map_err(ApiError::from_invalid))
        .transpose()?;
    let txn = Txn {
        session_id,
        compare: request
            .compare
            .iter()
            .map(compare)
            .collect::<Result<_, _>>()?,
        success: request.success.iter().map(op).collect::<Result<_, _>>()?,
        failure: request.failure.iter().map(op).collect::<Result<_, _>>()?,
    };
    let mutation = write.mutation(&app, &[], &body.canonical, body.canonical.len() + 256);
    let done = app.txn(mutation, txn).await?;
    let results = done
        .value
        .results
        .iter()
        .map(|result| match result {
            TxnResult::Put { revision } => TxnOpResult::Put {
                revision: *revision,
            },
            TxnResult::Delete { revision } => TxnOpResult::Delete {
                revision: *revision,
            },
            TxnResult::Release { resource, fence } => TxnOpResult::Release {
                released: resource.to_string(),
                fence: *fence,
            },
            TxnResult::AddTask(task) => TxnOpResult::AddTask {
                task: convert::task(task),
            },
            TxnResult::CompleteTask(task) => TxnOpResult::CompleteTask {
                task: convert::task(task),
            },
            TxnResult::FailTask(task) => TxnOpResult::FailTask {
                task: convert::task(task),
            },
        })
        .collect();
    Ok(done.answer(
        StatusCode::OK,
        &TxnResponse {
            succeeded: done.value.succeeded,
            results,
        },
    ))
}
