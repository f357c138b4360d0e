//! Work queues with leased claims: enqueue, claim-next, complete, fail, release, and the lapse
//! of claims whose session died.
//!
//! A claim is a lease on a task: it carries a fence from the cluster-wide counter and lives
//! exactly as long as its session. Claim-next picks the best ready task from an ordered index
//! (priority, then enqueue order) in O(log n). Two time-driven transitions happen at the start
//! of every entry, before its commands, so that every decision sees them at once: delayed tasks
//! whose time has come join the ready index, and the claims of sessions whose deadline has
//! passed lapse (the task is ready again, or dead after its last attempt). Both are found
//! through deadline-ordered indexes, so each costs O(log n) once per task.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use imbl::{OrdMap, OrdSet};

use serde::{Deserialize, Serialize};

use super::command::{
    Compensation, EventKind, NewSession, Owner, Rejection, Reply, TaskClaimed, TaskCounts,
    TaskFence, TaskSpec, TaskState, TaskView,
};
use super::legacy::{LifeV2, TaskV2};
use super::txn::Planned;
use super::{Machine, Name, Namespace, SessionId};

/// A compensation owed by a task that went dead in the command being applied (see
/// `Machine::enqueue_compensations`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PendingCompensation {
    namespace: Namespace,
    compensation: Compensation,
    /// The revision of the `TaskDead` event.
    revision: u64,
}

/// One queue: its tasks by id, plus indexes rebuilt on decode.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct QueueState {
    #[serde(with = "crate::imbl_serde::ord_map")]
    tasks: OrdMap<Name, Task>,
    /// The enqueue order; ties in priority are served first-in first-out.
    next_sequence: u64,
    /// Claimable tasks: ready, dependencies done, delay over. Best first.
    #[serde(skip)]
    ready: OrdSet<(Reverse<i32>, u64, Name)>,
    /// Tasks by life: `ready` here counts every unclaimed task (ready or waiting);
    /// `queue_counts` splits them with the ready index.
    #[serde(skip)]
    counts: TaskCounts,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Task {
    payload: String,
    priority: i32,
    depends_on: Vec<Name>,
    /// Tasks that depend on this one and are not done yet.
    dependents: Vec<Name>,
    /// How many of `depends_on` are not done yet.
    waiting_on: u32,
    max_attempts: u32,
    ready_at_ms: u64,
    sequence: u64,
    enqueued_revision: u64,
    attempt: u32,
    life: Life,
    note: Option<String>,
    /// The reason of the last failure that sent the task back to ready.
    last_failure: Option<String>,
    /// Enqueued when this task goes dead.
    on_dead: Option<Compensation>,
}

/// A done or dead task keeps the cluster time it finished at: retention counts from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
enum Life {
    Ready,
    Claimed {
        session_id: SessionId,
        fence: u64,
    },
    Done {
        result: Option<String>,
        finished_ms: u64,
    },
    Dead {
        reason: String,
        finished_ms: u64,
    },
}

impl Task {
    /// The state by life alone: every unclaimed task is `Ready` (the counts' bookkeeping).
    fn state(&self) -> TaskState {
        match self.life {
            Life::Ready => TaskState::Ready,
            Life::Claimed { .. } => TaskState::Claimed,
            Life::Done { .. } => TaskState::Done,
            Life::Dead { .. } => TaskState::Dead,
        }
    }

    /// The state readers see at cluster time `time_ms`: an unclaimed task that claim-next could
    /// not take yet is `Waiting`.
    fn state_at(&self, time_ms: u64) -> TaskState {
        match self.life {
            Life::Ready if !self.is_claimable(time_ms) => TaskState::Waiting,
            _ => self.state(),
        }
    }

    fn is_claimable(&self, time_ms: u64) -> bool {
        self.life == Life::Ready && self.waiting_on == 0 && self.ready_at_ms <= time_ms
    }

    fn is_delayed(&self, time_ms: u64) -> bool {
        self.life == Life::Ready && self.waiting_on == 0 && self.ready_at_ms > time_ms
    }

    fn finished_ms(&self) -> Option<u64> {
        match self.life {
            Life::Done { finished_ms, .. } | Life::Dead { finished_ms, .. } => Some(finished_ms),
            Life::Ready | Life::Claimed { .. } => None,
        }
    }
}

impl TaskCounts {
    fn add(&mut self, state: TaskState, delta: i64) {
        let count = match state {
            TaskState::Ready => &mut self.ready,
            TaskState::Waiting => &mut self.waiting,
            TaskState::Claimed => &mut self.claimed,
            TaskState::Done => &mut self.done,
            TaskState::Dead => &mut self.dead,
        };
        *count = count.saturating_add_signed(delta);
    }
}

