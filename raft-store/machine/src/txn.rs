//! Transactions (the outbox): compares, then the `success` or the `failure` ops, all applied or
//! none, in one command of one log entry.
//!
//! Nothing is undone, because nothing is done before every op is known to succeed: the ops are
//! first checked in order, each with the single operation's own check, against the state as
//! the ops before it will leave it. Only a few things one op does change whether a later one is
//! allowed, and `Planned` carries exactly those: the tasks added so far (a later task may
//! depend on them; they count against the queue's size), the queues they create, the keys
//! created, and the tasks a `fail_task` makes dead with their dependents (no later task may
//! depend on them). An op may name a key, a resource or a task only once in a transaction, so
//! no other interaction exists. Then the ops are applied with the ordinary operations, which
//! must succeed; one that does not is a broken invariant, and the node stops rather than apply
//! half a transaction. Compensations of tasks made dead run after the last op
//! (`enqueue_compensations`), and no limit refuses them.

use std::collections::{BTreeMap, BTreeSet};

use super::command::{Compare, Rejection, Reply, ResourceFence, TaskFence, Txn, TxnOp};
use super::{Machine, Name, Namespace, ResourcePath, SessionId};

/// What the earlier ops of a transaction will have done, as far as later checks care.
#[derive(Debug, Default)]
pub(super) struct Planned {
    /// Tasks added, by `(queue, id)`, with their dependencies.
    added: BTreeMap<(Name, Name), Vec<Name>>,
    /// Queues that the added tasks create.
    new_queues: BTreeSet<Name>,
    /// Keys that puts create and deletes remove.
    keys_created: usize,
    keys_deleted: usize,
    /// Tasks made dead by a `fail_task`, with everything that depends on them.
    killed: BTreeSet<(Name, Name)>,
}

impl Planned {
    pub(super) fn adds(&self, queue: &Name, task_id: &Name) -> bool {
        self.added.contains_key(&(queue.clone(), task_id.clone()))
    }

    pub(super) fn added_to(&self, queue: &Name) -> usize {
        self.added.keys().filter(|(name, _)| name == queue).count()
    }

    pub(super) fn new_queues(&self) -> usize {
        self.new_queues.len()
    }

    pub(super) fn kills(&self, queue: &Name, task_id: &Name) -> bool {
        self.killed.contains(&(queue.clone(), task_id.clone()))
    }
}

impl Machine {
    pub(super) fn txn(&mut self, namespace: &Namespace, txn: &Txn) -> Result<Reply, Rejection> {
        let session = txn.session_id;
        let succeeded = txn
            .compare
            .iter()
            .all(|compare| self.compare_holds(namespace, session, compare));
        let ops = if succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        self.check_txn_ops(namespace, session, ops)?;
        let results = ops
            .iter()
            .map(|op| {
                self.apply_txn_op(namespace, session, op)
                    .unwrap_or_else(|refused| {
                        panic!(
                            "a transaction's op was refused after its check passed: {}",
                            refused.message()
                        )
                    })
            })
            .collect();
        Ok(Reply::TxnDone { succeeded, results })
    }

    fn compare_holds(
        &self,
        namespace: &Namespace,
        session: Option<SessionId>,
        compare: &Compare,
    ) -> bool {
        match compare {
            Compare::Fence { resource, fence } => session.is_some_and(|session_id| {
                let claim = ResourceFence {
                    resource: resource.clone(),
                    fence: *fence,
                    session_id,
                };
                self.check_fence(namespace, Some(&claim)).is_ok()
            }),
            Compare::KvRevision { key, revision } => {
                self.kv_get(namespace, key)
                    .map_or(0, |entry| entry.revision)
                    == *revision
            }
        }
    }

