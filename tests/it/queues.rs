//! Work queues with leased claims (docs/guarantees.md, "Semantics" "Work queues", issue 5 "Show it"), against
//! real three-node clusters: one winner per claim race and a drain that completes every task
//! exactly once; a stalled worker's claim lapses, is handed over with a higher fence and its
//! late complete is `STALE_FENCE`; claims follow priority, FIFO, dependencies and delays;
//! tasks dead-letter after their attempts; a release counts no attempt and keeps its note; and
//! bad enqueues are refused without changing anything.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use baton_client::api::{
    ClaimResponse, CreateSessionResponse, ErrorCode, EventKind, EventsPage, QueueCounts, QueueInfo,
    Task, TaskList, TaskState,
};
use baton_tests::{
    idempotency_key, json, poll_until, Api, Cluster, HttpReply, Method, Node, Value,
};
use futures_util::future::join_all;
use futures_util::{stream, StreamExt};

/// Rounds of the claim race.
const ROUNDS: usize = 200;
/// Clients racing for the one task of each round.
const CONTENDERS: usize = 8;
/// Tasks of the drain.
const DRAIN_TASKS: usize = 2_000;
/// Workers of the drain.
const DRAIN_WORKERS: usize = 16;
/// Enqueues in flight while the drain's queue is filled.
const ENQUEUES_IN_FLIGHT: usize = 32;
/// A TTL no claim of these tests outlives by accident.
const LONG_TTL_MS: u64 = 60_000;
/// The shortest TTL: a worker that stops renewing loses its claim after it.
const SHORT_TTL_MS: u64 = 1_000;
/// The bound on a lapse being seen: TTL, tick, a loaded machine.
const LAPSE_TIMEOUT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn eight_clients_racing_for_one_task_have_exactly_one_winner_every_round() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let nodes = cluster.nodes();
    let queue = "race";
    let started = Instant::now();
    let mut last_fence = 0;
    for round in 0..ROUNDS {
        let id = format!("round-{round}");
        let enqueued: Task = enqueue(
            api,
            &nodes[round % nodes.len()],
            queue,
            &json!({"id": id, "payload": {"round": round}}),
        )
        .await
        .expect_json(201);
        assert_eq!(enqueued.state, TaskState::Ready, "{enqueued:?}");

        // Each contender is a new agent: it asks for a session with its claim.
        let replies = join_all((0..CONTENDERS).map(|client| {
            let body = json!({"holder": format!("claimer-{client}"), "ttl_ms": LONG_TTL_MS});
            async move { claim(api, &nodes[client % nodes.len()], queue, &body).await }
        }))
        .await;
        let winners: Vec<&HttpReply> = replies.iter().filter(|reply| reply.status == 200).collect();
        let empty = replies.iter().filter(|reply| reply.status == 204).count();
        assert!(
            winners.len() == 1 && empty == CONTENDERS - 1,
            "round {round}: {} winners and {empty} empty answers of {CONTENDERS}:\n{}",
            winners.len(),
            describe(&replies)
        );
        for reply in replies.iter().filter(|reply| reply.status == 204) {
            assert!(reply.text.is_empty(), "a 204 with a body: {reply}");
        }
        let won: ClaimResponse = winners[0].parse();
        assert_eq!(won.task.id, id, "round {round}: {}", winners[0]);
        assert_eq!(won.attempt, 1, "round {round}: {}", winners[0]);
        assert_eq!(won.task.state, TaskState::Claimed, "{}", winners[0]);
        assert!(
            won.fence > last_fence,
            "round {round}: fence {} after {last_fence} (G3)",
            won.fence
        );
        last_fence = won.fence;

        let done: Task = complete(
            api,
            &nodes[(round + 1) % nodes.len()],
            queue,
            &won.task.id,
            won.session_id.as_str(),
            won.fence,
        )
        .await
        .expect_json(200);
        assert_eq!(done.state, TaskState::Done, "{done:?}");
    }
    let elapsed = started.elapsed();
    eprintln!(
        "claim race: {ROUNDS} rounds of {CONTENDERS} claimers in {elapsed:?} ({:.1} ms a round)",
        elapsed.as_secs_f64() * 1_000.0 / ROUNDS as f64
    );
    assert_eq!(
        counts(api, &nodes[0], queue).await,
        QueueCounts {
            done: ROUNDS as u64,
            ..QueueCounts::default()
        }
    );
}

