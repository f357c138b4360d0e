//! The service: the operations of docs/api.md as one type, `Service`, which knows nothing of
//! HTTP. Every write becomes a `Command` that this node proposes as leader or relays to the
//! leader (`relay.rs`), through one typed call per mutation (`write.rs`) that hands back the
//! operation's result, never the machine's `Reply`; every read is linearizable (a read index on
//! the leader, then the applied state, `Service::read`, or `Service::read_here` on any node).
//! Refusals and failures are `ApiError`, a problem with its code (`error.rs`); `convert.rs`
//! renders the machine's views as the API's wire types.
//!
//! The client API (`crate::http`) parses requests into machine types, calls the service and
//! answers with what it hands back; the peer listener serves the relay's messages through
//! `Service::serve_relayed` and `Service::serve_read_index`.
//!
//! What must never live here: HTTP (routes, status codes, headers, axum) and request parsing. A
//! test keeps axum and HTTP status codes out.

pub mod convert;
mod error;
mod relay;
mod write;

use std::sync::Arc;
use std::time::Duration;

use baton_api::rfc3339;
use baton_raft_store::machine::{Limits, Machine, NewSession, Owner, Rejection, SessionId};
use baton_raft_store::store::{MachineHandle, Member, Raft};
use openraft::async_runtime::WatchReceiver;
use openraft::{Instant as _, ReadPolicy};
use tokio::time::Instant;

use crate::clock::NodeClock;
use crate::network::LeaderContact;
use baton_raft_store::proposer::Proposer;

pub use error::ApiError;
pub use relay::{Relay, RelayRefused, READ_INDEX_PATH, RELAY_PATH};
pub use write::{Acquired, Committed, LetGo, Mutation, TaskEnd, TxnResult};

/// What the operations need: this node's Raft, applied state, proposer, clocks and relay.
pub struct Service {
    pub node_id: u64,
    pub raft: Raft,
    pub machine: MachineHandle,
    pub proposer: Proposer,
    pub clock: Arc<NodeClock>,
    /// A follower's relay of writes to the leader (relay.rs).
    pub relay: Relay,
    /// The election timeout (`--election-timeout-ms`): a leader that stops answering is given
    /// up on after twice this.
    pub election_timeout: Duration,
    /// When this node last heard from its leader (the peer router keeps it).
    pub leader_contact: LeaderContact,
}

/// The leader as this node sees it.
pub enum Leader {
    /// This node: it handles the request itself.
    Me,
    /// Another node, with its addresses.
    Other { id: u64, member: Member },
}

/// How long to wait before trying a leader that could not be reached again.
pub const RECONNECT_PAUSE: Duration = Duration::from_millis(50);
/// The two clocks an answer is rendered with: the answering node's wall clock, for the
/// informational `*_at` fields, and the cluster time the answer was decided at, which every
/// `expires_in_ms` is relative to.
#[derive(Debug, Clone, Copy)]
pub struct Clocks {
    pub wall_ms: i64,
    pub cluster_ms: u64,
}

impl Clocks {
    /// `expires_in_ms` from now, as a wall-clock time.
    pub fn expires_at(&self, expires_in_ms: u64) -> String {
        rfc3339(
            self.wall_ms
                .saturating_add(i64::try_from(expires_in_ms).unwrap_or(i64::MAX)),
        )
    }

    /// A cluster time in the past (like `acquired_at`), as a wall-clock time.
    pub fn at(&self, cluster_time_ms: u64) -> String {
        let ago_ms =
            i64::try_from(self.cluster_ms.saturating_sub(cluster_time_ms)).unwrap_or(i64::MAX);
        rfc3339(self.wall_ms.saturating_sub(ago_ms))
    }
}

impl Service {
    /// The longest any request waits for a leader: twice the election timeout (by then a
    /// paused or cut-off leader has been replaced) plus a second to reach the new one.
    pub fn leader_wait(&self) -> Duration {
        self.election_timeout * 2 + Duration::from_secs(1)
    }

    /// Runs `check` on the limits of the applied state (validating input at the edge), under
    /// the read lock and without copying them. A poisoned lock means an apply panicked: the
    /// node is stopping, and nothing here may guess at limits.
    pub fn with_limits<T>(&self, check: impl FnOnce(&Limits) -> T) -> T {
        self.machine
            .read(|machine, _| check(machine.limits()))
            .expect("the applied state is readable: an apply panicked and the node is stopping")
    }

    /// A list's page size: `requested`, or the largest allowed when absent.
    pub fn page_limit(&self, requested: Option<u32>) -> Result<usize, ApiError> {
        let page_max = self.with_limits(|limits| limits.list_page_max);
        let limit = requested.map_or(page_max, |limit| limit as usize);
        if limit == 0 || limit > page_max {
            return Err(ApiError::invalid(format!("limit must be 1..={page_max}")));
        }
        Ok(limit)
    }

    /// Who an acquire or a claim is for: the named session, or a new one drawn here.
    pub fn owner(&self, owner: Result<baton_api::Owner<'_>, String>) -> Result<Owner, ApiError> {
        match owner.map_err(ApiError::invalid)? {
            baton_api::Owner::Session(id) => Ok(Owner::Session(
                SessionId::parse(id.as_str()).map_err(ApiError::from_invalid)?,
            )),
            baton_api::Owner::NewSession { holder, ttl_ms } => Ok(Owner::NewSession(NewSession {
                session_id: self.new_session_id(),
                holder: holder.to_owned(),
                ttl_ms,
                labels: Default::default(),
            })),
        }
    }

