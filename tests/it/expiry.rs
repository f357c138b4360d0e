//! Expiry in cluster time: a session that stops renewing loses its lease, never before its
//! deadline (G6) and soon after it; keepalives keep a lease; `max_hold_ms` caps a lease even
//! while keepalives continue.

use std::time::{Duration, Instant};

use baton_client::api::{ErrorCode, FenceCheckResponse, Grant, Lease, SessionInfo};
use baton_tests::{json, poll_until, Cluster, Method, Node};

/// The shortest TTL the limits allow (docs/guarantees.md, "Limits").
const TTL_MIN_MS: u64 = 1_000;
/// The default `clock_rate_error`.
const CLOCK_RATE_ERROR: f64 = 0.01;
/// How long after its deadline an expired lease must be acquirable: the deadline itself, a
/// tick (100 ms in tests), a commit, and generous room for a loaded two-core machine.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(3);

/// One attempt by `holder` to take `resource`: the grant, or `None` while it is held by
/// `expected_holder` with `expected_fence`. Anything else fails the test.
async fn try_take(
    cluster: &Cluster,
    node: &Node,
    resource: &str,
    holder: &str,
    expected_holder: &str,
    expected_fence: u64,
) -> Option<Grant> {
    let reply = cluster
        .api()
        .post(
            node,
            "/v1/leases",
            &json!({"resource": resource, "holder": holder, "ttl_ms": 5_000}),
        )
        .await;
    if reply.status == 201 {
        return Some(reply.parse());
    }
    let held_by = reply
        .expect_problem(409, ErrorCode::LeaseHeld)
        .held_by
        .unwrap_or_else(|| panic!("LEASE_HELD without held_by: {reply}"));
    assert_eq!(
        (held_by.holder.as_str(), held_by.fence),
        (expected_holder, expected_fence),
        "{reply}"
    );
    None
}

async fn keepalive(cluster: &Cluster, node: &Node, session: &str) -> u16 {
    cluster
        .api()
        .call(
            Method::POST,
            node,
            &format!("/v1/sessions/{session}/keepalive"),
        )
        .send()
        .await
        .status
}

/// The least real time that must pass for cluster time to advance `ms`, given G6's rate bound.
fn least_real_time_for(ms: u64) -> Duration {
    Duration::from_secs_f64(ms as f64 / (1.0 + CLOCK_RATE_ERROR) / 1000.0)
}

#[tokio::test]
async fn a_session_that_stops_renewing_loses_its_lease_at_its_deadline_and_not_before() {
    let cluster = Cluster::start(1).await;
    let node = cluster.node(1);
    let api = cluster.api();
    let resource = "build/lock";

    let sent = Instant::now();
    let first: Grant = api
        .post(
            node,
            "/v1/leases",
            &json!({"resource": resource, "holder": "agent-a", "ttl_ms": TTL_MIN_MS}),
        )
        .await
        .expect_json(201);
    assert!(first.expires_in_ms <= TTL_MIN_MS);

    // agent-a goes silent; agent-b polls.
    let (second, granted_at) = poll_until(
        HANDOVER_TIMEOUT,
        "the expired lease to be granted to agent-b",
        async || {
            try_take(&cluster, node, resource, "agent-b", "agent-a", first.fence)
                .await
                .map(|grant| (grant, Instant::now()))
        },
    )
    .await;
    let waited = granted_at - sent;
    eprintln!(
        "expiry: a {TTL_MIN_MS} ms lease was handed over {waited:?} after its acquire was sent"
    );
    assert!(
        waited >= least_real_time_for(TTL_MIN_MS),
        "the lease expired after {waited:?}, before its {TTL_MIN_MS} ms deadline (G6)"
    );
    assert!(
        second.fence > first.fence,
        "{} then {}",
        first.fence,
        second.fence
    );
    assert_eq!(second.holder, "agent-b");

    // The silent session is gone with its lease.
    let session = first.session_id.as_str();
    api.call(
        Method::POST,
        node,
        &format!("/v1/sessions/{session}/keepalive"),
    )
    .send()
    .await
    .expect_problem(409, ErrorCode::LeaseLost);
    api.post(
        node,
        &format!("/v1/sessions/{session}/release"),
        &json!({"resource": resource}),
    )
    .await
    .expect_problem(409, ErrorCode::LeaseLost);
    let lease: Lease = api
        .get(node, &format!("/v1/leases/{resource}"))
        .await
        .expect_json(200);
    assert_eq!(
        (lease.holder.as_str(), lease.fence),
        ("agent-b", second.fence)
    );
    let check: FenceCheckResponse = api
        .post(
            node,
            "/v1/fence/check",
            &json!({"resource": resource, "fence": first.fence}),
        )
        .await
        .expect_json(200);
    assert_eq!((check.current, check.fence), (false, Some(second.fence)));
}

