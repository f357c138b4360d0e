//! A model test: a deliberately naive reference implementation of the lease and work-queue rules
//! (docs/guarantees.md G2, G3, G4, G8 and section 4) is fed the same random entries as the real machine, and
//! their answers and observable state must agree after every entry.
//!
//! The model keeps plain `Vec`s and scans them linearly; its path logic splits strings into
//! segments and shares nothing with `ResourcePath`'s ancestor or range helpers. Its queues keep
//! no index, no dependents list and no counters: claim-next scans every task for the best one
//! that is ready now, "waiting on" is recounted from the dependencies, a claim lapses when a scan
//! finds its session past its deadline, and the counts are a scan. Where the real machine's
//! order of checks is a choice the contract leaves open (which validation comes first, which of
//! several live conflicts is reported, in which order simultaneous lapses emit their events),
//! the model mirrors it and says so.

mod common;

use std::collections::BTreeMap;

use baton_machine::{
    Batch, Command, Compare, Compensation, Event, EventKind, Grant, IdempotencyTag, Labels,
    LeaseMode, LeaseView, Limits, Machine, Name, Namespace, NewSession, Op, Owner, Queued, Reply,
    ResourceFence, ResourcePath, Response, SessionId, SessionView, TaskClaimed, TaskCounts,
    TaskFence, TaskSpec, TaskState, TaskView, Txn, TxnOp,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

// ---- the model ----

#[derive(Debug, Clone)]
struct ModelSession {
    namespace: Namespace,
    id: SessionId,
    holder: String,
    ttl_ms: u64,
    labels: Labels,
    deadline_ms: u64,
}

#[derive(Debug, Clone)]
struct ModelLease {
    namespace: Namespace,
    resource: ResourcePath,
    session: SessionId,
    fence: u64,
    mode: LeaseMode,
    labels: Labels,
    acquired_at_ms: u64,
    max_hold_deadline_ms: Option<u64>,
}

/// An acquire waiting in line. The model keeps one list of every waiter in arrival order; a
/// resource's line is the waiters on it, in that order.
#[derive(Debug, Clone)]
struct ModelWaiter {
    namespace: Namespace,
    resource: ResourcePath,
    session: SessionId,
    mode: LeaseMode,
    labels: Labels,
    max_hold_ms: Option<u64>,
}

#[derive(Debug, Clone)]
struct ModelValue {
    namespace: Namespace,
    key: ResourcePath,
    revision: u64,
}

/// Where a task is: the claim names its session and fence; done keeps the result, dead the
/// reason.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ModelLife {
    Ready,
    Claimed { session: SessionId, fence: u64 },
    Done { result: Option<String> },
    Dead { reason: String },
}

#[derive(Debug, Clone)]
struct ModelTask {
    namespace: Namespace,
    queue: Name,
    id: Name,
    payload: String,
    priority: i32,
    /// Sorted, without repeats.
    depends_on: Vec<Name>,
    /// The `order` of each dependency as it was at enqueue: an id taken again after
    /// retention removed its task names another task.
    depends_on_orders: Vec<u64>,
    max_attempts: u32,
    /// Enqueue time plus delay.
    ready_at_ms: u64,
    /// Enqueue order across the whole model (only the order within a queue matters).
    order: u64,
    enqueued_revision: u64,
    attempt: u32,
    life: ModelLife,
    note: Option<String>,
    /// The reason of the last failure that sent the task back to ready, shown as the view's
    /// `reason` until the task is done or dead.
    last_failure: Option<String>,
    /// When it became done or dead: retention counts from it.
    finished_ms: Option<u64>,
    on_dead: Option<Compensation>,
}

#[derive(Debug, Clone)]
struct ModelRecord {
    recorded_ms: u64,
    namespace: Namespace,
    key: String,
    fingerprint: [u8; 32],
    reply: Reply,
}

/// A refusal as the model sees it: the code, plus the structured parts callers act on.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Refusal {
    Invalid,
    NotFound,
    LeaseHeld(LeaseView),
    LeaseLost,
    StaleFence(Option<u64>),
    PayloadTooLarge,
    KeyReused,
    Exhausted,
}

impl Refusal {
    fn code(&self) -> &'static str {
        match self {
            Refusal::Invalid => "INVALID_ARGUMENT",
            Refusal::NotFound => "NOT_FOUND",
            Refusal::LeaseHeld(_) => "LEASE_HELD",
            Refusal::LeaseLost => "LEASE_LOST",
            Refusal::StaleFence(_) => "STALE_FENCE",
            Refusal::PayloadTooLarge => "PAYLOAD_TOO_LARGE",
            Refusal::KeyReused => "IDEMPOTENCY_KEY_REUSED",
            Refusal::Exhausted => "RESOURCE_EXHAUSTED",
        }
    }
}

/// A response normalized for comparison: replies exactly, refusals by code and structure.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Normalized {
    Ok {
        reply: Reply,
        replayed: bool,
    },
    Err {
        code: &'static str,
        held_by: Option<LeaseView>,
        current_fence: Option<Option<u64>>,
    },
}

fn normalize_real(response: &Response) -> Normalized {
    use baton_machine::Rejection;
    match &response.outcome {
        Ok(reply) => Normalized::Ok {
            reply: reply.clone(),
            replayed: response.replayed.is_some(),
        },
        Err(rejection) => Normalized::Err {
            code: rejection.code(),
            held_by: match rejection {
                Rejection::LeaseHeld { held_by, .. } => Some(LeaseView::clone(held_by)),
                _ => None,
            },
            current_fence: match rejection {
                Rejection::StaleFence { current_fence, .. } => Some(*current_fence),
                _ => None,
            },
        },
    }
}

fn normalize_model(outcome: &Result<Reply, Refusal>, replayed: bool) -> Normalized {
    match outcome {
        Ok(reply) => Normalized::Ok {
            reply: reply.clone(),
            replayed,
        },
        Err(refusal) => Normalized::Err {
            code: refusal.code(),
            held_by: match refusal {
                Refusal::LeaseHeld(view) => Some(view.clone()),
                _ => None,
            },
            current_fence: match refusal {
                Refusal::StaleFence(fence) => Some(*fence),
                _ => None,
            },
        },
    }
}

/// A deliberate error in the model's queue rules, to show the comparison catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mutant {
    /// Claim-next serves in enqueue order only.
    IgnorePriority,
    /// Claim-next does not wait for a task's delay.
    IgnoreDelay,
    /// A claim lapses only after its session's deadline, not at it.
    LapseLate,
    /// A release counts the attempt.
    ReleaseCountsAttempt,
    /// A dead task leaves its dependents alone.
    NoCascade,
    /// A claim on an empty queue is recorded for idempotency.
    RecordEmptyClaims,
    /// Claims do not count against `leases_per_session_max`.
    ClaimsAreFree,
}

#[derive(Debug, Clone)]
struct Model {
    /// `None` for the faithful model.
    mutant: Option<Mutant>,
    limits: Limits,
    time_ms: u64,
    fence_counter: u64,
    /// Each namespace's last revision (each counts its own events).
    revisions: BTreeMap<Namespace, u64>,
    /// Every event ever recorded (the real machine keeps a window of them).
    events: Vec<Event>,
    sessions: Vec<ModelSession>,
    leases: Vec<ModelLease>,
    /// Every waiter, in arrival order.
    waiters: Vec<ModelWaiter>,
    values: Vec<ModelValue>,
    /// In enqueue order; done and dead ones are removed after their retention.
    tasks: Vec<ModelTask>,
    next_order: u64,
    /// Compensations owed by tasks that went dead in the command being applied.
    compensations: Vec<(Namespace, Compensation, u64)>,
    /// Oldest first.
    records: Vec<ModelRecord>,
}

/// The segments of a path, by splitting on '/'.
fn segments(text: &str) -> Vec<&str> {
    text.split('/').collect()
}

/// Whether `outer` is `inner` or one of its ancestors, segment by segment.
fn covers_or_equals(outer: &str, inner: &str) -> bool {
    let (outer, inner) = (segments(outer), segments(inner));
    outer.len() <= inner.len() && outer.iter().zip(inner.iter()).all(|(a, b)| a == b)
}

/// G2: whether a `mode` lease on `wanted` conflicts with a `held_mode` lease on `held`.
fn conflicts(wanted: &str, mode: LeaseMode, held: &str, held_mode: LeaseMode) -> bool {
    // Shared holders of one path do not conflict with each other (their count and limit are
    // checked apart).
    let both_shared =
        matches!(mode, LeaseMode::Shared { .. }) && matches!(held_mode, LeaseMode::Shared { .. });
    (wanted == held && !both_shared)
        || (held_mode == LeaseMode::Subtree && covers_or_equals(held, wanted))
        || (mode == LeaseMode::Subtree && covers_or_equals(wanted, held))
}

impl Model {
    fn new(limits: Limits) -> Model {
        Model {
            mutant: None,
            limits,
            time_ms: 0,
            fence_counter: 0,
            revisions: BTreeMap::new(),
            events: Vec::new(),
            sessions: Vec::new(),
            leases: Vec::new(),
            waiters: Vec::new(),
            values: Vec::new(),
            tasks: Vec::new(),
            next_order: 0,
            compensations: Vec::new(),
            records: Vec::new(),
        }
    }

    fn apply(&mut self, batch: &Batch) -> Vec<Normalized> {
        let before_ms = self.time_ms;
        self.time_ms = self.time_ms.max(batch.stamp_ms);
        // G8: records older than the idempotency window are forgotten, oldest first.
        let (time_ms, ttl_ms) = (self.time_ms, self.limits.idempotency_ttl_ms);
        self.records
            .retain(|record| record.recorded_ms.saturating_add(ttl_ms) > time_ms);
        while self.records.len() > self.limits.idempotency_keys_max {
            self.records.remove(0);
        }
        self.lapse_dead_claims();
        self.enqueue_compensations();
        self.leave_dead_waiters(before_ms);
        self.serve();
        batch
            .commands
            .iter()
            .map(|command| self.command(command))
            .collect()
    }