#[tokio::test]
async fn sixteen_workers_drain_two_thousand_tasks_each_claimed_and_completed_once() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let nodes = cluster.nodes();
    let queue = "drain";
    let ids: Vec<String> = (0..DRAIN_TASKS).map(|n| format!("job-{n:04}")).collect();

    let filling = Instant::now();
    stream::iter(ids.iter().enumerate())
        .map(|(n, id)| {
            let body = json!({"id": id, "payload": {"n": n}});
            async move { enqueue(api, &nodes[n % nodes.len()], queue, &body).await }
        })
        .buffer_unordered(ENQUEUES_IN_FLIGHT)
        .for_each(async |reply| {
            reply.expect_status(201);
        })
        .await;
    eprintln!(
        "drain: enqueued {DRAIN_TASKS} tasks in {:?}",
        filling.elapsed()
    );
    assert_eq!(
        counts(api, &nodes[0], queue).await,
        QueueCounts {
            ready: DRAIN_TASKS as u64,
            ..QueueCounts::default()
        }
    );

    let started = Instant::now();
    let completed_by_worker = join_all(
        (0..DRAIN_WORKERS)
            .map(|worker| drain_worker(api, &nodes[worker % nodes.len()], queue, worker)),
    )
    .await;
    let elapsed = started.elapsed();
    eprintln!(
        "drain: {DRAIN_WORKERS} workers did {DRAIN_TASKS} claim+complete cycles in {elapsed:?}: \
         {:.0} cycles per second",
        DRAIN_TASKS as f64 / elapsed.as_secs_f64()
    );

    let mut claims: BTreeMap<&str, usize> = BTreeMap::new();
    let mut fences = BTreeSet::new();
    for (id, fence) in completed_by_worker.iter().flatten() {
        *claims.entry(id.as_str()).or_default() += 1;
        assert!(fences.insert(*fence), "fence {fence} handed out twice");
    }
    let twice: Vec<_> = claims.iter().filter(|(_, count)| **count != 1).collect();
    assert!(twice.is_empty(), "tasks claimed more than once: {twice:?}");
    let expected: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    let claimed: BTreeSet<&str> = claims.keys().copied().collect();
    assert_eq!(
        claimed, expected,
        "the claimed ids differ from the enqueued"
    );

    assert_eq!(
        counts(api, &nodes[1], queue).await,
        QueueCounts {
            done: DRAIN_TASKS as u64,
            ..QueueCounts::default()
        }
    );
    let done = list_tasks(api, &nodes[2], queue, "done").await;
    let done_ids: Vec<&str> = done.iter().map(|task| task.id.as_str()).collect();
    assert_eq!(done_ids.len(), DRAIN_TASKS, "done tasks: {done_ids:?}");
    assert_eq!(
        done_ids.iter().copied().collect::<BTreeSet<_>>(),
        expected,
        "the done ids differ from the enqueued"
    );
    for task in &done {
        assert_eq!(
            (task.state, task.attempt, task.result.is_some()),
            (TaskState::Done, 1, true),
            "{task:?}"
        );
    }
}

