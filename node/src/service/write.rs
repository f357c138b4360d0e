//! The writes: one method per mutation, taking that operation's parts and returning that
//! operation's result. Callers never see the machine's `Reply`: which reply answers which
//! operation is decided here, once, and a reply of another kind is a broken invariant that
//! stops the node (see `main`), never an API error.
//!
//! What must never live here: HTTP, parsing of requests (the route files and `extract.rs`),
//! reads (`Service::read`).

use baton_raft_store::machine::{
    Command, Grant, IdempotencyTag, Labels, LeaseMode, Name, Namespace, NewSession, Op, Owner,
    Queued, Reply, ResourceFence, ResourcePath, SessionId, SessionView, TaskClaimed, TaskFence,
    TaskSpec, TaskView, Txn, TxnOp,
};
use sha2::{Digest, Sha256};

use super::{ApiError, Clocks, Service};

/// Where a mutation acts, by whom, how a retry of it is recognised, and its share of a log
/// entry.
#[derive(Clone)]
pub struct Mutation {
    pub namespace: Namespace,
    /// The token it is made with, when access control is on: the machine checks it again.
    pub by: Option<Name>,
    pub tag: Option<IdempotencyTag>,
    pub size_bytes: usize,
}

/// A committed mutation's result, with the clocks to render it and how it was decided.
#[derive(Debug)]
pub struct Committed<T> {
    pub value: T,
    /// The clocks the answer's `*_at` times are rendered with (a replay's are the first
    /// answer's).
    pub clocks: Clocks,
    /// The cluster time of the entry that answered it.
    pub cluster_time_ms: u64,
    /// Whether this is the recorded first answer of an idempotent retry.
    pub replayed: bool,
}

/// A transaction's outcome: whether its compares held, and what each op run did.
pub struct TxnDone {
    pub succeeded: bool,
    pub results: Vec<TxnResult>,
}

/// What one op of a transaction did.
pub enum TxnResult {
    Put { revision: u64 },
    Delete { revision: u64 },
    Release { resource: ResourcePath, fence: u64 },
    AddTask(TaskView),
    CompleteTask(TaskView),
    FailTask(TaskView),
}

/// Which op a transaction's reply answers (the ops themselves hold payloads, not kept).
#[derive(Clone, Copy)]
enum TxnOpKind {
    Put,
    Delete,
    Release,
    AddTask,
    CompleteTask,
    FailTask,
}

impl TxnOpKind {
    fn of(op: &TxnOp) -> TxnOpKind {
        match op {
            TxnOp::Put { .. } => TxnOpKind::Put,
            TxnOp::Delete { .. } => TxnOpKind::Delete,
            TxnOp::Release { .. } => TxnOpKind::Release,
            TxnOp::AddTask { .. } => TxnOpKind::AddTask,
            TxnOp::CompleteTask { .. } => TxnOpKind::CompleteTask,
            TxnOp::FailTask { .. } => TxnOpKind::FailTask,
        }
    }
}

impl TxnResult {
    /// The result of an op of `kind` from its reply, if the reply is of that kind.
    fn of(kind: TxnOpKind, reply: Reply) -> Result<TxnResult, Box<Reply>> {
        Ok(match (kind, reply) {
            (TxnOpKind::Put, Reply::KvWritten { revision }) => TxnResult::Put { revision },
            (TxnOpKind::Delete, Reply::KvDeleted { revision }) => TxnResult::Delete { revision },
            (TxnOpKind::Release, Reply::Released { resource, fence }) => {
                TxnResult::Release { resource, fence }
            }
            (TxnOpKind::AddTask, Reply::TaskEnqueued(task)) => TxnResult::AddTask(task),
            (TxnOpKind::CompleteTask, Reply::TaskUpdated(task)) => TxnResult::CompleteTask(task),
            (TxnOpKind::FailTask, Reply::TaskUpdated(task)) => TxnResult::FailTask(task),
            (_, other) => return Err(Box::new(other)),
        })
    }
}

/// An acquire that waits: granted at once, or its place in the resource's line.
pub enum Acquired {
    Granted(Grant),
    Queued(Queued),
}

/// What `POST /v1/sessions/{id}/release` let go of: the session's lease, or its place in line.
pub enum LetGo {
    Released(ResourcePath),
    LeftLine(ResourcePath),
}

/// What ends a claimed task's attempt (`Op::Complete`, `Op::Fail`, `Op::ReleaseTask`).
pub enum TaskEnd {
    Complete { result: Option<String> },
    Fail { reason: String, retry: bool },
    Release { note: Option<String> },
}

impl Service {
    pub async fn create_session(
        &self,
        mutation: Mutation,
        session: NewSession,
    ) -> Result<Committed<SessionView>, ApiError> {
        self.commit(mutation, Op::CreateSession(session), |reply| match reply {
            Reply::SessionCreated(view) => Ok(view),
            other => Err(Box::new(other)),
        })
        .await
    }

