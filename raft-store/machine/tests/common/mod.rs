//! A generator of random log entries for the lease state machine, shared by `machine_props` and
//! `machine_model`.
//!
//! The universe is deliberately tiny (two namespaces, four session ids, three holders, eight
//! paths, two queues of six task ids) so that commands collide all the time: the same path is
//! acquired by two sessions, a subtree lands on top of an exclusive lease, a fence is presented
//! by the wrong session, a task is completed twice or by a worker whose claim lapsed, an
//! idempotency key is reused with another fingerprint. Stamps mostly rise, sometimes go back,
//! and sometimes jump past every TTL so that leases, sessions and task claims expire between
//! entries.
//!
//! The strategy produces `Scenario`s of abstract commands. Fence tokens, "the session that
//! holds this path", "a claimed task" and "its claimer" are resolved against the machine just
//! before each entry is applied (`Entry::materialize`), so they land near the live fences
//! instead of being random numbers. A task view never names its claimer's session (it is a
//! secret), so the claimers are learnt from the claim answers themselves: callers keep a
//! `Claimers` book and feed it every applied batch (`Claimers::observe`).

#![allow(dead_code)]

use std::collections::BTreeMap;

use baton_machine::{
    Batch, Command, Compare, Compensation, IdempotencyTag, Labels, LeaseMode, Limits, Machine,
    Name, Namespace, NewSession, Op, Owner, Reply, ResourceFence, ResourcePath, Response,
    SessionId, TaskFence, TaskSpec, TaskState, Txn, TxnOp,
};
use proptest::prelude::*;

/// The namespaces of the universe.
pub const NAMESPACES: [&str; 2] = ["ns-a", "ns-b"];
/// The largest session id a scenario creates (ids are handed out in order, see
/// `Scenario::resolve_sessions`).
pub const SESSION_IDS_MAX: u128 = 256;
/// The valid paths of the universe: nested, with `a/bc` and `ab` next to `a/b` and `a` so that
/// string prefixes that are not path prefixes are exercised.
pub const PATHS: [&str; 8] = ["a", "a/b", "a/bc", "a/b/c", "a/b/c/d", "ab", "x", "x/y"];
/// A path over the tight limits' segment count (valid under the default limits).
pub const DEEP_PATH: &str = "a/b/c/d/e";
/// Paths of the right shape that the default limits refuse: 520 bytes, over `path_bytes_max`
/// (512) and one segment over `path_segments_max` (32). Paths of the wrong shape cannot be
/// made at all, nor decoded from a log entry (`ResourcePath::new`).
pub const INVALID_PATHS: [&str; 2] = [LONG_PATH, WIDE_PATH];
const LONG_PATH: &str = concat!(
    "pppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppp",
    "pppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppp",
    "pppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppp",
    "pppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppp"
);
const WIDE_PATH: &str = "s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s";
/// Idempotency keys: three valid ones, one too short, one with a space (not printable ASCII).
pub const IDEMPOTENCY_KEYS: [&str; 5] = [
    "idem-key-0000000001",
    "idem-key-0000000002",
    "idem-key-0000000003",
    "short-key",
    "idem key with spaces",
];
/// The queues of the universe (in each namespace).
pub const QUEUES: [&str; 2] = ["q1", "q2"];
/// The task ids of the universe (in each queue).
pub const TASK_IDS: [&str; 6] = ["t0", "t1", "t2", "t3", "t4", "t5"];
/// A valid task id that is never enqueued: an unknown dependency or target.
pub const GHOST_TASK: &str = "ghost";
/// A queue name or task id of the right shape that the default limits refuse: one character
/// over `name_chars_max` (128). Names of the wrong shape cannot be made (`Name::new`).
pub const INVALID_NAMES: [&str; 1] = [LONG_NAME];
const LONG_NAME: &str = "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn";
/// A payload or result over the tight limits' `task_payload_bytes_max` (16).
pub const LONG_PAYLOAD: &str = "\"this payload is too long\"";
/// A reason or note over the tight limits' `task_text_chars_max` (8).
pub const LONG_TEXT: &str = "a reason that is too long";
/// Fingerprints; bytes 0xFD/0xFE are avoided so encodings stay clear of bincode's wide-length
/// markers (see `machine_props::decode_survives_*`).
pub const FINGERPRINTS: [[u8; 32]; 2] = [[0x11; 32], [0x22; 32]];

/// The default limits, or tight ones under which the quotas (`RESOURCE_EXHAUSTED`), the value
/// and payload sizes, the segment, dependency and text counts and the idempotency and event
/// windows are reached within a few commands.
pub fn limits_for(tight: bool) -> Limits {
    if !tight {
        return Limits::default();
    }
    Limits {
        path_segments_max: 4,
        holder_chars_max: 8,
        labels_max: 2,
        leases_per_session_max: 2,
        sessions_per_namespace_max: 3,
        kv_keys_per_namespace_max: 3,
        kv_value_bytes_max: 16,
        task_payload_bytes_max: 16,
        tasks_per_queue_max: 3,
        queues_per_namespace_max: 1,
        task_dependencies_max: 2,
        task_text_chars_max: 8,
        idempotency_ttl_ms: 10_000,
        idempotency_keys_max: 3,
        events_kept_max: 20,
        sweep_batch_max: 2,
        task_retention_ms: 500,
        shared_limit_max: 2,
        txn_ops_max: 3,
        ..Limits::default()
    }
}

pub fn namespace(index: usize) -> Namespace {
    Namespace::parse(NAMESPACES[index], &Limits::default()).expect("a valid namespace")
}

pub fn path(text: &str) -> ResourcePath {
    ResourcePath::parse(text, &Limits::default()).expect("a valid path")
}

/// A `ResourcePath` of the right shape but outside the limits' bounds, which only admission
/// refuses: this is how a test hands the machine one.
pub fn unchecked_path(text: &str) -> ResourcePath {
    ResourcePath::new(text).expect("a path of the right shape")
}