    /// The leader this node is in touch with: itself while a quorum acknowledged it within
    /// twice the election timeout, or the leader whose appends it accepted within that time.
    /// With pre-vote, a node cut off from the others goes on naming its last leader; contact,
    /// not the name, says whether it still has one.
    pub fn leader(&self) -> Option<u64> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow_watched();
        let leader = metrics.current_leader?;
        let recent = self.election_timeout * 2;
        let in_touch = if leader == self.node_id {
            // A lone voter is its own quorum (openraft reports no acknowledgement then).
            let alone = metrics
                .membership_config
                .membership()
                .voter_ids()
                .all(|voter| voter == self.node_id);
            metrics.state.is_leader()
                && (alone
                    || metrics
                        .last_quorum_acked
                        .as_ref()
                        .is_some_and(|acked| acked.elapsed() < recent))
        } else {
            self.leader_contact.within(recent)
        };
        in_touch.then_some(leader)
    }

    pub fn is_leader(&self) -> bool {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow_watched();
        metrics.state.is_leader() && metrics.current_leader == Some(self.node_id)
    }

    /// A fresh session id: 128 random bits, chosen here on the leader and carried in the log.
    pub fn new_session_id(&self) -> SessionId {
        SessionId(rand::random())
    }

    pub fn clocks(&self, cluster_ms: u64) -> Clocks {
        Clocks {
            wall_ms: self.clock.wall_ms(),
            cluster_ms,
        }
    }

    /// Runs `query` on the applied state after a read index: linearizable (G1). On the leader
    /// only (followers forward reads); `read_here` is the same on any node.
    pub async fn read<T>(
        &self,
        query: impl FnOnce(&Machine) -> T,
    ) -> Result<(T, Clocks), ApiError> {
        self.read_index_here().await?;
        self.query(query)
    }

    /// On the leader: confirms leadership and waits until the applied state holds every write
    /// acknowledged before the call; the read index, the log index a linearizable read must see
    /// applied.
    async fn read_index_here(&self) -> Result<u64, ApiError> {
        // A leader restored after a restart may not yet know which of its entries are
        // committed: it answers reads only once it has applied its whole takeover log.
        let term = self.raft.metrics().borrow_watched().current_term;
        if !self
            .proposer
            .wait_leader_ready(term, self.leader_wait())
            .await
        {
            return Err(ApiError::no_leader(None));
        }
        // ReadIndex: leadership confirmed by a quorum after the read arrived. Lease reads would
        // skip that round trip, but are safe only if no pause outlasts the lease, and Baton's
        // fault model has pauses (a SIGSTOP, a GC) of any length (docs/guarantees.md, G1).
        let read_index = self.raft.ensure_linearizable(ReadPolicy::ReadIndex);
        match tokio::time::timeout(self.leader_wait(), read_index).await {
            Ok(Ok(read_log_id)) => Ok(read_log_id.index()),
            Ok(Err(error)) => {
                tracing::debug!(%error, "read index refused");
                Err(ApiError::no_leader(
                    self.leader().filter(|id| *id != self.node_id),
                ))
            }
            Err(_) => Err(ApiError::no_leader(None)),
        }
    }

    /// `query` on this node's applied state as it is now, at its cluster time.
    fn query<T>(&self, query: impl FnOnce(&Machine) -> T) -> Result<(T, Clocks), ApiError> {
        let (value, cluster_ms) = self
            .machine
            .read(|machine, _| (query(machine), machine.time_ms()))
            .map_err(ApiError::internal)?;
        Ok((value, self.clocks(cluster_ms)))
    }

    /// A machine refusal as an API error, with the denial's lease in wire form.
    pub fn refusal(&self, rejection: Rejection, clocks: Clocks) -> ApiError {
        let held_by = match &rejection {
            Rejection::LeaseHeld {
                held_by,
                holders,
                holders_total,
                ..
            } => Some(convert::held_by(held_by, holders, *holders_total, clocks)),
            _ => None,
        };
        ApiError::rejected(rejection, held_by, Some(clocks.cluster_ms))
    }

    /// The leader to send to: waits until this node knows one other than `unanswered` (a leader
    /// that did not answer a request) or becomes the leader itself, until `deadline`.
    pub async fn wait_for_leader(
        &self,
        unanswered: Option<u64>,
        deadline: Instant,
    ) -> Option<Leader> {
        let mut metrics = self.raft.metrics();
        loop {
            {
                let current = metrics.borrow_and_update();
                if let Some(id) = current.current_leader.filter(|id| Some(*id) != unanswered) {
                    if id == self.node_id {
                        if current.state.is_leader() {
                            return Some(Leader::Me);
                        }
                    } else if let Some(member) =
                        current.membership_config.membership().get_node(&id)
                    {
                        let member = member.clone();
                        return Some(Leader::Other { id, member });
                    }
                }
            }
            match tokio::time::timeout_at(deadline, metrics.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// The service knows no HTTP: none of its files names axum or a status code.
    #[test]
    fn the_service_knows_no_http() {
        let files = [
            ("mod.rs", include_str!("mod.rs")),
            ("error.rs", include_str!("error.rs")),
            ("relay.rs", include_str!("relay.rs")),
            ("write.rs", include_str!("write.rs")),
            ("convert.rs", include_str!("convert.rs")),
        ];
        let code = |text: &'static str| {
            text.lines()
                .filter(|line| !line.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        for (name, text) in files {
            let code = code(text);
            for http in [
                concat!("ax", "um"),
                concat!("Status", "Code"),
                concat!("hy", "per"),
            ] {
                assert!(!code.contains(http), "service/{name} names {http}");
            }
        }
    }
}
