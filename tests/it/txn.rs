//! Transactions (`POST /v1/txn`, the outbox), compensations (`on_dead`) and the retention of
//! finished tasks, against real clusters: one transaction through a follower completes a task,
//! enqueues its follow-ups, records a result and releases the lease in one write; a compare
//! that fails runs only the failure ops, and a refused transaction (stale fence, a key named
//! twice, over 64 ops or compares, a fenced op without a session) changes nothing, not even the
//! event revision; a transaction retried with its `Idempotency-Key` applies once; a task that
//! goes dead (failed for good, its last claim lapsed, or its dependency dead) enqueues exactly
//! one compensation in the same write; done and dead tasks are removed after
//! `task_retention_ms` while their events stay; and `baton txn` and `baton task add --on-dead`
//! exit as docs/cli.md says.

use crate::events::describe;
use crate::queues::{claim, counts, enqueue, new_session, task_action};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use baton_client::api::{
    ClaimResponse, ErrorCode, Event, EventKind, Grant, KvEntry, KvPutResponse, QueueCounts,
    QueueInfo, Task, TaskList, TaskState, TxnOpResult, TxnResponse,
};
use baton_tests::{
    idempotency_key, json, poll_until, Api, Cluster, HttpReply, Method, Node, Value,
};

use crate::cli::{baton, url, Outcome};

/// A TTL no session of these tests outlives by accident.
const LONG_TTL_MS: u64 = 60_000;
/// The shortest TTL: a worker that stops renewing loses its claim after it.
const SHORT_TTL_MS: u64 = 1_000;
/// The bound on a lapse or a retention being seen: the duration, the tick, a loaded machine.
const LAPSE_TIMEOUT: Duration = Duration::from_secs(10);
/// `task_retention_ms` of the retention test.
const RETENTION_MS: u64 = 1_000;
/// `txn_ops_max`'s default: compares, and ops, in one transaction.
const TXN_OPS_MAX: usize = 64;

#[tokio::test]
async fn an_outbox_through_a_follower_completes_enqueues_records_and_releases_in_one_write() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let followers = cluster.followers().await;
    let (through, observer) = (followers[0], followers[1]);
    let queue = "pipeline";

    let session = new_session(api, through, "builder", LONG_TTL_MS).await;
    let grant: Grant = api
        .post(
            through,
            "/v1/leases",
            &json!({"resource": "repo/build", "session_id": session}),
        )
        .await
        .expect_json(201);
    enqueue(
        api,
        observer,
        queue,
        &json!({"id": "build", "payload": {"target": "all"}}),
    )
    .await
    .expect_status(201);
    let claimed: ClaimResponse = claim(api, through, queue, &json!({"session_id": session}))
        .await
        .expect_json(200);
    assert_eq!(claimed.task.id, "build", "{claimed:?}");
    let before = api.last_revision(observer).await;

    let reply = txn(
        api,
        through,
        &json!({
            "session_id": session,
            "compare": [{"fence": {"resource": "repo/build", "token": grant.fence}}],
            "success": [
                {"op": "complete_task", "queue": queue, "id": "build", "fence": claimed.fence,
                 "result": {"artifact": "build-1.tar"}},
                {"op": "add_task", "queue": queue, "task": {"id": "next", "payload": {"step": 2}}},
                {"op": "add_task", "queue": queue,
                 "task": {"id": "after", "payload": {"step": 3}, "depends_on": ["next"]}},
                {"op": "put", "key": "results/build", "value": {"ok": true, "artifact": "build-1.tar"}},
                {"op": "release", "resource": "repo/build"},
            ],
        }),
    )
    .await;
    reply.expect_baton_headers();
    let done: TxnResponse = reply.expect_json(200);
    assert!(done.succeeded, "{reply}");
    assert_eq!(
        done.results.iter().map(op_name).collect::<Vec<_>>(),
        ["complete_task", "add_task", "add_task", "put", "release"],
        "{reply}"
    );
    let (completed, next, after) = (
        result_task(&done.results[0]),
        result_task(&done.results[1]),
        result_task(&done.results[2]),
    );
    let TxnOpResult::Put { revision } = done.results[3] else {
        unreachable!("checked above")
    };
    let TxnOpResult::Release { released, fence } = &done.results[4] else {
        unreachable!("checked above")
    };
    assert_eq!(
        (completed.id.as_str(), completed.state),
        ("build", TaskState::Done),
        "{completed:?}"
    );
    assert_eq!(completed.result, Some(json!({"artifact": "build-1.tar"})));
    assert_eq!(
        (next.id.as_str(), next.state),
        ("next", TaskState::Ready),
        "{next:?}"
    );
    assert_eq!(
        (after.id.as_str(), after.state, after.waiting_on),
        ("after", TaskState::Waiting, 1),
        "{after:?}"
    );
    assert!(revision > 0, "{reply}");
    assert_eq!(
        (released.as_str(), *fence),
        ("repo/build", grant.fence),
        "{reply}"
    );

    // Read through the other follower: every op took effect.
    let done_tasks = list_tasks(api, observer, queue, Some("done")).await;
    assert_eq!(
        done_tasks
            .iter()
            .map(|task| (task.id.as_str(), task.result.clone()))
            .collect::<Vec<_>>(),
        [("build", Some(json!({"artifact": "build-1.tar"})))]
    );
    let ids = |tasks: Vec<Task>| tasks.into_iter().map(|task| task.id).collect::<Vec<_>>();
    assert_eq!(
        ids(list_tasks(api, observer, queue, Some("ready")).await),
        ["next"]
    );
    assert_eq!(
        ids(list_tasks(api, observer, queue, Some("waiting")).await),
        ["after"]
    );
    let entry: KvEntry = api
        .get(observer, "/v1/kv/results/build")
        .await
        .expect_json(200);
    assert_eq!(
        (entry.value, entry.revision, entry.fence),
        (
            json!({"ok": true, "artifact": "build-1.tar"}),
            revision,
            None
        )
    );
    api.get(observer, "/v1/leases/repo/build")
        .await
        .expect_problem(404, ErrorCode::NotFound);

    // One write: the five changes are the next five events, in op order, at one cluster time.
    let events = api.events_after(observer, before).await;
    assert_eq!(
        events.iter().map(describe).collect::<Vec<_>>(),
        [
            "task_completed pipeline/build",
            "task_enqueued pipeline/next",
            "task_enqueued pipeline/after",
            "kv_written results/build",
            "released repo/build",
        ],
        "the events of the transaction"
    );
    let times: BTreeSet<u64> = events.iter().map(|event| event.cluster_time_ms).collect();
    assert_eq!(times.len(), 1, "not one write: {events:?}");
}