impl QueueState {
    /// A queue read from a snapshot of format 1 or 2 (legacy.rs): tasks that had finished count
    /// as finished at `time_ms`, the snapshot's cluster time.
    pub(super) fn upgrade(
        tasks: BTreeMap<Name, TaskV2>,
        next_sequence: u64,
        time_ms: u64,
    ) -> QueueState {
        let tasks = tasks
            .into_iter()
            .map(|(id, task)| {
                let life = match task.life {
                    LifeV2::Ready => Life::Ready,
                    LifeV2::Claimed { session_id, fence } => Life::Claimed { session_id, fence },
                    LifeV2::Done { result } => Life::Done {
                        result,
                        finished_ms: time_ms,
                    },
                    LifeV2::Dead { reason } => Life::Dead {
                        reason,
                        finished_ms: time_ms,
                    },
                };
                let task = Task {
                    payload: task.payload,
                    priority: task.priority,
                    depends_on: task.depends_on,
                    dependents: task.dependents,
                    waiting_on: task.waiting_on,
                    max_attempts: task.max_attempts,
                    ready_at_ms: task.ready_at_ms,
                    sequence: task.sequence,
                    enqueued_revision: task.enqueued_revision,
                    attempt: task.attempt,
                    life,
                    note: task.note,
                    last_failure: task.last_failure,
                    on_dead: None,
                };
                (id, task)
            })
            .collect();
        QueueState {
            tasks,
            next_sequence,
            ready: OrdSet::new(),
            counts: TaskCounts::default(),
        }
    }

    /// Recomputes the indexes a snapshot leaves out, at cluster time `time_ms`.
    pub(super) fn rebuild(&mut self, time_ms: u64) {
        self.ready.clear();
        self.counts = TaskCounts::default();
        for (id, task) in &self.tasks {
            self.counts.add(task.state(), 1);
            if task.is_claimable(time_ms) {
                self.ready
                    .insert((Reverse(task.priority), task.sequence, id.clone()));
            }
        }
    }

    /// The claims held in this queue, as `(session, task id)`.
    pub(super) fn claims(&self) -> impl Iterator<Item = (SessionId, &Name, u64)> {
        self.tasks.iter().filter_map(|(id, task)| match task.life {
            Life::Claimed { session_id, fence } => Some((session_id, id, fence)),
            _ => None,
        })
    }

    /// Delayed tasks as `(ready_at_ms, sequence, id)`, for the machine's delay index.
    pub(super) fn delayed(&self, time_ms: u64) -> impl Iterator<Item = (u64, u64, &Name)> {
        self.tasks
            .iter()
            .filter(move |(_, task)| task.is_delayed(time_ms))
            .map(|(id, task)| (task.ready_at_ms, task.sequence, id))
    }

    /// Done and dead tasks as `(finished_ms, id)`, for the machine's retention index.
    pub(super) fn finished(&self) -> impl Iterator<Item = (u64, &Name)> {
        self.tasks
            .iter()
            .filter_map(|(id, task)| Some((task.finished_ms()?, id)))
    }

    /// Checks counts, the ready index and dependency bookkeeping.
    pub(super) fn check(&self, queue: &Name, time_ms: u64) -> Result<(), String> {
        let mut counts = TaskCounts::default();
        // How many tasks list each task among their dependents.
        let mut listed: BTreeMap<&Name, usize> = BTreeMap::new();
        for dependent in self.tasks.values().flat_map(|task| &task.dependents) {
            if !self.tasks.contains_key(dependent) {
                return Err(format!(
                    "queue {queue} lists a missing dependent {dependent}"
                ));
            }
            *listed.entry(dependent).or_default() += 1;
        }
        for (id, task) in &self.tasks {
            counts.add(task.state(), 1);
            let indexed = self
                .ready
                .contains(&(Reverse(task.priority), task.sequence, id.clone()));
            if indexed != task.is_claimable(time_ms) {
                return Err(format!(
                    "task {queue}/{id} is {}in the ready index",
                    if indexed { "" } else { "not " }
                ));
            }
            // A task waits on exactly the tasks that list it among their dependents (not on
            // names: retention may remove a done dependency and a new task take its id). A
            // finished task's count no longer matters.
            let waiting = listed.get(id).copied().unwrap_or(0);
            if task.finished_ms().is_none() && waiting != task.waiting_on as usize {
                return Err(format!(
                    "task {queue}/{id} waits on {} but counts {}",
                    waiting, task.waiting_on
                ));
            }
            if task.attempt > task.max_attempts {
                return Err(format!(
                    "task {queue}/{id} is on attempt {} of {}",
                    task.attempt, task.max_attempts
                ));
            }
        }
        if counts != self.counts || self.ready.len() > self.tasks.len() {
            return Err(format!(
                "queue {queue} counts {:?} but holds {:?}",
                self.counts, counts
            ));
        }
        Ok(())
    }
}