    fn command(&mut self, command: &Command) -> Normalized {
        match command {
            Command::CreateToken(_)
            | Command::RevokeToken { .. }
            | Command::BootstrapToken { .. }
            | Command::Authorized { .. } => {
                unreachable!("the generated commands hold no access control (see tests.rs)")
            }
            Command::Sweep { max } => {
                let (leases, sessions, tasks) = self.sweep(*max as usize);
                self.serve();
                normalize_model(
                    &Ok(Reply::Swept {
                        leases,
                        sessions,
                        tasks,
                    }),
                    false,
                )
            }
            Command::SetLimits(limits) => {
                self.limits = limits.clone();
                normalize_model(&Ok(Reply::LimitsSet), false)
            }
            Command::Namespaced {
                namespace,
                idempotency,
                op,
            } => {
                // Mirrors the real order: the key's shape first, then the lookup, then the op.
                if let Some(tag) = idempotency {
                    if !self.valid_idempotency_key(&tag.key) {
                        return normalize_model(&Err(Refusal::Invalid), false);
                    }
                    if let Some(record) = self
                        .records
                        .iter()
                        .find(|record| record.namespace == *namespace && record.key == tag.key)
                    {
                        return if record.fingerprint == tag.fingerprint {
                            normalize_model(&Ok(record.reply.clone()), true)
                        } else {
                            normalize_model(&Err(Refusal::KeyReused), false)
                        };
                    }
                }
                let outcome = self.op(namespace, op);
                self.serve();
                self.enqueue_compensations();
                // G8: a claim on an empty queue, or a wait already in line, changed nothing
                // and is not recorded.
                if let (
                    Some(IdempotencyTag {
                        key, fingerprint, ..
                    }),
                    Ok(reply),
                ) = (idempotency, &outcome)
                {
                    let unchanged = *reply == Reply::QueueEmpty
                        || matches!(
                            reply,
                            Reply::Queued(Queued { joined: false, .. }) | Reply::StillGranted(_)
                        );
                    if unchanged && self.mutant != Some(Mutant::RecordEmptyClaims) {
                        return normalize_model(&outcome, false);
                    }
                    self.records.push(ModelRecord {
                        recorded_ms: self.time_ms,
                        namespace: namespace.clone(),
                        key: key.clone(),
                        fingerprint: *fingerprint,
                        reply: reply.clone(),
                    });
                    while self.records.len() > self.limits.idempotency_keys_max {
                        self.records.remove(0);
                    }
                }
                normalize_model(&outcome, false)
            }
        }
    }

    fn valid_idempotency_key(&self, key: &str) -> bool {
        let chars = key.chars().count();
        chars >= self.limits.idempotency_key_chars_min
            && chars <= self.limits.idempotency_key_chars_max
            && key.chars().all(|c| c.is_ascii_graphic())
    }

    fn op(&mut self, namespace: &Namespace, op: &Op) -> Result<Reply, Refusal> {
        match op {
            Op::CreateSession(new_session) => {
                self.check_new_session(namespace, new_session)?;
                self.insert_session(namespace, new_session);
                Ok(Reply::SessionCreated(SessionView {
                    session_id: new_session.session_id,
                    holder: new_session.holder.clone(),
                    ttl_ms: new_session.ttl_ms,
                    labels: new_session.labels.clone(),
                    expires_in_ms: new_session.ttl_ms,
                }))
            }
            Op::Keepalive { session_id } => {
                let index = self
                    .live_session(namespace, *session_id)
                    .ok_or(Refusal::LeaseLost)?;
                let session = &mut self.sessions[index];
                session.deadline_ms = self.time_ms + session.ttl_ms;
                Ok(Reply::KeptAlive {
                    session_id: *session_id,
                    expires_in_ms: session.ttl_ms,
                })
            }
            Op::Release {
                session_id,
                resource,
            } => {
                self.check_path(resource)?;
                self.live_session(namespace, *session_id)
                    .ok_or(Refusal::LeaseLost)?;
                let index = self
                    .holding_index(namespace, resource, *session_id)
                    .filter(|&index| self.is_live(index))
                    .ok_or(Refusal::LeaseLost)?;
                let fence = self.leases[index].fence;
                self.remove_lease(
                    index,
                    EventKind::Released {
                        resource: resource.clone(),
                        fence,
                    },
                );
                Ok(Reply::Released {
                    resource: resource.clone(),
                    fence,
                })
            }
            Op::EndSession { session_id } => {
                let session_index = self
                    .live_session(namespace, *session_id)
                    .ok_or(Refusal::NotFound)?;
                let mut held: Vec<ResourcePath> = self
                    .leases
                    .iter()
                    .filter(|lease| lease.namespace == *namespace && lease.session == *session_id)
                    .map(|lease| lease.resource.clone())
                    .collect();
                held.sort();
                let mut released = Vec::new();
                for resource in held {
                    let index = self
                        .holding_index(namespace, &resource, *session_id)
                        .expect("listed just above");
                    let fence = self.leases[index].fence;
                    if self.is_live(index) {
                        self.remove_lease(
                            index,
                            EventKind::Released {
                                resource: resource.clone(),
                                fence,
                            },
                        );
                        released.push(resource);
                    } else {
                        self.remove_lease(
                            index,
                            EventKind::Expired {
                                resource: resource.clone(),
                                fence,
                            },
                        );
                    }
                }
                // It leaves every line it waits in, in path order.
                let mut waits: Vec<ResourcePath> = self
                    .waiters
                    .iter()
                    .filter(|waiter| {
                        waiter.namespace == *namespace && waiter.session == *session_id
                    })
                    .map(|waiter| waiter.resource.clone())
                    .collect();
                waits.sort();
                for resource in waits {
                    self.leave(namespace, &resource, *session_id);
                }
                // Its claims lapse as if it had expired (each counted as an attempt).
                self.lapse_claims(namespace, *session_id);
                self.sessions.remove(session_index);
                Ok(Reply::SessionEnded { released })
            }
            Op::Acquire {
                resource,
                mode,
                owner,
                max_hold_ms,
                labels,
            } => self.acquire(namespace, resource, *mode, owner, *max_hold_ms, labels),
            Op::KvPut { key, value, fence } => {
                self.check_path(key)?;
                if value.len() > self.limits.kv_value_bytes_max {
                    return Err(Refusal::PayloadTooLarge);
                }
                self.check_fence(namespace, fence.as_ref())?;
                let existing = self
                    .values
                    .iter()
                    .position(|entry| entry.namespace == *namespace && entry.key == *key);
                let keys = self
                    .values
                    .iter()
                    .filter(|entry| entry.namespace == *namespace)
                    .count();
                if existing.is_none() && keys >= self.limits.kv_keys_per_namespace_max {
                    return Err(Refusal::Exhausted);
                }
                let revision = self.event(
                    namespace,
                    EventKind::KvWritten {
                        key: key.clone(),
                        fence: fence.as_ref().map(|claim| claim.fence),
                    },
                );
                match existing {
                    Some(index) => self.values[index].revision = revision,
                    None => self.values.push(ModelValue {
                        namespace: namespace.clone(),
                        key: key.clone(),
                        revision,
                    }),
                }
                Ok(Reply::KvWritten { revision })
            }
            Op::KvDelete { key, fence } => {
                self.check_path(key)?;
                self.check_fence(namespace, fence.as_ref())?;
                let index = self
                    .values
                    .iter()
                    .position(|entry| entry.namespace == *namespace && entry.key == *key)
                    .ok_or(Refusal::NotFound)?;
                self.values.remove(index);
                let revision = self.event(namespace, EventKind::KvDeleted { key: key.clone() });
                Ok(Reply::KvDeleted { revision })
            }
            Op::Enqueue { queue, task } => self.enqueue(namespace, queue, task),
            Op::Claim { queue, owner } => self.claim(namespace, queue, owner),
            Op::Complete {
                queue,
                task_id,
                claim,
                result,
            } => {
                // Mirrors the real order (admission, then the operation).
                self.check_complete_shape(queue, task_id, result.as_deref())?;
                let index = self.check_task_claim(namespace, queue, task_id, claim)?;
                self.tasks[index].finished_ms = Some(self.time_ms);
                self.tasks[index].life = ModelLife::Done {
                    result: result.clone(),
                };
                self.event(
                    namespace,
                    EventKind::TaskCompleted {
                        queue: queue.clone(),
                        task_id: task_id.clone(),
                        fence: claim.fence,
                    },
                );
                Ok(Reply::TaskUpdated(self.task_view(index)))
            }
            Op::Fail {
                queue,
                task_id,
                claim,
                reason,
                retry,
            } => {
                // Mirrors the real order: the names, the reason's length, then the claim.
                self.check_fail_shape(queue, task_id, reason)?;
                let index = self.check_task_claim(namespace, queue, task_id, claim)?;
                let task = &self.tasks[index];
                let retried = *retry && task.attempt < task.max_attempts;
                self.event(
                    namespace,
                    EventKind::TaskFailed {
                        queue: queue.clone(),
                        task_id: task_id.clone(),
                        fence: claim.fence,
                        retry: retried,
                    },
                );
                if retried {
                    self.tasks[index].life = ModelLife::Ready;
                    self.tasks[index].last_failure = Some(reason.clone());
                } else {
                    self.kill(index, reason.clone());
                }
                Ok(Reply::TaskUpdated(self.task_view(index)))
            }
            Op::ReleaseTask {
                queue,
                task_id,
                claim,
                note,
            } => {
                // Mirrors the real order: the names, the note's length, then the claim.
                self.check_name(queue)?;
                self.check_name(task_id)?;
                if let Some(note) = note {
                    self.check_text(note)?;
                }
                let index = self.check_task_claim(namespace, queue, task_id, claim)?;
                let task = &mut self.tasks[index];
                task.life = ModelLife::Ready;
                if self.mutant != Some(Mutant::ReleaseCountsAttempt) {
                    task.attempt -= 1;
                }
                if note.is_some() {
                    task.note = note.clone();
                }
                self.event(
                    namespace,
                    EventKind::TaskReleased {
                        queue: queue.clone(),
                        task_id: task_id.clone(),
                        fence: claim.fence,
                    },
                );
                Ok(Reply::TaskUpdated(self.task_view(index)))
            }
            Op::Txn(txn) => self.txn(namespace, txn),
            Op::AcquireOrWait {
                resource,
                mode,
                owner,
                max_hold_ms,
                labels,
            } => self.acquire_or_wait(namespace, resource, *mode, owner, *max_hold_ms, labels),
            Op::LeaveOrRelease {
                session_id,
                resource,
            } => {
                self.check_path(resource)?;
                self.live_session(namespace, *session_id)
                    .ok_or(Refusal::LeaseLost)?;
                if self.position(namespace, resource, *session_id).is_some() {
                    self.leave(namespace, resource, *session_id);
                    return Ok(Reply::LeftLine {
                        resource: resource.clone(),
                    });
                }
                self.op(
                    namespace,
                    &Op::Release {
                        session_id: *session_id,
                        resource: resource.clone(),
                    },
                )
            }
        }
    }

