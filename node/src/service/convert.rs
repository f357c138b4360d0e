//! Hand-written conversions from the machine's log types to the client's wire types
//! (STYLE rule 3), and the informational RFC 3339 times.

use baton_api::{self as api};
use baton_raft_store::machine::{
    Event, EventKind, Grant, LeaseMode, LeaseView, Name, Page, SessionId, SessionView, TaskClaimed,
    TaskState, TaskView,
};

pub use crate::service::Clocks;

pub fn session_id(id: SessionId) -> api::SessionId {
    api::SessionId::new(id.to_string())
}

pub fn mode(mode: LeaseMode) -> api::LeaseMode {
    match mode {
        LeaseMode::Exclusive => api::LeaseMode::Exclusive,
        LeaseMode::Subtree => api::LeaseMode::Subtree,
        LeaseMode::Shared { .. } => api::LeaseMode::Shared,
    }
}

/// A shared lease's limit, on the wire next to its mode.
pub fn limit(mode: LeaseMode) -> Option<u32> {
    match mode {
        LeaseMode::Shared { limit } => Some(limit),
        LeaseMode::Exclusive | LeaseMode::Subtree => None,
    }
}

/// The mode of an acquire: `limit` comes with `shared` and only with it.
pub fn mode_from_wire(mode: api::LeaseMode, limit: Option<u32>) -> Result<LeaseMode, String> {
    match (mode, limit) {
        (api::LeaseMode::Exclusive, None) => Ok(LeaseMode::Exclusive),
        (api::LeaseMode::Subtree, None) => Ok(LeaseMode::Subtree),
        (api::LeaseMode::Shared, Some(limit)) => Ok(LeaseMode::Shared { limit }),
        (api::LeaseMode::Shared, None) => {
            Err("a shared lease needs its limit: how many may hold it at once".to_owned())
        }
        (_, Some(_)) => Err("limit goes with mode shared only".to_owned()),
    }
}

pub fn lease(view: &LeaseView, clocks: Clocks) -> api::Lease {
    api::Lease {
        resource: view.resource.to_string(),
        fence: view.fence,
        holder: view.holder.clone(),
        mode: mode(view.mode),
        limit: limit(view.mode),
        labels: view.labels.clone(),
        max_hold_ms: view.max_hold_ms,
        acquired_at: clocks.at(view.acquired_at_ms),
        expires_in_ms: view.expires_in_ms,
        expires_at: clocks.expires_at(view.expires_in_ms),
        covering: false,
    }
}

/// The lease in the way of a refusal and, for a shared lease, its holders listed.
pub fn held_by(
    view: &LeaseView,
    holders: &[LeaseView],
    holders_total: u32,
    clocks: Clocks,
) -> api::HeldBy {
    api::HeldBy {
        holders: holders
            .iter()
            .map(|holder| api::SharedHolder {
                holder: holder.holder.clone(),
                fence: holder.fence,
                acquired_at: clocks.at(holder.acquired_at_ms),
                expires_in_ms: holder.expires_in_ms,
                expires_at: clocks.expires_at(holder.expires_in_ms),
            })
            .collect(),
        holders_total: (!holders.is_empty()).then_some(holders_total),
        ..api::HeldBy::from(lease(view, clocks))
    }
}

pub fn grant(grant: &Grant, clocks: Clocks) -> api::Grant {
    let lease = lease(&grant.lease, clocks);
    api::Grant {
        resource: lease.resource,
        fence: lease.fence,
        session_id: session_id(grant.session_id),
        holder: lease.holder,
        mode: lease.mode,
        limit: lease.limit,
        labels: lease.labels,
        max_hold_ms: lease.max_hold_ms,
        acquired_at: lease.acquired_at,
        expires_in_ms: lease.expires_in_ms,
        expires_at: lease.expires_at,
    }
}

pub fn created_session(view: &SessionView, clocks: Clocks) -> api::CreateSessionResponse {
    api::CreateSessionResponse {
        session_id: session_id(view.session_id),
        holder: view.holder.clone(),
        ttl_ms: view.ttl_ms,
        expires_in_ms: view.expires_in_ms,
        expires_at: clocks.expires_at(view.expires_in_ms),
    }
}

pub fn session_info(
    view: &SessionView,
    leases: &Page<LeaseView>,
    clocks: Clocks,
) -> api::SessionInfo {
    api::SessionInfo {
        session_id: session_id(view.session_id),
        holder: view.holder.clone(),
        ttl_ms: view.ttl_ms,
        labels: view.labels.clone(),
        expires_in_ms: view.expires_in_ms,
        expires_at: clocks.expires_at(view.expires_in_ms),
        leases: leases
            .items
            .iter()
            .map(|view| lease(view, clocks))
            .collect(),
        next_cursor: leases.next_cursor.clone(),
    }
}

/// A JSON text stored by the machine, back as a JSON value (it was validated on the way in).
pub fn json_value(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or(serde_json::Value::Null)
}

pub fn task_state(state: TaskState) -> api::TaskState {
    match state {
        TaskState::Ready => api::TaskState::Ready,
        TaskState::Waiting => api::TaskState::Waiting,
        TaskState::Claimed => api::TaskState::Claimed,
        TaskState::Done => api::TaskState::Done,
        TaskState::Dead => api::TaskState::Dead,
    }
}

