//! `/v1/events`: the revisioned event stream.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::LeaseMode;

/// `GET /v1/events?after=&limit=` query.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Only events with a revision greater than this; from the start when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<u64>,
    /// Page size; at most the list page limit (default 1,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// `GET /v1/events` answer: `{events, next}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EventsPage {
    /// Events in revision order.
    pub events: Vec<Event>,
    /// The revision to pass as `after` next time.
    pub next: u64,
}

/// One state change: `{revision, namespace, cluster_time_ms, kind: {type, ...}}`. Also the
/// `data` of one SSE message.
///
/// `kind` is nested rather than flattened so its own fields (a kv write's `revision`) never
/// collide with the event's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Event {
    /// The event's revision; strictly increasing.
    pub revision: u64,
    /// The namespace the change happened in.
    pub namespace: String,
    /// The cluster time the change was applied at.
    pub cluster_time_ms: u64,
    /// What changed.
    pub kind: EventKind,
    /// The name of the token whose request made the change, on a cluster with access control;
    /// absent for expiries and without access control.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// What changed, tagged by `type` (`granted`, `released`, `expired`, `kv_written`,
/// `kv_deleted`, `task_enqueued`, `task_claimed`, `task_completed`, `task_failed`,
/// `task_released`, `task_dead`, `task_expired`, `queued`, `left_line`). Never carries a
/// session id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// A lease was granted.
    Granted {
        /// The claimed path.
        resource: String,
        /// The holder name.
        holder: String,
        /// The grant's fence.
        fence: u64,
        /// `exclusive`, `subtree` or `shared`.
        mode: LeaseMode,
    },
    /// A lease was released by its session (directly or by ending the session).
    Released {
        /// The freed path.
        resource: String,
        /// The released lease's fence.
        fence: u64,
    },
    /// A lease expired (its session lapsed or its max hold passed).
    Expired {
        /// The freed path.
        resource: String,
        /// The expired lease's fence.
        fence: u64,
    },
    /// A kv key was written.
    KvWritten {
        /// The key.
        key: String,
        /// The key's new revision.
        revision: u64,
        /// The fence token the write carried, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fence: Option<u64>,
    },
    /// A kv key was deleted.
    KvDeleted {
        /// The key.
        key: String,
    },
    /// A task was enqueued.
    TaskEnqueued(TaskChange),
    /// A task was claimed.
    TaskClaimed(TaskChange),
    /// A task was completed.
    TaskCompleted(TaskChange),
    /// A task attempt failed (it is ready again or dead; a `task_dead` follows if dead).
    TaskFailed(TaskChange),
    /// A task claim was released without counting an attempt.
    TaskReleased(TaskChange),
    /// A task became dead.
    TaskDead(TaskChange),
    /// A claim lapsed with its session (expired or ended); the task is ready again or dead.
    TaskExpired(TaskChange),
    /// An acquire joined the resource's line.
    Queued {
        /// The path waited for.
        resource: String,
        /// The waiting session's holder name.
        holder: String,
        /// `exclusive`, `subtree` or `shared`.
        mode: LeaseMode,
    },
    /// A waiter left the line without a grant: it asked to, or its session ended or died.
    LeftLine {
        /// The path it waited for.
        resource: String,
        /// The waiting session's holder name.
        holder: String,
    },
    /// An event type this client does not know (sent by a newer server). Never sent.
    #[serde(other)]
    Unknown,
}

/// The fields of every `task_*` event: `{queue, task_id, fence?, attempt?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TaskChange {
    /// The queue's name.
    pub queue: String,
    /// The task's id.
    pub task_id: String,
    /// The claim's fence, for claim-related events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    /// The attempt number, for claim-related events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// For `task_failed`: whether the task went back to ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<bool>,
}