    /// The naive transaction: admission of the whole transaction (its sizes, the session a
    /// fenced part needs, every op's shape), then the compares, then each op of the chosen list
    /// applied as the single operation it stands for, on a copy of the model kept only if all
    /// succeed. An op naming a key, a resource or a task an earlier op named is refused.
    fn txn(&mut self, namespace: &Namespace, txn: &Txn) -> Result<Reply, Refusal> {
        let all_ops = || txn.success.iter().chain(&txn.failure);
        if txn.compare.len() > self.limits.txn_ops_max
            || all_ops().count() > self.limits.txn_ops_max
        {
            return Err(Refusal::Invalid);
        }
        for compare in &txn.compare {
            match compare {
                Compare::Fence { resource: path, .. } | Compare::KvRevision { key: path, .. } => {
                    self.check_path(path)?
                }
            }
        }
        let fenced = txn
            .compare
            .iter()
            .any(|compare| matches!(compare, Compare::Fence { .. }))
            || all_ops().any(|op| {
                matches!(
                    op,
                    TxnOp::Release { .. } | TxnOp::CompleteTask { .. } | TxnOp::FailTask { .. }
                )
            });
        if fenced && txn.session_id.is_none() {
            return Err(Refusal::Invalid);
        }
        for op in all_ops() {
            self.check_txn_op_shape(op)?;
        }
        let session_id = txn.session_id.unwrap_or(SessionId(0));
        let succeeded = txn.compare.iter().all(|compare| match compare {
            Compare::Fence { resource, fence } => self
                .check_fence(
                    namespace,
                    Some(&ResourceFence {
                        resource: resource.clone(),
                        fence: *fence,
                        session_id,
                    }),
                )
                .is_ok(),
            Compare::KvRevision { key, revision } => {
                self.value_revision(namespace, key).unwrap_or(0) == *revision
            }
        });
        let ops = if succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        let before = self.clone();
        let mut named: Vec<String> = Vec::new();
        let mut results = Vec::new();
        for op in ops {
            let (thing, single) = match op {
                TxnOp::Put { key, value } => (
                    format!("key {key}"),
                    Op::KvPut {
                        key: key.clone(),
                        value: value.clone(),
                        fence: None,
                    },
                ),
                TxnOp::Delete { key } => (
                    format!("key {key}"),
                    Op::KvDelete {
                        key: key.clone(),
                        fence: None,
                    },
                ),
                TxnOp::Release { resource } => (
                    format!("resource {resource}"),
                    Op::Release {
                        session_id,
                        resource: resource.clone(),
                    },
                ),
                TxnOp::AddTask { queue, task } => (
                    format!("task {queue}/{}", task.task_id),
                    Op::Enqueue {
                        queue: queue.clone(),
                        task: task.clone(),
                    },
                ),
                TxnOp::CompleteTask {
                    queue,
                    task_id,
                    fence,
                    result,
                } => (
                    format!("task {queue}/{task_id}"),
                    Op::Complete {
                        queue: queue.clone(),
                        task_id: task_id.clone(),
                        claim: TaskFence {
                            session_id,
                            fence: *fence,
                        },
                        result: result.clone(),
                    },
                ),
                TxnOp::FailTask {
                    queue,
                    task_id,
                    fence,
                    reason,
                    retry,
                } => (
                    format!("task {queue}/{task_id}"),
                    Op::Fail {
                        queue: queue.clone(),
                        task_id: task_id.clone(),
                        claim: TaskFence {
                            session_id,
                            fence: *fence,
                        },
                        reason: reason.clone(),
                        retry: *retry,
                    },
                ),
            };
            let outcome = if named.contains(&thing) {
                Err(Refusal::Invalid)
            } else {
                named.push(thing);
                self.op(namespace, &single)
            };
            match outcome {
                Ok(reply) => results.push(reply),
                Err(refusal) => {
                    *self = before;
                    return Err(refusal);
                }
            }
        }
        Ok(Reply::TxnDone { succeeded, results })
    }

    /// A new task's admission, in the real order: names, payload size, attempts, delay, the
    /// number of dependencies as given (repeats counted), each dependency's name, then the
    /// compensation's queue, payload and attempts.
    fn check_task_shape(&self, queue: &Name, task: &TaskSpec) -> Result<(), Refusal> {
        self.check_name(queue)?;
        self.check_name(&task.task_id)?;
        if task.payload.len() > self.limits.task_payload_bytes_max {
            return Err(Refusal::PayloadTooLarge);
        }
        if task.max_attempts == 0 || task.max_attempts > self.limits.task_attempts_max {
            return Err(Refusal::Invalid);
        }
        if task.delay_ms > self.limits.task_delay_ms_max
            || task.depends_on.len() > self.limits.task_dependencies_max
        {
            return Err(Refusal::Invalid);
        }
        for dependency in &task.depends_on {
            self.check_name(dependency)?;
        }
        if let Some(compensation) = &task.on_dead {
            self.check_name(&compensation.queue)?;
            if compensation.payload.len() > self.limits.task_payload_bytes_max {
                return Err(Refusal::PayloadTooLarge);
            }
            if compensation.max_attempts == 0
                || compensation.max_attempts > self.limits.task_attempts_max
            {
                return Err(Refusal::Invalid);
            }
        }
        Ok(())
    }

    /// The shape checks of one transaction op, in the order the single operation makes them.
    fn check_txn_op_shape(&self, op: &TxnOp) -> Result<(), Refusal> {
        match op {
            TxnOp::Put { key, value } => {
                self.check_path(key)?;
                if value.len() > self.limits.kv_value_bytes_max {
                    return Err(Refusal::PayloadTooLarge);
                }
            }
            TxnOp::Delete { key } => self.check_path(key)?,
            TxnOp::Release { resource } => self.check_path(resource)?,
            TxnOp::AddTask { queue, task } => self.check_task_shape(queue, task)?,
            TxnOp::CompleteTask {
                queue,
                task_id,
                result,
                ..
            } => self.check_complete_shape(queue, task_id, result.as_deref())?,
            TxnOp::FailTask {
                queue,
                task_id,
                reason,
                ..
            } => self.check_fail_shape(queue, task_id, reason)?,
        }
        Ok(())
    }

    /// A complete's admission: the names, then the result's size.
    fn check_complete_shape(
        &self,
        queue: &Name,
        task_id: &Name,
        result: Option<&str>,
    ) -> Result<(), Refusal> {
        self.check_name(queue)?;
        self.check_name(task_id)?;
        if result.is_some_and(|result| result.len() > self.limits.task_payload_bytes_max) {
            return Err(Refusal::PayloadTooLarge);
        }
        Ok(())
    }

    /// A fail's admission: the names, then the reason's length.
    fn check_fail_shape(&self, queue: &Name, task_id: &Name, reason: &str) -> Result<(), Refusal> {
        self.check_name(queue)?;
        self.check_name(task_id)?;
        self.check_text(reason)
    }

    fn enqueue(
        &mut self,
        namespace: &Namespace,
        queue: &Name,
        task: &TaskSpec,
    ) -> Result<Reply, Refusal> {
        // Mirrors the real order: admission (`check_task_shape`), then a taken id, the queue's
        // quota, then each dependency's task.
        self.check_task_shape(queue, task)?;
        let TaskSpec {
            task_id,
            payload,
            priority,
            depends_on,
            max_attempts,
            delay_ms,
            on_dead,
        } = task;
        let (priority, max_attempts, delay_ms) = (*priority, *max_attempts, *delay_ms);
        if self.task_index(namespace, queue, task_id).is_some() {
            return Err(Refusal::Invalid);
        }
        let in_queue = self
            .tasks
            .iter()
            .filter(|task| task.namespace == *namespace && task.queue == *queue)
            .count();
        if in_queue >= self.limits.tasks_per_queue_max {
            return Err(Refusal::Exhausted);
        }
        let mut queues: Vec<&Name> = self
            .tasks
            .iter()
            .filter(|task| task.namespace == *namespace)
            .map(|task| &task.queue)
            .collect();
        queues.sort();
        queues.dedup();
        if in_queue == 0 && queues.len() >= self.limits.queues_per_namespace_max {
            return Err(Refusal::Exhausted);
        }
        let mut dependencies: Vec<Name> = depends_on.to_vec();
        dependencies.sort();
        dependencies.dedup();
        for dependency in &dependencies {
            let index = self
                .task_index(namespace, queue, dependency)
                .ok_or(Refusal::Invalid)?;
            if matches!(self.tasks[index].life, ModelLife::Dead { .. }) {
                return Err(Refusal::Invalid);
            }
        }
        let revision = self.event(
            namespace,
            EventKind::TaskEnqueued {
                queue: queue.clone(),
                task_id: task_id.clone(),
            },
        );
        let order = self.next_order;
        self.next_order += 1;
        let depends_on_orders = dependencies
            .iter()
            .map(|dependency| {
                let index = self
                    .task_index(namespace, queue, dependency)
                    .expect("checked above");
                self.tasks[index].order
            })
            .collect();
        self.tasks.push(ModelTask {
            namespace: namespace.clone(),
            queue: queue.clone(),
            id: task_id.clone(),
            payload: payload.to_owned(),
            priority,
            depends_on: dependencies,
            depends_on_orders,
            max_attempts,
            ready_at_ms: self.time_ms + delay_ms,
            order,
            enqueued_revision: revision,
            attempt: 0,
            life: ModelLife::Ready,
            note: None,
            last_failure: None,
            finished_ms: None,
            on_dead: on_dead.clone(),
        });
        Ok(Reply::TaskEnqueued(self.task_view(self.tasks.len() - 1)))
    }

