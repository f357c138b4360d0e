//! Cluster time (G6, docs/guarantees.md, "Time") as clients see it in `Baton-Cluster-Time`: it never
//! decreases across sequential requests to different nodes, a leader kill and a restart
//! included; it never gains on real time by more than the rate error; and with no writes the
//! idle tick keeps it in pace with real time.
//!
//! The rate bound is measured from a write's answer: a write's time is the leader's stamp,
//! taken after the request was sent, so between sending that write and receiving any later
//! answer, cluster time may advance at most that real interval times `1 + clock_rate_error`
//! (a read's time is an applied stamp, which may predate its request, so a read cannot anchor
//! the bound). All nodes share this machine's monotonic clock, so the real rate error is 0;
//! the 50 ms slack covers rounding only.

use std::time::{Duration, Instant};

use baton_tests::{json, poll_until, Cluster, HttpReply, Method, Node, Value};

/// The default `clock_rate_error`.
const CLOCK_RATE_ERROR: f64 = 0.01;
const RATE_SLACK_MS: f64 = 50.0;

#[derive(Debug, Default)]
struct Observations {
    /// (what was asked, cluster time answered), in real-time order.
    seen: Vec<(String, u64)>,
    /// When the first acknowledged write was sent, and its cluster time.
    anchor: Option<(Instant, u64)>,
}

impl Observations {
    /// Records a decided answer (2xx or 4xx) and checks G6 against every earlier one.
    /// Answers of 5xx (`NO_LEADER`, `OUTCOME_UNKNOWN`) decided nothing at any cluster time, so
    /// their header is not held to the order.
    fn record(&mut self, reply: &HttpReply, sent: Instant, received: Instant, is_write: bool) {
        if reply.status >= 500 {
            return;
        }
        let time = reply.cluster_time();
        if let Some((previous, previous_time)) = self.seen.last() {
            assert!(
                time >= *previous_time,
                "cluster time went back from {previous_time} ({previous}) to {time} ({reply})"
            );
        }
        if let Some((anchor_sent, anchor_time)) = self.anchor {
            let real_ms = (received - anchor_sent).as_secs_f64() * 1000.0;
            let bound = real_ms * (1.0 + CLOCK_RATE_ERROR) + RATE_SLACK_MS;
            assert!(
                (time - anchor_time) as f64 <= bound,
                "cluster time advanced {} ms in {real_ms:.1} ms of real time: {reply}",
                time - anchor_time
            );
        } else if is_write && reply.is_success() {
            self.anchor = Some((sent, time));
        }
        self.seen.push((reply.request.clone(), time));
    }
}

/// Round `round` of a mix of writes and linearizable reads against `node`; records the answer
/// and returns whether it was an acknowledged write.
async fn request(
    cluster: &Cluster,
    node: &Node,
    round: usize,
    observations: &mut Observations,
) -> bool {
    let api = cluster.api();
    let (method, path, body): (Method, &str, Option<Value>) = match round % 4 {
        0 => (Method::PUT, "/v1/kv/time/k", Some(json!({"value": round}))),
        1 => (Method::GET, "/v1/kv/time/k", None),
        2 => (
            Method::POST,
            "/v1/fence/check",
            Some(json!({"resource": "time/none", "fence": 1})),
        ),
        _ => (Method::GET, "/v1/leases/time/none", None),
    };
    let is_write = method == Method::PUT;
    let mut call = api.call(method, node, path);
    if let Some(body) = &body {
        call = call.json(body);
    }
    let sent = Instant::now();
    let Ok(reply) = call.try_send().await else {
        return false;
    };
    observations.record(&reply, sent, Instant::now(), is_write);
    is_write && reply.is_success()
}

#[tokio::test]
async fn cluster_time_never_decreases_across_nodes_a_leader_kill_and_a_restart() {
    let cluster = Cluster::start(3).await;
    let mut observations = Observations::default();
    let mut round = 0;

    for node in cluster.nodes().iter().cycle().take(24) {
        request(&cluster, node, round, &mut observations).await;
        round += 1;
    }
    assert!(observations.anchor.is_some(), "no write was acknowledged");

    let leader = cluster.leader().await;
    let killed = leader.id;
    leader.kill();
    let survivors = cluster.live_nodes();
    poll_until(
        Duration::from_secs(10),
        "a write after the leader was killed",
        async || {
            let node = survivors[round % survivors.len()];
            round += 1;
            // Only writes make progress here; reads in between are recorded too.
            let wrote = request(&cluster, node, round - 1, &mut observations).await;
            wrote.then_some(())
        },
    )
    .await;
    for node in survivors.iter().cycle().take(8) {
        request(&cluster, node, round, &mut observations).await;
        round += 1;
    }

    cluster.node(killed).restart();
    cluster.wait_ready(Duration::from_secs(20)).await;
    for node in cluster.nodes().iter().cycle().take(24) {
        request(&cluster, node, round, &mut observations).await;
        round += 1;
    }
    let first = observations.seen.first().expect("observations").1;
    let last = observations.seen.last().expect("observations").1;
    eprintln!(
        "time: {} answers, cluster time {first}..{last} ms, never decreasing",
        observations.seen.len()
    );
}

