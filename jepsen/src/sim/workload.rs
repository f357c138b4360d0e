//! What runs against the simulated cluster: clients writing and reading registers and
//! acquiring leases, recorded in the harness's history format so that its checkers judge it,
//! and the fault schedule. Every choice is drawn from a generator seeded by the run's seed.
//!
//! Clients talk to a node as the node's own service does: a write goes to the node's proposer
//! (which groups it with others into one entry stamped by the leader's clock), and a read waits
//! until the node, as leader, has applied its takeover log and a read index, and then reads the
//! node's applied state. A follower passes a write or a read on to the leader it knows, once.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_raft_store::machine::{
    Command, EventKind, LeaseMode, Name, Namespace, NewSession, Op as MachineOp, Owner, Reply,
    ResourcePath, SessionId, TaskFence, TaskSpec,
};
use baton_raft_store::proposer::{Committed, ProposeError};
use openraft::async_runtime::WatchReceiver;
use openraft::errors::{LinearizableReadError, RaftError};
use openraft::ReadPolicy;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::cluster::{Change, Cluster, Running, FAULT_RATE_ERROR};
use crate::checkers::line::FINAL_EVENTS;
use crate::history::{Op, OpType, Process, FINAL, NEMESIS};
use crate::workloads::{g7_valid_until, hold_value, Mode, HOLDS};

/// Registers and lease paths the clients share.
const KEYS: u64 = 3;
/// How long a client waits for an answer before it records the outcome as unknown: longer
/// than the proposer waits for openraft's (`proposer_settings`), as a client of `batond`
/// waits longer than the node's own bound, so that what the proposer answers is what the
/// client records.
const OP_TIMEOUT: Duration = Duration::from_secs(3);
/// What a command's encoding is taken to weigh, for the proposer's bound on a batch's bytes.
const COMMAND_BYTES: usize = 128;
/// How long a membership change is tried for.
pub const MEMBERSHIP_WAIT: Duration = Duration::from_secs(3);
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
        self.record_answer(process, kind, f, key, value, None, None);
    }

    /// Records an operation's completion: with its error, if it failed, and the cluster time
    /// of the state that decided it, if a node's machine did.
    #[allow(clippy::too_many_arguments)]
    fn record_answer(
        &self,
        process: Process,
        kind: OpType,
        f: &str,
        key: &str,
        value: Value,
        error: Option<String>,
        cluster_time_ms: Option<u64>,
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
            cluster_time_ms,
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
    /// Done, with the cluster time of the state that answered.
    Ok(Value, u64),
    /// Surely not applied, with the reason, and the cluster time of the state that refused,
    /// when a node's machine did.
    Fail(String, Option<u64>),
    /// May or may not have been applied.
    Unknown(String),
}

impl Outcome {
    /// Refused before any machine decided.
    fn refused(reason: impl Into<String>) -> Outcome {
        Outcome::Fail(reason.into(), None)
    }
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
        let operation = async {
            match command {
                Some(command) => write(&cluster, node, command).await,
                None => read(&cluster, node, &key).await,
            }
        };
        let (kind, value, sent_ns) = operate(&recorder, process, f, &key, invoke, operation).await;
        if kind == OpType::Ok && f == "acquire" {
            let hold = Hold {
                start_ns: recorder.now_ns(),
                sent_ns,
                valid_ns: 0,
                released_ns: None,
            };
            record_hold(&recorder, &key, Mode::Exclusive, &value, hold);
        }
        if kind == OpType::Info {
            // As in the harness: a client whose operation may still take effect goes on as a
            // new process.
            process += 1_000;
        }
        tokio::time::sleep(Duration::from_millis(random.random_range(0..20))).await;
    }
}

/// The queue the workers share.
const QUEUE: &str = "q";

/// A claim a worker holds: the task, the claiming session and the claim's fence.
struct Held {
    task: String,
    session_id: SessionId,
    fence: u64,
}