#[tokio::test]
async fn a_worker_that_stops_renewing_loses_its_task_and_its_late_complete_is_refused() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let (node_a, node_b, observer) = (cluster.node(1), cluster.node(2), cluster.node(3));
    let queue = "stall";
    enqueue(
        api,
        observer,
        queue,
        &json!({"id": "job", "payload": "work"}),
    )
    .await
    .expect_status(201);

    let first: ClaimResponse = claim(
        api,
        node_a,
        queue,
        &json!({"holder": "worker-a", "ttl_ms": SHORT_TTL_MS}),
    )
    .await
    .expect_json(200);
    assert_eq!((first.task.id.as_str(), first.attempt), ("job", 1));
    assert!(first.expires_in_ms <= SHORT_TTL_MS, "{first:?}");
    let session_b = new_session(api, node_b, "worker-b", LONG_TTL_MS).await;

    // Worker A goes silent. Worker B polls until the claim lapses and the task is its own.
    let second: ClaimResponse = poll_until(
        LAPSE_TIMEOUT,
        "worker B to claim the lapsed task",
        async || {
            let reply = claim(api, node_b, queue, &json!({"session_id": session_b})).await;
            match reply.status {
                204 => None,
                _ => Some(reply.expect_json(200)),
            }
        },
    )
    .await;
    assert_eq!(second.task.id, "job");
    assert_eq!(second.attempt, 2, "{second:?}");
    assert_eq!(second.task.attempt, 2, "{second:?}");
    assert!(
        second.fence > first.fence,
        "fence {} after {} (G3)",
        second.fence,
        first.fence
    );

    // Worker A wakes up: its complete, fail and release are refused and change nothing, and
    // so is the live fence under A's session. Its session is gone.
    let session_a = first.session_id.as_str();
    for (verb, body) in [
        (
            "complete",
            json!({"session_id": session_a, "fence": first.fence}),
        ),
        (
            "fail",
            json!({"session_id": session_a, "fence": first.fence, "reason": "late"}),
        ),
        (
            "release",
            json!({"session_id": session_a, "fence": first.fence}),
        ),
        (
            "complete",
            json!({"session_id": session_a, "fence": second.fence}),
        ),
    ] {
        task_action(api, node_a, queue, "job", verb, &body)
            .await
            .expect_problem(409, ErrorCode::StaleFence);
    }
    api.call(
        Method::POST,
        node_a,
        &format!("/v1/sessions/{session_a}/keepalive"),
    )
    .send()
    .await
    .expect_problem(409, ErrorCode::LeaseLost);
    assert_eq!(
        counts(api, observer, queue).await,
        QueueCounts {
            claimed: 1,
            ..QueueCounts::default()
        }
    );

    let done: Task = complete(api, node_b, queue, "job", session_b.as_str(), second.fence)
        .await
        .expect_json(200);
    assert_eq!((done.state, done.attempt), (TaskState::Done, 2), "{done:?}");
    // A second complete: the claim is gone.
    complete(
        api,
        observer,
        queue,
        "job",
        session_b.as_str(),
        second.fence,
    )
    .await
    .expect_problem(409, ErrorCode::StaleFence);
    complete(api, node_a, queue, "job", session_a, first.fence)
        .await
        .expect_problem(409, ErrorCode::StaleFence);

    assert_eq!(
        counts(api, observer, queue).await,
        QueueCounts {
            done: 1,
            ..QueueCounts::default()
        }
    );
    let done_tasks = list_tasks(api, observer, queue, "done").await;
    assert_eq!(done_tasks.len(), 1, "{done_tasks:?}");
    assert_eq!(
        (done_tasks[0].id.as_str(), done_tasks[0].state),
        ("job", TaskState::Done)
    );

    // The event stream tells the same story: one lapse, one hand-over, one completion.
    let story: Vec<(String, Option<u64>, Option<u32>)> = task_events(api, observer, "job")
        .await
        .into_iter()
        .filter(|(kind, _, _)| kind != "task_enqueued")
        .collect();
    assert_eq!(
        story,
        vec![
            ("task_claimed".to_owned(), Some(first.fence), Some(1)),
            ("task_expired".to_owned(), Some(first.fence), None),
            ("task_claimed".to_owned(), Some(second.fence), Some(2)),
            ("task_completed".to_owned(), Some(second.fence), None),
        ],
        "the events of task job"
    );
}

