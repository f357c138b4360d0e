//! Corners of the API contract that a review found open, each shown over HTTP against real
//! nodes: names with `.`/`..` segments sent raw, covered paths, the event stream's revision
//! rules, waiting tasks, paged session gets, membership that would make one process two
//! members, and the cluster time of a follower's own answers.

use baton_client::api::{
    ClusterStatus, ErrorCode, FenceCheckResponse, Grant, Lease, QueueInfo, SessionInfo, TaskList,
};
use baton_tests::{json, Cluster, Method};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Sends `GET {path}` as raw bytes (no URL library between), and returns the status line and
/// body.
async fn raw_get(address: &str, path: &str) -> (String, String) {
    raw_request(address, "GET", path, "").await
}

/// Sends `{method} {path}` with a JSON `body` as raw bytes; the status line and the body.
async fn raw_request(address: &str, method: &str, path: &str, body: &str) -> (String, String) {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let status = answer.lines().next().unwrap_or_default().to_owned();
    let body = answer
        .split_once("\r\n\r\n")
        .map_or("", |(_, body)| body)
        .to_owned();
    (status, body)
}

/// One file never goes by two names: a `.` or `..` segment in a URL path, sent as is, is
/// refused rather than resolved, so `repo/src/x.rs`, `repo/./src/x.rs` and
/// `repo/../repo/src/x.rs` cannot be three leases.
#[tokio::test]
async fn dot_segments_in_urls_are_refused_not_resolved() {
    let cluster = Cluster::start(1).await;
    let node = cluster.node(1);
    let api = cluster.api();
    api.post(
        node,
        "/v1/leases",
        &json!({"resource": "repo/src/x.rs", "holder": "agent-a", "ttl_ms": 60_000}),
    )
    .await
    .expect_status(201);
    for path in [
        "/v1/leases/repo/./src/x.rs",
        "/v1/leases/repo/../repo/src/x.rs",
        "/v1/kv/dots/a/../b",
        "/v1/kv/dots/a/%2E%2E/b",
        "/v1/queues/%2E%2E",
    ] {
        let (status, body) = raw_get(&node.api_addr(), path).await;
        assert!(status.contains(" 400 "), "{path}: {status} {body}");
        assert!(body.contains("INVALID_ARGUMENT"), "{path}: {body}");
    }
    for resource in ["repo/./src/x.rs", "repo/../repo/src/x.rs"] {
        api.post(
            node,
            "/v1/leases",
            &json!({"resource": resource, "holder": "agent-b", "ttl_ms": 60_000}),
        )
        .await
        .expect_problem(400, ErrorCode::InvalidArgument);
    }
}

/// A follower forwards through a URL library that would resolve `a/../b` to `b`: it refuses
/// the dot segment itself, so the write never lands under another name.
#[tokio::test]
async fn a_follower_never_forwards_a_dot_segment_resolved() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let follower = cluster.followers().await[0];
    for path in ["/v1/kv/dots/a/../b", "/v1/kv/dots/a/%2E%2E/b"] {
        let (status, body) =
            raw_request(&follower.api_addr(), "PUT", path, r#"{"value": 1}"#).await;
        assert!(status.contains(" 400 "), "{path}: {status} {body}");
    }
    api.get(follower, "/v1/kv/dots/b")
        .await
        .expect_problem(404, ErrorCode::NotFound);
}

