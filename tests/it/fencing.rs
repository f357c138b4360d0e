//! Fenced writes (G4) in Kleppmann's scenario: client 1 holds a lease, goes silent past its
//! TTL (a GC pause), client 2 takes the lease, and client 1's late write with its old fence is
//! refused with `STALE_FENCE` and changes nothing; so is a write that pairs a live fence with
//! the wrong session. Runs on three nodes, each client talking to its own node.

use std::time::Duration;

use baton_client::api::{ErrorCode, FenceRef, Grant, KvEntry, KvPutResponse};
use baton_tests::{json, poll_until, Cluster, HttpReply, Method, Node, Value};

const RESOURCE: &str = "storage/file-17";
const KEY: &str = "storage/file-17/contents";

async fn put(cluster: &Cluster, node: &Node, body: Value) -> HttpReply {
    cluster
        .api()
        .put(node, &format!("/v1/kv/{KEY}"), &body)
        .await
}

fn fenced(value: &str, token: u64, session: &str) -> Value {
    json!({"value": value, "fence": {"resource": RESOURCE, "token": token},
           "session_id": session})
}

async fn read(cluster: &Cluster, node: &Node) -> KvEntry {
    cluster
        .api()
        .get(node, &format!("/v1/kv/{KEY}"))
        .await
        .expect_json(200)
}

fn expect_stale(reply: &HttpReply, live_fence: u64) {
    let problem = reply.expect_problem(409, ErrorCode::StaleFence);
    assert_eq!(
        problem.current_fence,
        Some(live_fence),
        "STALE_FENCE names the live fence: {reply}"
    );
}

#[tokio::test]
async fn a_paused_holder_with_an_expired_lease_cannot_write_after_the_next_holder() {
    let cluster = Cluster::start(3).await;
    let (client_1, client_2, reader) = (cluster.node(1), cluster.node(2), cluster.node(3));

    let lease_1: Grant = cluster
        .api()
        .post(
            client_1,
            "/v1/leases",
            &json!({"resource": RESOURCE, "holder": "client-1", "ttl_ms": 1_000}),
        )
        .await
        .expect_json(201);
    let session_1 = lease_1.session_id.as_str().to_owned();
    let written_1: KvPutResponse = put(
        &cluster,
        client_1,
        fenced("by client 1", lease_1.fence, &session_1),
    )
    .await
    .expect_json(200);
    let entry = read(&cluster, reader).await;
    assert_eq!(entry.value, json!("by client 1"));
    assert_eq!(entry.revision, written_1.revision);
    assert_eq!(
        entry.fence,
        Some(FenceRef {
            resource: RESOURCE.to_owned(),
            token: lease_1.fence
        })
    );

    // Client 1 pauses: no keepalive. Client 2 polls until the lease expires and is granted.
    let lease_2: Grant = poll_until(
        Duration::from_secs(4),
        "client 2 to get the lease",
        async || {
            let reply = cluster
                .api()
                .post(
                    client_2,
                    "/v1/leases",
                    &json!({"resource": RESOURCE, "holder": "client-2", "ttl_ms": 30_000}),
                )
                .await;
            if reply.status == 201 {
                return Some(reply.parse());
            }
            reply.expect_problem(409, ErrorCode::LeaseHeld);
            None
        },
    )
    .await;
    assert!(lease_2.fence > lease_1.fence);
    let session_2 = lease_2.session_id.as_str().to_owned();

    // Client 1 wakes up and writes with its old fence: refused, nothing changes.
    expect_stale(
        &put(
            &cluster,
            client_1,
            fenced("late write by client 1", lease_1.fence, &session_1),
        )
        .await,
        lease_2.fence,
    );
    // The live fence with the wrong session: refused (the session id proves the holder).
    expect_stale(
        &put(
            &cluster,
            client_1,
            fenced("borrowed fence", lease_2.fence, &session_1),
        )
        .await,
        lease_2.fence,
    );
    // The old fence with the live session: refused.
    expect_stale(
        &put(
            &cluster,
            client_2,
            fenced("old token", lease_1.fence, &session_2),
        )
        .await,
        lease_2.fence,
    );
    let entry = read(&cluster, reader).await;
    assert_eq!(
        (entry.value, entry.revision),
        (json!("by client 1"), written_1.revision),
        "a refused write changed the value"
    );

    // Client 2's write lands and reads back with its fence, from any node.
    let written_2: KvPutResponse = put(
        &cluster,
        client_2,
        fenced("by client 2", lease_2.fence, &session_2),
    )
    .await
    .expect_json(200);
    assert!(written_2.revision > written_1.revision);
    for node in cluster.nodes() {
        let entry = read(&cluster, node).await;
        assert_eq!(entry.key, KEY);
        assert_eq!(entry.value, json!("by client 2"));
        assert_eq!(entry.revision, written_2.revision);
        assert_eq!(
            entry.fence,
            Some(FenceRef {
                resource: RESOURCE.to_owned(),
                token: lease_2.fence
            })
        );
    }

    // Client 1 tries again, and tries to delete: refused, the value stays.
    expect_stale(
        &put(
            &cluster,
            client_1,
            fenced("again", lease_1.fence, &session_1),
        )
        .await,
        lease_2.fence,
    );
    let delete = cluster
        .api()
        .call(Method::DELETE, client_1, &format!("/v1/kv/{KEY}"))
        .json(
            &json!({"fence": {"resource": RESOURCE, "token": lease_1.fence},
                      "session_id": session_1}),
        )
        .send()
        .await;
    expect_stale(&delete, lease_2.fence);
    // A fence on a resource nobody holds is not live either, whoever sends it.
    let unheld = put(
        &cluster,
        client_2,
        json!({"value": "x", "fence": {"resource": "storage/unheld", "token": lease_2.fence},
               "session_id": session_2}),
    )
    .await;
    unheld.expect_problem(409, ErrorCode::StaleFence);
    let entry = read(&cluster, reader).await;
    assert_eq!(
        (entry.value, entry.revision),
        (json!("by client 2"), written_2.revision)
    );

    // Client 2's fenced delete works.
    cluster
        .api()
        .call(Method::DELETE, client_2, &format!("/v1/kv/{KEY}"))
        .json(
            &json!({"fence": {"resource": RESOURCE, "token": lease_2.fence},
                      "session_id": session_2}),
        )
        .send()
        .await
        .expect_status(200);
    cluster
        .api()
        .get(reader, &format!("/v1/kv/{KEY}"))
        .await
        .expect_problem(404, ErrorCode::NotFound);
}

#[tokio::test]
async fn unfenced_writes_are_unconditional_and_revisions_rise() {
    let cluster = Cluster::start(1).await;
    let node = cluster.node(1);
    let api = cluster.api();
    let mut last_revision = 0;
    for value in [json!(1), json!({"nested": [true, null]}), json!("three")] {
        let written: KvPutResponse = api
            .put(node, "/v1/kv/config/app", &json!({"value": value}))
            .await
            .expect_json(200);
        assert!(written.revision > last_revision);
        last_revision = written.revision;
        let entry: KvEntry = api.get(node, "/v1/kv/config/app").await.expect_json(200);
        assert_eq!(
            (entry.value, entry.revision, entry.fence),
            (value, last_revision, None)
        );
    }
    api.delete(node, "/v1/kv/config/app")
        .await
        .expect_status(200);
    api.get(node, "/v1/kv/config/app")
        .await
        .expect_problem(404, ErrorCode::NotFound);
}
