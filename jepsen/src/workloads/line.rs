//! The `line` workload: acquires that wait in line. Each round of a worker is one session with
//! a holder name of its own (`w<worker>.<round>`: the `line` checker matches the event log and
//! the history by holder), on one of three paths, so lines form: two exclusive ones and one
//! taken mostly as a shared lease of limit 2 (sometimes exclusive, so exclusive and shared
//! waiters mix in one line).
//!
//! A round acquires with `wait_ms` (random, 0..=1500). Answered `202` (queued), it keeps its
//! session alive and sends the same acquire again, with its session, until it is granted or
//! gives up after a few seconds (then it leaves the line, `POST /v1/sessions/{id}/release`, and
//! ends its session). Granted, it holds for a short while like a `lease` holder: exclusive
//! holders write to the fence-checking resource, every hold is recorded (`holds`) for the
//! `holds`, `shared-limits` and `stale-writes` checkers, then it releases and ends its session;
//! some holders walk away instead, so their leases expire and the line is served at expiry.
//!
//! Every acquire records its holder; a re-sent one also records `resend` and `since_ns` (when
//! its wait began: the grant it learns of may have been made any time since, which the `fences`
//! checker takes into account). Answers: `ok` with `queued`/`position` for a `202`, `ok` with
//! the fence for a `201`, `fail` for a refusal, `info` for a timeout or a 5xx. A re-sent
//! acquire refused `LEASE_HELD` by the session's own lease (granted since the last answer) is a
//! `fail` whose `held_by` names the holder; the round then lets go without acting as holder.
//! What must never live here: the checks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::Rng;
use reqwest::Method;
use serde_json::{json, Value};

use super::lease::{answer_digest, record_hold};
use super::{
    g7_valid_until, home_node, idempotency_key, other_node, pause_for, requests, Context,
    GuardClock, Mode, Worker,
};
use crate::http::Outcome;

/// The paths and modes a round picks from.
pub const PATHS: &[(&str, Mode)] = &[
    ("line/a", Mode::Exclusive),
    ("line/a", Mode::Exclusive),
    ("line/a", Mode::Exclusive),
    ("line/b", Mode::Exclusive),
    ("line/b", Mode::Exclusive),
    ("line/s", Mode::Shared { limit: 2 }),
    ("line/s", Mode::Shared { limit: 2 }),
    ("line/s", Mode::Shared { limit: 2 }),
    ("line/s", Mode::Exclusive),
];
/// Session TTL: longer than the longest wait of one acquire, so a waiter renews between its
/// acquires.
const TTL_MS: u64 = 3_000;
/// The longest `wait_ms` sent.
const WAIT_MS_MAX: u64 = 1_500;
/// Timeout of an acquire: its wait plus room for a failover.
const ACQUIRE_TIMEOUT: Duration = Duration::from_millis(WAIT_MS_MAX + 1_500);
/// Timeout of the other calls (keepalive, release, end).
const CALL_TIMEOUT: Duration = Duration::from_millis(900);
/// How long a round waits in line before it gives up (ms).
const GIVE_UP_MS: std::ops::Range<u64> = 2_500..6_000;
/// The share of holders that walk away without releasing.
const ABANDON: f64 = 0.15;
/// A holder writes only while at least this much validity is left.
const WRITE_MARGIN: Duration = Duration::from_millis(3);
/// A holder renews its session this often.
const KEEPALIVE_EVERY: Duration = Duration::from_millis(250);

/// Runs `concurrency` workers until the deadline.
pub async fn run(ctx: Context, concurrency: usize) {
    let mut tasks = Vec::new();
    for worker in 0..concurrency {
        let ctx = ctx.clone();
        tasks.push(tokio::spawn(async move { worker_loop(ctx, worker).await }));
    }
    for task in tasks {
        let _ = task.await;
    }
}

