//! The `fenced-kv` workload: registers in Baton's fenced key-value store. A writer acquires a
//! lease on the register's lease path and writes unique values with its fence and session;
//! readers read linearizably from the node they are bound to. Unknown writes are sometimes
//! retried with the same idempotency key on another node. Each register takes a bounded number
//! of operations, then the slot moves to a fresh key, so the per-key linearizability search
//! stays small. Nearly half the fenced writes are transactions (`POST /v1/txn`: compare the
//! fence, then put); one whose compare failed is recorded as a failed write, which it surely
//! is. Some of them put one value under the register key; the others are *pair writes*: they
//! put the same value under the register key and under its twin (`t{slot}-{generation}`, a
//! key only pair writes write), recorded as one write of the register naming its `twin`, with
//! both revisions when answered. Reads sometimes read a register and then its twin, or the twin
//! and then the register, one after the other, so that a transaction seen half applied would
//! show (the `txn-atomic` checker).
//!
//! The last worker (when there are two or more) never retries and sends no Idempotency-Key: its
//! answers are taken at face value, so a write it was told is `NO_LEADER` ("surely not
//! applied") must never become visible. Retrying workers would hide such a lie behind their
//! retry's replay. Half its time it writes, without a fence, to registers of its own (`uN-G`):
//! those writes need no lease, so they keep arriving while a leader is being elected. Every
//! written value is unique (worker id and a counter), so a value seen later names its write. What must never live here: the checks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use reqwest::Method;
use serde_json::{json, Value};

use super::lease::answer_digest;
use super::{home_node, idempotency_key, other_node, pause_for, requests, Context, Mode, Worker};
use crate::http::Outcome;

/// Registers written at once.
const SLOTS: usize = 3;
/// Operations one register takes before its slot moves to a fresh key.
const OPS_PER_KEY_MAX: u64 = 120;
/// Lease TTL of writers.
const WRITER_TTL_MS: u64 = 1_500;
/// Per-request timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(1_500);

/// The register key of slot `slot` in generation `generation`.
pub fn register_key(slot: usize, generation: u64) -> String {
    format!("r{slot}-{generation}")
}

/// The twin of the register of slot `slot` in generation `generation`: written only by pair
/// writes, with the register, in one transaction.
pub fn twin_key(slot: usize, generation: u64) -> String {
    format!("t{slot}-{generation}")
}