pub fn name(text: &str) -> Name {
    Name::parse("name", text, &Limits::default()).expect("a valid name")
}

/// A `Name` of the right shape but outside the limits' bounds (see `unchecked_path`).
pub fn unchecked_name(text: &str) -> Name {
    Name::new("name", text).expect("a name of the right shape")
}

/// The valid queues of the universe.
pub fn queues() -> Vec<Name> {
    QUEUES.iter().map(|text| name(text)).collect()
}

/// Every valid task id a scenario may name (the universe's and the ghost).
pub fn task_ids() -> Vec<Name> {
    TASK_IDS
        .iter()
        .chain([&GHOST_TASK])
        .map(|text| name(text))
        .collect()
}

/// Every path a scenario may name, valid and invalid.
pub fn all_paths() -> Vec<ResourcePath> {
    PATHS
        .iter()
        .chain([&DEEP_PATH])
        .map(|text| path(text))
        .collect()
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub tight: bool,
    pub entries: Vec<Entry>,
}

impl Scenario {
    pub fn limits(&self) -> Limits {
        limits_for(self.tight)
    }
}

#[derive(Debug, Clone)]
pub struct Entry {
    pub stamp_ms: u64,
    pub commands: Vec<AbstractCommand>,
}

// A generated scenario holds a few hundred commands: their size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum AbstractCommand {
    Namespaced {
        namespace: usize,
        tag: Option<(usize, usize)>,
        op: AbstractOp,
    },
    Sweep {
        max: u32,
    },
}

#[derive(Debug, Clone)]
pub enum AbstractOp {
    CreateSession(NewSession),
    Keepalive(SessionId),
    Release(SessionId, ReleaseChoice),
    EndSession(SessionId),
    /// `wait`: an acquire that waits in line (`Op::AcquireOrWait`).
    Acquire {
        resource: ResourcePath,
        mode: LeaseMode,
        owner: Owner,
        max_hold_ms: Option<u64>,
        labels: Labels,
        wait: bool,
    },
    /// Leaves a line, or releases (`Op::LeaveOrRelease`).
    Leave(SessionId, ReleaseChoice),
    KvPut {
        key: ResourcePath,
        value: String,
        fence: Option<AbstractFence>,
    },
    KvDelete {
        key: ResourcePath,
        fence: Option<AbstractFence>,
    },
    Enqueue {
        queue: Name,
        task_id: TaskChoice,
        payload: String,
        priority: i32,
        depends_on: Vec<TaskChoice>,
        max_attempts: u32,
        delay_ms: u64,
        on_dead: Option<Compensation>,
    },
    /// With `prefer_ready`, the claim goes to the other queue of its namespace when only that
    /// one has a task to claim; with `busy_worker`, it is made by a session of the namespace
    /// that already holds a claim, if there is one (a worker taking task after task).
    Claim {
        queue: Name,
        owner: Owner,
        prefer_ready: bool,
        busy_worker: bool,
    },
    /// Complete, fail or release a task with a claim resolved just before the entry.
    Finish {
        queue: Name,
        task: TaskChoice,
        claim: AbstractTaskClaim,
        how: Finish,
    },
    /// A transaction of the ops a transaction carries (unfenced puts and deletes, releases,
    /// enqueues, completes and fails). With `session`, the transaction acts for the first
    /// session its fenced parts resolve to (the holder of the fence or claim), else `session`.
    Txn {
        session: Option<SessionId>,
        compare: Vec<AbstractCompare>,
        success: Vec<AbstractOp>,
        failure: Vec<AbstractOp>,
    },
}

/// A transaction's compare, resolved just before the entry.
#[derive(Debug, Clone)]
pub enum AbstractCompare {
    Fence(AbstractFence),
    /// The key's revision now, or 0 (absent), or a revision it does not have.
    Kv {
        key: ResourcePath,
        revision: RevisionChoice,
    },
}

#[derive(Debug, Clone, Copy)]
pub enum RevisionChoice {
    Current,
    Absent,
    Other,
}

/// What a complete, fail or release carries besides the claim.
#[derive(Debug, Clone)]
pub enum Finish {
    Complete { result: Option<String> },
    Fail { reason: String, retry: bool },
    Release { note: Option<String> },
}

/// Which task an operation names, resolved right before the entry is applied.
#[derive(Debug, Clone)]
pub enum TaskChoice {
    /// The `n`th (modulo their number) task of the queue, in id order, whatever its state;
    /// the `n`th id of the universe when the queue is empty.
    Existing(usize),
    /// The `n`th (modulo their number) id of the universe that the queue does not hold yet;
    /// the `n`th id of the universe when it holds them all.
    Unused(usize),
    /// The `n`th (modulo their number) claimed task of the whole universe: the command moves
    /// to that task's namespace and queue. Like `Existing` when none is claimed.
    Claimed(usize),
    Id(Name),
}

/// The claim a complete, fail or release presents: like `AbstractFence`, for tasks.
#[derive(Debug, Clone)]
pub struct AbstractTaskClaim {
    pub token: TokenChoice,
    pub session: SessionChoice,
}

/// The claimers of task claims, learnt from the answers (task views hide them): fence →
/// session, per namespace.
#[derive(Debug, Clone, Default)]
pub struct Claimers {
    by_fence: BTreeMap<(Namespace, u64), SessionId>,
}

impl Claimers {
    /// Records the claimer of every claim granted by `batch` (answered by `responses`).
    pub fn observe(&mut self, batch: &Batch, responses: &[Response]) {
        for (command, response) in batch.commands.iter().zip(responses) {
            if let (Command::Namespaced { namespace, .. }, Ok(Reply::TaskClaimed(claimed))) =
                (command, &response.outcome)
            {
                self.by_fence
                    .insert((namespace.clone(), claimed.fence), claimed.session_id);
            }
        }
    }

    /// The session that was granted the claim with this fence.
    pub fn claimer(&self, namespace: &Namespace, fence: u64) -> Option<SessionId> {
        self.by_fence.get(&(namespace.clone(), fence)).copied()
    }
}

