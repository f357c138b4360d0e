//! Lease lifecycle over HTTP on a one-node cluster: grant, denial with `held_by`, keepalive,
//! release, re-grant with a higher fence, the G2 conflict rules of subtree leases, reads and
//! lists, fence checks, sessions, and namespaces.

use baton_client::api::{
    CreateSessionResponse, EndSessionResponse, ErrorCode, FenceCheckResponse, Grant,
    KeepaliveResponse, Lease, LeaseList, LeaseMode, SessionInfo,
};
use baton_tests::{is_session_id, json, mentions_number, Cluster, HttpReply, Method, Value};

const TTL_MS: u64 = 30_000;

async fn acquire(cluster: &Cluster, body: Value) -> HttpReply {
    cluster
        .api()
        .post(cluster.node(1), "/v1/leases", &body)
        .await
}

async fn grant(cluster: &Cluster, body: Value) -> Grant {
    acquire(cluster, body).await.expect_json(201)
}

#[tokio::test]
async fn a_lease_is_granted_denied_renewed_released_and_granted_again_with_a_higher_fence() {
    let cluster = Cluster::start(1).await;
    let api = cluster.api();
    let node = cluster.node(1);
    let resource = "repo/src/auth.rs";

    let reply = acquire(
        &cluster,
        json!({"resource": resource, "holder": "agent-a", "ttl_ms": TTL_MS,
               "labels": {"task": "refactor"}}),
    )
    .await;
    reply.expect_status(201).expect_baton_headers();
    assert_eq!(reply.leader(), Some(1), "{reply}");
    let first: Grant = reply.parse();
    assert!(first.fence >= 1, "{reply}");
    assert!(is_session_id(first.session_id.as_str()), "{reply}");
    assert_eq!(first.resource, resource);
    assert_eq!(first.holder, "agent-a");
    assert_eq!(first.mode, LeaseMode::Exclusive, "exclusive is the default");
    assert_eq!(
        first.labels.get("task").map(String::as_str),
        Some("refactor")
    );
    assert!(
        first.expires_in_ms > 0 && first.expires_in_ms <= TTL_MS,
        "{reply}"
    );
    assert!(!first.acquired_at.is_empty() && !first.expires_at.is_empty());
    let session = first.session_id.as_str().to_owned();

    // Another holder is denied, and told who holds it, with which fence, for how long; never
    // the holder's session id.
    let denial = acquire(
        &cluster,
        json!({"resource": resource, "holder": "agent-b", "ttl_ms": TTL_MS}),
    )
    .await;
    let problem = denial.expect_problem(409, ErrorCode::LeaseHeld);
    let held_by = problem.held_by.clone().expect("LEASE_HELD carries held_by");
    assert_eq!(held_by.holder, "agent-a");
    assert_eq!(held_by.resource, resource);
    assert_eq!(held_by.fence, first.fence);
    assert_eq!(held_by.mode, LeaseMode::Exclusive);
    assert!(held_by.expires_in_ms > 0 && held_by.expires_in_ms <= TTL_MS);
    assert!(
        problem.message.contains("agent-a") && mentions_number(&problem.message, first.fence),
        "the message names the holder and the fence: {denial}"
    );
    assert!(problem.message.contains(resource), "{denial}");
    assert!(
        !denial.text.contains(&session),
        "a denial leaks the session id: {denial}"
    );

    // Re-acquiring with one's own session is LEASE_HELD too (docs/guarantees.md, "Semantics").
    let again = acquire(
        &cluster,
        json!({"resource": resource, "session_id": session}),
    )
    .await;
    let problem = again.expect_problem(409, ErrorCode::LeaseHeld);
    assert_eq!(problem.held_by.expect("held_by").fence, first.fence);

    // Keepalive renews the session.
    let keepalive: KeepaliveResponse = api
        .call(
            Method::POST,
            node,
            &format!("/v1/sessions/{session}/keepalive"),
        )
        .send()
        .await
        .expect_json(200);
    assert_eq!(keepalive.session_id.as_str(), session);
    assert!(keepalive.expires_in_ms > 0 && keepalive.expires_in_ms <= TTL_MS);

    // The lease reads back, without its session id.
    let read = api.get(node, &format!("/v1/leases/{resource}")).await;
    let lease: Lease = read.expect_json(200);
    assert_eq!(
        (lease.fence, lease.holder.as_str(), lease.mode),
        (first.fence, "agent-a", LeaseMode::Exclusive)
    );
    assert!(
        !read.text.contains("session_id") && !read.text.contains(&session),
        "{read}"
    );

    let info: SessionInfo = api
        .get(node, &format!("/v1/sessions/{session}"))
        .await
        .expect_json(200);
    assert_eq!(info.holder, "agent-a");
    assert_eq!(info.ttl_ms, TTL_MS);
    assert_eq!(
        info.leases
            .iter()
            .map(|lease| (lease.resource.as_str(), lease.fence))
            .collect::<Vec<_>>(),
        [(resource, first.fence)]
    );

    // Release frees it at once.
    api.post(
        node,
        &format!("/v1/sessions/{session}/release"),
        &json!({"resource": resource}),
    )
    .await
    .expect_status(200)
    .expect_baton_headers();
    api.get(node, &format!("/v1/leases/{resource}"))
        .await
        .expect_problem(404, ErrorCode::NotFound);
    // Releasing what the (live) session no longer holds: LEASE_LOST.
    api.post(
        node,
        &format!("/v1/sessions/{session}/release"),
        &json!({"resource": resource}),
    )
    .await
    .expect_problem(409, ErrorCode::LeaseLost);

    let second = grant(
        &cluster,
        json!({"resource": resource, "holder": "agent-b", "ttl_ms": TTL_MS}),
    )
    .await;
    assert!(
        second.fence > first.fence,
        "fences rise: {} then {}",
        first.fence,
        second.fence
    );
    assert_ne!(second.session_id, first.session_id);
    // The first session is alive but is now the one denied.
    let denial = acquire(
        &cluster,
        json!({"resource": resource, "session_id": session}),
    )
    .await;
    let held_by = denial
        .expect_problem(409, ErrorCode::LeaseHeld)
        .held_by
        .expect("held_by");
    assert_eq!(
        (held_by.holder.as_str(), held_by.fence),
        ("agent-b", second.fence)
    );
}