impl Machine {
    pub(super) fn enqueue(
        &mut self,
        namespace: &Namespace,
        queue: &Name,
        task: &TaskSpec,
    ) -> Result<Reply, Rejection> {
        self.check_enqueue(namespace, queue, task, &Planned::default())?;
        self.insert_task(namespace, queue, task);
        Ok(Reply::TaskEnqueued(
            self.task_view(namespace, queue, &task.task_id)
                .expect("just enqueued"),
        ))
    }

    /// Whether `task` may be enqueued into `queue` once the ops `planned` describes have run
    /// (the earlier ops of a transaction; nothing for a single enqueue).
    pub(super) fn check_enqueue(
        &self,
        namespace: &Namespace,
        queue: &Name,
        task: &TaskSpec,
        planned: &Planned,
    ) -> Result<(), Rejection> {
        let task_id = &task.task_id;
        let limits = &self.limits;
        let existing = self
            .namespaces
            .get(namespace)
            .and_then(|state| state.queues.get(queue));
        if existing.is_some_and(|queue| queue.tasks.contains_key(task_id))
            || planned.adds(queue, task_id)
        {
            return Err(Rejection::invalid(format!(
                "task {task_id} already exists in queue {queue}: use another id (or the same Idempotency-Key to retry)"
            )));
        }
        let tasks = existing.map_or(0, |queue| queue.tasks.len()) + planned.added_to(queue);
        if tasks >= limits.tasks_per_queue_max {
            return Err(Rejection::ResourceExhausted(format!(
                "queue {queue} already holds {tasks} tasks, the most allowed"
            )));
        }
        if existing.is_none() && planned.added_to(queue) == 0 {
            let queues = self
                .namespaces
                .get(namespace)
                .map_or(0, |state| state.queues.len())
                + planned.new_queues();
            if queues >= limits.queues_per_namespace_max {
                return Err(Rejection::ResourceExhausted(format!(
                    "namespace {namespace} already has {queues} queues, the most allowed"
                )));
            }
        }
        for dependency in &task.depends_on {
            let life = existing
                .and_then(|queue| queue.tasks.get(dependency))
                .map(|task| &task.life);
            if planned.kills(queue, dependency) || matches!(life, Some(Life::Dead { .. })) {
                return Err(Rejection::invalid(format!(
                    "dependency {dependency} is dead: it will never be done"
                )));
            }
            if life.is_none() && !planned.adds(queue, dependency) {
                return Err(Rejection::invalid(format!(
                    "dependency {dependency} is not a task of queue {queue}"
                )));
            }
        }
        Ok(())
    }

    /// Adds a task whose checks passed (or a compensation, which no limit refuses).
    fn insert_task(&mut self, namespace: &Namespace, queue: &Name, spec: &TaskSpec) {
        let time_ms = self.time_ms;
        let event = EventKind::TaskEnqueued {
            queue: queue.clone(),
            task_id: spec.task_id.clone(),
        };
        let revision = self.record(namespace, event);
        let state = self.namespaces.entry(namespace.clone()).or_default();
        let queue_state = state.queues.entry(queue.clone()).or_default();
        let dependencies: BTreeSet<&Name> = spec.depends_on.iter().collect();
        let mut waiting_on = 0u32;
        for dependency in &dependencies {
            let dependency = queue_state
                .tasks
                .get_mut(*dependency)
                .expect("checked: dependencies exist");
            if !matches!(dependency.life, Life::Done { .. }) {
                dependency.dependents.push(spec.task_id.clone());
                waiting_on += 1;
            }
        }
        let sequence = queue_state.next_sequence;
        queue_state.next_sequence += 1;
        let task = Task {
            payload: spec.payload.clone(),
            priority: spec.priority,
            depends_on: dependencies.into_iter().cloned().collect(),
            dependents: Vec::new(),
            waiting_on,
            max_attempts: spec.max_attempts,
            ready_at_ms: time_ms.saturating_add(spec.delay_ms),
            sequence,
            enqueued_revision: revision,
            attempt: 0,
            life: Life::Ready,
            note: None,
            last_failure: None,
            on_dead: spec.on_dead.clone(),
        };
        queue_state.counts.add(TaskState::Ready, 1);
        queue_state.tasks.insert(spec.task_id.clone(), task);
        self.make_ready(namespace, queue, &spec.task_id);
    }