#[tokio::test]
async fn claims_follow_priority_then_fifo_and_wait_for_dependencies_and_delays() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let nodes = cluster.nodes();
    let queue = "ordered";
    for (id, priority, depends_on) in [
        ("a", 0, vec![]),
        ("b", 0, vec![]),
        ("c", 5, vec![]),
        ("d", 5, vec![]),
        ("e", -1, vec![]),
        ("f", 10, vec!["c", "a"]),
    ] {
        let task: Task = enqueue(
            api,
            &nodes[0],
            queue,
            &json!({"id": id, "payload": id, "priority": priority, "depends_on": depends_on}),
        )
        .await
        .expect_json(201);
        let state = if depends_on.is_empty() {
            TaskState::Ready
        } else {
            TaskState::Waiting
        };
        assert_eq!(
            (task.priority, task.waiting_on, task.state),
            (priority, depends_on.len() as u32, state),
            "{task:?}"
        );
    }
    let session = new_session(api, &nodes[1], "worker", LONG_TTL_MS).await;
    let worker = Worker {
        api,
        node: &nodes[1],
        queue,
        session: &session,
    };

    // c and d first (priority 5, FIFO); f (priority 10) waits for c and a.
    let c = worker.claim_expecting("c").await;
    worker.complete(&c).await;
    let d = worker.claim_expecting("d").await;
    worker.complete(&d).await;
    let a = worker.claim_expecting("a").await;
    // a is claimed but not done: f still waits, so b comes next.
    let b = worker.claim_expecting("b").await;
    worker.complete(&a).await;
    let f = worker.claim_expecting("f").await;
    worker.complete(&b).await;
    worker.complete(&f).await;
    let e = worker.claim_expecting("e").await;
    worker.complete(&e).await;
    worker.claim_nothing().await;

    // A delayed task is not claimable before its time, whatever its priority: until then the
    // task without a delay goes first, then nothing is claimable.
    let late_reply = enqueue(
        api,
        &nodes[2],
        queue,
        &json!({"id": "late", "payload": {}, "priority": 100, "not_before_ms": 1_000}),
    )
    .await;
    let late: Task = late_reply.expect_json(201);
    assert_eq!(
        late.ready_at_ms,
        late_reply.cluster_time() + 1_000,
        "{late_reply}"
    );
    enqueue(api, &nodes[2], queue, &json!({"id": "now", "payload": {}}))
        .await
        .expect_status(201);
    let mut claimed_now = false;
    let (claimed_at, claimed_late) = poll_until(
        LAPSE_TIMEOUT,
        "the delayed task to be claimable",
        async || {
            let reply = worker.claim().await;
            let at = reply.cluster_time();
            if reply.status == 204 {
                assert!(
                    claimed_now && at < late.ready_at_ms,
                    "nothing claimable at {at} (`late` is ready at {}, `now` claimed: \
                     {claimed_now}): {reply}",
                    late.ready_at_ms
                );
                return None;
            }
            let claimed: ClaimResponse = reply.expect_json(200);
            if at < late.ready_at_ms {
                assert_eq!(claimed.task.id, "now", "claimed at {at}: {reply}");
                claimed_now = true;
                worker.complete(&claimed).await;
                return None;
            }
            Some((at, claimed))
        },
    )
    .await;
    assert_eq!(claimed_late.task.id, "late", "claimed at {claimed_at}");
    assert!(claimed_at >= late.ready_at_ms);
    if !claimed_now {
        eprintln!("the delay passed before the first claim (at {claimed_at}): `now` unchecked");
    }
}