/// A fence claim, resolved against the machine's state right before the entry is applied.
#[derive(Debug, Clone)]
pub struct AbstractFence {
    pub resource: ResourcePath,
    pub token: TokenChoice,
    pub session: SessionChoice,
}

/// What a release names: a path the session holds (the `n`th, modulo their number, resolved
/// just before the entry), or any path.
#[derive(Debug, Clone)]
pub enum ReleaseChoice {
    Held(usize),
    Path(ResourcePath),
}

#[derive(Debug, Clone, Copy)]
pub enum TokenChoice {
    /// The live fence of the claimed resource or task (or the counter when there is none).
    Live,
    /// `fence_counter + offset`, clamped at 0: old tokens, and the next grants of this entry.
    CounterPlus(i64),
}

#[derive(Debug, Clone, Copy)]
pub enum SessionChoice {
    /// The session that holds the claimed resource or task, if one of the universe's ids does.
    Holder,
    Id(SessionId),
}

impl Entry {
    /// The concrete batch for `machine`'s current state, whose claimers `claimers` knows.
    pub fn materialize(&self, machine: &Machine, claimers: &Claimers) -> Batch {
        let commands = self
            .commands
            .iter()
            .map(|command| command.materialize(machine, claimers))
            .collect();
        Batch {
            stamp_ms: self.stamp_ms,
            commands,
        }
    }
}

impl AbstractCommand {
    fn materialize(&self, machine: &Machine, claimers: &Claimers) -> Command {
        match self {
            AbstractCommand::Sweep { max } => Command::Sweep { max: *max },
            AbstractCommand::Namespaced {
                namespace: index,
                tag,
                op,
            } => {
                let mut namespace = namespace(*index);
                let idempotency = tag.map(|(key, fingerprint)| IdempotencyTag {
                    key: IDEMPOTENCY_KEYS[key].to_owned(),
                    fingerprint: FINGERPRINTS[fingerprint],
                    wall_ms: 0,
                });
                let op = op.materialize(machine, claimers, &mut namespace);
                Command::Namespaced {
                    namespace,
                    idempotency,
                    op,
                }
            }
        }
    }
}

impl AbstractOp {
    /// The concrete op for `machine`'s current state; a task choice may move it to another
    /// namespace (`TaskChoice::Claimed`).
    fn materialize(&self, machine: &Machine, claimers: &Claimers, namespace: &mut Namespace) -> Op {
        match self {
            AbstractOp::CreateSession(new_session) => Op::CreateSession(new_session.clone()),
            AbstractOp::Keepalive(session_id) => Op::Keepalive {
                session_id: *session_id,
            },
            AbstractOp::Release(session_id, choice) | AbstractOp::Leave(session_id, choice) => {
                let resource = match choice {
                    ReleaseChoice::Path(resource) => resource.clone(),
                    // Leaving picks a line the session waits in, if any.
                    ReleaseChoice::Held(index)
                        if matches!(self, AbstractOp::Leave(..))
                            && !waited(machine, namespace, *session_id).is_empty() =>
                    {
                        let waits = waited(machine, namespace, *session_id);
                        waits[index % waits.len()].clone()
                    }
                    ReleaseChoice::Held(index) => {
                        match machine.session(namespace, *session_id, None, usize::MAX) {
                            Some((_, leases)) if !leases.items.is_empty() => {
                                leases.items[index % leases.items.len()].resource.clone()
                            }
                            _ => path(PATHS[index % PATHS.len()]),
                        }
                    }
                };
                match self {
                    AbstractOp::Leave(..) => Op::LeaveOrRelease {
                        session_id: *session_id,
                        resource,
                    },
                    _ => Op::Release {
                        session_id: *session_id,
                        resource,
                    },
                }
            }
            AbstractOp::EndSession(session_id) => Op::EndSession {
                session_id: *session_id,
            },
            AbstractOp::Acquire {
                resource,
                mode,
                owner,
                max_hold_ms,
                labels,
                wait: false,
            } => Op::Acquire {
                resource: resource.clone(),
                mode: *mode,
                owner: owner.clone(),
                max_hold_ms: *max_hold_ms,
                labels: labels.clone(),
            },
            AbstractOp::Acquire {
                resource,
                mode,
                owner,
                max_hold_ms,
                labels,
                wait: true,
            } => Op::AcquireOrWait {
                resource: resource.clone(),
                mode: *mode,
                owner: owner.clone(),
                max_hold_ms: *max_hold_ms,
                labels: labels.clone(),
            },
            AbstractOp::KvPut { key, value, fence } => Op::KvPut {
                key: key.clone(),
                value: value.clone(),
                fence: fence
                    .as_ref()
                    .map(|fence| fence.materialize(machine, namespace)),
            },
            AbstractOp::KvDelete { key, fence } => Op::KvDelete {
                key: key.clone(),
                fence: fence
                    .as_ref()
                    .map(|fence| fence.materialize(machine, namespace)),
            },
            AbstractOp::Enqueue {
                queue,
                task_id,
                payload,
                priority,
                depends_on,
                max_attempts,
                delay_ms,
                on_dead,
            } => Op::Enqueue {
                queue: queue.clone(),
                task: TaskSpec {
                    task_id: task_id.resolve_in(machine, namespace, queue),
                    payload: payload.clone(),
                    priority: *priority, // An existing task of an empty queue is no dependency at all.
                    depends_on: depends_on
                        .iter()
                        .filter(|choice| {
                            !matches!(choice, TaskChoice::Existing(_))
                                || !machine
                                    .tasks(namespace, queue, None, None, 1)
                                    .items
                                    .is_empty()
                        })
                        .map(|choice| choice.resolve_in(machine, namespace, queue))
                        .collect(),
                    max_attempts: *max_attempts,
                    delay_ms: *delay_ms,
                    on_dead: on_dead.clone(),
                },
            },
            AbstractOp::Claim {
                queue,
                owner,
                prefer_ready,
                busy_worker,
            } => {
                let has_work = |queue: &Name| {
                    machine
                        .tasks(namespace, queue, Some(TaskState::Ready), None, 1_000)
                        .items
                        .iter()
                        .any(|task| task.waiting_on == 0 && task.ready_at_ms <= machine.time_ms())
                };
                let queue = match queues().into_iter().find(|other| other != queue) {
                    Some(other) if *prefer_ready && !has_work(queue) && has_work(&other) => other,
                    _ => queue.clone(),
                };
                let worker = queues()
                    .iter()
                    .flat_map(|queue| {
                        machine
                            .tasks(namespace, queue, Some(TaskState::Claimed), None, 1_000)
                            .items
                    })
                    .filter_map(|task| task.claim)
                    .find_map(|(fence, _)| claimers.claimer(namespace, fence));
                let owner = match worker {
                    Some(session_id) if *busy_worker => Owner::Session(session_id),
                    _ => owner.clone(),
                };
                Op::Claim { queue, owner }
            }
            AbstractOp::Finish {
                queue,
                task,
                claim,
                how,
            } => {
                let mut queue = queue.clone();
                let task_id = task.resolve(machine, namespace, &mut queue);
                let claim = claim.materialize(machine, claimers, namespace, &queue, &task_id);
                match how {
                    Finish::Complete { result } => Op::Complete {
                        queue,
                        task_id,
                        claim,
                        result: result.clone(),
                    },
                    Finish::Fail { reason, retry } => Op::Fail {
                        queue,
                        task_id,
                        claim,
                        reason: reason.clone(),
                        retry: *retry,
                    },
                    Finish::Release { note } => Op::ReleaseTask {
                        queue,
                        task_id,
                        claim,
                        note: note.clone(),
                    },
                }
            }
            AbstractOp::Txn {
                session,
                compare,
                success,
                failure,
            } => {
                let mut acting = None;
                let mut compares = Vec::new();
                for choice in compare {
                    compares.push(match choice {
                        AbstractCompare::Fence(fence) => {
                            let fence = fence.materialize(machine, namespace);
                            acting.get_or_insert(fence.session_id);
                            Compare::Fence {
                                resource: fence.resource,
                                fence: fence.fence,
                            }
                        }
                        AbstractCompare::Kv { key, revision } => {
                            let current =
                                machine.kv_get(namespace, key).map_or(0, |kv| kv.revision);
                            Compare::KvRevision {
                                key: key.clone(),
                                revision: match revision {
                                    RevisionChoice::Current => current,
                                    RevisionChoice::Absent => 0,
                                    RevisionChoice::Other => current + 1,
                                },
                            }
                        }
                    });
                }
                let mut ops = |list: &[AbstractOp], acting: &mut Option<SessionId>| {
                    let mut ops = Vec::new();
                    for op in list {
                        let op = op.materialize(machine, claimers, namespace);
                        ops.extend(txn_op(op, acting));
                    }
                    ops
                };
                let success = ops(success, &mut acting);
                let failure = ops(failure, &mut acting);
                Op::Txn(Txn {
                    session_id: session.map(|session| acting.unwrap_or(session)),
                    compare: compares,
                    success,
                    failure,
                })
            }
        }
    }
}