/// One queue worker: enqueues tasks, claims the next (each claim with a session of its own,
/// of `LEASE_TTL_MS`) and completes what it claimed, on a node drawn at random each time,
/// until `until`. A claim it does not complete at its next turn is left to expire with its
/// session, which is never renewed, and the task is claimed again. The `claims` checker judges
/// the history: no task is held by two claims whose G7 intervals overlap.
pub async fn worker(cluster: Cluster, recorder: Recorder, number: u64, seed: u64, until: Instant) {
    let mut random = StdRng::seed_from_u64(seed);
    let mut process = number;
    let mut enqueued = 0u64;
    let mut held: Option<Held> = None;
    let queue = || Name::new("queue", QUEUE).expect("a valid queue name");
    while Instant::now() < until {
        let node = cluster.ids()[random.random_range(0..cluster.ids().len())];
        let draw = random.random_range(0..100);
        let (f, invoke, command) = match held.take() {
            Some(claim) if draw < 60 => {
                let command = MachineOp::Complete {
                    queue: queue(),
                    task_id: Name::new("task id", claim.task.clone()).expect("a task id"),
                    claim: TaskFence {
                        session_id: claim.session_id,
                        fence: claim.fence,
                    },
                    result: None,
                };
                let invoke = json!({ "task": claim.task, "fence": claim.fence });
                ("complete", invoke, command)
            }
            _ if draw < 30 => {
                enqueued += 1;
                let task = format!("w{number}-{enqueued}");
                let command = MachineOp::Enqueue {
                    queue: queue(),
                    task: TaskSpec {
                        task_id: Name::new("task id", task.clone()).expect("a task id"),
                        payload: "{}".to_owned(),
                        priority: 0,
                        depends_on: Vec::new(),
                        max_attempts: 100,
                        delay_ms: 0,
                        on_dead: None,
                    },
                };
                ("enqueue", json!({ "task": task }), command)
            }
            _ => {
                let command = MachineOp::Claim {
                    queue: queue(),
                    owner: Owner::NewSession(NewSession {
                        session_id: SessionId(random.random()),
                        holder: format!("worker-{number}"),
                        ttl_ms: LEASE_TTL_MS,
                        labels: Default::default(),
                    }),
                };
                ("claim", json!({}), command)
            }
        };
        let operation = write(&cluster, node, command);
        let (kind, value, _) = operate(&recorder, process, f, QUEUE, invoke, operation).await;
        if kind == OpType::Info {
            process += 1_000;
        }
        if let (Some(task), Some(fence), Some(session)) = (
            value["task"].as_str(),
            value["fence"].as_u64(),
            value["session"].as_str(),
        ) {
            held = session.parse().ok().map(|session_id| Held {
                task: task.to_owned(),
                session_id: SessionId(session_id),
                fence,
            });
        }
        tokio::time::sleep(Duration::from_millis(random.random_range(0..20))).await;
    }
}

/// The line's paths and modes, as the harness's `line` workload takes them: one exclusive
/// path, and one taken mostly as a shared lease of limit 2 and sometimes exclusively, so that
/// exclusive and shared waiters mix in its line.
const LINE_PATHS: &[(&str, Mode)] = &[
    ("line/a", Mode::Exclusive),
    ("line/a", Mode::Exclusive),
    ("line/s", Mode::Shared { limit: 2 }),
    ("line/s", Mode::Shared { limit: 2 }),
    ("line/s", Mode::Exclusive),
];
/// The TTL of a line waiter's session: it renews it while it waits and while it holds.
const LINE_TTL_MS: u64 = 3_000;