#[tokio::test]
async fn tasks_dead_letter_after_their_attempts_and_a_release_counts_no_attempt() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let nodes = cluster.nodes();
    let queue = "letters";

    // max_attempts 1 and a claim that lapses: dead, and so is what depends on it.
    enqueue(
        api,
        &nodes[0],
        queue,
        &json!({"id": "once", "payload": 1, "max_attempts": 1}),
    )
    .await
    .expect_status(201);
    enqueue(
        api,
        &nodes[0],
        queue,
        &json!({"id": "after-once", "payload": 2, "depends_on": ["once"]}),
    )
    .await
    .expect_status(201);
    let sleeper: ClaimResponse = claim(
        api,
        &nodes[1],
        queue,
        &json!({"holder": "sleeper", "ttl_ms": SHORT_TTL_MS}),
    )
    .await
    .expect_json(200);
    assert_eq!((sleeper.task.id.as_str(), sleeper.attempt), ("once", 1));
    poll_until(
        LAPSE_TIMEOUT,
        "the lapsed last attempt to be dead",
        async || {
            let counts = counts(api, &nodes[2], queue).await;
            (counts.dead == 2).then_some(())
        },
    )
    .await;
    let dead = list_tasks(api, &nodes[2], queue, "dead").await;
    let dead_ids: BTreeSet<&str> = dead.iter().map(|task| task.id.as_str()).collect();
    assert_eq!(dead_ids, BTreeSet::from(["once", "after-once"]), "{dead:?}");
    let once = dead.iter().find(|task| task.id == "once").expect("once");
    assert_eq!(
        (once.attempt, once.fence, once.reason.is_some()),
        (1, None, true),
        "{once:?}"
    );
    let session = new_session(api, &nodes[1], "worker", LONG_TTL_MS).await;
    let worker = Worker {
        api,
        node: &nodes[1],
        queue,
        session: &session,
    };
    worker.claim_nothing().await;
    complete(
        api,
        &nodes[1],
        queue,
        "once",
        sleeper.session_id.as_str(),
        sleeper.fence,
    )
    .await
    .expect_problem(409, ErrorCode::StaleFence);
    // Nothing can depend on a dead task.
    enqueue(
        api,
        &nodes[0],
        queue,
        &json!({"id": "after-dead", "payload": 3, "depends_on": ["once"]}),
    )
    .await
    .expect_problem(400, ErrorCode::InvalidArgument);

    // fail with retry=false: dead at once, with attempts left.
    enqueue(
        api,
        &nodes[0],
        queue,
        &json!({"id": "hopeless", "payload": 4}),
    )
    .await
    .expect_status(201);
    let hopeless = worker.claim_expecting("hopeless").await;
    let failed: Task = worker
        .action(
            &hopeless,
            "fail",
            json!({"reason": "bad input", "retry": false}),
        )
        .await
        .expect_json(200);
    assert_eq!(
        (failed.state, failed.attempt, failed.reason.as_deref()),
        (TaskState::Dead, 1, Some("bad input")),
        "{failed:?}"
    );

    // fail with retry=true: ready again while attempts remain, dead after the last.
    enqueue(
        api,
        &nodes[0],
        queue,
        &json!({"id": "flaky", "payload": 5, "max_attempts": 2}),
    )
    .await
    .expect_status(201);
    let flaky_1 = worker.claim_expecting("flaky").await;
    let retried: Task = worker
        .action(
            &flaky_1,
            "fail",
            json!({"reason": "transient", "retry": true}),
        )
        .await
        .expect_json(200);
    assert_eq!(
        (retried.state, retried.attempt, retried.reason.as_deref()),
        (TaskState::Ready, 1, Some("transient")),
        "{retried:?}"
    );
    let flaky_2 = worker.claim_expecting("flaky").await;
    assert_eq!(flaky_2.attempt, 2, "{flaky_2:?}");
    assert!(
        flaky_2.fence > flaky_1.fence,
        "{flaky_2:?} after {flaky_1:?}"
    );
    let exhausted: Task = worker
        .action(&flaky_2, "fail", json!({"reason": "transient again"}))
        .await
        .expect_json(200);
    assert_eq!(
        (exhausted.state, exhausted.attempt),
        (TaskState::Dead, 2),
        "{exhausted:?}"
    );
    worker.claim_nothing().await;

    // release: no attempt counted, the note stays for the next claimer.
    enqueue(
        api,
        &nodes[0],
        queue,
        &json!({"id": "handoff", "payload": 6, "max_attempts": 1}),
    )
    .await
    .expect_status(201);
    let handoff_1 = worker.claim_expecting("handoff").await;
    assert_eq!(handoff_1.attempt, 1);
    let released: Task = worker
        .action(
            &handoff_1,
            "release",
            json!({"note": "half done: see branch x"}),
        )
        .await
        .expect_json(200);
    assert_eq!(
        (released.state, released.attempt, released.note.as_deref()),
        (TaskState::Ready, 0, Some("half done: see branch x")),
        "{released:?}"
    );
    // A released claim is gone like any other.
    worker
        .action(&handoff_1, "complete", json!({}))
        .await
        .expect_problem(409, ErrorCode::StaleFence);
    // With max_attempts 1, a counted release would have made it dead: it is claimable again.
    let handoff_2 = worker.claim_expecting("handoff").await;
    assert_eq!(handoff_2.attempt, 1, "{handoff_2:?}");
    assert_eq!(
        handoff_2.task.note.as_deref(),
        Some("half done: see branch x"),
        "{handoff_2:?}"
    );
    assert!(handoff_2.fence > handoff_1.fence);
    worker.complete(&handoff_2).await;

    assert_eq!(
        counts(api, &nodes[2], queue).await,
        QueueCounts {
            done: 1,
            dead: 4,
            ..QueueCounts::default()
        }
    );
    let story: Vec<String> = task_events(api, &nodes[2], "once")
        .await
        .into_iter()
        .map(|(kind, _, _)| kind)
        .collect();
    assert_eq!(
        story,
        ["task_enqueued", "task_claimed", "task_expired", "task_dead"],
        "the events of task once"
    );
}