/// The transaction op that `op` stands for, noting the session a fenced one acts for.
fn txn_op(op: Op, acting: &mut Option<SessionId>) -> Option<TxnOp> {
    Some(match op {
        Op::KvPut { key, value, .. } => TxnOp::Put { key, value },
        Op::KvDelete { key, .. } => TxnOp::Delete { key },
        Op::Release {
            session_id,
            resource,
        } => {
            acting.get_or_insert(session_id);
            TxnOp::Release { resource }
        }
        Op::Enqueue { queue, task } => TxnOp::AddTask { queue, task },
        Op::Complete {
            queue,
            task_id,
            claim,
            result,
        } => {
            acting.get_or_insert(claim.session_id);
            TxnOp::CompleteTask {
                queue,
                task_id,
                fence: claim.fence,
                result,
            }
        }
        Op::Fail {
            queue,
            task_id,
            claim,
            reason,
            retry,
        } => {
            acting.get_or_insert(claim.session_id);
            TxnOp::FailTask {
                queue,
                task_id,
                fence: claim.fence,
                reason,
                retry,
            }
        }
        _ => return None,
    })
}

impl AbstractFence {
    fn materialize(&self, machine: &Machine, namespace: &Namespace) -> ResourceFence {
        let counter = machine.fence_counter();
        let live = machine
            .lease(namespace, &self.resource)
            .map(|lease| lease.fence);
        let token = match self.token {
            TokenChoice::Live => live.unwrap_or(counter),
            TokenChoice::CounterPlus(offset) => counter.saturating_add_signed(offset),
        };
        let session_id = match self.session {
            SessionChoice::Id(session_id) => session_id,
            SessionChoice::Holder => (1..=SESSION_IDS_MAX)
                .map(SessionId)
                .find(|session_id| {
                    machine
                        .session(namespace, *session_id, None, usize::MAX)
                        .is_some_and(|(_, leases)| {
                            leases
                                .items
                                .iter()
                                .any(|lease| lease.resource == self.resource)
                        })
                })
                .unwrap_or(SessionId(1)),
        };
        ResourceFence {
            resource: self.resource.clone(),
            fence: token,
            session_id,
        }
    }
}

impl TaskChoice {
    /// The task id this choice names in `machine`, staying in `namespace` and `queue`.
    fn resolve_in(&self, machine: &Machine, namespace: &Namespace, queue: &Name) -> Name {
        self.resolve(machine, &mut namespace.clone(), &mut queue.clone())
    }

