//! Any node answers any request (docs/api.md): a follower forwards writes to the leader and
//! names it in `Baton-Leader`; reads through any node see every acknowledged write (G1); and
//! idempotent retries (G8) replay the first answer on any node, refuse a reused key with another
//! request, and evaluate a refused request afresh.

use baton_client::api::{ErrorCode, Grant, KvEntry, LeaseList};
use std::time::{Duration, Instant};

use baton_tests::{idempotency_key, json, Cluster, Method};

#[tokio::test]
async fn a_follower_forwards_writes_and_idempotent_retries_replay_the_first_answer() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let leader = cluster.leader().await;
    let followers = cluster.followers().await;
    assert_eq!(followers.len(), 2);
    let (follower, other) = (followers[0], followers[1]);

    let key = idempotency_key();
    let body = json!({"resource": "fw/one", "holder": "agent-f", "ttl_ms": 30_000});
    let acquire = |node, key: &str, body| {
        api.call(Method::POST, node, "/v1/leases")
            .idempotency_key(key)
            .json(body)
            .send()
    };

    let first = acquire(follower, &key, &body).await;
    first.expect_status(201).expect_baton_headers();
    assert_eq!(
        first.leader(),
        Some(leader.id),
        "a forwarded answer names the leader: {first}"
    );
    assert!(!first.replayed(), "a first answer is not a replay: {first}");
    let grant: Grant = first.parse();

    // The same key and body, on every node: the first answer, replayed.
    for node in [follower, leader, other] {
        let retry = acquire(node, &key, &body).await;
        assert_eq!(retry.status, 201, "{retry}");
        assert!(retry.replayed(), "no Idempotent-Replayed: true: {retry}");
        assert_eq!(
            retry.body, first.body,
            "a replay is the first answer: {retry}"
        );
        retry.expect_baton_headers();
    }
    // Applied once: one lease, the first fence.
    let list: LeaseList = api
        .call(Method::GET, other, "/v1/leases?prefix=fw")
        .send()
        .await
        .expect_json(200);
    assert_eq!(
        list.leases
            .iter()
            .map(|lease| (lease.resource.as_str(), lease.fence))
            .collect::<Vec<_>>(),
        [("fw/one", grant.fence)]
    );

    // The same key with another request: refused, on any node, whatever differs.
    let other_holder = json!({"resource": "fw/one", "holder": "agent-g", "ttl_ms": 30_000});
    acquire(follower, &key, &other_holder)
        .await
        .expect_problem(422, ErrorCode::IdempotencyKeyReused);
    acquire(leader, &key, &other_holder)
        .await
        .expect_problem(422, ErrorCode::IdempotencyKeyReused);
    api.call(Method::PUT, other, "/v1/kv/fw/one")
        .idempotency_key(&key)
        .json(&json!({"value": 1}))
        .send()
        .await
        .expect_problem(422, ErrorCode::IdempotencyKeyReused);
    api.get(other, "/v1/kv/fw/one")
        .await
        .expect_problem(404, ErrorCode::NotFound);

    // Keys are per namespace: the same key and body elsewhere is a new request.
    let elsewhere = api
        .call(Method::POST, other, "/v1/leases")
        .namespace("other-team")
        .idempotency_key(&key)
        .json(&body)
        .send()
        .await;
    let elsewhere_grant: Grant = elsewhere.expect_json(201);
    assert!(!elsewhere.replayed(), "{elsewhere}");
    assert!(elsewhere_grant.fence > grant.fence);

    // A refusal is not recorded: the retry after the resource is freed is evaluated afresh.
    let refused_key = idempotency_key();
    acquire(other, &refused_key, &other_holder)
        .await
        .expect_problem(409, ErrorCode::LeaseHeld);
    api.post(
        follower,
        &format!("/v1/sessions/{}/release", grant.session_id.as_str()),
        &json!({"resource": "fw/one"}),
    )
    .await
    .expect_status(200);
    let fresh = acquire(other, &refused_key, &other_holder).await;
    let fresh_grant: Grant = fresh.expect_json(201);
    assert!(!fresh.replayed(), "{fresh}");
    assert_eq!(fresh_grant.holder, "agent-g");
    assert!(fresh_grant.fence > elsewhere_grant.fence);
}

#[tokio::test]
async fn every_node_reads_what_any_node_acknowledged() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let leader = cluster.leader().await;
    let nodes = cluster.nodes();
    // Write through one node, read at once through the next: linearizable reads (G1) see it.
    for round in 0..12_usize {
        let writer = &nodes[round % 3];
        let reader = &nodes[(round + 1) % 3];
        let written = api
            .put(writer, "/v1/kv/fw/counter", &json!({"value": round}))
            .await;
        written.expect_status(200);
        assert_eq!(written.leader(), Some(leader.id), "{written}");
        let read = api.get(reader, "/v1/kv/fw/counter").await;
        assert_eq!(read.leader(), Some(leader.id), "{read}");
        let entry: KvEntry = read.expect_json(200);
        assert_eq!(
            entry.value,
            json!(round),
            "node {} read a stale value",
            reader.id
        );
    }
}