#[tokio::test]
async fn a_failed_compare_runs_only_the_failure_ops_and_a_refused_txn_changes_nothing() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let nodes = cluster.nodes();

    let written: KvPutResponse = api
        .put(&nodes[0], "/v1/kv/config/app", &json!({"value": {"v": 1}}))
        .await
        .expect_json(200);
    let revision = api.last_revision(&nodes[0]).await;

    // The compare fails and there are no failure ops: nothing at all happens.
    let reply = txn(
        api,
        &nodes[1],
        &json!({
            "compare": [{"kv": "config/app", "revision": 0}],
            "success": [
                {"op": "put", "key": "a", "value": 1},
                {"op": "put", "key": "b", "value": 2},
            ],
            "failure": [],
        }),
    )
    .await;
    assert_eq!(
        reply.expect_json::<TxnResponse>(200),
        TxnResponse {
            succeeded: false,
            results: vec![],
        },
        "{reply}"
    );
    for node in nodes {
        for key in ["a", "b"] {
            api.get(node, &format!("/v1/kv/{key}"))
                .await
                .expect_problem(404, ErrorCode::NotFound);
        }
    }
    assert_eq!(
        api.last_revision(&nodes[2]).await,
        revision,
        "a failed compare without failure ops emitted an event"
    );

    // The compare fails and there are failure ops: only they run.
    let reply = txn(
        api,
        &nodes[2],
        &json!({
            "compare": [{"kv": "config/app", "revision": written.revision + 1}],
            "success": [{"op": "put", "key": "a", "value": 1}],
            "failure": [{"op": "put", "key": "conflicts/app", "value": "stale"}],
        }),
    )
    .await;
    let done: TxnResponse = reply.expect_json(200);
    let [TxnOpResult::Put {
        revision: conflict_revision,
    }] = done.results[..]
    else {
        panic!("not one put result: {reply}");
    };
    assert!(!done.succeeded, "{reply}");
    let conflict: KvEntry = api
        .get(&nodes[0], "/v1/kv/conflicts/app")
        .await
        .expect_json(200);
    assert_eq!(
        (conflict.value, conflict.revision),
        (json!("stale"), conflict_revision)
    );
    api.get(&nodes[0], "/v1/kv/a")
        .await
        .expect_problem(404, ErrorCode::NotFound);

    // A session with a lease and a task claimed twice: the first claim's fence is stale.
    let session = new_session(api, &nodes[0], "worker", LONG_TTL_MS).await;
    let grant: Grant = api
        .post(
            &nodes[0],
            "/v1/leases",
            &json!({"resource": "locks/deploy", "session_id": session}),
        )
        .await
        .expect_json(201);
    enqueue(api, &nodes[0], "jobs", &json!({"id": "job", "payload": {}}))
        .await
        .expect_status(201);
    let first: ClaimResponse = claim(api, &nodes[1], "jobs", &json!({"session_id": session}))
        .await
        .expect_json(200);
    task_action(
        api,
        &nodes[1],
        "jobs",
        "job",
        "release",
        &json!({"session_id": session, "fence": first.fence}),
    )
    .await
    .expect_status(200);
    let second: ClaimResponse = claim(api, &nodes[1], "jobs", &json!({"session_id": session}))
        .await
        .expect_json(200);
    assert!(second.fence > first.fence, "{second:?} after {first:?}");

    let baseline = QueueCounts {
        claimed: 1,
        ..QueueCounts::default()
    };
    assert_eq!(counts(api, &nodes[0], "jobs").await, baseline);
    let revision = api.last_revision(&nodes[0]).await;
    let put_x = json!({"op": "put", "key": "x", "value": "must not be written"});
    let puts = |n: usize| -> Vec<Value> {
        (0..n)
            .map(|i| json!({"op": "put", "key": format!("bulk/{i}"), "value": i}))
            .collect()
    };
    let compares = |n: usize| -> Vec<Value> {
        (0..n)
            .map(|i| json!({"kv": format!("bulk/{i}"), "revision": 0}))
            .collect()
    };
    let cases: Vec<(&str, Value, u16, ErrorCode)> = vec![
        (
            "a complete_task with a stale fence",
            json!({"session_id": session, "success": [
                put_x,
                {"op": "complete_task", "queue": "jobs", "id": "job", "fence": first.fence},
            ]}),
            409,
            ErrorCode::StaleFence,
        ),
        (
            "a key put twice",
            json!({"success": [put_x, {"op": "put", "key": "x", "value": 2}]}),
            400,
            ErrorCode::InvalidArgument,
        ),
        (
            "65 puts",
            json!({"success": puts(TXN_OPS_MAX + 1)}),
            400,
            ErrorCode::InvalidArgument,
        ),
        (
            "65 compares",
            json!({"compare": compares(TXN_OPS_MAX + 1), "success": [put_x]}),
            400,
            ErrorCode::InvalidArgument,
        ),
        (
            "a release without session_id",
            json!({"success": [put_x, {"op": "release", "resource": "locks/deploy"}]}),
            400,
            ErrorCode::InvalidArgument,
        ),
        (
            "a fence compare without session_id",
            json!({
                "compare": [{"fence": {"resource": "locks/deploy", "token": grant.fence}}],
                "success": [put_x],
            }),
            400,
            ErrorCode::InvalidArgument,
        ),
    ];
    for (n, (what, body, status, code)) in cases.iter().enumerate() {
        let node = &nodes[n % nodes.len()];
        let reply = txn(api, node, body).await;
        assert_eq!(reply.status, *status, "{what}: {reply}");
        reply.expect_problem(*status, *code);
        for key in ["x", "bulk/0"] {
            let read = api.get(node, &format!("/v1/kv/{key}")).await;
            assert_eq!(read.status, 404, "{what} wrote {key}: {read}");
        }
        assert_eq!(
            counts(api, node, "jobs").await,
            baseline,
            "{what} changed the counts"
        );
        let claimed = list_tasks(api, node, "jobs", Some("claimed")).await;
        assert_eq!(
            claimed
                .iter()
                .map(|task| (task.id.as_str(), task.fence))
                .collect::<Vec<_>>(),
            [("job", Some(second.fence))],
            "{what} changed the claim"
        );
        let lease = api.get(node, "/v1/leases/locks/deploy").await;
        assert_eq!(
            lease.expect_json::<Value>(200)["fence"],
            grant.fence,
            "{what} released the lease: {lease}"
        );
        assert_eq!(
            api.last_revision(node).await,
            revision,
            "{what} emitted an event"
        );
    }

    // The edges are accepted: the refusals were about what they name.
    let edge = txn(api, &nodes[0], &json!({"success": puts(TXN_OPS_MAX)})).await;
    let done: TxnResponse = edge.expect_json(200);
    assert_eq!(
        (done.succeeded, done.results.len()),
        (true, TXN_OPS_MAX),
        "{edge}"
    );
    let live = txn(
        api,
        &nodes[1],
        &json!({
            "session_id": session,
            "compare": [
                {"kv": "config/app", "revision": written.revision},
                {"kv": "x", "revision": 0},
            ],
            "success": [
                put_x,
                {"op": "complete_task", "queue": "jobs", "id": "job", "fence": second.fence},
                {"op": "release", "resource": "locks/deploy"},
            ],
        }),
    )
    .await;
    assert!(live.expect_json::<TxnResponse>(200).succeeded, "{live}");
    assert_eq!(
        counts(api, &nodes[2], "jobs").await,
        QueueCounts {
            done: 1,
            ..QueueCounts::default()
        }
    );
    api.get(&nodes[2], "/v1/kv/x").await.expect_status(200);
}