#[tokio::test]
async fn bad_enqueues_are_refused_and_change_nothing() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let nodes = cluster.nodes();
    let queue = "strict";
    let key = idempotency_key();
    let first_body = json!({"id": "t1", "payload": {"n": 1}});
    let first = api
        .call(
            Method::POST,
            &nodes[0],
            &format!("/v1/queues/{queue}/tasks"),
        )
        .idempotency_key(&key)
        .json(&first_body)
        .send()
        .await;
    let first_task: Task = first.expect_json(201);
    let baseline = QueueCounts {
        ready: 1,
        ..QueueCounts::default()
    };
    assert_eq!(counts(api, &nodes[0], queue).await, baseline);
    let revision = api.last_revision(&nodes[0]).await;

    let oversized = "x".repeat(256 * 1024 + 1);
    let cases: Vec<(&str, String, Value, u16, ErrorCode)> = vec![
        (
            "an unknown dependency",
            queue.to_owned(),
            json!({"id": "t2", "payload": {}, "depends_on": ["t1", "nope"]}),
            400,
            ErrorCode::InvalidArgument,
        ),
        (
            "a duplicate id",
            queue.to_owned(),
            json!({"id": "t1", "payload": {"n": 2}}),
            400,
            ErrorCode::InvalidArgument,
        ),
        (
            "a duplicate id with the same body but no Idempotency-Key",
            queue.to_owned(),
            first_body.clone(),
            400,
            ErrorCode::InvalidArgument,
        ),
        (
            "max_attempts 0",
            queue.to_owned(),
            json!({"id": "t3", "payload": {}, "max_attempts": 0}),
            400,
            ErrorCode::InvalidArgument,
        ),
        (
            "a payload over 256 KiB",
            queue.to_owned(),
            json!({"id": "t4", "payload": oversized}),
            413,
            ErrorCode::PayloadTooLarge,
        ),
        (
            "a queue name with a space",
            "strict%20queue".to_owned(),
            json!({"id": "t5", "payload": {}}),
            400,
            ErrorCode::InvalidArgument,
        ),
        (
            "an invalid task id",
            queue.to_owned(),
            json!({"id": "t 6", "payload": {}}),
            400,
            ErrorCode::InvalidArgument,
        ),
    ];
    for (n, (what, target, body, status, code)) in cases.iter().enumerate() {
        let node = &nodes[n % nodes.len()];
        let reply = enqueue(api, node, target, body).await;
        assert_eq!(reply.status, *status, "{what}: {reply}");
        reply.expect_problem(*status, *code);
        assert_eq!(
            counts(api, node, queue).await,
            baseline,
            "{what} changed the counts"
        );
        assert_eq!(
            api.last_revision(node).await,
            revision,
            "{what} emitted an event"
        );
    }
    claim(
        api,
        &nodes[1],
        "strict%20queue",
        &json!({"holder": "worker", "ttl_ms": LONG_TTL_MS}),
    )
    .await
    .expect_problem(400, ErrorCode::InvalidArgument);

    // A retry with the first request's key replays its answer; the same key with another
    // body is refused. Neither changes anything.
    let replay = api
        .call(
            Method::POST,
            &nodes[2],
            &format!("/v1/queues/{queue}/tasks"),
        )
        .idempotency_key(&key)
        .json(&first_body)
        .send()
        .await;
    assert!(replay.replayed(), "not a replay: {replay}");
    assert_eq!(replay.expect_json::<Task>(201), first_task);
    api.call(
        Method::POST,
        &nodes[2],
        &format!("/v1/queues/{queue}/tasks"),
    )
    .idempotency_key(&key)
    .json(&json!({"id": "t1", "payload": {"n": 3}}))
    .send()
    .await
    .expect_problem(422, ErrorCode::IdempotencyKeyReused);
    assert_eq!(counts(api, &nodes[2], queue).await, baseline);
    assert_eq!(api.last_revision(&nodes[2]).await, revision);
    let tasks = list_tasks(api, &nodes[0], queue, "ready").await;
    assert_eq!(tasks, vec![first_task]);
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// One worker with its own session on one node.
struct Worker<'a> {
    api: &'a Api,
    node: &'a Node,
    queue: &'a str,
    session: &'a str,
}

