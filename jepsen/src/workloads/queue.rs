//! The `queue` workload: workers enqueue tasks with ids of their own, claim the best ready
//! task (a claim is a lease with a fence and a 1 s TTL), and complete it with that fence; some
//! claimers walk away, so their claim lapses and the task is claimed again. After healing the
//! harness lists every task of every queue it used. What must never live here: the checks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use reqwest::Method;
use serde_json::{json, Value};

use super::lease::answer_digest;
use super::{home_node, idempotency_key, other_node, pause_for, requests, Context, Worker, TTL_MS};
use crate::http::Outcome;

/// Operations one queue takes before the workers move to a fresh queue.
const OPS_PER_QUEUE_MAX: u64 = 1_500;
/// Per-request timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(1_500);

/// Runs `concurrency` workers until the deadline.
pub async fn run(ctx: Context, concurrency: usize) {
    let operations = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for worker in 0..concurrency {
        let ctx = ctx.clone();
        let operations = operations.clone();
        tasks.push(tokio::spawn(async move {
            worker_loop(ctx, worker, operations).await
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
}

async fn worker_loop(ctx: Context, worker_id: usize, operations: Arc<AtomicU64>) {
    let mut rng = ctx.rng(worker_id);
    let home = home_node(&ctx, worker_id);
    let mut worker = Worker::new(&ctx, worker_id, home, REQUEST_TIMEOUT);
    let mut enqueued = 0u64;
    while !ctx.done() {
        let queue = format!(
            "q{}",
            operations.fetch_add(1, Ordering::Relaxed) / OPS_PER_QUEUE_MAX
        );
        worker.rebind(home);
        if rng.random_bool(0.35) {
            enqueued += 1;
            let id = format!("w{worker_id}-{enqueued}");
            let idem = idempotency_key(&mut rng);
            let body = requests::enqueue(&id, json!({"n": enqueued}), 20);
            let path = format!("/v1/queues/{queue}/tasks");
            let mut attempts = 0;
            loop {
                attempts += 1;
                let outcome = worker
                    .op(
                        "enqueue",
                        &queue,
                        json!({"task": id, "idempotency_key": idem}),
                        Method::POST,
                        &path,
                        Some(&body),
                        Some(&idem),
                        |answer, replayed| {
                            json!({"task": answer["id"], "replayed": replayed,
                                                  "digest": answer_digest(answer)})
                        },
                    )
                    .await;
                if !matches!(outcome, Outcome::Info { .. }) || attempts >= 3 || ctx.done() {
                    break;
                }
                // Give a failover time to finish before the retry.
                pause_for(&ctx, Duration::from_millis(rng.random_range(300..800))).await;
                let node = other_node(&ctx, worker.client.node, &mut rng);
                worker.rebind(node);
            }
            worker.rebind(home);
            continue;
        }
        let path = format!("/v1/queues/{queue}/claim");
        let idem = idempotency_key(&mut rng);
        let body = requests::claim(&format!("q{worker_id}"), TTL_MS);
        let outcome = worker
            .op(
                "claim",
                &queue,
                json!({"idempotency_key": idem}),
                Method::POST,
                &path,
                Some(&body),
                Some(&idem),
                |answer, replayed| {
                    if answer.is_null() {
                        json!({"task": null})
                    } else {
                        json!({"task": answer["task"]["id"], "fence": answer["fence"],
                               "attempt": answer["attempt"], "replayed": replayed,
                               "expires_in_ms": answer["expires_in_ms"],
                               "digest": answer_digest(answer)})
                    }
                },
            )
            .await;
        let Outcome::Ok {
            body: claim,
            status,
            ..
        } = outcome
        else {
            pause_for(&ctx, Duration::from_millis(rng.random_range(20..100))).await;
            continue;
        };
        if status == 204 || claim.is_null() {
            pause_for(&ctx, Duration::from_millis(rng.random_range(20..80))).await;
            continue;
        }
        let task = claim["task"]["id"].as_str().unwrap_or("").to_owned();
        let fence = claim["fence"].as_u64().unwrap_or(0);
        let session = claim["session_id"].as_str().unwrap_or("").to_owned();
        pause_for(&ctx, Duration::from_millis(rng.random_range(10..120))).await;
        if rng.random_bool(0.15) {
            continue; // walk away: the claim lapses and the task is claimed again
        }
        let path = format!("/v1/queues/{queue}/tasks/{task}/complete");
        let body = requests::complete(&session, fence, json!({"by": worker_id}));
        let idem = idempotency_key(&mut rng);
        worker
            .op(
                "complete",
                &queue,
                json!({"task": task, "fence": fence, "idempotency_key": idem}),
                Method::POST,
                &path,
                Some(&body),
                Some(&idem),
                |answer, replayed| {
                    json!({"task": task, "fence": fence, "replayed": replayed,
                                          "digest": answer_digest(answer)})
                },
            )
            .await;
        // The session has done its work: end it, so it does not linger. The fence names the
        // claim this ends, for the claims checker.
        let path = format!("/v1/sessions/{session}");
        worker
            .op(
                "end-session",
                &queue,
                json!({"task": task, "fence": fence}),
                Method::DELETE,
                &path,
                None,
                Some(&idempotency_key(&mut rng)),
                |_, _| Value::Null,
            )
            .await;
    }
}