    /// Renews a session and its leases; the result is the session's new `expires_in_ms`.
    pub async fn keepalive(
        &self,
        mutation: Mutation,
        session_id: SessionId,
    ) -> Result<Committed<u64>, ApiError> {
        self.commit(
            mutation,
            Op::Keepalive { session_id },
            |reply| match reply {
                Reply::KeptAlive { expires_in_ms, .. } => Ok(expires_in_ms),
                other => Err(Box::new(other)),
            },
        )
        .await
    }

    /// Releases one lease of a session, or takes the session out of the resource's line.
    pub async fn release(
        &self,
        mutation: Mutation,
        session_id: SessionId,
        resource: ResourcePath,
    ) -> Result<Committed<LetGo>, ApiError> {
        let op = Op::LeaveOrRelease {
            session_id,
            resource,
        };
        self.commit(mutation, op, |reply| match reply {
            Reply::Released { resource, .. } => Ok(LetGo::Released(resource)),
            Reply::LeftLine { resource } => Ok(LetGo::LeftLine(resource)),
            other => Err(Box::new(other)),
        })
        .await
    }

    /// Ends a session; the result is every path it held.
    pub async fn end_session(
        &self,
        mutation: Mutation,
        session_id: SessionId,
    ) -> Result<Committed<Vec<ResourcePath>>, ApiError> {
        self.commit(
            mutation,
            Op::EndSession { session_id },
            |reply| match reply {
                Reply::SessionEnded { released } => Ok(released),
                other => Err(Box::new(other)),
            },
        )
        .await
    }

    /// An acquire; one that `waits` joins the resource's line instead of being refused by its
    /// holders (only it is ever answered `Queued`).
    #[allow(clippy::too_many_arguments)]
    pub async fn acquire(
        &self,
        mutation: Mutation,
        resource: ResourcePath,
        mode: LeaseMode,
        owner: Owner,
        max_hold_ms: Option<u64>,
        labels: Labels,
        waits: bool,
    ) -> Result<Committed<Acquired>, ApiError> {
        let op = if waits {
            Op::AcquireOrWait {
                resource,
                mode,
                owner,
                max_hold_ms,
                labels,
            }
        } else {
            Op::Acquire {
                resource,
                mode,
                owner,
                max_hold_ms,
                labels,
            }
        };
        self.commit(mutation, op, move |reply| match reply {
            Reply::Granted(grant) => Ok(Acquired::Granted(grant)),
            Reply::StillGranted(grant) if waits => Ok(Acquired::Granted(grant)),
            Reply::Queued(queued) if waits => Ok(Acquired::Queued(queued)),
            other => Err(Box::new(other)),
        })
        .await
    }

    /// Writes a value (fenced when `fence` is set); the result is the key's new revision.
    pub async fn kv_put(
        &self,
        mutation: Mutation,
        key: ResourcePath,
        value: String,
        fence: Option<ResourceFence>,
    ) -> Result<Committed<u64>, ApiError> {
        self.commit(
            mutation,
            Op::KvPut { key, value, fence },
            |reply| match reply {
                Reply::KvWritten { revision } => Ok(revision),
                other => Err(Box::new(other)),
            },
        )
        .await
    }

    /// Deletes a value (fenced when `fence` is set); the result is the delete's revision.
    pub async fn kv_delete(
        &self,
        mutation: Mutation,
        key: ResourcePath,
        fence: Option<ResourceFence>,
    ) -> Result<Committed<u64>, ApiError> {
        self.commit(mutation, Op::KvDelete { key, fence }, |reply| match reply {
            Reply::KvDeleted { revision } => Ok(revision),
            other => Err(Box::new(other)),
        })
        .await
    }

    pub async fn enqueue(
        &self,
        mutation: Mutation,
        queue: Name,
        task: TaskSpec,
    ) -> Result<Committed<TaskView>, ApiError> {
        self.commit(mutation, Op::Enqueue { queue, task }, |reply| match reply {
            Reply::TaskEnqueued(task) => Ok(task),
            other => Err(Box::new(other)),
        })
        .await
    }

    pub async fn txn(&self, mutation: Mutation, txn: Txn) -> Result<Committed<TxnDone>, ApiError> {
        let kinds = |ops: &[TxnOp]| ops.iter().map(TxnOpKind::of).collect::<Vec<_>>();
        let (success, failure) = (kinds(&txn.success), kinds(&txn.failure));
        self.commit(mutation, Op::Txn(txn), move |reply| match reply {
            Reply::TxnDone { succeeded, results } => {
                let ops = if succeeded { &success } else { &failure };
                if ops.len() != results.len() {
                    return Err(Box::new(Reply::TxnDone { succeeded, results }));
                }
                Ok(TxnDone {
                    succeeded,
                    results: ops
                        .iter()
                        .zip(results)
                        .map(|(kind, reply)| TxnResult::of(*kind, reply))
                        .collect::<Result<_, _>>()?,
                })
            }
            other => Err(Box::new(other)),
        })
        .await
    }