    /// The task id this choice names in `machine`; `Claimed` may move the command to the
    /// claimed task's namespace and queue.
    fn resolve(&self, machine: &Machine, namespace: &mut Namespace, queue: &mut Name) -> Name {
        match self {
            TaskChoice::Id(task_id) => task_id.clone(),
            TaskChoice::Unused(index) => {
                let unused: Vec<&str> = TASK_IDS
                    .iter()
                    .copied()
                    .filter(|id| machine.task(namespace, queue, &self::name(id)).is_none())
                    .collect();
                if unused.is_empty() {
                    name(TASK_IDS[index % TASK_IDS.len()])
                } else {
                    name(unused[index % unused.len()])
                }
            }
            TaskChoice::Existing(index) => {
                let tasks = machine.tasks(namespace, queue, None, None, 1_000).items;
                if tasks.is_empty() {
                    name(TASK_IDS[index % TASK_IDS.len()])
                } else {
                    tasks[index % tasks.len()].id.clone()
                }
            }
            TaskChoice::Claimed(index) => {
                let claimed: Vec<(Namespace, Name, Name)> = (0..NAMESPACES.len())
                    .map(self::namespace)
                    .flat_map(|namespace| {
                        queues().into_iter().flat_map(move |queue| {
                            let namespace = namespace.clone();
                            machine
                                .tasks(&namespace, &queue, Some(TaskState::Claimed), None, 1_000)
                                .items
                                .into_iter()
                                .map(move |task| (namespace.clone(), queue.clone(), task.id))
                        })
                    })
                    .collect();
                if claimed.is_empty() {
                    return TaskChoice::Existing(*index).resolve(machine, namespace, queue);
                }
                let (claimed_namespace, claimed_queue, task_id) =
                    claimed[index % claimed.len()].clone();
                *namespace = claimed_namespace;
                *queue = claimed_queue;
                task_id
            }
        }
    }
}

impl AbstractTaskClaim {
    fn materialize(
        &self,
        machine: &Machine,
        claimers: &Claimers,
        namespace: &Namespace,
        queue: &Name,
        task_id: &Name,
    ) -> TaskFence {
        let counter = machine.fence_counter();
        let live = machine
            .task(namespace, queue, task_id)
            .and_then(|task| task.claim)
            .map(|(fence, _)| fence);
        let fence = match self.token {
            TokenChoice::Live => live.unwrap_or(counter),
            TokenChoice::CounterPlus(offset) => counter.saturating_add_signed(offset),
        };
        let session_id = match self.session {
            SessionChoice::Id(session_id) => session_id,
            SessionChoice::Holder => live
                .and_then(|fence| claimers.claimer(namespace, fence))
                .unwrap_or(SessionId(1)),
        };
        TaskFence { session_id, fence }
    }
}

// ---- strategies ----

/// A session reference, as generated: `SessionId(1..=4)` is the 1st..4th most recently
/// created session, `SessionId(5)` the first session of the scenario, `SessionId(6)` one that
/// does not exist yet. `Scenario::resolve_sessions` turns them into real ids.
fn session_id() -> impl Strategy<Value = SessionId> {
    prop_oneof![8 => (1u128..=4).prop_map(SessionId), 1 => Just(SessionId(5)), 1 => Just(SessionId(6))]
}

/// A new session's id, as generated: `SessionId(0)` is a fresh id, anything else refers to an
/// existing session like `session_id()` (an id already in use).
fn new_session_id() -> impl Strategy<Value = SessionId> {
    prop_oneof![12 => Just(SessionId(0)), 1 => session_id()]
}

fn resource() -> impl Strategy<Value = ResourcePath> {
    prop_oneof![
        60 => proptest::sample::select(PATHS.to_vec()).prop_map(path),
        1 => Just(path(DEEP_PATH)),
        1 => proptest::sample::select(INVALID_PATHS.to_vec()).prop_map(unchecked_path),
    ]
}

fn waited_resource() -> impl Strategy<Value = ResourcePath> {
    prop_oneof![
        8 => proptest::sample::select(vec!["a", "a/b"]).prop_map(path),
        1 => resource(),
    ]
}

fn holder() -> impl Strategy<Value = String> {
    prop_oneof![
        60 => proptest::sample::select(vec!["a", "b", "c"]).prop_map(str::to_owned),
        1 => Just(String::new()),
        1 => Just("abcdefghij".to_owned()),
        1 => Just("h".repeat(129)),
    ]
}

fn ttl_ms() -> impl Strategy<Value = u64> {
    prop_oneof![
        40 => proptest::sample::select(vec![1_000u64, 2_000, 5_000]),
        1 => proptest::sample::select(vec![0u64, 999, 3_600_001, u64::MAX]),
    ]
}

fn max_hold_ms() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![
        24 => Just(None),
        8 => proptest::sample::select(vec![1_500u64, 3_000]).prop_map(Some),
        1 => proptest::sample::select(vec![0u64, 86_400_001, u64::MAX]).prop_map(Some),
    ]
}

fn labels() -> impl Strategy<Value = Labels> {
    let one = |key: &str, value: &str| Labels::from([(key.to_owned(), value.to_owned())]);
    let many = |count: usize| {
        (0..count)
            .map(|index| (format!("k{index:02}"), "v".to_owned()))
            .collect::<Labels>()
    };
    prop_oneof![
        40 => Just(Labels::new()),
        8 => Just(one("team", "x")),
        1 => Just(many(3)),
        1 => Just(many(17)),
        1 => Just(one("k", "")),
    ]
}

fn new_session() -> impl Strategy<Value = NewSession> {
    (new_session_id(), holder(), ttl_ms(), labels()).prop_map(
        |(session_id, holder, ttl_ms, labels)| NewSession {
            session_id,
            holder,
            ttl_ms,
            labels,
        },
    )
}

fn owner() -> impl Strategy<Value = Owner> {
    prop_oneof![
        3 => session_id().prop_map(Owner::Session),
        2 => new_session().prop_map(Owner::NewSession),
    ]
}

fn mode() -> impl Strategy<Value = LeaseMode> {
    prop_oneof![
        3 => Just(LeaseMode::Exclusive),
        2 => Just(LeaseMode::Subtree),
        3 => (0u32..=3).prop_map(|limit| LeaseMode::Shared { limit }),
    ]
}

