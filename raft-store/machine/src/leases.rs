//! Sessions and leases: create, keepalive, acquire (with the G2 conflict rules), release, end,
//! and the bounded sweep of what has expired.
//!
//! Costs: acquire is O(depth · log n) (each ancestor is one lookup; a subtree acquire also
//! visits the leases below its path, which it must rule out anyway); keepalive is O(log n)
//! whatever the number of leases, because a lease's liveness is read from its session's
//! deadline rather than stored on each lease.

use super::command::{EventKind, Grant, LeaseView, NewSession, Owner, Rejection, Reply};
use super::shared::InTheWay;
use super::{
    descendants, Labels, Lease, LeaseMode, Machine, Namespace, NamespaceState, ResourcePath,
    Session, SessionId,
};

impl Machine {
    pub(super) fn create_session(
        &mut self,
        namespace: &Namespace,
        new_session: &NewSession,
    ) -> Result<Reply, Rejection> {
        self.check_new_session(namespace, new_session)?;
        self.insert_session(namespace, new_session);
        let state = &self.namespaces[namespace];
        let view = self.session_view(
            new_session.session_id,
            &state.sessions[&new_session.session_id],
        );
        Ok(Reply::SessionCreated(view))
    }

    pub(super) fn keepalive(
        &mut self,
        namespace: &Namespace,
        session_id: SessionId,
    ) -> Result<Reply, Rejection> {
        let time_ms = self.time_ms;
        let session = self.live_session_mut(namespace, session_id)?;
        let old_deadline_ms = session.deadline_ms;
        session.deadline_ms = time_ms + session.ttl_ms;
        let (new_deadline_ms, expires_in_ms) = (session.deadline_ms, session.ttl_ms);
        self.session_deadlines
            .remove(&(old_deadline_ms, namespace.clone(), session_id));
        self.session_deadlines
            .insert((new_deadline_ms, namespace.clone(), session_id));
        self.move_claim_deadline(namespace, session_id, old_deadline_ms, new_deadline_ms);
        Ok(Reply::KeptAlive {
            session_id,
            expires_in_ms,
        })
    }

    pub(super) fn release(
        &mut self,
        namespace: &Namespace,
        session_id: SessionId,
        resource: &ResourcePath,
    ) -> Result<Reply, Rejection> {
        let view = self.check_release(namespace, session_id, resource)?;
        let event = EventKind::Released {
            resource: resource.clone(),
            fence: view.fence,
        };
        if matches!(view.mode, LeaseMode::Shared { .. }) {
            self.remove_hold(namespace, resource, session_id, event);
        } else {
            self.remove_lease(namespace, resource, event);
        }
        Ok(Reply::Released {
            resource: resource.clone(),
            fence: view.fence,
        })
    }

    pub(super) fn end_session(
        &mut self,
        namespace: &Namespace,
        session_id: SessionId,
    ) -> Result<Reply, Rejection> {
        let live = self
            .namespaces
            .get(namespace)
            .and_then(|state| state.sessions.get(&session_id))
            .is_some_and(|session| self.time_ms < session.deadline_ms);
        if !live {
            return Err(Rejection::NotFound(
                "no live session with this id: it ended or expired".to_owned(),
            ));
        }
        let mut released = Vec::new();
        for (resource, shared) in self.holdings(namespace, session_id, usize::MAX) {
            let state = &self.namespaces[namespace];
            let lease = self.held_lease(state, &resource, session_id, shared);
            let fence = lease.fence;
            let live = self.live_view(state, &resource, lease).is_some();
            let event = if live {
                EventKind::Released {
                    resource: resource.clone(),
                    fence,
                }
            } else {
                EventKind::Expired {
                    resource: resource.clone(),
                    fence,
                }
            };
            self.remove_holding(namespace, &resource, session_id, shared, event);
            if live {
                released.push(resource);
            }
        }
        self.leave_lines(namespace, session_id);
        // Its claims lapse now, as if it had expired: each counts as an attempt.
        self.lapse_claims(namespace, session_id);
        self.remove_session(namespace, session_id);
        Ok(Reply::SessionEnded { released })
    }