/// One worker: its acquires (long timeout) and its other calls (short timeout), each a
/// recording client bound to the same node.
struct Round<'a> {
    ctx: &'a Context,
    rng: &'a mut StdRng,
    clock: Arc<GuardClock>,
    acquirer: &'a mut Worker,
    caller: &'a mut Worker,
    holder: String,
    resource: &'static str,
    mode: Mode,
    /// The latest G7 bound the session's keepalives gave.
    session_valid: Duration,
}

async fn worker_loop(ctx: Context, worker_id: usize) {
    let mut rng = ctx.rng(worker_id);
    let home = home_node(&ctx, worker_id);
    let mut acquirer = Worker::new(&ctx, worker_id, home, ACQUIRE_TIMEOUT);
    let mut caller = Worker::new(&ctx, worker_id, home, CALL_TIMEOUT);
    let clock = ctx.clocks[worker_id].clone();
    let mut rounds = 0u64;
    while !ctx.done() {
        rounds += 1;
        let (resource, mode) = PATHS[rng.random_range(0..PATHS.len())];
        acquirer.rebind(home);
        caller.rebind(home);
        let mut round = Round {
            ctx: &ctx,
            rng: &mut rng,
            clock: clock.clone(),
            acquirer: &mut acquirer,
            caller: &mut caller,
            holder: format!("w{worker_id}.{rounds}"),
            resource,
            mode,
            session_valid: Duration::ZERO,
        };
        round.run().await;
    }
}

/// How a keepalive went.
enum Renewal {
    /// Renewed: the session is valid until this guard-clock reading (G7).
    Until(Duration),
    /// The session is gone (`LEASE_LOST`).
    Gone,
    /// Refused otherwise, or unknown.
    Unsure,
}

