//! Admission: every check of a command's input that needs the limits and nothing else. The
//! node runs it on the leader before proposing, so a bad request costs no log entry; `apply`
//! runs it again, deterministically, because the limits may have been lowered in between.
//! Checks that need the state (a live session, a free path, a full queue) are the operations'
//! own, in leases.rs, kv.rs and queues.rs. Shapes need no check here: holding a `Namespace`,
//! `ResourcePath` or `Name` proves its shape (types.rs).

use super::auth::{NewToken, Scope};
use super::command::{
    Command, Compare, NewSession, Op, Owner, Rejection, ResourceFence, TaskSpec, Txn, TxnOp,
};
use super::types::{
    validate_holder, validate_idempotency_key, validate_labels, validate_max_hold, validate_ttl,
    LeaseMode, Limits, Name, Namespace,
};

/// Admits `command` under `limits`: its namespace, idempotency key and operation.
pub fn admit(command: &Command, limits: &Limits) -> Result<(), Rejection> {
    match command {
        Command::Namespaced {
            namespace,
            idempotency,
            op,
        } => {
            if let Some(tag) = idempotency {
                validate_idempotency_key(&tag.key, limits)?;
            }
            admit_op(namespace, op, limits)
        }
        Command::CreateToken(new_token) => admit_new_token(new_token, limits),
        Command::RevokeToken { name } => Ok(name.check("token name", limits)?),
        Command::Authorized { command, .. } => admit(command, limits),
        Command::SetLimits(limits) => Ok(limits.check()?),
        Command::Sweep { .. } | Command::BootstrapToken { .. } => Ok(()),
    }
}

/// A token's name within the name limits and at least one namespace, each within limits.
pub(crate) fn admit_new_token(new_token: &NewToken, limits: &Limits) -> Result<(), Rejection> {
    new_token.name.check("token name", limits)?;
    if let Scope::Only(namespaces) = &new_token.scope {
        if namespaces.is_empty() {
            return Err(Rejection::invalid(
                "a token needs at least one namespace, or [\"*\"] for all",
            ));
        }
        for namespace in namespaces {
            namespace.check(limits)?;
        }
    }
    Ok(())
}

/// Admits one operation in `namespace` under `limits`.
pub(crate) fn admit_op(namespace: &Namespace, op: &Op, limits: &Limits) -> Result<(), Rejection> {
    namespace.check(limits)?;
    match op {
        Op::CreateSession(new_session) => admit_new_session(new_session, limits),
        Op::Keepalive { .. } | Op::EndSession { .. } => Ok(()),
        Op::Release { resource, .. } | Op::LeaveOrRelease { resource, .. } => {
            Ok(resource.check(limits)?)
        }
        Op::Acquire {
            resource,
            mode,
            owner,
            max_hold_ms,
            labels,
        }
        | Op::AcquireOrWait {
            resource,
            mode,
            owner,
            max_hold_ms,
            labels,
        } => {
            resource.check(limits)?;
            if let LeaseMode::Shared { limit } = mode {
                if *limit == 0 || *limit > limits.shared_limit_max {
                    return Err(Rejection::invalid(format!(
                        "a shared lease's limit must be 1..={}, got {limit}",
                        limits.shared_limit_max
                    )));
                }
            }
            validate_labels(labels, limits)?;
            if let Some(max_hold_ms) = max_hold_ms {
                validate_max_hold(*max_hold_ms, limits)?;
            }
            admit_owner(owner, limits)
        }
        Op::KvPut { key, value, fence } => {
            key.check(limits)?;
            admit_value(value, limits)?;
            admit_fence(fence.as_ref(), limits)
        }
        Op::KvDelete { key, fence } => {
            key.check(limits)?;
            admit_fence(fence.as_ref(), limits)
        }
        Op::Enqueue { queue, task } => admit_task_spec(queue, task, limits),
        Op::Claim { queue, owner } => {
            queue.check("queue", limits)?;
            admit_owner(owner, limits)
        }
        Op::Complete {
            queue,
            task_id,
            result,
            ..
        } => {
            admit_task(queue, task_id, limits)?;
            match result {
                Some(result) => admit_payload("result", result, limits),
                None => Ok(()),
            }
        }
        Op::Fail {
            queue,
            task_id,
            reason,
            ..
        } => {
            admit_task(queue, task_id, limits)?;
            admit_text("reason", reason, limits)
        }
        Op::ReleaseTask {
            queue,
            task_id,
            note,
            ..
        } => {
            admit_task(queue, task_id, limits)?;
            match note {
                Some(note) => admit_text("note", note, limits),
                None => Ok(()),
            }
        }
        Op::Txn(txn) => admit_txn(txn, limits),
    }
}

fn admit_value(value: &str, limits: &Limits) -> Result<(), Rejection> {
    if value.len() > limits.kv_value_bytes_max {
        return Err(Rejection::PayloadTooLarge(format!(
            "the value is {} bytes, at most {} are allowed",
            value.len(),
            limits.kv_value_bytes_max
        )));
    }
    Ok(())
}