    /// Enqueues what the tasks that went dead since the last call owe: `on-dead-R` (R the
    /// revision of the death, with `-2`, `-3`... while taken), past every limit.
    fn enqueue_compensations(&mut self) {
        for (namespace, compensation, revision) in std::mem::take(&mut self.compensations) {
            let base = format!("on-dead-{revision}");
            let mut id = common::name(&base);
            let mut suffix = 1;
            while self
                .task_index(&namespace, &compensation.queue, &id)
                .is_some()
            {
                suffix += 1;
                id = common::name(&format!("{base}-{suffix}"));
            }
            let enqueued_revision = self.event(
                &namespace,
                EventKind::TaskEnqueued {
                    queue: compensation.queue.clone(),
                    task_id: id.clone(),
                },
            );
            let order = self.next_order;
            self.next_order += 1;
            self.tasks.push(ModelTask {
                namespace,
                queue: compensation.queue,
                id,
                payload: compensation.payload,
                priority: 0,
                depends_on: Vec::new(),
                depends_on_orders: Vec::new(),
                max_attempts: compensation.max_attempts,
                ready_at_ms: self.time_ms,
                order,
                enqueued_revision,
                attempt: 0,
                life: ModelLife::Ready,
                note: None,
                last_failure: None,
                finished_ms: None,
                on_dead: None,
            });
        }
    }

    fn claim(
        &mut self,
        namespace: &Namespace,
        queue: &Name,
        owner: &Owner,
    ) -> Result<Reply, Refusal> {
        // Mirrors the real order: the queue's name, the owner (a full session is refused even
        // when the queue is empty), then the search.
        self.check_name(queue)?;
        match owner {
            Owner::Session(session_id) => {
                self.live_session(namespace, *session_id)
                    .ok_or(Refusal::LeaseLost)?;
                if self.held(namespace, *session_id) >= self.limits.leases_per_session_max {
                    return Err(Refusal::Exhausted);
                }
            }
            Owner::NewSession(new_session) => self.check_new_session(namespace, new_session)?,
        }
        // Claim-next: the best task that is ready now, by priority, then enqueue order.
        let best = (0..self.tasks.len())
            .filter(|&index| {
                self.tasks[index].namespace == *namespace
                    && self.tasks[index].queue == *queue
                    && self.is_claimable(index)
            })
            .max_by_key(|&index| {
                let priority = match self.mutant {
                    Some(Mutant::IgnorePriority) => 0,
                    _ => self.tasks[index].priority,
                };
                (priority, std::cmp::Reverse(self.tasks[index].order))
            });
        let Some(index) = best else {
            return Ok(Reply::QueueEmpty);
        };
        let (session_id, session_created) = match owner {
            Owner::Session(session_id) => (*session_id, false),
            Owner::NewSession(new_session) => {
                self.insert_session(namespace, new_session);
                (new_session.session_id, true)
            }
        };
        self.fence_counter += 1;
        let fence = self.fence_counter;
        let task = &mut self.tasks[index];
        task.attempt += 1;
        task.life = ModelLife::Claimed {
            session: session_id,
            fence,
        };
        let (task_id, attempt) = (task.id.clone(), task.attempt);
        self.event(
            namespace,
            EventKind::TaskClaimed {
                queue: queue.clone(),
                task_id,
                fence,
                attempt,
            },
        );
        let deadline_ms = self
            .session(namespace, session_id)
            .expect("the claimer exists")
            .deadline_ms;
        Ok(Reply::TaskClaimed(TaskClaimed {
            task: self.task_view(index),
            fence,
            attempt,
            session_id,
            session_created,
            expires_in_ms: deadline_ms - self.time_ms,
        }))
    }

    /// G4 for tasks: the task exists and its live claim has this fence and this session; a
    /// task that does not exist has no live claim (STALE_FENCE too).
    fn check_task_claim(
        &self,
        namespace: &Namespace,
        queue: &Name,
        task_id: &Name,
        claim: &TaskFence,
    ) -> Result<usize, Refusal> {
        self.check_name(queue)?;
        self.check_name(task_id)?;
        let index = self
            .task_index(namespace, queue, task_id)
            .ok_or(Refusal::StaleFence(None))?;
        match self.tasks[index].life {
            ModelLife::Claimed { session, fence } => {
                if fence == claim.fence && session == claim.session_id {
                    Ok(index)
                } else {
                    Err(Refusal::StaleFence(Some(fence)))
                }
            }
            _ => Err(Refusal::StaleFence(None)),
        }
    }

    /// At the start of an entry: every claim whose session's deadline has come lapses, the
    /// sessions taken by (deadline, namespace, id) like the real deadline index.
    fn lapse_dead_claims(&mut self) {
        loop {
            let due = self
                .sessions
                .iter()
                .filter(|session| match self.mutant {
                    Some(Mutant::LapseLate) => session.deadline_ms < self.time_ms,
                    _ => session.deadline_ms <= self.time_ms,
                })
                .filter(|session| self.held_claims(&session.namespace, session.id) > 0)
                .min_by(|a, b| {
                    (a.deadline_ms, &a.namespace, a.id).cmp(&(b.deadline_ms, &b.namespace, b.id))
                })
                .map(|session| (session.namespace.clone(), session.id));
            let Some((namespace, session_id)) = due else {
                break;
            };
            self.lapse_claims(&namespace, session_id);
        }
    }

    /// Every claim of the session lapses, in (queue, task id) order: an `expired` event, then
    /// the task is ready again, or dead (with its dependents) after its last attempt.
    fn lapse_claims(&mut self, namespace: &Namespace, session_id: SessionId) {
        let mut claimed: Vec<usize> = (0..self.tasks.len())
            .filter(|&index| {
                self.tasks[index].namespace == *namespace
                    && matches!(self.tasks[index].life, ModelLife::Claimed { session, .. } if session == session_id)
            })
            .collect();
        claimed.sort_by(|&a, &b| {
            (&self.tasks[a].queue, &self.tasks[a].id)
                .cmp(&(&self.tasks[b].queue, &self.tasks[b].id))
        });
        for index in claimed {
            let ModelLife::Claimed { fence, .. } = self.tasks[index].life else {
                continue;
            };
            let task = &self.tasks[index];
            let last_attempt = task.attempt >= task.max_attempts;
            let event = EventKind::TaskExpired {
                queue: task.queue.clone(),
                task_id: task.id.clone(),
                fence,
            };
            self.event(namespace, event);
            if last_attempt {
                self.kill(index, "its claim lapsed on the last attempt".to_owned());
            } else {
                self.tasks[index].life = ModelLife::Ready;
            }
        }
    }

    /// The task dies, and with it every task that depends on it, transitively. Mirrors the
    /// real order of the `dead` events: depth first, the latest-enqueued dependent first.
    fn kill(&mut self, index: usize, reason: String) {
        let mut doomed = vec![(index, reason)];
        while let Some((index, reason)) = doomed.pop() {
            if matches!(
                self.tasks[index].life,
                ModelLife::Done { .. } | ModelLife::Dead { .. }
            ) {
                continue;
            }
            self.tasks[index].life = ModelLife::Dead { reason };
            self.tasks[index].finished_ms = Some(self.time_ms);
            let task = &self.tasks[index];
            let (namespace, queue, id, order) = (
                task.namespace.clone(),
                task.queue.clone(),
                task.id.clone(),
                task.order,
            );
            let revision = self.event(
                &namespace,
                EventKind::TaskDead {
                    queue: queue.clone(),
                    task_id: id.clone(),
                },
            );
            if let Some(compensation) = self.tasks[index].on_dead.clone() {
                self.compensations
                    .push((namespace.clone(), compensation, revision));
            }
            let mut dependents: Vec<usize> = (0..self.tasks.len())
                .filter(|&other| self.tasks[other].depends_on_orders.contains(&order))
                .collect();
            dependents.sort_by_key(|&other| self.tasks[other].order);
            if self.mutant == Some(Mutant::NoCascade) {
                dependents.clear();
            }
            doomed.extend(
                dependents
                    .into_iter()
                    .map(|other| (other, format!("its dependency {id} is dead"))),
            );
        }
    }

    /// Mirrors the real order of admission: path, a shared limit, labels, max hold.
    fn check_acquire_shape(
        &self,
        resource: &ResourcePath,
        mode: LeaseMode,
        max_hold_ms: Option<u64>,
        labels: &Labels,
    ) -> Result<(), Refusal> {
        self.check_path(resource)?;
        if let LeaseMode::Shared { limit } = mode {
            if limit == 0 || limit > self.limits.shared_limit_max {
                return Err(Refusal::Invalid);
            }
        }
        self.check_labels(labels)?;
        if let Some(max_hold_ms) = max_hold_ms {
            if max_hold_ms == 0 || max_hold_ms > self.limits.max_hold_ms_max {
                return Err(Refusal::Invalid);
            }
        }
        Ok(())
    }

    /// The owner may take one more lease or place in line: a live session below the limit,
    /// or a new session the namespace has room for.
    fn check_owner(&self, namespace: &Namespace, owner: &Owner) -> Result<(), Refusal> {
        match owner {
            Owner::Session(session_id) => {
                self.live_session(namespace, *session_id)
                    .ok_or(Refusal::LeaseLost)?;
                // Counts every lease the session still has, dead (max hold) or alive, its
                // places in line and its task claims.
                if self.held(namespace, *session_id) >= self.limits.leases_per_session_max {
                    return Err(Refusal::Exhausted);
                }
                Ok(())
            }
            Owner::NewSession(new_session) => self.check_new_session(namespace, new_session),
        }
    }

    fn acquire(
        &mut self,
        namespace: &Namespace,
        resource: &ResourcePath,
        mode: LeaseMode,
        owner: &Owner,
        max_hold_ms: Option<u64>,
        labels: &Labels,
    ) -> Result<Reply, Refusal> {
        // Mirrors the real order: the shape, the owner, conflicts, then the line.
        self.check_acquire_shape(resource, mode, max_hold_ms, labels)?;
        self.check_owner(namespace, owner)?;
        let acting = match owner {
            Owner::Session(session_id) => Some(*session_id),
            Owner::NewSession(_) => None,
        };
        let dead_in_the_way = self.conflicts_for(namespace, resource, mode, acting)?;
        // Nobody overtakes the line.
        if let Some(&first) = self.line(namespace, resource).first() {
            let first = self.waiters[first].clone();
            match self.conflicts_for(namespace, resource, first.mode, Some(first.session)) {
                Err(Refusal::LeaseHeld(view)) => return Err(Refusal::LeaseHeld(view)),
                Err(_) => {
                    if let Some(&oldest) = self.live_on(namespace, resource).first() {
                        return Err(Refusal::LeaseHeld(self.view(oldest).expect("live")));
                    }
                }
                Ok(_) => {}
            }
        }
        self.clear(namespace, resource, dead_in_the_way);
        let (session_id, session_created) = match owner {
            Owner::Session(session_id) => (*session_id, false),
            Owner::NewSession(new_session) => {
                self.insert_session(namespace, new_session);
                (new_session.session_id, true)
            }
        };
        Ok(Reply::Granted(self.grant(
            namespace,
            resource,
            mode,
            session_id,
            session_created,
            max_hold_ms,
            labels,
        )))
    }