/// One waiter in the resources' lines: round after round, a session with a holder name of its
/// own (`w<number>.<round>`, by which the `line` checker matches the event log and the history)
/// acquires with waiting (`AcquireOrWait`, as `batond` proposes an acquire with `wait_ms`). In
/// line, it renews its session and sends the acquire again until it is granted, its session is
/// gone, or it gives up after a few seconds and leaves the line. Granted, it holds the lease a
/// moment (recorded for `holds` and `shared-limits`), then releases it and ends its session,
/// or walks away from both so that the lease expires and the line is served then.
pub async fn line_waiter(
    cluster: Cluster,
    recorder: Recorder,
    number: u64,
    seed: u64,
    until: Instant,
) {
    let mut waiter = LineWaiter {
        cluster,
        recorder,
        random: StdRng::seed_from_u64(seed),
        process: number,
    };
    for round in 0u64.. {
        if Instant::now() >= until {
            break;
        }
        let (resource, mode) = LINE_PATHS[waiter.random.random_range(0..LINE_PATHS.len())];
        waiter
            .round(&format!("w{number}.{round}"), resource, mode, until)
            .await;
        let pause = waiter.random.random_range(0..100);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

/// A line waiter's state across its rounds.
struct LineWaiter {
    cluster: Cluster,
    recorder: Recorder,
    random: StdRng,
    process: u64,
}

impl LineWaiter {
    async fn round(&mut self, holder: &str, resource: &str, mode: Mode, until: Instant) {
        let session_id = SessionId(self.random.random());
        let since_ns = self.recorder.now_ns();
        let owner = Owner::NewSession(NewSession {
            session_id,
            holder: holder.to_owned(),
            ttl_ms: LINE_TTL_MS,
            labels: Default::default(),
        });
        let (kind, answer) = self.acquire(holder, resource, mode, owner, None).await;
        // An acquire that failed or may have been applied ends the round: a session it made
        // expires, and leaves the line with it.
        if kind != OpType::Ok {
            return;
        }
        let mut valid_ns = 0;
        let grant = if answer["queued"] == Value::Bool(true) {
            let give_up =
                Instant::now() + Duration::from_millis(self.random.random_range(2_500..6_000));
            loop {
                if Instant::now() >= give_up.min(until) {
                    self.let_go("leave", holder, resource, session_id).await;
                    return;
                }
                tokio::time::sleep(Duration::from_millis(self.random.random_range(50..250))).await;
                match self.keepalive(holder, resource, session_id).await {
                    Renewal::Until(valid) => valid_ns = valid_ns.max(valid),
                    Renewal::Gone => return,
                    Renewal::Unsure => {}
                }
                let owner = Owner::Session(session_id);
                let (kind, answer) = self
                    .acquire(holder, resource, mode, owner, Some(since_ns))
                    .await;
                match kind {
                    OpType::Ok if answer["queued"] == Value::Bool(true) => {}
                    OpType::Ok => break answer,
                    _ if answer["error"] == "LEASE_LOST" => return,
                    _ => {}
                }
            }
        } else {
            answer
        };
        self.hold(
            holder, resource, mode, session_id, &grant, since_ns, valid_ns,
        )
        .await;
    }

    /// Holds a granted lease for a moment, renewing its session, then releases it and ends the
    /// session, or walks away; records the hold.
    #[allow(clippy::too_many_arguments)]
    async fn hold(
        &mut self,
        holder: &str,
        resource: &str,
        mode: Mode,
        session_id: SessionId,
        grant: &Value,
        sent_ns: u64,
        mut valid_ns: u64,
    ) {
        let start_ns = self.recorder.now_ns();
        let walks_away = self.random.random_bool(0.15);
        let hold = Duration::from_millis(self.random.random_range(30..400));
        if hold > Duration::from_millis(200) {
            tokio::time::sleep(hold / 2).await;
            if let Renewal::Until(valid) = self.keepalive(holder, resource, session_id).await {
                valid_ns = valid_ns.max(valid);
            }
            tokio::time::sleep(hold / 2).await;
        } else {
            tokio::time::sleep(hold).await;
        }
        let released_ns = (!walks_away).then(|| self.recorder.now_ns());
        let hold = Hold {
            start_ns,
            sent_ns,
            valid_ns,
            released_ns,
        };
        record_hold(&self.recorder, resource, mode, grant, hold);
        if !walks_away {
            self.let_go("release", holder, resource, session_id).await;
        }
    }

    /// Leaves the line, or releases the lease (`f`: `leave` or `release`), and then ends the
    /// session.
    async fn let_go(&mut self, f: &str, holder: &str, resource: &str, session_id: SessionId) {
        let op = MachineOp::LeaveOrRelease {
            session_id,
            resource: path(resource),
        };
        self.call(f, holder, resource, op).await;
        let op = MachineOp::EndSession { session_id };
        self.call("end", holder, resource, op).await;
    }

    /// One acquire with waiting, to a node drawn at random (`since_ns`: a re-sent one, and when
    /// its wait began). Returns its outcome's kind and its answer, or `{"error": code}`.
    async fn acquire(
        &mut self,
        holder: &str,
        resource: &str,
        mode: Mode,
        owner: Owner,
        since_ns: Option<u64>,
    ) -> (OpType, Value) {
        let mut invoke = json!({ "holder": holder, "mode": mode.as_str(), "limit": mode.limit(),
                                 "resend": since_ns.is_some() });
        if let Some(since_ns) = since_ns {
            invoke["since_ns"] = Value::from(since_ns);
        }
        let lease_mode = match mode {
            Mode::Shared { limit } => LeaseMode::Shared { limit },
            Mode::Subtree => LeaseMode::Subtree,
            Mode::Exclusive => LeaseMode::Exclusive,
        };
        let op = MachineOp::AcquireOrWait {
            resource: path(resource),
            mode: lease_mode,
            owner,
            max_hold_ms: None,
            labels: Default::default(),
        };
        self.send("acquire", resource, invoke, op).await
    }

    async fn keepalive(&mut self, holder: &str, resource: &str, session_id: SessionId) -> Renewal {
        let sent_ns = self.recorder.now_ns();
        let (kind, answer) = self
            .send(
                "keepalive",
                resource,
                json!({ "holder": holder }),
                MachineOp::Keepalive { session_id },
            )
            .await;
        match (kind, answer["expires_in_ms"].as_u64()) {
            (OpType::Ok, Some(expires_in_ms)) => {
                let valid = g7_valid_until(Duration::from_nanos(sent_ns), expires_in_ms);
                Renewal::Until(u64::try_from(valid.as_nanos()).unwrap_or(u64::MAX))
            }
            _ if answer["error"] == "LEASE_LOST" => Renewal::Gone,
            _ => Renewal::Unsure,
        }
    }

    async fn call(&mut self, f: &str, holder: &str, resource: &str, op: MachineOp) {
        self.send(f, resource, json!({ "holder": holder }), op)
            .await;
    }

    /// Sends `op` to a node drawn at random and records it as operation `f`; the answer, or
    /// `{"error": ...}` when it failed.
    async fn send(
        &mut self,
        f: &str,
        resource: &str,
        invoke: Value,
        op: MachineOp,
    ) -> (OpType, Value) {
        let ids = self.cluster.ids();
        let node = ids[self.random.random_range(0..ids.len())];
        let operation = write(&self.cluster, node, op);
        let (kind, answer, _) =
            operate(&self.recorder, self.process, f, resource, invoke, operation).await;
        if kind == OpType::Info {
            self.process += 1_000;
        }
        (kind, answer)
    }
}

/// How a line waiter's keepalive went.
enum Renewal {
    /// Renewed: the session is valid until then (simulated ns, G7).
    Until(u64),
    /// The session is gone (`LEASE_LOST`).
    Gone,
    /// Refused otherwise, or unknown.
    Unsure,
}

/// Runs one operation of client `process`: records its invocation, waits for its outcome
/// (unknown after `OP_TIMEOUT`) and records that. Returns the outcome's kind, its value (for
/// one that is not `Ok`, `{"error": ...}`: the rejection's code, or why), and when the
/// operation was sent.
async fn operate(
    recorder: &Recorder,
    process: u64,
    f: &str,
    key: &str,
    invoke: Value,
    operation: impl Future<Output = Outcome>,
) -> (OpType, Value, u64) {
    let sent_ns = recorder.now_ns();
    recorder.record(Process::Client(process), OpType::Invoke, f, key, invoke);
    let outcome = tokio::time::timeout(OP_TIMEOUT, operation)
        .await
        .unwrap_or_else(|_| Outcome::Unknown("no answer in time".to_owned()));
    let (kind, value, error, cluster_time_ms) = match outcome {
        Outcome::Ok(value, time_ms) => (OpType::Ok, value, None, Some(time_ms)),
        Outcome::Fail(error, time_ms) => (OpType::Fail, Value::Null, Some(error), time_ms),
        Outcome::Unknown(error) => (OpType::Info, Value::Null, Some(error), None),
    };
    let process = Process::Client(process);
    let answer = match &error {
        Some(error) => json!({ "error": error }),
        None => value.clone(),
    };
    recorder.record_answer(process, kind, f, key, value, error, cluster_time_ms);
    (kind, answer, sent_ns)
}

/// When a hold began and what bounds it (simulated ns).
struct Hold {
    /// The grant's answer came back.
    start_ns: u64,
    /// The request that was granted was sent (for a grant learned in line, the first acquire).
    sent_ns: u64,
    /// A renewal of the holder's session proved it valid until then (0: none).
    valid_ns: u64,
    /// The holder sent its release then, and stopped acting as holder.
    released_ns: Option<u64>,
}

/// Records the hold a client may claim for the lease `grant`ed on `resource`, as the harness's
/// holders do (process `holds`): from the answer to the end of its G7 validity, counted from
/// when the request was sent on the client's clock (simulated time, which every node's clock
/// strays from by less than the 1% the rule allows) or from a later renewal of its session,
/// and cut short when the holder sent its release. The `holds` checker then finds any two
/// holds that overlap: a lease a node let expire early, by its clock or by a failover, or
/// granted while another still held it.
fn record_hold(recorder: &Recorder, resource: &str, mode: Mode, grant: &Value, hold: Hold) {
    let (Some(fence), Some(expires_in_ms)) =
        (grant["fence"].as_u64(), grant["expires_in_ms"].as_u64())
    else {
        return;
    };
    let valid_until = g7_valid_until(Duration::from_nanos(hold.sent_ns), expires_in_ms);
    let g7_end_ns = u64::try_from(valid_until.as_nanos())
        .unwrap_or(u64::MAX)
        .max(hold.valid_ns);
    let end_ns = hold
        .released_ns
        .map_or(g7_end_ns, |released| released.min(g7_end_ns));
    recorder.record(
        Process::Named(HOLDS.to_owned()),
        OpType::Info,
        "hold",
        resource,
        hold_value(
            &fence.to_string(),
            mode,
            fence,
            hold.start_ns,
            end_ns,
            g7_end_ns,
        ),
    );
}

/// Proposes `op` as `node`'s service would: through its own proposer if it leads, else
/// relayed to the leader it knows, once. A `NotLeader` from the proposer that took it is
/// surely not applied (the proposer's promise), so it is a refusal, never tried again.
async fn write(cluster: &Cluster, node: u64, op: MachineOp) -> Outcome {
    let command = Command::Namespaced {
        namespace: namespace(),
        idempotency: None,
        op,
    };
    let Some(running) = cluster.node(node) else {
        return Outcome::refused(format!("node {node} is down"));
    };
    let leader = running.raft.metrics().borrow_watched().current_leader;
    let target = match leader {
        Some(leader) if leader == node => running,
        Some(leader) => match cluster.node(leader) {
            Some(leader) => leader,
            None => return Outcome::refused("NO_LEADER: the leader is down"),
        },
        None => return Outcome::refused("NO_LEADER"),
    };
    match target.proposer.propose(command, COMMAND_BYTES).await {
        Ok(Committed { response, time_ms }) => match response.outcome {
            Ok(Reply::KvWritten { revision }) => {
                Outcome::Ok(json!({ "revision": revision }), time_ms)
            }
            Ok(Reply::Granted(grant)) => Outcome::Ok(
                json!({ "fence": grant.lease.fence, "expires_in_ms": grant.lease.expires_in_ms }),
                time_ms,
            ),
            Ok(Reply::TaskEnqueued(task)) => {
                Outcome::Ok(json!({ "task": task.id.as_str() }), time_ms)
            }
            Ok(Reply::TaskClaimed(claim)) => Outcome::Ok(
                json!({ "task": claim.task.id.as_str(), "fence": claim.fence,
                        "expires_in_ms": claim.expires_in_ms,
                        "session": claim.session_id.0.to_string() }),
                time_ms,
            ),
            Ok(Reply::QueueEmpty) => Outcome::Ok(json!({ "task": null }), time_ms),
            Ok(Reply::TaskUpdated(task)) => {
                Outcome::Ok(json!({ "state": format!("{:?}", task.state) }), time_ms)
            }
            Ok(Reply::StillGranted(grant)) => Outcome::Ok(
                json!({ "fence": grant.lease.fence, "expires_in_ms": grant.lease.expires_in_ms }),
                time_ms,
            ),
            Ok(Reply::Queued(queued)) => Outcome::Ok(
                json!({ "queued": true, "position": queued.position }),
                time_ms,
            ),
            Ok(Reply::KeptAlive { expires_in_ms, .. }) => {
                Outcome::Ok(json!({ "expires_in_ms": expires_in_ms }), time_ms)
            }
            Ok(Reply::LeftLine { .. }) => Outcome::Ok(json!({ "left": true }), time_ms),
            Ok(Reply::Released { fence, .. }) => Outcome::Ok(json!({ "released": fence }), time_ms),
            Ok(Reply::SessionEnded { .. }) => Outcome::Ok(json!({ "ended": true }), time_ms),
            Ok(other) => Outcome::Unknown(format!("unexpected reply {other:?}")),
            Err(rejection) => Outcome::Fail(rejection.code().to_owned(), Some(time_ms)),
        },
        Err(ProposeError::NotLeader { .. }) => Outcome::refused("NO_LEADER"),
        Err(ProposeError::Overloaded) => Outcome::refused("RESOURCE_EXHAUSTED"),
        Err(ProposeError::Unknown(error)) => Outcome::Unknown(error),
    }
}

/// Reads register `key` linearizably at `node`, or at the leader it names.
async fn read(cluster: &Cluster, node: u64, key: &str) -> Outcome {
    let mut target = node;
    for _ in 0..2 {
        let Some(running) = cluster.node(target) else {
            return Outcome::refused(format!("node {target} is down"));
        };
        match linearizable_read(&running).await {
            Ok(()) => {
                let read = running.machine.read(|machine, _| {
                    let value = machine
                        .kv_get(&namespace(), &path(key))
                        .map(|view| view.value);
                    (value, machine.time_ms())
                });
                return match read {
                    Ok((Some(value), time_ms)) => match value.parse::<u64>() {
                        Ok(number) => Outcome::Ok(json!({ "value": number }), time_ms),
                        Err(_) => Outcome::Unknown(format!("a register holds {value:?}")),
                    },
                    Ok((None, time_ms)) => Outcome::Ok(json!({ "value": null }), time_ms),
                    Err(error) => Outcome::refused(error.to_string()),
                };
            }
            Err(Some(leader)) if leader != target => target = leader,
            Err(_) => return Outcome::refused("NO_LEADER"),
        }
    }
    Outcome::refused("NO_LEADER")
}

/// Waits until `node` has applied everything committed before the call, as the service of
/// `batond` does: the node leads and has applied its takeover log (`wait_leader_ready`), and
/// then a quorum confirms its read index; `Err` with the leader to ask instead, if known.
async fn linearizable_read(node: &Running) -> Result<(), Option<u64>> {
    let term = {
        let metrics = node.raft.metrics();
        let metrics = metrics.borrow_watched();
        if metrics.current_leader != Some(metrics.id) {
            return Err(metrics.current_leader);
        }
        metrics.current_term
    };
    if !node.proposer.wait_leader_ready(term, OP_TIMEOUT).await {
        return Err(None);
    }
    match node.raft.ensure_linearizable(ReadPolicy::ReadIndex).await {
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
            None => Outcome::refused("no leader"),
        };
        let value = match outcome {
            Outcome::Ok(read, _) => json!({ "ok": true, "value": read["value"] }),
            Outcome::Fail(error, _) | Outcome::Unknown(error) => {
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

/// The final read of the event log for the `line` checker: every event of the clients'
/// namespace, from revision 0 to the end, read from the leader's applied state once the cluster
/// has healed, in the shape the process harness reads from `GET /v1/events`.
pub fn final_events(cluster: &Cluster, recorder: &Recorder) {
    let read = cluster.leader().and_then(|leader| {
        let running = cluster.node(leader)?;
        running
            .machine
            .read(|machine, _| {
                let mut events = Vec::new();
                let mut after = 0;
                loop {
                    let page = machine.events_after(&namespace(), after, usize::MAX)?;
                    let Some(last) = page.last() else {
                        return Some((leader, events));
                    };
                    after = last.revision;
                    events.extend(page.iter().map(event_value));
                }
            })
            .ok()
            .flatten()
    });
    let value = match read {
        Some((node, events)) => json!({ "node": node, "complete": true, "events": events }),
        None => json!({ "complete": false, "error": "no leader, or the window was trimmed" }),
    };
    recorder.record(
        Process::Named(FINAL.to_owned()),
        OpType::Info,
        FINAL_EVENTS,
        "",
        value,
    );
}

/// An event as the `line` checker reads it: the fields `GET /v1/events` gives the three kinds
/// it replays (`node::service::convert::event`, which the binary-only node keeps), and only the
/// revision of the rest.
fn event_value(event: &baton_raft_store::machine::Event) -> Value {
    let (kind, resource, holder, fence) = match &event.kind {
        EventKind::Queued {
            resource, holder, ..
        } => ("queued", resource.as_str(), Some(holder.as_str()), None),
        EventKind::LeftLine { resource, holder } => {
            ("left_line", resource.as_str(), Some(holder.as_str()), None)
        }
        EventKind::Granted {
            resource,
            holder,
            fence,
            ..
        } => (
            "granted",
            resource.as_str(),
            Some(holder.as_str()),
            Some(*fence),
        ),
        _ => ("other", "", None, None),
    };
    json!({ "revision": event.revision, "type": kind, "resource": resource, "holder": holder,
            "fence": fence })
}

/// Which node a fault strikes: the leader when the fault starts (node 1 if there is none), or
/// a given node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Leader,
    Node(u64),
}

/// What a fault does while it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The target is cut off from every other node, both ways.
    Partition(Target),
    /// Messages from the target to one node are lost; the other way works.
    OneWay(Target, u64),
    /// The target crashes, and starts again on its disk when the fault ends.
    Kill(Target),
    /// The target loses power: it stops, its disk loses or tears what it had not synced, and
    /// it starts again when the fault ends.
    Power(Target),
    /// Every node loses power at once, and all start again when the fault ends.
    Blackout,
    /// The target's disk fails every operation: the node must stop (openraft stops a node
    /// on any storage error). When the fault ends it is restarted on a working disk with what
    /// the failed one held.
    DiskError(Target),
    /// The target's monotonic clock runs fast (`true`) or slow, by just under the 1% that
    /// docs/guarantees.md G6 allows, and then at its own rate again.
    Clock(Target, bool),
    /// The target is removed from the voters while it runs, and added back when the fault
    /// ends.
    Remove(Target),
}

/// One fault of a schedule: after `pause_ms` (from the end of the previous one) it starts, and
/// it is undone `hold_ms` later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub pause_ms: u64,
    pub kind: FaultKind,
    pub hold_ms: u64,
}

/// The faults of seed `seed`, back to back, enough to fill `length`.
pub fn schedule(seed: u64, nodes: &[u64], length: Duration) -> Vec<Fault> {
    let mut random = StdRng::seed_from_u64(seed);
    let mut faults = Vec::new();
    let mut elapsed = 0;
    while elapsed < length.as_millis() as u64 {
        let target = match random.random_range(0..3) {
            0 => Target::Leader,
            _ => Target::Node(nodes[random.random_range(0..nodes.len())]),
        };
        let kind = match random.random_range(0..11) {
            0 | 1 => FaultKind::Partition(target),
            2 => FaultKind::OneWay(target, nodes[random.random_range(0..nodes.len())]),
            3 => FaultKind::Remove(target),
            4 | 5 => FaultKind::Kill(target),
            6 | 7 => FaultKind::Power(target),
            8 => FaultKind::Blackout,
            9 => FaultKind::DiskError(target),
            _ => FaultKind::Clock(target, random.random_bool(0.5)),
        };
        let fault = Fault {
            pause_ms: random.random_range(100..1_000),
            kind,
            hold_ms: random.random_range(200..2_000),
        };
        elapsed += fault.pause_ms + fault.hold_ms;
        faults.push(fault);
    }
    faults
}

/// `PAUSE:KIND[:TARGET[:TO]]:HOLD`, e.g. `420:kill:leader:1300`, `300:one-way:2:3:800` or
/// `500:blackout:900`; a schedule is its faults joined by commas.
impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let target = |target: Target| match target {
            Target::Leader => "leader".to_owned(),
            Target::Node(id) => id.to_string(),
        };
        let kind = match self.kind {
            FaultKind::Partition(on) => format!("partition:{}", target(on)),
            FaultKind::OneWay(from, to) => format!("one-way:{}:{to}", target(from)),
            FaultKind::Kill(on) => format!("kill:{}", target(on)),
            FaultKind::Power(on) => format!("power:{}", target(on)),
            FaultKind::Blackout => "blackout".to_owned(),
            FaultKind::DiskError(on) => format!("disk-error:{}", target(on)),
            FaultKind::Clock(on, fast) => {
                format!(
                    "clock:{}:{}",
                    target(on),
                    if fast { "fast" } else { "slow" }
                )
            }
            FaultKind::Remove(on) => format!("remove:{}", target(on)),
        };
        write!(f, "{}:{kind}:{}", self.pause_ms, self.hold_ms)
    }
}