/// A path under a live subtree lease reads as held by it, and its fence is current there.
#[tokio::test]
async fn a_path_under_a_subtree_lease_answers_the_covering_lease() {
    let cluster = Cluster::start(1).await;
    let node = cluster.node(1);
    let api = cluster.api();
    let grant: Grant = api
        .post(
            node,
            "/v1/leases",
            &json!({"resource": "repo/src", "holder": "agent-a", "ttl_ms": 60_000, "mode": "subtree"}),
        )
        .await
        .expect_json(201);
    let covered = api.get(node, "/v1/leases/repo/src/auth/x.rs").await;
    let lease: Lease = covered.expect_json(200);
    assert_eq!(
        (lease.resource.as_str(), lease.fence, lease.covering),
        ("repo/src", grant.fence, true),
        "{covered}"
    );
    let own: Lease = api.get(node, "/v1/leases/repo/src").await.expect_json(200);
    assert!(!own.covering);
    let own_body = api.get(node, "/v1/leases/repo/src").await.body;
    assert!(own_body.get("covering").is_none(), "{own_body}");
    api.get(node, "/v1/leases/repo/srcx")
        .await
        .expect_problem(404, ErrorCode::NotFound);
    let check: FenceCheckResponse = api
        .post(
            node,
            "/v1/fence/check",
            &json!({"resource": "repo/src/auth/x.rs", "fence": grant.fence}),
        )
        .await
        .expect_json(200);
    assert_eq!((check.current, check.fence), (true, Some(grant.fence)));
    // Acquiring it is refused by that same lease.
    let denial = api
        .post(
            node,
            "/v1/leases",
            &json!({"resource": "repo/src/auth/x.rs", "holder": "agent-b", "ttl_ms": 60_000}),
        )
        .await
        .expect_problem(409, ErrorCode::LeaseHeld);
    assert_eq!(denial.held_by.map(|held| held.fence), Some(grant.fence));
}

/// `Last-Event-ID` wins over `after` (a browser reconnects with its first URL); a malformed
/// one, or a revision beyond the latest, is 400 instead of a silent replay from the start.
#[tokio::test]
async fn the_event_stream_takes_its_revision_from_last_event_id_and_checks_it() {
    let cluster = Cluster::start(1).await;
    let node = cluster.node(1);
    let api = cluster.api();
    for index in 0..3 {
        api.put(
            node,
            &format!("/v1/kv/ev/{index}"),
            &json!({"value": index}),
        )
        .await
        .expect_status(200);
    }
    let all: serde_json::Value = api.get(node, "/v1/events?after=0").await.expect_json(200);
    let revisions: Vec<u64> = all["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|event| event["revision"].as_u64().unwrap())
        .collect();
    assert!(revisions.len() >= 3, "{all}");
    let second = revisions[1];
    let resumed: serde_json::Value = api
        .call(Method::GET, node, "/v1/events?after=0")
        .header("last-event-id", &second.to_string())
        .send()
        .await
        .expect_json(200);
    assert_eq!(
        resumed["events"][0]["revision"].as_u64(),
        Some(revisions[2]),
        "Last-Event-ID wins: {resumed}"
    );
    for bad in ["abc", "-1", "1.5"] {
        api.call(Method::GET, node, "/v1/events")
            .header("last-event-id", bad)
            .send()
            .await
            .expect_problem(400, ErrorCode::InvalidArgument);
    }
    let latest = *revisions.last().unwrap();
    api.call(Method::GET, node, "/v1/events")
        .header("last-event-id", &(latest + 1_000).to_string())
        .send()
        .await
        .expect_problem(400, ErrorCode::InvalidArgument);
    api.get(node, &format!("/v1/events?after={}", u64::MAX))
        .await
        .expect_problem(400, ErrorCode::InvalidArgument);
}

/// `ready` is what claim-next could take; tasks held back by dependencies or delays are
/// `waiting`, in the counts and in the `state` filter.
#[tokio::test]
async fn tasks_held_back_are_waiting_not_ready() {
    let cluster = Cluster::start(1).await;
    let node = cluster.node(1);
    let api = cluster.api();
    for body in [
        json!({"id": "build", "payload": {}}),
        json!({"id": "deploy", "payload": {}, "depends_on": ["build"]}),
        json!({"id": "later", "payload": {}, "not_before_ms": 600_000}),
    ] {
        api.post(node, "/v1/queues/ci/tasks", &body)
            .await
            .expect_status(201);
    }
    let info: QueueInfo = api.get(node, "/v1/queues/ci").await.expect_json(200);
    assert_eq!((info.counts.ready, info.counts.waiting), (1, 2));
    let waiting: TaskList = api
        .get(node, "/v1/queues/ci/tasks?state=waiting")
        .await
        .expect_json(200);
    let ids: Vec<&str> = waiting.tasks.iter().map(|task| task.id.as_str()).collect();
    assert_eq!(ids, ["deploy", "later"]);
    let ready: TaskList = api
        .get(node, "/v1/queues/ci/tasks?state=ready")
        .await
        .expect_json(200);
    let ids: Vec<&str> = ready.tasks.iter().map(|task| task.id.as_str()).collect();
    assert_eq!(ids, ["build"]);
}

/// A session's leases are paged like every list.
#[tokio::test]
async fn a_session_get_is_paged() {
    let cluster = Cluster::start(1).await;
    let node = cluster.node(1);
    let api = cluster.api();
    let grant: Grant = api
        .post(
            node,
            "/v1/leases",
            &json!({"resource": "page/0", "holder": "agent-a", "ttl_ms": 60_000}),
        )
        .await
        .expect_json(201);
    let session = grant.session_id.as_str().to_owned();
    for index in 1..5 {
        api.post(
            node,
            "/v1/leases",
            &json!({"resource": format!("page/{index}"), "session_id": session}),
        )
        .await
        .expect_status(201);
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(cursor) => format!("/v1/sessions/{session}?limit=2&cursor={cursor}"),
            None => format!("/v1/sessions/{session}?limit=2"),
        };
        let info: SessionInfo = api.get(node, &path).await.expect_json(200);
        assert!(info.leases.len() <= 2);
        seen.extend(info.leases.into_iter().map(|lease| lease.resource));
        match info.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, ["page/0", "page/1", "page/2", "page/3", "page/4"]);
    api.get(node, &format!("/v1/sessions/{session}?limit=0"))
        .await
        .expect_problem(400, ErrorCode::InvalidArgument);
}

