//! The simulated cluster: real Baton nodes (openraft, the store, the machine, the proposer) in
//! one process, each with its own simulated disk (`store::SimDisk`) and clock, on the
//! simulator's network; started, crashed, cut off from power and restarted by the fault
//! schedule; and the invariants checked while it runs.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::Context;
use baton_raft_store::machine::Limits;
use baton_raft_store::proposer::{Clock, Proposer, ProposerSettings};
use baton_raft_store::store::{
    self, DiskLatency, Io, LogId, MachineHandle, Member, Options, Raft, RaftTiming, SimDisk,
    StoreError, Vote,
};
use openraft::async_runtime::WatchReceiver;
use openraft::ChangeMembers;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::net::{Endpoint, SimNet, SimNode};

/// A change of the voters.
#[derive(Debug, Clone, Copy)]
pub enum Change {
    Add(u64),
    Remove(u64),
}

/// A node that is up: its Raft handle, its applied state and its proposer (which turns
/// commands into entries stamped by the node's leader clock, as in `batond`).
#[derive(Clone)]
pub struct Running {
    pub raft: Raft,
    pub machine: MachineHandle,
    pub proposer: Proposer,
    /// Which start of the cluster's this is (each start takes the next number).
    incarnation: u64,
}

impl Running {
    /// openraft has not stopped the node (on a storage error, say).
    fn runs(&self) -> bool {
        self.raft.metrics().borrow_watched().running_state.is_ok()
    }
}

/// A node's monotonic clock: it reads 0 when the node starts and runs at `rate` times
/// simulated time.
#[derive(Debug, Clone, Copy)]
struct SimClock {
    anchor: tokio::time::Instant,
    anchor_ms: f64,
    rate: f64,
    /// The rate of this node's hardware, which a `clock` fault changes for a while.
    base_rate: f64,
}

impl SimClock {
    fn reading_ms(&self) -> f64 {
        self.anchor_ms + self.anchor.elapsed().as_secs_f64() * 1_000.0 * self.rate
    }
}

/// Every node's clock, shared by the cluster (which starts, reads and bends them) and each
/// node's proposer (which reads its own).
type Clocks = Arc<Mutex<BTreeMap<u64, SimClock>>>;

/// Node `id`'s clock, as its proposer reads it.
#[derive(Debug)]
struct NodeClock {
    clocks: Clocks,
    id: u64,
}

