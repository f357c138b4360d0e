//! The `fenced-kv` workload: registers in Baton's fenced key-value store. A writer acquires a
//! lease on the register's lease path and writes unique values with its fence and session;
//! readers read linearizably from the node they are bound to. Unknown writes are sometimes
//! retried with the same idempotency key on another node. Each register takes a bounded number
//! of operations, then the slot moves to a fresh key, so the per-key linearizability search
//! stays small. A third of the fenced writes are transactions (`POST /v1/txn`: compare the
//! fence, put the value); one whose compare failed is recorded as a failed write, which it
//! surely is.
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

/// Every register key the workers may have touched, for the final reads.
pub fn keys_touched(history: &[crate::history::Op]) -> Vec<String> {
    let mut keys: Vec<String> = history
        .iter()
        .filter(|op| op.f == "write" || op.f == "read")
        .filter(|op| op.is_client())
        .map(|op| op.key_str().to_owned())
        .collect();
    keys.sort();
    keys.dedup();
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
                    read(&mut worker, &key).await;
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
        worker.rebind(home);
        if rng.random_bool(0.4) {
            read(&mut worker, &key).await;
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
                read(&mut worker, &key).await;
                continue;
            }
            written += 1;
            let value = (worker_id as u64) * 1_000_000_000 + written;
            // A third of the fenced writes go as transactions (compare the fence, put): the
            // same write, through `POST /v1/txn`.
            let write = if rng.random_bool(0.33) {
                Write::Txn(requests::txn_put(
                    &key,
                    Value::from(value),
                    &resource,
                    fence,
                    &session,
                ))
            } else {
                Write::Put(requests::kv_put(
                    Value::from(value),
                    Some((&resource, fence, &session)),
                ))
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

async fn read(worker: &mut Worker, key: &str) -> Outcome {
    let path = format!("/v1/kv/{key}");
    let outcome = worker
        .op(
            "read",
            key,
            Value::Null,
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

/// A fenced write's request: a `PUT` with the fence, or a transaction comparing it.
enum Write {
    Put(Value),
    Txn(Value),
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
    };
    worker
        .op(
            "write",
            key,
            json!({"value": value, "fence": fence, "resource": resource, "idempotency_key": idem,
                   "via": via}),
            method,
            &path,
            Some(body),
            idem,
            |answer, replayed| {
                // A transaction's put answers its revision in its one result.
                let revision = match answer.get("results") {
                    Some(results) => results[0]["revision"].clone(),
                    None => answer["revision"].clone(),
                };
                json!({"value": value, "revision": revision, "replayed": replayed,
                       "digest": answer_digest(answer)})
            },
        )
        .await
}
