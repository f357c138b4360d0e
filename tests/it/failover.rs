//! Failover and durability (G3, G5): after a SIGKILL of the leader a new leader serves writes
//! within a bounded time with every acknowledged lease, session, fence and value intact and
//! fences still rising; after a SIGKILL of all three nodes at once and a restart, the same
//! holds, and a held resource is still refused. SIGTERM of a leader hands leadership over
//! before it exits.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use baton_client::api::{
    CreateSessionResponse, ErrorCode, FenceRef, Grant, KvEntry, Lease, SessionInfo,
};
use baton_tests::{idempotency_key, json, Cluster, Method, Node, Value};

/// Long enough that no lease of this test expires, leaderless gaps included.
const TTL_MS: u64 = 60_000;
/// The bound on a failover: election timeout 300..600 ms, plus a loaded machine.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(10);
/// The bound on a restart of every node.
const RESTART_TIMEOUT: Duration = Duration::from_secs(20);

/// What the cluster acknowledged, to be found again after each fault.
#[derive(Debug, Default)]
struct Acknowledged {
    /// resource -> (holder, fence)
    leases: BTreeMap<String, (String, u64)>,
    /// key -> (value, fence)
    values: BTreeMap<String, (Value, Option<FenceRef>)>,
    /// session id -> resources it holds
    sessions: BTreeMap<String, Vec<String>>,
    highest_fence: u64,
}

impl Acknowledged {
    fn granted(&mut self, grant: &Grant) {
        assert!(
            grant.fence > self.highest_fence,
            "fence {} after {}: fences must rise (G3)",
            grant.fence,
            self.highest_fence
        );
        self.highest_fence = grant.fence;
        self.leases
            .insert(grant.resource.clone(), (grant.holder.clone(), grant.fence));
        let held = self
            .sessions
            .entry(grant.session_id.as_str().to_owned())
            .or_default();
        held.push(grant.resource.clone());
        held.sort();
    }

    fn wrote(&mut self, key: &str, value: Value, fence: Option<FenceRef>) {
        self.values.insert(key.to_owned(), (value, fence));
    }

    /// Reads everything back through `node` (linearizable reads) and checks it.
    async fn check_through(&self, cluster: &Cluster, node: &Node) {
        let api = cluster.api();
        for (resource, (holder, fence)) in &self.leases {
            let reply = api.get(node, &format!("/v1/leases/{resource}")).await;
            let lease: Lease = reply.expect_json(200);
            assert_eq!(
                (&lease.holder, lease.fence),
                (holder, *fence),
                "node {}: {reply}",
                node.id
            );
        }
        for (key, (value, fence)) in &self.values {
            let reply = api.get(node, &format!("/v1/kv/{key}")).await;
            let entry: KvEntry = reply.expect_json(200);
            assert_eq!(
                (&entry.value, &entry.fence),
                (value, fence),
                "node {}: {reply}",
                node.id
            );
        }
        for (session, resources) in &self.sessions {
            let reply = api.get(node, &format!("/v1/sessions/{session}")).await;
            let info: SessionInfo = reply.expect_json(200);
            let mut held: Vec<String> = info
                .leases
                .into_iter()
                .map(|lease| lease.resource)
                .collect();
            held.sort();
            assert_eq!(&held, resources, "node {}: {reply}", node.id);
        }
        // A held resource is still refused, naming the same fence.
        for (resource, (holder, fence)) in &self.leases {
            let reply = api
                .post(
                    node,
                    "/v1/leases",
                    &json!({"resource": resource, "holder": "intruder", "ttl_ms": TTL_MS}),
                )
                .await;
            let held_by = reply
                .expect_problem(409, ErrorCode::LeaseHeld)
                .held_by
                .expect("held_by");
            assert_eq!(
                (&held_by.holder, held_by.fence),
                (holder, *fence),
                "{reply}"
            );
        }
    }
}

