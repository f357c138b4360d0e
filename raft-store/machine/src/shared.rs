//! Shared leases (semaphores): a path held in `shared` mode by up to `limit` sessions at once,
//! each holder with its own lease and its own rising fence.
//!
//! G2 with shared holders: they count as one conflicting set. A shared acquire is refused by a
//! live exclusive lease on the path, a live subtree lease on the path or an ancestor, a live
//! holder set with another limit (`INVALID_ARGUMENT`: every holder gives the same limit), the
//! session's own live hold, or `limit` live holders; an exclusive or subtree acquire is refused
//! by any live holder of the path (and a subtree one by any live holder below it). Each holder
//! lives and dies like any lease: with its session, or at its max hold. Holders whose lease is
//! dead but not swept yet are cleared by the next grant that needs their place, each with its
//! `expired` event.

use super::command::{EventKind, LeaseView, Rejection};
use super::leases::human_duration;
use super::{Lease, Machine, Namespace, NamespaceState, ResourcePath, SessionId};

/// The most holders a `LEASE_HELD` refusal lists.
const HOLDERS_LISTED_MAX: usize = 10;

/// Something dead that a grant clears out of its way first.
pub(super) enum InTheWay {
    Lease(ResourcePath, u64),
    Hold(ResourcePath, SessionId, u64),
}

impl Machine {
    /// The live holders of `resource`'s shared lease, oldest grant first.
    pub(super) fn live_holders(
        &self,
        state: &NamespaceState,
        resource: &ResourcePath,
    ) -> Vec<(SessionId, LeaseView)> {
        let Some(shared) = state.shared.get(resource) else {
            return Vec::new();
        };
        let mut live: Vec<(SessionId, LeaseView)> = shared
            .holders
            .iter()
            .filter_map(|(session_id, lease)| {
                Some((*session_id, self.live_view(state, resource, lease)?))
            })
            .collect();
        live.sort_by_key(|(_, view)| view.fence);
        live
    }

    /// Whether a `mode` acquire of `requested` by `session` may join or must avoid the
    /// holders of `resource`'s shared lease (`requested` itself, or a path below a subtree
    /// request); dead holders go to `dead` for clearing.
    pub(super) fn check_shared(
        &self,
        state: &NamespaceState,
        requested: &ResourcePath,
        resource: &ResourcePath,
        wanted: super::LeaseMode,
        session: Option<SessionId>,
        dead: &mut Vec<InTheWay>,
    ) -> Result<(), Rejection> {
        let Some(shared) = state.shared.get(resource) else {
            return Ok(());
        };
        let live = self.live_holders(state, resource);
        if !live.is_empty() {
            match wanted {
                super::LeaseMode::Shared { limit } if limit != shared.limit => {
                    return Err(Rejection::invalid(format!(
                        "{resource} is shared with limit {}: every holder must give the same limit",
                        shared.limit
                    )));
                }
                super::LeaseMode::Shared { .. } => {
                    if let Some((_, own)) = live.iter().find(|(holder, _)| Some(*holder) == session)
                    {
                        return Err(held(
                            requested,
                            resource,
                            shared.limit,
                            vec![own.clone()],
                            &live,
                        ));
                    }
                    if live.len() >= shared.limit as usize {
                        return Err(held(requested, resource, shared.limit, Vec::new(), &live));
                    }
                }
                _ => return Err(held(requested, resource, shared.limit, Vec::new(), &live)),
            }
        }
        let mut gone: Vec<(u64, SessionId)> = shared
            .holders
            .iter()
            .filter(|(session_id, _)| !live.iter().any(|(holder, _)| holder == *session_id))
            .map(|(session_id, lease)| (lease.fence, *session_id))
            .collect();
        gone.sort();
        dead.extend(
            gone.into_iter()
                .map(|(fence, session_id)| InTheWay::Hold(resource.clone(), session_id, fence)),
        );
        Ok(())
    }