impl Worker<'_> {
    async fn claim(&self) -> HttpReply {
        claim(
            self.api,
            self.node,
            self.queue,
            &json!({"session_id": self.session}),
        )
        .await
    }

    async fn claim_expecting(&self, id: &str) -> ClaimResponse {
        let reply = self.claim().await;
        let claimed: ClaimResponse = reply.expect_json(200);
        assert_eq!(claimed.task.id, id, "claimed the wrong task: {reply}");
        assert_eq!(claimed.task.state, TaskState::Claimed, "{reply}");
        assert_eq!(claimed.task.fence, Some(claimed.fence), "{reply}");
        claimed
    }

    async fn claim_nothing(&self) {
        let reply = self.claim().await;
        assert_eq!(reply.status, 204, "expected an empty queue: {reply}");
    }

    /// `complete`, `fail` or `release` with this worker's session and the claim's fence, plus
    /// the fields of `extra`.
    async fn action(&self, claimed: &ClaimResponse, verb: &str, extra: Value) -> HttpReply {
        let mut body = json!({"session_id": self.session, "fence": claimed.fence});
        if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
            body.extend(extra);
        }
        task_action(
            self.api,
            self.node,
            self.queue,
            &claimed.task.id,
            verb,
            &body,
        )
        .await
    }

    async fn complete(&self, claimed: &ClaimResponse) {
        let done: Task = self
            .action(claimed, "complete", json!({}))
            .await
            .expect_json(200);
        assert_eq!(done.state, TaskState::Done, "{done:?}");
    }
}

