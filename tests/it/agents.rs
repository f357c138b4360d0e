//! The agent runtime of docs/agents.md against real `batond` processes: `baton task work`
//! settling tasks by its command's status, stopping it when a claim is lost, following the
//! queue, and failing closed. The fan-out snippet of `docs/agents.md` and the README is run as
//! it is written (the hook's tests are in `hook.rs`).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use baton_client::api::{EnqueueRequest, ListTasksQuery, Task, TaskState};
use baton_client::Client;
use baton_tests::{is_session_id, path_with_baton, poll_until, snippet, Cluster, Method};
use serde_json::{json, Value};

use super::cli::{baton, command, process_exists, url, KillOnDrop, Outcome, COMMAND_TIMEOUT};
use super::hook::run_with_input;

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
                on_dead: None,
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

/// docs/agents.md: a lost claim stops the command within a second, not at the next renewal
/// (a third of `--ttl`, 20 s here): the worker watches its claim on the event stream.
#[tokio::test]
async fn task_work_stops_its_command_within_a_second_of_the_claim_ending_on_the_server() {
    const STOPPED_WITHIN: Duration = Duration::from_secs(1);
    let cluster = Cluster::start(1).await;
    let producer = client(&cluster);
    let directory = tempfile::tempdir().expect("a temporary directory");
    // Each way a claim ends on the server while its worker is connected: the session ended
    // (an operator, or anyone holding BATON_SESSION), the task released with the claim's fence.
    for how in ["the session ended", "the task released"] {
        let queue = if how == "the session ended" {
            "ended"
        } else {
            "released"
        };
        enqueue(&producer, queue, "job", json!({}), 3).await;
        let started = directory.path().join(queue);
        let script = format!(
            "echo $$ $BATON_SESSION $BATON_FENCE > {started}.tmp && mv {started}.tmp {started}; \
             exec sleep 60",
            started = started.display()
        );
        let work = command(
            &url(&cluster),
            &[
                "task", "work", queue, "--ttl", "60s", "--grace", "2s", "--", "sh", "-c", &script,
            ],
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn baton task work");
        let (pid, session, fence): (u32, String, u64) = poll_until(
            Duration::from_secs(20),
            "the command to start",
            async || {
                let text = std::fs::read_to_string(&started).ok()?;
                let mut words = text.split_whitespace();
                let pid = words.next()?.parse().ok()?;
                let session = words.next()?.to_owned();
                let fence = words.next()?.parse().ok()?;
                Some((pid, session, fence))
            },
        )
        .await;
        let _reaper = KillOnDrop(pid);

        let reply = match how {
            "the session ended" => {
                cluster
                    .api()
                    .call(
                        Method::DELETE,
                        cluster.node(1),
                        &format!("/v1/sessions/{session}"),
                    )
                    .send()
                    .await
            }
            _ => {
                cluster
                    .api()
                    .post(
                        cluster.node(1),
                        &format!("/v1/queues/{queue}/tasks/job/release"),
                        &json!({"session_id": session, "fence": fence}),
                    )
                    .await
            }
        };
        reply.expect_status(200);
        poll_until(
            STOPPED_WITHIN,
            &format!("{how}: the command to be stopped"),
            async || (!process_exists(pid)).then_some(()),
        )
        .await;
        let output = tokio::time::timeout(Duration::from_secs(15), work.wait_with_output())
            .await
            .expect("baton task work exits once its command is stopped")
            .expect("wait for baton task work");
        let outcome = Outcome {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        };
        outcome.expect_code(4);
        assert!(
            outcome.error_line().starts_with("error[LEASE_LOST]: ")
                && outcome.error_line().contains("job"),
            "{how}: {outcome:#?}"
        );
        let [task] = <[Task; 1]>::try_from(tasks(&producer, queue).await).expect("one");
        assert_eq!(task.state, TaskState::Ready, "{how}: {task:?}");
    }
}

#[tokio::test]
async fn a_sigkilled_worker_takes_its_command_and_its_children_along() {
    let cluster = Cluster::start(1).await;
    let producer = client(&cluster);
    enqueue(&producer, "killed", "job", json!({}), 3).await;
    let directory = tempfile::tempdir().expect("a temporary directory");
    let pids = directory.path().join("pids");
    let script = format!(
        "sleep 300 & echo $$ $! > {pids}.tmp && mv {pids}.tmp {pids}; wait",
        pids = pids.display()
    );
    let mut work = command(
        &url(&cluster),
        &["task", "work", "killed", "--", "sh", "-c", &script],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("spawn baton task work");
    let (child, grandchild): (u32, u32) = poll_until(
        Duration::from_secs(20),
        "the command to start",
        async || {
            let text = std::fs::read_to_string(&pids).ok()?;
            let mut words = text.split_whitespace();
            Some((words.next()?.parse().ok()?, words.next()?.parse().ok()?))
        },
    )
    .await;
    let _reapers = (KillOnDrop(child), KillOnDrop(grandchild));

    work.start_kill().expect("SIGKILL the worker");
    work.wait().await.expect("reap the worker");
    poll_until(
        Duration::from_secs(2),
        "the command and its child to die",
        async || (!process_exists(child) && !process_exists(grandchild)).then_some(()),
    )
    .await;
}

#[tokio::test]
async fn an_interrupted_worker_passes_the_signal_on_and_releases_its_task() {
    let cluster = Cluster::start(1).await;
    let producer = client(&cluster);
    enqueue(&producer, "interrupted", "job", json!({}), 3).await;
    let directory = tempfile::tempdir().expect("a temporary directory");
    let ready = directory.path().join("ready");
    // Only builtins once the pid is written: the shell blocks in `read` on a FIFO it holds
    // open itself, so no child of its own can die of the signal before the trap runs.
    let script = format!(
        "trap 'exit 42' TERM; mkfifo {fifo}; exec 3<>{fifo}; echo $$ > {ready}; \
         while :; do read line <&3; done",
        fifo = directory.path().join("fifo").display(),
        ready = ready.display()
    );
    let work = command(
        &url(&cluster),
        &["task", "work", "interrupted", "--", "sh", "-c", &script],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn baton task work");
    let pid: u32 = poll_until(
        Duration::from_secs(20),
        "the command to start",
        async || std::fs::read_to_string(&ready).ok()?.trim().parse().ok(),
    )
    .await;
    let _reaper = KillOnDrop(pid);
    let sent = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(work.id().expect("the worker's pid").to_string())
        .status()
        .expect("run kill");
    assert!(sent.success());
    let output = tokio::time::timeout(Duration::from_secs(15), work.wait_with_output())
        .await
        .expect("the worker exits after its command")
        .expect("wait for the worker");
    assert_eq!(
        output.status.code(),
        Some(42),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Released, not failed: ready again, no failure reason.
    let [task] = <[Task; 1]>::try_from(tasks(&producer, "interrupted").await).expect("one");
    assert_eq!(task.state, TaskState::Ready, "{task:?}");
    assert_eq!(task.reason, None, "{task:?}");
    assert_eq!(
        task.note.as_deref(),
        Some("baton task work was interrupted"),
        "{task:?}"
    );
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
    // An idle worker still ends on SIGTERM (a service manager's stop), with 128 + 15.
    let sent = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(work.id().expect("the worker's pid").to_string())
        .status()
        .expect("run kill");
    assert!(sent.success());
    let status = tokio::time::timeout(Duration::from_secs(5), work.wait())
        .await
        .expect("an idle worker ends on SIGTERM")
        .expect("wait for the worker");
    assert_eq!(status.code(), Some(143), "{status:?}");
}

#[tokio::test]
async fn the_documented_fan_out_supervisor_works_the_whole_queue() {
    let script = snippet("README.md", "fan-out.sh");
    assert_eq!(script, snippet("docs/agents.md", "fan-out.sh"));
    let cluster = Cluster::start(1).await;
    let producer = client(&cluster);
    let ids: Vec<String> = (1..=6).map(|n| format!("lint-{n}")).collect();
    for id in &ids {
        enqueue(
            &producer,
            "lint",
            id,
            json!({"file": format!("src/{id}.rs")}),
            3,
        )
        .await;
    }
    let directory = tempfile::tempdir().expect("a temporary directory");
    let fan_out = directory.path().join("fan-out.sh");
    std::fs::write(&fan_out, &script).expect("write fan-out.sh");
    let log = directory.path().join("log");
    let work = format!("echo \"$BATON_TASK_ID\" >> {}", log.display());
    let mut shell = tokio::process::Command::new("sh");
    shell
        .arg(&fan_out)
        .args(["lint", "3", "sh", "-c", &work])
        .env("PATH", path_with_baton())
        .env("BATON_ENDPOINTS", url(&cluster))
        .kill_on_drop(true);
    let outcome = run_with_input(shell, b"").await;
    outcome.expect_code(0);

    let mut worked: Vec<String> = read(&log).lines().map(str::to_owned).collect();
    worked.sort();
    assert_eq!(worked, ids, "each task once: {outcome:#?}");
    assert!(tasks(&producer, "lint")
        .await
        .iter()
        .all(|task| task.state == TaskState::Done));
}

// ---------------------------------------------------------------------------------------------
// `baton run` and `baton task work` failing closed (docs/agents.md, "Failing closed: baton run
// and task work"): a failure before the claim never starts the command
// ---------------------------------------------------------------------------------------------

/// `baton ARGS... -- sh -c 'touch MARKER'` with extra environment: its outcome, after checking
/// that the command never ran.
async fn never_starts(
    endpoints: &str,
    args: &[&str],
    environment: &[(&str, &str)],
    marker: &Path,
) -> Outcome {
    let script = format!("touch {}", marker.display());
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--", "sh", "-c", &script]);
    let mut command = command(endpoints, &all);
    command.envs(environment.iter().copied());
    let output = tokio::time::timeout(
        COMMAND_TIMEOUT,
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("baton {args:?} did not finish within {COMMAND_TIMEOUT:?}"))
    .expect("run baton");
    let outcome = Outcome {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    assert!(
        !marker.exists(),
        "{args:?}: the command ran although nothing was claimed: {outcome:#?}"
    );
    outcome
}

#[tokio::test]
async fn run_and_task_work_never_start_the_command_on_a_bad_flag_a_refusal_or_no_answer() {
    let cluster = Cluster::start(3).await;
    let producer = client(&cluster);
    let directory = tempfile::tempdir().expect("a temporary directory");
    let marker = directory.path().join("ran");
    let leader = cluster.leader().await.id;
    let follower = cluster
        .nodes()
        .iter()
        .find(|node| node.id != leader)
        .expect("a follower")
        .api_url();
    let endpoints = follower.clone();
    for queue in ["refused", "paused", "leaderless"] {
        enqueue(&producer, queue, "job", json!({}), 3).await;
    }
    cluster
        .api()
        .post(
            cluster.node(leader),
            "/v1/leases",
            &json!({"resource": "held/resource", "holder": "someone-else", "ttl_ms": 120_000}),
        )
        .await
        .expect_status(201);

    // (row, baton's arguments, exit code, what the error line starts with)
    let closed = format!("http://127.0.0.1:{}", baton_tests::free_port());
    for (row, endpoints, args, code, error) in [
        (
            "bad flag",
            &endpoints,
            &["run", "x", "--ttl", "banana"][..],
            2,
            "error: invalid value 'banana' for '--ttl",
        ),
        (
            "bad flag",
            &endpoints,
            &["task", "work", "refused", "--ttl", "banana"][..],
            2,
            "error: invalid value 'banana' for '--ttl",
        ),
        (
            "bad state",
            &endpoints,
            &["run", "held/resource"][..],
            4,
            "error[LEASE_HELD]: ",
        ),
        (
            "bad state",
            &endpoints,
            &["task", "work", "empty"][..],
            3,
            "error[EMPTY]: ",
        ),
        (
            "4xx",
            &endpoints,
            &["run", "x", "--ttl", "10ms"][..],
            2,
            "error[INVALID_ARGUMENT]: ",
        ),
        (
            "4xx",
            &endpoints,
            &["task", "work", "refused", "--ttl", "10ms"][..],
            2,
            "error[INVALID_ARGUMENT]: ",
        ),
        (
            "unreachable",
            &closed,
            &["run", "x", "--timeout", "3s"][..],
            1,
            "error[",
        ),
        (
            "unreachable",
            &closed,
            &["task", "work", "refused", "--timeout", "3s"][..],
            1,
            "error[",
        ),
    ] {
        let outcome = never_starts(endpoints, args, &[], &marker).await;
        outcome.expect_code(code);
        // clap's usage error ends with a hint line; Baton's refusals are the last line.
        let said = match row {
            "bad flag" => outcome.stderr.starts_with(error),
            _ => outcome.error_line().starts_with(error),
        };
        assert!(said, "{row} {args:?}: {outcome:#?}");
    }
    let [task] = <[Task; 1]>::try_from(tasks(&producer, "refused").await).expect("one");
    assert_eq!(task.state, TaskState::Ready, "refused: {task:?}");

    // Timeout: the node answers nothing (SIGSTOP) until --timeout.
    let paused = cluster
        .nodes()
        .iter()
        .find(|node| node.api_url() == follower)
        .expect("the follower");
    paused.pause();
    for args in [
        &["run", "paused/resource", "--timeout", "2s"][..],
        &["task", "work", "paused", "--timeout", "2s"][..],
    ] {
        let outcome = never_starts(&follower, args, &[], &marker).await;
        outcome.expect_code(1);
        assert!(
            outcome.error_line().starts_with("error["),
            "timeout {args:?}: {outcome:#?}"
        );
    }
    paused.resume();

    // 5xx: a node that has lost its cluster answers NO_LEADER (503) until --timeout.
    for node in cluster.nodes() {
        if node.api_url() != follower {
            node.kill();
        }
    }
    for args in [
        &["run", "leaderless/resource", "--timeout", "3s"][..],
        &["task", "work", "leaderless", "--timeout", "3s"][..],
    ] {
        let outcome = never_starts(&follower, args, &[], &marker).await;
        outcome.expect_code(1);
        assert!(
            outcome.error_line().starts_with("error["),
            "5xx {args:?}: {outcome:#?}"
        );
    }
}

#[tokio::test]
async fn run_and_task_work_never_start_the_command_on_a_tls_or_token_failure() {
    const BOOTSTRAP: &str = "bootstrap-secret-for-work-tests-01";
    let dir = tempfile::tempdir().expect("a directory for certificates");
    let certs = baton_tests::TestCerts::generate(dir.path(), "cluster", &[]);
    let cluster = Cluster::start_with(baton_tests::ClusterConfig {
        bootstrap_token: Some(BOOTSTRAP.to_owned()),
        tls: Some(certs.clone()),
        ..baton_tests::ClusterConfig::new(1)
    })
    .await;
    let endpoints = url(&cluster);
    let producer = Client::builder([endpoints.as_str()])
        .token(BOOTSTRAP)
        .ca_certificates(certs.ca_pem())
        .holder("producer")
        .build()
        .expect("a client");
    enqueue(&producer, "secured", "job", json!({}), 3).await;
    let ca = certs.ca.to_string_lossy().into_owned();
    let marker = dir.path().join("ran");

    for (row, environment, code, error) in [
        // No CA for the node's certificate: the TLS handshake fails, nothing is sent, and it
        // is said as the configuration error it is.
        ("TLS", vec![("BATON_TOKEN", BOOTSTRAP)], 2, "error[TLS]: "),
        (
            "auth",
            vec![
                ("BATON_TOKEN", "not-a-token-of-this-cluster"),
                ("BATON_CA_FILE", ca.as_str()),
            ],
            1,
            "error[UNAUTHENTICATED]: ",
        ),
        (
            "auth",
            vec![("BATON_CA_FILE", ca.as_str())],
            1,
            "error[UNAUTHENTICATED]: ",
        ),
    ] {
        for args in [
            &["run", "secured/resource", "--timeout", "3s"][..],
            &["task", "work", "secured", "--timeout", "3s"][..],
        ] {
            let outcome = never_starts(&endpoints, args, &environment, &marker).await;
            outcome.expect_code(code);
            assert!(
                outcome.error_line().starts_with(error),
                "{row} {args:?}: {outcome:#?}"
            );
        }
    }
    let [task] = <[Task; 1]>::try_from(tasks(&producer, "secured").await).expect("one");
    assert_eq!(task.state, TaskState::Ready, "{task:?}");
    assert!(lease_free(&producer, "secured/resource").await);
}

async fn lease_free(client: &Client, resource: &str) -> bool {
    matches!(
        client.get_lease(resource).await,
        Err(baton_client::Error::NotFound { .. })
    )
}