#[tokio::test]
async fn idle_cluster_time_keeps_pace_with_real_time_and_never_gains_on_it() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let tick_ms = cluster.config().tick_ms;
    let mut observations = Observations::default();

    let writer = cluster.leader().await;
    let sent = Instant::now();
    let reply = api
        .put(writer, "/v1/kv/time/anchor", &json!({"value": 0}))
        .await;
    let written = Instant::now();
    reply.expect_status(200);
    observations.record(&reply, sent, written, true);
    let anchor_time = reply.cluster_time();

    // Only reads for two seconds, paced every 50 ms (the interval paces requests; it waits
    // for no state): time moves by the leader's idle ticks alone.
    let mut pace = tokio::time::interval(Duration::from_millis(50));
    let mut last = (written, anchor_time);
    let mut round = 0;
    while written.elapsed() < Duration::from_secs(2) {
        pace.tick().await;
        let node = &cluster.nodes()[round % 3];
        round += 1;
        let read_sent = Instant::now();
        let reply = api.get(node, "/v1/kv/time/anchor").await;
        reply.expect_status(200);
        observations.record(&reply, read_sent, Instant::now(), false);
        last = (read_sent, reply.cluster_time());
    }

    // Lower bound: a read reflects the last tick, at most a tick and a commit old.
    let (last_sent, last_time) = last;
    let real_ms = (last_sent - written).as_millis() as u64;
    let advanced = last_time - anchor_time;
    let allowed_lag_ms = tick_ms + 500;
    eprintln!(
        "time: idle cluster time advanced {advanced} ms in at least {real_ms} ms of real time"
    );
    assert!(
        advanced + allowed_lag_ms >= real_ms,
        "idle cluster time advanced only {advanced} ms in {real_ms} ms: the tick does not keep \
         pace (allowed lag {allowed_lag_ms} ms)"
    );
}

#[tokio::test]
async fn a_failover_extends_a_lease_by_about_the_leaderless_gap_and_never_shortens_it() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let leader = cluster.leader().await;
    let acquire = json!({"resource": "time/lease", "holder": "agent-a", "ttl_ms": 20_000});
    let grant = api.post(leader, "/v1/leases", &acquire).await;
    let granted = Instant::now();
    grant.expect_status(201);
    let granted_expires_in = grant.body["expires_in_ms"].as_u64().expect("expires_in_ms") as f64;

    let killed_at = Instant::now();
    leader.kill();
    let survivors = cluster.live_nodes();
    let mut attempt = 0;
    let lease = poll_until(
        Duration::from_secs(10),
        "the lease read after failover",
        async || {
            let node = survivors[attempt % survivors.len()];
            attempt += 1;
            let reply = api
                .call(Method::GET, node, "/v1/leases/time/lease")
                .try_send()
                .await
                .ok()?;
            (reply.status == 200).then_some(reply)
        },
    )
    .await;
    let answered = Instant::now();
    let leaderless_ms = (answered - killed_at).as_secs_f64() * 1000.0;
    let elapsed_ms = (answered - granted).as_secs_f64() * 1000.0;
    let expires_in = lease.body["expires_in_ms"].as_u64().expect("expires_in_ms") as f64;
    // Without a failover the lease would have this much left by now; cluster time stood still
    // while there was no leader, so the lease has that much more.
    let extension_ms = expires_in - (granted_expires_in - elapsed_ms);
    eprintln!(
        "time: after {leaderless_ms:.0} ms without a usable leader the lease has {expires_in} ms left, \
         {extension_ms:.0} ms more than real time alone would leave"
    );
    assert!(
        extension_ms >= -RATE_SLACK_MS,
        "the failover shortened the lease by {:.0} ms",
        -extension_ms
    );
    assert!(
        extension_ms >= 100.0,
        "the leaderless gap ({leaderless_ms:.0} ms, election timeout 300 ms) did not extend the lease: {extension_ms:.0} ms"
    );
    assert!(
        extension_ms <= leaderless_ms + RATE_SLACK_MS,
        "the lease gained {extension_ms:.0} ms, more than the {leaderless_ms:.0} ms leaderless gap"
    );
}

#[tokio::test]
async fn a_leader_restarted_faster_than_the_election_timeout_keeps_time_monotonic() {
    let cluster = Cluster::start(3).await;
    let mut observations = Observations::default();
    let mut round = 0;
    for node in cluster.nodes().iter().cycle().take(12) {
        request(&cluster, node, round, &mut observations).await;
        round += 1;
    }
    let leader = cluster.leader().await;
    let restarted = leader.id;
    // SIGKILL and start again at once: with a 300 ms election timeout the node is back before
    // its followers time out, and may resume leadership in the same term.
    leader.kill();
    leader.restart();
    poll_until(
        Duration::from_secs(10),
        "a write after the quick restart",
        async || {
            let nodes = cluster.nodes();
            let node = &nodes[round % nodes.len()];
            round += 1;
            let wrote = request(&cluster, node, round - 1, &mut observations).await;
            wrote.then_some(())
        },
    )
    .await;
    cluster.wait_ready(Duration::from_secs(20)).await;
    for node in cluster.nodes().iter().cycle().take(24) {
        request(&cluster, node, round, &mut observations).await;
        round += 1;
    }
    let leader_now = cluster.leader().await.id;
    eprintln!(
        "time: node {restarted} restarted at once; leader now {leader_now}; {} answers, never decreasing",
        observations.seen.len()
    );
}