    /// Enqueues the compensations of the tasks that went dead since the last call: run at the
    /// end of every client operation (the only commands that kill tasks) and after the
    /// time-driven transitions, so each lands in the same apply as
    /// the death that asked for it (and after all of a transaction's ops). A compensation's id
    /// is `on-dead-R`, R the revision of the `TaskDead` event, with a suffix if a task already
    /// took that name; no limit refuses it.
    pub(super) fn enqueue_compensations(&mut self) {
        for pending in std::mem::take(&mut self.compensations) {
            let taken = |machine: &Machine, id: &Name| {
                machine
                    .namespaces
                    .get(&pending.namespace)
                    .and_then(|state| state.queues.get(&pending.compensation.queue))
                    .is_some_and(|queue| queue.tasks.contains_key(id))
            };
            let base = format!("on-dead-{}", pending.revision);
            let mut task_id = Name::new("task id", base.clone()).expect("a valid name");
            let mut suffix = 1u64;
            while taken(self, &task_id) {
                suffix += 1;
                task_id = Name::new("task id", format!("{base}-{suffix}")).expect("a valid name");
            }
            let spec = TaskSpec {
                task_id,
                payload: pending.compensation.payload.clone(),
                priority: 0,
                depends_on: Vec::new(),
                max_attempts: pending.compensation.max_attempts,
                delay_ms: 0,
                on_dead: None,
            };
            self.insert_task(&pending.namespace, &pending.compensation.queue, &spec);
        }
    }

    /// Removes at most `max` done and dead tasks whose retention has run out, oldest first;
    /// a queue left empty goes too. Their events stay. Returns how many were removed.
    pub(super) fn remove_retired_tasks(&mut self, max: usize) -> u64 {
        let mut removed = 0u64;
        while (removed as usize) < max {
            let Some((finished_ms, namespace, queue, task_id)) = self.finished.get_min().cloned()
            else {
                break;
            };
            if finished_ms.saturating_add(self.limits.task_retention_ms) > self.time_ms {
                break;
            }
            self.finished.remove(&(
                finished_ms,
                namespace.clone(),
                queue.clone(),
                task_id.clone(),
            ));
            let state = self
                .namespaces
                .get_mut(&namespace)
                .expect("indexed tasks exist");
            let queue_state = state.queues.get_mut(&queue).expect("indexed tasks exist");
            let task = queue_state
                .tasks
                .remove(&task_id)
                .expect("indexed tasks exist");
            queue_state.counts.add(task.state(), -1);
            // A task that died through one dependency is still listed by its others: forget
            // it there, or a later task taking its id would be woken or killed in its place.
            for dependency in &task.depends_on {
                if let Some(dependency) = queue_state.tasks.get_mut(dependency) {
                    dependency
                        .dependents
                        .retain(|dependent| *dependent != task_id);
                }
            }
            if queue_state.tasks.is_empty() {
                state.queues.remove(&queue);
            }
            if state.is_empty() {
                self.namespaces.remove(&namespace);
            }
            removed += 1;
        }
        removed
    }

    /// Whether some finished task's retention has run out: O(1).
    pub(super) fn retention_due(&self) -> bool {
        self.finished
            .get_min()
            .is_some_and(|(finished_ms, _, _, _)| {
                finished_ms.saturating_add(self.limits.task_retention_ms) <= self.time_ms
            })
    }

    pub(super) fn claim(
        &mut self,
        namespace: &Namespace,
        queue: &Name,
        owner: &Owner,
    ) -> Result<Reply, Rejection> {
        self.check_owner(namespace, owner)?;
        let best = self
            .namespaces
            .get(namespace)
            .and_then(|state| state.queues.get(queue))
            .and_then(|queue| queue.ready.get_min())
            .map(|(_, _, id)| id.clone());
        let Some(task_id) = best else {
            return Ok(Reply::QueueEmpty);
        };
        let (session_id, session_created) = match owner {
            Owner::Session(session_id) => (*session_id, false),
            Owner::NewSession(NewSession { session_id, .. }) => {
                if let Owner::NewSession(new_session) = owner {
                    self.insert_session(namespace, new_session);
                }
                (*session_id, true)
            }
        };
        self.fence_counter += 1;
        let fence = self.fence_counter;
        let queue_state = self.queue_mut(namespace, queue);
        let task = queue_state
            .tasks
            .get_mut(&task_id)
            .expect("indexed tasks exist");
        queue_state
            .ready
            .remove(&(Reverse(task.priority), task.sequence, task_id.clone()));
        task.attempt += 1;
        task.life = Life::Claimed { session_id, fence };
        let attempt = task.attempt;
        queue_state.counts.add(TaskState::Ready, -1);
        queue_state.counts.add(TaskState::Claimed, 1);
        self.add_claim(namespace, session_id, queue, &task_id);
        let event = EventKind::TaskClaimed {
            queue: queue.clone(),
            task_id: task_id.clone(),
            fence,
            attempt,
        };
        self.record(namespace, event);
        let expires_in_ms =
            self.namespaces[namespace].sessions[&session_id].deadline_ms - self.time_ms;
        Ok(Reply::TaskClaimed(TaskClaimed {
            task: self
                .task_view(namespace, queue, &task_id)
                .expect("just claimed"),
            fence,
            attempt,
            session_id,
            session_created,
            expires_in_ms,
        }))
    }