#[tokio::test]
async fn a_txn_retried_with_its_idempotency_key_applies_once() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let nodes = cluster.nodes();
    let queue = "mail";
    let key = idempotency_key();
    // The task has no id: the server makes one, so a second apply would add a second task.
    let body = json!({"success": [
        {"op": "add_task", "queue": queue, "task": {"payload": {"to": "ops"}}},
        {"op": "put", "key": "mail/sent", "value": 1},
    ]});
    let send = |node: &Node, key: Option<&str>, body: &Value| {
        let mut call = api.call(Method::POST, node, "/v1/txn").json(body);
        if let Some(key) = key {
            call = call.idempotency_key(key);
        }
        call.send()
    };

    let first = send(&nodes[0], Some(&key), &body).await;
    let applied: TxnResponse = first.expect_json(200);
    assert!(!first.replayed(), "a first answer marked replayed: {first}");
    assert_eq!(
        applied.results.iter().map(op_name).collect::<Vec<_>>(),
        ["add_task", "put"],
        "{first}"
    );
    let task = result_task(&applied.results[0]);
    let TxnOpResult::Put { revision } = applied.results[1] else {
        unreachable!("checked above")
    };
    let revision_after_first = api.last_revision(&nodes[0]).await;

    let replay = send(&nodes[1], Some(&key), &body).await;
    assert!(replay.replayed(), "not a replay: {replay}");
    assert_eq!(replay.expect_json::<TxnResponse>(200), applied, "{replay}");
    assert_eq!(replay.body, first.body, "{replay}");
    assert_eq!(api.last_revision(&nodes[2]).await, revision_after_first);
    let tasks = list_tasks(api, &nodes[2], queue, None).await;
    assert_eq!(
        tasks
            .iter()
            .map(|task| task.id.as_str())
            .collect::<Vec<_>>(),
        [task.id.as_str()],
        "the task was added twice"
    );
    let entry: KvEntry = api
        .get(&nodes[2], "/v1/kv/mail/sent")
        .await
        .expect_json(200);
    assert_eq!(entry.revision, revision, "the put was applied twice");

    // The key with another body is refused; without a key the body applies again.
    send(
        &nodes[2],
        Some(&key),
        &json!({"success": [{"op": "put", "key": "mail/sent", "value": 2}]}),
    )
    .await
    .expect_problem(422, ErrorCode::IdempotencyKeyReused);
    assert_eq!(api.last_revision(&nodes[0]).await, revision_after_first);
    let again: TxnResponse = send(&nodes[0], None, &body).await.expect_json(200);
    assert!(again.succeeded);
    assert_eq!(list_tasks(api, &nodes[1], queue, None).await.len(), 2);
}