    /// Adds `lease` as a holder of `resource` (checked by `check_shared`).
    pub(super) fn insert_hold(
        &mut self,
        namespace: &Namespace,
        resource: &ResourcePath,
        limit: u32,
        lease: Lease,
    ) {
        let session_id = lease.session_id;
        if let Some(deadline_ms) = lease.max_hold_deadline_ms {
            self.shared_max_hold_deadlines.insert((
                deadline_ms,
                namespace.clone(),
                resource.clone(),
                session_id,
            ));
        }
        let state = self.namespaces.entry(namespace.clone()).or_default();
        state
            .shared
            .entry(resource.clone())
            .or_insert_with(|| super::SharedLease {
                limit,
                holders: Default::default(),
            })
            .holders
            .insert(session_id, lease);
        state
            .sessions
            .get_mut(&session_id)
            .expect("the holder session was checked live")
            .shared
            .insert(resource.clone());
    }

    /// Removes `session_id`'s hold on `resource` (and the shared lease with its last holder)
    /// and records `event`.
    pub(super) fn remove_hold(
        &mut self,
        namespace: &Namespace,
        resource: &ResourcePath,
        session_id: SessionId,
        event: EventKind,
    ) {
        let state = self
            .namespaces
            .get_mut(namespace)
            .expect("the hold's namespace exists");
        let shared = state
            .shared
            .get_mut(resource)
            .expect("the shared lease exists");
        let lease = shared.holders.remove(&session_id).expect("the hold exists");
        if shared.holders.is_empty() {
            state.shared.remove(resource);
        }
        if let Some(session) = state.sessions.get_mut(&session_id) {
            session.shared.remove(resource);
        }
        if let Some(deadline_ms) = lease.max_hold_deadline_ms {
            self.shared_max_hold_deadlines.remove(&(
                deadline_ms,
                namespace.clone(),
                resource.clone(),
                session_id,
            ));
        }
        self.record(namespace, event);
        self.lines_freed_by(namespace, resource, false);
    }

    /// Clears what a grant found dead in its way, each with its `expired` event.
    pub(super) fn clear_dead(&mut self, namespace: &Namespace, dead: Vec<InTheWay>) {
        for thing in dead {
            match thing {
                InTheWay::Lease(resource, fence) => {
                    let event = EventKind::Expired {
                        resource: resource.clone(),
                        fence,
                    };
                    self.remove_lease(namespace, &resource, event);
                }
                InTheWay::Hold(resource, session_id, fence) => {
                    let event = EventKind::Expired {
                        resource: resource.clone(),
                        fence,
                    };
                    self.remove_hold(namespace, &resource, session_id, event);
                }
            }
        }
    }
}

/// `LEASE_HELD` for a shared lease on `resource` in the way of `requested`: `first` (the
/// caller's own hold, if that is the reason) or the oldest holder, and up to ten holders with
/// their total.
fn held(
    requested: &ResourcePath,
    resource: &ResourcePath,
    limit: u32,
    first: Vec<LeaseView>,
    live: &[(SessionId, LeaseView)],
) -> Rejection {
    let holders: Vec<LeaseView> = live
        .iter()
        .take(HOLDERS_LISTED_MAX)
        .map(|(_, view)| view.clone())
        .collect();
    let held_by = first
        .into_iter()
        .next()
        .unwrap_or_else(|| holders[0].clone());
    let names: Vec<String> = holders
        .iter()
        .map(|view| {
            format!(
                "{} (fence {}) for {} more",
                view.holder,
                view.fence,
                human_duration(view.expires_in_ms)
            )
        })
        .collect();
    Rejection::LeaseHeld {
        message: format!(
            "{} {} of {limit} holders: {}",
            super::leases::what_is_held(requested, resource).replace("held by", "shared by"),
            live.len(),
            names.join(", ")
        ),
        held_by: Box::new(held_by),
        holders,
        holders_total: live.len() as u32,
    }
}