/// Claims and completes until the queue answers 204; returns `(task id, fence)` of each cycle.
async fn drain_worker(api: &Api, node: &Node, queue: &str, worker: usize) -> Vec<(String, u64)> {
    let session = new_session(api, node, &format!("drainer-{worker}"), LONG_TTL_MS).await;
    let mut done = Vec::new();
    loop {
        let reply = claim(api, node, queue, &json!({"session_id": session})).await;
        if reply.status == 204 {
            return done;
        }
        let claimed: ClaimResponse = reply.expect_json(200);
        assert_eq!(claimed.attempt, 1, "{reply}");
        let completed: Task = task_action(
            api,
            node,
            queue,
            &claimed.task.id,
            "complete",
            &json!({"session_id": session, "fence": claimed.fence, "result": {"by": worker}}),
        )
        .await
        .expect_json(200);
        assert_eq!(completed.state, TaskState::Done, "{completed:?}");
        done.push((claimed.task.id, claimed.fence));
    }
}

pub(crate) async fn enqueue(api: &Api, node: &Node, queue: &str, body: &Value) -> HttpReply {
    api.post(node, &format!("/v1/queues/{queue}/tasks"), body)
        .await
}

pub(crate) async fn claim(api: &Api, node: &Node, queue: &str, body: &Value) -> HttpReply {
    api.post(node, &format!("/v1/queues/{queue}/claim"), body)
        .await
}

pub(crate) async fn task_action(
    api: &Api,
    node: &Node,
    queue: &str,
    id: &str,
    verb: &str,
    body: &Value,
) -> HttpReply {
    api.post(node, &format!("/v1/queues/{queue}/tasks/{id}/{verb}"), body)
        .await
}

async fn complete(
    api: &Api,
    node: &Node,
    queue: &str,
    id: &str,
    session: &str,
    fence: u64,
) -> HttpReply {
    task_action(
        api,
        node,
        queue,
        id,
        "complete",
        &json!({"session_id": session, "fence": fence}),
    )
    .await
}

pub(crate) async fn new_session(api: &Api, node: &Node, holder: &str, ttl_ms: u64) -> String {
    let session: CreateSessionResponse = api
        .post(
            node,
            "/v1/sessions",
            &json!({"holder": holder, "ttl_ms": ttl_ms}),
        )
        .await
        .expect_json(201);
    session.session_id.as_str().to_owned()
}

pub(crate) async fn counts(api: &Api, node: &Node, queue: &str) -> QueueCounts {
    let info: QueueInfo = api
        .get(node, &format!("/v1/queues/{queue}"))
        .await
        .expect_json(200);
    assert_eq!(info.queue, queue);
    info.counts
}

/// Every task in `state`, following the cursor.
async fn list_tasks(api: &Api, node: &Node, queue: &str, state: &str) -> Vec<Task> {
    let mut tasks = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/queues/{queue}/tasks?state={state}&limit=1000");
        if let Some(cursor) = &cursor {
            path.push_str(&format!("&cursor={cursor}"));
        }
        let page: TaskList = api.get(node, &path).await.expect_json(200);
        tasks.extend(page.tasks);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return tasks,
        }
    }
}

/// The `(type, fence, attempt)` of every event of task `id`, in order.
async fn task_events(api: &Api, node: &Node, id: &str) -> Vec<(String, Option<u64>, Option<u32>)> {
    let mut story = Vec::new();
    let mut after = 0;
    loop {
        let page: EventsPage = api
            .get(node, &format!("/v1/events?after={after}&limit=1000"))
            .await
            .expect_json(200);
        if page.events.is_empty() {
            return story;
        }
        after = page.next;
        for event in page.events {
            let (kind, change) = match event.kind {
                EventKind::TaskEnqueued(change) => ("task_enqueued", change),
                EventKind::TaskClaimed(change) => ("task_claimed", change),
                EventKind::TaskCompleted(change) => ("task_completed", change),
                EventKind::TaskFailed(change) => ("task_failed", change),
                EventKind::TaskReleased(change) => ("task_released", change),
                EventKind::TaskDead(change) => ("task_dead", change),
                EventKind::TaskExpired(change) => ("task_expired", change),
                _ => continue,
            };
            if change.task_id == id {
                story.push((kind.to_owned(), change.fence, change.attempt));
            }
        }
    }
}

fn describe(replies: &[HttpReply]) -> String {
    replies
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}
