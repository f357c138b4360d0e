//! Baton's lease state machine: the deterministic heart that every replica applies in log order.
//!
//! `Machine::apply` takes a `Batch` (a cluster-time stamp and many commands) and returns one
//! `Response` per command. Everything here is synchronous and pure: no I/O, no clock, no async,
//! no openraft, sled or tokio types, and no iteration over hash maps (every collection is
//! ordered), so two replicas fed the same entries hold byte-identical state. Time enters only
//! through the stamps (docs/guarantees.md, "Time"): each entry is evaluated at
//! `max(stamp, cluster time)`. Expiry is a comparison of a deadline with that time; the `Sweep`
//! command only cleans up what is already dead.
//!
//! The state's maps, sets and event windows are persistent (`imbl`): cloning a `Machine` is
//! O(1) whatever it holds, and the clone and the original share every node that neither has
//! changed since. The store encodes snapshots and backups from such a clone while applies go on
//! (raft-store's `MachineHandle::copy`). A persistent map serializes as a `BTreeMap` does, so
//! the snapshot bytes are those of the builds before it (test:
//! `the_current_format_writes_the_bytes_the_build_before_wrote`).
//!
//! Never put here: anything that reads a clock, a random number generator, a file or a socket.

mod admission;
mod auth;
mod codec;
mod command;
mod events;
mod idempotency;
mod imbl_serde;
mod indexes;
mod invariants;
mod kv;
mod leases;
mod legacy;
mod line;
mod queues;
mod shared;
mod txn;
mod types;

#[cfg(test)]
mod tests;

use imbl::{OrdMap, OrdSet};
use std::ops::Bound;

use serde::{Deserialize, Serialize};

pub use admission::admit;
pub use auth::{AuthState, Caller, NewToken, Quotas, Role, Scope, TokenView, BOOTSTRAP_TOKEN_NAME};
pub use codec::{decode_batch, decode_value, encode_batch, encode_value, CodecError};
pub use command::{
    Batch, Command, Compare, Compensation, Event, EventKind, FenceStatus, Grant, IdempotencyTag,
    KvView, LeaseView, NewSession, Op, Owner, Page, Queued, Recorded, Rejection, Reply,
    ResourceFence, Response, SessionView, TaskClaimed, TaskCounts, TaskFence, TaskSpec, TaskState,
    TaskView, Txn, TxnOp,
};
pub use types::{
    validate_idempotency_key, Invalid, Labels, LeaseMode, Limits, Name, Namespace, ResourcePath,
    SessionId,
};

/// The fence's high bits above this one are its epoch (see [`Machine::begin_fence_epoch`]).
pub const FENCE_EPOCH_SHIFT: u32 = 40;

use admission::admit_op;
use events::EventLog;
use idempotency::IdempotencyTable;
use line::Line;
use queues::{PendingCompensation, QueueState};

/// The whole replicated state. See the module docs for the rules it lives by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    limits: Limits,
    /// Cluster time in milliseconds: the largest stamp applied so far.
    time_ms: u64,
    /// The last fence granted (G3). Every grant takes `fence_counter + 1`.
    fence_counter: u64,
    namespaces: OrdMap<Namespace, NamespaceState>,
    /// Every session by deadline, so expired ones are found without a scan.
    session_deadlines: OrdSet<(u64, Namespace, SessionId)>,
    /// Every lease with a max hold, by the deadline that max hold sets.
    max_hold_deadlines: OrdSet<(u64, Namespace, ResourcePath)>,
    /// The same for shared holds, which a path has several of.
    shared_max_hold_deadlines: OrdSet<(u64, Namespace, ResourcePath, SessionId)>,
    /// Sessions holding at least one task claim, by deadline: their claims lapse with them.
    claim_deadlines: OrdSet<(u64, Namespace, SessionId)>,
    /// Ready tasks whose delay has not run out, by the time it does.
    delayed: OrdSet<(u64, Namespace, Name, u64, Name)>,
    /// Done and dead tasks by the time they finished, for retention: `(finished_ms, namespace,
    /// queue, task id)`.
    finished: OrdSet<(u64, Namespace, Name, Name)>,
    idempotency: IdempotencyTable,
    events: EventLog,
    auth: AuthState,
    /// The token of the command being applied (access control on), for its events' `by`;
    /// `None` between commands, so never part of the state.
    acting: Option<Name>,
    /// Compensations owed by tasks that went dead in the command being applied; empty between
    /// commands, so never part of the state.
    compensations: Vec<PendingCompensation>,
    /// Lines that something freed in the command being applied may unblock (line.rs); empty
    /// between commands, so never part of the state.
    to_serve: OrdSet<(Namespace, ResourcePath)>,
    /// The events the entry being applied (or last applied) recorded, for the store's
    /// watchers; cleared at the start of each entry, so never part of the state.
    applied_events: AppliedEvents,
}