pub fn task_state_from_wire(state: api::TaskState) -> TaskState {
    match state {
        api::TaskState::Ready => TaskState::Ready,
        api::TaskState::Waiting => TaskState::Waiting,
        api::TaskState::Claimed => TaskState::Claimed,
        api::TaskState::Done => TaskState::Done,
        api::TaskState::Dead => TaskState::Dead,
    }
}

pub fn task(view: &TaskView) -> api::Task {
    api::Task {
        id: view.id.to_string(),
        queue: view.queue.to_string(),
        payload: json_value(&view.payload),
        priority: view.priority,
        depends_on: view.depends_on.iter().map(ToString::to_string).collect(),
        state: task_state(view.state),
        attempt: view.attempt,
        max_attempts: view.max_attempts,
        ready_at_ms: view.ready_at_ms,
        waiting_on: view.waiting_on,
        note: view.note.clone(),
        result: view.result.as_deref().map(json_value),
        reason: view.reason.clone(),
        fence: view.claim.as_ref().map(|(fence, _)| *fence),
        holder: view.claim.as_ref().map(|(_, holder)| holder.clone()),
        enqueued_revision: Some(view.enqueued_revision),
        on_dead: view.on_dead.as_ref().map(|compensation| api::OnDead {
            queue: compensation.queue.to_string(),
            payload: json_value(&compensation.payload),
            max_attempts: Some(compensation.max_attempts),
        }),
    }
}

pub fn claimed(claimed: &TaskClaimed, clocks: Clocks) -> api::ClaimResponse {
    api::ClaimResponse {
        task: task(&claimed.task),
        fence: claimed.fence,
        attempt: claimed.attempt,
        session_id: session_id(claimed.session_id),
        expires_in_ms: claimed.expires_in_ms,
        expires_at: clocks.expires_at(claimed.expires_in_ms),
    }
}

pub fn event(event: &Event) -> api::Event {
    let change = |queue: &Name,
                  task_id: &Name,
                  fence: Option<u64>,
                  attempt: Option<u32>,
                  retry: Option<bool>| {
        api::TaskChange {
            queue: queue.to_string(),
            task_id: task_id.to_string(),
            fence,
            attempt,
            retry,
        }
    };
    let kind = match &event.kind {
        EventKind::Granted {
            resource,
            holder,
            fence,
            mode: lease_mode,
        } => api::EventKind::Granted {
            resource: resource.to_string(),
            holder: holder.clone(),
            fence: *fence,
            mode: mode(*lease_mode),
        },
        EventKind::Released { resource, fence } => api::EventKind::Released {
            resource: resource.to_string(),
            fence: *fence,
        },
        EventKind::Expired { resource, fence } => api::EventKind::Expired {
            resource: resource.to_string(),
            fence: *fence,
        },
        EventKind::KvWritten { key, fence } => api::EventKind::KvWritten {
            key: key.to_string(),
            revision: event.revision,
            fence: *fence,
        },
        EventKind::KvDeleted { key } => api::EventKind::KvDeleted {
            key: key.to_string(),
        },
        EventKind::TaskEnqueued { queue, task_id } => {
            api::EventKind::TaskEnqueued(change(queue, task_id, None, None, None))
        }
        EventKind::TaskClaimed {
            queue,
            task_id,
            fence,
            attempt,
        } => {
            api::EventKind::TaskClaimed(change(queue, task_id, Some(*fence), Some(*attempt), None))
        }
        EventKind::TaskCompleted {
            queue,
            task_id,
            fence,
        } => api::EventKind::TaskCompleted(change(queue, task_id, Some(*fence), None, None)),
        EventKind::TaskFailed {
            queue,
            task_id,
            fence,
            retry,
        } => api::EventKind::TaskFailed(change(queue, task_id, Some(*fence), None, Some(*retry))),
        EventKind::TaskReleased {
            queue,
            task_id,
            fence,
        } => api::EventKind::TaskReleased(change(queue, task_id, Some(*fence), None, None)),
        EventKind::TaskExpired {
            queue,
            task_id,
            fence,
        } => api::EventKind::TaskExpired(change(queue, task_id, Some(*fence), None, None)),
        EventKind::TaskDead { queue, task_id } => {
            api::EventKind::TaskDead(change(queue, task_id, None, None, None))
        }
        EventKind::Queued {
            resource,
            holder,
            mode: lease_mode,
        } => api::EventKind::Queued {
            resource: resource.to_string(),
            holder: holder.clone(),
            mode: mode(*lease_mode),
        },
        EventKind::LeftLine { resource, holder } => api::EventKind::LeftLine {
            resource: resource.to_string(),
            holder: holder.clone(),
        },
    };
    api::Event {
        revision: event.revision,
        namespace: event.namespace.to_string(),
        cluster_time_ms: event.time_ms,
        kind,
        by: event.by.as_ref().map(ToString::to_string),
    }
}

#[cfg(test)]
mod tests {
    use baton_api::rfc3339;

    use super::*;

    #[test]
    fn past_cluster_times_map_back_onto_the_wall_clock() {
        let clocks = Clocks {
            wall_ms: 10_000,
            cluster_ms: 500,
        };
        assert_eq!(clocks.at(400), rfc3339(9_900));
        assert_eq!(clocks.expires_at(2_000), rfc3339(12_000));
    }
}
