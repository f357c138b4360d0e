//! The shapes that earlier formats wrote, kept only to read them: log entries of batch format
//! `V1` and snapshots of formats 1, 2 and 3. Each converts into the current type; nothing here is
//! ever written.
//!
//! What changed since: tasks gained `on_dead` (a compensation) and the time they finished (for
//! retention); namespaces gained the lines of waiting acquires and the task views recorded in
//! idempotency replies gained `on_dead` (format 4); the limits gained `task_retention_ms` and `txn_ops_max`; `Op::Enqueue` carries
//! a `TaskSpec`. A finished task read from an old snapshot counts as finished at the
//! snapshot's cluster time, so its retention starts when the upgrade reads it.

use std::collections::BTreeMap;

use imbl::{OrdMap, Vector};

use serde::Deserialize;

use super::auth::{NewToken, TokenView};
use super::command::{
    Command, Grant, IdempotencyTag, NewSession, Op, Owner, Recorded, Reply, ResourceFence,
    SessionView, TaskClaimed, TaskFence, TaskSpec, TaskState, TaskView,
};
use super::idempotency::{IdempotencyTable, Record};
use super::queues::QueueState;
use super::types::{Labels, LeaseMode, Limits, Name, Namespace, ResourcePath, SessionId};
use super::{KvEntry, Lease, NamespaceState, Session, SharedLease};

/// The limits before `task_retention_ms`, `txn_ops_max` and `shared_limit_max`.
#[derive(Deserialize)]
pub(super) struct LimitsV1 {
    ttl_ms_min: u64,
    ttl_ms_max: u64,
    max_hold_ms_max: u64,
    path_bytes_max: usize,
    path_segments_max: usize,
    namespace_bytes_max: usize,
    holder_chars_max: usize,
    label_chars_max: usize,
    labels_max: usize,
    leases_per_session_max: usize,
    sessions_per_namespace_max: usize,
    kv_keys_per_namespace_max: usize,
    kv_value_bytes_max: usize,
    task_payload_bytes_max: usize,
    tasks_per_queue_max: usize,
    queues_per_namespace_max: usize,
    task_dependencies_max: usize,
    task_attempts_max: u32,
    task_delay_ms_max: u64,
    task_text_chars_max: usize,
    name_chars_max: usize,
    list_page_max: usize,
    idempotency_key_chars_min: usize,
    idempotency_key_chars_max: usize,
    idempotency_ttl_ms: u64,
    idempotency_keys_max: usize,
    events_kept_max: usize,
    sweep_batch_max: usize,
}

impl From<LimitsV1> for Limits {
    fn from(old: LimitsV1) -> Limits {
        let defaults = Limits::default();
        Limits {
            ttl_ms_min: old.ttl_ms_min,
            ttl_ms_max: old.ttl_ms_max,
            max_hold_ms_max: old.max_hold_ms_max,
            path_bytes_max: old.path_bytes_max,
            path_segments_max: old.path_segments_max,
            namespace_bytes_max: old.namespace_bytes_max,
            holder_chars_max: old.holder_chars_max,
            label_chars_max: old.label_chars_max,
            labels_max: old.labels_max,
            leases_per_session_max: old.leases_per_session_max,
            sessions_per_namespace_max: old.sessions_per_namespace_max,
            kv_keys_per_namespace_max: old.kv_keys_per_namespace_max,
            kv_value_bytes_max: old.kv_value_bytes_max,
            task_payload_bytes_max: old.task_payload_bytes_max,
            tasks_per_queue_max: old.tasks_per_queue_max,
            queues_per_namespace_max: old.queues_per_namespace_max,
            task_dependencies_max: old.task_dependencies_max,
            task_attempts_max: old.task_attempts_max,
            task_delay_ms_max: old.task_delay_ms_max,
            task_text_chars_max: old.task_text_chars_max,
            name_chars_max: old.name_chars_max,
            list_page_max: old.list_page_max,
            idempotency_key_chars_min: old.idempotency_key_chars_min,
            idempotency_key_chars_max: old.idempotency_key_chars_max,
            idempotency_ttl_ms: old.idempotency_ttl_ms,
            idempotency_keys_max: old.idempotency_keys_max,
            events_kept_max: old.events_kept_max,
            sweep_batch_max: old.sweep_batch_max,
            task_retention_ms: defaults.task_retention_ms,
            txn_ops_max: defaults.txn_ops_max,
            shared_limit_max: defaults.shared_limit_max,
        }
    }
}

