//! Long leases: one extra client, beside a workload's own workers, that acquires leases with a
//! two-minute TTL on paths of their own (`long/N`) and releases some of them. The workloads'
//! own leases live a second or two and are all expired by the time the harness re-reads lease
//! state after healing; these are still live then, so the final lease listing can show that an
//! acknowledged grant survived every crash, restart and snapshot install (G5), not just that
//! nothing phantom appeared. The client speaks to every node in turn and retries an unknown
//! acquire once with its idempotency key on another node. What must never live here: the
//! checks (that is `checkers::final_leases`).

use std::time::Duration;

use rand::Rng;
use reqwest::Method;
use serde_json::json;

use super::lease::answer_digest;
use super::{idempotency_key, other_node, pause_for, requests, Context, Mode, Worker};
use crate::http::Outcome;

/// TTL of the long leases: far longer than the faults, the healing and the final reads.
pub const LONG_TTL_MS: u64 = 120_000;
/// The prefix of their paths.
pub const PREFIX: &str = "long/";
/// The worker number whose seeded generator the client uses (past any real worker's).
const WORKER_ID: usize = 1_000;
/// Per-request timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(1_500);
/// Leases held at once at most (a bound, and sessions stay few).
const HELD_MAX: usize = 16;

/// Runs the long-lease client until the deadline.
pub async fn run(ctx: Context) {
    let mut rng = ctx.rng(WORKER_ID);
    let nodes: Vec<u64> = ctx.nodes.iter().map(|(id, _)| *id).collect();
    let mut worker = Worker::new(&ctx, WORKER_ID, nodes[0], REQUEST_TIMEOUT);
    // (resource, session, fence) of the leases held; the session id never enters the history.
    let mut held: Vec<(String, String, u64)> = Vec::new();
    let mut acquired = 0usize;
    while !ctx.done() {
        pause_for(&ctx, Duration::from_millis(rng.random_range(400..1_200))).await;
        if ctx.done() {
            break;
        }
        let home = nodes[acquired % nodes.len()];
        acquired += 1;
        if held.len() >= HELD_MAX || (!held.is_empty() && rng.random_bool(0.3)) {
            let (resource, session, fence) = held.swap_remove(rng.random_range(0..held.len()));
            let idem = idempotency_key(&mut rng);
            worker.rebind(home);
            let path = format!("/v1/sessions/{session}/release");
            worker
                .op(
                    "release",
                    &resource,
                    json!({"fence": fence, "idempotency_key": idem}),
                    Method::POST,
                    &path,
                    Some(&requests::release(&resource)),
                    Some(&idem),
                    |_, _| serde_json::Value::Null,
                )
                .await;
            continue;
        }
        let resource = format!("{PREFIX}{}-{acquired}", ctx.seed);
        let idem = idempotency_key(&mut rng);
        let body = requests::acquire(&resource, "long", LONG_TTL_MS, Mode::Exclusive);
        worker.rebind(home);
        let mut outcome = acquire(&mut worker, &resource, &body, &idem).await;
        if matches!(outcome, Outcome::Info { .. }) && !ctx.done() {
            // Give a failover time to finish before the retry with the same key.
            pause_for(&ctx, Duration::from_millis(rng.random_range(300..800))).await;
            worker.rebind(other_node(&ctx, home, &mut rng));
            outcome = acquire(&mut worker, &resource, &body, &idem).await;
        }
        if let Outcome::Ok { body: grant, .. } = outcome {
            if let (Some(session), Some(fence)) =
                (grant["session_id"].as_str(), grant["fence"].as_u64())
            {
                held.push((resource, session.to_owned(), fence));
            }
        }
    }
}

async fn acquire(
    worker: &mut Worker,
    resource: &str,
    body: &serde_json::Value,
    idem: &str,
) -> Outcome {
    worker
        .op(
            "acquire",
            resource,
            json!({"mode": "exclusive", "idempotency_key": idem, "ttl_ms": LONG_TTL_MS}),
            Method::POST,
            "/v1/leases",
            Some(body),
            Some(idem),
            |grant, replayed| {
                json!({"fence": grant["fence"], "mode": grant["mode"],
                       "expires_in_ms": grant["expires_in_ms"], "replayed": replayed,
                       "digest": answer_digest(grant)})
            },
        )
        .await
}