    pub(super) fn complete(
        &mut self,
        namespace: &Namespace,
        queue: &Name,
        task_id: &Name,
        claim: TaskFence,
        result: Option<&str>,
    ) -> Result<Reply, Rejection> {
        self.check_claim(namespace, queue, task_id, claim)?;
        self.end_claim(
            namespace,
            queue,
            task_id,
            Life::Done {
                result: result.map(str::to_owned),
                finished_ms: self.time_ms,
            },
        );
        self.finished.insert((
            self.time_ms,
            namespace.clone(),
            queue.clone(),
            task_id.clone(),
        ));
        let event = EventKind::TaskCompleted {
            queue: queue.clone(),
            task_id: task_id.clone(),
            fence: claim.fence,
        };
        self.record(namespace, event);
        self.wake_dependents(namespace, queue, task_id);
        Ok(Reply::TaskUpdated(
            self.task_view(namespace, queue, task_id).expect("exists"),
        ))
    }

    pub(super) fn fail(
        &mut self,
        namespace: &Namespace,
        queue: &Name,
        task_id: &Name,
        claim: TaskFence,
        reason: &str,
        retry: bool,
    ) -> Result<Reply, Rejection> {
        self.check_claim(namespace, queue, task_id, claim)?;
        let retried = self.retries(namespace, queue, task_id, retry);
        let event = EventKind::TaskFailed {
            queue: queue.clone(),
            task_id: task_id.clone(),
            fence: claim.fence,
            retry: retried,
        };
        self.record(namespace, event);
        if retried {
            self.end_claim(namespace, queue, task_id, Life::Ready);
            let task = self
                .queue_mut(namespace, queue)
                .tasks
                .get_mut(task_id)
                .expect("exists");
            task.last_failure = Some(reason.to_owned());
            self.make_ready(namespace, queue, task_id);
        } else {
            self.kill_task(namespace, queue, task_id, reason.to_owned());
        }
        Ok(Reply::TaskUpdated(
            self.task_view(namespace, queue, task_id).expect("exists"),
        ))
    }

    pub(super) fn release_task(
        &mut self,
        namespace: &Namespace,
        queue: &Name,
        task_id: &Name,
        claim: TaskFence,
        note: Option<&str>,
    ) -> Result<Reply, Rejection> {
        self.check_claim(namespace, queue, task_id, claim)?;
        self.end_claim(namespace, queue, task_id, Life::Ready);
        let task = self
            .queue_mut(namespace, queue)
            .tasks
            .get_mut(task_id)
            .expect("exists");
        task.attempt -= 1;
        if note.is_some() {
            task.note = note.map(str::to_owned);
        }
        let event = EventKind::TaskReleased {
            queue: queue.clone(),
            task_id: task_id.clone(),
            fence: claim.fence,
        };
        self.record(namespace, event);
        self.make_ready(namespace, queue, task_id);
        Ok(Reply::TaskUpdated(
            self.task_view(namespace, queue, task_id).expect("exists"),
        ))
    }

    /// Time-driven transitions, run at the start of every entry (see the module docs).
    pub(super) fn advance_queues(&mut self) {
        while let Some((ready_at_ms, namespace, queue, sequence, task_id)) =
            self.delayed.get_min().cloned()
        {
            if ready_at_ms > self.time_ms {
                break;
            }
            self.delayed.remove(&(
                ready_at_ms,
                namespace.clone(),
                queue.clone(),
                sequence,
                task_id.clone(),
            ));
            let queue_state = self.queue_mut(&namespace, &queue);
            let priority = queue_state.tasks[&task_id].priority;
            queue_state
                .ready
                .insert((Reverse(priority), sequence, task_id));
        }
        while let Some((deadline_ms, namespace, session_id)) =
            self.claim_deadlines.get_min().cloned()
        {
            if deadline_ms > self.time_ms {
                break;
            }
            self.lapse_claims(&namespace, session_id);
        }
    }

    /// Ends every claim of a session that died (expired or ended): each task is ready again,
    /// or dead if that was its last attempt.
    pub(super) fn lapse_claims(&mut self, namespace: &Namespace, session_id: SessionId) {
        let session = self
            .namespaces
            .get_mut(namespace)
            .and_then(|state| state.sessions.get_mut(&session_id));
        let Some(session) = session else { return };
        let claims = std::mem::take(&mut session.claims);
        self.claim_deadlines
            .remove(&(session.deadline_ms, namespace.clone(), session_id));
        for (queue, task_id) in claims {
            let task = &self.namespaces[namespace].queues[&queue].tasks[&task_id];
            let Life::Claimed { fence, .. } = task.life else {
                continue;
            };
            let last_attempt = task.attempt >= task.max_attempts;
            let event = EventKind::TaskExpired {
                queue: queue.clone(),
                task_id: task_id.clone(),
                fence,
            };
            self.record(namespace, event);
            if last_attempt {
                self.kill_task(
                    namespace,
                    &queue,
                    &task_id,
                    "its claim lapsed on the last attempt".to_owned(),
                );
            } else {
                self.end_claim(namespace, &queue, &task_id, Life::Ready);
                self.make_ready(namespace, &queue, &task_id);
            }
        }
    }