/// `Command` as batch format `V1` wrote it.
#[derive(Deserialize)]
pub(super) enum CommandV1 {
    Namespaced {
        namespace: Namespace,
        idempotency: Option<IdempotencyTag>,
        op: OpV1,
    },
    Sweep {
        max: u32,
    },
    SetLimits(LimitsV1),
    CreateToken(NewToken),
    RevokeToken {
        name: Name,
    },
    BootstrapToken {
        secret_sha256: [u8; 32],
    },
    Authorized {
        token: Name,
        command: Box<CommandV1>,
    },
}

impl From<CommandV1> for Command {
    fn from(old: CommandV1) -> Command {
        match old {
            CommandV1::Namespaced {
                namespace,
                idempotency,
                op,
            } => Command::Namespaced {
                namespace,
                idempotency,
                op: op.into(),
            },
            CommandV1::Sweep { max } => Command::Sweep { max },
            CommandV1::SetLimits(limits) => Command::SetLimits(limits.into()),
            CommandV1::CreateToken(new_token) => Command::CreateToken(new_token),
            CommandV1::RevokeToken { name } => Command::RevokeToken { name },
            CommandV1::BootstrapToken { secret_sha256 } => {
                Command::BootstrapToken { secret_sha256 }
            }
            CommandV1::Authorized { token, command } => Command::Authorized {
                token,
                command: Box::new((*command).into()),
            },
        }
    }
}

/// `Op` as batch format `V1` wrote it: the same but for `Enqueue`.
#[derive(Deserialize)]
pub(super) enum OpV1 {
    CreateSession(NewSession),
    Keepalive {
        session_id: SessionId,
    },
    Release {
        session_id: SessionId,
        resource: ResourcePath,
    },
    EndSession {
        session_id: SessionId,
    },
    Acquire {
        resource: ResourcePath,
        mode: LeaseMode,
        owner: Owner,
        max_hold_ms: Option<u64>,
        labels: Labels,
    },
    KvPut {
        key: ResourcePath,
        value: String,
        fence: Option<ResourceFence>,
    },
    KvDelete {
        key: ResourcePath,
        fence: Option<ResourceFence>,
    },
    Enqueue {
        queue: Name,
        task_id: Name,
        payload: String,
        priority: i32,
        depends_on: Vec<Name>,
        max_attempts: u32,
        delay_ms: u64,
    },
    Claim {
        queue: Name,
        owner: Owner,
    },
    Complete {
        queue: Name,
        task_id: Name,
        claim: TaskFence,
        result: Option<String>,
    },
    Fail {
        queue: Name,
        task_id: Name,
        claim: TaskFence,
        reason: String,
        retry: bool,
    },
    ReleaseTask {
        queue: Name,
        task_id: Name,
        claim: TaskFence,
        note: Option<String>,
    },
}

impl From<OpV1> for Op {
    fn from(old: OpV1) -> Op {
        match old {
            OpV1::CreateSession(new_session) => Op::CreateSession(new_session),
            OpV1::Keepalive { session_id } => Op::Keepalive { session_id },
            OpV1::Release {
                session_id,
                resource,
            } => Op::Release {
                session_id,
                resource,
            },
            OpV1::EndSession { session_id } => Op::EndSession { session_id },
            OpV1::Acquire {
                resource,
                mode,
                owner,
                max_hold_ms,
                labels,
            } => Op::Acquire {
                resource,
                mode,
                owner,
                max_hold_ms,
                labels,
            },
            OpV1::KvPut { key, value, fence } => Op::KvPut { key, value, fence },
            OpV1::KvDelete { key, fence } => Op::KvDelete { key, fence },
            OpV1::Enqueue {
                queue,
                task_id,
                payload,
                priority,
                depends_on,
                max_attempts,
                delay_ms,
            } => Op::Enqueue {
                queue,
                task: TaskSpec {
                    task_id,
                    payload,
                    priority,
                    depends_on,
                    max_attempts,
                    delay_ms,
                    on_dead: None,
                },
            },
            OpV1::Claim { queue, owner } => Op::Claim { queue, owner },
            OpV1::Complete {
                queue,
                task_id,
                claim,
                result,
            } => Op::Complete {
                queue,
                task_id,
                claim,
                result,
            },
            OpV1::Fail {
                queue,
                task_id,
                claim,
                reason,
                retry,
            } => Op::Fail {
                queue,
                task_id,
                claim,
                reason,
                retry,
            },
            OpV1::ReleaseTask {
                queue,
                task_id,
                claim,
                note,
            } => Op::ReleaseTask {
                queue,
                task_id,
                claim,
                note,
            },
        }
    }
}

