//! Work queues and the event stream through the client crate and the `baton` command line,
//! against real `batond` processes: the worker loop drains a queue completing each task once;
//! a claim whose session is ended mid-work is refused on settle (`STALE_FENCE`) and the task is
//! redone; `baton task claim` on an empty queue exits 3 so that `id=$(baton task claim q) &&
//! work` ends cleanly; `baton events --after N` prints exactly the events after N; and a
//! followed event stream resumes after a node restart without losing or repeating an event.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_client::api::{
    EnqueueRequest, Event, EventKind, ListTasksQuery, Task, TaskList, TaskState,
};
use baton_client::{Client, Error, LostReason, WorkOptions, WorkStopped};
use baton_tests::{baton_path, json, poll_until, Cluster, Value, READY_TIMEOUT};
use futures_util::StreamExt;
use tokio::sync::Notify;

/// How long one `baton` command or one wait on the server may take before the test calls it a
/// hang.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);

fn client(cluster: &Cluster, holder: &str) -> Client {
    Client::builder(cluster.nodes().iter().map(|node| node.api_url()))
        .holder(holder)
        .request_timeout(Duration::from_secs(2))
        .build()
        .expect("a client")
}

fn task(id: &str, payload: Value) -> EnqueueRequest {
    EnqueueRequest {
        id: Some(id.to_owned()),
        payload,
        priority: 0,
        depends_on: Vec::new(),
        max_attempts: None,
        not_before_ms: None,
        on_dead: None,
    }
}

