//! `check_invariants`: a walk over the whole state that fails loudly on any broken rule. Tests
//! call it after every applied entry; snapshot decoding calls it before trusting the bytes.

use std::collections::BTreeSet;

use super::{descendants, events, lease_deadline, LeaseMode, Machine};

impl Machine {
    /// Checks every structural rule of the state. O(leases · depth · log n).
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut fences = BTreeSet::new();
        let (mut sessions_seen, mut max_holds_seen) = (0usize, 0usize);
        let (mut claims_seen, mut sessions_with_claims, mut delayed_seen) =
            (0usize, 0usize, 0usize);
        let mut finished_seen = 0usize;
        let mut shared_max_holds_seen = 0usize;
        for (namespace, state) in &self.namespaces {
            if state.is_empty() {
                return Err(format!("namespace {namespace} is empty but kept"));
            }
            for (session_id, session) in &state.sessions {
                sessions_seen += 1;
                if !self.session_deadlines.contains(&(
                    session.deadline_ms,
                    namespace.clone(),
                    *session_id,
                )) {
                    return Err(format!(
                        "session {session_id} in {namespace} is missing from the deadline index"
                    ));
                }
                for resource in &session.leases {
                    if state
                        .leases
                        .get(resource)
                        .is_none_or(|lease| lease.session_id != *session_id)
                    {
                        return Err(format!(
                            "session {session_id} lists {resource}, which it does not hold"
                        ));
                    }
                }
            }
            for (resource, lease) in &state.leases {
                let Some(session) = state.sessions.get(&lease.session_id) else {
                    return Err(format!("lease on {resource} in {namespace} has no session"));
                };
                if !session.leases.contains(resource) {
                    return Err(format!(
                        "lease on {resource} is missing from its session's lease set"
                    ));
                }
                if lease.fence == 0 || lease.fence > self.fence_counter {
                    return Err(format!(
                        "lease on {resource} has fence {} outside 1..={}",
                        lease.fence, self.fence_counter
                    ));
                }
                if !fences.insert(lease.fence) {
                    return Err(format!("fence {} is held by two leases", lease.fence));
                }
                if lease.acquired_at_ms > self.time_ms {
                    return Err(format!("lease on {resource} was acquired in the future"));
                }
                if let Some(deadline_ms) = lease.max_hold_deadline_ms {
                    max_holds_seen += 1;
                    if !self.max_hold_deadlines.contains(&(
                        deadline_ms,
                        namespace.clone(),
                        resource.clone(),
                    )) {
                        return Err(format!(
                            "lease on {resource} is missing from the max-hold index"
                        ));
                    }
                }
                if self.time_ms >= lease_deadline(session, lease) {
                    continue;
                }
                for ancestor in resource.ancestors() {
                    if let Some((path, other)) = state.leases.get_key_value(ancestor) {
                        if other.mode == LeaseMode::Subtree
                            && self.live_view(state, path, other).is_some()
                        {
                            return Err(format!(
                                "live leases on {path} (subtree) and {resource} conflict"
                            ));
                        }
                    }
                }
                if lease.mode == LeaseMode::Subtree {
                    for (path, other) in descendants(&state.leases, resource) {
                        if self.live_view(state, path, other).is_some() {
                            return Err(format!(
                                "live leases on {resource} (subtree) and {path} conflict"
                            ));
                        }
                    }
                }
            }
            for (session_id, session) in &state.sessions {
                for resource in &session.shared {
                    if !state
                        .shared
                        .get(resource)
                        .is_some_and(|shared| shared.holders.contains_key(session_id))
                    {
                        return Err(format!(
                            "session {session_id} lists a shared hold on {resource} it does not have"
                        ));
                    }
                }
            }
            for (resource, shared) in &state.shared {
                if shared.holders.is_empty() || shared.holders.len() > shared.limit as usize {
                    return Err(format!(
                        "shared lease on {resource} has {} holders for limit {}",
                        shared.holders.len(),
                        shared.limit
                    ));
                }
                let mut live = false;
                for (session_id, lease) in &shared.holders {
                    let Some(session) = state.sessions.get(session_id) else {
                        return Err(format!("a shared hold on {resource} has no session"));
                    };
                    if lease.session_id != *session_id
                        || lease.mode
                            != (LeaseMode::Shared {
                                limit: shared.limit,
                            })
                        || !session.shared.contains(resource)
                    {
                        return Err(format!("a shared hold on {resource} is misfiled"));
                    }
                    if lease.fence == 0
                        || lease.fence > self.fence_counter
                        || !fences.insert(lease.fence)
                    {
                        return Err(format!(
                            "a shared hold on {resource} has a bad or repeated fence {}",
                            lease.fence
                        ));
                    }
                    if lease.acquired_at_ms > self.time_ms {
                        return Err(format!("a hold on {resource} was acquired in the future"));
                    }
                    if let Some(deadline_ms) = lease.max_hold_deadline_ms {
                        shared_max_holds_seen += 1;
                        if !self.shared_max_hold_deadlines.contains(&(
                            deadline_ms,
                            namespace.clone(),
                            resource.clone(),
                            *session_id,
                        )) {
                            return Err(format!(
                                "a hold on {resource} is missing from the max-hold index"
                            ));
                        }
                    }
                    live |= self.time_ms < lease_deadline(session, lease);
                }
                if !live {
                    continue;
                }
                // G2: live holders and a live lease of another kind on or above the path.
                let mut covering = resource.ancestors().filter_map(|ancestor| {
                    state
                        .leases
                        .get_key_value(ancestor)
                        .filter(|(_, other)| other.mode == LeaseMode::Subtree)
                });
                let conflicting = state
                    .leases
                    .get_key_value(resource)
                    .into_iter()
                    .chain(&mut covering)
                    .find(|(path, other)| self.live_view(state, path, other).is_some());
                if let Some((path, _)) = conflicting {
                    return Err(format!(
                        "live shared holders of {resource} and a live lease on {path} conflict"
                    ));
                }
            }
            for (resource, line) in &state.lines {
                if line.is_empty() {
                    return Err(format!("the line of {resource} is empty but kept"));
                }
                let mut seen = BTreeSet::new();
                for waiter in line {
                    if !seen.insert(waiter.session_id) {
                        return Err(format!(
                            "session {} waits twice in the line of {resource}",
                            waiter.session_id
                        ));
                    }
                    let Some(session) = state.sessions.get(&waiter.session_id) else {
                        return Err(format!("a waiter in the line of {resource} has no session"));
                    };
                    if !session.waits.contains(resource) {
                        return Err(format!(
                            "a waiter in the line of {resource} is missing from its session"
                        ));
                    }
                    if session.deadline_ms <= self.time_ms {
                        return Err(format!(
                            "a waiter in the line of {resource} has a dead session"
                        ));
                    }
                    if self
                        .lease_of(namespace, resource, waiter.session_id)
                        .is_some()
                    {
                        return Err(format!(
                            "session {} waits for {resource}, which it holds",
                            waiter.session_id
                        ));
                    }
                    if waiter.joined_at_ms > self.time_ms {
                        return Err(format!(
                            "a waiter joined the line of {resource} in the future"
                        ));
                    }
                }
                // Served in the apply that freed it: the first waiter cannot be granted.
                if let Some(first) = line.front() {
                    let grantable = self
                        .check_conflicts(namespace, resource, first.mode, Some(first.session_id))
                        .is_ok();
                    if grantable {
                        return Err(format!(
                            "the first waiter in the line of {resource} could be granted but waits"
                        ));
                    }
                }
            }
            for (session_id, session) in &state.sessions {
                for resource in &session.waits {
                    if !state.lines.get(resource).is_some_and(|line| {
                        line.iter().any(|waiter| waiter.session_id == *session_id)
                    }) {
                        return Err(format!(
                            "session {session_id} lists a place in the line of {resource} it does not have"
                        ));
                    }
                }
            }
            for (queue, queue_state) in &state.queues {
                queue_state.check(queue, self.time_ms)?;
                for (session_id, task_id, fence) in queue_state.claims() {
                    let claimed = (queue.clone(), task_id.clone());
                    if !state
                        .sessions
                        .get(&session_id)
                        .is_some_and(|session| session.claims.contains(&claimed))
                    {
                        return Err(format!(
                            "claim on {queue}/{task_id} is missing from its session"
                        ));
                    }
                    if fence == 0 || fence > self.fence_counter || !fences.insert(fence) {
                        return Err(format!(
                            "claim on {queue}/{task_id} has a bad or shared fence {fence}"
                        ));
                    }
                    claims_seen += 1;
                }
                for (ready_at_ms, sequence, task_id) in queue_state.delayed(self.time_ms) {
                    let entry = (
                        ready_at_ms,
                        namespace.clone(),
                        queue.clone(),
                        sequence,
                        task_id.clone(),
                    );
                    if !self.delayed.contains(&entry) {
                        return Err(format!(
                            "delayed task {queue}/{task_id} is missing from the delay index"
                        ));
                    }
                    delayed_seen += 1;
                }
                for (finished_ms, task_id) in queue_state.finished() {
                    let entry = (
                        finished_ms,
                        namespace.clone(),
                        queue.clone(),
                        task_id.clone(),
                    );
                    if !self.finished.contains(&entry) {
                        return Err(format!(
                            "finished task {queue}/{task_id} is missing from the retention index"
                        ));
                    }
                    if finished_ms > self.time_ms {
                        return Err(format!(
                            "task {queue}/{task_id} finished at {finished_ms}, after now"
                        ));
                    }
                    finished_seen += 1;
                }
            }
            for (session_id, session) in &state.sessions {
                if session.claims.is_empty() {
                    continue;
                }
                sessions_with_claims += 1;
                if !self.claim_deadlines.contains(&(
                    session.deadline_ms,
                    namespace.clone(),
                    *session_id,
                )) {
                    return Err(format!(
                        "session {session_id} holds claims but is missing from the claim index"
                    ));
                }
                if session.deadline_ms <= self.time_ms {
                    return Err(format!(
                        "session {session_id} is dead but its claims did not lapse"
                    ));
                }
            }
            for (key, entry) in &state.kv {
                if entry.revision == 0 || entry.revision > self.events.last_revision(namespace) {
                    return Err(format!(
                        "value under {key} has revision {} past the last one",
                        entry.revision
                    ));
                }
            }
        }
        if sessions_seen != self.session_deadlines.len() {
            return Err(format!(
                "{} sessions but {} deadline index entries",
                sessions_seen,
                self.session_deadlines.len()
            ));
        }
        if max_holds_seen != self.max_hold_deadlines.len() {
            return Err(format!(
                "{} max-held leases but {} index entries",
                max_holds_seen,
                self.max_hold_deadlines.len()
            ));
        }
        let session_claims: usize = self
            .namespaces
            .values()
            .flat_map(|state| state.sessions.values())
            .map(|session| session.claims.len())
            .sum();
        if session_claims != claims_seen || sessions_with_claims != self.claim_deadlines.len() {
            return Err(format!(
                "{claims_seen} claims on tasks but sessions list {session_claims}; {sessions_with_claims} claiming sessions but {} indexed",
                self.claim_deadlines.len()
            ));
        }
        if shared_max_holds_seen != self.shared_max_hold_deadlines.len() {
            return Err(format!(
                "{shared_max_holds_seen} max-held shared holds but {} index entries",
                self.shared_max_hold_deadlines.len()
            ));
        }
        if finished_seen != self.finished.len() {
            return Err(format!(
                "{finished_seen} finished tasks but {} in the retention index",
                self.finished.len()
            ));
        }
        if !self.compensations.is_empty() {
            return Err("compensations are owed between commands".to_owned());
        }
        if delayed_seen != self.delayed.len() {
            return Err(format!(
                "{delayed_seen} delayed tasks but {} in the delay index",
                self.delayed.len()
            ));
        }
        let per_namespace_max = self.limits.events_kept_max.max(1);
        for (namespace, window) in self.events.windows() {
            if window.events.len() > per_namespace_max {
                return Err(format!(
                    "{} events kept in {namespace}, more than {per_namespace_max}",
                    window.events.len()
                ));
            }
            let contiguous = window
                .events
                .iter()
                .zip(window.events.iter().skip(1))
                .all(|(a, b)| b.revision == a.revision + 1);
            let in_place = window
                .events
                .iter()
                .all(|event| &event.namespace == namespace);
            if !contiguous
                || !in_place
                || window
                    .events
                    .back()
                    .is_some_and(|last| last.revision != window.last_revision)
            {
                return Err(format!(
                    "the events of {namespace} have a gap, do not end at its last revision, or belong elsewhere"
                ));
            }
        }
        if !self.events.is_indexed() {
            return Err("the event windows' size index is stale".to_owned());
        }
        let total_max = per_namespace_max.saturating_mul(events::EVENTS_KEPT_TOTAL_FACTOR);
        if self.events.total() > total_max {
            return Err(format!(
                "{} events kept in all namespaces, more than {total_max}",
                self.events.total()
            ));
        }
        if self.idempotency.len() != self.idempotency.order_len()
            || !self.idempotency.is_ordered_by_time()
        {
            return Err("idempotency records and their order disagree".to_owned());
        }
        if self.idempotency.len() > self.limits.idempotency_keys_max {
            return Err("more idempotency records than idempotency_keys_max".to_owned());
        }
        for (namespace, session_id) in self.auth.owned_sessions() {
            let exists = self
                .namespaces
                .get(namespace)
                .is_some_and(|state| state.sessions.contains_key(session_id));
            if !exists {
                return Err(format!(
                    "session {session_id:?} in {namespace} has an owner but does not exist"
                ));
            }
        }
        Ok(())
    }
}
