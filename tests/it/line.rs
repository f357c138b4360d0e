//! The line against real `batond` processes: five sessions that wait for a held lock get it
//! in the order they asked, one after the other, although the leader that put them in line is
//! SIGKILLed before the lock frees (their places are replicated state, asked again through the
//! survivors); `baton acquire --wait` prints its grant within 50 ms of the release that frees
//! the resource (the grant is made in the release's own write, and the waiting request is
//! answered as soon as it is applied); a wait that runs out leaves the line; a waiter leaves on
//! request, a session never waits for its own lease (asking again for a lease it holds answers
//! with that lease), and `wait_ms` over 60,000 changes nothing; a claim that waits gets the
//! task enqueued while it waited.

use std::time::{Duration, Instant};

use baton_client::api::{ErrorCode, Grant, Queued, ReleaseResponse};
use baton_tests::{json, poll_until, Api, Cluster, Method, Node, Value};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::cli::{baton, command};
use crate::events::describe;
use crate::queues::new_session;

/// A TTL no session of these tests outlives unless a test means it to.
const TTL_MS: u64 = 30_000;
/// The bound on a new leader answering after the old one is killed.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(20);
/// How late `baton acquire --wait` may print its grant after the release's answer.
const WAKE_BOUND: Duration = Duration::from_millis(50);
/// The bound on a waiting process joining the line.
const JOIN_TIMEOUT: Duration = Duration::from_secs(10);

/// A new session of `holder` holding `resource` (exclusive): its id.
async fn holding(api: &Api, node: &Node, resource: &str, holder: &str) -> String {
    let session = new_session(api, node, holder, TTL_MS).await;
    api.post(
        node,
        "/v1/leases",
        &json!({"resource": resource, "session_id": session}),
    )
    .await
    .expect_status(201);
    session
}

fn acquire_body(resource: &str, session: &str, wait_ms: u64) -> serde_json::Value {
    json!({"resource": resource, "session_id": session, "wait_ms": wait_ms})
}

/// The lease events on `resource` after revision `after`, described.
async fn line_events(api: &Api, node: &Node, after: u64, resource: &str) -> Vec<String> {
    api.events_after(node, after)
        .await
        .iter()
        .map(describe)
        .filter(|line| line.split(' ').nth(1) == Some(resource))
        .collect()
}

#[tokio::test]
async fn five_waiters_get_the_lock_in_arrival_order_across_a_leader_kill() {
    const LOCK: &str = "db/migrations";
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let leader = cluster.leader().await;
    let revision = api.last_revision(leader).await;
    let holder = holding(api, leader, LOCK, "holder").await;
    let mut waiters = Vec::new();
    for index in 1..=5u32 {
        let session = new_session(api, leader, &format!("waiter-{index}"), TTL_MS).await;
        let queued: Queued = api
            .post(leader, "/v1/leases", &acquire_body(LOCK, &session, 0))
            .await
            .expect_json(202);
        assert_eq!((queued.position, queued.queued), (index, true));
        waiters.push(session);
    }
    // An acquire that does not wait is refused while they wait, and changes nothing.
    let other = new_session(api, leader, "barger", TTL_MS).await;
    api.post(
        leader,
        "/v1/leases",
        &json!({"resource": LOCK, "session_id": other}),
    )
    .await
    .expect_problem(409, ErrorCode::LeaseHeld);

    let killed = leader.id;
    leader.kill();
    let survivors = cluster.live_nodes();
    // Every place survived the leader: asking again keeps it.
    for (index, session) in waiters.iter().enumerate() {
        let body = acquire_body(LOCK, session, 0);
        let (reply, _) = cluster
            .retry_until_acknowledged(&survivors, FAILOVER_TIMEOUT, |node| {
                api.call(Method::POST, node, "/v1/leases").json(&body)
            })
            .await;
        let queued: Queued = reply.parse();
        assert_eq!(queued.position as usize, index + 1, "{reply}");
    }
    let node = cluster.leader().await;
    assert_ne!(node.id, killed);

    // The holder lets go; each waiter in turn is granted in the write that frees the lock.
    let mut last_fence = 0;
    let mut releasing = holder.clone();
    for (index, session) in waiters.iter().enumerate() {
        let released: ReleaseResponse = api
            .post(
                node,
                &format!("/v1/sessions/{releasing}/release"),
                &json!({"resource": LOCK}),
            )
            .await
            .expect_json(200);
        assert!(!released.left_line);
        let grant: Grant = api
            .post(node, "/v1/leases", &acquire_body(LOCK, session, 0))
            .await
            .expect_json(201);
        assert!(grant.fence > last_fence, "fences rise: {grant:?}");
        last_fence = grant.fence;
        // The next one is first in line now.
        if let Some(next) = waiters.get(index + 1) {
            let queued: Queued = api
                .post(node, "/v1/leases", &acquire_body(LOCK, next, 0))
                .await
                .expect_json(202);
            assert_eq!(queued.position, 1);
        }
        releasing = session.clone();
    }

    let events = line_events(api, node, revision, LOCK).await;
    let mut expected = vec![format!("granted {LOCK}")];
    expected.extend((1..=5).map(|index| format!("queued {LOCK} waiter-{index}")));
    for _ in 1..=5 {
        expected.push(format!("released {LOCK}"));
        expected.push(format!("granted {LOCK}"));
    }
    assert_eq!(events, expected);
    let granted: Vec<String> = api
        .events_after(node, revision)
        .await
        .into_iter()
        .filter_map(|event| match event.kind {
            baton_client::api::EventKind::Granted {
                resource, holder, ..
            } if resource == LOCK => Some(holder),
            _ => None,
        })
        .collect();
    assert_eq!(
        granted,
        ["holder", "waiter-1", "waiter-2", "waiter-3", "waiter-4", "waiter-5"]
    );
}