#[tokio::test]
async fn subtree_leases_conflict_with_everything_below_and_above_them() {
    let cluster = Cluster::start(1).await;
    let mut highest_fence = 0;
    let mut check_rises = |grant: &Grant| {
        assert!(
            grant.fence > highest_fence,
            "fence {} after {highest_fence}",
            grant.fence
        );
        highest_fence = grant.fence;
    };

    let subtree = grant(
        &cluster,
        json!({"resource": "t/a", "mode": "subtree", "holder": "x", "ttl_ms": TTL_MS}),
    )
    .await;
    assert_eq!(subtree.mode, LeaseMode::Subtree);
    check_rises(&subtree);

    // (mode, resource) that conflict with the subtree lease on t/a.
    let refused = [
        ("exclusive", "t/a"),
        ("exclusive", "t/a/b"),
        ("exclusive", "t/a/b/c"),
        ("subtree", "t/a"),
        ("subtree", "t/a/b"),
        ("subtree", "t"),
    ];
    for (mode, resource) in refused {
        let reply = acquire(
            &cluster,
            json!({"resource": resource, "mode": mode, "holder": "y", "ttl_ms": TTL_MS}),
        )
        .await;
        let held_by = reply
            .expect_problem(409, ErrorCode::LeaseHeld)
            .held_by
            .unwrap_or_else(|| panic!("no held_by: {reply}"));
        assert_eq!(
            (held_by.resource.as_str(), held_by.mode, held_by.fence),
            ("t/a", LeaseMode::Subtree, subtree.fence),
            "{mode} {resource}: {reply}"
        );
    }

    // An exclusive lease on a parent covers only that path; a sibling whose name merely starts
    // with the same characters is another path.
    for resource in ["t", "t/ab", "t/b"] {
        let granted = grant(
            &cluster,
            json!({"resource": resource, "holder": "y", "ttl_ms": TTL_MS}),
        )
        .await;
        check_rises(&granted);
    }

    // A subtree lease conflicts with an exclusive lease below it; `a/b` and `a/bc` do not.
    let below = grant(
        &cluster,
        json!({"resource": "v/a/b", "holder": "x", "ttl_ms": TTL_MS}),
    )
    .await;
    check_rises(&below);
    let reply = acquire(
        &cluster,
        json!({"resource": "v/a", "mode": "subtree", "holder": "y", "ttl_ms": TTL_MS}),
    )
    .await;
    let held_by = reply
        .expect_problem(409, ErrorCode::LeaseHeld)
        .held_by
        .expect("held_by");
    assert_eq!(
        (held_by.resource.as_str(), held_by.fence),
        ("v/a/b", below.fence)
    );
    for (mode, resource) in [("exclusive", "v/a/bc"), ("subtree", "v/a/bcd")] {
        let granted = grant(
            &cluster,
            json!({"resource": resource, "mode": mode, "holder": "y", "ttl_ms": TTL_MS}),
        )
        .await;
        check_rises(&granted);
    }

    // Once the subtree lease is released, what it covered is free.
    cluster
        .api()
        .post(
            cluster.node(1),
            &format!("/v1/sessions/{}/release", subtree.session_id.as_str()),
            &json!({"resource": "t/a"}),
        )
        .await
        .expect_status(200);
    let freed = grant(
        &cluster,
        json!({"resource": "t/a/b", "holder": "y", "ttl_ms": TTL_MS}),
    )
    .await;
    check_rises(&freed);
}