#[tokio::test]
async fn a_dead_task_enqueues_exactly_one_compensation_in_the_same_write() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let nodes = cluster.nodes();
    let (queue, undo) = ("saga", "undo");

    // Failed for good: the task and its dependent die, and each enqueues its compensation.
    enqueue(
        api,
        &nodes[0],
        queue,
        &json!({"id": "charge", "payload": {"amount": 42}, "max_attempts": 1,
                "on_dead": {"queue": undo, "payload": {"refund": 42}}}),
    )
    .await
    .expect_status(201);
    let ship: Task = enqueue(
        api,
        &nodes[0],
        queue,
        &json!({"id": "ship", "payload": {}, "depends_on": ["charge"],
                "on_dead": {"queue": undo, "payload": {"cancel": "shipment"}, "max_attempts": 5}}),
    )
    .await
    .expect_json(201);
    // The task object shows its compensation.
    assert_eq!(
        serde_json::to_value(&ship.on_dead).expect("JSON"),
        json!({"queue": undo, "payload": {"cancel": "shipment"}, "max_attempts": 5})
    );
    let claimed: ClaimResponse = claim(
        api,
        &nodes[1],
        queue,
        &json!({"holder": "worker", "ttl_ms": LONG_TTL_MS}),
    )
    .await
    .expect_json(200);
    assert_eq!(claimed.task.id, "charge");
    let failed: Task = task_action(
        api,
        &nodes[1],
        queue,
        "charge",
        "fail",
        &json!({"session_id": claimed.session_id, "fence": claimed.fence,
                "reason": "card declined", "retry": false}),
    )
    .await
    .expect_json(200);
    assert_eq!(failed.state, TaskState::Dead, "{failed:?}");

    // No waiting: the compensations are there as soon as the fail is answered.
    let compensations = list_tasks(api, &nodes[2], undo, None).await;
    let events = api.events_after(&nodes[2], 0).await;
    let death = |id: &str| -> &Event {
        events
            .iter()
            .find(
                |event| matches!(&event.kind, EventKind::TaskDead(change) if change.task_id == id),
            )
            .unwrap_or_else(|| panic!("no task_dead event for {id}: {events:?}"))
    };
    let (charge_dead, ship_dead) = (death("charge"), death("ship"));
    assert_eq!(
        compensations
            .iter()
            .map(|task| (
                task.id.clone(),
                (task.payload.clone(), task.state, task.max_attempts)
            ))
            .collect::<BTreeMap<_, _>>(),
        BTreeMap::from([
            (
                format!("on-dead-{}", charge_dead.revision),
                (json!({"refund": 42}), TaskState::Ready, 3)
            ),
            (
                format!("on-dead-{}", ship_dead.revision),
                (json!({"cancel": "shipment"}), TaskState::Ready, 5)
            ),
        ]),
        "the compensations in {undo}"
    );
    for compensation in &compensations {
        let enqueued = events
            .iter()
            .find(|event| {
                matches!(&event.kind, EventKind::TaskEnqueued(change)
                    if change.queue == undo && change.task_id == compensation.id)
            })
            .unwrap_or_else(|| panic!("no task_enqueued event for {}", compensation.id));
        assert_eq!(
            enqueued.cluster_time_ms, charge_dead.cluster_time_ms,
            "{} was not enqueued in the write that made its task dead: {events:?}",
            compensation.id
        );
    }

    // The last attempt's claim lapses: one compensation.
    enqueue(
        api,
        &nodes[0],
        queue,
        &json!({"id": "reserve", "payload": {"room": 7}, "max_attempts": 1,
                "on_dead": {"queue": undo, "payload": {"release": "room-7"}}}),
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
    assert_eq!((sleeper.task.id.as_str(), sleeper.attempt), ("reserve", 1));
    poll_until(
        LAPSE_TIMEOUT,
        "the compensation of the lapsed last attempt",
        async || {
            let counts = counts(api, &nodes[2], undo).await;
            (counts.ready > 2).then_some(())
        },
    )
    .await;
    let released: Vec<Task> = list_tasks(api, &nodes[0], undo, None)
        .await
        .into_iter()
        .filter(|task| task.payload == json!({"release": "room-7"}))
        .collect();
    assert_eq!(released.len(), 1, "{released:?}");
    assert!(released[0].id.starts_with("on-dead-"), "{released:?}");
    let dead: BTreeSet<String> = list_tasks(api, &nodes[0], queue, Some("dead"))
        .await
        .into_iter()
        .map(|task| task.id)
        .collect();
    assert_eq!(
        dead,
        BTreeSet::from(["charge", "reserve", "ship"].map(str::to_owned))
    );
    assert_eq!(
        counts(api, &nodes[1], undo).await,
        QueueCounts {
            ready: 3,
            ..QueueCounts::default()
        }
    );

    // An invalid compensation is refused with its task, and nothing is enqueued.
    let revision = api.last_revision(&nodes[0]).await;
    let long_queue = "q".repeat(200);
    let bad_on_dead = [
        json!({"queue": long_queue, "payload": {}}),
        json!({"queue": "has space", "payload": {}}),
        json!({"queue": undo, "payload": {}, "max_attempts": 0}),
    ];
    for (n, on_dead) in bad_on_dead.iter().enumerate() {
        let node = &nodes[n % nodes.len()];
        enqueue(
            api,
            node,
            queue,
            &json!({"id": "bad", "payload": {}, "on_dead": on_dead}),
        )
        .await
        .expect_problem(400, ErrorCode::InvalidArgument);
        txn(
            api,
            node,
            &json!({"success": [{"op": "add_task", "queue": queue,
                                 "task": {"id": "bad", "payload": {}, "on_dead": on_dead}}]}),
        )
        .await
        .expect_problem(400, ErrorCode::InvalidArgument);
        assert_eq!(
            api.last_revision(node).await,
            revision,
            "on_dead {on_dead} emitted an event"
        );
    }
    assert_eq!(
        counts(api, &nodes[2], queue).await,
        QueueCounts {
            dead: 3,
            ..QueueCounts::default()
        }
    );
    assert_eq!(
        counts(api, &nodes[2], undo).await,
        QueueCounts {
            ready: 3,
            ..QueueCounts::default()
        }
    );
}