impl std::str::FromStr for Fault {
    type Err = String;

    fn from_str(text: &str) -> Result<Fault, String> {
        let bad = || {
            format!(
                "{text:?} is not a fault: PAUSE:KIND[:TARGET[:TO]]:HOLD, KIND one of partition, \
                 one-way (with TO), clock (with TO fast or slow), kill, power, disk-error, \
                 remove, or blackout (without TARGET); TARGET \
                 leader or a node id; e.g. 420:kill:leader:1300"
            )
        };
        let parts: Vec<&str> = text.trim().split(':').collect();
        let number = |part: &str| part.parse::<u64>().map_err(|_| bad());
        let target = |part: &str| match part {
            "leader" => Ok(Target::Leader),
            id => number(id).map(Target::Node),
        };
        let (pause, hold) = match (parts.first(), parts.last()) {
            (Some(pause), Some(hold)) if parts.len() >= 3 => (number(pause)?, number(hold)?),
            _ => return Err(bad()),
        };
        let kind = match (parts[1], parts.len()) {
            ("partition", 4) => FaultKind::Partition(target(parts[2])?),
            ("kill", 4) => FaultKind::Kill(target(parts[2])?),
            ("power", 4) => FaultKind::Power(target(parts[2])?),
            ("blackout", 3) => FaultKind::Blackout,
            ("disk-error", 4) => FaultKind::DiskError(target(parts[2])?),
            ("clock", 5) => FaultKind::Clock(
                target(parts[2])?,
                match parts[3] {
                    "fast" => true,
                    "slow" => false,
                    _ => return Err(bad()),
                },
            ),
            ("remove", 4) => FaultKind::Remove(target(parts[2])?),
            ("one-way", 5) => FaultKind::OneWay(target(parts[2])?, number(parts[3])?),
            _ => return Err(bad()),
        };
        Ok(Fault {
            pause_ms: pause,
            kind,
            hold_ms: hold,
        })
    }
}

