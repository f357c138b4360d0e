//! The indexes a snapshot leaves out, recomputed from the state it holds: each session's
//! leases, claims and places in line, the deadline and delay indexes the sweeps walk, each queue's ready order.
//! `decode_snapshot` (codec.rs) calls it, then `check_invariants` before trusting the result.

use super::queues::claims_by_session;
use super::{Machine, Name, Namespace};

impl Machine {
    /// Recomputes what snapshots leave out: each session's lease set and the deadline indexes.
    pub(crate) fn rebuild_indexes(&mut self) -> Result<(), String> {
        self.auth.rebuild_index();
        let namespaces: Vec<Namespace> = self.namespaces.keys().cloned().collect();
        for namespace in namespaces {
            let Some(state) = self.namespaces.get_mut(&namespace) else {
                continue;
            };
            for (session_id, session) in &state.sessions {
                self.session_deadlines.insert((
                    session.deadline_ms,
                    namespace.clone(),
                    *session_id,
                ));
            }
            for (resource, lease) in &state.leases {
                let session = state
                    .sessions
                    .get_mut(&lease.session_id)
                    .ok_or_else(|| format!("lease on {resource} names a missing session"))?;
                session.leases.insert(resource.clone());
                if let Some(deadline_ms) = lease.max_hold_deadline_ms {
                    self.max_hold_deadlines.insert((
                        deadline_ms,
                        namespace.clone(),
                        resource.clone(),
                    ));
                }
            }
            for (resource, shared) in &state.shared {
                for (session_id, lease) in &shared.holders {
                    let session = state.sessions.get_mut(session_id).ok_or_else(|| {
                        format!("a shared hold on {resource} names a missing session")
                    })?;
                    session.shared.insert(resource.clone());
                    if let Some(deadline_ms) = lease.max_hold_deadline_ms {
                        self.shared_max_hold_deadlines.insert((
                            deadline_ms,
                            namespace.clone(),
                            resource.clone(),
                            *session_id,
                        ));
                    }
                }
            }
            for (resource, line) in &state.lines {
                for waiter in line {
                    let session = state.sessions.get_mut(&waiter.session_id).ok_or_else(|| {
                        format!("a waiter in the line of {resource} names a missing session")
                    })?;
                    session.waits.insert(resource.clone());
                }
            }
            let queues: Vec<Name> = state.queues.keys().cloned().collect();
            for queue in queues {
                let Some(queue_state) = state.queues.get_mut(&queue) else {
                    continue;
                };
                queue_state.rebuild(self.time_ms);
                for (finished_ms, task_id) in queue_state.finished() {
                    self.finished.insert((
                        finished_ms,
                        namespace.clone(),
                        queue.clone(),
                        task_id.clone(),
                    ));
                }
                for (ready_at_ms, sequence, task_id) in queue_state.delayed(self.time_ms) {
                    self.delayed.insert((
                        ready_at_ms,
                        namespace.clone(),
                        queue.clone(),
                        sequence,
                        task_id.clone(),
                    ));
                }
            }
            for (session_id, claims) in claims_by_session(&state.queues) {
                let session = state
                    .sessions
                    .get_mut(&session_id)
                    .ok_or_else(|| format!("a claim in {namespace} names a missing session"))?;
                self.claim_deadlines
                    .insert((session.deadline_ms, namespace.clone(), session_id));
                session.claims.extend(claims);
            }
        }
        Ok(())
    }
}