    /// Claim-next; `None` when no task of the queue is ready (nothing changed).
    pub async fn claim(
        &self,
        mutation: Mutation,
        queue: Name,
        owner: Owner,
    ) -> Result<Committed<Option<TaskClaimed>>, ApiError> {
        self.commit(mutation, Op::Claim { queue, owner }, |reply| match reply {
            Reply::TaskClaimed(claimed) => Ok(Some(claimed)),
            Reply::QueueEmpty => Ok(None),
            other => Err(Box::new(other)),
        })
        .await
    }

    /// Completes, fails or releases the attempt `claim` proves; the result is the task after.
    pub async fn end_task(
        &self,
        mutation: Mutation,
        queue: Name,
        task_id: Name,
        claim: TaskFence,
        end: TaskEnd,
    ) -> Result<Committed<TaskView>, ApiError> {
        let op = match end {
            TaskEnd::Complete { result } => Op::Complete {
                queue,
                task_id,
                claim,
                result,
            },
            TaskEnd::Fail { reason, retry } => Op::Fail {
                queue,
                task_id,
                claim,
                reason,
                retry,
            },
            TaskEnd::Release { note } => Op::ReleaseTask {
                queue,
                task_id,
                claim,
                note,
            },
        };
        self.commit(mutation, op, |reply| match reply {
            Reply::TaskUpdated(task) => Ok(task),
            other => Err(Box::new(other)),
        })
        .await
    }

    /// Admits `op` (machine's admission.rs) on the leader, replicates it (relayed there from a
    /// follower, relay.rs) and takes its result out of the reply with `result`, which hands back
    /// a reply of any other kind: the machine broke its contract, and the node stops.
    ///
    /// An idempotent request renders its `*_at` times with the wall clock recorded in its tag,
    /// so the first answer and every replay have identical bodies on every node.
    async fn commit<T>(
        &self,
        mutation: Mutation,
        op: Op,
        result: impl FnOnce(Reply) -> Result<T, Box<Reply>>,
    ) -> Result<Committed<T>, ApiError> {
        let tag_wall_ms = mutation.tag.as_ref().map(|tag| tag.wall_ms);
        let idempotency = mutation.tag.map(|tag| made_by(tag, mutation.by.as_ref()));
        let command = Command::Namespaced {
            namespace: mutation.namespace,
            idempotency,
            op,
        };
        let command = authorized(mutation.by, command);
        self.propose_and_take(command, mutation.size_bytes, tag_wall_ms, result)
            .await
    }

    /// A cluster-wide command (tokens, limits) made with token `by`; the result as `commit`.
    pub async fn administer<T>(
        &self,
        by: Option<Name>,
        command: Command,
        result: impl FnOnce(Reply) -> Result<T, Box<Reply>>,
    ) -> Result<Committed<T>, ApiError> {
        self.propose_and_take(authorized(by, command), 1_024, None, result)
            .await
    }

    async fn propose_and_take<T>(
        &self,
        command: Command,
        size_bytes: usize,
        tag_wall_ms: Option<i64>,
        result: impl FnOnce(Reply) -> Result<T, Box<Reply>>,
    ) -> Result<Committed<T>, ApiError> {
        let committed = self.decide(command, size_bytes).await?;
        let clocks = match (committed.response.replayed, tag_wall_ms) {
            (Some(recorded), _) => Clocks {
                wall_ms: recorded.wall_ms,
                cluster_ms: recorded.time_ms,
            },
            (None, Some(wall_ms)) => Clocks {
                wall_ms,
                cluster_ms: committed.time_ms,
            },
            (None, None) => self.clocks(committed.time_ms),
        };
        match committed.response.outcome {
            Ok(reply) => match result(reply) {
                Ok(value) => Ok(Committed {
                    value,
                    clocks,
                    cluster_time_ms: committed.time_ms,
                    replayed: committed.response.replayed.is_some(),
                }),
                Err(other) => {
                    panic!("invariant broken: the machine answered an operation with {other:?}")
                }
            },
            Err(rejection) => Err(self.refusal(rejection, self.clocks(committed.time_ms))),
        }
    }
}

/// `command` made with token `by` when there is one (access control on): the machine checks
/// the token again when it applies it.
fn authorized(by: Option<Name>, command: Command) -> Command {
    match by {
        Some(token) => Command::Authorized {
            token,
            command: Box::new(command),
        },
        None => command,
    }
}

/// `tag` with the token that makes the request in its fingerprint: a key's record answers only
/// the token that used it, and any other token using the same key is refused as a different
/// request (`IDEMPOTENCY_KEY_REUSED`) instead of getting its answer, session id included.
/// Without access control (no token) the fingerprint is the edge's.
fn made_by(mut tag: IdempotencyTag, by: Option<&Name>) -> IdempotencyTag {
    if let Some(token) = by {
        let mut hasher = Sha256::new();
        hasher.update(tag.fingerprint);
        hasher.update((token.as_str().len() as u64).to_le_bytes());
        hasher.update(token.as_str().as_bytes());
        tag.fingerprint = hasher.finalize().into();
    }
    tag
}