/// A schedule's text: its faults joined by commas.
pub fn parse_schedule(text: &str) -> Result<Vec<Fault>, String> {
    text.split(',').map(str::parse).collect()
}

/// Injects `faults` one after another, each undone before the next, stopping at `until`.
/// Returns how many it injected.
pub async fn nemesis(
    cluster: Cluster,
    recorder: Recorder,
    faults: Vec<Fault>,
    until: Instant,
) -> usize {
    let nemesis = || Process::Named(NEMESIS.to_owned());
    let mut injected = 0;
    for fault in faults {
        tokio::time::sleep(Duration::from_millis(fault.pause_ms)).await;
        if Instant::now() >= until {
            break;
        }
        injected += 1;
        let resolve = |target: Target| match target {
            Target::Leader => cluster.leader().unwrap_or(cluster.ids()[0]),
            Target::Node(id) => id,
        };
        let hold = Duration::from_millis(fault.hold_ms);
        match fault.kind {
            FaultKind::Partition(target) => {
                let victim = resolve(target);
                recorder.record(
                    nemesis(),
                    OpType::Info,
                    "partition",
                    "",
                    json!({ "isolated": victim }),
                );
                for other in cluster.ids().iter().filter(|id| **id != victim) {
                    cluster.net().cut(victim, *other);
                    cluster.net().cut(*other, victim);
                }
                tokio::time::sleep(hold).await;
                cluster.net().heal();
                recorder.record(nemesis(), OpType::Info, "heal", "", Value::Null);
            }
            FaultKind::OneWay(from, to) => {
                let from = resolve(from);
                recorder.record(
                    nemesis(),
                    OpType::Info,
                    "cut-one-way",
                    "",
                    json!({ "from": from, "to": to }),
                );
                cluster.net().cut(from, to);
                tokio::time::sleep(hold).await;
                cluster.net().heal();
                recorder.record(nemesis(), OpType::Info, "heal", "", Value::Null);
            }
            FaultKind::Remove(target) => {
                let victim = resolve(target);
                let removed = cluster
                    .change_voters(Change::Remove(victim), MEMBERSHIP_WAIT)
                    .await;
                recorder.record(
                    nemesis(),
                    OpType::Info,
                    "remove",
                    "",
                    json!({ "node": victim, "ok": removed.is_ok(), "error": removed.err() }),
                );
                tokio::time::sleep(hold).await;
                let added = cluster
                    .change_voters(Change::Add(victim), MEMBERSHIP_WAIT)
                    .await;
                recorder.record(
                    nemesis(),
                    OpType::Info,
                    "add",
                    "",
                    json!({ "node": victim, "ok": added.is_ok(), "error": added.err() }),
                );
            }
            FaultKind::Kill(target) | FaultKind::Power(target) => {
                let victim = resolve(target);
                let power = matches!(fault.kind, FaultKind::Power(_));
                let f = if power { "power-cut" } else { "kill" };
                recorder.record(nemesis(), OpType::Info, f, "", json!({ "node": victim }));
                if power {
                    cluster.power_cut(victim).await;
                } else {
                    cluster.crash(victim).await;
                }
                tokio::time::sleep(hold).await;
                start(&cluster, &recorder, victim).await;
            }
            FaultKind::DiskError(target) => {
                let victim = resolve(target);
                recorder.record(
                    nemesis(),
                    OpType::Info,
                    "disk-error",
                    "",
                    json!({ "node": victim }),
                );
                cluster.fail_disk(victim);
                tokio::time::sleep(hold).await;
                let (refused, runs) = cluster.disk_failures(victim);
                if refused > 0 && runs {
                    cluster.violation(format!(
                        "node {victim} still ran {} ms after its disk refused an operation \
                         ({refused} refused)",
                        fault.hold_ms
                    ));
                }
                cluster.crash(victim).await;
                start(&cluster, &recorder, victim).await;
            }
            FaultKind::Clock(target, fast) => {
                let victim = resolve(target);
                let rate = if fast {
                    1.0 + FAULT_RATE_ERROR
                } else {
                    1.0 - FAULT_RATE_ERROR
                };
                recorder.record(
                    nemesis(),
                    OpType::Info,
                    "clock-rate",
                    "",
                    json!({ "node": victim, "rate": rate }),
                );
                cluster.set_clock_rate(victim, Some(rate));
                tokio::time::sleep(hold).await;
                cluster.set_clock_rate(victim, None);
                recorder.record(
                    nemesis(),
                    OpType::Info,
                    "clock-reset",
                    "",
                    json!({ "node": victim }),
                );
            }
            FaultKind::Blackout => {
                recorder.record(nemesis(), OpType::Info, "blackout", "", Value::Null);
                for id in cluster.ids().to_vec() {
                    cluster.power_cut(id).await;
                }
                tokio::time::sleep(hold).await;
                for id in cluster.ids().to_vec() {
                    start(&cluster, &recorder, id).await;
                }
            }
        }
    }
    injected
}