#[tokio::test]
async fn leases_are_read_one_by_one_and_listed_by_prefix_in_pages() {
    let cluster = Cluster::start(1).await;
    let api = cluster.api();
    let node = cluster.node(1);
    let first = grant(
        &cluster,
        json!({"resource": "proj/a", "holder": "lister", "ttl_ms": TTL_MS}),
    )
    .await;
    let session = first.session_id.as_str().to_owned();
    let mut fences = vec![("proj/a".to_owned(), first.fence)];
    for resource in ["proj/b/c", "proj/b/d", "other/z"] {
        let granted = grant(
            &cluster,
            json!({"resource": resource, "session_id": session}),
        )
        .await;
        assert_eq!(granted.holder, "lister");
        assert_eq!(granted.session_id.as_str(), session);
        fences.push((resource.to_owned(), granted.fence));
    }
    fences.sort();

    let read: Lease = api.get(node, "/v1/leases/proj/b/c").await.expect_json(200);
    assert_eq!(read.resource, "proj/b/c");
    // A prefix of held paths is not itself held.
    api.get(node, "/v1/leases/proj")
        .await
        .expect_problem(404, ErrorCode::NotFound);

    let list = |query: &'static str| async move {
        let reply = api.get(node, &format!("/v1/leases{query}")).await;
        assert!(
            !reply.text.contains("session_id"),
            "a list leaks session ids: {reply}"
        );
        let list: LeaseList = reply.expect_json(200);
        list
    };
    let resources = |list: &LeaseList| -> Vec<(String, u64)> {
        list.leases
            .iter()
            .map(|lease| (lease.resource.clone(), lease.fence))
            .collect()
    };

    let all = list("").await;
    assert_eq!(resources(&all), fences, "every lease, in resource order");
    assert_eq!(all.next_cursor, None);
    let proj = list("?prefix=proj").await;
    assert_eq!(
        resources(&proj),
        fences
            .iter()
            .filter(|(resource, _)| resource.starts_with("proj/"))
            .cloned()
            .collect::<Vec<_>>()
    );
    let proj_b = list("?prefix=proj/b").await;
    assert_eq!(
        resources(&proj_b)
            .into_iter()
            .map(|(resource, _)| resource)
            .collect::<Vec<_>>(),
        ["proj/b/c", "proj/b/d"]
    );
    assert!(list("?prefix=nothing").await.leases.is_empty());

    // Pages of two, following next_cursor, give the same list.
    let mut paged = Vec::new();
    let mut page = list("?limit=2").await;
    assert_eq!(page.leases.len(), 2);
    assert!(
        page.next_cursor.is_some(),
        "more leases follow the first page"
    );
    for _ in 0..10 {
        paged.extend(resources(&page));
        let Some(cursor) = page.next_cursor.clone() else {
            break;
        };
        let reply = api
            .get(node, &format!("/v1/leases?limit=2&cursor={cursor}"))
            .await;
        page = reply.expect_json(200);
        assert!(page.leases.len() <= 2, "{reply}");
    }
    assert_eq!(paged, fences);
}

#[tokio::test]
async fn fence_check_tells_whether_a_token_is_the_live_fence() {
    let cluster = Cluster::start(1).await;
    let api = cluster.api();
    let node = cluster.node(1);
    let check = |resource: &'static str, fence: u64| async move {
        let reply = api
            .post(
                node,
                "/v1/fence/check",
                &json!({"resource": resource, "fence": fence}),
            )
            .await;
        reply.expect_baton_headers();
        let answer: FenceCheckResponse = reply.expect_json(200);
        (answer.current, answer.fence)
    };

    let first = grant(
        &cluster,
        json!({"resource": "db/orders", "holder": "migrator", "ttl_ms": TTL_MS}),
    )
    .await;
    assert_eq!(
        check("db/orders", first.fence).await,
        (true, Some(first.fence))
    );
    assert_eq!(
        check("db/orders", first.fence + 1).await,
        (false, Some(first.fence))
    );
    assert_eq!(check("db/none", first.fence).await, (false, None));

    api.post(
        node,
        &format!("/v1/sessions/{}/release", first.session_id.as_str()),
        &json!({"resource": "db/orders"}),
    )
    .await
    .expect_status(200);
    assert_eq!(check("db/orders", first.fence).await, (false, None));

    let second = grant(
        &cluster,
        json!({"resource": "db/orders", "holder": "migrator-2", "ttl_ms": TTL_MS}),
    )
    .await;
    assert!(second.fence > first.fence);
    assert_eq!(
        check("db/orders", first.fence).await,
        (false, Some(second.fence)),
        "an old token is not current"
    );
    assert_eq!(
        check("db/orders", second.fence).await,
        (true, Some(second.fence))
    );
}

