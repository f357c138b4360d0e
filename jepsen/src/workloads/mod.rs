//! The workloads: seeded clients that drive a cluster and record every operation.
//!
//! What lives here, shared by all workloads: the run context ([`Context`]), the recording
//! client ([`Worker`]: `invoke`, then exactly one of `ok` / `fail` / `info`, and a new process
//! id after `info`), the guard clock the clock nemesis skews ([`GuardClock`]), the G7 validity
//! rule ([`g7_valid_until`]), client pauses inside critical sections ([`ClientPause`]) and the
//! harness-owned protected resource ([`ProtectedResource`]). Each workload lives in its own
//! module. What must never live here: judging the history (that is `checkers/`).

pub mod fenced_kv;
pub mod lease;
pub mod line;
pub mod long_leases;
pub mod queue;
pub mod requests;
pub mod unfenced_lock;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_client::CLOCK_RATE_ERROR_DEFAULT;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::history::{History, OpType, Process};
use crate::http::{NodeClient, Outcome};

/// The error a history records for a transaction whose compares failed (an answer of 200).
pub const COMPARE_FAILED: &str = "COMPARE_FAILED";

/// Lease and session TTL of the lease workloads: short, so leases expire and are handed over.
pub const TTL_MS: u64 = 1_000;

/// Which workload runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// Leases over a small tree, holders writing to a fence-checking resource.
    Lease,
    /// Fenced key-value writes and linearizable reads.
    FencedKv,
    /// Leases guarding a resource that does not check fences (known unsafe).
    UnfencedLock,
    /// Enqueue, claim, complete.
    Queue,
    /// Shared leases (semaphores) beside exclusive and subtree ones on the same tree.
    Semaphore,
    /// Acquires that wait in line (`wait_ms`), served first come, first served.
    Line,
}

impl Workload {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Lease => "lease",
            Workload::FencedKv => "fenced-kv",
            Workload::UnfencedLock => "unfenced-lock",
            Workload::Queue => "queue",
            Workload::Semaphore => "semaphore",
            Workload::Line => "line",
        }
    }
}

/// What every worker of a run shares.
#[derive(Debug, Clone)]
pub struct Context {
    /// The recorder.
    pub history: History,
    /// Node id → API address.
    pub nodes: Vec<(u64, std::net::SocketAddr)>,
    /// Shared HTTP connection pool (no proxy; a secured cluster's CA and token).
    pub http: reqwest::Client,
    /// `http`, or `https` for a secured cluster.
    pub scheme: &'static str,
    /// When workers stop starting operations.
    pub deadline: Instant,
    /// The run's seed.
    pub seed: u64,
    /// One guard clock per worker.
    pub clocks: Vec<Arc<GuardClock>>,
    /// Stall requests for clients inside their critical section.
    pub client_pause: Arc<ClientPause>,
    /// The protected resource of the lease workloads.
    pub resource: Arc<ProtectedResource>,
}

impl Context {
    /// A client of node `id` with a per-request timeout.
    pub fn client(&self, id: u64, timeout: Duration) -> NodeClient {
        let address = self
            .nodes
            .iter()
            .find(|(node, _)| *node == id)
            .map(|(_, address)| *address)
            .unwrap_or(self.nodes[0].1);
        NodeClient::new(self.http.clone(), self.scheme, id, address, timeout)
    }

    /// The seeded generator of worker `worker`.
    pub fn rng(&self, worker: usize) -> StdRng {
        StdRng::seed_from_u64(self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ worker as u64)
    }

    /// True once the run's time is up.
    pub fn done(&self) -> bool {
        Instant::now() >= self.deadline
    }
}

/// A recording client: one worker, bound to one node, with its current process id.
#[derive(Debug)]
pub struct Worker {
    /// The current process id.
    pub process: u64,
    /// The client of its node.
    pub client: NodeClient,
    history: History,
    timeout: Duration,
    ctx: Context,
}

impl Worker {
    /// Worker `id`, bound to node `node`.
    pub fn new(ctx: &Context, id: usize, node: u64, timeout: Duration) -> Worker {
        let _ = id;
        Worker {
            process: ctx.history.new_process(),
            client: ctx.client(node, timeout),
            history: ctx.history.clone(),
            timeout,
            ctx: ctx.clone(),
        }
    }