    /// G2, by pairs: the live lease that refuses a `mode` lease on `resource` for `acting`,
    /// else the dead leases the grant clears. Of several live conflicts the real machine
    /// reports the lease on the same path first, then the subtree ancestors from the root
    /// down, then the lease below in path order; the model sorts its candidates the same way.
    fn conflicts_for(
        &self,
        namespace: &Namespace,
        resource: &ResourcePath,
        mode: LeaseMode,
        acting: Option<SessionId>,
    ) -> Result<Vec<usize>, Refusal> {
        let mut live_conflicts: Vec<(u8, usize)> = Vec::new();
        let mut dead_in_the_way: Vec<usize> = Vec::new();
        for (index, lease) in self.leases.iter().enumerate() {
            if lease.namespace != *namespace
                || !conflicts(resource.as_str(), mode, lease.resource.as_str(), lease.mode)
            {
                continue;
            }
            let rank = if lease.resource == *resource {
                0
            } else if covers_or_equals(lease.resource.as_str(), resource.as_str()) {
                1
            } else {
                2
            };
            if self.is_live(index) {
                live_conflicts.push((rank, index));
            } else if rank != 1 {
                // A dead lease on the path or below a subtree request is cleared by the
                // grant; a dead ancestor is left for the sweeper.
                dead_in_the_way.push(index);
            }
        }
        live_conflicts.sort_by(|a, b| {
            (a.0, &self.leases[a.1].resource, self.leases[a.1].fence).cmp(&(
                b.0,
                &self.leases[b.1].resource,
                self.leases[b.1].fence,
            ))
        });
        // A shared acquire meets the path's other shared holders: the same limit, not its own
        // session again, and room left. Their dead ones are cleared like any dead lease.
        let mut shared_refusal = None;
        if let LeaseMode::Shared { limit } = mode {
            let live = self.live_on(namespace, resource);
            if let Some(&oldest) = live.first() {
                if self.leases[oldest].mode != mode {
                    shared_refusal = Some(Refusal::Invalid);
                } else if let Some(&own) = live
                    .iter()
                    .find(|&&index| Some(self.leases[index].session) == acting)
                {
                    shared_refusal = Some(Refusal::LeaseHeld(self.view(own).expect("live")));
                } else if live.len() >= limit as usize {
                    shared_refusal = Some(Refusal::LeaseHeld(self.view(oldest).expect("live")));
                }
            }
            dead_in_the_way.extend((0..self.leases.len()).filter(|&index| {
                let lease = &self.leases[index];
                lease.namespace == *namespace
                    && lease.resource == *resource
                    && matches!(lease.mode, LeaseMode::Shared { .. })
                    && !self.is_live(index)
            }));
        }
        match (live_conflicts.first(), shared_refusal) {
            (Some(&(rank, index)), refusal) if rank == 0 || refusal.is_none() => Err(
                Refusal::LeaseHeld(self.view(index).expect("a live lease has a view")),
            ),
            (_, Some(refusal)) => Err(refusal),
            _ => Ok(dead_in_the_way),
        }
    }

    /// Clears the dead leases in a grant's way, each with its `expired` event: the path
    /// itself, then the leases below in path order.
    fn clear(
        &mut self,
        namespace: &Namespace,
        resource: &ResourcePath,
        dead_in_the_way: Vec<usize>,
    ) {
        let mut dead: Vec<(bool, ResourcePath, u64)> = dead_in_the_way
            .iter()
            .map(|&index| {
                (
                    self.leases[index].resource != *resource,
                    self.leases[index].resource.clone(),
                    self.leases[index].fence,
                )
            })
            .collect();
        dead.sort();
        for (_, path, fence) in dead {
            let index = self
                .leases
                .iter()
                .position(|lease| {
                    lease.namespace == *namespace && lease.resource == path && lease.fence == fence
                })
                .expect("found above");
            self.remove_lease(
                index,
                EventKind::Expired {
                    resource: path.clone(),
                    fence,
                },
            );
        }
    }

    /// A new lease for the live `session_id` (out of the resource's line if it waited there).
    #[allow(clippy::too_many_arguments)]
    fn grant(
        &mut self,
        namespace: &Namespace,
        resource: &ResourcePath,
        mode: LeaseMode,
        session_id: SessionId,
        session_created: bool,
        max_hold_ms: Option<u64>,
        labels: &Labels,
    ) -> Grant {
        self.waiters.retain(|waiter| {
            !(waiter.namespace == *namespace
                && waiter.resource == *resource
                && waiter.session == session_id)
        });
        self.fence_counter += 1;
        let fence = self.fence_counter;
        self.leases.push(ModelLease {
            namespace: namespace.clone(),
            resource: resource.clone(),
            session: session_id,
            fence,
            mode,
            labels: labels.clone(),
            acquired_at_ms: self.time_ms,
            max_hold_deadline_ms: max_hold_ms.map(|max_hold_ms| self.time_ms + max_hold_ms),
        });
        let holder = self
            .session(namespace, session_id)
            .expect("the owner exists")
            .holder
            .clone();
        self.event(
            namespace,
            EventKind::Granted {
                resource: resource.clone(),
                holder,
                fence,
                mode,
            },
        );
        let view = self
            .view(self.leases.len() - 1)
            .expect("a fresh lease is live");
        Grant {
            lease: view,
            session_id,
            session_created,
        }
    }

    /// An acquire that waits: as `acquire`, but a refusal by holders (not by the session's
    /// own lease), or waiters ahead, puts it at the end of the line.
    fn acquire_or_wait(
        &mut self,
        namespace: &Namespace,
        resource: &ResourcePath,
        mode: LeaseMode,
        owner: &Owner,
        max_hold_ms: Option<u64>,
        labels: &Labels,
    ) -> Result<Reply, Refusal> {
        // Mirrors the real order: the shape, a live session, its place if it waits, the
        // owner's limits, then conflicts.
        self.check_acquire_shape(resource, mode, max_hold_ms, labels)?;
        let acting = match owner {
            Owner::Session(session_id) => {
                self.live_session(namespace, *session_id)
                    .ok_or(Refusal::LeaseLost)?;
                if let Some(position) = self.position(namespace, resource, *session_id) {
                    return Ok(Reply::Queued(Queued {
                        resource: resource.clone(),
                        session_id: *session_id,
                        session_created: false,
                        position,
                        joined: false,
                    }));
                }
                // Already granted this lease (from the line): that grant again.
                let held = self
                    .holding_index(namespace, resource, *session_id)
                    .and_then(|index| self.view(index))
                    .filter(|view| view.mode == mode);
                if let Some(lease) = held {
                    return Ok(Reply::StillGranted(Grant {
                        lease,
                        session_id: *session_id,
                        session_created: false,
                    }));
                }
                Some(*session_id)
            }
            Owner::NewSession(_) => None,
        };
        self.check_owner(namespace, owner)?;
        let ahead = self.line(namespace, resource).len() as u32;
        match self.conflicts_for(namespace, resource, mode, acting) {
            Ok(_) if ahead == 0 => {
                return self.acquire(namespace, resource, mode, owner, max_hold_ms, labels)
            }
            Ok(_) => {}
            Err(Refusal::LeaseHeld(view)) => {
                // Its own live lease on the path, else its own lease that refuses it, refuses
                // it.
                let own = acting.and_then(|session_id| {
                    let index = self.holding_index(namespace, resource, session_id)?;
                    self.view(index)
                });
                if let Some(own) = own {
                    return Err(Refusal::LeaseHeld(own));
                }
                let by_itself = self.leases.iter().any(|lease| {
                    lease.namespace == *namespace
                        && lease.fence == view.fence
                        && Some(lease.session) == acting
                });
                if by_itself {
                    return Err(Refusal::LeaseHeld(view));
                }
            }
            Err(refusal) => return Err(refusal),
        }
        let (session_id, session_created) = match owner {
            Owner::Session(session_id) => (*session_id, false),
            Owner::NewSession(new_session) => {
                self.insert_session(namespace, new_session);
                (new_session.session_id, true)
            }
        };
        self.waiters.push(ModelWaiter {
            namespace: namespace.clone(),
            resource: resource.clone(),
            session: session_id,
            mode,
            labels: labels.clone(),
            max_hold_ms,
        });
        let holder = self
            .session(namespace, session_id)
            .expect("the waiter's session exists")
            .holder
            .clone();
        self.event(
            namespace,
            EventKind::Queued {
                resource: resource.clone(),
                holder,
                mode,
            },
        );
        Ok(Reply::Queued(Queued {
            resource: resource.clone(),
            session_id,
            session_created,
            position: ahead + 1,
            joined: true,
        }))
    }

    /// The indexes of `resource`'s waiters, first come first.
    fn line(&self, namespace: &Namespace, resource: &ResourcePath) -> Vec<usize> {
        (0..self.waiters.len())
            .filter(|&index| {
                self.waiters[index].namespace == *namespace
                    && self.waiters[index].resource == *resource
            })
            .collect()
    }

    fn position(
        &self,
        namespace: &Namespace,
        resource: &ResourcePath,
        session_id: SessionId,
    ) -> Option<u32> {
        self.line(namespace, resource)
            .iter()
            .position(|&index| self.waiters[index].session == session_id)
            .map(|position| position as u32 + 1)
    }

    /// Takes a waiter out of its line, with its `left_line` event.
    fn leave(&mut self, namespace: &Namespace, resource: &ResourcePath, session_id: SessionId) {
        let index = self
            .waiters
            .iter()
            .position(|waiter| {
                waiter.namespace == *namespace
                    && waiter.resource == *resource
                    && waiter.session == session_id
            })
            .expect("the waiter is in line");
        self.waiters.remove(index);
        let holder = self
            .session(namespace, session_id)
            .expect("a waiter's session exists")
            .holder
            .clone();
        self.event(
            namespace,
            EventKind::LeftLine {
                resource: resource.clone(),
                holder,
            },
        );
    }

