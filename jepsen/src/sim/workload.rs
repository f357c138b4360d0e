//! What runs against the simulated cluster: clients writing and reading registers and
//! acquiring leases, recorded in the harness's history format so that its checkers judge it,
//! and the fault schedule. Every choice is drawn from a generator seeded by the run's seed.
//!
//! Clients talk to a node's Raft directly, as the node's own service does: a write is one
//! entry (`client_write`), a read waits for a read index (`ensure_linearizable`) and then
//! reads the node's applied state. A node that is not the leader answers `ForwardToLeader`
//! before appending anything, and the client then tries the leader it names once, as a
//! follower's relay would.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_raft_store::machine::{
    Batch, Command, LeaseMode, Namespace, NewSession, Op as MachineOp, Owner, Reply, ResourcePath,
    SessionId,
};
use baton_raft_store::store::Raft;
use openraft::errors::{ClientWriteError, LinearizableReadError, RaftError};
use openraft::ReadPolicy;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::cluster::Cluster;
use crate::history::{Op, OpType, Process, FINAL, NEMESIS};

/// Registers and lease paths the clients share.
const KEYS: u64 = 3;
/// How long a client waits for an answer before it records the outcome as unknown.
const OP_TIMEOUT: Duration = Duration::from_secs(1);
/// The TTL of every client's lease.
const LEASE_TTL_MS: u64 = 1_000;

/// The history, recorded in simulated time.
#[derive(Clone)]
pub struct Recorder {
    ops: Arc<Mutex<Vec<Op>>>,
    start: Instant,
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder {
            ops: Arc::default(),
            start: Instant::now(),
        }
    }

    /// Simulated time since the run started.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    pub fn record(&self, process: Process, kind: OpType, f: &str, key: &str, value: Value) {
        self.record_error(process, kind, f, key, value, None);
    }

    fn record_error(
        &self,
        process: Process,
        kind: OpType,
        f: &str,
        key: &str,
        value: Value,
        error: Option<String>,
    ) {
        let time_ns = self.now_ns();
        let mut ops = self
            .ops
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let index = ops.len() as u64;
        ops.push(Op {
            index,
            time_ns,
            process,
            kind,
            f: f.to_owned(),
            key: if key.is_empty() {
                Value::Null
            } else {
                Value::from(key)
            },
            value,
            error,
            cluster_time_ms: None,
            node: None,
        });
    }

    pub fn history(&self) -> Vec<Op> {
        self.ops
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

/// How an operation ended.
enum Outcome {
    Ok(Value),
    /// Surely not applied, with the reason.
    Fail(String),
    /// May or may not have been applied.
    Unknown(String),
}

fn namespace() -> Namespace {
    Namespace::new("sim").expect("a valid namespace")
}

fn path(text: &str) -> ResourcePath {
    ResourcePath::new(text).expect("a valid path")
}

/// One client: operations one after another until `until`, each on a node drawn at random.
pub async fn client(cluster: Cluster, recorder: Recorder, number: u64, seed: u64, until: Instant) {
    let mut random = StdRng::seed_from_u64(seed);
    let mut process = number;
    let mut written = 0u64;
    while Instant::now() < until {
        let node = cluster.ids()[random.random_range(0..cluster.ids().len())];
        let key_number = random.random_range(0..KEYS);
        let draw = random.random_range(0..100);
        let (f, key, invoke, command) = if draw < 45 {
            written += 1;
            let value = number * 1_000_000 + written;
            let key = format!("r{key_number}");
            let command = MachineOp::KvPut {
                key: path(&key),
                value: value.to_string(),
                fence: None,
            };
            ("write", key, json!({ "value": value }), Some(command))
        } else if draw < 80 {
            ("read", format!("r{key_number}"), Value::Null, None)
        } else {
            let key = format!("l{key_number}");
            let command = MachineOp::Acquire {
                resource: path(&key),
                mode: LeaseMode::Exclusive,
                owner: Owner::NewSession(NewSession {
                    session_id: SessionId(random.random()),
                    holder: format!("client-{number}"),
                    ttl_ms: LEASE_TTL_MS,
                    labels: Default::default(),
                }),
                max_hold_ms: None,
                labels: Default::default(),
            };
            ("acquire", key, Value::Null, Some(command))
        };
        recorder.record(Process::Client(process), OpType::Invoke, f, &key, invoke);
        let outcome = tokio::time::timeout(OP_TIMEOUT, async {
            match command {
                Some(command) => write(&cluster, node, &recorder, command).await,
                None => read(&cluster, node, &key).await,
            }
        })
        .await
        .unwrap_or_else(|_| Outcome::Unknown("no answer in time".to_owned()));
        let (kind, value, error) = match outcome {
            Outcome::Ok(value) => (OpType::Ok, value, None),
            Outcome::Fail(error) => (OpType::Fail, Value::Null, Some(error)),
            Outcome::Unknown(error) => (OpType::Info, Value::Null, Some(error)),
        };
        recorder.record_error(Process::Client(process), kind, f, &key, value, error);
        if kind == OpType::Info {
            // As in the harness: a client whose operation may still take effect goes on as a
            // new process.
            process += 1_000;
        }
        tokio::time::sleep(Duration::from_millis(random.random_range(0..20))).await;
    }
}

/// Proposes `op` as one entry at `node`, or at the leader it names.
async fn write(cluster: &Cluster, node: u64, recorder: &Recorder, op: MachineOp) -> Outcome {
    let batch = Batch {
        stamp_ms: recorder.now_ns() / 1_000_000,
        commands: vec![Command::Namespaced {
            namespace: namespace(),
            idempotency: None,
            op,
        }],
    };
    let mut target = node;
    for _ in 0..2 {
        let Some(running) = cluster.node(target) else {
            return Outcome::Fail(format!("node {target} is down"));
        };
        match running.raft.client_write(batch.clone()).await {
            Ok(written) => {
                let Some(response) = written.data.responses.first() else {
                    return Outcome::Unknown("an entry applied with no response".to_owned());
                };
                return match &response.outcome {
                    Ok(Reply::KvWritten { revision }) => {
                        Outcome::Ok(json!({ "revision": revision }))
                    }
                    Ok(Reply::Granted(grant)) => Outcome::Ok(json!({ "fence": grant.lease.fence })),
                    Ok(other) => Outcome::Unknown(format!("unexpected reply {other:?}")),
                    Err(rejection) => Outcome::Fail(rejection.code().to_owned()),
                };
            }
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                match forward.leader_id {
                    Some(leader) if leader != target => target = leader,
                    _ => return Outcome::Fail("NO_LEADER".to_owned()),
                }
            }
            Err(error) => return Outcome::Unknown(error.to_string()),
        }
    }
    Outcome::Fail("NO_LEADER".to_owned())
}