    /// Rebinds the worker to another node (used to retry an unknown mutation elsewhere).
    pub fn rebind(&mut self, node: u64) {
        self.client = self.ctx.client(node, self.timeout);
    }

    /// Records the invocation, performs the call, records its completion with the value
    /// `result` computes from an ok answer, and takes a new process id after `info`.
    #[allow(clippy::too_many_arguments)]
    pub async fn op(
        &mut self,
        f: &str,
        key: &str,
        invoke_value: Value,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        idempotency_key: Option<&str>,
        result: impl FnOnce(&Value, bool) -> Value,
    ) -> Outcome {
        let process = Process::Client(self.process);
        let node = Some(self.client.node);
        self.history.add(
            process.clone(),
            OpType::Invoke,
            f,
            Value::from(key),
            invoke_value,
            None,
            None,
            node,
        );
        let outcome = self.client.call(method, path, body, idempotency_key).await;
        match &outcome {
            // A transaction whose compares failed ran none of its success ops: the write it
            // carried surely did not happen.
            Outcome::Ok {
                body,
                cluster_time_ms,
                ..
            } if body["succeeded"] == Value::Bool(false) => {
                self.history.add(
                    process,
                    OpType::Fail,
                    f,
                    Value::from(key),
                    Value::Null,
                    Some(COMPARE_FAILED.to_owned()),
                    *cluster_time_ms,
                    node,
                );
            }
            Outcome::Ok {
                body,
                cluster_time_ms,
                replayed,
                ..
            } => {
                self.history.add(
                    process,
                    OpType::Ok,
                    f,
                    Value::from(key),
                    result(body, *replayed),
                    None,
                    *cluster_time_ms,
                    node,
                );
            }
            // An empty register reads as null: a 404 on a read is an ok read.
            Outcome::Fail {
                code,
                cluster_time_ms,
                ..
            } if f == "read" && code == "NOT_FOUND" => {
                self.history.add(
                    process,
                    OpType::Ok,
                    f,
                    Value::from(key),
                    json!({"value": null}),
                    None,
                    *cluster_time_ms,
                    node,
                );
            }
            Outcome::Fail {
                code,
                cluster_time_ms,
                held_by: body,
            } => {
                self.history.add(
                    process,
                    OpType::Fail,
                    f,
                    Value::from(key),
                    if body.is_null() {
                        Value::Null
                    } else {
                        json!({"held_by": body})
                    },
                    Some(code.clone()),
                    *cluster_time_ms,
                    node,
                );
            }
            Outcome::Info {
                code,
                cluster_time_ms,
            } => {
                self.history.add(
                    process,
                    OpType::Info,
                    f,
                    Value::from(key),
                    Value::Null,
                    Some(code.clone()),
                    *cluster_time_ms,
                    node,
                );
                self.process = self.history.new_process();
            }
        }
        outcome
    }
}

/// The G7 rule, computed by the client crate's own arithmetic: a holder that sent the first
/// attempt of a successful acquire or keepalive at guard-clock reading `sent_at` and was told
/// `expires_in_ms` may act until the returned reading.
pub fn g7_valid_until(sent_at: Duration, expires_in_ms: u64) -> Duration {
    baton_client::clock::valid_until(sent_at, expires_in_ms, CLOCK_RATE_ERROR_DEFAULT)
}

/// A worker's monotonic guard clock, whose rate the clock nemesis may change while it runs.
/// Readings are piecewise linear in real time, so they can be mapped back to harness time.
#[derive(Debug)]
pub struct GuardClock {
    state: Mutex<(Instant, Duration, f64)>,
}

impl Default for GuardClock {
    fn default() -> GuardClock {
        GuardClock::new()
    }
}

impl GuardClock {
    /// A clock at real speed reading zero now.
    pub fn new() -> GuardClock {
        GuardClock {
            state: Mutex::new((Instant::now(), Duration::ZERO, 1.0)),
        }
    }

    /// The reading now.
    pub fn now(&self) -> Duration {
        let (base, reading, rate) = *self.lock();
        reading + base.elapsed().mul_f64(rate)
    }

    /// Changes the rate from now on.
    pub fn set_rate(&self, rate: f64) {
        let mut state = self.lock();
        let now = Instant::now();
        let reading = state.1 + now.saturating_duration_since(state.0).mul_f64(state.2);
        *state = (now, reading, rate);
    }