#[tokio::test]
async fn baton_acquire_wait_gets_the_lease_within_50ms_of_the_release() {
    const RESOURCE: &str = "repo/src/auth.rs";
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let leader = cluster.leader().await;
    let endpoints = leader.api_url();
    let mut delays = Vec::new();
    for round in 0..3 {
        let holder = holding(api, leader, RESOURCE, "agent-a").await;
        let revision = api.last_revision(leader).await;
        let waiter_name = format!("agent-b{round}");
        let mut child = command(
            &endpoints,
            &[
                "acquire",
                RESOURCE,
                "--wait",
                "20s",
                "--holder",
                &waiter_name,
            ],
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn baton");
        let joined = format!("queued {RESOURCE} {waiter_name}");
        poll_until(
            JOIN_TIMEOUT,
            "baton acquire --wait to join the line",
            async || {
                line_events(api, leader, revision, RESOURCE)
                    .await
                    .contains(&joined)
                    .then_some(())
            },
        )
        .await;

        let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
        api.post(
            leader,
            &format!("/v1/sessions/{holder}/release"),
            &json!({"resource": RESOURCE}),
        )
        .await
        .expect_status(200);
        let released = Instant::now();
        let line = tokio::time::timeout(JOIN_TIMEOUT, stdout.next_line())
            .await
            .expect("the waiter prints its grant")
            .expect("read stdout")
            .expect("a line");
        let delay = released.elapsed();
        assert!(
            line.starts_with(&format!("acquired {RESOURCE} fence=")),
            "{line}"
        );
        let status = child.wait().await.expect("baton exits");
        assert_eq!(status.code(), Some(0));
        delays.push(delay);
        // The waiter's session holds it now; free it for the next round.
        let session = line
            .split_whitespace()
            .find_map(|word| word.strip_prefix("session="))
            .expect("the session id")
            .to_owned();
        api.delete(leader, &format!("/v1/sessions/{session}"))
            .await
            .expect_status(200);
        api.delete(leader, &format!("/v1/sessions/{holder}"))
            .await
            .expect_status(200);
    }
    delays.sort();
    eprintln!("line: baton acquire --wait printed its grant {delays:?} after the release's answer");
    assert!(
        delays[1] < WAKE_BOUND,
        "median {:?} over {WAKE_BOUND:?}: {delays:?}",
        delays[1]
    );
}

#[tokio::test]
async fn waiting_refusals_leaving_and_a_wait_that_runs_out_leave_nothing_behind() {
    const RESOURCE: &str = "deploy/prod";
    let cluster = Cluster::start(1).await;
    let api = cluster.api();
    let node = cluster.node(1);
    let holder = holding(api, node, RESOURCE, "agent-a").await;
    let revision = api.last_revision(node).await;

    // Bad input and waiting for oneself are refused, and asking for what one holds answers
    // with that lease: none of it changes anything.
    let waiter = new_session(api, node, "agent-b", TTL_MS).await;
    let revision_before = api.last_revision(node).await;
    let problem = api
        .post(node, "/v1/leases", &acquire_body(RESOURCE, &waiter, 60_001))
        .await
        .expect_problem(400, ErrorCode::InvalidArgument);
    assert!(problem.message.contains("wait_ms"), "{problem:?}");
    let own: Grant = api
        .post(node, "/v1/leases", &acquire_body(RESOURCE, &holder, 100))
        .await
        .expect_json(201);
    assert_eq!(own.fence, 1);
    api.post(
        node,
        "/v1/leases",
        &json!({"resource": RESOURCE, "session_id": holder, "wait_ms": 100, "mode": "shared", "limit": 2}),
    )
    .await
    .expect_problem(409, ErrorCode::LeaseHeld);
    api.post(
        node,
        "/v1/queues/jobs/claim",
        &json!({"session_id": waiter, "wait_ms": 60_001}),
    )
    .await
    .expect_problem(400, ErrorCode::InvalidArgument);
    assert_eq!(api.last_revision(node).await, revision_before);

    // A wait of 200 ms is answered 202 after about that long, and the place is kept.
    let started = Instant::now();
    let queued: Queued = api
        .post(node, "/v1/leases", &acquire_body(RESOURCE, &waiter, 200))
        .await
        .expect_json(202);
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!((queued.position, queued.resource.as_str()), (1, RESOURCE));
    // Leaving is a release of the place.
    let left: ReleaseResponse = api
        .post(
            node,
            &format!("/v1/sessions/{waiter}/release"),
            &json!({"resource": RESOURCE}),
        )
        .await
        .expect_json(200);
    assert!(left.left_line);
    api.post(
        node,
        &format!("/v1/sessions/{waiter}/release"),
        &json!({"resource": RESOURCE}),
    )
    .await
    .expect_problem(409, ErrorCode::LeaseLost);

    // `baton acquire --wait` that runs out exits 5 and leaves no place behind.
    let outcome = baton(
        &node.api_url(),
        &[
            "acquire", RESOURCE, "--wait", "300ms", "--holder", "agent-c",
        ],
    )
    .await;
    outcome.expect_code(5);
    assert!(outcome.stderr.contains("LEASE_HELD"), "{}", outcome.stderr);
    let events = line_events(api, node, revision, RESOURCE).await;
    assert_eq!(
        events,
        [
            format!("queued {RESOURCE} agent-b"),
            format!("left_line {RESOURCE} agent-b"),
            format!("queued {RESOURCE} agent-c"),
            format!("left_line {RESOURCE} agent-c"),
        ]
    );

    // A claim that waits gets the task enqueued while it waited.
    let enqueue = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        api.post(node, "/v1/queues/jobs/tasks", &json!({"payload": {"n": 1}}))
            .await
            .expect_status(201);
    };
    let claim_body = json!({"session_id": waiter, "wait_ms": 10_000});
    let claim = api.post(node, "/v1/queues/jobs/claim", &claim_body);
    let (claimed, ()) = tokio::join!(claim, enqueue);
    claimed.expect_status(200);
    // And one that runs out answers 204.
    api.post(
        node,
        "/v1/queues/jobs/claim",
        &json!({"session_id": waiter, "wait_ms": 100}),
    )
    .await
    .expect_status(204);
}