impl Clock for NodeClock {
    fn now_ms(&self) -> u64 {
        lock(&self.clocks)
            .get(&self.id)
            .map_or(0, |clock| clock.reading_ms() as u64)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How far a node's clock rate strays from simulated time at most, without a `clock` fault
/// (and by how much the fault pushes it: within the 1% of docs/guarantees.md G6).
const BASE_RATE_ERROR: f64 = 0.005;
pub const FAULT_RATE_ERROR: f64 = 0.0099;

/// The nodes, up or down, shared by the fault schedule, the clients and the invariant watch.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Mutex<Inner>>,
    clocks: Clocks,
    net: SimNet,
    dir: PathBuf,
    timing: RaftTiming,
    ids: Vec<u64>,
}

/// A log segment of the simulated stores gets no more entries past this many bytes: small, so
/// that purges remove segments.
const SEGMENT_BYTES: u64 = 4 << 10;

struct Inner {
    up: BTreeMap<u64, Running>,
    /// Every node's disk, as the node finds it when it starts.
    disks: BTreeMap<u64, SimDisk>,
    /// Decides how much of each unsynced write a power cut keeps.
    power: StdRng,
    /// Seeds each start's disk latency.
    latency: StdRng,
    /// Nodes started so far.
    starts: u64,
    /// What the invariants have seen: each node's greatest vote, across its restarts; at each
    /// applied index what was seen first; and for each node the start and applied log id of
    /// its state last digested.
    votes: BTreeMap<u64, Vote>,
    applied: BTreeMap<u64, Applied>,
    digested: BTreeMap<u64, (u64, LogId)>,
    violations: Vec<String>,
}

impl Cluster {
    /// A cluster of nodes `ids`, none started, each with an empty disk (and a real data dir
    /// under `dir` for its lock file); `seed` draws each node's clock rate, its disk's
    /// latency and what power cuts keep.
    pub fn new(net: SimNet, dir: PathBuf, timing: RaftTiming, ids: Vec<u64>, seed: u64) -> Cluster {
        Cluster {
            inner: Arc::new(Mutex::new(Inner {
                up: BTreeMap::new(),
                disks: ids.iter().map(|id| (*id, SimDisk::default())).collect(),
                power: StdRng::seed_from_u64(seed),
                latency: StdRng::seed_from_u64(seed ^ 0xd15c),
                starts: 0,
                votes: BTreeMap::new(),
                applied: BTreeMap::new(),
                digested: BTreeMap::new(),
                violations: Vec::new(),
            })),
            clocks: Arc::new(Mutex::new(
                ids.iter()
                    .zip(StdRng::seed_from_u64(seed ^ 0xc10c).random_iter::<f64>())
                    .map(|(id, draw)| {
                        let base_rate = 1.0 + BASE_RATE_ERROR * (2.0 * draw - 1.0);
                        let clock = SimClock {
                            anchor: tokio::time::Instant::now(),
                            anchor_ms: 0.0,
                            rate: base_rate,
                            base_rate,
                        };
                        (*id, clock)
                    })
                    .collect(),
            )),
            net,
            dir,
            timing,
            ids,
        }
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// The network the nodes are on.
    pub fn net(&self) -> &SimNet {
        &self.net
    }

    /// Every member's id.
    pub fn ids(&self) -> &[u64] {
        &self.ids
    }

    /// Node `id`, if it is up: started, and openraft has not stopped it (a real node exits
    /// then, and its clients find nothing listening).
    pub fn node(&self, id: u64) -> Option<Running> {
        self.inner()
            .up
            .get(&id)
            .filter(|running| running.runs())
            .cloned()
    }

    /// Starts node `id` on its disk (as it was left, or empty). A crashed node's store may
    /// still be held by its last tasks for a moment: the open is tried again until it is free.
    pub async fn start(&self, id: u64) -> anyhow::Result<()> {
        // One that openraft stopped is still listed: a real node has exited by then.
        if self.inner().up.contains_key(&id) {
            self.crash(id).await;
        }
        let dir = self.dir.join(format!("n{id}"));
        let latency = DiskLatency::new(self.inner().latency.random());
        let options = Options {
            io: Io::Simulated(latency),
            disk: Arc::new(self.inner().disks.entry(id).or_default().clone()),
            segment_bytes: SEGMENT_BYTES,
        };
        let mut attempts = 0;
        let (log, state_machine) = loop {
            match store::open_with(&dir, &options) {
                Ok(opened) => break opened,
                Err(StoreError::InUse(_)) if attempts < 100 => {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(error) => {
                    return Err(error).with_context(|| format!("opening node {id}'s store"))
                }
            }
        };
        let inbox = state_machine.snapshot_inbox();
        let machine = state_machine.handle();
        let config = store::raft_config(id, &self.timing).context("raft configuration")?;
        let network = SimNode {
            net: self.net.clone(),
            id,
        };
        let raft = Raft::new(id, Arc::new(config), network, log, state_machine)
            .await
            .with_context(|| format!("starting node {id}"))?;
        self.net.attach(
            id,
            Endpoint {
                raft: raft.clone(),
                inbox: inbox.clone(),
            },
        );
        // A new process: its monotonic clock reads 0.
        if let Some(clock) = lock(&self.clocks).get_mut(&id) {
            clock.anchor = tokio::time::Instant::now();
            clock.anchor_ms = 0.0;
        }
        let clock = NodeClock {
            clocks: self.clocks.clone(),
            id,
        };
        let proposer = Proposer::spawn(
            raft.clone(),
            machine.clone(),
            Arc::new(clock),
            id,
            proposer_settings(&self.timing),
        );
        let incarnation = {
            let mut inner = self.inner();
            inner.starts += 1;
            let incarnation = inner.starts;
            inner.up.insert(
                id,
                Running {
                    raft,
                    machine,
                    proposer,
                    incarnation,
                },
            );
            incarnation
        };
        // As `batond` does, the node stops on a storage error met while it gathers a snapshot
        // (storage work openraft does not call, so it would not stop on it by itself).
        let cluster = self.clone();
        tokio::spawn(async move {
            inbox.failed().await;
            let current = cluster
                .inner()
                .up
                .get(&id)
                .map(|running| running.incarnation);
            if current == Some(incarnation) {
                cluster.stop(id).await;
            }
        });
        Ok(())
    }

    /// Makes node 1 initialize the cluster of every member.
    pub async fn initialize(&self) -> anyhow::Result<()> {
        let members: BTreeMap<u64, Member> =
            self.ids.iter().map(|id| (*id, Member::default())).collect();
        let first = self.node(self.ids[0]).context("the first node is not up")?;
        first
            .raft
            .initialize(members)
            .await
            .context("initializing the cluster")
    }

    /// Stops node `id` as a SIGKILL would: its messages are lost from now on, its tasks end,
    /// and what it wrote stays on its disk (unsynced writes included: a crash, not a power cut).
    pub async fn crash(&self, id: u64) {
        self.stop(id).await;
        let mut inner = self.inner();
        if let Some(disk) = inner.disks.get_mut(&id) {
            *disk = disk.crash();
        }
    }

    /// Stops node `id` as a power cut would: as `crash`, and then what its disk had not synced
    /// is lost, kept, or torn (new bytes up to some point, the old ones after it), one change
    /// at a time as the seed decides.
    pub async fn power_cut(&self, id: u64) {
        self.stop(id).await;
        let mut inner = self.inner();
        let Inner { disks, power, .. } = &mut *inner;
        if let Some(disk) = disks.get_mut(&id) {
            *disk = disk.power_cut(|steps| match power.random_range(0..3) {
                0 => 0,
                1 => steps,
                _ => power.random_range(0..=steps),
            });
        }
    }

    /// Node `id`'s clock runs at `rate` times simulated time from now on (`None`: its own
    /// rate again); the reading never jumps.
    pub fn set_clock_rate(&self, id: u64, rate: Option<f64>) {
        if let Some(clock) = lock(&self.clocks).get_mut(&id) {
            clock.anchor_ms = clock.reading_ms();
            clock.anchor = tokio::time::Instant::now();
            clock.rate = rate.unwrap_or(clock.base_rate);
        }
    }

    /// Node `id`'s disk fails every operation from now on, reads included, until the node is
    /// crashed (which gives it back a working disk with what it held).
    pub fn fail_disk(&self, id: u64) {
        if let Some(disk) = self.inner().disks.get(&id) {
            disk.fail_after(disk.steps());
        }
    }

    /// How many operations node `id`'s disk refused, and whether the node still runs (it is up
    /// and openraft has not stopped it).
    pub fn disk_failures(&self, id: u64) -> (usize, bool) {
        let inner = self.inner();
        let refused = inner.disks.get(&id).map_or(0, SimDisk::failures);
        let runs = inner.up.get(&id).is_some_and(Running::runs);
        (refused, runs)
    }

    /// Records a broken invariant that the fault schedule saw.
    pub fn violation(&self, violation: String) {
        self.inner().violations.push(violation);
    }

    /// Takes node `id` off the network and ends its tasks.
    async fn stop(&self, id: u64) {
        self.net.detach(id);
        let running = self.inner().up.remove(&id);
        if let Some(running) = running {
            let _ = running.raft.shutdown().await;
        }
    }

    /// The leader, as the nodes that are up see it: one that is up, runs and leads. (A leader that
    /// removed itself and stepped down still names itself as the leader it last knew.)
    pub fn leader(&self) -> Option<u64> {
        let up = self.inner().up.clone();
        up.iter()
            .find(|(id, running)| {
                let metrics = running.raft.metrics();
                let metrics = metrics.borrow_watched();
                metrics.running_state.is_ok()
                    && metrics.state.is_leader()
                    && metrics.current_leader == Some(**id)
            })
            .map(|(id, _)| *id)
    }

    /// The voters of the leader's membership, if there is a leader.
    pub fn voters(&self) -> Option<BTreeSet<u64>> {
        let leader = self.node(self.leader()?)?;
        let metrics = leader.raft.metrics();
        let voters = metrics
            .borrow_watched()
            .membership_config
            .membership()
            .voter_ids()
            .collect();
        Some(voters)
    }

    /// Removes voter `id` (`Change::Remove`) or makes it a voter again (`Change::Add`: first a
    /// learner that has caught up), through whichever node leads, trying again for up to
    /// `within`.
    pub async fn change_voters(&self, change: Change, within: Duration) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + within;
        let mut last_error = "no leader".to_owned();
        while tokio::time::Instant::now() < deadline {
            if let Some(leader) = self.leader().and_then(|id| self.node(id)) {
                let changed = match change {
                    Change::Remove(id) => leader
                        .raft
                        .change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false)
                        .await
                        .map(drop)
                        .map_err(|error| error.to_string()),
                    Change::Add(id) => {
                        match leader.raft.add_learner(id, Member::default(), true).await {
                            Ok(_) => leader
                                .raft
                                .change_membership(
                                    ChangeMembers::AddVoterIds(BTreeSet::from([id])),
                                    false,
                                )
                                .await
                                .map(drop)
                                .map_err(|error| error.to_string()),
                            Err(error) => Err(error.to_string()),
                        }
                    }
                };
                match changed {
                    Ok(()) => return Ok(()),
                    Err(error) => last_error = error,
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(last_error)
    }

    /// Checks the invariants on every node that is up:
    /// - a node's vote never goes back, across restarts: openraft grants only a vote greater
    ///   than the one it holds, and holds it durably. (Two leaders in one term are no fault:
    ///   openraft's leader ids are (term, candidate) pairs, and a node may grant the greater of
    ///   two in one term.)
    /// - an applied index is the same entry on every node, forever (committed entries never
    ///   change);
    /// - the applied state at an index is the same on every node (its encoding's hash), when
    ///   `states` (encoding a whole state is by far the costliest part: the simulator checks
    ///   states less often than the rest, and a node's state only once per applied index).
    pub fn check_invariants(&self, states: bool) {
        let up = self.inner().up.clone();
        for (id, running) in up {
            let vote = running.raft.metrics().borrow_watched().vote;
            let digested = self.inner().digested.get(&id).copied();
            let seen = running.machine.read(|machine, last_applied| {
                last_applied.map(|log_id| {
                    let new = digested != Some((running.incarnation, log_id));
                    let hash = (states && new)
                        .then(|| machine.encode_snapshot().map(|bytes| digest(&bytes)));
                    (log_id, hash)
                })
            });
            let mut inner = self.inner();
            // A node just started shows the vote of term 0 until openraft reports the one it
            // read from its store.
            if vote.leader_id.term > 0 {
                match inner.votes.get(&id).copied() {
                    Some(greatest) if vote < greatest => inner.violations.push(format!(
                        "node {id}'s vote went back from {greatest} to {vote}"
                    )),
                    _ => {
                        inner.votes.insert(id, vote);
                    }
                }
            }
            match seen {
                Ok(Some((log_id, hash))) => {
                    let hash = match hash {
                        Some(Ok(hash)) => {
                            inner.digested.insert(id, (running.incarnation, log_id));
                            Some(hash)
                        }
                        Some(Err(error)) => {
                            inner
                                .violations
                                .push(format!("node {id}'s state could not be encoded: {error}"));
                            None
                        }
                        None => None,
                    };
                    let first = *inner.applied.entry(log_id.index).or_insert(Applied {
                        log_id,
                        hash,
                        node: id,
                    });
                    if first.log_id != log_id {
                        inner.violations.push(format!(
                            "index {} applied as {} on node {} and as {log_id} on node {id}",
                            log_id.index, first.log_id, first.node
                        ));
                    } else if let (Some(first_hash), Some(hash)) = (first.hash, hash) {
                        if first_hash != hash {
                            inner.violations.push(format!(
                                "the state applied through {log_id} differs between node {} and node {id}",
                                first.node
                            ));
                        }
                    } else if first.hash.is_none() && hash.is_some() {
                        // The first digest taken at this index: the one later ones must match.
                        inner.applied.insert(
                            log_id.index,
                            Applied {
                                log_id,
                                hash,
                                node: id,
                            },
                        );
                    }
                }
                Ok(None) => {}
                Err(error) => inner
                    .violations
                    .push(format!("node {id}'s state could not be read: {error}")),
            }
        }
    }

    /// The invariants broken so far.
    pub fn violations(&self) -> Vec<String> {
        self.inner().violations.clone()
    }

    /// The nodes that are up whose proposer waits for openraft's answer for a batch.
    pub fn proposers_waiting(&self) -> Vec<u64> {
        self.inner()
            .up
            .iter()
            .filter(|(_, running)| running.proposer.batches_in_flight() > 0)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Every node that is up applied the same last index (and the cluster has a leader).
    pub fn converged(&self) -> bool {
        let up = self.inner().up.clone();
        let applied: Vec<Option<u64>> = up
            .values()
            .map(|running| {
                running
                    .raft
                    .metrics()
                    .borrow_watched()
                    .last_applied
                    .map(|log_id| log_id.index)
            })
            .collect();
        self.leader().is_some() && applied.windows(2).all(|pair| pair[0] == pair[1])
    }
}

/// What the invariants saw first at an applied index: the entry's log id, the digest of the
/// state it left (if one was taken), and the node.
#[derive(Debug, Clone, Copy)]
struct Applied {
    log_id: LogId,
    hash: Option<u64>,
    node: u64,
}

/// The proposer's settings in `batond`'s defaults (a tick every 250 ms, a sweep check every
/// second, the default limits' sweep batch and group commit); a request waits for a leader as
/// long as `batond`'s do.
fn proposer_settings(timing: &RaftTiming) -> ProposerSettings {
    let limits = Limits::default();
    ProposerSettings {
        tick: Duration::from_millis(250),
        sweep: Duration::from_secs(1),
        sweep_batch_max: u32::try_from(limits.sweep_batch_max).unwrap_or(u32::MAX),
        batch_commands_max: 1_024,
        apply_timeout: Duration::from_millis(timing.election_timeout_ms * 2 + 1_000),
    }
}

/// A hash of an applied state's encoding (SipHash with fixed keys: the same in every run).
fn digest(bytes: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    hasher.write(bytes);
    hasher.finish()
}