impl Round<'_> {
    async fn run(&mut self) {
        let since_ns = self.ctx.history.now_ns();
        let first_sent = self.clock.now();
        let wait_ms = self.rng.random_range(0..=WAIT_MS_MAX);
        let body =
            requests::acquire_waiting(self.resource, &self.holder, TTL_MS, self.mode, wait_ms);
        let key = idempotency_key(self.rng);
        let mut outcome = self.acquire(&body, &key, wait_ms, None).await;
        // An unknown acquire is retried with the same key on other nodes: at most once applied.
        let mut retries = 0;
        while matches!(outcome, Outcome::Info { .. }) && retries < 2 && !self.ctx.done() {
            retries += 1;
            pause_for(
                self.ctx,
                Duration::from_millis(self.rng.random_range(300..800)),
            )
            .await;
            self.rebind_elsewhere();
            outcome = self.acquire(&body, &key, wait_ms, None).await;
        }
        let answer = match outcome {
            Outcome::Ok { body, .. } => body,
            Outcome::Fail { .. } => {
                pause_for(
                    self.ctx,
                    Duration::from_millis(self.rng.random_range(50..150)),
                )
                .await;
                return;
            }
            // Its session, if it was made, expires and leaves the line with it.
            Outcome::Info { .. } => return,
        };
        let Some(session) = answer["session_id"].as_str().map(str::to_owned) else {
            return;
        };
        let (grant, sent) = if answer["queued"] == Value::Bool(true) {
            match self.wait(&session, since_ns, first_sent).await {
                Some(granted) => granted,
                None => return,
            }
        } else {
            (answer, first_sent)
        };
        self.hold(&session, &grant, sent).await;
    }

    /// Waits in line: renews the session and sends the acquire again until it is granted
    /// (the grant and the guard-clock reading from which its `expires_in_ms` counts), the
    /// session is gone, or the round gives up and leaves. `since_ns` and `first_sent`: when
    /// the round's first acquire was sent, in harness and guard-clock time.
    async fn wait(
        &mut self,
        session: &str,
        since_ns: u64,
        first_sent: Duration,
    ) -> Option<(Value, Duration)> {
        let give_up = Instant::now() + Duration::from_millis(self.rng.random_range(GIVE_UP_MS));
        loop {
            if self.ctx.done() || Instant::now() >= give_up {
                self.leave(session).await;
                self.end(session).await;
                return None;
            }
            match self.keepalive(session).await {
                Renewal::Until(valid) => self.session_valid = self.session_valid.max(valid),
                Renewal::Gone => return None,
                Renewal::Unsure => self.rebind_elsewhere(),
            }
            let wait_ms = self.rng.random_range(0..=WAIT_MS_MAX);
            let body = requests::acquire_again(self.resource, session, self.mode, wait_ms);
            let key = idempotency_key(self.rng);
            match self.acquire(&body, &key, wait_ms, Some(since_ns)).await {
                Outcome::Ok { body, .. } if body["queued"] == Value::Bool(true) => {}
                // The grant may have been made before this acquire was sent (even before the
                // first answer arrived), so its `expires_in_ms` counts from the first send.
                Outcome::Ok { body, .. } => return Some((body, first_sent)),
                // Granted since the last answer, and told so by a refusal that names the
                // session's own lease (the server answers such a re-sent acquire 201 with the
                // grant; an older one refused it). No acquire was answered with this fence, so
                // the round does not act on it: it lets go and ends its session.
                Outcome::Fail { code, held_by, .. }
                    if code == "LEASE_HELD"
                        && held_by["holder"] == self.holder.as_str()
                        && held_by["resource"] == self.resource =>
                {
                    self.leave(session).await;
                    self.end(session).await;
                    return None;
                }
                Outcome::Fail { code, .. } if code == "LEASE_LOST" => return None,
                Outcome::Fail { .. } | Outcome::Info { .. } => {
                    self.rebind_elsewhere();
                    pause_for(
                        self.ctx,
                        Duration::from_millis(self.rng.random_range(50..200)),
                    )
                    .await;
                }
            }
        }
    }

    /// Holds the granted lease for a short while, writing with its fence when exclusive, and
    /// records the hold; then releases and ends the session, or walks away.
    async fn hold(&mut self, session: &str, grant: &Value, sent: Duration) {
        let ok_ns = self.ctx.history.now_ns();
        let fence = grant["fence"].as_u64().unwrap_or(0);
        let mut valid_until = g7_valid_until(sent, grant["expires_in_ms"].as_u64().unwrap_or(0))
            .max(self.session_valid);
        let paths: Vec<String> = ["line/a", "line/b", "line/s"]
            .iter()
            .map(|path| (*path).to_owned())
            .collect();
        let renews = !self.rng.random_bool(ABANDON);
        let rounds = self.rng.random_range(1..5);
        let mut last_write_ns = 0u64;
        let mut released_ns: Option<u64> = None;
        let mut last_keepalive = self.clock.now();
        for round in 0.. {
            if self.ctx.done() || self.clock.now() + WRITE_MARGIN >= valid_until {
                break;
            }
            // Shared holders hold together: only an exclusive holder writes.
            if self.mode.limit().is_none()
                && self
                    .ctx
                    .resource
                    .write(&self.holder, self.resource, self.mode, fence, &paths)
            {
                last_write_ns = self.ctx.history.now_ns();
            }
            pause_for(
                self.ctx,
                Duration::from_millis(self.rng.random_range(30..120)),
            )
            .await;
            if renews && round + 1 >= rounds {
                released_ns = Some(self.ctx.history.now_ns());
                self.release(session, fence).await;
                break;
            }
            if renews && self.clock.now().saturating_sub(last_keepalive) >= KEEPALIVE_EVERY {
                last_keepalive = self.clock.now();
                match self.keepalive(session).await {
                    Renewal::Until(renewed) => valid_until = valid_until.max(renewed),
                    Renewal::Gone => break,
                    Renewal::Unsure => {}
                }
            }
        }
        // A holder that did not release (the run ended, or its validity ran out) ends its
        // session now: it stops acting as holder before it sends that.
        if renews && released_ns.is_none() {
            released_ns = Some(self.ctx.history.now_ns());
        }
        let g7_end_ns = self.ctx.history.ns_of(self.clock.instant_of(valid_until));
        let end_ns = released_ns
            .map_or(g7_end_ns, |sent| sent.min(g7_end_ns))
            .max(last_write_ns);
        record_hold(
            self.ctx,
            &self.holder,
            self.resource,
            self.mode,
            fence,
            ok_ns,
            end_ns,
            g7_end_ns,
        );
        if renews {
            self.end(session).await;
        } else {
            // Walked away: the lease expires on its own and the line is served then.
            pause_for(
                self.ctx,
                Duration::from_millis(self.rng.random_range(0..200)),
            )
            .await;
        }
    }

    /// One acquire (`since_ns`: a re-sent one, and when its wait began).
    async fn acquire(
        &mut self,
        body: &Value,
        key: &str,
        wait_ms: u64,
        since_ns: Option<u64>,
    ) -> Outcome {
        let mut invoked = json!({"mode": self.mode.as_str(), "limit": self.mode.limit(),
                                 "holder": self.holder, "wait_ms": wait_ms,
                                 "idempotency_key": key, "resend": since_ns.is_some()});
        if let Some(since_ns) = since_ns {
            invoked["since_ns"] = Value::from(since_ns);
        }
        self.acquirer
            .op(
                "acquire",
                self.resource,
                invoked,
                Method::POST,
                "/v1/leases",
                Some(body),
                Some(key),
                |answer, replayed| {
                    if answer["queued"] == Value::Bool(true) {
                        json!({"queued": true, "position": answer["position"],
                               "session_created": answer["session_created"],
                               "replayed": replayed, "digest": answer_digest(answer)})
                    } else {
                        json!({"fence": answer["fence"], "mode": answer["mode"],
                               "expires_in_ms": answer["expires_in_ms"], "replayed": replayed,
                               "digest": answer_digest(answer)})
                    }
                },
            )
            .await
    }

    async fn keepalive(&mut self, session: &str) -> Renewal {
        let sent = self.clock.now();
        let path = format!("/v1/sessions/{session}/keepalive");
        let key = idempotency_key(self.rng);
        let outcome = self
            .caller
            .op(
                "keepalive",
                self.resource,
                json!({"lease": self.holder}),
                Method::POST,
                &path,
                None,
                Some(&key),
                |answer, _| json!({"expires_in_ms": answer["expires_in_ms"]}),
            )
            .await;
        match outcome {
            Outcome::Ok { body, .. } => Renewal::Until(g7_valid_until(
                sent,
                body["expires_in_ms"].as_u64().unwrap_or(0),
            )),
            Outcome::Fail { code, .. } if code == "LEASE_LOST" => Renewal::Gone,
            _ => Renewal::Unsure,
        }
    }

    /// Leaves the line (or releases a grant that raced the decision to give up).
    async fn leave(&mut self, session: &str) {
        let path = format!("/v1/sessions/{session}/release");
        let key = idempotency_key(self.rng);
        self.caller
            .op(
                "leave",
                self.resource,
                json!({"holder": self.holder}),
                Method::POST,
                &path,
                Some(&requests::release(self.resource)),
                Some(&key),
                |answer, _| json!({"digest": answer_digest(answer)}),
            )
            .await;
    }

    async fn release(&mut self, session: &str, fence: u64) {
        let path = format!("/v1/sessions/{session}/release");
        let key = idempotency_key(self.rng);
        self.caller
            .op(
                "release",
                self.resource,
                json!({"lease": self.holder, "fence": fence}),
                Method::POST,
                &path,
                Some(&requests::release(self.resource)),
                Some(&key),
                |_, _| Value::Null,
            )
            .await;
    }

    async fn end(&mut self, session: &str) {
        let path = format!("/v1/sessions/{session}");
        let key = idempotency_key(self.rng);
        self.caller
            .op(
                "end",
                self.resource,
                json!({"holder": self.holder}),
                Method::DELETE,
                &path,
                None,
                Some(&key),
                |_, _| Value::Null,
            )
            .await;
    }

    /// Moves both clients to another node than the current one.
    fn rebind_elsewhere(&mut self) {
        let node = other_node(self.ctx, self.acquirer.client.node, self.rng);
        self.acquirer.rebind(node);
        self.caller.rebind(node);
    }
}