#[tokio::test]
async fn finished_tasks_are_removed_after_their_retention_and_their_events_stay() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let followers = cluster.followers().await;
    let (node, observer) = (followers[0], followers[1]);
    let queue = "short";

    // No --auth in these clusters: anyone may set limits.
    let limits: Value = api
        .put(
            node,
            "/v1/limits",
            &json!({"task_retention_ms": RETENTION_MS}),
        )
        .await
        .expect_json(200);
    assert_eq!(limits["task_retention_ms"], RETENTION_MS, "{limits}");
    for id in ["kept", "failed", "untouched"] {
        enqueue(api, node, queue, &json!({"id": id, "payload": {}}))
            .await
            .expect_status(201);
    }
    let session = new_session(api, node, "worker", LONG_TTL_MS).await;
    let kept: ClaimResponse = claim(api, node, queue, &json!({"session_id": session}))
        .await
        .expect_json(200);
    let failed: ClaimResponse = claim(api, node, queue, &json!({"session_id": session}))
        .await
        .expect_json(200);
    assert_eq!(
        (kept.task.id.as_str(), failed.task.id.as_str()),
        ("kept", "failed")
    );
    let completed = task_action(
        api,
        node,
        queue,
        "kept",
        "complete",
        &json!({"session_id": session, "fence": kept.fence}),
    )
    .await;
    assert_eq!(completed.expect_json::<Task>(200).state, TaskState::Done);
    let dead = task_action(
        api,
        node,
        queue,
        "failed",
        "fail",
        &json!({"session_id": session, "fence": failed.fence, "reason": "no", "retry": false}),
    )
    .await;
    assert_eq!(dead.expect_json::<Task>(200).state, TaskState::Dead);
    let (done_at, dead_at) = (completed.cluster_time(), dead.cluster_time());

    // Still there until the retention runs out.
    let read = api.get(observer, &format!("/v1/queues/{queue}")).await;
    let info: QueueInfo = read.expect_json(200);
    if read.cluster_time() < done_at + RETENTION_MS {
        assert_eq!(
            info.counts,
            QueueCounts {
                ready: 1,
                done: 1,
                dead: 1,
                ..QueueCounts::default()
            },
            "removed before the retention ran out: {read}"
        );
    } else {
        eprintln!("the retention ran out before the first read: its presence is unchecked");
    }

    // Then gone, and only they: the ready task stays.
    let gone_at = poll_until(
        LAPSE_TIMEOUT,
        "the finished tasks to be removed",
        async || {
            let read = api.get(observer, &format!("/v1/queues/{queue}")).await;
            let info: QueueInfo = read.expect_json(200);
            let only_ready = QueueCounts {
                ready: 1,
                ..QueueCounts::default()
            };
            (info.counts == only_ready).then(|| read.cluster_time())
        },
    )
    .await;
    assert!(
        gone_at >= dead_at + RETENTION_MS,
        "removed at {gone_at}, died at {dead_at}, retention {RETENTION_MS} ms"
    );
    let left = list_tasks(api, observer, queue, None).await;
    assert_eq!(
        left.iter()
            .map(|task| (task.id.as_str(), task.state))
            .collect::<Vec<_>>(),
        [("untouched", TaskState::Ready)]
    );
    for state in ["done", "dead"] {
        assert!(
            list_tasks(api, observer, queue, Some(state))
                .await
                .is_empty(),
            "{state} tasks left"
        );
    }

    // Their events stay.
    let events: Vec<String> = api
        .events_after(cluster.node(1), 0)
        .await
        .iter()
        .map(describe)
        .collect();
    for kept in ["task_completed short/kept", "task_dead short/failed"] {
        assert!(
            events.iter().any(|event| event == kept),
            "no {kept}: {events:?}"
        );
    }
}