#[tokio::test]
async fn a_session_holds_many_leases_and_ending_it_releases_them_all() {
    let cluster = Cluster::start(1).await;
    let api = cluster.api();
    let node = cluster.node(1);
    let reply = api
        .post(
            node,
            "/v1/sessions",
            &json!({"holder": "agent-s", "ttl_ms": TTL_MS, "labels": {"team": "infra"}}),
        )
        .await;
    let created: CreateSessionResponse = reply.expect_json(201);
    let session = created.session_id.as_str().to_owned();
    assert!(is_session_id(&session), "{reply}");
    assert_eq!(
        (created.holder.as_str(), created.ttl_ms),
        ("agent-s", TTL_MS)
    );
    assert!(created.expires_in_ms > 0 && created.expires_in_ms <= TTL_MS);

    for resource in ["s/1", "s/2"] {
        let granted = grant(
            &cluster,
            json!({"resource": resource, "session_id": session}),
        )
        .await;
        assert_eq!(granted.holder, "agent-s");
    }
    let info: SessionInfo = api
        .get(node, &format!("/v1/sessions/{session}"))
        .await
        .expect_json(200);
    let mut held: Vec<String> = info
        .leases
        .into_iter()
        .map(|lease| lease.resource)
        .collect();
    held.sort();
    assert_eq!(held, ["s/1", "s/2"]);

    let ended: EndSessionResponse = api
        .delete(node, &format!("/v1/sessions/{session}"))
        .await
        .expect_json(200);
    let mut released = ended.released;
    released.sort();
    assert_eq!(released, ["s/1", "s/2"]);

    for resource in ["s/1", "s/2"] {
        api.get(node, &format!("/v1/leases/{resource}"))
            .await
            .expect_problem(404, ErrorCode::NotFound);
    }
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
        &json!({"resource": "s/1"}),
    )
    .await
    .expect_problem(409, ErrorCode::LeaseLost);
    // Freed at once.
    grant(
        &cluster,
        json!({"resource": "s/1", "holder": "agent-t", "ttl_ms": TTL_MS}),
    )
    .await;
}

#[tokio::test]
async fn namespaces_are_isolated() {
    let cluster = Cluster::start(1).await;
    let api = cluster.api();
    let node = cluster.node(1);
    let body = |holder: &str| json!({"resource": "common/x", "holder": holder, "ttl_ms": TTL_MS});

    let in_default = grant(&cluster, body("agent-a")).await;
    let reply = api
        .call(Method::POST, node, "/v1/leases")
        .namespace("team-b")
        .json(&body("agent-b"))
        .send()
        .await;
    let in_team_b: Grant = reply.expect_json(201);
    assert!(
        in_team_b.fence > in_default.fence,
        "fences rise cluster-wide, across namespaces (docs/guarantees.md, Vocabulary)"
    );

    let list_in = |namespace: &'static str| async move {
        let list: LeaseList = api
            .call(Method::GET, node, "/v1/leases")
            .namespace(namespace)
            .send()
            .await
            .expect_json(200);
        list.leases
            .into_iter()
            .map(|lease| (lease.holder, lease.fence))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        list_in("default").await,
        [("agent-a".to_owned(), in_default.fence)]
    );
    assert_eq!(
        list_in("team-b").await,
        [("agent-b".to_owned(), in_team_b.fence)]
    );

    // A session lives in its namespace: elsewhere it is unknown, so it cannot be renewed.
    api.call(
        Method::POST,
        node,
        &format!("/v1/sessions/{}/keepalive", in_default.session_id.as_str()),
    )
    .namespace("team-b")
    .send()
    .await
    .expect_problem(409, ErrorCode::LeaseLost);
    // Keys are per namespace too.
    api.call(Method::PUT, node, "/v1/kv/config")
        .namespace("team-b")
        .json(&json!({"value": "b"}))
        .send()
        .await
        .expect_status(200);
    api.get(node, "/v1/kv/config")
        .await
        .expect_problem(404, ErrorCode::NotFound);
}
