//! `/v1/queues`: tasks, claims and counts.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use crate::common::{default_true, is_zero, owner_from_fields};
use crate::{Owner, SessionId};

/// A task's state: `ready`, `waiting`, `claimed`, `done` or `dead`. Also the `state=` list filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    /// Claim-next could take it now (a lapsed claim counts as ready at once).
    Ready,
    /// Unclaimed, but held back by a dependency that is not done or by `not_before_ms`.
    Waiting,
    /// Claimed by a live lease.
    Claimed,
    /// Completed.
    Done,
    /// Its last attempt lapsed or failed, or it failed with `retry: false`.
    Dead,
}

/// `POST /v1/queues/{queue}/tasks` body: `{id?, payload, priority?, depends_on?, max_attempts?,
/// not_before_ms?, on_dead?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnqueueRequest {
    /// The task id, unique within its queue; generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The task's JSON payload.
    pub payload: Value,
    /// Higher is claimed first, then FIFO. Default 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: i32,
    /// Ids in the same queue that must be done before this task is ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// Attempts before the task is dead; the server's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// A delay: the task may be claimed only this many milliseconds (of cluster time) after it
    /// was enqueued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before_ms: Option<u64>,
    /// A compensating task, enqueued in the same write that makes this one dead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_dead: Option<OnDead>,
}

/// `on_dead` of a task: `{queue, payload, max_attempts?}`, the task enqueued (with the id
/// `on-dead-R`, R the revision of the death) when the task goes dead: a saga step's undo.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OnDead {
    /// The queue of the compensating task (any queue of the namespace, perhaps this one).
    pub queue: String,
    /// Its JSON payload.
    pub payload: Value,
    /// Its attempts; the server's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
}

/// The task object (enqueue answer (201), claim answer, complete/fail/release answers, lists).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Task {
    /// Unique within its queue.
    pub id: String,
    /// The queue's name.
    pub queue: String,
    /// The JSON payload given at enqueue.
    pub payload: Value,
    /// Higher is claimed first.
    #[serde(default)]
    pub priority: i32,
    /// Ids that must be done before this task is ready.
    #[serde(default)]
    pub depends_on: Vec<String>,
    /// Current state.
    pub state: TaskState,
    /// Attempts so far (0 before the first claim; a release does not count one).
    pub attempt: u32,
    /// Attempts allowed before the task is dead.
    pub max_attempts: u32,
    /// Cluster time (ms, as in `Baton-Cluster-Time`) from which the task may be claimed: its
    /// enqueue time plus its `not_before_ms` delay.
    pub ready_at_ms: u64,
    /// How many of `depends_on` are not done yet.
    #[serde(default)]
    pub waiting_on: u32,
    /// The note left by the last release, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The result given on completion, when done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The reason given by the last failure, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The fence of the live claim, when claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    /// The holder of the live claim, when claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// The revision of the enqueue, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enqueued_revision: Option<u64>,
    /// The task enqueued when this one goes dead, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_dead: Option<OnDead>,
}

/// `POST /v1/queues/{queue}/claim` body: `{session_id}` or `{holder, ttl_ms}` (checked by
/// `ClaimRequest::owner`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// An existing session to hold the claim; excludes `holder` and `ttl_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
    /// Holder of a session created with the claim; needs `ttl_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// TTL of a session created with the claim; needs `holder`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// When no task is ready, wait up to this long (0..=60,000 ms) for one before answering
    /// 204.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

impl ClaimRequest {
    /// Same rule as [`AcquireRequest::owner`](crate::AcquireRequest::owner).
    pub fn owner(&self) -> Result<Owner<'_>, String> {
        owner_from_fields(
            self.session_id.as_ref(),
            self.holder.as_deref(),
            self.ttl_ms,
        )
    }
}

/// `POST /v1/queues/{queue}/claim` answer (200; an empty queue is 204 with no body):
/// `{task, fence, attempt, session_id, expires_in_ms, expires_at}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClaimResponse {
    /// The claimed task.
    pub task: Task,
    /// The claim's fence, needed to complete, fail or release it.
    pub fence: u64,
    /// This attempt's number, from 1.
    pub attempt: u32,
    /// The session holding the claim (given, or created by this claim).
    pub session_id: SessionId,
    /// Deadline minus the cluster time the claim was applied at (docs/guarantees.md G7).
    pub expires_in_ms: u64,
    /// Informational RFC 3339 UTC deadline.
    pub expires_at: String,
}

/// `POST /v1/queues/{queue}/tasks/{id}/complete` body: `{session_id, fence, result?}`.
/// Answer: the [`Task`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteRequest {
    /// The session holding the claim.
    pub session_id: SessionId,
    /// The claim's fence.
    pub fence: u64,
    /// A JSON result kept on the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

/// `POST /v1/queues/{queue}/tasks/{id}/fail` body: `{session_id, fence, reason, retry?}`.
/// Answer: the [`Task`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailRequest {
    /// The session holding the claim.
    pub session_id: SessionId,
    /// The claim's fence.
    pub fence: u64,
    /// Why it failed; kept on the task.
    pub reason: String,
    /// `true` (default): ready again while attempts remain; `false`: dead now.
    #[serde(default = "default_true")]
    pub retry: bool,
}

/// `POST /v1/queues/{queue}/tasks/{id}/release` body: `{session_id, fence, note?}`; no
/// attempt is counted. Answer: the [`Task`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskReleaseRequest {
    /// The session holding the claim.
    pub session_id: SessionId,
    /// The claim's fence.
    pub fence: u64,
    /// A note that stays on the task for the next claimer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Task counts by state: `{ready, waiting, claimed, done, dead}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QueueCounts {
    /// Tasks claim-next could take now.
    pub ready: u64,
    /// Unclaimed tasks held back by a dependency or by `not_before_ms`.
    pub waiting: u64,
    /// Tasks under a live claim.
    pub claimed: u64,
    /// Completed tasks.
    pub done: u64,
    /// Dead tasks.
    pub dead: u64,
}

/// `GET /v1/queues/{queue}` answer: `{queue, counts}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QueueInfo {
    /// The queue's name.
    pub queue: String,
    /// Its tasks by state.
    pub counts: QueueCounts,
}

/// `GET /v1/queues?limit=&cursor=` answer: `{queues: [{queue, counts}], next_cursor}`, in
/// name order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QueueList {
    /// The queues of the page, each with its counts.
    pub queues: Vec<QueueInfo>,
    /// Pass as `cursor` for the next page; `null` on the last one.
    pub next_cursor: Option<String>,
}

/// `GET /v1/queues/{queue}/tasks?state=&limit=&cursor=` query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListTasksQuery {
    /// Only tasks in this state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<TaskState>,
    /// Page size; at most the list page limit (default 1,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

/// `GET /v1/queues/{queue}/tasks` answer: `{tasks, next_cursor}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TaskList {
    /// One page of tasks.
    pub tasks: Vec<Task>,
    /// Cursor of the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}