fn fence() -> impl Strategy<Value = Option<AbstractFence>> {
    let token = prop_oneof![
        3 => Just(TokenChoice::Live),
        3 => (-3i64..=2).prop_map(TokenChoice::CounterPlus),
    ];
    let session = prop_oneof![
        3 => Just(SessionChoice::Holder),
        2 => session_id().prop_map(SessionChoice::Id),
    ];
    prop_oneof![
        2 => Just(None),
        3 => (resource(), token, session)
            .prop_map(|(resource, token, session)| Some(AbstractFence { resource, token, session })),
    ]
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => proptest::sample::select(vec!["1", "\"v\"", "{}"]).prop_map(str::to_owned),
        1 => Just("\"this value is too long\"".to_owned()),
    ]
}

fn release_choice() -> impl Strategy<Value = ReleaseChoice> {
    prop_oneof![3 => (0usize..8).prop_map(ReleaseChoice::Held), 1 => resource().prop_map(ReleaseChoice::Path)]
}

/// Mostly the first queue, so that work piles up where the claims look for it.
fn queue() -> impl Strategy<Value = Name> {
    prop_oneof![
        30 => Just(name(QUEUES[0])),
        10 => Just(name(QUEUES[1])),
        1 => proptest::sample::select(INVALID_NAMES.to_vec()).prop_map(unchecked_name),
    ]
}

/// Mostly an id the queue does not hold yet, sometimes any (perhaps taken), rarely invalid.
fn new_task_id() -> impl Strategy<Value = TaskChoice> {
    prop_oneof![
        30 => (0usize..6).prop_map(TaskChoice::Unused),
        10 => proptest::sample::select(TASK_IDS.to_vec()).prop_map(|id| TaskChoice::Id(name(id))),
        1 => proptest::sample::select(INVALID_NAMES.to_vec()).prop_map(|id| TaskChoice::Id(unchecked_name(id))),
    ]
}

/// A dependency: mostly a task that exists, sometimes any id of the universe, rarely an
/// unknown or invalid one.
fn dependency() -> impl Strategy<Value = TaskChoice> {
    prop_oneof![
        16 => (0usize..8).prop_map(TaskChoice::Existing),
        3 => proptest::sample::select(TASK_IDS.to_vec()).prop_map(|id| TaskChoice::Id(name(id))),
        1 => Just(TaskChoice::Id(name(GHOST_TASK))),
        1 => proptest::sample::select(INVALID_NAMES.to_vec()).prop_map(|id| TaskChoice::Id(unchecked_name(id))),
    ]
}

/// Mostly none; one or two (sometimes the same twice); rarely three, over the tight limit.
fn dependencies() -> BoxedStrategy<Vec<TaskChoice>> {
    prop_oneof![
        8 => Just(Vec::new()),
        6 => proptest::collection::vec(dependency(), 1..=2),
        1 => proptest::collection::vec(dependency(), 3..=3),
    ]
    .boxed()
}

fn payload() -> impl Strategy<Value = String> {
    prop_oneof![
        12 => proptest::sample::select(vec!["{}", "1", "\"p\""]).prop_map(str::to_owned),
        1 => Just(LONG_PAYLOAD.to_owned()),
    ]
}

fn max_attempts() -> impl Strategy<Value = u32> {
    prop_oneof![
        30 => 1u32..=3,
        1 => proptest::sample::select(vec![0u32, 101]),
    ]
}

fn delay_ms() -> impl Strategy<Value = u64> {
    prop_oneof![
        20 => Just(0u64),
        3 => Just(300u64),
        2 => Just(2_000u64),
        1 => proptest::sample::select(vec![30 * 24 * 60 * 60 * 1_000, 30 * 24 * 60 * 60 * 1_000 + 1]),
    ]
}

/// Mostly none; a compensation, sometimes to the other queue or with bad parts.
fn on_dead() -> impl Strategy<Value = Option<Compensation>> {
    prop_oneof![
        3 => Just(None),
        1 => (queue(), payload(), max_attempts()).prop_map(|(queue, payload, max_attempts)| {
            Some(Compensation { queue, payload, max_attempts })
        }),
    ]
}

fn enqueue() -> BoxedStrategy<AbstractOp> {
    (
        queue(),
        new_task_id(),
        payload(),
        -1i32..=2,
        dependencies(),
        max_attempts(),
        (delay_ms(), on_dead()),
    )
        .prop_map(
            |(queue, task_id, payload, priority, depends_on, max_attempts, (delay_ms, on_dead))| {
                AbstractOp::Enqueue {
                    queue,
                    task_id,
                    payload,
                    priority,
                    depends_on,
                    max_attempts,
                    delay_ms,
                    on_dead,
                }
            },
        )
        .boxed()
}

/// The target of a complete, fail or release: mostly a claimed task, sometimes any task of
/// the queue, rarely an unknown or invalid id.
fn finish_target() -> BoxedStrategy<TaskChoice> {
    prop_oneof![
        12 => (0usize..4).prop_map(TaskChoice::Claimed),
        4 => (0usize..8).prop_map(TaskChoice::Existing),
        1 => Just(TaskChoice::Id(name(GHOST_TASK))),
        1 => proptest::sample::select(INVALID_NAMES.to_vec()).prop_map(|id| TaskChoice::Id(unchecked_name(id))),
    ]
    .boxed()
}

fn task_claim() -> BoxedStrategy<AbstractTaskClaim> {
    let token = prop_oneof![
        8 => Just(TokenChoice::Live),
        2 => (-3i64..=1).prop_map(TokenChoice::CounterPlus),
    ];
    let session = prop_oneof![
        8 => Just(SessionChoice::Holder),
        1 => session_id().prop_map(SessionChoice::Id),
    ];
    (token, session)
        .prop_map(|(token, session)| AbstractTaskClaim { token, session })
        .boxed()
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        10 => Just("boom".to_owned()),
        2 => Just(String::new()),
        1 => Just(LONG_TEXT.to_owned()),
    ]
}