    /// The waiters whose session died since `before_ms` leave their lines, by (deadline,
    /// namespace, session, path).
    fn leave_dead_waiters(&mut self, before_ms: u64) {
        let mut dead: Vec<(u64, Namespace, SessionId, ResourcePath)> = self
            .waiters
            .iter()
            .filter_map(|waiter| {
                let deadline_ms = self.session(&waiter.namespace, waiter.session)?.deadline_ms;
                (before_ms < deadline_ms && deadline_ms <= self.time_ms).then(|| {
                    (
                        deadline_ms,
                        waiter.namespace.clone(),
                        waiter.session,
                        waiter.resource.clone(),
                    )
                })
            })
            .collect();
        dead.sort();
        for (_, namespace, session_id, resource) in dead {
            self.leave(&namespace, &resource, session_id);
        }
    }

    /// Grants every line's first waiter while it can be granted, lines in (namespace, path)
    /// order, until a whole pass grants nothing.
    fn serve(&mut self) {
        loop {
            let mut lines: Vec<(Namespace, ResourcePath)> = self
                .waiters
                .iter()
                .map(|waiter| (waiter.namespace.clone(), waiter.resource.clone()))
                .collect();
            lines.sort();
            lines.dedup();
            let mut granted = false;
            for (namespace, resource) in lines {
                while let Some(&first) = self.line(&namespace, &resource).first() {
                    let first = self.waiters[first].clone();
                    let Ok(dead) =
                        self.conflicts_for(&namespace, &resource, first.mode, Some(first.session))
                    else {
                        break;
                    };
                    self.clear(&namespace, &resource, dead);
                    self.grant(
                        &namespace,
                        &resource,
                        first.mode,
                        first.session,
                        false,
                        first.max_hold_ms,
                        &first.labels,
                    );
                    granted = true;
                }
            }
            if !granted {
                break;
            }
        }
    }

    /// G4: the claim must name the live lease on its resource, held by the claim's session.
    fn check_fence(
        &self,
        namespace: &Namespace,
        claim: Option<&ResourceFence>,
    ) -> Result<(), Refusal> {
        let Some(claim) = claim else { return Ok(()) };
        self.check_path(&claim.resource)?;
        // Of a shared lease's holders: the one with the claimed fence, else the claimant's
        // own, else the oldest.
        let live = self.live_on(namespace, &claim.resource);
        let judged = live
            .iter()
            .find(|&&index| self.leases[index].fence == claim.fence)
            .or_else(|| {
                live.iter()
                    .find(|&&index| self.leases[index].session == claim.session_id)
            })
            .or(live.first())
            .copied();
        match judged {
            None => Err(Refusal::StaleFence(None)),
            Some(index) => {
                let lease = &self.leases[index];
                if lease.fence == claim.fence && lease.session == claim.session_id {
                    Ok(())
                } else {
                    Err(Refusal::StaleFence(Some(lease.fence)))
                }
            }
        }
    }

    /// Mirrors the real sweep: expired sessions by (deadline, namespace, id), each one's leases
    /// in path order and then the session itself, each removal one unit of work; then leases
    /// past their max hold by (deadline, namespace, path).
    fn sweep(&mut self, max: usize) -> (u64, u64, u64) {
        let max = max.min(self.limits.sweep_batch_max);
        let (mut leases, mut sessions, mut work) = (0u64, 0u64, 0usize);
        while work < max {
            let expired = self
                .sessions
                .iter()
                .filter(|session| session.deadline_ms <= self.time_ms)
                .min_by(|a, b| {
                    (a.deadline_ms, &a.namespace, a.id).cmp(&(b.deadline_ms, &b.namespace, b.id))
                })
                .map(|session| (session.namespace.clone(), session.id));
            let Some((namespace, session_id)) = expired else {
                break;
            };
            let mut held: Vec<ResourcePath> = self
                .leases
                .iter()
                .filter(|lease| lease.namespace == namespace && lease.session == session_id)
                .map(|lease| lease.resource.clone())
                .collect();
            held.sort();
            held.truncate(max - work);
            for resource in held {
                let index = self
                    .holding_index(&namespace, &resource, session_id)
                    .expect("listed just above");
                let fence = self.leases[index].fence;
                self.remove_lease(index, EventKind::Expired { resource, fence });
                leases += 1;
                work += 1;
            }
            if !self
                .leases
                .iter()
                .any(|lease| lease.namespace == namespace && lease.session == session_id)
            {
                let index = self
                    .sessions
                    .iter()
                    .position(|session| session.namespace == namespace && session.id == session_id)
                    .expect("found above");
                self.sessions.remove(index);
                sessions += 1;
                work += 1;
            }
        }
        // Exclusive and subtree leases past their max hold first, then shared holds.
        for shared in [false, true] {
            while work < max {
                let over = self
                    .leases
                    .iter()
                    .filter(|lease| matches!(lease.mode, LeaseMode::Shared { .. }) == shared)
                    .filter_map(|lease| {
                        lease.max_hold_deadline_ms.map(|deadline| (deadline, lease))
                    })
                    .filter(|(deadline, _)| *deadline <= self.time_ms)
                    .min_by(|a, b| {
                        (a.0, &a.1.namespace, &a.1.resource, a.1.session).cmp(&(
                            b.0,
                            &b.1.namespace,
                            &b.1.resource,
                            b.1.session,
                        ))
                    })
                    .map(|(_, lease)| {
                        (
                            lease.namespace.clone(),
                            lease.resource.clone(),
                            lease.session,
                        )
                    });
                let Some((namespace, resource, session_id)) = over else {
                    break;
                };
                let index = self
                    .holding_index(&namespace, &resource, session_id)
                    .expect("found above");
                let fence = self.leases[index].fence;
                self.remove_lease(index, EventKind::Expired { resource, fence });
                leases += 1;
                work += 1;
            }
        }
        // Then done and dead tasks past their retention, by (finished, namespace, queue, id).
        let mut tasks = 0u64;
        while work < max {
            let retired = self
                .tasks
                .iter()
                .enumerate()
                .filter_map(|(index, task)| Some((task.finished_ms?, index)))
                .filter(|(finished_ms, _)| {
                    finished_ms.saturating_add(self.limits.task_retention_ms) <= self.time_ms
                })
                .min_by(|(a_ms, a), (b_ms, b)| {
                    let (a, b) = (&self.tasks[*a], &self.tasks[*b]);
                    (a_ms, &a.namespace, &a.queue, &a.id).cmp(&(
                        b_ms,
                        &b.namespace,
                        &b.queue,
                        &b.id,
                    ))
                })
                .map(|(_, index)| index);
            let Some(index) = retired else { break };
            self.tasks.remove(index);
            tasks += 1;
            work += 1;
        }
        (leases, sessions, tasks)
    }

    // ---- checks and helpers ----

    fn check_path(&self, path: &ResourcePath) -> Result<(), Refusal> {
        let text = path.as_str();
        let parts = segments(text);
        let valid = !text.is_empty()
            && text.len() <= self.limits.path_bytes_max
            && parts.iter().all(|part| !part.is_empty())
            && parts.len() <= self.limits.path_segments_max;
        if valid {
            Ok(())
        } else {
            Err(Refusal::Invalid)
        }
    }

    fn check_chars(text: &str, chars_max: usize) -> Result<(), Refusal> {
        let chars = text.chars().count();
        if chars == 0 || chars > chars_max {
            Err(Refusal::Invalid)
        } else {
            Ok(())
        }
    }

    /// A queue name or task id: 1..=`name_chars_max` of `[A-Za-z0-9._:-]`.
    fn check_name(&self, name: &Name) -> Result<(), Refusal> {
        let text = name.as_str();
        let valid = !text.is_empty()
            && text.len() <= self.limits.name_chars_max
            && text
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-_:".contains(c));
        if valid {
            Ok(())
        } else {
            Err(Refusal::Invalid)
        }
    }

    /// A reason or note: at most `task_text_chars_max` characters (empty is fine).
    fn check_text(&self, text: &str) -> Result<(), Refusal> {
        if text.chars().count() > self.limits.task_text_chars_max {
            Err(Refusal::Invalid)
        } else {
            Ok(())
        }
    }

    fn check_labels(&self, labels: &Labels) -> Result<(), Refusal> {
        if labels.len() > self.limits.labels_max {
            return Err(Refusal::Invalid);
        }
        for (key, value) in labels {
            Self::check_chars(key, self.limits.label_chars_max)?;
            Self::check_chars(value, self.limits.label_chars_max)?;
        }
        Ok(())
    }

    /// Mirrors the real order: holder, ttl, labels, the namespace's session quota (dead,
    /// unswept sessions count), then an id already in use (dead or alive).
    fn check_new_session(
        &self,
        namespace: &Namespace,
        new_session: &NewSession,
    ) -> Result<(), Refusal> {
        Self::check_chars(&new_session.holder, self.limits.holder_chars_max)?;
        if new_session.ttl_ms < self.limits.ttl_ms_min
            || new_session.ttl_ms > self.limits.ttl_ms_max
        {
            return Err(Refusal::Invalid);
        }
        self.check_labels(&new_session.labels)?;
        let in_namespace = self
            .sessions
            .iter()
            .filter(|session| session.namespace == *namespace)
            .count();
        if in_namespace >= self.limits.sessions_per_namespace_max {
            return Err(Refusal::Exhausted);
        }
        if self.session(namespace, new_session.session_id).is_some() {
            return Err(Refusal::Invalid);
        }
        Ok(())
    }

    fn insert_session(&mut self, namespace: &Namespace, new_session: &NewSession) {
        self.sessions.push(ModelSession {
            namespace: namespace.clone(),
            id: new_session.session_id,
            holder: new_session.holder.clone(),
            ttl_ms: new_session.ttl_ms,
            labels: new_session.labels.clone(),
            deadline_ms: self.time_ms + new_session.ttl_ms,
        });
    }

    fn session(&self, namespace: &Namespace, session_id: SessionId) -> Option<&ModelSession> {
        self.sessions
            .iter()
            .find(|session| session.namespace == *namespace && session.id == session_id)
    }

