//! The `lease` workload: workers acquire, keep alive and release leases over a small tree of
//! paths, mixing exclusive and subtree leases, each with a session of its own and a 1 s TTL.
//! While a holder's G7 validity lasts it writes to the protected resource with its fence. Some
//! holders stop renewing, so their leases expire and are handed over while contenders poll.
//! Every hold is recorded (`holds`) with its guaranteed interval in harness time, for the
//! hold-interval checker.
//!
//! The same loop serves `unfenced-lock` (see that module): there the resource does not check
//! fences and a worker may stall between its validity check and its write. What must never
//! live here: the checks.

use std::time::Duration;

use rand::Rng;
use reqwest::Method;
use serde_json::{json, Value};

use super::{
    g7_valid_until, hold_value, home_node, idempotency_key, other_node, pause_for, requests,
    Context, Mode, Worker, HOLDS, TTL_MS,
};
use crate::history::{OpType, Process};
use crate::http::Outcome;

/// The `lease` workload's tree: `(relative path, mode)` of every lease the workers take.
pub const TREE: &[(&str, Mode)] = &[
    ("", Mode::Subtree),
    ("a", Mode::Subtree),
    ("a", Mode::Exclusive),
    ("a/x", Mode::Exclusive),
    ("a/y", Mode::Exclusive),
    ("b", Mode::Exclusive),
    ("b", Mode::Subtree),
    ("b/z", Mode::Exclusive),
];
/// The `semaphore` workload's tree: mostly shared leases of a limit smaller than the number of
/// workers, so holders queue, beside exclusive and subtree leases that must exclude them.
pub const SEMAPHORE_TREE: &[(&str, Mode)] = &[
    ("a", Mode::Shared { limit: 2 }),
    ("a", Mode::Shared { limit: 2 }),
    ("a", Mode::Shared { limit: 2 }),
    ("a", Mode::Exclusive),
    ("b", Mode::Shared { limit: 3 }),
    ("b", Mode::Shared { limit: 3 }),
    ("b/z", Mode::Shared { limit: 2 }),
    ("b", Mode::Subtree),
    ("", Mode::Subtree),
];
/// Acquire attempts on one tree before the workers move to a fresh tree (bounded ops per key).
const ACQUIRES_PER_TREE_MAX: u64 = 1_500;
/// Per-request timeout: an answer later than the TTL is useless to a holder anyway.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(900);
/// A holder writes only while at least this much validity is left.
const WRITE_MARGIN: Duration = Duration::from_millis(3);
/// How long a stalled client (unfenced-lock under `pause`) stays stalled: longer than the TTL.
pub const STALL: Duration = Duration::from_millis(1_700);

/// Every path of tree number `generation`.
pub fn tree_paths(generation: u64) -> Vec<String> {
    let root = format!("t{generation}");
    ["", "a", "a/x", "a/y", "b", "b/z"]
        .iter()
        .map(|relative| join(&root, relative))
        .collect()
}

fn join(root: &str, relative: &str) -> String {
    if relative.is_empty() {
        root.to_owned()
    } else {
        format!("{root}/{relative}")
    }
}