/// Runs `concurrency` workers until the deadline.
pub async fn run(ctx: Context, concurrency: usize) {
    let counters: Arc<Vec<AtomicU64>> = Arc::new((0..SLOTS).map(|_| AtomicU64::new(0)).collect());
    let mut tasks = vec![tokio::spawn(super::long_leases::run(ctx.clone()))];
    for worker in 0..concurrency {
        let ctx = ctx.clone();
        let counters = counters.clone();
        let retries = concurrency < 2 || worker + 1 < concurrency;
        tasks.push(tokio::spawn(async move {
            worker_loop(ctx, worker, counters, retries).await
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
}

/// Every key the workers may have touched (registers, twins, unfenced registers), sorted.
pub fn keys_touched(history: &[crate::history::Op]) -> Vec<String> {
    let mut keys: Vec<String> = history
        .iter()
        .filter(|op| op.f == "write" || op.f == "read")
        .filter(|op| op.is_client())
        .flat_map(|op| op.written_keys())
        .map(str::to_owned)
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// The keys to read after healing, in order: every key touched, sorted (so each register is
/// read before its twin), then each register that a pair write named again (so after its
/// twin): whichever of a pair's two keys a final read sees the pair on, the other key is also
/// read after it.
pub fn final_read_keys(history: &[crate::history::Op]) -> Vec<String> {
    let mut keys = keys_touched(history);
    let mut paired: Vec<String> = history
        .iter()
        .filter(|op| op.is_client() && op.f == "write" && op.value["twin"].is_string())
        .map(|op| op.key_str().to_owned())
        .collect();
    paired.sort();
    paired.dedup();
    keys.extend(paired);
    keys
}

/// One worker. With `retries` false it sends no Idempotency-Key and never retries.
async fn worker_loop(ctx: Context, worker_id: usize, counters: Arc<Vec<AtomicU64>>, retries: bool) {
    let mut rng = ctx.rng(worker_id);
    let home = home_node(&ctx, worker_id);
    let mut worker = Worker::new(&ctx, worker_id, home, REQUEST_TIMEOUT);
    let mut written = 0u64;
    let mut unfenced_ops = 0u64;
    while !ctx.done() {
        if !retries && rng.random_bool(0.5) {
            // Unfenced writes need no lease, so they keep arriving through elections and
            // partitions, when NO_LEADER answers are given.
            let key = format!("u{worker_id}-{}", unfenced_ops / OPS_PER_KEY_MAX);
            for _ in 0..rng.random_range(1..5) {
                if ctx.done() {
                    break;
                }
                unfenced_ops += 1;
                if rng.random_bool(0.3) {
                    read(&mut worker, &key, Value::Null).await;
                } else {
                    written += 1;
                    let value = (worker_id as u64) * 1_000_000_000 + written;
                    put_unfenced(&mut worker, &key, value).await;
                }
                pause_for(&ctx, Duration::from_millis(rng.random_range(5..40))).await;
            }
            continue;
        }
        let slot = rng.random_range(0..SLOTS);
        let generation = counters[slot].fetch_add(1, Ordering::Relaxed) / OPS_PER_KEY_MAX;
        let key = register_key(slot, generation);
        let twin = twin_key(slot, generation);
        worker.rebind(home);
        if rng.random_bool(0.4) {
            read_slot(&mut worker, &key, &twin, &mut rng).await;
            pause_for(&ctx, Duration::from_millis(rng.random_range(10..60))).await;
            continue;
        }
        let resource = format!("kvlock/{key}");
        // Drawn even when unused, so every worker's random sequence keeps its shape.
        let idem = idempotency_key(&mut rng);
        let idem = retries.then_some(idem);
        let body = requests::acquire(
            &resource,
            &format!("kv{worker_id}"),
            WRITER_TTL_MS,
            Mode::Exclusive,
        );
        let outcome = worker
            .op(
                "acquire",
                &resource,
                json!({"mode": "exclusive", "idempotency_key": idem}),
                Method::POST,
                "/v1/leases",
                Some(&body),
                idem.as_deref(),
                |grant, replayed| {
                    json!({"fence": grant["fence"], "mode": grant["mode"],
                           "expires_in_ms": grant["expires_in_ms"], "replayed": replayed,
                           "digest": answer_digest(grant)})
                },
            )
            .await;
        let Outcome::Ok { body: grant, .. } = outcome else {
            pause_for(&ctx, Duration::from_millis(rng.random_range(20..100))).await;
            continue;
        };
        let fence = grant["fence"].as_u64().unwrap_or(0);
        let session = grant["session_id"].as_str().unwrap_or("").to_owned();
        for _ in 0..rng.random_range(1..5) {
            if ctx.done() {
                break;
            }
            if rng.random_bool(0.3) {
                read_slot(&mut worker, &key, &twin, &mut rng).await;
                continue;
            }
            written += 1;
            let value = (worker_id as u64) * 1_000_000_000 + written;
            // Nearly half the fenced writes go as transactions (compare the fence, then put):
            // a third of those put the value under the register, the same write through
            // `POST /v1/txn`; the others are pair writes, the register and its twin at once.
            let write = match rng.random_range(0..100) {
                0..15 => Write::Txn(requests::txn_put(
                    &key,
                    Value::from(value),
                    &resource,
                    fence,
                    &session,
                )),
                15..45 => Write::Pair {
                    twin: twin.clone(),
                    body: requests::txn_put_pair(
                        &key,
                        &twin,
                        Value::from(value),
                        &resource,
                        fence,
                        &session,
                    ),
                },
                _ => Write::Put(requests::kv_put(
                    Value::from(value),
                    Some((&resource, fence, &session)),
                )),
            };
            let idem = idempotency_key(&mut rng);
            let idem = retries.then_some(idem);
            let mut outcome = put(
                &mut worker,
                &key,
                value,
                fence,
                &resource,
                &write,
                idem.as_deref(),
            )
            .await;
            if retries
                && matches!(outcome, Outcome::Info { .. })
                && rng.random_bool(0.5)
                && !ctx.done()
            {
                // Give a failover time to finish before the retry.
                pause_for(&ctx, Duration::from_millis(rng.random_range(300..800))).await;
                let node = other_node(&ctx, worker.client.node, &mut rng);
                worker.rebind(node);
                outcome = put(
                    &mut worker,
                    &key,
                    value,
                    fence,
                    &resource,
                    &write,
                    idem.as_deref(),
                )
                .await;
                worker.rebind(home);
            }
            let stale = match &outcome {
                Outcome::Fail { code, .. } => code == "STALE_FENCE",
                Outcome::Ok { body, .. } => body["succeeded"] == Value::Bool(false),
                Outcome::Info { .. } => false,
            };
            if stale {
                break;
            }
            pause_for(&ctx, Duration::from_millis(rng.random_range(5..40))).await;
        }
        if rng.random_bool(0.8) {
            let path = format!("/v1/sessions/{session}/release");
            let idem = idempotency_key(&mut rng);
            let idem = retries.then_some(idem);
            worker
                .op(
                    "release",
                    &resource,
                    json!({"fence": fence, "idempotency_key": idem}),
                    Method::POST,
                    &path,
                    Some(&requests::release(&resource)),
                    idem.as_deref(),
                    |_, _| Value::Null,
                )
                .await;
        }
    }
}

/// Reads the register alone, or (half the time) the register and its twin one after the
/// other, in either order. The second read is sent after the first one's answer, so that a
/// pair write seen by the first read must be seen whole by the second.
async fn read_slot(worker: &mut Worker, key: &str, twin: &str, rng: &mut impl Rng) {
    if rng.random_bool(0.5) {
        read(worker, key, Value::Null).await;
        return;
    }
    let (first, second) = if rng.random_bool(0.5) {
        (key, twin)
    } else {
        (twin, key)
    };
    read(worker, first, json!({"pair_read": 1, "then": second})).await;
    read(worker, second, json!({"pair_read": 2, "after": first})).await;
}

async fn read(worker: &mut Worker, key: &str, invoke_value: Value) -> Outcome {
    let path = format!("/v1/kv/{key}");
    let outcome = worker
        .op(
            "read",
            key,
            invoke_value,
            Method::GET,
            &path,
            None,
            None,
            |body, _| json!({"value": body["value"], "revision": body["revision"]}),
        )
        .await;
    outcome
}

/// A write without fence or Idempotency-Key, sent once.
async fn put_unfenced(worker: &mut Worker, key: &str, value: u64) -> Outcome {
    let path = format!("/v1/kv/{key}");
    worker
        .op(
            "write",
            key,
            json!({"value": value, "fence": null, "idempotency_key": null}),
            Method::PUT,
            &path,
            Some(&requests::kv_put(Value::from(value), None)),
            None,
            |answer, replayed| {
                json!({"value": value, "revision": answer["revision"], "replayed": replayed,
                       "digest": answer_digest(answer)})
            },
        )
        .await
}

/// A fenced write's request: a `PUT` with the fence, or a transaction comparing it and putting
/// the value under the register, or under the register and its twin.
enum Write {
    Put(Value),
    Txn(Value),
    Pair { twin: String, body: Value },
}

#[allow(clippy::too_many_arguments)]
async fn put(
    worker: &mut Worker,
    key: &str,
    value: u64,
    fence: u64,
    resource: &str,
    write: &Write,
    idem: Option<&str>,
) -> Outcome {
    let (method, path, body, via) = match write {
        Write::Put(body) => (Method::PUT, format!("/v1/kv/{key}"), body, "put"),
        Write::Txn(body) => (Method::POST, "/v1/txn".to_owned(), body, "txn"),
        Write::Pair { body, .. } => (Method::POST, "/v1/txn".to_owned(), body, "txn-pair"),
    };
    let mut invoke = json!({"value": value, "fence": fence, "resource": resource,
                            "idempotency_key": idem, "via": via});
    if let Write::Pair { twin, .. } = write {
        invoke["twin"] = Value::from(twin.as_str());
    }
    let pair = matches!(write, Write::Pair { .. });
    worker
        .op(
            "write",
            key,
            invoke,
            method,
            &path,
            Some(body),
            idem,
            |answer, replayed| {
                // A transaction answers each put's revision in its result, in op order: the
                // register's, then (a pair write's) the twin's.
                let revision = match answer.get("results") {
                    Some(results) => results[0]["revision"].clone(),
                    None => answer["revision"].clone(),
                };
                let mut result = json!({"value": value, "revision": revision,
                                        "replayed": replayed, "digest": answer_digest(answer)});
                if pair {
                    result["twin_revision"] = answer["results"][1]["revision"].clone();
                }
                result
            },
        )
        .await
}