/// A transaction: at most `txn_ops_max` compares and as many ops, each admitted like the
/// single operation it stands for, and a session when a compare or an op is fenced.
fn admit_txn(txn: &Txn, limits: &Limits) -> Result<(), Rejection> {
    let ops = txn.success.len() + txn.failure.len();
    if txn.compare.len() > limits.txn_ops_max || ops > limits.txn_ops_max {
        return Err(Rejection::invalid(format!(
            "a transaction may have at most {} compares and {} ops, got {} and {ops}",
            limits.txn_ops_max,
            limits.txn_ops_max,
            txn.compare.len()
        )));
    }
    for compare in &txn.compare {
        match compare {
            Compare::Fence { resource, .. } => resource.check(limits)?,
            Compare::KvRevision { key, .. } => key.check(limits)?,
        }
    }
    let fenced = txn
        .compare
        .iter()
        .any(|compare| matches!(compare, Compare::Fence { .. }))
        || txn.success.iter().chain(&txn.failure).any(|op| {
            matches!(
                op,
                TxnOp::Release { .. } | TxnOp::CompleteTask { .. } | TxnOp::FailTask { .. }
            )
        });
    if fenced && txn.session_id.is_none() {
        return Err(Rejection::invalid(
            "this transaction has fence compares or fenced ops (release, complete_task, fail_task): give its session_id",
        ));
    }
    for op in txn.success.iter().chain(&txn.failure) {
        match op {
            TxnOp::Put { key, value } => {
                key.check(limits)?;
                admit_value(value, limits)?;
            }
            TxnOp::Delete { key } => key.check(limits)?,
            TxnOp::Release { resource } => resource.check(limits)?,
            TxnOp::AddTask { queue, task } => admit_task_spec(queue, task, limits)?,
            TxnOp::CompleteTask {
                queue,
                task_id,
                result,
                ..
            } => {
                admit_task(queue, task_id, limits)?;
                if let Some(result) = result {
                    admit_payload("result", result, limits)?;
                }
            }
            TxnOp::FailTask {
                queue,
                task_id,
                reason,
                ..
            } => {
                admit_task(queue, task_id, limits)?;
                admit_text("reason", reason, limits)?;
            }
        }
    }
    Ok(())
}

fn admit_task_spec(queue: &Name, task: &TaskSpec, limits: &Limits) -> Result<(), Rejection> {
    admit_task(queue, &task.task_id, limits)?;
    admit_payload("payload", &task.payload, limits)?;
    admit_attempts(task.max_attempts, limits)?;
    if task.delay_ms > limits.task_delay_ms_max {
        return Err(Rejection::invalid(format!(
            "not_before_ms must be at most {}, got {}",
            limits.task_delay_ms_max, task.delay_ms
        )));
    }
    if task.depends_on.len() > limits.task_dependencies_max {
        return Err(Rejection::invalid(format!(
            "at most {} dependencies are allowed, got {}",
            limits.task_dependencies_max,
            task.depends_on.len()
        )));
    }
    for dependency in &task.depends_on {
        dependency.check("dependency", limits)?;
    }
    if let Some(compensation) = &task.on_dead {
        compensation.queue.check("on_dead queue", limits)?;
        admit_payload("on_dead payload", &compensation.payload, limits)?;
        admit_attempts(compensation.max_attempts, limits)?;
    }
    Ok(())
}

fn admit_attempts(max_attempts: u32, limits: &Limits) -> Result<(), Rejection> {
    if max_attempts == 0 || max_attempts > limits.task_attempts_max {
        return Err(Rejection::invalid(format!(
            "max_attempts must be 1..={}, got {max_attempts}",
            limits.task_attempts_max
        )));
    }
    Ok(())
}

fn admit_new_session(new_session: &NewSession, limits: &Limits) -> Result<(), Rejection> {
    validate_holder(&new_session.holder, limits)?;
    validate_ttl(new_session.ttl_ms, limits)?;
    validate_labels(&new_session.labels, limits)?;
    Ok(())
}

fn admit_owner(owner: &Owner, limits: &Limits) -> Result<(), Rejection> {
    match owner {
        Owner::Session(_) => Ok(()),
        Owner::NewSession(new_session) => admit_new_session(new_session, limits),
    }
}

fn admit_fence(fence: Option<&ResourceFence>, limits: &Limits) -> Result<(), Rejection> {
    match fence {
        Some(fence) => Ok(fence.resource.check(limits)?),
        None => Ok(()),
    }
}

fn admit_task(queue: &Name, task_id: &Name, limits: &Limits) -> Result<(), Rejection> {
    queue.check("queue", limits)?;
    task_id.check("task id", limits)?;
    Ok(())
}

fn admit_payload(what: &str, json: &str, limits: &Limits) -> Result<(), Rejection> {
    if json.len() > limits.task_payload_bytes_max {
        return Err(Rejection::PayloadTooLarge(format!(
            "the {what} is {} bytes, at most {} are allowed",
            json.len(),
            limits.task_payload_bytes_max
        )));
    }
    Ok(())
}

fn admit_text(what: &str, text: &str, limits: &Limits) -> Result<(), Rejection> {
    let chars = text.chars().count();
    if chars > limits.task_text_chars_max {
        return Err(Rejection::invalid(format!(
            "{what} is {chars} characters, at most {} are allowed",
            limits.task_text_chars_max
        )));
    }
    Ok(())
}