    /// The index of the session if it is alive now.
    fn live_session(&self, namespace: &Namespace, session_id: SessionId) -> Option<usize> {
        self.sessions.iter().position(|session| {
            session.namespace == *namespace
                && session.id == session_id
                && self.time_ms < session.deadline_ms
        })
    }

    /// What counts against `leases_per_session_max`: leases (dead or alive), places in line
    /// and task claims.
    fn held(&self, namespace: &Namespace, session_id: SessionId) -> usize {
        let leases = self
            .leases
            .iter()
            .filter(|lease| lease.namespace == *namespace && lease.session == session_id)
            .count();
        let waits = self
            .waiters
            .iter()
            .filter(|waiter| waiter.namespace == *namespace && waiter.session == session_id)
            .count();
        if self.mutant == Some(Mutant::ClaimsAreFree) {
            return leases + waits;
        }
        leases + waits + self.held_claims(namespace, session_id)
    }

    fn held_claims(&self, namespace: &Namespace, session_id: SessionId) -> usize {
        self.tasks
            .iter()
            .filter(|task| {
                task.namespace == *namespace
                    && matches!(task.life, ModelLife::Claimed { session, .. } if session == session_id)
            })
            .count()
    }

    fn task_index(&self, namespace: &Namespace, queue: &Name, task_id: &Name) -> Option<usize> {
        self.tasks.iter().position(|task| {
            task.namespace == *namespace && task.queue == *queue && task.id == *task_id
        })
    }

    /// How many of the task's dependencies are not done yet.
    /// The dependencies not done yet: those still here and not done (retention removes only
    /// finished tasks, and a dead one kills its dependents, so a missing one was done); none
    /// once the task itself is finished.
    fn waiting_on(&self, index: usize) -> u32 {
        let task = &self.tasks[index];
        if task.finished_ms.is_some() {
            return 0;
        }
        task.depends_on_orders
            .iter()
            .filter(|order| {
                self.tasks.iter().any(|other| {
                    other.order == **order && !matches!(other.life, ModelLife::Done { .. })
                })
            })
            .count() as u32
    }

    /// Ready, every dependency done, and its time has come.
    fn is_claimable(&self, index: usize) -> bool {
        let task = &self.tasks[index];
        task.life == ModelLife::Ready
            && (task.ready_at_ms <= self.time_ms || self.mutant == Some(Mutant::IgnoreDelay))
            && self.waiting_on(index) == 0
    }

    /// The lease `session_id` holds on `resource`, dead or alive.
    fn holding_index(
        &self,
        namespace: &Namespace,
        resource: &ResourcePath,
        session_id: SessionId,
    ) -> Option<usize> {
        self.leases.iter().position(|lease| {
            lease.namespace == *namespace
                && lease.resource == *resource
                && lease.session == session_id
        })
    }

    /// The live leases on exactly `resource`, oldest grant first (several only when shared).
    fn live_on(&self, namespace: &Namespace, resource: &ResourcePath) -> Vec<usize> {
        let mut live: Vec<usize> = (0..self.leases.len())
            .filter(|&index| {
                self.leases[index].namespace == *namespace
                    && self.leases[index].resource == *resource
                    && self.is_live(index)
            })
            .collect();
        live.sort_by_key(|&index| self.leases[index].fence);
        live
    }

    /// When the lease dies: its session's deadline or its max hold, whichever comes first.
    fn deadline(&self, index: usize) -> u64 {
        let lease = &self.leases[index];
        let session_deadline = self
            .session(&lease.namespace, lease.session)
            .map_or(0, |session| session.deadline_ms);
        lease
            .max_hold_deadline_ms
            .map_or(session_deadline, |max_hold| max_hold.min(session_deadline))
    }

    fn is_live(&self, index: usize) -> bool {
        self.time_ms < self.deadline(index)
    }

    fn view(&self, index: usize) -> Option<LeaseView> {
        if !self.is_live(index) {
            return None;
        }
        let lease = &self.leases[index];
        let session = self.session(&lease.namespace, lease.session)?;
        Some(LeaseView {
            resource: lease.resource.clone(),
            fence: lease.fence,
            holder: session.holder.clone(),
            mode: lease.mode,
            labels: lease.labels.clone(),
            acquired_at_ms: lease.acquired_at_ms,
            max_hold_ms: lease
                .max_hold_deadline_ms
                .map(|deadline| deadline - lease.acquired_at_ms),
            expires_in_ms: self.deadline(index) - self.time_ms,
        })
    }

    fn remove_lease(&mut self, index: usize, event: EventKind) {
        let lease = self.leases.remove(index);
        self.event(&lease.namespace, event);
    }

    fn event(&mut self, namespace: &Namespace, kind: EventKind) -> u64 {
        let revision = self.revisions.entry(namespace.clone()).or_default();
        *revision += 1;
        let revision = *revision;
        self.events.push(Event {
            revision,
            time_ms: self.time_ms,
            namespace: namespace.clone(),
            kind,
            // The model's commands are never made with a token.
            by: None,
        });
        revision
    }

    // ---- the observable state ----

    fn lease(&self, namespace: &Namespace, resource: &ResourcePath) -> Option<LeaseView> {
        self.view(*self.live_on(namespace, resource).first()?)
    }

    fn live_leases(&self, namespace: &Namespace) -> Vec<LeaseView> {
        let mut views: Vec<LeaseView> = (0..self.leases.len())
            .filter(|&index| self.leases[index].namespace == *namespace)
            .filter_map(|index| self.view(index))
            .collect();
        views.sort_by(|a, b| (&a.resource, a.fence).cmp(&(&b.resource, b.fence)));
        views
    }

    fn session_view(
        &self,
        namespace: &Namespace,
        session_id: SessionId,
    ) -> Option<(SessionView, Vec<LeaseView>)> {
        let session = self
            .session(namespace, session_id)
            .filter(|session| self.time_ms < session.deadline_ms)?;
        let mut leases: Vec<LeaseView> = (0..self.leases.len())
            .filter(|&index| {
                self.leases[index].namespace == *namespace
                    && self.leases[index].session == session_id
            })
            .filter_map(|index| self.view(index))
            .collect();
        leases.sort_by(|a, b| a.resource.cmp(&b.resource));
        let view = SessionView {
            session_id,
            holder: session.holder.clone(),
            ttl_ms: session.ttl_ms,
            labels: session.labels.clone(),
            expires_in_ms: session.deadline_ms - self.time_ms,
        };
        Some((view, leases))
    }

    fn task_view(&self, index: usize) -> TaskView {
        let task = &self.tasks[index];
        let (state, result, reason, claim) = match &task.life {
            ModelLife::Ready => {
                let state = if self.is_claimable(index) {
                    TaskState::Ready
                } else {
                    TaskState::Waiting
                };
                (state, None, task.last_failure.clone(), None)
            }
            ModelLife::Claimed { session, fence } => {
                let holder = self
                    .session(&task.namespace, *session)
                    .expect("a claimer lives until its claims lapse")
                    .holder
                    .clone();
                let reason = task.last_failure.clone();
                (TaskState::Claimed, None, reason, Some((*fence, holder)))
            }
            ModelLife::Done { result } => (TaskState::Done, result.clone(), None, None),
            ModelLife::Dead { reason } => (TaskState::Dead, None, Some(reason.clone()), None),
        };
        TaskView {
            queue: task.queue.clone(),
            id: task.id.clone(),
            payload: task.payload.clone(),
            priority: task.priority,
            depends_on: task.depends_on.clone(),
            state,
            attempt: task.attempt,
            max_attempts: task.max_attempts,
            ready_at_ms: task.ready_at_ms,
            waiting_on: self.waiting_on(index),
            note: task.note.clone(),
            result,
            reason,
            claim,
            enqueued_revision: task.enqueued_revision,
            on_dead: task.on_dead.clone(),
        }
    }

    fn task(&self, namespace: &Namespace, queue: &Name, task_id: &Name) -> Option<TaskView> {
        Some(self.task_view(self.task_index(namespace, queue, task_id)?))
    }

    /// The queue's tasks in id order, optionally only those in `state`.
    fn tasks_in(
        &self,
        namespace: &Namespace,
        queue: &Name,
        state: Option<TaskState>,
    ) -> Vec<TaskView> {
        let mut views: Vec<TaskView> = (0..self.tasks.len())
            .filter(|&index| {
                self.tasks[index].namespace == *namespace && self.tasks[index].queue == *queue
            })
            .map(|index| self.task_view(index))
            .filter(|view| state.is_none_or(|state| view.state == state))
            .collect();
        views.sort_by(|a, b| a.id.cmp(&b.id));
        views
    }

    fn queue_counts(&self, namespace: &Namespace, queue: &Name) -> TaskCounts {
        let mut counts = TaskCounts::default();
        for view in self.tasks_in(namespace, queue, None) {
            match view.state {
                TaskState::Ready => counts.ready += 1,
                TaskState::Waiting => counts.waiting += 1,
                TaskState::Claimed => counts.claimed += 1,
                TaskState::Done => counts.done += 1,
                TaskState::Dead => counts.dead += 1,
            }
        }
        counts
    }

    fn value_revision(&self, namespace: &Namespace, key: &ResourcePath) -> Option<u64> {
        self.values
            .iter()
            .find(|entry| entry.namespace == *namespace && entry.key == *key)
            .map(|entry| entry.revision)
    }
}

// ---- the comparison ----

fn compare(scenario: &common::Scenario) -> Result<(), TestCaseError> {
    let mut machine = Machine::new(scenario.limits());
    let mut model = Model::new(scenario.limits());
    let mut claimers = common::Claimers::default();
    for (index, entry) in scenario.entries.iter().enumerate() {
        let batch = entry.materialize(&machine, &claimers);
        let responses = apply_both(&mut machine, &mut model, index, &batch)?;
        claimers.observe(&batch, &responses);
    }
    Ok(())
}