    pub(super) fn acquire(
        &mut self,
        namespace: &Namespace,
        resource: &ResourcePath,
        mode: LeaseMode,
        owner: &Owner,
        max_hold_ms: Option<u64>,
        labels: &Labels,
    ) -> Result<Reply, Rejection> {
        self.check_owner(namespace, owner)?;
        let acting = match owner {
            Owner::Session(session_id) => Some(*session_id),
            Owner::NewSession(_) => None,
        };
        let dead_in_the_way = self.check_conflicts(namespace, resource, mode, acting)?;
        self.refuse_if_waiters(namespace, resource)?;
        self.clear_dead(namespace, dead_in_the_way);
        let (session_id, session_created) = match owner {
            Owner::Session(session_id) => (*session_id, false),
            Owner::NewSession(new_session) => {
                self.insert_session(namespace, new_session);
                (new_session.session_id, true)
            }
        };
        let grant = self.grant(
            namespace,
            resource,
            mode,
            session_id,
            session_created,
            max_hold_ms,
            labels,
        );
        Ok(Reply::Granted(grant))
    }

    /// Whether `owner` may take one more lease or place in line: a live session below
    /// `leases_per_session_max`, or a new session the namespace has room for.
    pub(super) fn check_owner(
        &mut self,
        namespace: &Namespace,
        owner: &Owner,
    ) -> Result<(), Rejection> {
        match owner {
            Owner::Session(session_id) => {
                let session = self.live_session_mut(namespace, *session_id)?;
                if session.held() >= self.limits.leases_per_session_max {
                    return Err(Rejection::ResourceExhausted(format!(
                        "this session already holds {} leases, claims and places in line, the most a session may hold; release some or use another session",
                        self.limits.leases_per_session_max
                    )));
                }
                Ok(())
            }
            Owner::NewSession(new_session) => self.check_new_session(namespace, new_session),
        }
    }