async fn tasks_in(client: &Client, queue: &str, state: TaskState) -> Vec<Task> {
    let query = ListTasksQuery {
        state: Some(state),
        limit: None,
        cursor: None,
    };
    let list = client.list_tasks(queue, &query).await.expect("list tasks");
    assert!(list.next_cursor.is_none(), "one page is enough here");
    list.tasks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_worker_loop_drains_a_queue_completing_each_task_once() {
    let cluster = Cluster::start(3).await;
    let client = client(&cluster, "enqueuer");
    let tasks = 12;
    for index in 0..tasks {
        client
            .enqueue("builds", task(&format!("t{index}"), json!({"n": index})))
            .await
            .expect("enqueue");
    }
    // One task always fails: retried once (max 2 attempts), then dead.
    let mut broken = task("broken", json!({"fail": true}));
    broken.max_attempts = Some(2);
    client.enqueue("builds", broken).await.expect("enqueue");

    let runs: Arc<Mutex<Vec<(String, u32)>>> = Arc::default();
    let handler = |runs: Arc<Mutex<Vec<(String, u32)>>>| {
        move |task: Task| {
            let runs = Arc::clone(&runs);
            async move {
                runs.lock()
                    .expect("runs")
                    .push((task.id.clone(), task.attempt));
                tokio::task::yield_now().await;
                if task.payload["fail"] == json!(true) {
                    Err("this task always fails".to_owned())
                } else {
                    Ok(Some(
                        json!({"doubled": task.payload["n"].as_u64().unwrap_or(0) * 2}),
                    ))
                }
            }
        }
    };
    // Three workers: two with sessions of their own, one with a session it was given.
    let worker_a = client.clone();
    let worker_b = client.clone();
    let given = client
        .session(Duration::from_secs(10))
        .await
        .expect("a session");
    let started = Instant::now();
    let (a, b, c) = tokio::time::timeout(STEP_TIMEOUT, async {
        tokio::join!(
            worker_a.work("builds", WorkOptions::new(), handler(Arc::clone(&runs))),
            worker_b.work(
                "builds",
                WorkOptions::new().ttl(Duration::from_secs(5)),
                handler(Arc::clone(&runs))
            ),
            client.work(
                "builds",
                WorkOptions::new().session(&given),
                handler(Arc::clone(&runs))
            ),
        )
    })
    .await
    .expect("the workers drain the queue in time");
    eprintln!("drained in {:?}", started.elapsed());
    let reports = [
        a.expect("worker a"),
        b.expect("worker b"),
        c.expect("worker c"),
    ];
    for report in &reports {
        assert_eq!(report.stopped, WorkStopped::QueueEmpty, "{report:?}");
    }
    let completed: u64 = reports.iter().map(|report| report.completed).sum();
    let failed: u64 = reports.iter().map(|report| report.failed).sum();
    assert_eq!((completed, failed), (tasks, 2), "{reports:?}");

    // Each good task ran once, on attempt 1; the broken one twice, on attempts 1 and 2.
    let mut seen: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for (id, attempt) in runs.lock().expect("runs").iter() {
        seen.entry(id.clone()).or_default().push(*attempt);
    }
    for index in 0..tasks {
        assert_eq!(seen.get(&format!("t{index}")), Some(&vec![1]), "{seen:?}");
    }
    let mut broken_attempts = seen.get("broken").cloned().unwrap_or_default();
    broken_attempts.sort_unstable();
    assert_eq!(broken_attempts, [1, 2]);

    let info = client.queue_info("builds").await.expect("counts");
    assert_eq!(
        (
            info.counts.ready,
            info.counts.claimed,
            info.counts.done,
            info.counts.dead
        ),
        (0, 0, tasks, 1)
    );
    for done in tasks_in(&client, "builds", TaskState::Done).await {
        let n = done.payload["n"].as_u64().expect("n");
        assert_eq!(done.result, Some(json!({"doubled": n * 2})), "{done:?}");
    }
    // The given session is still usable (the loop did not end it); a loop's own is ended.
    assert!(given.is_valid());
    given.end().await.expect("end the given session");

    // tasks_max stops the loop after that many tasks.
    for index in 0..3 {
        client
            .enqueue("small", task(&format!("s{index}"), json!(index)))
            .await
            .expect("enqueue");
    }
    let report = client
        .work(
            "small",
            WorkOptions::new().tasks_max(2),
            handler(Arc::clone(&runs)),
        )
        .await
        .expect("work");
    assert_eq!(
        (report.completed, report.stopped),
        (2, WorkStopped::TasksMax)
    );
    assert_eq!(
        client
            .queue_info("small")
            .await
            .expect("counts")
            .counts
            .ready,
        1
    );
}

/// Sets its flag when dropped: tells whether a closure's future was dropped.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_session_is_ended_mid_work_is_refused_and_the_task_is_redone() {
    let cluster = Cluster::start(1).await;
    let client = client(&cluster, "worker-1");
    let other = client_for_other(&cluster);

    // A claim handle: its session is ended elsewhere, so its complete is STALE_FENCE.
    client
        .enqueue("jobs", task("job-1", json!("payload")))
        .await
        .expect("enqueue");
    let first = client
        .claim("jobs", Duration::from_secs(10))
        .await
        .expect("claim")
        .expect("a task is ready");
    assert_eq!((first.task().id.as_str(), first.attempt()), ("job-1", 1));
    let first_fence = first.fence();
    other
        .end_session(first.session_id())
        .await
        .expect("end the claimer's session");
    match first.complete(Some(json!("late"))).await {
        Err(Error::StaleFence { .. }) => {}
        other => panic!("a complete after the session ended must be STALE_FENCE: {other:?}"),
    }
    // The task is ready again: claimed with attempt 2 and a higher fence, completed once.
    let second = other
        .claim("jobs", Duration::from_secs(10))
        .await
        .expect("claim")
        .expect("the task is ready again");
    assert_eq!((second.task().id.as_str(), second.attempt()), ("job-1", 2));
    assert!(second.fence() > first_fence);
    let done = second
        .complete(Some(json!("on time")))
        .await
        .expect("complete");
    assert_eq!(
        (done.state, done.result),
        (TaskState::Done, Some(json!("on time")))
    );
    assert!(other
        .claim("jobs", Duration::from_secs(10))
        .await
        .expect("claim")
        .is_none());

    // The worker loop: the session is ended while the closure runs; the closure's future is
    // dropped, the loop stops, and another worker redoes the task.
    client
        .enqueue("jobs", task("job-2", json!("payload")))
        .await
        .expect("enqueue");
    let session = client
        .session(Duration::from_secs(3))
        .await
        .expect("a session");
    let started = Arc::new(Notify::new());
    let dropped = Arc::new(AtomicBool::new(false));
    let handler = {
        let started = Arc::clone(&started);
        let dropped = Arc::clone(&dropped);
        move |_task: Task| {
            let started = Arc::clone(&started);
            let flag = SetOnDrop(Arc::clone(&dropped));
            async move {
                let _flag = flag;
                started.notify_one();
                std::future::pending::<Result<Option<Value>, String>>().await
            }
        }
    };
    let end_elsewhere = async {
        started.notified().await;
        other
            .end_session(session.id())
            .await
            .expect("end the worker's session");
    };
    let (report, ()) = tokio::time::timeout(STEP_TIMEOUT, async {
        tokio::join!(
            client.work("jobs", WorkOptions::new().session(&session), handler),
            end_elsewhere
        )
    })
    .await
    .expect("the loop notices the lost session in time");
    let report = report.expect("work");
    match &report.stopped {
        WorkStopped::ClaimLost {
            task_id,
            reason: LostReason::Gone { .. },
        } if task_id == "job-2" => {}
        stopped => panic!("the loop must stop on the lost claim: {stopped:?}"),
    }
    assert_eq!((report.completed, report.failed), (0, 0));
    assert!(
        dropped.load(Ordering::SeqCst),
        "the closure's future was not dropped"
    );
    assert!(!session.is_valid());

    let redone = other
        .work("jobs", WorkOptions::new(), |task| async move {
            Ok(Some(json!({"redone": task.attempt})))
        })
        .await
        .expect("work");
    assert_eq!(
        (redone.completed, redone.stopped),
        (1, WorkStopped::QueueEmpty)
    );
    let done = tasks_in(&client, "jobs", TaskState::Done).await;
    let job_2 = done
        .iter()
        .find(|task| task.id == "job-2")
        .expect("job-2 done");
    assert_eq!(
        (job_2.attempt, &job_2.result),
        (2, &Some(json!({"redone": 2})))
    );
}