/// A namespace as snapshot formats 1 and 2 wrote it: tasks in their old shape.
#[derive(Deserialize)]
pub(super) struct NamespaceStateV2 {
    sessions: BTreeMap<SessionId, Session>,
    leases: BTreeMap<ResourcePath, Lease>,
    kv: BTreeMap<ResourcePath, KvEntry>,
    queues: BTreeMap<Name, QueueStateV2>,
}

impl NamespaceStateV2 {
    /// The current shape; finished tasks count as finished at `time_ms`.
    pub(super) fn upgrade(self, time_ms: u64) -> NamespaceState {
        NamespaceState {
            sessions: self.sessions.into(),
            leases: self.leases.into(),
            shared: OrdMap::new(),
            kv: self.kv.into(),
            queues: self
                .queues
                .into_iter()
                .map(|(name, queue)| (name, queue.upgrade(time_ms)))
                .collect(),
            lines: OrdMap::new(),
        }
    }
}

/// A namespace as snapshot format 3 wrote it: without lines.
#[derive(Deserialize)]
pub(super) struct NamespaceStateV3 {
    sessions: BTreeMap<SessionId, Session>,
    leases: BTreeMap<ResourcePath, Lease>,
    shared: BTreeMap<ResourcePath, SharedLease>,
    kv: BTreeMap<ResourcePath, KvEntry>,
    queues: BTreeMap<Name, QueueState>,
}

impl From<NamespaceStateV3> for NamespaceState {
    fn from(old: NamespaceStateV3) -> NamespaceState {
        NamespaceState {
            sessions: old.sessions.into(),
            leases: old.leases.into(),
            shared: old.shared.into(),
            kv: old.kv.into(),
            queues: old.queues.into(),
            lines: OrdMap::new(),
        }
    }
}

#[derive(Deserialize)]
pub(super) struct QueueStateV2 {
    tasks: BTreeMap<Name, TaskV2>,
    next_sequence: u64,
}

impl QueueStateV2 {
    fn upgrade(self, time_ms: u64) -> QueueState {
        QueueState::upgrade(self.tasks, self.next_sequence, time_ms)
    }
}

/// A task as snapshot formats 1 and 2 wrote it: no `on_dead`, no finishing time.
#[derive(Deserialize)]
pub(super) struct TaskV2 {
    pub payload: String,
    pub priority: i32,
    pub depends_on: Vec<Name>,
    pub dependents: Vec<Name>,
    pub waiting_on: u32,
    pub max_attempts: u32,
    pub ready_at_ms: u64,
    pub sequence: u64,
    pub enqueued_revision: u64,
    pub attempt: u32,
    pub life: LifeV2,
    pub note: Option<String>,
    pub last_failure: Option<String>,
}

#[derive(Deserialize)]
pub(super) enum LifeV2 {
    Ready,
    Claimed { session_id: SessionId, fence: u64 },
    Done { result: Option<String> },
    Dead { reason: String },
}

/// The idempotency table as snapshot formats 1 to 3 wrote it: replies whose task views had no
/// `on_dead`. A replay of such a record shows none (the task's own view does).
#[derive(Deserialize)]
pub(super) struct IdempotencyTableV3 {
    records: BTreeMap<(Namespace, String), RecordV3>,
    #[serde(deserialize_with = "crate::imbl_serde::vector::deserialize")]
    order: Vector<(u64, Namespace, String)>,
}

#[derive(Deserialize)]
struct RecordV3 {
    fingerprint: [u8; 32],
    reply: ReplyV3,
    recorded: Recorded,
}

impl From<IdempotencyTableV3> for IdempotencyTable {
    fn from(old: IdempotencyTableV3) -> IdempotencyTable {
        IdempotencyTable {
            records: old
                .records
                .into_iter()
                .map(|(key, record)| {
                    let record = Record {
                        fingerprint: record.fingerprint,
                        reply: record.reply.into(),
                        recorded: record.recorded,
                    };
                    (key, record)
                })
                .collect(),
            order: old.order,
        }
    }
}