    /// Keeps the claim deadline index in step with a session's deadline.
    pub(super) fn move_claim_deadline(
        &mut self,
        namespace: &Namespace,
        session_id: SessionId,
        old_ms: u64,
        new_ms: u64,
    ) {
        if self
            .claim_deadlines
            .remove(&(old_ms, namespace.clone(), session_id))
            .is_some()
        {
            self.claim_deadlines
                .insert((new_ms, namespace.clone(), session_id));
        }
    }

    /// The per-state counts of a queue (all zero for a queue never used): the unclaimed tasks
    /// split into ready (in the ready index) and waiting.
    pub fn queue_counts(&self, namespace: &Namespace, queue: &Name) -> TaskCounts {
        self.namespaces
            .get(namespace)
            .and_then(|state| state.queues.get(queue))
            .map(|queue| {
                let ready = queue.ready.len() as u64;
                TaskCounts {
                    ready,
                    waiting: queue.counts.ready.saturating_sub(ready),
                    ..queue.counts
                }
            })
            .unwrap_or_default()
    }

    /// The namespace's queues in name order after `cursor`, each with its counts.
    pub fn queues(
        &self,
        namespace: &Namespace,
        cursor: Option<&str>,
        limit: usize,
    ) -> super::Page<(Name, TaskCounts)> {
        let limit = limit.clamp(1, self.limits.list_page_max);
        let mut page = super::Page {
            items: Vec::new(),
            next_cursor: None,
        };
        let Some(state) = self.namespaces.get(namespace) else {
            return page;
        };
        let start = cursor.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
        for queue in state
            .queues
            .range::<_, str>((start, std::ops::Bound::Unbounded))
            .map(|(queue, _)| queue)
        {
            if page.items.len() == limit {
                page.next_cursor = page.items.last().map(|(last, _)| last.to_string());
                break;
            }
            page.items
                .push((queue.clone(), self.queue_counts(namespace, queue)));
        }
        page
    }

    pub fn task(&self, namespace: &Namespace, queue: &Name, task_id: &Name) -> Option<TaskView> {
        self.task_view(namespace, queue, task_id)
    }

    /// Tasks of a queue in id order after `cursor`, optionally only those in `state`.
    pub fn tasks(
        &self,
        namespace: &Namespace,
        queue: &Name,
        state: Option<TaskState>,
        cursor: Option<&str>,
        limit: usize,
    ) -> super::Page<TaskView> {
        let limit = limit.clamp(1, self.limits.list_page_max);
        let mut page = super::Page {
            items: Vec::new(),
            next_cursor: None,
        };
        let Some(queue_state) = self
            .namespaces
            .get(namespace)
            .and_then(|namespace| namespace.queues.get(queue))
        else {
            return page;
        };
        let start = cursor.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
        let range = queue_state
            .tasks
            .range::<_, str>((start, std::ops::Bound::Unbounded));
        let time_ms = self.time_ms;
        for (id, task) in
            range.filter(|(_, task)| state.is_none_or(|state| task.state_at(time_ms) == state))
        {
            if page.items.len() == limit {
                page.next_cursor = page.items.last().map(|last: &TaskView| last.id.to_string());
                break;
            }
            page.items.push(self.view_of(namespace, queue, id, task));
        }
        page
    }

    fn task_view(&self, namespace: &Namespace, queue: &Name, task_id: &Name) -> Option<TaskView> {
        let task = self
            .namespaces
            .get(namespace)?
            .queues
            .get(queue)?
            .tasks
            .get(task_id)?;
        Some(self.view_of(namespace, queue, task_id, task))
    }

    fn view_of(
        &self,
        namespace: &Namespace,
        queue: &Name,
        task_id: &Name,
        task: &Task,
    ) -> TaskView {
        let (result, reason) = match &task.life {
            Life::Done { result, .. } => (result.clone(), None),
            Life::Dead { reason, .. } => (None, Some(reason.clone())),
            _ => (None, task.last_failure.clone()),
        };
        let claim = match task.life {
            Life::Claimed { session_id, fence } => {
                let holder = self.namespaces[namespace]
                    .sessions
                    .get(&session_id)
                    .map(|session| session.holder.clone());
                Some((fence, holder.unwrap_or_default()))
            }
            _ => None,
        };
        TaskView {
            queue: queue.clone(),
            id: task_id.clone(),
            payload: task.payload.clone(),
            priority: task.priority,
            depends_on: task.depends_on.clone(),
            state: task.state_at(self.time_ms),
            attempt: task.attempt,
            max_attempts: task.max_attempts,
            ready_at_ms: task.ready_at_ms,
            // A finished task waits on nothing.
            waiting_on: if task.finished_ms().is_some() {
                0
            } else {
                task.waiting_on
            },
            note: task.note.clone(),
            result,
            reason,
            claim,
            enqueued_revision: task.enqueued_revision,
            on_dead: task.on_dead.clone(),
        }
    }