fn client_for_other(cluster: &Cluster) -> Client {
    client(cluster, "worker-2")
}

/// The outcome of one shell command.
#[derive(Debug)]
struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// `sh -c SCRIPT` with `$B` the `baton` binary, `BATON_ENDPOINTS` the cluster, holder `tester`,
/// and no other `BATON_*` variable.
async fn shell(cluster: &Cluster, script: &str) -> Outcome {
    let mut command = tokio::process::Command::new("sh");
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("BATON_") {
            command.env_remove(key);
        }
    }
    let child = command
        .arg("-c")
        .arg(script)
        .env("B", baton_path())
        .env("BATON_ENDPOINTS", cluster.node(1).api_url())
        .env("BATON_HOLDER", "tester")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn sh");
    let output = tokio::time::timeout(STEP_TIMEOUT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("`{script}` did not finish within {STEP_TIMEOUT:?}"))
        .expect("wait for sh");
    Outcome {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The value of `name=` in a `key=value ...` line.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(name)?.strip_prefix('='))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shell_flow_claims_by_id_and_an_empty_queue_exits_3() {
    let cluster = Cluster::start(1).await;

    // An empty queue: exit 3, and `&& work` does not run.
    let empty = shell(
        &cluster,
        r#"id=$("$B" task claim q) && echo "worked on $id""#,
    )
    .await;
    assert_eq!(empty.code, Some(3), "{empty:#?}");
    assert!(!empty.stdout.contains("worked"), "{empty:#?}");
    let line = empty.stderr.lines().last().unwrap_or_default();
    assert!(
        line.starts_with("error[") && line.contains('q'),
        "{empty:#?}"
    );

    // `baton task add` prints the id; `id=$(baton task claim q)` gets just the id, and the
    // fence and session are on stderr.
    let added = shell(
        &cluster,
        r#""$B" task add q '{"n": 1}' --id t1 --priority 2"#,
    )
    .await;
    assert_eq!(
        (added.code, added.stdout.trim()),
        (Some(0), "t1"),
        "{added:#?}"
    );
    let claimed = shell(
        &cluster,
        r#"id=$("$B" task claim q --ttl 20s) && echo "worked on $id""#,
    )
    .await;
    assert_eq!(claimed.code, Some(0), "{claimed:#?}");
    assert_eq!(claimed.stdout.trim(), "worked on t1", "{claimed:#?}");
    let info = claimed.stderr.lines().last().unwrap_or_default();
    let fence = field(info, "fence").expect("the fence on stderr");
    let session = field(info, "session").expect("the session on stderr");
    assert_eq!(field(info, "attempt"), Some("1"), "{info}");

    // Completing with them; a second complete is STALE_FENCE, exit 4.
    let complete = format!(
        r#""$B" task complete q t1 --session {session} --fence {fence} --result '{{"ok": true}}'"#
    );
    let completed = shell(&cluster, &complete).await;
    assert_eq!(completed.code, Some(0), "{completed:#?}");
    assert!(completed.stdout.contains("now done"), "{completed:#?}");
    let again = shell(&cluster, &complete).await;
    assert_eq!(again.code, Some(4), "{again:#?}");
    assert!(
        again
            .stderr
            .lines()
            .last()
            .unwrap_or_default()
            .starts_with("error[STALE_FENCE]: "),
        "{again:#?}"
    );

    // The --env form: session and fence come from the environment.
    let env_flow = shell(
        &cluster,
        r#"set -e
"$B" task add q '"second"' --id t2 >/dev/null
set -a; eval "$("$B" task claim q --env)"; set +a
test "$BATON_TASK" = t2
"$B" task fail q "$BATON_TASK" --reason flaky
eval "$("$B" task claim q --env)"
echo "attempt=$BATON_ATTEMPT"
"$B" task release q "$BATON_TASK" --session "$BATON_SESSION" --fence "$BATON_FENCE" --note "half done"
"$B" task list q --json"#,
    )
    .await;
    assert_eq!(env_flow.code, Some(0), "{env_flow:#?}");
    assert!(env_flow.stdout.contains("attempt=2"), "{env_flow:#?}");
    let list: TaskList = serde_json::from_str(env_flow.stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|error| panic!("the list is not JSON ({error}): {env_flow:#?}"));
    let states: Vec<(&str, TaskState, u32, Option<&str>)> = list
        .tasks
        .iter()
        .map(|task| {
            (
                task.id.as_str(),
                task.state,
                task.attempt,
                task.note.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        states,
        [
            ("t1", TaskState::Done, 1, None),
            // One failed attempt; the released one does not count.
            ("t2", TaskState::Ready, 1, Some("half done"))
        ]
    );
    let done = shell(&cluster, r#""$B" task list q --state done"#).await;
    assert_eq!(done.code, Some(0), "{done:#?}");
    assert_eq!(done.stdout.lines().count(), 1, "{done:#?}");
    assert!(done.stdout.starts_with("t1 done attempt=1/3"), "{done:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_after_a_revision_print_exactly_the_later_events() {
    let cluster = Cluster::start(1).await;
    let client = client(&cluster, "agent-a");
    for index in 0..4 {
        client
            .enqueue("q", task(&format!("e{index}"), json!(index)))
            .await
            .expect("enqueue");
    }
    client
        .kv_put("config/mode", json!("fast"))
        .await
        .expect("kv put");
    let all = client.events(None, None).await.expect("events").events;
    assert_eq!(all.len(), 5, "{all:?}");
    let after = all[1].revision;
    let later: Vec<&Event> = all.iter().filter(|event| event.revision > after).collect();

    let printed = shell(&cluster, &format!(r#""$B" events --after {after}"#)).await;
    assert_eq!(printed.code, Some(0), "{printed:#?}");
    let lines: Vec<&str> = printed.stdout.lines().collect();
    let expected: Vec<String> = later
        .iter()
        .map(|event| match &event.kind {
            EventKind::TaskEnqueued(change) => format!(
                "{} task_enqueued queue=q task={}",
                event.revision, change.task_id
            ),
            EventKind::KvWritten { key, .. } => format!("{} kv_written key={key}", event.revision),
            kind => panic!("unexpected event {kind:?}"),
        })
        .collect();
    assert_eq!(lines, expected, "{printed:#?}");

    let as_json = shell(&cluster, &format!(r#""$B" events --after {after} --json"#)).await;
    assert_eq!(as_json.code, Some(0), "{as_json:#?}");
    let parsed: Vec<Event> = as_json
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("an event per line"))
        .collect();
    assert_eq!(parsed.iter().collect::<Vec<_>>(), later);

    let none = shell(
        &cluster,
        &format!(r#""$B" events --after {}"#, all[4].revision),
    )
    .await;
    assert_eq!(
        (none.code, none.stdout.as_str()),
        (Some(0), ""),
        "{none:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followed_stream_resumes_after_a_restart_without_loss_or_duplicates() {
    let cluster = Cluster::dev().await;
    let client = client(&cluster, "agent-a");
    let mut events = client.follow_events(None);
    let mut seen: Vec<Event> = Vec::new();
    let next = async |events: &mut baton_client::EventStream, seen: &mut Vec<Event>| {
        let event = tokio::time::timeout(STEP_TIMEOUT, events.next())
            .await
            .expect("an event in time")
            .expect("the stream goes on")
            .expect("an event, not an error");
        seen.push(event);
    };

    for index in 0..3 {
        client
            .enqueue("q", task(&format!("before{index}"), json!(index)))
            .await
            .expect("enqueue");
    }
    for _ in 0..3 {
        next(&mut events, &mut seen).await;
    }

    // SIGKILL the node while the stream is open, restart it on its data, and write while the
    // stream is still reconnecting.
    cluster.node(1).kill();
    cluster.node(1).restart();
    cluster.wait_ready(READY_TIMEOUT).await;
    for index in 0..3 {
        client
            .enqueue("q", task(&format!("after{index}"), json!(index)))
            .await
            .expect("enqueue after the restart");
    }
    for _ in 0..3 {
        next(&mut events, &mut seen).await;
    }
    assert_eq!(events.last_revision(), seen[5].revision);

    let ids: Vec<String> = seen
        .iter()
        .map(|event| match &event.kind {
            EventKind::TaskEnqueued(change) => change.task_id.clone(),
            kind => panic!("unexpected event {kind:?}"),
        })
        .collect();
    assert_eq!(
        ids,
        ["before0", "before1", "before2", "after0", "after1", "after2"]
    );
    let revisions: Vec<u64> = seen.iter().map(|event| event.revision).collect();
    assert!(
        revisions.windows(2).all(|pair| pair[0] < pair[1]),
        "{revisions:?}"
    );
    // The stream matches the page form exactly: nothing lost, nothing repeated.
    let page = poll_until(STEP_TIMEOUT, "the page form to answer", async || {
        client.events(None, None).await.ok()
    })
    .await;
    assert_eq!(page.events, seen);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followed_stream_moves_to_another_node_when_the_leader_dies() {
    let cluster = Cluster::start(3).await;
    let client = client(&cluster, "agent-a");
    let mut events = client.follow_events(Some(0));
    let mut ids = Vec::new();
    for phase in ["before", "after"] {
        if phase == "after" {
            let leader = cluster.leader().await;
            leader.kill();
            cluster.leader().await;
        }
        for index in 0..2 {
            client
                .enqueue("q", task(&format!("{phase}{index}"), json!(index)))
                .await
                .expect("enqueue");
        }
        for _ in 0..2 {
            let event = tokio::time::timeout(STEP_TIMEOUT, events.next())
                .await
                .expect("an event in time")
                .expect("the stream goes on")
                .expect("an event, not an error");
            match event.kind {
                EventKind::TaskEnqueued(change) => ids.push(change.task_id),
                kind => panic!("unexpected event {kind:?}"),
            }
        }
    }
    assert_eq!(ids, ["before0", "before1", "after0", "after1"]);
}