#[tokio::test]
async fn leader_failover_and_a_full_restart_keep_every_acknowledged_write() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let mut acknowledged = Acknowledged::default();

    // Acknowledged state: a session with two leases, a subtree lease, an unfenced and a fenced
    // value.
    let leader = cluster.leader().await;
    let session: CreateSessionResponse = api
        .post(
            leader,
            "/v1/sessions",
            &json!({"holder": "worker-a", "ttl_ms": TTL_MS}),
        )
        .await
        .expect_json(201);
    let session_a = session.session_id.as_str().to_owned();
    for resource in ["jobs/1", "jobs/2"] {
        let grant: Grant = api
            .post(
                leader,
                "/v1/leases",
                &json!({"resource": resource, "session_id": session_a}),
            )
            .await
            .expect_json(201);
        acknowledged.granted(&grant);
    }
    let data: Grant = api
        .post(
            leader,
            "/v1/leases",
            &json!({"resource": "data", "mode": "subtree", "holder": "worker-b",
                    "ttl_ms": TTL_MS}),
        )
        .await
        .expect_json(201);
    acknowledged.granted(&data);
    let session_b = data.session_id.as_str().to_owned();
    api.put(
        leader,
        "/v1/kv/config/x",
        &json!({"value": {"replicas": 3}}),
    )
    .await
    .expect_status(200);
    acknowledged.wrote("config/x", json!({"replicas": 3}), None);
    let data_fence = FenceRef {
        resource: "data".to_owned(),
        token: data.fence,
    };
    api.put(
        leader,
        "/v1/kv/data/file",
        &json!({"value": "v1", "fence": data_fence, "session_id": session_b}),
    )
    .await
    .expect_status(200);
    acknowledged.wrote("data/file", json!("v1"), Some(data_fence.clone()));

    // SIGKILL the leader; the survivors elect another and serve a write.
    let killed = leader.id;
    leader.kill();
    let survivors = cluster.live_nodes();
    // One Idempotency-Key for every attempt: a retry after OUTCOME_UNKNOWN applies it once.
    let key = idempotency_key();
    let body = json!({"resource": "jobs/after-failover", "holder": "worker-c", "ttl_ms": TTL_MS});
    let (reply, failover) = cluster
        .retry_until_acknowledged(&survivors, FAILOVER_TIMEOUT, |node| {
            api.call(Method::POST, node, "/v1/leases")
                .idempotency_key(&key)
                .json(&body)
        })
        .await;
    eprintln!(
        "failover: a write was acknowledged {failover:?} after SIGKILL of leader node {killed}"
    );
    assert!(failover < FAILOVER_TIMEOUT, "failover took {failover:?}");
    acknowledged.granted(&reply.parse::<Grant>());
    let new_leader = cluster.leader().await;
    assert_ne!(new_leader.id, killed);
    for node in &survivors {
        acknowledged.check_through(&cluster, node).await;
    }

    // The killed node comes back and catches up; more writes are acknowledged.
    cluster.node(killed).restart();
    cluster.wait_ready(RESTART_TIMEOUT).await;
    acknowledged
        .check_through(&cluster, cluster.node(killed))
        .await;
    let grant: Grant = api
        .post(
            cluster.node(killed),
            "/v1/leases",
            &json!({"resource": "jobs/3", "session_id": session_a}),
        )
        .await
        .expect_json(201);
    acknowledged.granted(&grant);
    api.put(
        cluster.node(killed),
        "/v1/kv/data/file",
        &json!({"value": "v2", "fence": data_fence, "session_id": session_b}),
    )
    .await
    .expect_status(200);
    acknowledged.wrote("data/file", json!("v2"), Some(data_fence.clone()));

    // SIGKILL all three at once, restart them all: everything acknowledged is back.
    cluster.kill_all();
    let restarted = Instant::now();
    cluster.restart_all();
    cluster.wait_ready(RESTART_TIMEOUT).await;
    eprintln!(
        "failover: all three nodes were ready {:?} after a restart",
        restarted.elapsed()
    );
    for node in cluster.nodes() {
        acknowledged.check_through(&cluster, node).await;
    }
    // The sessions are alive, their fences still write, and fences still rise.
    for session in [&session_a, &session_b] {
        api.call(
            Method::POST,
            cluster.node(1),
            &format!("/v1/sessions/{session}/keepalive"),
        )
        .send()
        .await
        .expect_status(200);
    }
    api.put(
        cluster.node(2),
        "/v1/kv/data/file",
        &json!({"value": "v3", "fence": data_fence, "session_id": session_b}),
    )
    .await
    .expect_status(200);
    let after_restart: Grant = api
        .post(
            cluster.node(3),
            "/v1/leases",
            &json!({"resource": "jobs/after-restart", "holder": "worker-d", "ttl_ms": TTL_MS}),
        )
        .await
        .expect_json(201);
    acknowledged.granted(&after_restart);
}

/// The leader each live node names in `/v1/cluster`.
async fn named_leaders(cluster: &Cluster) -> Vec<(u64, Option<u64>)> {
    let mut named = Vec::new();
    for node in cluster.live_nodes() {
        let status: Value = cluster
            .api()
            .get(node, "/v1/cluster")
            .await
            .expect_json(200);
        named.push((node.id, status["leader_id"].as_u64()));
    }
    named
}

/// SIGTERM of the leader hands leadership over before the process exits (docs/guarantees.md,
/// "Graceful stop"): it exits 0 with another node already leading, so writes pause for the
/// hand-over, not for an election timeout, and nothing acknowledged is lost. SIGTERM of a
/// follower exits 0 at once; a leader whose followers are gone exits 0 within the bound.
#[tokio::test]
async fn a_sigterm_of_the_leader_hands_leadership_over_before_it_exits() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let leader = cluster.leader().await;
    api.put(leader, "/v1/kv/handed/over", &json!({"value": 1}))
        .await
        .expect_status(200);
    let stopped = leader.id;
    let status = leader.terminate().await;
    assert!(status.success(), "{status:?}");
    assert!(
        leader.log_tail(200).contains("leadership handed over"),
        "{}",
        leader.log_tail(40)
    );
    // At the old leader's exit a survivor already leads, and says so.
    let named = named_leaders(&cluster).await;
    let successor = named
        .iter()
        .find(|(id, leader)| Some(*id) == *leader)
        .map(|(id, _)| *id);
    assert!(
        successor.is_some_and(|id| id != stopped),
        "no survivor leads at the old leader's exit: {named:?}"
    );
    let successor = cluster.node(successor.expect("a successor"));
    let entry: KvEntry = api
        .get(successor, "/v1/kv/handed/over")
        .await
        .expect_json(200);
    assert_eq!(entry.value, json!(1));

    // A follower's SIGTERM: exit 0 at once.
    cluster.node(stopped).restart();
    cluster.wait_ready(RESTART_TIMEOUT).await;
    let follower = cluster.followers().await[0];
    let started = Instant::now();
    assert!(follower.terminate().await.success());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    follower.restart();
    cluster.wait_ready(RESTART_TIMEOUT).await;

    // A leader whose followers are gone cannot hand over: it still exits 0, within the bound.
    let leader = cluster.leader().await;
    for follower in cluster.followers().await {
        follower.kill();
    }
    assert!(leader.terminate().await.success());
}
