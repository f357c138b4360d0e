//! Membership changes: a follower removed through `DELETE /v1/cluster/members/{id}` misses
//! enough writes that the leader would need a snapshot to catch it up; re-added with its data
//! dir untouched through `POST /v1/cluster/members`, it catches up to the very same state
//! machine (equal `/v1/debug/digest` at an equal applied index) and serves linearizable reads.
//! A member added at the addresses of another cluster's node never reaches that node.

use std::time::Duration;

use baton_client::api::{ClusterStatus, Digest, KvEntry};
use baton_tests::{idempotency_key, json, poll_until, Cluster, ClusterConfig, Method, Node};

/// Enough writes to pass the server's snapshot interval; each is one log entry at least.
const WRITES: usize = 50;
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(20);

async fn cluster_status(cluster: &Cluster, node: &Node) -> ClusterStatus {
    cluster
        .api()
        .get(node, "/v1/cluster")
        .await
        .expect_json(200)
}

/// Polls until `a` and `b` report the same applied index, then asserts equal digests there.
async fn wait_for_equal_digests(cluster: &Cluster, a: &Node, b: &Node) -> Digest {
    let api = cluster.api();
    poll_until(
        CATCH_UP_TIMEOUT,
        &format!(
            "nodes {} and {} to be at the same applied index",
            a.id, b.id
        ),
        async || {
            let (first, second) = tokio::join!(
                api.call(Method::GET, a, "/v1/debug/digest").try_send(),
                api.call(Method::GET, b, "/v1/debug/digest").try_send()
            );
            let (Ok(first), Ok(second)) = (first, second) else {
                return None;
            };
            let first: Digest = first.expect_json(200);
            let second: Digest = second.expect_json(200);
            assert_eq!((first.node_id, second.node_id), (a.id, b.id));
            if first.applied_index != second.applied_index {
                return None;
            }
            assert_eq!(
                (&first.digest, first.cluster_time_ms),
                (&second.digest, second.cluster_time_ms),
                "nodes {} and {} differ at applied index {}",
                a.id,
                b.id,
                first.applied_index
            );
            Some(first)
        },
    )
    .await
}

#[tokio::test]
async fn a_removed_follower_is_re_added_and_catches_up_to_the_same_state() {
    // Snapshot often, so that the removed node's missed entries are purged from the leader's
    // log and catching it up needs a snapshot install. (A `batond run` flag beyond docs/cli.md.)
    let mut config = ClusterConfig::new(3);
    config.extra_args = vec!["--snapshot-log-entries".to_owned(), "20".to_owned()];
    let cluster = Cluster::start_with(config).await;
    let api = cluster.api();
    let leader = cluster.leader().await;
    let followers = cluster.followers().await;
    let (removed, other) = (followers[0], followers[1]);

    // Membership calls and writes retry NO_LEADER (definitely not applied, docs/api.md): the
    // removed node, still running, may start an election that unsettles the leader.
    let (reply, _) = cluster
        .retry_until_acknowledged(&[leader, other], CATCH_UP_TIMEOUT, |node| {
            api.call(
                Method::DELETE,
                node,
                &format!("/v1/cluster/members/{}", removed.id),
            )
        })
        .await;
    reply.expect_status(200).expect_baton_headers();
    let status = cluster_status(&cluster, leader).await;
    assert!(
        status.members.iter().all(|member| member.id != removed.id),
        "node {} is still a member after its removal: {status:?}",
        removed.id
    );
    assert_eq!(status.members.len(), 2);

    // The two remaining nodes are a quorum of two: writes go on without the removed node.
    for index in 0..WRITES {
        let key = idempotency_key();
        cluster
            .retry_until_acknowledged(&[leader, other], CATCH_UP_TIMEOUT, |node| {
                api.call(Method::PUT, node, &format!("/v1/kv/mem/k{index}"))
                    .idempotency_key(&key)
                    .json(&json!({"value": index}))
            })
            .await
            .0
            .expect_status(200);
    }
    let key = idempotency_key();
    cluster
        .retry_until_acknowledged(&[other, leader], CATCH_UP_TIMEOUT, |node| {
            api.call(Method::POST, node, "/v1/leases")
                .idempotency_key(&key)
                .json(&json!({"resource": "mem/lease", "holder": "agent-m", "ttl_ms": 60_000}))
        })
        .await
        .0
        .expect_status(201);

    // Re-add it, data dir untouched. Catching up may take a snapshot install: allow time.
    let (reply, _) = cluster
        .retry_until_acknowledged(&[leader, other], CATCH_UP_TIMEOUT, |node| {
            api.call(Method::POST, node, "/v1/cluster/members")
                .json(&json!({"id": removed.id, "api_addr": removed.api_addr(),
                              "peer_addr": removed.peer_addr()}))
                .timeout(CATCH_UP_TIMEOUT)
        })
        .await;
    reply.expect_status(200).expect_baton_headers();
    poll_until(
        CATCH_UP_TIMEOUT,
        &format!("node {} to be a voter again", removed.id),
        async || {
            // Asked of the two members: the re-added node may not know the leader yet.
            let (first, second) = tokio::join!(
                cluster_status(&cluster, leader),
                cluster_status(&cluster, other)
            );
            let status = [first, second]
                .into_iter()
                .find(|status| status.leader_id == Some(status.node_id))?;
            let member = status
                .members
                .iter()
                .find(|member| member.id == removed.id)?;
            assert_eq!(
                (member.api_addr.as_str(), member.peer_addr.as_str()),
                (removed.api_addr().as_str(), removed.peer_addr().as_str())
            );
            member.voter.then_some(())
        },
    )
    .await;

    let leader = cluster.leader().await;
    let digest = wait_for_equal_digests(&cluster, leader, removed).await;
    eprintln!(
        "membership: node {} matches the leader at applied index {}",
        removed.id, digest.applied_index
    );
    wait_for_equal_digests(&cluster, removed, other).await;

    // It serves linearizable reads and forwards writes.
    let last = format!("/v1/kv/mem/k{}", WRITES - 1);
    let entry: KvEntry = api.get(removed, &last).await.expect_json(200);
    assert_eq!(entry.value, json!(WRITES - 1));
    api.get(removed, "/v1/leases/mem/lease")
        .await
        .expect_status(200);
    api.put(removed, "/v1/kv/mem/after", &json!({"value": "back"}))
        .await
        .expect_status(200);
    let entry: KvEntry = api.get(other, "/v1/kv/mem/after").await.expect_json(200);
    assert_eq!(entry.value, json!("back"));
}