#[tokio::test]
async fn baton_txn_and_task_add_on_dead_exit_as_documented() {
    let cluster = Cluster::start(1).await;
    let endpoints = url(&cluster);
    let api = cluster.api();
    let node = cluster.node(1);
    let directory = tempfile::tempdir().expect("a temporary directory");
    let file = |name: &str, text: &str| {
        let path = directory.path().join(name);
        std::fs::write(&path, text).expect("write a transaction file");
        path.to_str().expect("a UTF-8 path").to_owned()
    };

    baton(
        &endpoints,
        &["task", "add", "build", "{}", "--id", "compile"],
    )
    .await
    .expect_code(0);
    let claimed = baton(&endpoints, &["task", "claim", "build", "--env"]).await;
    claimed.expect_code(0);
    let (session, fence) = (
        env_value(&claimed, "BATON_SESSION"),
        env_value(&claimed, "BATON_FENCE"),
    );
    let fence: u64 = fence.parse().expect("a fence");
    let complete =
        json!({"op": "complete_task", "queue": "build", "id": "compile", "fence": fence});

    // The outbox: "succeeded", then one line per op.
    let outbox = file(
        "outbox.json",
        &json!({"session_id": session, "success": [
            complete,
            {"op": "add_task", "queue": "build", "task": {"id": "link", "payload": {}}},
            {"op": "put", "key": "results/compile", "value": {"ok": true}},
        ]})
        .to_string(),
    );
    let succeeded = baton(&endpoints, &["txn", &outbox]).await;
    succeeded.expect_code(0);
    let lines: Vec<&str> = succeeded.stdout.lines().collect();
    assert!(
        matches!(
            lines[..],
            ["succeeded", "complete_task build/compile", "add_task build/link", put]
                if put.starts_with("put revision=")
        ),
        "{succeeded:#?}"
    );

    // A compare that fails: exit 0 all the same, and the failure ops ran.
    let compare_fails = json!({
        "compare": [{"kv": "results/compile", "revision": 0}],
        "success": [{"op": "put", "key": "results/compile", "value": {"ok": false}}],
        "failure": [{"op": "put", "key": "conflicts/compile", "value": 1}],
    });
    let failed = baton(
        &endpoints,
        &["txn", &file("compare.json", &compare_fails.to_string())],
    )
    .await;
    failed.expect_code(0);
    let lines: Vec<&str> = failed.stdout.lines().collect();
    assert!(
        matches!(lines[..], [first, put] if first.starts_with("compare failed")
            && put.starts_with("put revision=")),
        "{failed:#?}"
    );
    let entry: KvEntry = api
        .get(node, "/v1/kv/results/compile")
        .await
        .expect_json(200);
    assert_eq!(entry.value, json!({"ok": true}));
    // With --json: the API's answer.
    let answer: TxnResponse = baton(
        &endpoints,
        &[
            "--json",
            "txn",
            &file(
                "compare-only.json",
                &json!({"compare": [{"kv": "results/compile", "revision": 0}]}).to_string(),
            ),
        ],
    )
    .await
    .expect_code(0)
    .json();
    assert_eq!(
        answer,
        TxnResponse {
            succeeded: false,
            results: vec![],
        }
    );

    // Refused: the claim is gone, so the fence is stale; exit 4, nothing written.
    let stale = file(
        "stale.json",
        &json!({"session_id": session, "success": [
            {"op": "put", "key": "results/again", "value": 1},
            complete,
        ]})
        .to_string(),
    );
    let refused = baton(&endpoints, &["txn", &stale]).await;
    refused.expect_code(4);
    assert!(
        refused.error_line().starts_with("error[STALE_FENCE]"),
        "{refused:#?}"
    );
    assert!(refused.stdout.is_empty(), "{refused:#?}");
    api.get(node, "/v1/kv/results/again")
        .await
        .expect_problem(404, ErrorCode::NotFound);

    // Not a transaction: exit 2.
    for (name, text) in [
        ("broken.json", "{\"success\": ["),
        ("unknown-op.json", "{\"success\": [{\"op\": \"launch\"}]}"),
    ] {
        let usage = baton(&endpoints, &["txn", &file(name, text)]).await;
        usage.expect_code(2);
        assert!(
            usage.error_line().starts_with("error[INVALID_ARGUMENT]"),
            "{usage:#?}"
        );
    }
    let missing = directory.path().join("missing.json");
    baton(
        &endpoints,
        &["txn", missing.to_str().expect("a UTF-8 path")],
    )
    .await
    .expect_code(2);

    // --on-dead: failed for good, one compensation with the given payload.
    baton(
        &endpoints,
        &[
            "task",
            "add",
            "saga",
            "{}",
            "--id",
            "charge",
            "--on-dead",
            "undo",
            "--on-dead-payload",
            "{\"undo\":1}",
            "--max-attempts",
            "1",
        ],
    )
    .await
    .expect_code(0);
    let claimed = baton(&endpoints, &["task", "claim", "saga", "--env"]).await;
    claimed.expect_code(0);
    assert_eq!(env_value(&claimed, "BATON_TASK"), "charge");
    baton(
        &endpoints,
        &[
            "task",
            "fail",
            "saga",
            "charge",
            "--session",
            &env_value(&claimed, "BATON_SESSION"),
            "--fence",
            &env_value(&claimed, "BATON_FENCE"),
            "--reason",
            "declined",
            "--no-retry",
        ],
    )
    .await
    .expect_code(0);
    let undo = list_tasks(api, node, "undo", None).await;
    assert_eq!(undo.len(), 1, "{undo:?}");
    assert!(undo[0].id.starts_with("on-dead-"), "{undo:?}");
    assert_eq!(
        (undo[0].payload.clone(), undo[0].state),
        (json!({"undo": 1}), TaskState::Ready)
    );
    let counts = baton(&endpoints, &["task", "counts", "undo"]).await;
    counts.expect_code(0);
    assert_eq!(
        counts.stdout.trim(),
        "undo ready=1 waiting=0 claimed=0 done=0 dead=0"
    );
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

async fn txn(api: &Api, node: &Node, body: &Value) -> HttpReply {
    api.post(node, "/v1/txn", body).await
}

/// Every task of `queue`, or only those in `state`, following the cursor.
async fn list_tasks(api: &Api, node: &Node, queue: &str, state: Option<&str>) -> Vec<Task> {
    let mut tasks = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/queues/{queue}/tasks?limit=1000");
        if let Some(state) = state {
            path.push_str(&format!("&state={state}"));
        }
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

/// The `op` tag of a transaction's result.
fn op_name(result: &TxnOpResult) -> &'static str {
    match result {
        TxnOpResult::Put { .. } => "put",
        TxnOpResult::Delete { .. } => "delete",
        TxnOpResult::Release { .. } => "release",
        TxnOpResult::AddTask { .. } => "add_task",
        TxnOpResult::CompleteTask { .. } => "complete_task",
        TxnOpResult::FailTask { .. } => "fail_task",
    }
}

/// The task of an `add_task`, `complete_task` or `fail_task` result.
fn result_task(result: &TxnOpResult) -> &Task {
    match result {
        TxnOpResult::AddTask { task }
        | TxnOpResult::CompleteTask { task }
        | TxnOpResult::FailTask { task } => task,
        other => panic!("not a task's result: {other:?}"),
    }
}

/// The value of a `NAME=value` line `baton ... --env` printed.
fn env_value(outcome: &Outcome, name: &str) -> String {
    outcome
        .stdout
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name}= line: {outcome:#?}"))
        .to_owned()
}