fn finish() -> BoxedStrategy<Finish> {
    let result = prop_oneof![
        4 => Just(None),
        4 => Just(Some("\"ok\"".to_owned())),
        1 => Just(Some(LONG_PAYLOAD.to_owned())),
    ];
    let note = prop_oneof![
        2 => Just(None),
        3 => Just(Some("half".to_owned())),
        1 => Just(Some(LONG_TEXT.to_owned())),
    ];
    prop_oneof![
        7 => result.prop_map(|result| Finish::Complete { result }),
        4 => (text(), any::<bool>()).prop_map(|(reason, retry)| Finish::Fail { reason, retry }),
        2 => note.prop_map(|note| Finish::Release { note }),
    ]
    .boxed()
}

/// A claimer: an existing session or, more often than for an acquire, a new one.
fn claim_owner() -> impl Strategy<Value = Owner> {
    prop_oneof![
        2 => session_id().prop_map(Owner::Session),
        3 => new_session().prop_map(Owner::NewSession),
    ]
}

/// An op a transaction carries (the finishing ones: complete or fail).
fn txn_inner_op() -> BoxedStrategy<AbstractOp> {
    let finish = finish().prop_filter("complete or fail", |how| {
        !matches!(how, Finish::Release { .. })
    });
    prop_oneof![
        3 => (resource(), value()).prop_map(|(key, value)| AbstractOp::KvPut { key, value, fence: None }),
        1 => resource().prop_map(|key| AbstractOp::KvDelete { key, fence: None }),
        2 => (session_id(), release_choice()).prop_map(|(session_id, choice)| AbstractOp::Release(session_id, choice)),
        3 => enqueue(),
        4 => (queue(), finish_target(), task_claim(), finish)
            .prop_map(|(queue, task, claim, how)| AbstractOp::Finish { queue, task, claim, how }),
    ]
    .boxed()
}

fn compare() -> BoxedStrategy<AbstractCompare> {
    let revision = prop_oneof![
        3 => Just(RevisionChoice::Current),
        2 => Just(RevisionChoice::Absent),
        1 => Just(RevisionChoice::Other),
    ];
    prop_oneof![
        2 => fence().prop_filter_map("a fence", |fence| fence.map(AbstractCompare::Fence)),
        2 => (resource(), revision).prop_map(|(key, revision)| AbstractCompare::Kv { key, revision }),
    ]
    .boxed()
}

fn txn() -> BoxedStrategy<AbstractOp> {
    (
        proptest::option::weighted(0.9, session_id()),
        proptest::collection::vec(compare(), 0..=2),
        proptest::collection::vec(txn_inner_op(), 0..=4),
        proptest::collection::vec(txn_inner_op(), 0..=2),
    )
        .prop_map(|(session, compare, success, failure)| AbstractOp::Txn {
            session,
            compare,
            success,
            failure,
        })
        .boxed()
}

fn queue_op() -> BoxedStrategy<AbstractOp> {
    prop_oneof![
        9 => enqueue(),
        6 => (queue(), claim_owner(), proptest::bool::weighted(0.8), proptest::bool::weighted(0.5))
            .prop_map(|(queue, owner, prefer_ready, busy_worker)| AbstractOp::Claim { queue, owner, prefer_ready, busy_worker }),
        9 => (queue(), finish_target(), task_claim(), finish())
            .prop_map(|(queue, task, claim, how)| AbstractOp::Finish { queue, task, claim, how }),
        5 => txn(),
    ]
    .boxed()
}

fn lease_op() -> BoxedStrategy<AbstractOp> {
    prop_oneof![
        3 => new_session().prop_map(AbstractOp::CreateSession),
        4 => session_id().prop_map(AbstractOp::Keepalive),
        4 => (session_id(), release_choice()).prop_map(|(session_id, choice)| AbstractOp::Release(session_id, choice)),
        1 => session_id().prop_map(AbstractOp::EndSession),
        10 => (resource(), mode(), owner(), max_hold_ms(), labels()).prop_map(
            |(resource, mode, owner, max_hold_ms, labels)| AbstractOp::Acquire { resource, mode, owner, max_hold_ms, labels, wait: false }
        ).boxed(),
        // Waits go mostly to a few paths, so that lines form behind holders.
        8 => (waited_resource(), mode(), owner(), max_hold_ms(), labels()).prop_map(
            |(resource, mode, owner, max_hold_ms, labels)| AbstractOp::Acquire { resource, mode, owner, max_hold_ms, labels, wait: true }
        ).boxed(),
        3 => (session_id(), release_choice()).prop_map(|(session_id, choice)| AbstractOp::Leave(session_id, choice)),
        3 => (resource(), value(), fence()).prop_map(|(key, value, fence)| AbstractOp::KvPut { key, value, fence }),
        2 => (resource(), fence()).prop_map(|(key, fence)| AbstractOp::KvDelete { key, fence }),
    ]
    .boxed()
}

fn idempotency_key() -> impl Strategy<Value = usize> {
    prop_oneof![12 => 0usize..3, 1 => 3usize..IDEMPOTENCY_KEYS.len()]
}

fn tag() -> impl Strategy<Value = Option<(usize, usize)>> {
    prop_oneof![
        6 => Just(None),
        1 => (idempotency_key(), 0..FINGERPRINTS.len()).prop_map(Some),
    ]
}

/// Queue operations happen mostly in the first namespace (a claim by an existing session moves
/// to that session's namespace), so that enqueued work meets claims.
fn queue_namespace() -> impl Strategy<Value = usize> {
    prop_oneof![4 => Just(0usize), 1 => Just(1usize)]
}