    /// Checks every op as it will be applied, in order; the first refusal refuses them all.
    fn check_txn_ops(
        &self,
        namespace: &Namespace,
        session: Option<SessionId>,
        ops: &[TxnOp],
    ) -> Result<(), Rejection> {
        let mut planned = Planned::default();
        let mut keys: BTreeSet<&ResourcePath> = BTreeSet::new();
        let mut resources: BTreeSet<&ResourcePath> = BTreeSet::new();
        let mut tasks: BTreeSet<(&Name, &Name)> = BTreeSet::new();
        let state = self.namespaces.get(namespace);
        let key_exists = |key: &ResourcePath| state.is_some_and(|state| state.kv.contains_key(key));
        for op in ops {
            match op {
                TxnOp::Put { key, .. } | TxnOp::Delete { key } => {
                    if !keys.insert(key) {
                        return Err(twice("key", key));
                    }
                    match (op, key_exists(key)) {
                        (TxnOp::Delete { .. }, false) => {
                            return Err(Rejection::NotFound(format!(
                                "no value is stored under {key}"
                            )));
                        }
                        (TxnOp::Delete { .. }, true) => planned.keys_deleted += 1,
                        (_, false) => {
                            let keys = state.map_or(0, |state| state.kv.len())
                                + planned.keys_created
                                - planned.keys_deleted;
                            if keys >= self.limits.kv_keys_per_namespace_max {
                                return Err(Rejection::ResourceExhausted(format!(
                                    "namespace {namespace} already has {keys} keys, the most allowed; delete some first"
                                )));
                            }
                            planned.keys_created += 1;
                        }
                        (_, true) => {}
                    }
                }
                TxnOp::Release { resource } => {
                    if !resources.insert(resource) {
                        return Err(twice("resource", resource));
                    }
                    self.check_release(namespace, txn_session(session)?, resource)?;
                }
                TxnOp::AddTask { queue, task } => {
                    if !tasks.insert((queue, &task.task_id)) {
                        return Err(twice("task", &format!("{queue}/{}", task.task_id)));
                    }
                    self.check_enqueue(namespace, queue, task, &planned)?;
                    let exists = state.is_some_and(|state| state.queues.contains_key(queue));
                    if !exists {
                        planned.new_queues.insert(queue.clone());
                    }
                    planned.added.insert(
                        (queue.clone(), task.task_id.clone()),
                        task.depends_on.clone(),
                    );
                }
                TxnOp::CompleteTask {
                    queue,
                    task_id,
                    fence,
                    ..
                }
                | TxnOp::FailTask {
                    queue,
                    task_id,
                    fence,
                    ..
                } => {
                    if !tasks.insert((queue, task_id)) {
                        return Err(twice("task", &format!("{queue}/{task_id}")));
                    }
                    let claim = TaskFence {
                        session_id: txn_session(session)?,
                        fence: *fence,
                    };
                    self.check_claim(namespace, queue, task_id, claim)?;
                    if let TxnOp::FailTask { retry, .. } = op {
                        if !self.retries(namespace, queue, task_id, *retry) {
                            self.plan_kill(namespace, queue, task_id, &mut planned);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Records `task_id` and everything that depends on it, in the state or among the tasks
    /// the transaction adds, as made dead.
    fn plan_kill(
        &self,
        namespace: &Namespace,
        queue: &Name,
        task_id: &Name,
        planned: &mut Planned,
    ) {
        let mut doomed = vec![task_id.clone()];
        while let Some(id) = doomed.pop() {
            if !planned.killed.insert((queue.clone(), id.clone())) {
                continue;
            }
            doomed.extend(self.dependents_of(namespace, queue, &id));
            doomed.extend(
                planned
                    .added
                    .iter()
                    .filter(|((added_queue, _), depends_on)| {
                        added_queue == queue && depends_on.contains(&id)
                    })
                    .map(|((_, added_id), _)| added_id.clone()),
            );
        }
    }

    fn apply_txn_op(
        &mut self,
        namespace: &Namespace,
        session: Option<SessionId>,
        op: &TxnOp,
    ) -> Result<Reply, Rejection> {
        match op {
            TxnOp::Put { key, value } => self.kv_put(namespace, key, value, None),
            TxnOp::Delete { key } => self.kv_delete(namespace, key, None),
            TxnOp::Release { resource } => self.release(namespace, txn_session(session)?, resource),
            TxnOp::AddTask { queue, task } => self.enqueue(namespace, queue, task),
            TxnOp::CompleteTask {
                queue,
                task_id,
                fence,
                result,
            } => {
                let claim = TaskFence {
                    session_id: txn_session(session)?,
                    fence: *fence,
                };
                self.complete(namespace, queue, task_id, claim, result.as_deref())
            }
            TxnOp::FailTask {
                queue,
                task_id,
                fence,
                reason,
                retry,
            } => {
                let claim = TaskFence {
                    session_id: txn_session(session)?,
                    fence: *fence,
                };
                self.fail(namespace, queue, task_id, claim, reason, *retry)
            }
        }
    }
}

/// The session a fenced op acts with; admission refuses a transaction that needs one and has
/// none, so this only guards.
fn txn_session(session: Option<SessionId>) -> Result<SessionId, Rejection> {
    session.ok_or_else(|| {
        Rejection::invalid("this transaction has fenced ops or compares: give its session_id")
    })
}

fn twice(what: &str, name: &impl std::fmt::Display) -> Rejection {
    Rejection::invalid(format!(
        "the transaction names {what} {name} in two ops: one op per {what}"
    ))
}