    /// G4 for tasks: the fence must be the live claim's and the session its holder, now.
    pub(super) fn check_claim(
        &self,
        namespace: &Namespace,
        queue: &Name,
        task_id: &Name,
        claim: TaskFence,
    ) -> Result<(), Rejection> {
        // A task that does not exist has no live claim either: whatever the reason, a fence that
        // is not live is STALE_FENCE.
        let Some(task) = self
            .namespaces
            .get(namespace)
            .and_then(|state| state.queues.get(queue))
            .and_then(|queue| queue.tasks.get(task_id))
        else {
            return Err(Rejection::StaleFence {
                message: format!(
                    "queue {queue} has no task {task_id}, so fence {} is stale: refused",
                    claim.fence
                ),
                current_fence: None,
            });
        };
        let holder = |session_id: SessionId| {
            self.namespaces[namespace]
                .sessions
                .get(&session_id)
                .map_or_else(
                    || "a gone session".to_owned(),
                    |session| session.holder.clone(),
                )
        };
        match task.life {
            Life::Claimed { session_id, fence } if fence == claim.fence && session_id == claim.session_id => Ok(()),
            Life::Claimed { session_id, fence } if fence == claim.fence => Err(Rejection::StaleFence {
                message: format!(
                    "fence {fence} is the live claim of {queue}/{task_id}, but it belongs to {}'s session, not the one given: refused",
                    holder(session_id)
                ),
                current_fence: Some(fence),
            }),
            Life::Claimed { session_id, fence } => Err(Rejection::StaleFence {
                message: format!(
                    "fence {} is not the live claim of {queue}/{task_id} (live fence {fence}, held by {}): refused",
                    claim.fence,
                    holder(session_id)
                ),
                current_fence: Some(fence),
            }),
            _ => Err(Rejection::StaleFence {
                message: format!("{queue}/{task_id} has no live claim, so fence {} is stale: refused", claim.fence),
                current_fence: None,
            }),
        }
    }

    /// Whether failing the claimed task `task_id` with `retry` sends it back to ready (rather
    /// than making it dead).
    pub(super) fn retries(
        &self,
        namespace: &Namespace,
        queue: &Name,
        task_id: &Name,
        retry: bool,
    ) -> bool {
        let task = &self.namespaces[namespace].queues[queue].tasks[task_id];
        retry && task.attempt < task.max_attempts
    }

    /// The tasks waiting on `task_id`.
    pub(super) fn dependents_of(
        &self,
        namespace: &Namespace,
        queue: &Name,
        task_id: &Name,
    ) -> Vec<Name> {
        self.namespaces
            .get(namespace)
            .and_then(|state| state.queues.get(queue))
            .and_then(|queue| queue.tasks.get(task_id))
            .map(|task| task.dependents.clone())
            .unwrap_or_default()
    }

    fn queue_mut(&mut self, namespace: &Namespace, queue: &Name) -> &mut QueueState {
        self.namespaces
            .get_mut(namespace)
            .and_then(|state| state.queues.get_mut(queue))
            .expect("the queue exists")
    }

    /// Puts a `Ready` task whose dependencies are done into the ready or the delay index.
    fn make_ready(&mut self, namespace: &Namespace, queue: &Name, task_id: &Name) {
        let time_ms = self.time_ms;
        let queue_state = self.queue_mut(namespace, queue);
        let task = &queue_state.tasks[task_id];
        if task.waiting_on > 0 || task.life != Life::Ready {
            return;
        }
        let (priority, sequence, ready_at_ms) = (task.priority, task.sequence, task.ready_at_ms);
        if ready_at_ms <= time_ms {
            queue_state
                .ready
                .insert((Reverse(priority), sequence, task_id.clone()));
        } else {
            self.delayed.insert((
                ready_at_ms,
                namespace.clone(),
                queue.clone(),
                sequence,
                task_id.clone(),
            ));
        }
    }

    /// Moves a claimed task to `life`, dropping the claim from its session's books.
    fn end_claim(&mut self, namespace: &Namespace, queue: &Name, task_id: &Name, life: Life) {
        let queue_state = self.queue_mut(namespace, queue);
        let task = queue_state.tasks.get_mut(task_id).expect("exists");
        let Life::Claimed { session_id, .. } = task.life else {
            return;
        };
        let new_state = match &life {
            Life::Ready => TaskState::Ready,
            Life::Claimed { .. } => TaskState::Claimed,
            Life::Done { .. } => TaskState::Done,
            Life::Dead { .. } => TaskState::Dead,
        };
        task.life = life;
        queue_state.counts.add(TaskState::Claimed, -1);
        queue_state.counts.add(new_state, 1);
        self.remove_claim(namespace, session_id, queue, task_id);
    }

