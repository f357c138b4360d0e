//! The simulator's network: openraft's RPCs delivered inside the process, after a delay drawn
//! from the seed, through links the fault schedule cuts and heals. A message on a cut link,
//! or to a node that is down, is lost after its delay (the sender sees `Unreachable`, as it
//! would a refused connection); an answer whose way back was cut meanwhile is lost too (the
//! sender sees `Timeout`: the request may have been applied). Snapshots travel as bytes into
//! the receiver's own snapshot inbox, as over the real network.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use baton_raft_store::store::{
    Member, Raft, Snapshot, SnapshotData, SnapshotInbox, TypeConfig, Vote,
};
use openraft::errors::{
    NetworkError, RPCError, ReplicationClosed, StreamingError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::{OptionalSend, RPCTypes};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type RpcError = RPCError<TypeConfig>;

/// A running node as the network reaches it.
#[derive(Clone)]
pub struct Endpoint {
    pub raft: Raft,
    pub inbox: SnapshotInbox,
}

/// The network's state: who is up, which directed links are cut, and the generator every
/// delay is drawn from.
struct State {
    up: BTreeMap<u64, Endpoint>,
    cut: BTreeSet<(u64, u64)>,
    random: StdRng,
    delay_ms: (u64, u64),
}

/// The network every simulated node's openraft sends through. Cloning shares it.
#[derive(Clone)]
pub struct SimNet {
    state: Arc<Mutex<State>>,
}

impl SimNet {
    /// A network with every link up and no node on it; delays are `delay_ms` (inclusive range).
    pub fn new(seed: u64, delay_ms: (u64, u64)) -> SimNet {
        SimNet {
            state: Arc::new(Mutex::new(State {
                up: BTreeMap::new(),
                cut: BTreeSet::new(),
                random: StdRng::seed_from_u64(seed),
                delay_ms,
            })),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding it, and the simulation is one thread.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `id` answers from now on.
    pub fn attach(&self, id: u64, endpoint: Endpoint) {
        self.state().up.insert(id, endpoint);
    }

    /// `id` is down: messages to it are lost.
    pub fn detach(&self, id: u64) -> Option<Endpoint> {
        self.state().up.remove(&id)
    }

    /// Messages from `from` to `to` are lost until `heal`.
    pub fn cut(&self, from: u64, to: u64) {
        self.state().cut.insert((from, to));
    }

    /// Every link is up again.
    pub fn heal(&self) {
        self.state().cut.clear();
    }

    /// A delay drawn from the seed's generator.
    fn delay(&self) -> Duration {
        let mut state = self.state();
        let (low, high) = state.delay_ms;
        Duration::from_millis(state.random.random_range(low..=high))
    }

    /// The endpoint `to`, if it is up and the link from `from` is.
    fn reachable(&self, from: u64, to: u64) -> Option<Endpoint> {
        let state = self.state();
        if state.cut.contains(&(from, to)) {
            return None;
        }
        state.up.get(&to).cloned()
    }

    /// Delivers one request from `from` to `to` and its answer back, each after a delay.
    async fn deliver<T, F, Fut>(
        &self,
        from: u64,
        to: u64,
        action: RPCTypes,
        call: F,
    ) -> Result<T, RpcError>
    where
        F: FnOnce(Endpoint) -> Fut,
        Fut: Future<Output = Result<T, RpcError>>,
    {
        tokio::time::sleep(self.delay()).await;
        let Some(endpoint) = self.reachable(from, to) else {
            return Err(RPCError::Unreachable(Unreachable::from_string(format!(
                "node {to} is down or cut off from node {from}"
            ))));
        };
        let answer = call(endpoint).await;
        tokio::time::sleep(self.delay()).await;
        if self.reachable(to, from).is_none() {
            return Err(RPCError::Timeout(Timeout {
                action,
                id: from,
                target: to,
                timeout: Duration::ZERO,
            }));
        }
        answer
    }
}

/// A node's Raft error as its peer sees it: the node is stopping, so it is unreachable.
fn remote<T, E: std::fmt::Display>(to: u64, answer: Result<T, E>) -> Result<T, RpcError> {
    answer.map_err(|error| {
        RPCError::Unreachable(Unreachable::from_string(format!(
            "node {to} is stopping: {error}"
        )))
    })
}

impl RaftNetworkFactory<TypeConfig> for SimNode {
    type Network = SimClient;

    async fn new_client(&mut self, target: u64, _node: &Member) -> SimClient {
        SimClient {
            net: self.net.clone(),
            from: self.id,
            to: target,
        }
    }
}

/// One node's side of the network: what it hands openraft.
pub struct SimNode {
    pub net: SimNet,
    pub id: u64,
}

/// openraft's connection from one node to another.
pub struct SimClient {
    net: SimNet,
    from: u64,
    to: u64,
}

impl RaftNetworkV2<TypeConfig> for SimClient {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RpcError> {
        let to_id = self.to;
        self.net
            .deliver(
                self.from,
                self.to,
                RPCTypes::AppendEntries,
                |to| async move { remote(to_id, to.raft.append_entries(rpc).await) },
            )
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RpcError> {
        let to_id = self.to;
        self.net
            .deliver(self.from, self.to, RPCTypes::Vote, |to| async move {
                remote(to_id, to.raft.vote(rpc).await)
            })
            .await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RpcError> {
        let to_id = self.to;
        self.net
            .deliver(self.from, self.to, RPCTypes::Vote, |to| async move {
                remote(to_id, to.raft.pre_vote(rpc).await)
            })
            .await
    }

    async fn transfer_leader(
        &mut self,
        rpc: TransferLeaderRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RpcError> {
        let to_id = self.to;
        self.net
            .deliver(
                self.from,
                self.to,
                RPCTypes::TransferLeader,
                |to| async move { remote(to_id, to.raft.handle_transfer_leader(rpc).await) },
            )
            .await
    }

    /// The snapshot's bytes are read whole and written into the receiver's inbox, which checks
    /// them as it would a transfer over the wire, then installed there.
    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let to_id = self.to;
        let Snapshot { meta, snapshot } = snapshot;
        let bytes = snapshot
            .into_bytes()
            .map_err(|error| StreamingError::from(RPCError::Network(NetworkError::new(&error))))?;
        let sent = self.net.deliver(
            self.from,
            self.to,
            RPCTypes::InstallSnapshot,
            |to| async move {
                let received = (|| {
                    let mut receiving = to.inbox.receive()?;
                    receiving.append(&bytes)?;
                    receiving.finish()
                })();
                let data = received.map_err(|error| {
                    RPCError::Network(NetworkError::from_string(format!(
                        "node {to_id} could not receive the snapshot: {error}"
                    )))
                })?;
                remote(
                    to_id,
                    to.raft
                        .install_full_snapshot(
                            vote,
                            Snapshot {
                                meta,
                                snapshot: data,
                            },
                        )
                        .await,
                )
            },
        );
        tokio::select! {
            biased;
            closed = cancel => Err(StreamingError::Closed(closed)),
            sent = sent => sent.map_err(StreamingError::from),
        }
    }
}