#[tokio::test]
async fn keepalives_keep_a_short_lease_and_it_expires_once_they_stop() {
    let cluster = Cluster::start(1).await;
    let node = cluster.node(1);
    let resource = "svc/dev-server";
    let first: Grant = cluster
        .api()
        .post(
            node,
            "/v1/leases",
            &json!({"resource": resource, "holder": "agent-a", "ttl_ms": TTL_MIN_MS}),
        )
        .await
        .expect_json(201);
    let session = first.session_id.as_str();

    // Renew every 250 ms for 2.5 s, 2.5 TTLs: the lease must never be handed over. The
    // interval paces the heartbeats; it waits for no state.
    let mut heartbeat = tokio::time::interval(Duration::from_millis(250));
    let until = Instant::now() + Duration::from_millis(2_500);
    while Instant::now() < until {
        heartbeat.tick().await;
        assert_eq!(
            keepalive(&cluster, node, session).await,
            200,
            "keepalive refused"
        );
        let taken = try_take(&cluster, node, resource, "agent-b", "agent-a", first.fence).await;
        assert!(
            taken.is_none(),
            "a renewed lease was handed over: {taken:?}"
        );
    }

    let stopped = Instant::now();
    let second = poll_until(
        HANDOVER_TIMEOUT,
        "the lease to expire after keepalives stopped",
        async || try_take(&cluster, node, resource, "agent-b", "agent-a", first.fence).await,
    )
    .await;
    assert!(second.fence > first.fence);
    eprintln!(
        "expiry: handed over {:?} after the last keepalive",
        stopped.elapsed()
    );
}

#[tokio::test]
async fn max_hold_caps_a_lease_even_while_keepalives_continue() {
    let cluster = Cluster::start(1).await;
    let node = cluster.node(1);
    let api = cluster.api();
    let resource = "migrations";
    let max_hold_ms = 1_500;

    let sent = Instant::now();
    let first: Grant = api
        .post(
            node,
            "/v1/leases",
            &json!({"resource": resource, "holder": "agent-a", "ttl_ms": TTL_MIN_MS,
                    "max_hold_ms": max_hold_ms}),
        )
        .await
        .expect_json(201);
    // docs/api.md does not list max_hold_ms in the grant; when the server shows it, it is the one
    // asked for.
    if let Some(shown) = first.max_hold_ms {
        assert_eq!(shown, max_hold_ms);
    }
    assert!(first.expires_in_ms <= TTL_MIN_MS);
    let session = first.session_id.as_str();

    // agent-a keeps renewing (every loop turn, well within its TTL) while agent-b polls.
    let (second, granted_at) = poll_until(
        Duration::from_millis(max_hold_ms) + HANDOVER_TIMEOUT,
        "the lease to reach its max hold",
        async || {
            assert_eq!(
                keepalive(&cluster, node, session).await,
                200,
                "keepalive refused"
            );
            try_take(&cluster, node, resource, "agent-b", "agent-a", first.fence)
                .await
                .map(|grant| (grant, Instant::now()))
        },
    )
    .await;
    let held = granted_at - sent;
    assert!(
        held >= least_real_time_for(max_hold_ms),
        "the lease ended after {held:?}, before its max hold of {max_hold_ms} ms"
    );
    assert!(second.fence > first.fence);

    // The session outlives the capped lease: it is alive and holds nothing.
    assert_eq!(keepalive(&cluster, node, session).await, 200);
    let info: SessionInfo = api
        .get(node, &format!("/v1/sessions/{session}"))
        .await
        .expect_json(200);
    assert!(info.leases.is_empty(), "{:?}", info.leases);
}