/// Runs `concurrency` workers over `tree` until the deadline. `stalls`: workers honour client
/// pauses.
pub async fn run(
    ctx: Context,
    concurrency: usize,
    stalls: bool,
    tree: &'static [(&'static str, Mode)],
) {
    let acquires = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = vec![tokio::spawn(super::long_leases::run(ctx.clone()))];
    for worker in 0..concurrency {
        let ctx = ctx.clone();
        let acquires = acquires.clone();
        tasks.push(tokio::spawn(async move {
            worker_loop(ctx, worker, stalls, tree, acquires).await;
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
}

async fn worker_loop(
    ctx: Context,
    worker_id: usize,
    stalls: bool,
    tree: &'static [(&'static str, Mode)],
    acquires: std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    let mut rng = ctx.rng(worker_id);
    let home = home_node(&ctx, worker_id);
    let mut worker = Worker::new(&ctx, worker_id, home, REQUEST_TIMEOUT);
    let clock = ctx.clocks[worker_id].clone();
    let mut leases = 0u64;
    while !ctx.done() {
        let count = acquires.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let generation = count / ACQUIRES_PER_TREE_MAX;
        let (relative, mode) = tree[rng.random_range(0..tree.len())];
        let resource = join(&format!("t{generation}"), relative);
        let key = idempotency_key(&mut rng);
        let body = requests::acquire(&resource, &format!("w{worker_id}"), TTL_MS, mode);
        let sent_at = clock.now();
        worker.rebind(home);
        let mut outcome = acquire(&mut worker, &resource, mode, &body, &key).await;
        // An unknown acquire is retried with the same key on other nodes: at most once applied.
        let mut retries = 0;
        while matches!(outcome, Outcome::Info { .. }) && retries < 2 && !ctx.done() {
            retries += 1;
            // Give a failover time to finish before the retry.
            pause_for(&ctx, Duration::from_millis(rng.random_range(300..800))).await;
            let node = other_node(&ctx, worker.client.node, &mut rng);
            worker.rebind(node);
            outcome = acquire(&mut worker, &resource, mode, &body, &key).await;
        }
        worker.rebind(home);
        let grant = match outcome {
            Outcome::Ok { body, .. } => body,
            Outcome::Fail { code, .. } => {
                let wait = if code == "LEASE_HELD" {
                    20..80
                } else {
                    50..150
                };
                pause_for(&ctx, Duration::from_millis(rng.random_range(wait))).await;
                continue;
            }
            Outcome::Info { .. } => continue,
        };
        let ok_ns = ctx.history.now_ns();
        let fence = grant["fence"].as_u64().unwrap_or(0);
        let session = grant["session_id"].as_str().unwrap_or("").to_owned();
        let mut valid_until = g7_valid_until(sent_at, grant["expires_in_ms"].as_u64().unwrap_or(0));
        leases += 1;
        let lease_id = format!("w{worker_id}/{leases}");
        let paths = tree_paths(generation);
        let renews = rng.random_bool(0.75);
        let rounds = rng.random_range(2..8);
        let mut last_write_ns = 0u64;
        let mut released_ns: Option<u64> = None;
        let mut last_keepalive = clock.now();
        for round in 0.. {
            if ctx.done() {
                break;
            }
            // The critical section: check validity, (maybe stall), write.
            if clock.now() + WRITE_MARGIN >= valid_until {
                break;
            }
            if stalls && ctx.client_pause.take() {
                ctx.client_pause
                    .stalls
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(STALL).await;
            }
            // Shared holders hold together: only an exclusive or subtree holder writes to the
            // fence-checking resource, which accepts one writer's tokens at a time.
            if mode.limit().is_none()
                && ctx
                    .resource
                    .write(&lease_id, &resource, mode, fence, &paths)
            {
                last_write_ns = ctx.history.now_ns();
            }
            pause_for(&ctx, Duration::from_millis(rng.random_range(40..140))).await;
            if renews && round + 1 >= rounds {
                released_ns = Some(ctx.history.now_ns());
                let path = format!("/v1/sessions/{session}/release");
                worker
                    .op(
                        "release",
                        &resource,
                        json!({"lease": lease_id, "fence": fence}),
                        Method::POST,
                        &path,
                        Some(&requests::release(&resource)),
                        Some(&idempotency_key(&mut rng)),
                        |_, _| Value::Null,
                    )
                    .await;
                break;
            }
            if renews && clock.now().saturating_sub(last_keepalive) >= Duration::from_millis(250) {
                let keepalive_sent = clock.now();
                last_keepalive = keepalive_sent;
                let path = format!("/v1/sessions/{session}/keepalive");
                let outcome = worker
                    .op(
                        "keepalive",
                        &resource,
                        json!({"lease": lease_id}),
                        Method::POST,
                        &path,
                        None,
                        Some(&idempotency_key(&mut rng)),
                        |body, _| json!({"expires_in_ms": body["expires_in_ms"]}),
                    )
                    .await;
                match outcome {
                    Outcome::Ok { body, .. } => {
                        let renewed = g7_valid_until(
                            keepalive_sent,
                            body["expires_in_ms"].as_u64().unwrap_or(0),
                        );
                        valid_until = valid_until.max(renewed);
                    }
                    Outcome::Fail { code, .. } if code == "LEASE_LOST" => break,
                    _ => {}
                }
            }
        }
        // The interval this holder was guaranteed (G7), cut short by its own release, and
        // stretched by any write it made later (a stalled write acts as holder too).
        let g7_end_ns = ctx.history.ns_of(clock.instant_of(valid_until));
        let end_ns = released_ns
            .map_or(g7_end_ns, |sent| sent.min(g7_end_ns))
            .max(last_write_ns);
        record_hold(
            &ctx, &lease_id, &resource, mode, fence, ok_ns, end_ns, g7_end_ns,
        );
        if !renews {
            // Abandoned: the lease expires on its own while others poll for it.
            pause_for(&ctx, Duration::from_millis(rng.random_range(0..200))).await;
        }
    }
}

async fn acquire(
    worker: &mut Worker,
    resource: &str,
    mode: Mode,
    body: &Value,
    key: &str,
) -> Outcome {
    worker
        .op(
            "acquire",
            resource,
            json!({"mode": mode.as_str(), "idempotency_key": key, "holder": body["holder"]}),
            Method::POST,
            "/v1/leases",
            Some(body),
            Some(key),
            |grant, replayed| {
                json!({"fence": grant["fence"], "mode": grant["mode"],
                       "expires_in_ms": grant["expires_in_ms"], "replayed": replayed,
                       "digest": answer_digest(grant)})
            },
        )
        .await
}

/// A fingerprint of an answer's body (session ids never enter the history in clear).
pub fn answer_digest(body: &Value) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    body.to_string().hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// Records a hold (process `holds`) for the `holds` and `shared-limits` checkers: from
/// `start_ns`, when the grant came back, to `end_ns`; `g7_end_ns` is where G7 alone ends it.
#[allow(clippy::too_many_arguments)]
pub(super) fn record_hold(
    ctx: &Context,
    lease_id: &str,
    resource: &str,
    mode: Mode,
    fence: u64,
    start_ns: u64,
    end_ns: u64,
    g7_end_ns: u64,
) {
    ctx.history.add(
        Process::Named(HOLDS.to_owned()),
        OpType::Info,
        "hold",
        Value::from(resource),
        hold_value(lease_id, mode, fence, start_ns, end_ns, g7_end_ns),
        None,
        None,
        None,
    );
}