/// `Reply` as formats 1 to 3 wrote it, variant for variant (the later ones were never recorded
/// then).
#[derive(Deserialize)]
enum ReplyV3 {
    SessionCreated(SessionView),
    KeptAlive {
        session_id: SessionId,
        expires_in_ms: u64,
    },
    Released {
        resource: ResourcePath,
        fence: u64,
    },
    SessionEnded {
        released: Vec<ResourcePath>,
    },
    Granted(Grant),
    KvWritten {
        revision: u64,
    },
    KvDeleted {
        revision: u64,
    },
    Swept {
        leases: u64,
        sessions: u64,
        tasks: u64,
    },
    LimitsSet,
    TaskEnqueued(TaskViewV3),
    TaskClaimed(TaskClaimedV3),
    QueueEmpty,
    TaskUpdated(TaskViewV3),
    TokenCreated(TokenView),
    TokenRevoked {
        name: Name,
    },
    TokenBootstrapped {
        created: bool,
    },
    TxnDone {
        succeeded: bool,
        results: Vec<ReplyV3>,
    },
}

impl From<ReplyV3> for Reply {
    fn from(old: ReplyV3) -> Reply {
        match old {
            ReplyV3::SessionCreated(view) => Reply::SessionCreated(view),
            ReplyV3::KeptAlive {
                session_id,
                expires_in_ms,
            } => Reply::KeptAlive {
                session_id,
                expires_in_ms,
            },
            ReplyV3::Released { resource, fence } => Reply::Released { resource, fence },
            ReplyV3::SessionEnded { released } => Reply::SessionEnded { released },
            ReplyV3::Granted(grant) => Reply::Granted(grant),
            ReplyV3::KvWritten { revision } => Reply::KvWritten { revision },
            ReplyV3::KvDeleted { revision } => Reply::KvDeleted { revision },
            ReplyV3::Swept {
                leases,
                sessions,
                tasks,
            } => Reply::Swept {
                leases,
                sessions,
                tasks,
            },
            ReplyV3::LimitsSet => Reply::LimitsSet,
            ReplyV3::TaskEnqueued(task) => Reply::TaskEnqueued(task.into()),
            ReplyV3::TaskClaimed(claimed) => Reply::TaskClaimed(TaskClaimed {
                task: claimed.task.into(),
                fence: claimed.fence,
                attempt: claimed.attempt,
                session_id: claimed.session_id,
                session_created: claimed.session_created,
                expires_in_ms: claimed.expires_in_ms,
            }),
            ReplyV3::QueueEmpty => Reply::QueueEmpty,
            ReplyV3::TaskUpdated(task) => Reply::TaskUpdated(task.into()),
            ReplyV3::TokenCreated(token) => Reply::TokenCreated(token),
            ReplyV3::TokenRevoked { name } => Reply::TokenRevoked { name },
            ReplyV3::TokenBootstrapped { created } => Reply::TokenBootstrapped { created },
            ReplyV3::TxnDone { succeeded, results } => Reply::TxnDone {
                succeeded,
                results: results.into_iter().map(Reply::from).collect(),
            },
        }
    }
}

#[derive(Deserialize)]
struct TaskClaimedV3 {
    task: TaskViewV3,
    fence: u64,
    attempt: u32,
    session_id: SessionId,
    session_created: bool,
    expires_in_ms: u64,
}

/// A task view without `on_dead`.
#[derive(Deserialize)]
struct TaskViewV3 {
    queue: Name,
    id: Name,
    payload: String,
    priority: i32,
    depends_on: Vec<Name>,
    state: TaskState,
    attempt: u32,
    max_attempts: u32,
    ready_at_ms: u64,
    waiting_on: u32,
    note: Option<String>,
    result: Option<String>,
    reason: Option<String>,
    claim: Option<(u64, String)>,
    enqueued_revision: u64,
}

impl From<TaskViewV3> for TaskView {
    fn from(old: TaskViewV3) -> TaskView {
        TaskView {
            queue: old.queue,
            id: old.id,
            payload: old.payload,
            priority: old.priority,
            depends_on: old.depends_on,
            state: old.state,
            attempt: old.attempt,
            max_attempts: old.max_attempts,
            ready_at_ms: old.ready_at_ms,
            waiting_on: old.waiting_on,
            note: old.note,
            result: old.result,
            reason: old.reason,
            claim: old.claim,
            enqueued_revision: old.enqueued_revision,
            on_dead: None,
        }
    }
}