    /// The real instant at which the clock will read `reading` at the current rate.
    pub fn instant_of(&self, reading: Duration) -> Instant {
        let (base, base_reading, rate) = *self.lock();
        if reading >= base_reading {
            base + (reading - base_reading).div_f64(rate)
        } else {
            base.checked_sub((base_reading - reading).div_f64(rate))
                .unwrap_or(base)
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Instant, Duration, f64)> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl baton_client::Clock for GuardClock {
    fn now(&self) -> Duration {
        GuardClock::now(self)
    }
}

/// Requests, from the pause nemesis, that clients inside their critical section stall (the
/// classic GC pause between checking a lease and using it).
#[derive(Debug, Default)]
pub struct ClientPause {
    requests: AtomicU32,
    /// How many stalls happened.
    pub stalls: AtomicU64,
}

impl ClientPause {
    /// Asks the next `count` clients that enter a critical section to stall.
    pub fn request(&self, count: u32) {
        self.requests.fetch_add(count, Ordering::SeqCst);
    }

    /// Cancels the requests not yet taken.
    pub fn clear(&self) {
        self.requests.store(0, Ordering::SeqCst);
    }

    /// Takes one request, if any.
    pub fn take(&self) -> bool {
        self.requests
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |count| {
                count.checked_sub(1)
            })
            .is_ok()
    }
}

/// Lease mode on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// That path.
    Exclusive,
    /// That path and everything below.
    Subtree,
    /// That path, by up to `limit` holders at once.
    Shared { limit: u32 },
}

impl Mode {
    /// `exclusive`, `subtree` or `shared`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Subtree => "subtree",
            Mode::Shared { .. } => "shared",
        }
    }

    /// A shared lease's limit.
    pub fn limit(self) -> Option<u32> {
        match self {
            Mode::Shared { limit } => Some(limit),
            Mode::Exclusive | Mode::Subtree => None,
        }
    }

    /// Parses the wire name (and a shared lease's limit, recorded beside it).
    pub fn parse(text: &str, limit: Option<u64>) -> Mode {
        match text {
            "subtree" => Mode::Subtree,
            "shared" => Mode::Shared {
                limit: limit
                    .and_then(|limit| u32::try_from(limit).ok())
                    .unwrap_or(1),
            },
            _ => Mode::Exclusive,
        }
    }
}

/// True when a lease `(resource, mode)` covers `path` (docs/guarantees.md G2).
pub fn covers(resource: &str, mode: Mode, path: &str) -> bool {
    match mode {
        Mode::Exclusive | Mode::Shared { .. } => resource == path,
        Mode::Subtree => {
            path == resource
                || (path.len() > resource.len()
                    && path.starts_with(resource)
                    && path.as_bytes()[resource.len()] == b'/')
        }
    }
}

/// True when two leases conflict (docs/guarantees.md G2): some path is covered by both.
/// Shared holders of one path do not conflict with each other: how many may hold it at once is
/// `checkers::holds::check_limits`' business.
pub fn overlapping(a: (&str, Mode), b: (&str, Mode)) -> bool {
    match (a.1, b.1) {
        (Mode::Shared { .. }, Mode::Shared { .. }) => false,
        (Mode::Subtree, Mode::Subtree) => {
            covers(a.0, Mode::Subtree, b.0) || covers(b.0, Mode::Subtree, a.0)
        }
        (Mode::Subtree, _) => covers(a.0, Mode::Subtree, b.0),
        (_, Mode::Subtree) => covers(b.0, Mode::Subtree, a.0),
        _ => a.0 == b.0,
    }
}

/// The harness-owned resource the lease holders write to. With `checks_fences` it accepts a
/// write only if its token is at least the highest it has accepted on every path it covers
/// (a SQL row guard); without, it accepts everything (the unsafe design). Every write is
/// recorded in the history under the resource's lock, so the history's order is the order in
/// which the resource saw them.
#[derive(Debug)]
pub struct ProtectedResource {
    checks_fences: bool,
    highest: Mutex<BTreeMap<String, u64>>,
    history: History,
}

/// The process name of the protected resource's accepted and refused writes.
pub const RESOURCE: &str = "resource";
/// The process name of the hold intervals holders claim.
pub const HOLDS: &str = "holds";