/// Reads register `key` linearizably at `node`, or at the leader it names.
async fn read(cluster: &Cluster, node: u64, key: &str) -> Outcome {
    let mut target = node;
    for _ in 0..2 {
        let Some(running) = cluster.node(target) else {
            return Outcome::Fail(format!("node {target} is down"));
        };
        match linearizable_read(&running.raft).await {
            Ok(()) => {
                let read = running.machine.read(|machine, _| {
                    machine
                        .kv_get(&namespace(), &path(key))
                        .map(|view| view.value)
                });
                return match read {
                    Ok(Some(value)) => match value.parse::<u64>() {
                        Ok(number) => Outcome::Ok(json!({ "value": number })),
                        Err(_) => Outcome::Unknown(format!("a register holds {value:?}")),
                    },
                    Ok(None) => Outcome::Ok(json!({ "value": null })),
                    Err(error) => Outcome::Fail(error.to_string()),
                };
            }
            Err(Some(leader)) if leader != target => target = leader,
            Err(_) => return Outcome::Fail("NO_LEADER".to_owned()),
        }
    }
    Outcome::Fail("NO_LEADER".to_owned())
}

/// Waits until `raft` has applied everything committed before the call, as the leader
/// confirms it; `Err` with the leader to ask instead, if known.
async fn linearizable_read(raft: &Raft) -> Result<(), Option<u64>> {
    match raft.ensure_linearizable(ReadPolicy::ReadIndex).await {
        Ok(_) => Ok(()),
        Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(forward))) => {
            Err(forward.leader_id)
        }
        Err(_) => Err(None),
    }
}

/// The final reads: every register read through the leader once the cluster has healed.
pub async fn final_reads(cluster: &Cluster, recorder: &Recorder) {
    for key_number in 0..KEYS {
        let key = format!("r{key_number}");
        let outcome = match cluster.leader() {
            Some(leader) => read(cluster, leader, &key).await,
            None => Outcome::Fail("no leader".to_owned()),
        };
        let value = match outcome {
            Outcome::Ok(read) => json!({ "ok": true, "value": read["value"] }),
            Outcome::Fail(error) | Outcome::Unknown(error) => {
                json!({ "ok": false, "error": error })
            }
        };
        recorder.record(
            Process::Named(FINAL.to_owned()),
            OpType::Info,
            "final-read",
            &key,
            value,
        );
    }
}

/// The fault schedule: one fault at a time, each held for a while and then undone, until
/// `until`. Returns how many faults it injected.
pub async fn nemesis(cluster: Cluster, recorder: Recorder, seed: u64, until: Instant) -> usize {
    let mut random = StdRng::seed_from_u64(seed);
    let mut faults = 0;
    let nemesis = || Process::Named(NEMESIS.to_owned());
    loop {
        tokio::time::sleep(Duration::from_millis(random.random_range(100..1_000))).await;
        if Instant::now() >= until {
            return faults;
        }
        faults += 1;
        let ids = cluster.ids().to_vec();
        let victim = match random.random_range(0..3) {
            0 => cluster.leader().unwrap_or(ids[0]),
            _ => ids[random.random_range(0..ids.len())],
        };
        let hold = Duration::from_millis(random.random_range(200..2_000));
        match random.random_range(0..3) {
            0 => {
                recorder.record(
                    nemesis(),
                    OpType::Info,
                    "partition",
                    "",
                    json!({ "isolated": victim }),
                );
                for other in ids.iter().filter(|id| **id != victim) {
                    cluster.net().cut(victim, *other);
                    cluster.net().cut(*other, victim);
                }
                tokio::time::sleep(hold).await;
                cluster.net().heal();
                recorder.record(nemesis(), OpType::Info, "heal", "", Value::Null);
            }
            1 => {
                let other = ids[random.random_range(0..ids.len())];
                recorder.record(
                    nemesis(),
                    OpType::Info,
                    "cut-one-way",
                    "",
                    json!({ "from": victim, "to": other }),
                );
                cluster.net().cut(victim, other);
                tokio::time::sleep(hold).await;
                cluster.net().heal();
                recorder.record(nemesis(), OpType::Info, "heal", "", Value::Null);
            }
            _ => {
                recorder.record(
                    nemesis(),
                    OpType::Info,
                    "kill",
                    "",
                    json!({ "node": victim }),
                );
                cluster.crash(victim).await;
                tokio::time::sleep(hold).await;
                let started = cluster.start(victim).await;
                recorder.record(
                    nemesis(),
                    OpType::Info,
                    "start",
                    "",
                    json!({ "node": victim, "ok": started.is_ok(), "error": started.err().map(|error| format!("{error:#}")) }),
                );
            }
        }
    }
}