#[tokio::test]
async fn a_waiting_acquire_through_a_follower_waits_longer_than_a_forward_may_otherwise_take() {
    const RESOURCE: &str = "jobs/nightly";
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let leader = cluster.leader().await;
    let follower = cluster.followers().await[0];
    let holder = holding(api, leader, RESOURCE, "agent-a").await;
    let waiter = new_session(api, leader, "agent-b", TTL_MS).await;
    // Released well after twice the election timeout, the bound of an ordinary forward.
    let hold = Duration::from_millis(cluster.config().election_timeout_ms * 2 + 700);
    let release = async {
        tokio::time::sleep(hold).await;
        api.post(
            leader,
            &format!("/v1/sessions/{holder}/release"),
            &json!({"resource": RESOURCE}),
        )
        .await
        .expect_status(200);
    };
    let body = acquire_body(RESOURCE, &waiter, 10_000);
    let started = Instant::now();
    let (reply, ()) = tokio::join!(api.post(follower, "/v1/leases", &body), release);
    let grant: Grant = reply.expect_json(201);
    assert!(started.elapsed() >= hold, "granted before the release");
    assert_eq!(grant.holder, "agent-b");
}

/// A claim that waits is woken by its queue's task events, not by every applied entry: a task
/// released by its holder, one whose dependency completes, and one whose delay ends (which
/// becomes ready with no event at all) each reach it.
#[tokio::test]
async fn a_waiting_claim_gets_a_task_freed_by_an_event_a_delay_or_a_dependency() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let node = cluster.leader().await;
    let waiter = crate::queues::new_session(api, node, "worker", 60_000).await;
    let body = json!({"session_id": waiter, "wait_ms": 10_000});
    let claim = |queue: &'static str| {
        let body = &body;
        async move {
            api.post(node, &format!("/v1/queues/{queue}/claim"), body)
                .await
        }
    };

    // Released by its holder: a task event on the queue.
    let holder = crate::queues::new_session(api, node, "holder", 60_000).await;
    api.post(
        node,
        "/v1/queues/freed/tasks",
        &json!({"id": "t", "payload": 1}),
    )
    .await
    .expect_status(201);
    let held: Value = api
        .post(
            node,
            "/v1/queues/freed/claim",
            &json!({"session_id": holder}),
        )
        .await
        .expect_json(200);
    let fence = held["fence"].clone();
    let release = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        api.post(
            node,
            "/v1/queues/freed/tasks/t/release",
            &json!({"session_id": holder, "fence": fence}),
        )
        .await
        .expect_status(200);
    };
    let (claimed, ()) = tokio::join!(claim("freed"), release);
    let claimed: Value = claimed.expect_json(200);
    assert_eq!(claimed["task"]["id"], "t", "{claimed}");

    // Held back by a delay: no event when it ends, yet the waiter gets it.
    let started = Instant::now();
    api.post(
        node,
        "/v1/queues/delayed/tasks",
        &json!({"id": "d", "payload": 1, "not_before_ms": 600}),
    )
    .await
    .expect_status(201);
    let claimed: Value = claim("delayed").await.expect_json(200);
    assert_eq!(claimed["task"]["id"], "d", "{claimed}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    // Held back by a dependency: the waiter gets it when the dependency completes.
    api.post(
        node,
        "/v1/queues/chain/tasks",
        &json!({"id": "a", "payload": 1}),
    )
    .await
    .expect_status(201);
    let worker = crate::queues::new_session(api, node, "first-worker", 60_000).await;
    let first: Value = api
        .post(
            node,
            "/v1/queues/chain/claim",
            &json!({"session_id": worker}),
        )
        .await
        .expect_json(200);
    api.post(
        node,
        "/v1/queues/chain/tasks",
        &json!({"id": "b", "payload": 1, "depends_on": ["a"]}),
    )
    .await
    .expect_status(201);
    let complete = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        api.post(
            node,
            "/v1/queues/chain/tasks/a/complete",
            &json!({"session_id": worker, "fence": first["fence"]}),
        )
        .await
        .expect_status(200);
    };
    let (claimed, ()) = tokio::join!(claim("chain"), complete);
    let claimed: Value = claimed.expect_json(200);
    assert_eq!(claimed["task"]["id"], "b", "{claimed}");
}