/// A member added at another cluster's node (a mistyped address, or a replaced cluster's node
/// still running where the new one lives) never reaches that node's Raft: the node refuses
/// every request that names another cluster, and its own cluster goes on as before, in the same
/// term, with that node's state equal to its leader's.
#[tokio::test]
async fn a_member_added_at_another_clusters_node_never_reaches_it() {
    let ours = Cluster::start(3).await;
    let theirs = Cluster::start(3).await;
    for n in 0..5 {
        theirs
            .api()
            .put(
                theirs.node(1 + n % 3),
                &format!("/v1/kv/theirs/{n}"),
                &json!({"value": n}),
            )
            .await
            .expect_status(200);
    }
    let their_leader = theirs.leader().await;
    let term_before = cluster_status(&theirs, their_leader).await.term;

    // Our node 3 is replaced by a "node 3" at the addresses of their node 3.
    let stranger = theirs.node(3);
    let api = ours.api();
    let ours_left: Vec<&Node> = ours.nodes().iter().filter(|node| node.id != 3).collect();
    ours.retry_until_acknowledged(&ours_left, CATCH_UP_TIMEOUT, |node| {
        api.call(Method::DELETE, node, "/v1/cluster/members/3")
    })
    .await
    .0
    .expect_status(200);
    ours.node(3).kill();
    // It can never catch up, so the add does not finish; what it answers does not matter.
    let _ = api
        .call(Method::POST, ours_left[0], "/v1/cluster/members")
        .json(&json!({"id": 3, "api_addr": stranger.api_addr(),
                      "peer_addr": stranger.peer_addr()}))
        .timeout(Duration::from_secs(3))
        .try_send()
        .await;
    // Our leader sends it appends and heartbeats every 50 ms: their node 3 refuses them.
    poll_until(
        CATCH_UP_TIMEOUT,
        "their node 3 to refuse our leader's requests",
        async || {
            let said = stranger.log_tail(200);
            said.contains("refused a peer request meant for another node or cluster")
                .then_some(())
        },
    )
    .await;
    let status = cluster_status(&theirs, stranger).await;
    assert_eq!(
        (status.term, status.leader_id),
        (term_before, Some(their_leader.id)),
        "their cluster was disturbed: {status:?}"
    );
    wait_for_equal_digests(&theirs, their_leader, stranger).await;
    theirs
        .api()
        .put(stranger, "/v1/kv/theirs/after", &json!({"value": "after"}))
        .await
        .expect_status(200);
}
