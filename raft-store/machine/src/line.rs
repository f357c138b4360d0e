//! The line: acquires that wait instead of being refused.
//!
//! An acquire made with `wait_ms` (`Op::AcquireOrWait`) that the resource's holders refuse
//! joins the resource's line: replicated state, first come first served. Whenever something
//! that could stand in a waiter's way goes away (a release, a session's end, a lease's expiry
//! or max hold, a waiter leaving), the paths it could free are served in the same apply: the
//! first waiter is granted if it can be, then the next, and so on; serving stops at the first
//! waiter that still cannot be granted, so nobody overtakes the waiter ahead of them (shared
//! waiters in a row are granted together). A waiting acquire never overtakes the line either:
//! while waiters are ahead it joins behind them even if it could be granted.
//!
//! Expiry needs no command to free anything (docs/guarantees.md, "Time"), so at the start of
//! each entry, before any of its commands, the sessions that died since the previous entry's
//! time leave the lines they waited in (each with a `left_line` event), and the paths whose
//! holders died are served. An ended session leaves its lines the same way. So every waiter
//! has a live session, and between commands no line's first waiter could be granted.
//!
//! A session's places in lines count towards `leases_per_session_max`, and towards its
//! token's `leases_max`, which the line checks again before it grants (a place past the quota
//! leaves the line with its `left_line` event instead). An acquire without `wait_ms` never
//! joins a line, and is refused while anyone waits in the path's line.

use std::collections::{BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use super::command::{EventKind, Grant, Owner, Queued, Rejection, Reply};
use super::{
    descendants, Labels, LeaseMode, LeaseView, Machine, Namespace, ResourcePath, SessionId,
};

/// One acquire waiting in a resource's line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Waiter {
    pub(super) session_id: SessionId,
    pub(super) mode: LeaseMode,
    pub(super) labels: Labels,
    pub(super) max_hold_ms: Option<u64>,
    pub(super) joined_at_ms: u64,
}

/// The waiters of one resource, first come first.
pub(super) type Line = VecDeque<Waiter>;

