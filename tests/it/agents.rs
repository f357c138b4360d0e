//! The agent runtime of SPEC section 11 against real `batond` processes: `baton task work`
//! settling tasks by its command's status, stopping it when a claim is lost, following the
//! queue.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use baton_client::api::{EnqueueRequest, ListTasksQuery, Task, TaskState};
use baton_client::Client;
use baton_tests::{is_session_id, poll_until, Cluster, Method};
use serde_json::{json, Value};

use super::cli::{baton, command, process_exists, url, KillOnDrop, Outcome};

fn client(cluster: &Cluster) -> Client {
    Client::builder([url(cluster)])
        .holder("producer")
        .build()
        .expect("a client")
}

async fn enqueue(client: &Client, queue: &str, id: &str, payload: Value, max_attempts: u32) {
    client
        .enqueue(
            queue,
            EnqueueRequest {
                id: Some(id.to_owned()),
                payload,
                priority: 0,
                depends_on: Vec::new(),
                max_attempts: Some(max_attempts),
                not_before_ms: None,
            },
        )
        .await
        .expect("enqueue");
}

async fn tasks(client: &Client, queue: &str) -> Vec<Task> {
    let mut tasks = client
        .list_tasks(queue, &ListTasksQuery::default())
        .await
        .expect("list tasks")
        .tasks;
    tasks.sort_by(|a, b| a.id.cmp(&b.id));
    tasks
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[tokio::test]
async fn task_work_completes_on_0_and_fails_otherwise_until_the_queue_is_empty() {
    let cluster = Cluster::start(1).await;
    let endpoints = url(&cluster);
    let producer = client(&cluster);

    let empty = baton(&endpoints, &["task", "work", "builds", "--", "true"]).await;
    empty.expect_code(3);
    assert!(
        empty.error_line().starts_with("error[EMPTY]: "),
        "{empty:#?}"
    );

    enqueue(&producer, "builds", "good", json!({"target": "app"}), 3).await;
    enqueue(&producer, "builds", "bad", json!({"target": "lib"}), 2).await;
    let directory = tempfile::tempdir().expect("a temporary directory");
    let script = format!(
        "printf '%s %s %s %s %s' \"$BATON_QUEUE\" \"$BATON_TASK_PAYLOAD\" \"$BATON_TASK_ATTEMPT\" \
         \"$BATON_FENCE\" \"$BATON_SESSION\" > {dir}/$BATON_TASK_ID.$BATON_TASK_ATTEMPT; \
         [ \"$BATON_TASK_ID\" = good ] || exit 3",
        dir = directory.path().display()
    );
    let worked = baton(
        &endpoints,
        &["task", "work", "builds", "--", "sh", "-c", &script],
    )
    .await;
    worked.expect_code(0);
    assert!(worked.stdout.is_empty(), "{worked:#?}");

    let [bad, good] = <[Task; 2]>::try_from(tasks(&producer, "builds").await).expect("two");
    assert_eq!((good.state, good.attempt), (TaskState::Done, 1), "{good:?}");
    assert_eq!((bad.state, bad.attempt), (TaskState::Dead, 2), "{bad:?}");
    assert_eq!(bad.reason.as_deref(), Some("exit status 3"), "{bad:?}");

    // The command saw its task.
    let seen = read(&directory.path().join("good.1"));
    let words: Vec<&str> = seen.split(' ').collect();
    assert_eq!(words.len(), 5, "{seen}");
    assert_eq!(words[0], "builds");
    assert_eq!(
        serde_json::from_str::<Value>(words[1]).expect("JSON payload"),
        json!({"target": "app"})
    );
    assert_eq!(words[2], "1");
    assert!(
        words[3].parse::<u64>().is_ok_and(|fence| fence > 0),
        "{seen}"
    );
    assert!(is_session_id(words[4]), "{seen}");
    for attempt in ["bad.1", "bad.2"] {
        assert!(directory.path().join(attempt).exists(), "{attempt}");
    }
}

#[tokio::test]
async fn task_work_once_takes_one_task() {
    let cluster = Cluster::start(1).await;
    let producer = client(&cluster);
    for id in ["t1", "t2"] {
        enqueue(&producer, "once", id, json!(id), 3).await;
    }
    baton(
        &url(&cluster),
        &["task", "work", "once", "--once", "--", "true"],
    )
    .await
    .expect_code(0);
    let states: Vec<TaskState> = tasks(&producer, "once")
        .await
        .iter()
        .map(|task| task.state)
        .collect();
    assert_eq!(states, [TaskState::Done, TaskState::Ready]);
}

#[tokio::test]
async fn task_work_stops_the_command_and_exits_4_when_the_claim_is_lost() {
    let cluster = Cluster::start(1).await;
    let producer = client(&cluster);
    enqueue(&producer, "long", "job", json!({}), 3).await;
    let directory = tempfile::tempdir().expect("a temporary directory");
    let started = directory.path().join("started");
    let script = format!(
        "echo $$ $BATON_SESSION > {started}.tmp && mv {started}.tmp {started}; exec sleep 60",
        started = started.display()
    );
    let work = command(
        &url(&cluster),
        &[
            "task", "work", "long", "--ttl", "3s", "--grace", "2s", "--", "sh", "-c", &script,
        ],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn baton task work");
    let (pid, session): (u32, String) = poll_until(
        Duration::from_secs(20),
        "the command to start",
        async || {
            let text = std::fs::read_to_string(&started).ok()?;
            let (pid, session) = text.trim().split_once(' ')?;
            Some((pid.parse().ok()?, session.to_owned()))
        },
    )
    .await;
    let _reaper = KillOnDrop(pid);

    cluster
        .api()
        .call(
            Method::DELETE,
            cluster.node(1),
            &format!("/v1/sessions/{session}"),
        )
        .send()
        .await
        .expect_status(200);
    let output = tokio::time::timeout(Duration::from_secs(15), work.wait_with_output())
        .await
        .expect("baton task work exits once its claim is gone")
        .expect("wait for baton task work");
    let outcome = Outcome {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    outcome.expect_code(4);
    assert!(
        outcome.error_line().starts_with("error[LEASE_LOST]: ")
            && outcome.error_line().contains("session ended"),
        "{outcome:#?}"
    );
    assert!(!process_exists(pid), "the command still runs: {outcome:#?}");
    // Not failed by the worker: ready again for someone else, the lost attempt counted.
    let [task] = <[Task; 1]>::try_from(tasks(&producer, "long").await).expect("one");
    assert_eq!(task.state, TaskState::Ready, "{task:?}");
    assert_eq!(task.reason, None, "{task:?}");
}

#[tokio::test]
async fn task_work_follow_picks_up_a_task_enqueued_later() {
    let cluster = Cluster::start(1).await;
    let producer = client(&cluster);
    let directory = tempfile::tempdir().expect("a temporary directory");
    let log = directory.path().join("log");
    let script = format!("echo $BATON_TASK_ID >> {}", log.display());
    let mut work = command(
        &url(&cluster),
        &[
            "task", "work", "later", "--follow", "--", "sh", "-c", &script,
        ],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("spawn baton task work --follow");

    for id in ["first", "second"] {
        enqueue(&producer, "later", id, json!(id), 3).await;
        // Well inside the 10 s re-check: the event stream woke the worker.
        poll_until(
            Duration::from_secs(5),
            "the task to be worked",
            async || read(&log).lines().any(|line| line == id).then_some(()),
        )
        .await;
    }
    poll_until(Duration::from_secs(5), "both tasks done", async || {
        let done = tasks(&producer, "later")
            .await
            .iter()
            .all(|task| task.state == TaskState::Done);
        done.then_some(())
    })
    .await;
    assert!(
        work.try_wait().expect("baton task work's status").is_none(),
        "--follow exited on an empty queue"
    );
    work.start_kill().expect("stop the worker");
}
