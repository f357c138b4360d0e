//! The server as a process (docs/cli.md): `batond dev` starts a one-node cluster that
//! resumes from its data; SIGTERM shuts it down cleanly (exit status 0); the liveness and
//! metrics routes answer; and no session id ever reaches a log or a metric (docs/api.md:
//! logs and metric labels use the route pattern, never the raw path).

use std::time::Duration;

use baton_client::api::{Grant, KvEntry, Lease};
use baton_tests::{json, Cluster, Method};

#[tokio::test]
async fn dev_mode_serves_shuts_down_on_sigterm_and_resumes_from_its_data() {
    let cluster = Cluster::dev().await;
    let node = cluster.node(1);
    let api = cluster.api();

    api.get(node, "/healthz").await.expect_status(200);
    let grant: Grant = api
        .post(
            node,
            "/v1/leases",
            &json!({"resource": "repo/src/auth.rs", "holder": "agent-a", "ttl_ms": 60_000}),
        )
        .await
        .expect_json(201);
    let session = grant.session_id.as_str().to_owned();
    api.call(
        Method::POST,
        node,
        &format!("/v1/sessions/{session}/keepalive"),
    )
    .send()
    .await
    .expect_status(200);
    api.get(node, &format!("/v1/sessions/{session}"))
        .await
        .expect_status(200);
    api.put(
        node,
        "/v1/kv/notes",
        &json!({"value": "kept", "fence": {"resource": "repo/src/auth.rs", "token": grant.fence},
                "session_id": session}),
    )
    .await
    .expect_status(200);

    let metrics = api.get(node, "/metrics").await;
    metrics.expect_status(200);
    assert!(!metrics.text.trim().is_empty(), "empty /metrics");
    assert!(
        !metrics.text.contains(&session),
        "/metrics shows a session id"
    );

    let status = node.terminate().await;
    assert!(
        status.success(),
        "SIGTERM must shut down cleanly, got {status}"
    );

    node.restart();
    cluster.wait_ready(Duration::from_secs(20)).await;
    let lease: Lease = api
        .get(node, "/v1/leases/repo/src/auth.rs")
        .await
        .expect_json(200);
    assert_eq!(
        (lease.holder.as_str(), lease.fence),
        ("agent-a", grant.fence)
    );
    let entry: KvEntry = api.get(node, "/v1/kv/notes").await.expect_json(200);
    assert_eq!(entry.value, json!("kept"));
    api.call(
        Method::POST,
        node,
        &format!("/v1/sessions/{session}/keepalive"),
    )
    .send()
    .await
    .expect_status(200);

    let log = std::fs::read_to_string(node.log_path()).expect("the node log");
    assert!(
        !log.contains(&session),
        "the node log contains a session id (it must log route patterns, not paths)"
    );
}