    /// Makes a task dead, and with it every task that can now never run because it depends on
    /// it, transitively. Each one's compensation is queued for `enqueue_compensations`.
    fn kill_task(&mut self, namespace: &Namespace, queue: &Name, task_id: &Name, reason: String) {
        let finished_ms = self.time_ms;
        let mut doomed = vec![(task_id.clone(), reason)];
        while let Some((id, reason)) = doomed.pop() {
            let task = &self.namespaces[namespace].queues[queue].tasks[&id];
            let dead = Life::Dead {
                reason,
                finished_ms,
            };
            match task.life {
                Life::Claimed { .. } => self.end_claim(namespace, queue, &id, dead),
                Life::Ready => {
                    let queue_state = self.queue_mut(namespace, queue);
                    let task = queue_state.tasks.get_mut(&id).expect("exists");
                    let (priority, sequence, ready_at_ms) =
                        (task.priority, task.sequence, task.ready_at_ms);
                    task.life = dead;
                    queue_state
                        .ready
                        .remove(&(Reverse(priority), sequence, id.clone()));
                    queue_state.counts.add(TaskState::Ready, -1);
                    queue_state.counts.add(TaskState::Dead, 1);
                    self.delayed.remove(&(
                        ready_at_ms,
                        namespace.clone(),
                        queue.clone(),
                        sequence,
                        id.clone(),
                    ));
                }
                Life::Done { .. } | Life::Dead { .. } => continue,
            }
            let event = EventKind::TaskDead {
                queue: queue.clone(),
                task_id: id.clone(),
            };
            let revision = self.record(namespace, event);
            self.finished
                .insert((finished_ms, namespace.clone(), queue.clone(), id.clone()));
            let task = self
                .queue_mut(namespace, queue)
                .tasks
                .get_mut(&id)
                .expect("exists");
            let dependents = std::mem::take(&mut task.dependents);
            if let Some(compensation) = task.on_dead.clone() {
                self.compensations.push(PendingCompensation {
                    namespace: namespace.clone(),
                    compensation,
                    revision,
                });
            }
            doomed.extend(
                dependents
                    .into_iter()
                    .map(|dependent| (dependent, format!("its dependency {id} is dead"))),
            );
        }
    }

    /// A task is done: its dependents wait on one task fewer, and may become ready.
    fn wake_dependents(&mut self, namespace: &Namespace, queue: &Name, task_id: &Name) {
        let dependents = std::mem::take(
            &mut self
                .queue_mut(namespace, queue)
                .tasks
                .get_mut(task_id)
                .expect("exists")
                .dependents,
        );
        for dependent in dependents {
            let task = self
                .queue_mut(namespace, queue)
                .tasks
                .get_mut(&dependent)
                .expect("dependents exist");
            task.waiting_on -= 1;
            self.make_ready(namespace, queue, &dependent);
        }
    }

    fn add_claim(
        &mut self,
        namespace: &Namespace,
        session_id: SessionId,
        queue: &Name,
        task_id: &Name,
    ) {
        let session = self
            .namespaces
            .get_mut(namespace)
            .and_then(|state| state.sessions.get_mut(&session_id))
            .expect("the claimer lives");
        if session.claims.is_empty() {
            self.claim_deadlines
                .insert((session.deadline_ms, namespace.clone(), session_id));
        }
        session.claims.insert((queue.clone(), task_id.clone()));
    }

    fn remove_claim(
        &mut self,
        namespace: &Namespace,
        session_id: SessionId,
        queue: &Name,
        task_id: &Name,
    ) {
        let Some(session) = self
            .namespaces
            .get_mut(namespace)
            .and_then(|state| state.sessions.get_mut(&session_id))
        else {
            return;
        };
        session.claims.remove(&(queue.clone(), task_id.clone()));
        if session.claims.is_empty() {
            self.claim_deadlines
                .remove(&(session.deadline_ms, namespace.clone(), session_id));
        }
    }
}

/// The tasks a snapshot names as claimed, by session, for rebuilding `Session::claims`.
pub(super) fn claims_by_session(
    queues: &OrdMap<Name, QueueState>,
) -> BTreeMap<SessionId, Vec<(Name, Name)>> {
    let mut claims: BTreeMap<SessionId, Vec<(Name, Name)>> = BTreeMap::new();
    for (queue, state) in queues {
        for (session_id, task_id, _) in state.claims() {
            claims
                .entry(session_id)
                .or_default()
                .push((queue.clone(), task_id.clone()));
        }
    }
    claims
}