/// Starts node `id` again and records whether it could.
pub async fn start(cluster: &Cluster, recorder: &Recorder, id: u64) {
    let started = cluster.start(id).await;
    recorder.record(
        Process::Named(NEMESIS.to_owned()),
        OpType::Info,
        "start",
        "",
        json!({ "node": id, "ok": started.is_ok(), "error": started.err().map(|error| format!("{error:#}")) }),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_reads_back_from_its_text_and_bad_text_is_refused() {
        let faults = schedule(5, &[1, 2, 3], Duration::from_secs(20));
        let text: Vec<String> = faults.iter().map(Fault::to_string).collect();
        assert_eq!(parse_schedule(&text.join(",")), Ok(faults.clone()));
        assert!(faults.len() > 5);
        for fault in &faults {
            assert_eq!(fault.to_string().parse::<Fault>(), Ok(*fault));
        }
        for bad in [
            "",
            "1:kill:leader",
            "x:kill:leader:3",
            "1:crash:2:3",
            "1:one-way:2:3",
            "1:blackout:2:3",
            "1:power:3",
            "1:clock:2:late:3",
        ] {
            let refused = bad.parse::<Fault>().expect_err(bad);
            assert!(refused.contains("PAUSE:KIND[:TARGET"), "{refused}");
        }
    }
}