/// The value of a `hold` event (process [`HOLDS`]), as the `holds` and `shared-limits`
/// checkers read it: lease `lease_id` held `mode` with `fence` from `start_ns`, when the grant
/// came back, to `end_ns`; `g7_end_ns` is where G7 alone ends it.
pub fn hold_value(
    lease_id: &str,
    mode: Mode,
    fence: u64,
    start_ns: u64,
    end_ns: u64,
    g7_end_ns: u64,
) -> Value {
    json!({"lease": lease_id, "mode": mode.as_str(), "limit": mode.limit(), "fence": fence,
           "start_ns": start_ns, "end_ns": end_ns, "g7_end_ns": g7_end_ns})
}

impl ProtectedResource {
    /// A resource recording into `history`.
    pub fn new(checks_fences: bool, history: History) -> ProtectedResource {
        ProtectedResource {
            checks_fences,
            highest: Mutex::new(BTreeMap::new()),
            history,
        }
    }

    /// A write by lease `lease_id` holding `(resource, mode)` with `fence`, covering `paths`.
    /// Returns whether it was accepted.
    pub fn write(
        &self,
        lease_id: &str,
        resource: &str,
        mode: Mode,
        fence: u64,
        paths: &[String],
    ) -> bool {
        let mut highest = self
            .highest
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let covered: Vec<&String> = paths
            .iter()
            .filter(|path| covers(resource, mode, path))
            .collect();
        let accepted = !self.checks_fences
            || covered
                .iter()
                .all(|path| highest.get(*path).is_none_or(|&top| fence >= top));
        if accepted {
            for path in &covered {
                let top = highest.entry((*path).clone()).or_insert(0);
                *top = (*top).max(fence);
            }
        }
        self.history.add(
            Process::Named(RESOURCE.to_owned()),
            if accepted { OpType::Ok } else { OpType::Fail },
            "write",
            Value::from(resource),
            json!({"lease": lease_id, "mode": mode.as_str(), "fence": fence, "paths": covered}),
            (!accepted).then(|| "STALE_FENCE".to_owned()),
            None,
            None,
        );
        accepted
    }
}

/// A fresh idempotency key (UUIDv4-shaped), from the worker's seeded generator.
pub fn idempotency_key(rng: &mut StdRng) -> String {
    baton_client::api::uuid_v4(rng.random())
}

/// The node a worker is bound to: workers are spread over the nodes.
pub fn home_node(ctx: &Context, worker: usize) -> u64 {
    ctx.nodes[worker % ctx.nodes.len()].0
}

/// Another node than `node`, chosen by `rng`.
pub fn other_node(ctx: &Context, node: u64, rng: &mut StdRng) -> u64 {
    let others: Vec<u64> = ctx
        .nodes
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| *id != node)
        .collect();
    others[rng.random_range(0..others.len())]
}

/// Sleeps, but not past the deadline.
pub async fn pause_for(ctx: &Context, duration: Duration) {
    let until = (Instant::now() + duration).min(ctx.deadline);
    tokio::time::sleep_until(until.into()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coverage_follows_g2() {
        let cases = [
            (("t/a", Mode::Exclusive), ("t/a", Mode::Exclusive), true),
            (("t/a", Mode::Exclusive), ("t/a/x", Mode::Exclusive), false),
            (("t", Mode::Subtree), ("t/a/x", Mode::Exclusive), true),
            (("t/a", Mode::Subtree), ("t", Mode::Exclusive), false),
            (("t/a", Mode::Subtree), ("t", Mode::Subtree), true),
            (("t/a", Mode::Subtree), ("t/ab", Mode::Exclusive), false),
        ];
        for (a, b, expected) in cases {
            assert_eq!(overlapping(a, b), expected, "{a:?} {b:?}");
        }
    }

    #[test]
    fn a_fenced_resource_refuses_lower_tokens_on_covered_paths() {
        let history = History::new();
        let paths: Vec<String> = vec!["t".into(), "t/a".into()];
        let resource = ProtectedResource::new(true, history.clone());
        assert!(resource.write("l1", "t/a", Mode::Exclusive, 5, &paths));
        assert!(!resource.write("l2", "t", Mode::Subtree, 4, &paths));
        assert!(resource.write("l3", "t", Mode::Subtree, 6, &paths));
        let unfenced = ProtectedResource::new(false, history);
        assert!(unfenced.write("l1", "t/a", Mode::Exclusive, 5, &paths));
        assert!(unfenced.write("l2", "t/a", Mode::Exclusive, 4, &paths));
    }
}