/// What the last applied entry recorded: a by-product of applying, not state, so any two are
/// equal (two machines with the same state compare equal whatever they last applied).
#[derive(Debug, Clone, Default)]
struct AppliedEvents(Vec<Event>);

impl PartialEq for AppliedEvents {
    fn eq(&self, _other: &AppliedEvents) -> bool {
        true
    }
}

impl Eq for AppliedEvents {}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct NamespaceState {
    #[serde(with = "crate::imbl_serde::ord_map")]
    sessions: OrdMap<SessionId, Session>,
    /// Exclusive and subtree leases: one holder a path.
    #[serde(with = "crate::imbl_serde::ord_map")]
    leases: OrdMap<ResourcePath, Lease>,
    /// Shared leases: up to `limit` holders a path.
    #[serde(with = "crate::imbl_serde::ord_map")]
    shared: OrdMap<ResourcePath, SharedLease>,
    #[serde(with = "crate::imbl_serde::ord_map")]
    kv: OrdMap<ResourcePath, KvEntry>,
    #[serde(with = "crate::imbl_serde::ord_map")]
    queues: OrdMap<Name, QueueState>,
    /// Acquires waiting for a path, first come first (line.rs).
    #[serde(with = "crate::imbl_serde::ord_map")]
    lines: OrdMap<ResourcePath, Line>,
}