fn command() -> impl Strategy<Value = AbstractCommand> {
    prop_oneof![
        12 => (0..NAMESPACES.len(), tag(), lease_op())
            .prop_map(|(namespace, tag, op)| AbstractCommand::Namespaced { namespace, tag, op }),
        9 => (queue_namespace(), tag(), queue_op())
            .prop_map(|(namespace, tag, op)| AbstractCommand::Namespaced { namespace, tag, op }),
        2 => (0u32..4).prop_map(|max| AbstractCommand::Sweep { max }),
    ]
}

/// How the stamp moves between entries: a step forward, a step back (a stale stamp that must
/// not move time), a jump past the TTLs, or a jump past the idempotency window.
fn stamp_step() -> impl Strategy<Value = i64> {
    prop_oneof![
        40 => 0i64..400,
        8 => -3_000i64..0,
        6 => 1_000i64..7_000,
        1 => Just(90_000_000i64),
    ]
}

pub fn scenario(entries_max: usize) -> impl Strategy<Value = Scenario> {
    let entry = (stamp_step(), proptest::collection::vec(command(), 1..=8));
    (
        proptest::bool::weighted(0.35),
        proptest::collection::vec(entry, 1..=entries_max),
    )
        .prop_map(|(tight, steps)| {
            let mut stamp_ms: u64 = 1_000;
            let entries = steps
                .into_iter()
                .map(|(step, commands)| {
                    stamp_ms = stamp_ms.saturating_add_signed(step);
                    Entry { stamp_ms, commands }
                })
                .collect();
            let mut scenario = Scenario { tight, entries };
            scenario.resolve_sessions();
            scenario
        })
}

impl Scenario {
    /// Turns the generated session references into ids: new sessions get ids 1, 2, 3... in
    /// scenario order (whether or not their creation succeeds), references pick recent ones.
    fn resolve_sessions(&mut self) {
        /// The id a generated reference stands for, and whether it names a created session.
        fn reference(created: u128, generated: SessionId) -> (SessionId, bool) {
            match generated.0 {
                recent @ 1..=4 if created > 0 => {
                    (SessionId(created.saturating_sub(recent - 1).max(1)), true)
                }
                5 => (SessionId(1), false),
                _ => (SessionId((created + 1).min(SESSION_IDS_MAX)), false),
            }
        }
        let mut created: u128 = 0;
        // The namespace each created id was made in, so that references follow their session.
        let mut namespaces: BTreeMap<SessionId, usize> = BTreeMap::new();
        for entry in &mut self.entries {
            for command in &mut entry.commands {
                let AbstractCommand::Namespaced { namespace, op, .. } = command else {
                    continue;
                };
                let follow = |namespace: &mut usize, session_id: &mut SessionId| {
                    let (resolved, existing) = reference(created, *session_id);
                    *session_id = resolved;
                    if let (true, Some(home)) = (existing, namespaces.get(&resolved)) {
                        *namespace = *home;
                    }
                };
                match op {
                    AbstractOp::CreateSession(session)
                    | AbstractOp::Acquire {
                        owner: Owner::NewSession(session),
                        ..
                    }
                    | AbstractOp::Claim {
                        owner: Owner::NewSession(session),
                        ..
                    } => {
                        if session.session_id.0 == 0 {
                            created = (created + 1).min(SESSION_IDS_MAX);
                            session.session_id = SessionId(created);
                            namespaces.insert(session.session_id, *namespace);
                        } else {
                            follow(namespace, &mut session.session_id);
                        }
                    }
                    AbstractOp::Acquire {
                        owner: Owner::Session(session_id),
                        ..
                    }
                    | AbstractOp::Claim {
                        owner: Owner::Session(session_id),
                        ..
                    }
                    | AbstractOp::Keepalive(session_id)
                    | AbstractOp::Release(session_id, _)
                    | AbstractOp::Leave(session_id, _)
                    | AbstractOp::EndSession(session_id) => follow(namespace, session_id),
                    AbstractOp::KvPut { fence, .. } | AbstractOp::KvDelete { fence, .. } => {
                        if let Some(AbstractFence {
                            session: SessionChoice::Id(session_id),
                            ..
                        }) = fence
                        {
                            *session_id = reference(created, *session_id).0;
                        }
                    }
                    AbstractOp::Finish {
                        claim:
                            AbstractTaskClaim {
                                session: SessionChoice::Id(session_id),
                                ..
                            },
                        ..
                    } => *session_id = reference(created, *session_id).0,
                    AbstractOp::Txn {
                        session,
                        compare,
                        success,
                        failure,
                    } => {
                        if let Some(session_id) = session {
                            follow(namespace, session_id);
                        }
                        for choice in compare {
                            if let AbstractCompare::Fence(AbstractFence {
                                session: SessionChoice::Id(session_id),
                                ..
                            }) = choice
                            {
                                *session_id = reference(created, *session_id).0;
                            }
                        }
                        for op in success.iter_mut().chain(failure.iter_mut()) {
                            match op {
                                AbstractOp::Release(session_id, _)
                                | AbstractOp::Finish {
                                    claim:
                                        AbstractTaskClaim {
                                            session: SessionChoice::Id(session_id),
                                            ..
                                        },
                                    ..
                                } => *session_id = reference(created, *session_id).0,
                                _ => {}
                            }
                        }
                    }
                    AbstractOp::Enqueue { .. } | AbstractOp::Finish { .. } => {}
                }
            }
        }
    }
}

/// The paths whose line `session_id` waits in.
fn waited(machine: &Machine, namespace: &Namespace, session_id: SessionId) -> Vec<ResourcePath> {
    all_paths()
        .into_iter()
        .filter(|resource| {
            machine
                .line_position(namespace, resource, session_id)
                .is_some()
        })
        .collect()
}

/// The number of proptest cases: `PROPTEST_CASES` if set, else `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(default)
}

/// Paths keyed by namespace, for walking every `(namespace, path)` pair of the universe.
pub fn universe() -> BTreeMap<Namespace, Vec<ResourcePath>> {
    (0..NAMESPACES.len())
        .map(|index| (namespace(index), all_paths()))
        .collect()
}