    /// Grants `resource` to the live `session_id` (checked free by `check_conflicts`, dead
    /// leases in the way cleared), taking the session out of the resource's line if it waited.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn grant(
        &mut self,
        namespace: &Namespace,
        resource: &ResourcePath,
        mode: LeaseMode,
        session_id: SessionId,
        session_created: bool,
        max_hold_ms: Option<u64>,
        labels: &Labels,
    ) -> Grant {
        if self.namespaces[namespace].sessions[&session_id]
            .waits
            .contains(resource)
        {
            self.remove_waiter(namespace, resource, session_id);
        }
        self.fence_counter += 1;
        let fence = self.fence_counter;
        let max_hold_deadline_ms = max_hold_ms.map(|max_hold_ms| self.time_ms + max_hold_ms);
        let lease = Lease {
            session_id,
            fence,
            mode,
            labels: labels.clone(),
            acquired_at_ms: self.time_ms,
            max_hold_deadline_ms,
        };
        if let LeaseMode::Shared { limit } = mode {
            self.insert_hold(namespace, resource, limit, lease);
        } else {
            if let Some(deadline_ms) = max_hold_deadline_ms {
                self.max_hold_deadlines
                    .insert((deadline_ms, namespace.clone(), resource.clone()));
            }
            let state = self.namespaces.entry(namespace.clone()).or_default();
            state
                .sessions
                .get_mut(&session_id)
                .expect("the owner session was checked live")
                .leases
                .insert(resource.clone());
            state.leases.insert(resource.clone(), lease);
        }
        let holder = self.namespaces[namespace].sessions[&session_id]
            .holder
            .clone();
        self.record(
            namespace,
            EventKind::Granted {
                resource: resource.clone(),
                holder,
                fence,
                mode,
            },
        );
        let view = self
            .lease_of(namespace, resource, session_id)
            .expect("a lease just granted is live");
        Grant {
            lease: view,
            session_id,
            session_created,
        }
    }

    /// Finds what stands in the way of a `mode` lease on `resource` (G2). A live conflicting
    /// lease refuses the acquire with `LEASE_HELD`; dead leases that occupy the same path or lie
    /// below a subtree request are returned so the grant can clear them (emitting `expired`).
    pub(super) fn check_conflicts(
        &self,
        namespace: &Namespace,
        resource: &ResourcePath,
        mode: LeaseMode,
        session: Option<SessionId>,
    ) -> Result<Vec<InTheWay>, Rejection> {
        let mut dead_in_the_way = Vec::new();
        let Some(state) = self.namespaces.get(namespace) else {
            return Ok(dead_in_the_way);
        };
        // In the order a refusal names them: the path itself (one kind of lease at a time),
        // the subtree leases above it, then what lies below a subtree request, in path order.
        if let Some(lease) = state.leases.get(resource) {
            self.refuse_if_live(state, resource, resource, lease)?;
            dead_in_the_way.push(InTheWay::Lease(resource.clone(), lease.fence));
        }
        self.check_shared(
            state,
            resource,
            resource,
            mode,
            session,
            &mut dead_in_the_way,
        )?;
        for ancestor in resource.ancestors() {
            if let Some((path, lease)) = state.leases.get_key_value(ancestor) {
                if lease.mode == LeaseMode::Subtree {
                    self.refuse_if_live(state, resource, path, lease)?;
                }
            }
        }
        if mode == LeaseMode::Subtree {
            let mut below: Vec<&ResourcePath> = descendants(&state.leases, resource)
                .map(|(path, _)| path)
                .chain(descendants(&state.shared, resource).map(|(path, _)| path))
                .collect();
            below.sort();
            for path in below {
                match state.leases.get(path) {
                    Some(lease) => {
                        self.refuse_if_live(state, resource, path, lease)?;
                        dead_in_the_way.push(InTheWay::Lease(path.clone(), lease.fence));
                    }
                    None => self.check_shared(
                        state,
                        resource,
                        path,
                        mode,
                        session,
                        &mut dead_in_the_way,
                    )?,
                }
            }
        }
        Ok(dead_in_the_way)
    }

    /// `LEASE_HELD` when `lease`, on `path`, is live. The message names the `requested` path
    /// and, when the lease is another path's (a subtree above it, or a lease below a subtree
    /// request), that path too.
    fn refuse_if_live(
        &self,
        state: &NamespaceState,
        requested: &ResourcePath,
        path: &ResourcePath,
        lease: &Lease,
    ) -> Result<(), Rejection> {
        match self.live_view(state, path, lease) {
            None => Ok(()),
            Some(held_by) => Err(Rejection::LeaseHeld {
                message: format!(
                    "{} {} (fence {}) for {} more",
                    what_is_held(requested, path),
                    held_by.holder,
                    held_by.fence,
                    human_duration(held_by.expires_in_ms)
                ),
                held_by: Box::new(held_by),
                holders: Vec::new(),
                holders_total: 0,
            }),
        }
    }

    /// Removes up to `max` dead things: leases of expired sessions (then the sessions once
    /// empty) and leases past their max hold. Returns `(leases, sessions)` removed.
    pub(super) fn sweep(&mut self, max: usize) -> (u64, u64) {
        let max = max.min(self.limits.sweep_batch_max);
        let (mut leases, mut sessions) = (0u64, 0u64);
        let mut work = 0usize;
        while work < max {
            let Some((deadline_ms, namespace, session_id)) =
                self.session_deadlines.get_min().cloned()
            else {
                break;
            };
            if deadline_ms > self.time_ms {
                break;
            }
            for (resource, shared) in self.holdings(&namespace, session_id, max - work) {
                let state = &self.namespaces[&namespace];
                let fence = self.held_lease(state, &resource, session_id, shared).fence;
                let event = EventKind::Expired {
                    resource: resource.clone(),
                    fence,
                };
                self.remove_holding(&namespace, &resource, session_id, shared, event);
                leases += 1;
                work += 1;
            }
            let session = &self.namespaces[&namespace].sessions[&session_id];
            if session.leases.is_empty() && session.shared.is_empty() {
                self.remove_session(&namespace, session_id);
                sessions += 1;
                work += 1;
            }
        }
        while work < max {
            let Some((deadline_ms, namespace, resource)) =
                self.max_hold_deadlines.get_min().cloned()
            else {
                break;
            };
            if deadline_ms > self.time_ms {
                break;
            }
            let fence = self.namespaces[&namespace].leases[&resource].fence;
            self.remove_lease(
                &namespace,
                &resource,
                EventKind::Expired {
                    resource: resource.clone(),
                    fence,
                },
            );
            leases += 1;
            work += 1;
        }
        while work < max {
            let Some((deadline_ms, namespace, resource, session_id)) =
                self.shared_max_hold_deadlines.get_min().cloned()
            else {
                break;
            };
            if deadline_ms > self.time_ms {
                break;
            }
            let fence = self.namespaces[&namespace].shared[&resource].holders[&session_id].fence;
            let event = EventKind::Expired {
                resource: resource.clone(),
                fence,
            };
            self.remove_hold(&namespace, &resource, session_id, event);
            leases += 1;
            work += 1;
        }
        (leases, sessions)
    }

    /// Up to `max` of the paths `session_id` holds, in path order, each with whether it holds
    /// it shared.
    fn holdings(
        &self,
        namespace: &Namespace,
        session_id: SessionId,
        max: usize,
    ) -> Vec<(ResourcePath, bool)> {
        let session = &self.namespaces[namespace].sessions[&session_id];
        let mut held: Vec<(ResourcePath, bool)> = session
            .leases
            .iter()
            .take(max)
            .map(|resource| (resource.clone(), false))
            .chain(
                session
                    .shared
                    .iter()
                    .take(max)
                    .map(|resource| (resource.clone(), true)),
            )
            .collect();
        held.sort();
        held.truncate(max);
        held
    }

    /// The lease `session_id` holds on `resource` (listed by `holdings`).
    fn held_lease<'a>(
        &self,
        state: &'a NamespaceState,
        resource: &ResourcePath,
        session_id: SessionId,
        shared: bool,
    ) -> &'a Lease {
        if shared {
            &state.shared[resource].holders[&session_id]
        } else {
            &state.leases[resource]
        }
    }

    fn remove_holding(
        &mut self,
        namespace: &Namespace,
        resource: &ResourcePath,
        session_id: SessionId,
        shared: bool,
        event: EventKind,
    ) {
        if shared {
            self.remove_hold(namespace, resource, session_id, event);
        } else {
            self.remove_lease(namespace, resource, event);
        }
    }

    pub(super) fn check_new_session(
        &self,
        namespace: &Namespace,
        new_session: &NewSession,
    ) -> Result<(), Rejection> {
        let sessions = self
            .namespaces
            .get(namespace)
            .map_or(0, |state| state.sessions.len());
        if sessions >= self.limits.sessions_per_namespace_max {
            return Err(Rejection::ResourceExhausted(format!(
                "namespace {namespace} already has {sessions} sessions, the most allowed; end unused sessions or retry later"
            )));
        }
        if self
            .namespaces
            .get(namespace)
            .is_some_and(|state| state.sessions.contains_key(&new_session.session_id))
        {
            return Err(Rejection::invalid(
                "session id already in use: retry with a fresh request",
            ));
        }
        Ok(())
    }

    pub(super) fn insert_session(&mut self, namespace: &Namespace, new_session: &NewSession) {
        let deadline_ms = self.time_ms + new_session.ttl_ms;
        let session = Session {
            holder: new_session.holder.clone(),
            ttl_ms: new_session.ttl_ms,
            labels: new_session.labels.clone(),
            deadline_ms,
            leases: Default::default(),
            shared: Default::default(),
            claims: Default::default(),
            waits: Default::default(),
        };
        self.namespaces
            .entry(namespace.clone())
            .or_default()
            .sessions
            .insert(new_session.session_id, session);
        self.session_deadlines
            .insert((deadline_ms, namespace.clone(), new_session.session_id));
    }

    /// The live lease `session_id` holds on `resource`, which it may release; else
    /// `LEASE_LOST`.
    pub(super) fn check_release(
        &self,
        namespace: &Namespace,
        session_id: SessionId,
        resource: &ResourcePath,
    ) -> Result<LeaseView, Rejection> {
        let state = self
            .namespaces
            .get(namespace)
            .filter(|state| {
                state
                    .sessions
                    .get(&session_id)
                    .is_some_and(|session| self.time_ms < session.deadline_ms)
            })
            .ok_or_else(session_gone)?;
        state
            .leases
            .get(resource)
            .filter(|lease| lease.session_id == session_id)
            .or_else(|| state.shared.get(resource)?.holders.get(&session_id))
            .and_then(|lease| self.live_view(state, resource, lease))
            .ok_or_else(|| {
                Rejection::LeaseLost(format!("this session holds no live lease on {resource}"))
            })
    }

    /// The session if it is alive at the current cluster time, else `LEASE_LOST`.
    pub(super) fn live_session_mut(
        &mut self,
        namespace: &Namespace,
        session_id: SessionId,
    ) -> Result<&mut Session, Rejection> {
        let time_ms = self.time_ms;
        self.namespaces
            .get_mut(namespace)
            .and_then(|state| state.sessions.get_mut(&session_id))
            .filter(|session| time_ms < session.deadline_ms)
            .ok_or_else(session_gone)
    }

    /// Removes a lease and everything that points at it, and records `event`.
    pub(super) fn remove_lease(
        &mut self,
        namespace: &Namespace,
        resource: &ResourcePath,
        event: EventKind,
    ) {
        let state = self
            .namespaces
            .get_mut(namespace)
            .expect("the lease's namespace exists");
        let lease = state.leases.remove(resource).expect("the lease exists");
        if let Some(session) = state.sessions.get_mut(&lease.session_id) {
            session.leases.remove(resource);
        }
        if let Some(deadline_ms) = lease.max_hold_deadline_ms {
            self.max_hold_deadlines
                .remove(&(deadline_ms, namespace.clone(), resource.clone()));
        }
        self.record(namespace, event);
        self.lines_freed_by(namespace, resource, lease.mode == LeaseMode::Subtree);
    }

    fn remove_session(&mut self, namespace: &Namespace, session_id: SessionId) {
        let state = self
            .namespaces
            .get_mut(namespace)
            .expect("the session's namespace exists");
        let session = state
            .sessions
            .remove(&session_id)
            .expect("the session exists");
        assert!(
            session.held() == 0,
            "a session is removed only after its leases and claims"
        );
        self.session_deadlines
            .remove(&(session.deadline_ms, namespace.clone(), session_id));
        self.auth.forget_session(namespace, session_id);
        if state.is_empty() {
            self.namespaces.remove(namespace);
        }
    }
}

fn session_gone() -> Rejection {
    Rejection::LeaseLost("the session is gone (expired or ended): stop acting as holder".to_owned())
}

/// `38s`, `2m5s`, `450ms`: how long a lease has left, for messages.
pub(super) fn human_duration(milliseconds: u64) -> String {
    if milliseconds < 1_000 {
        return format!("{milliseconds}ms");
    }
    let seconds = milliseconds.div_ceil(1_000);
    match (seconds / 60, seconds % 60) {
        (0, seconds) => format!("{seconds}s"),
        (minutes, 0) => format!("{minutes}m"),
        (minutes, seconds) => format!("{minutes}m{seconds}s"),
    }
}

/// How a refusal opens: `a/b is held by`, `a/b/c is inside a/b, held (subtree) by`, or
/// `a (subtree) covers a/b, held by`; so a denial names the path asked for and the path of
/// the lease in its way.
pub(super) fn what_is_held(requested: &ResourcePath, path: &ResourcePath) -> String {
    if requested == path {
        format!("{path} is held by")
    } else if requested
        .ancestors()
        .any(|ancestor| ancestor == path.as_str())
    {
        format!("{requested} is inside {path}, held (subtree) by")
    } else {
        format!("{requested} (subtree) covers {path}, held by")
    }
}