impl NamespaceState {
    fn is_empty(&self) -> bool {
        self.sessions.is_empty()
            && self.lines.is_empty()
            && self.leases.is_empty()
            && self.shared.is_empty()
            && self.kv.is_empty()
            && self.queues.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Session {
    holder: String,
    ttl_ms: u64,
    labels: Labels,
    /// The session, and with it every lease it holds, is dead at `time >= deadline_ms`.
    deadline_ms: u64,
    /// The resources this session holds a lease on (a reverse index, rebuilt on decode).
    #[serde(skip)]
    leases: OrdSet<ResourcePath>,
    /// The resources this session holds a shared lease on (rebuilt on decode).
    #[serde(skip)]
    shared: OrdSet<ResourcePath>,
    /// The tasks this session holds a claim on, as `(queue, task id)` (rebuilt on decode).
    #[serde(skip)]
    claims: OrdSet<(Name, Name)>,
    /// The resources whose line this session waits in (rebuilt on decode).
    #[serde(skip)]
    waits: OrdSet<ResourcePath>,
}

impl Session {
    /// Leases (exclusive, subtree, shared), task claims and places in line: what
    /// `leases_per_session_max` bounds.
    fn held(&self) -> usize {
        self.leases.len() + self.shared.len() + self.claims.len() + self.waits.len()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Lease {
    session_id: SessionId,
    fence: u64,
    mode: LeaseMode,
    labels: Labels,
    acquired_at_ms: u64,
    /// Set by `max_hold_ms`: the lease is dead at this time even while its session lives.
    max_hold_deadline_ms: Option<u64>,
}

/// A path held in `shared` mode: every holder gave `limit`, and at most `limit` hold it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SharedLease {
    limit: u32,
    /// Each holder's lease, by session.
    #[serde(with = "crate::imbl_serde::ord_map")]
    holders: OrdMap<SessionId, Lease>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct KvEntry {
    value: String,
    revision: u64,
    fence: Option<(ResourcePath, u64)>,
}

impl Default for Machine {
    fn default() -> Self {
        Machine::new(Limits::default())
    }
}

impl Machine {
    pub fn new(limits: Limits) -> Machine {
        Machine {
            limits,
            time_ms: 0,
            fence_counter: 0,
            namespaces: OrdMap::new(),
            session_deadlines: OrdSet::new(),
            max_hold_deadlines: OrdSet::new(),
            shared_max_hold_deadlines: OrdSet::new(),
            claim_deadlines: OrdSet::new(),
            delayed: OrdSet::new(),
            finished: OrdSet::new(),
            idempotency: IdempotencyTable::default(),
            events: EventLog::default(),
            auth: AuthState::default(),
            acting: None,
            compensations: Vec::new(),
            to_serve: OrdSet::new(),
            applied_events: AppliedEvents::default(),
        }
    }

    /// Applies one log entry at `max(batch.stamp_ms, cluster time)` and answers each command.
    pub fn apply(&mut self, batch: &Batch) -> Vec<Response> {
        self.applied_events.0.clear();
        let before_ms = self.time_ms;
        self.time_ms = self.time_ms.max(batch.stamp_ms);
        self.idempotency.prune(self.time_ms, &self.limits);
        self.advance_queues();
        self.enqueue_compensations();
        self.serve_lines_freed_by_time(before_ms);
        batch
            .commands
            .iter()
            .map(|command| self.apply_command(command))
            .collect()
    }

    /// Records a state change at the applied cluster time, made by the acting token: its
    /// revision.
    fn record(&mut self, namespace: &Namespace, kind: EventKind) -> u64 {
        let event = self.events.push(
            self.time_ms,
            namespace,
            kind,
            self.acting.as_ref(),
            &self.limits,
        );
        let revision = event.revision;
        self.applied_events.0.push(event);
        revision
    }

    /// Cluster time of the applied state, in milliseconds.
    pub fn time_ms(&self) -> u64 {
        self.time_ms
    }

    /// The last fence granted.
    pub fn fence_counter(&self) -> u64 {
        self.fence_counter
    }

    /// Starts the next fence epoch: the next grant takes `(epoch + 1) << FENCE_EPOCH_SHIFT` + 1,
    /// above any fence of this epoch, however many the state's old cluster granted after this
    /// copy of it was taken (fewer than 2^40 by far). `batond restore` calls it on the state it
    /// seeds a new cluster with, so a restore never hands out a fence again. Returns the new
    /// epoch.
    pub fn begin_fence_epoch(&mut self) -> u64 {
        let epoch = (self.fence_counter >> FENCE_EPOCH_SHIFT) + 1;
        self.fence_counter = epoch << FENCE_EPOCH_SHIFT;
        epoch
    }

    /// The revision of `namespace`'s last state change (each namespace counts its own).
    pub fn revision(&self, namespace: &Namespace) -> u64 {
        self.events.last_revision(namespace)
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The number of sessions and leases held, dead or alive, across namespaces.
    pub fn counts(&self) -> (usize, usize) {
        self.namespaces
            .values()
            .fold((0, 0), |(sessions, leases), state| {
                let shared: usize = state
                    .shared
                    .values()
                    .map(|shared| shared.holders.len())
                    .sum();
                (
                    sessions + state.sessions.len(),
                    leases + state.leases.len() + shared,
                )
            })
    }

    /// Whether a `Sweep` would find something to remove at the applied cluster time (a dead
    /// session or lease, a finished task past its retention): O(1).
    pub fn sweep_due(&self) -> bool {
        let due = |deadline_ms: u64| deadline_ms <= self.time_ms;
        self.session_deadlines
            .get_min()
            .is_some_and(|(deadline_ms, _, _)| due(*deadline_ms))
            || self
                .max_hold_deadlines
                .get_min()
                .is_some_and(|(deadline_ms, _, _)| due(*deadline_ms))
            || self
                .shared_max_hold_deadlines
                .get_min()
                .is_some_and(|(deadline_ms, _, _, _)| due(*deadline_ms))
            || self.retention_due()
    }

    /// The live lease on exactly `resource`, at the applied cluster time: its exclusive or
    /// subtree lease, or the oldest live holder of its shared lease.
    pub fn lease(&self, namespace: &Namespace, resource: &ResourcePath) -> Option<LeaseView> {
        let state = self.namespaces.get(namespace)?;
        match state.leases.get(resource) {
            Some(lease) => self.live_view(state, resource, lease),
            None => self
                .live_holders(state, resource)
                .into_iter()
                .next()
                .map(|(_, view)| view),
        }
    }

    /// Every live lease on exactly `resource`: one, or each holder of a shared lease (oldest
    /// grant first).
    fn leases_on(&self, state: &NamespaceState, resource: &ResourcePath) -> Vec<LeaseView> {
        match state.leases.get(resource) {
            Some(lease) => self.live_view(state, resource, lease).into_iter().collect(),
            None => self
                .live_holders(state, resource)
                .into_iter()
                .map(|(_, view)| view)
                .collect(),
        }
    }

    /// Live leases whose path starts with `prefix` (as a string), after `cursor`, in path order.
    pub fn leases(
        &self,
        namespace: &Namespace,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Page<LeaseView> {
        let limit = limit.clamp(1, self.limits.list_page_max);
        let Some(state) = self.namespaces.get(namespace) else {
            return Page {
                items: Vec::new(),
                next_cursor: None,
            };
        };
        let start = match cursor {
            Some(cursor) if cursor >= prefix => Bound::Excluded(cursor),
            _ => Bound::Included(prefix),
        };
        let mut items = Vec::new();
        let mut next_cursor = None;
        // Paths with a lease of either kind, in path order (a path has only one kind).
        let paths = merge_ascending(
            state
                .leases
                .range::<_, str>((start, Bound::Unbounded))
                .map(|(resource, _)| resource),
            state
                .shared
                .range::<_, str>((start, Bound::Unbounded))
                .map(|(resource, _)| resource),
        );
        // A page ends between paths, so a shared lease's holders are never split.
        for resource in paths.take_while(|resource| resource.as_str().starts_with(prefix)) {
            let views = self.leases_on(state, resource);
            if views.is_empty() {
                continue;
            }
            if items.len() >= limit {
                next_cursor = items
                    .last()
                    .map(|last: &LeaseView| last.resource.to_string());
                break;
            }
            items.extend(views);
        }
        Page { items, next_cursor }
    }

    /// The session, if it is alive, with a page of its live leases in path order after
    /// `cursor`.
    pub fn session(
        &self,
        namespace: &Namespace,
        session_id: SessionId,
        cursor: Option<&str>,
        limit: usize,
    ) -> Option<(SessionView, Page<LeaseView>)> {
        let limit = limit.clamp(1, self.limits.list_page_max);
        let state = self.namespaces.get(namespace)?;
        let session = state.sessions.get(&session_id)?;
        if session.deadline_ms <= self.time_ms {
            return None;
        }
        let mut items = Vec::new();
        let mut next_cursor = None;
        let held = merge_ascending(session.leases.iter(), session.shared.iter())
            .filter(|resource| cursor.is_none_or(|cursor| resource.as_str() > cursor));
        for resource in held {
            let Some(view) = state
                .leases
                .get(resource)
                .filter(|lease| lease.session_id == session_id)
                .or_else(|| state.shared.get(resource)?.holders.get(&session_id))
                .and_then(|lease| self.live_view(state, resource, lease))
            else {
                continue;
            };
            if items.len() == limit {
                next_cursor = items
                    .last()
                    .map(|last: &LeaseView| last.resource.to_string());
                break;
            }
            items.push(view);
        }
        let page = Page { items, next_cursor };
        Some((self.session_view(session_id, session), page))
    }

    /// The live lease that would refuse an exclusive acquire of `resource`: its own lease, or
    /// a subtree lease on one of its ancestors (then `true`: it covers `resource`). At most one
    /// can be live (G2).
    pub fn covering_lease(
        &self,
        namespace: &Namespace,
        resource: &ResourcePath,
    ) -> Option<(LeaseView, bool)> {
        if let Some(own) = self.lease(namespace, resource) {
            return Some((own, false));
        }
        let state = self.namespaces.get(namespace)?;
        resource.ancestors().find_map(|ancestor| {
            let (path, lease) = state.leases.get_key_value(ancestor)?;
            if lease.mode != LeaseMode::Subtree {
                return None;
            }
            Some((self.live_view(state, path, lease)?, true))
        })
    }

    /// Whether `fence` is the live fence of a lease covering `resource` (its own, one holder
    /// of its shared lease, or a subtree lease on an ancestor): G4, for resources outside
    /// Baton. `live_fence` is `fence` when current, else the covering lease's (the oldest
    /// holder's, for a shared one).
    pub fn fence_status(
        &self,
        namespace: &Namespace,
        resource: &ResourcePath,
        fence: u64,
    ) -> FenceStatus {
        // The path's own live leases (one, or a shared lease's holders), else a covering
        // subtree lease above it.
        let own = self
            .namespaces
            .get(namespace)
            .map(|state| self.leases_on(state, resource))
            .unwrap_or_default();
        let live_fence = if own.iter().any(|view| view.fence == fence) {
            Some(fence)
        } else {
            own.first().map(|view| view.fence).or_else(|| {
                self.covering_lease(namespace, resource)
                    .map(|(lease, _)| lease.fence)
            })
        };
        FenceStatus {
            current: live_fence == Some(fence),
            live_fence,
        }
    }

    /// The revision of `namespace`'s oldest event still kept (one past its last when none is).
    pub fn oldest_event_revision(&self, namespace: &Namespace) -> u64 {
        self.events.oldest_revision(namespace)
    }

    /// The events the last applied entry recorded, in every namespace, in order: for the
    /// store to see what that entry changed.
    pub fn applied_events(&self) -> &[Event] {
        &self.applied_events.0
    }

    /// `namespace`'s events after revision `after`, at most `limit`; `None` when `after` is
    /// older than its kept window, so a reader must re-list instead of silently missing changes.
    pub fn events_after(
        &self,
        namespace: &Namespace,
        after: u64,
        limit: usize,
    ) -> Option<Vec<Event>> {
        self.events
            .after(namespace, after, limit.clamp(1, self.limits.list_page_max))
    }

    fn apply_command(&mut self, command: &Command) -> Response {
        match command {
            Command::Namespaced {
                namespace,
                idempotency,
                op,
            } => self.apply_namespaced(namespace, idempotency.as_ref(), op, None),
            Command::Sweep { max } => {
                let max = (*max as usize).min(self.limits.sweep_batch_max);
                let (leases, sessions) = self.sweep(max);
                self.serve_lines();
                let tasks =
                    self.remove_retired_tasks(max.saturating_sub((leases + sessions) as usize));
                Response::fresh(Ok(Reply::Swept {
                    leases,
                    sessions,
                    tasks,
                }))
            }
            Command::SetLimits(limits) => {
                self.limits = limits.clone();
                // Lowered bounds apply at once, so the state stays within them.
                self.events.trim(&self.limits);
                self.idempotency.prune(self.time_ms, &self.limits);
                Response::fresh(Ok(Reply::LimitsSet))
            }
            Command::CreateToken(new_token) => {
                Response::fresh(self.auth.create(new_token, self.time_ms, &self.limits))
            }
            Command::RevokeToken { name } => Response::fresh(self.auth.revoke(name)),
            Command::BootstrapToken { secret_sha256 } => Response::fresh(self.auth.bootstrap(
                *secret_sha256,
                self.time_ms,
                &self.limits,
            )),
            Command::Authorized { token, command } => self.apply_authorized(token, command),
        }
    }

    /// A command made with `token`: refused unless the token exists now and may do it.
    fn apply_authorized(&mut self, token: &Name, command: &Command) -> Response {
        let Some(caller) = self.auth.caller(token) else {
            return Response::fresh(Err(Rejection::Unauthenticated(format!(
                "token {token} was revoked"
            ))));
        };
        match command {
            Command::Namespaced {
                namespace,
                idempotency,
                op,
            } => match self
                .auth
                .authorize(&caller, namespace, op)
                .and_then(|()| self.within_quotas(token, namespace, op))
            {
                Ok(()) => {
                    self.acting = Some(token.clone());
                    let response =
                        self.apply_namespaced(namespace, idempotency.as_ref(), op, Some(token));
                    self.acting = None;
                    response
                }
                Err(refused) => Response::fresh(Err(refused)),
            },
            Command::CreateToken(_) | Command::RevokeToken { .. } | Command::SetLimits(_) => {
                if caller.role == Role::Admin {
                    self.apply_command(command)
                } else {
                    Response::fresh(Err(Rejection::PermissionDenied(format!(
                        "token {token} has role {}: tokens and limits need admin",
                        caller.role.as_str()
                    ))))
                }
            }
            Command::Sweep { .. } | Command::BootstrapToken { .. } | Command::Authorized { .. } => {
                Response::fresh(Err(Rejection::invalid(
                    "this command is never made with a token",
                )))
            }
        }
    }

    /// Refuses an operation that would take `token` past its quotas: a new session past
    /// `sessions_max`, an acquire past `leases_max` (live leases and places in lines, counted
    /// over the token's sessions).
    fn within_quotas(&self, token: &Name, namespace: &Namespace, op: &Op) -> Result<(), Rejection> {
        let quotas = self.auth.quotas(token).unwrap_or_default();
        let sessions = || self.auth.sessions_of(token);
        if let (Some(sessions_max), Some(_)) = (quotas.sessions_max, op.session_created()) {
            if sessions().count() as u64 >= sessions_max {
                return Err(Rejection::ResourceExhausted(format!(
                    "token {token} holds {sessions_max} sessions, its sessions_max: end one first"
                )));
            }
        }
        let Some(leases_max) = quotas.leases_max else {
            return Ok(());
        };
        let asks_again = match op {
            Op::Acquire { .. } => false,
            // A session asking again for a place it has, or for what the line granted it,
            // takes nothing more.
            Op::AcquireOrWait {
                resource,
                owner: Owner::Session(session_id),
                ..
            } => {
                self.line_position(namespace, resource, *session_id)
                    .is_some()
                    || self.lease_of(namespace, resource, *session_id).is_some()
            }
            Op::AcquireOrWait { .. } => false,
            _ => return Ok(()),
        };
        if !asks_again && self.claims_of(token, true) as u64 >= leases_max {
            return Err(Rejection::ResourceExhausted(format!(
                "token {token} holds or waits for {leases_max} leases, its leases_max: release one or leave a line first"
            )));
        }
        Ok(())
    }

    /// The leases and shared holds over `token`'s sessions, and with `waits` their places in
    /// lines too (a place in line is a lease to come, so it counts toward `leases_max`).
    fn claims_of(&self, token: &Name, waits: bool) -> usize {
        self.auth
            .sessions_of(token)
            .filter_map(|(namespace, session_id)| {
                let session = self.namespaces.get(namespace)?.sessions.get(session_id)?;
                let places = if waits { session.waits.len() } else { 0 };
                Some(session.leases.len() + session.shared.len() + places)
            })
            .sum()
    }

    /// Whether granting one more lease to `session_id` would take its owner token past its
    /// `leases_max` (checked again when the line grants: the quota may have become smaller
    /// since the session took its place, by a token made again under the same name).
    fn grant_past_quota(&self, namespace: &Namespace, session_id: SessionId) -> bool {
        let Some(token) = self.auth.owner(namespace, session_id) else {
            return false;
        };
        let leases_max = self.auth.quotas(token).and_then(|quotas| quotas.leases_max);
        leases_max.is_some_and(|leases_max| self.claims_of(token, false) as u64 >= leases_max)
    }

    /// A client operation in `namespace`, made by token `by` when access control is on.
    fn apply_namespaced(
        &mut self,
        namespace: &Namespace,
        idempotency: Option<&IdempotencyTag>,
        op: &Op,
        by: Option<&Name>,
    ) -> Response {
        if let Some(tag) = idempotency {
            if let Err(invalid) = validate_idempotency_key(&tag.key, &self.limits) {
                return Response::fresh(Err(invalid.into()));
            }
            if let Some(replay) = self.idempotency.lookup(namespace, tag) {
                return replay;
            }
        }
        let outcome = self.apply_op(namespace, op);
        // The waiters that what this operation freed lets in, then the compensations this
        // operation owes, all made by the same token (`acting`).
        self.serve_lines();
        self.enqueue_compensations();
        if let (Some(by), Some(session_id)) = (by, op.session_created()) {
            let created = self
                .namespaces
                .get(namespace)
                .is_some_and(|state| state.sessions.contains_key(&session_id));
            if created {
                self.auth.set_owner(namespace, session_id, by);
            }
        }
        if let (Some(tag), Ok(reply)) = (idempotency, &outcome) {
            if !reply.changed_state() {
                return Response::fresh(outcome);
            }
            self.idempotency
                .record(namespace, tag, reply.clone(), self.time_ms, &self.limits);
        }
        if self
            .namespaces
            .get(namespace)
            .is_some_and(NamespaceState::is_empty)
        {
            self.namespaces.remove(namespace);
        }
        Response::fresh(outcome)
    }

    /// The access-control state: tokens and session owners.
    pub fn auth(&self) -> &AuthState {
        &self.auth
    }

    fn apply_op(&mut self, namespace: &Namespace, op: &Op) -> Result<Reply, Rejection> {
        admit_op(namespace, op, &self.limits)?;
        match op {
            Op::CreateSession(new_session) => self.create_session(namespace, new_session),
            Op::Keepalive { session_id } => self.keepalive(namespace, *session_id),
            Op::Release {
                session_id,
                resource,
            } => self.release(namespace, *session_id, resource),
            Op::EndSession { session_id } => self.end_session(namespace, *session_id),
            Op::Acquire {
                resource,
                mode,
                owner,
                max_hold_ms,
                labels,
            } => self.acquire(namespace, resource, *mode, owner, *max_hold_ms, labels),
            Op::KvPut { key, value, fence } => self.kv_put(namespace, key, value, fence.as_ref()),
            Op::KvDelete { key, fence } => self.kv_delete(namespace, key, fence.as_ref()),
            Op::Enqueue { queue, task } => self.enqueue(namespace, queue, task),
            Op::Claim { queue, owner } => self.claim(namespace, queue, owner),
            Op::Complete {
                queue,
                task_id,
                claim,
                result,
            } => self.complete(namespace, queue, task_id, *claim, result.as_deref()),
            Op::Fail {
                queue,
                task_id,
                claim,
                reason,
                retry,
            } => self.fail(namespace, queue, task_id, *claim, reason, *retry),
            Op::ReleaseTask {
                queue,
                task_id,
                claim,
                note,
            } => self.release_task(namespace, queue, task_id, *claim, note.as_deref()),
            Op::Txn(txn) => self.txn(namespace, txn),
            Op::AcquireOrWait {
                resource,
                mode,
                owner,
                max_hold_ms,
                labels,
            } => self.acquire_or_wait(namespace, resource, *mode, owner, *max_hold_ms, labels),
            Op::LeaveOrRelease {
                session_id,
                resource,
            } => self.leave_or_release(namespace, *session_id, resource),
        }
    }

    fn session_view(&self, session_id: SessionId, session: &Session) -> SessionView {
        SessionView {
            session_id,
            holder: session.holder.clone(),
            ttl_ms: session.ttl_ms,
            labels: session.labels.clone(),
            expires_in_ms: session.deadline_ms.saturating_sub(self.time_ms),
        }
    }

    /// The lease's view if it is live at the applied cluster time.
    fn live_view(
        &self,
        state: &NamespaceState,
        resource: &ResourcePath,
        lease: &Lease,
    ) -> Option<LeaseView> {
        let session = state.sessions.get(&lease.session_id)?;
        let deadline_ms = lease_deadline(session, lease);
        (self.time_ms < deadline_ms).then(|| LeaseView {
            resource: resource.clone(),
            fence: lease.fence,
            holder: session.holder.clone(),
            mode: lease.mode,
            labels: lease.labels.clone(),
            acquired_at_ms: lease.acquired_at_ms,
            max_hold_ms: lease
                .max_hold_deadline_ms
                .map(|max_hold_deadline_ms| max_hold_deadline_ms - lease.acquired_at_ms),
            expires_in_ms: deadline_ms - self.time_ms,
        })
    }
}

/// Two ascending iterators as one ascending iterator, an item in both once.
fn merge_ascending<'a, T: Ord + 'a>(
    a: impl Iterator<Item = &'a T>,
    b: impl Iterator<Item = &'a T>,
) -> impl Iterator<Item = &'a T> {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) if y < x => b.next(),
        (Some(x), Some(y)) if x == y => {
            b.next();
            a.next()
        }
        (Some(_), _) => a.next(),
        (None, _) => b.next(),
    })
}

/// The entries strictly below `resource` in a path-keyed map, in path order.
fn descendants<'a, V>(
    map: &'a OrdMap<ResourcePath, V>,
    resource: &ResourcePath,
) -> impl Iterator<Item = (&'a ResourcePath, &'a V)> {
    let (start, end) = resource.descendant_bounds();
    map.range::<_, str>((
        Bound::Included(start.as_str()),
        Bound::Excluded(end.as_str()),
    ))
}

/// A lease dies when its session does or when its max hold runs out, whichever is first.
fn lease_deadline(session: &Session, lease: &Lease) -> u64 {
    lease
        .max_hold_deadline_ms
        .map_or(session.deadline_ms, |max_hold| {
            max_hold.min(session.deadline_ms)
        })
}