/// One process is never two members: another id with a member's addresses, or a member's id
/// with other addresses, is refused and the membership stays as it was.
#[tokio::test]
async fn membership_refuses_one_process_as_two_members() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let leader = cluster.leader().await;
    let third = cluster.node(3);
    let before: ClusterStatus = api.get(leader, "/v1/cluster").await.expect_json(200);
    let refused = [
        json!({"id": 5, "api_addr": third.api_addr(), "peer_addr": third.peer_addr()}),
        json!({"id": 5, "api_addr": "127.0.0.1:1", "peer_addr": third.peer_addr()}),
        json!({"id": 3, "api_addr": "127.0.0.1:1", "peer_addr": "127.0.0.1:2"}),
    ];
    for body in refused {
        api.post(leader, "/v1/cluster/members", &body)
            .await
            .expect_problem(400, ErrorCode::InvalidArgument);
    }
    // The same member with the same addresses is a no-op, not an error.
    api.post(
        leader,
        "/v1/cluster/members",
        &json!({"id": 3, "api_addr": third.api_addr(), "peer_addr": third.peer_addr()}),
    )
    .await
    .expect_status(200);
    let after: ClusterStatus = api.get(leader, "/v1/cluster").await.expect_json(200);
    assert_eq!(after.members, before.members);
}

/// A follower's own answers (a local route, a refusal it makes up) never show a cluster time
/// below one it already relayed from the leader.
#[tokio::test]
async fn a_follower_never_shows_an_older_cluster_time_than_it_relayed() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let follower = cluster.followers().await[0];
    for round in 0..20 {
        let relayed = api
            .put(follower, "/v1/kv/ct/x", &json!({"value": round}))
            .await;
        relayed.expect_status(200);
        for path in ["/v1/cluster", "/v1/no/such/route"] {
            let local = api.get(follower, path).await;
            assert!(
                local.cluster_time() >= relayed.cluster_time(),
                "round {round}: {path} showed {} after the relayed {}",
                local.cluster_time(),
                relayed.cluster_time()
            );
        }
    }
}