impl Machine {
    /// `acquire`, except that a refusal because the resource is held (or because waiters are
    /// ahead) joins the line instead; a session already in the line keeps its place and
    /// learns it, and one already granted the lease it asks for gets that grant again.
    pub(super) fn acquire_or_wait(
        &mut self,
        namespace: &Namespace,
        resource: &ResourcePath,
        mode: LeaseMode,
        owner: &Owner,
        max_hold_ms: Option<u64>,
        labels: &Labels,
    ) -> Result<Reply, Rejection> {
        let acting = match owner {
            Owner::Session(session_id) => {
                self.live_session_mut(namespace, *session_id)?;
                if let Some(position) = self.line_position(namespace, resource, *session_id) {
                    return Ok(Reply::Queued(Queued {
                        resource: resource.clone(),
                        session_id: *session_id,
                        session_created: false,
                        position,
                        joined: false,
                    }));
                }
                // Granted from the line since it asked: the answer is that grant.
                if let Some(lease) = self
                    .lease_of(namespace, resource, *session_id)
                    .filter(|lease| lease.mode == mode)
                {
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
        let ahead = self.waiting(namespace, resource);
        match self.check_conflicts(namespace, resource, mode, acting) {
            Ok(_) if ahead == 0 => {
                return self.acquire(namespace, resource, mode, owner, max_hold_ms, labels)
            }
            Ok(_) => {}
            Err(Rejection::LeaseHeld { held_by, .. }) => {
                // Never wait for oneself: a lease of the session's own on the path, or the
                // one that refuses it.
                let own =
                    acting.and_then(|session_id| self.lease_of(namespace, resource, session_id));
                if let Some(own) = own {
                    return Err(Rejection::LeaseHeld {
                        message: format!(
                            "this session already holds {resource} (fence {}): release it before waiting for it again",
                            own.fence
                        ),
                        held_by: Box::new(own),
                        holders: Vec::new(),
                        holders_total: 0,
                    });
                }
                if self.is_held_by(namespace, &held_by, acting) {
                    return Err(Rejection::LeaseHeld {
                        message: format!(
                            "{resource} is kept out by this session's own lease on {} (fence {}): release that first",
                            held_by.resource, held_by.fence
                        ),
                        held_by,
                        holders: Vec::new(),
                        holders_total: 0,
                    });
                }
            }
            Err(refused) => return Err(refused),
        }
        let (session_id, session_created) = match owner {
            Owner::Session(session_id) => (*session_id, false),
            Owner::NewSession(new_session) => {
                self.insert_session(namespace, new_session);
                (new_session.session_id, true)
            }
        };
        let state = self
            .namespaces
            .get_mut(namespace)
            .expect("the waiter's session lives in this namespace");
        state
            .lines
            .entry(resource.clone())
            .or_default()
            .push_back(Waiter {
                session_id,
                mode,
                labels: labels.clone(),
                max_hold_ms,
                joined_at_ms: self.time_ms,
            });
        let session = state
            .sessions
            .get_mut(&session_id)
            .expect("the waiter's session was checked live");
        session.waits.insert(resource.clone());
        let holder = session.holder.clone();
        self.record(
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

    /// Takes `session_id` out of `resource`'s line if it waits there, else releases its lease
    /// on `resource`: whichever it has, in one write, so a grant racing the request is
    /// released rather than left behind.
    pub(super) fn leave_or_release(
        &mut self,
        namespace: &Namespace,
        session_id: SessionId,
        resource: &ResourcePath,
    ) -> Result<Reply, Rejection> {
        self.live_session_mut(namespace, session_id)?;
        if self
            .line_position(namespace, resource, session_id)
            .is_some()
        {
            self.leave_line(namespace, resource, session_id);
            return Ok(Reply::LeftLine {
                resource: resource.clone(),
            });
        }
        self.release(namespace, session_id, resource)
    }

    /// `LEASE_HELD` when anyone waits in `resource`'s line: an acquire that does not wait
    /// never overtakes them. It names what keeps the first waiter out.
    pub(super) fn refuse_if_waiters(
        &self,
        namespace: &Namespace,
        resource: &ResourcePath,
    ) -> Result<(), Rejection> {
        let waiting = self.waiting(namespace, resource);
        if waiting == 0 {
            return Ok(());
        }
        let state = &self.namespaces[namespace];
        let first = &state.lines[resource][0];
        match self.check_conflicts(namespace, resource, first.mode, Some(first.session_id)) {
            Err(Rejection::LeaseHeld {
                message,
                held_by,
                holders,
                holders_total,
            }) => Err(Rejection::LeaseHeld {
                message: format!("{resource} has {waiting} acquires waiting in line; {message}"),
                held_by,
                holders,
                holders_total,
            }),
            // A shared lease whose limit the first waiter does not give keeps it out: name
            // its holders. (The first waiter is never grantable between commands, so `Ok`
            // does not happen; it would let the acquire through.)
            Err(_) => {
                let holders: Vec<LeaseView> = self.leases_on(state, resource);
                let Some(held_by) = holders.first().cloned() else {
                    return Ok(());
                };
                Err(Rejection::LeaseHeld {
                    message: format!(
                        "{resource} has {waiting} acquires waiting in line; it is held by {} (fence {})",
                        held_by.holder, held_by.fence
                    ),
                    held_by: Box::new(held_by),
                    holders_total: holders.len() as u32,
                    holders,
                })
            }
            Ok(_) => Ok(()),
        }
    }

    /// Whether the live lease `view` is held by `session` (so waiting for it would be waiting
    /// for oneself).
    fn is_held_by(
        &self,
        namespace: &Namespace,
        view: &LeaseView,
        session: Option<SessionId>,
    ) -> bool {
        session.is_some_and(|session_id| {
            self.lease_of(namespace, &view.resource, session_id)
                .is_some_and(|own| own.fence == view.fence)
        })
    }

    /// The number of waiters in `resource`'s line (every one with a live session).
    fn waiting(&self, namespace: &Namespace, resource: &ResourcePath) -> u32 {
        self.namespaces
            .get(namespace)
            .and_then(|state| state.lines.get(resource))
            .map_or(0, |line| line.len() as u32)
    }

    /// The sessions waiting in `resource`'s line, first come first (session ids: for the node
    /// and tests, never shown to other callers).
    pub fn waiters(&self, namespace: &Namespace, resource: &ResourcePath) -> Vec<SessionId> {
        self.namespaces
            .get(namespace)
            .and_then(|state| state.lines.get(resource))
            .map_or_else(Vec::new, |line| {
                line.iter().map(|waiter| waiter.session_id).collect()
            })
    }

    /// `session_id`'s place in `resource`'s line (1 = next).
    pub fn line_position(
        &self,
        namespace: &Namespace,
        resource: &ResourcePath,
        session_id: SessionId,
    ) -> Option<u32> {
        let line = self.namespaces.get(namespace)?.lines.get(resource)?;
        let index = line
            .iter()
            .position(|waiter| waiter.session_id == session_id)?;
        Some(index as u32 + 1)
    }

    /// The live lease `session_id` holds on exactly `resource`, if any.
    pub fn lease_of(
        &self,
        namespace: &Namespace,
        resource: &ResourcePath,
        session_id: SessionId,
    ) -> Option<LeaseView> {
        let state = self.namespaces.get(namespace)?;
        let lease = state
            .leases
            .get(resource)
            .filter(|lease| lease.session_id == session_id)
            .or_else(|| state.shared.get(resource)?.holders.get(&session_id))?;
        self.live_view(state, resource, lease)
    }

    /// Removes `session_id` from `resource`'s line with a `line_left` event, and serves the
    /// line (those behind may be grantable now).
    pub(super) fn leave_line(
        &mut self,
        namespace: &Namespace,
        resource: &ResourcePath,
        session_id: SessionId,
    ) {
        self.remove_waiter(namespace, resource, session_id);
        let holder = self.namespaces[namespace].sessions[&session_id]
            .holder
            .clone();
        self.record(
            namespace,
            EventKind::LeftLine {
                resource: resource.clone(),
                holder,
            },
        );
        self.to_serve.insert((namespace.clone(), resource.clone()));
    }

    /// Takes a session that ends or died out of every line it waits in.
    pub(super) fn leave_lines(&mut self, namespace: &Namespace, session_id: SessionId) {
        let waits: Vec<ResourcePath> = self.namespaces[namespace].sessions[&session_id]
            .waits
            .iter()
            .cloned()
            .collect();
        for resource in &waits {
            self.leave_line(namespace, resource, session_id);
        }
    }

    /// Takes `session_id`'s waiter out of `resource`'s line (and the line when it empties).
    pub(super) fn remove_waiter(
        &mut self,
        namespace: &Namespace,
        resource: &ResourcePath,
        session_id: SessionId,
    ) {
        let state = self
            .namespaces
            .get_mut(namespace)
            .expect("the waiter's namespace exists");
        let line = state.lines.get_mut(resource).expect("the line exists");
        line.retain(|waiter| waiter.session_id != session_id);
        if line.is_empty() {
            state.lines.remove(resource);
        }
        state
            .sessions
            .get_mut(&session_id)
            .expect("a waiter's session exists")
            .waits
            .remove(resource);
    }

    /// Notes the lines that a lease (or hold) going away from `resource` may unblock: its
    /// own, its ancestors' (subtree waiters), and, for a subtree lease, its descendants'.
    pub(super) fn lines_freed_by(
        &mut self,
        namespace: &Namespace,
        resource: &ResourcePath,
        subtree: bool,
    ) {
        let Some(state) = self.namespaces.get(namespace) else {
            return;
        };
        if state.lines.is_empty() {
            return;
        }
        let mut paths: Vec<ResourcePath> = std::iter::once(resource.as_str())
            .chain(resource.ancestors())
            .filter_map(|path| state.lines.get_key_value(path))
            .map(|(path, _)| path.clone())
            .collect();
        if subtree {
            paths.extend(descendants(&state.lines, resource).map(|(path, _)| path.clone()));
        }
        self.to_serve
            .extend(paths.into_iter().map(|path| (namespace.clone(), path)));
    }

    /// Serves every line noted since the last call, and the lines those grants unblock.
    pub(super) fn serve_lines(&mut self) {
        while let Some((namespace, resource)) = self.to_serve.remove_min() {
            self.serve_line(&namespace, &resource);
        }
    }

    /// Grants `resource` to the waiters at the front of its line while they can be granted.
    fn serve_line(&mut self, namespace: &Namespace, resource: &ResourcePath) {
        loop {
            let Some(state) = self.namespaces.get(namespace) else {
                return;
            };
            let Some(head) = state.lines.get(resource).and_then(|line| line.front()) else {
                return;
            };
            let head = head.clone();
            let Ok(dead) =
                self.check_conflicts(namespace, resource, head.mode, Some(head.session_id))
            else {
                return;
            };
            if self.grant_past_quota(namespace, head.session_id) {
                // Its token may hold no more: the place is given up, not granted, and the
                // line goes on with the next waiter.
                self.leave_line(namespace, resource, head.session_id);
                self.to_serve.remove(&(namespace.clone(), resource.clone()));
                continue;
            }
            self.clear_dead(namespace, dead);
            self.grant(
                namespace,
                resource,
                head.mode,
                head.session_id,
                false,
                head.max_hold_ms,
                &head.labels,
            );
        }
    }

    /// At the start of an entry: the sessions that died by time since `before_ms` leave their
    /// lines, then the lines of whatever died (those sessions' leases, leases past their max
    /// hold) are served, so the first waiter gets a dead holder's resource before any command
    /// can take it.
    pub(super) fn serve_lines_freed_by_time(&mut self, before_ms: u64) {
        if before_ms >= self.time_ms || self.namespaces.values().all(|state| state.lines.is_empty())
        {
            return;
        }
        let time_ms = self.time_ms;
        // What died in (before_ms, time_ms]: the deadline indexes from just after before_ms.
        let from = before_ms + 1;
        let sessions: Vec<(Namespace, SessionId)> = self
            .session_deadlines
            .range((from, Namespace::below_all(), SessionId(0))..)
            .take_while(|(deadline_ms, _, _)| *deadline_ms <= time_ms)
            .map(|(_, namespace, session_id)| (namespace.clone(), *session_id))
            .collect();
        let mut freed: BTreeSet<(Namespace, ResourcePath, bool)> = BTreeSet::new();
        for (namespace, session_id) in &sessions {
            self.leave_lines(namespace, *session_id);
            let state = &self.namespaces[namespace];
            let session = &state.sessions[session_id];
            for resource in &session.leases {
                let subtree = state.leases[resource].mode == LeaseMode::Subtree;
                freed.insert((namespace.clone(), resource.clone(), subtree));
            }
            for resource in &session.shared {
                freed.insert((namespace.clone(), resource.clone(), false));
            }
        }
        for (_, namespace, resource) in self
            .max_hold_deadlines
            .range((from, Namespace::below_all(), ResourcePath::below_all())..)
            .take_while(|(deadline_ms, _, _)| *deadline_ms <= time_ms)
        {
            let subtree = self.namespaces[namespace].leases[resource].mode == LeaseMode::Subtree;
            freed.insert((namespace.clone(), resource.clone(), subtree));
        }
        for (_, namespace, resource, _) in self
            .shared_max_hold_deadlines
            .range(
                (
                    from,
                    Namespace::below_all(),
                    ResourcePath::below_all(),
                    SessionId(0),
                )..,
            )
            .take_while(|(deadline_ms, _, _, _)| *deadline_ms <= time_ms)
        {
            freed.insert((namespace.clone(), resource.clone(), false));
        }
        for (namespace, resource, subtree) in freed {
            self.lines_freed_by(&namespace, &resource, subtree);
        }
        self.serve_lines();
    }
}