/// Applies one entry to the machine and the model and compares the answers and everything
/// observable: time, fence counter, revision, new events, leases, values, sessions, and every
/// queue's counts, task views and task lists. Returns the machine's responses.
fn apply_both(
    machine: &mut Machine,
    model: &mut Model,
    index: usize,
    batch: &Batch,
) -> Result<Vec<Response>, TestCaseError> {
    let universe = common::universe();
    let events_before = model.events.len();
    let responses = machine.apply(batch);
    let real: Vec<Normalized> = responses.iter().map(normalize_real).collect();
    let expected = model.apply(batch);
    for (position, (real, expected)) in real.iter().zip(&expected).enumerate() {
        prop_assert_eq!(
            real,
            expected,
            "entry {} command {}: {:?}\nat time {}",
            index,
            position,
            &batch.commands[position],
            machine.time_ms()
        );
    }
    prop_assert_eq!(
        machine.time_ms(),
        model.time_ms,
        "entry {}: cluster time",
        index
    );
    prop_assert_eq!(
        machine.fence_counter(),
        model.fence_counter,
        "entry {}: fence counter",
        index
    );
    for namespace in universe.keys() {
        prop_assert_eq!(
            machine.revision(namespace),
            model.revisions.get(namespace).copied().unwrap_or(0),
            "entry {}: revision of {}",
            index,
            namespace
        );
    }
    prop_assert_eq!(
        machine.applied_events(),
        &model.events[events_before..],
        "entry {}: events",
        index
    );
    for (namespace, paths) in &universe {
        for resource in paths {
            prop_assert_eq!(
                machine.lease(namespace, resource),
                model.lease(namespace, resource),
                "entry {}: lease on {} in {}",
                index,
                resource,
                namespace
            );
            prop_assert_eq!(
                machine.waiters(namespace, resource),
                model
                    .line(namespace, resource)
                    .into_iter()
                    .map(|index| model.waiters[index].session)
                    .collect::<Vec<_>>(),
                "entry {}: line of {} in {}",
                index,
                resource,
                namespace
            );
            prop_assert_eq!(
                machine
                    .kv_get(namespace, resource)
                    .map(|value| value.revision),
                model.value_revision(namespace, resource),
                "entry {}: value under {}",
                index,
                resource
            );
        }
        let listed = machine.leases(namespace, "", None, 1_000).items;
        prop_assert_eq!(
            listed,
            model.live_leases(namespace),
            "entry {}: live leases in {}",
            index,
            namespace
        );
        for queue in common::queues() {
            prop_assert_eq!(
                machine.queue_counts(namespace, &queue),
                model.queue_counts(namespace, &queue),
                "entry {}: counts of queue {} in {}",
                index,
                queue,
                namespace
            );
            for task_id in common::task_ids() {
                prop_assert_eq!(
                    machine.task(namespace, &queue, &task_id),
                    model.task(namespace, &queue, &task_id),
                    "entry {}: task {}/{} in {}",
                    index,
                    queue,
                    task_id,
                    namespace
                );
            }
            let states = [
                None,
                Some(TaskState::Ready),
                Some(TaskState::Claimed),
                Some(TaskState::Done),
                Some(TaskState::Dead),
            ];
            for state in states {
                prop_assert_eq!(
                    machine.tasks(namespace, &queue, state, None, 1_000).items,
                    model.tasks_in(namespace, &queue, state),
                    "entry {}: tasks of {} in {} in state {:?}",
                    index,
                    queue,
                    namespace,
                    state
                );
            }
            // Paging: two at a time, each page continuing after the previous cursor.
            let mut paged = Vec::new();
            let mut cursor: Option<String> = None;
            let all = model.tasks_in(namespace, &queue, None);
            loop {
                let page = machine.tasks(namespace, &queue, None, cursor.as_deref(), 2);
                prop_assert!(page.items.len() <= 2);
                paged.extend(page.items);
                match page.next_cursor {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
                prop_assert!(paged.len() <= all.len(), "paging never ends");
            }
            prop_assert_eq!(
                paged,
                all,
                "entry {}: tasks of {} in {} paged by two",
                index,
                queue,
                namespace
            );
        }
        for id in 1..=common::SESSION_IDS_MAX.min(64) {
            prop_assert_eq!(
                machine
                    .session(namespace, SessionId(id), None, usize::MAX)
                    .map(|(view, page)| (view, page.items)),
                model.session_view(namespace, SessionId(id)),
                "entry {}: session {} in {}",
                index,
                id,
                namespace
            );
        }
    }
    Ok(responses)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: common::cases(256),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn machine_agrees_with_the_naive_model(scenario in common::scenario(30)) {
        compare(&scenario)?;
    }
}

/// The model's conflict rule against the table of docs/guarantees.md G2, so the model itself is checked.
#[test]
fn model_conflict_rule_follows_g2() {
    use LeaseMode::{Exclusive, Subtree};
    let table = [
        ("a/b", Exclusive, "a/b", Exclusive, true),
        ("a/b", Exclusive, "a", Subtree, true),
        ("a/b", Exclusive, "a/b", Subtree, true),
        ("a/b", Exclusive, "a", Exclusive, false),
        ("a/b", Exclusive, "a/b/c", Subtree, false),
        ("a", Subtree, "a/b/c", Exclusive, true),
        ("a", Subtree, "a", Exclusive, true),
        ("a/b", Subtree, "a", Subtree, true),
        ("a/b", Subtree, "a/bc", Exclusive, false),
        ("a", Subtree, "ab", Subtree, false),
        ("x", Subtree, "a", Subtree, false),
    ];
    for (wanted, mode, held, held_mode, expected) in table {
        assert_eq!(
            conflicts(wanted, mode, held, held_mode),
            expected,
            "{wanted} {mode:?} vs {held} {held_mode:?}"
        );
    }
}

/// A comparison must be able to fail: a model that grants a fence one too high is caught.
#[test]
fn comparison_catches_a_wrong_model() {
    let limits = Limits::default();
    let namespace = common::namespace(0);
    let batch = Batch {
        stamp_ms: 1_000,
        commands: vec![Command::Namespaced {
            namespace,
            idempotency: None,
            op: Op::Acquire {
                resource: common::path("a"),
                mode: LeaseMode::Exclusive,
                owner: Owner::NewSession(NewSession {
                    session_id: SessionId(1),
                    holder: "a".to_owned(),
                    ttl_ms: 1_000,
                    labels: Labels::new(),
                }),
                max_hold_ms: None,
                labels: Labels::new(),
            },
        }],
    };
    let mut machine = Machine::new(limits.clone());
    let mut model = Model::new(limits);
    model.fence_counter = 1;
    let real: Vec<Normalized> = machine.apply(&batch).iter().map(normalize_real).collect();
    assert_ne!(real, model.apply(&batch));
}

/// The queue comparison must be able to fail too: a short script that touches every queue rule
/// passes against the faithful model and is caught against each mutant.
#[test]
fn comparison_catches_a_wrong_queue_model() {
    use baton_machine::TaskFence;

    let limits = Limits {
        leases_per_session_max: 2,
        ..Limits::default()
    };
    let namespace = common::namespace(0);
    let on = |op: Op| Command::Namespaced {
        namespace: namespace.clone(),
        idempotency: None,
        op,
    };
    let tagged = |op: Op| Command::Namespaced {
        namespace: namespace.clone(),
        idempotency: Some(IdempotencyTag {
            key: common::IDEMPOTENCY_KEYS[0].to_owned(),
            fingerprint: common::FINGERPRINTS[0],
            wall_ms: 0,
        }),
        op,
    };
    let new_session = |id: u128| NewSession {
        session_id: SessionId(id),
        holder: "w".to_owned(),
        ttl_ms: 1_000,
        labels: Labels::new(),
    };
    let enqueue = |queue: &str,
                   id: &str,
                   priority: i32,
                   depends_on: &[&str],
                   max_attempts: u32,
                   delay_ms: u64| {
        on(Op::Enqueue {
            queue: common::name(queue),
            task: TaskSpec {
                task_id: common::name(id),
                payload: "{}".to_owned(),
                priority,
                depends_on: depends_on.iter().map(|id| common::name(id)).collect(),
                max_attempts,
                delay_ms,
                on_dead: None,
            },
        })
    };
    let claim = |queue: &str, owner: Owner| Op::Claim {
        queue: common::name(queue),
        owner,
    };
    let release = |id: &str, fence: u64| {
        on(Op::ReleaseTask {
            queue: common::name("q1"),
            task_id: common::name(id),
            claim: TaskFence {
                session_id: SessionId(1),
                fence,
            },
            note: None,
        })
    };
    let script = [
        Batch {
            stamp_ms: 1_000,
            commands: vec![
                on(Op::CreateSession(new_session(1))),
                enqueue("q1", "a", 0, &[], 1, 0),
                enqueue("q1", "b", 1, &["a"], 3, 0),
                enqueue("q1", "c", 2, &[], 3, 0),
                enqueue("q1", "later", 9, &[], 3, 500),
            ],
        },
        Batch {
            stamp_ms: 1_000,
            commands: vec![
                // c (priority 2) before a; "later" waits for its delay.
                on(claim("q1", Owner::Session(SessionId(1)))),
                release("c", 1),
                on(claim("q1", Owner::Session(SessionId(1)))),
                on(claim("q1", Owner::Session(SessionId(1)))),
                // Two claims fill a session of at most two.
                on(claim("q1", Owner::Session(SessionId(1)))),
            ],
        },
        // The session's deadline: both claims lapse; a (last attempt) dies, and b with it.
        Batch::tick(2_000),
        Batch {
            stamp_ms: 2_000,
            commands: vec![
                tagged(claim("q2", Owner::NewSession(new_session(2)))),
                enqueue("q2", "d", 0, &[], 3, 0),
                tagged(claim("q2", Owner::NewSession(new_session(2)))),
            ],
        },
    ];
    let run = |mutant: Option<Mutant>| -> Result<(), TestCaseError> {
        let mut machine = Machine::new(limits.clone());
        let mut model = Model::new(limits.clone());
        model.mutant = mutant;
        for (index, batch) in script.iter().enumerate() {
            apply_both(&mut machine, &mut model, index, batch)?;
        }
        Ok(())
    };
    run(None).expect("the faithful model agrees with the machine");
    let mutants = [
        Mutant::IgnorePriority,
        Mutant::IgnoreDelay,
        Mutant::LapseLate,
        Mutant::ReleaseCountsAttempt,
        Mutant::NoCascade,
        Mutant::RecordEmptyClaims,
        Mutant::ClaimsAreFree,
    ];
    for mutant in mutants {
        assert!(
            run(Some(mutant)).is_err(),
            "the comparison misses {mutant:?}"
        );
    }
}