/// A follower whose leader is paused does not hang (docs/api.md): within twice the election
/// timeout it gives up on the old leader; a read is re-sent to the new leader and answered; a
/// write that may have reached the old leader is OUTCOME_UNKNOWN; nothing waits longer than
/// `2 × election timeout + 1 s`, and an error names the same leader in its body and its header.
#[tokio::test]
async fn a_follower_of_a_paused_leader_moves_on_within_the_bound() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let leader = cluster.leader().await;
    let follower = cluster.followers().await[0];
    let bound = Duration::from_millis(2 * cluster.config().election_timeout_ms + 1_000);
    api.put(follower, "/v1/kv/paused/x", &json!({"value": 1}))
        .await
        .expect_status(200);

    leader.pause();
    let started = Instant::now();
    let read = api
        .call(Method::GET, follower, "/v1/kv/paused/x")
        .timeout(Duration::from_secs(30))
        .send()
        .await;
    let read_took = started.elapsed();
    let started = Instant::now();
    let write = api
        .call(Method::PUT, follower, "/v1/kv/paused/y")
        .json(&json!({"value": 2}))
        .timeout(Duration::from_secs(30))
        .send()
        .await;
    let write_took = started.elapsed();
    leader.resume();

    assert!(
        read_took <= bound + SLACK,
        "the read took {read_took:?}, over {bound:?}: {read}"
    );
    let entry: KvEntry = read.expect_json(200);
    assert_eq!(entry.value, json!(1));
    assert_ne!(
        read.leader(),
        Some(leader.id),
        "answered by the new leader: {read}"
    );
    assert!(
        write_took <= bound + SLACK,
        "the write took {write_took:?}, over {bound:?}: {write}"
    );
    // The new leader is elected by the time the read came back, so the write goes there; if it
    // raced the election it may be unknown, never NO_LEADER naming the paused leader.
    if !write.is_success() {
        let problem = write.expect_problem(write.status, ErrorCode::OutcomeUnknown);
        assert_eq!(
            problem.leader,
            write.leader(),
            "body and header agree: {write}"
        );
    }
}

/// Timing noise allowed on top of the bound on a shared two-core machine.
const SLACK: Duration = Duration::from_millis(500);

/// A follower relays writes to the leader as commands over the peer listener, not as HTTP
/// requests: 64 writes at once through a follower are all applied and read back everywhere,
/// the follower counts them as relayed, and the leader's client API never saw them.
#[tokio::test]
async fn a_follower_relays_concurrent_writes_to_the_leader_as_commands() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let leader = cluster.leader().await;
    let follower = cluster.followers().await[0];
    let leader_puts_before = counter(api, leader, PUT_KV_REQUESTS).await;
    let relayed_before = counter(api, follower, "baton_relayed_commands_total").await;

    let puts = (0..64_u64).map(|n| async move {
        api.put(follower, &format!("/v1/kv/relay/{n}"), &json!({"value": n}))
            .await
    });
    for written in futures_util::future::join_all(puts).await {
        written.expect_status(200);
        assert_eq!(written.leader(), Some(leader.id), "{written}");
    }

    let relayed = counter(api, follower, "baton_relayed_commands_total").await - relayed_before;
    let messages = counter(api, follower, "baton_relay_messages_total").await;
    assert!(relayed >= 64, "only {relayed} of 64 writes were relayed");
    assert!(
        (1..=relayed).contains(&messages),
        "{messages} relay messages for {relayed} commands"
    );
    assert_eq!(
        counter(api, leader, PUT_KV_REQUESTS).await,
        leader_puts_before,
        "the leader's client API answered relayed writes itself"
    );
    for node in cluster.nodes() {
        for n in [0_u64, 31, 63] {
            let entry: KvEntry = api
                .get(node, &format!("/v1/kv/relay/{n}"))
                .await
                .expect_json(200);
            assert_eq!(entry.value, json!(n));
        }
    }
}

/// The leader's count of successful `PUT /v1/kv/{*key}` requests in its `/metrics`.
const PUT_KV_REQUESTS: &str =
    "baton_http_requests_total{route=\"/v1/kv/{*key}\",method=\"PUT\",status=\"200\"}";

/// The value of the metric line starting with `name` on `node` (0 when absent).
async fn counter(api: &baton_tests::Api, node: &baton_tests::Node, name: &str) -> u64 {
    let metrics = api.get(node, "/metrics").await;
    metrics
        .text
        .lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0)
}
