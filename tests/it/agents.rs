//! The agent runtime of docs/agents.md against real `batond` processes: `baton task work`
//! settling tasks by its command's status, stopping it when a claim is lost, following the
//! queue, and `baton hook claude-code` fed real Claude Code hook events. The snippets of
//! `docs/agents.md` and the README are run as they are written.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use baton_client::api::{EnqueueRequest, Lease, ListTasksQuery, SessionInfo, Task, TaskState};
use baton_client::Client;
use baton_tests::{is_session_id, path_with_baton, poll_until, snippet, Cluster, Method};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use super::cli::{baton, command, process_exists, url, KillOnDrop, Outcome, COMMAND_TIMEOUT};

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

// ---------------------------------------------------------------------------------------------
// baton hook claude-code
// ---------------------------------------------------------------------------------------------

/// A repository with a `.git` directory and a state directory for the hook.
pub(crate) struct HookWorld {
    _directory: tempfile::TempDir,
    pub(crate) repo: PathBuf,
    pub(crate) state: PathBuf,
}

impl HookWorld {
    pub(crate) fn new() -> HookWorld {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let repo = directory.path().join("repo");
        std::fs::create_dir_all(repo.join(".git")).expect("a .git directory");
        std::fs::create_dir_all(repo.join("src")).expect("src");
        let state = directory.path().join("state");
        HookWorld {
            _directory: directory,
            repo,
            state,
        }
    }

    /// A `PreToolUse` event of `tool` editing `file` (relative to the repository).
    pub(crate) fn pre_tool_use(&self, session: &str, tool: &str, file: &str) -> Value {
        let field = if tool == "NotebookEdit" {
            "notebook_path"
        } else {
            "file_path"
        };
        json!({
            "session_id": session,
            "transcript_path": format!("/home/u/.claude/projects/x/{session}.jsonl"),
            "cwd": self.repo,
            "permission_mode": "default",
            "hook_event_name": "PreToolUse",
            "tool_name": tool,
            "tool_input": {field: self.repo.join(file), "old_string": "a", "new_string": "b"},
        })
    }

    pub(crate) fn session_end(&self, session: &str) -> Value {
        json!({
            "session_id": session,
            "transcript_path": format!("/home/u/.claude/projects/x/{session}.jsonl"),
            "cwd": self.repo,
            "hook_event_name": "SessionEnd",
            "reason": "exit",
        })
    }

    pub(crate) fn state_file(&self, session: &str) -> PathBuf {
        self.state.join("baton").join("claude-code").join(session)
    }

    /// `baton hook claude-code ARGS` with `input` on stdin.
    pub(crate) async fn hook(&self, endpoints: &str, args: &[&str], input: &[u8]) -> Outcome {
        let mut full = vec!["hook", "claude-code"];
        full.extend_from_slice(args);
        let mut hook = command(endpoints, &full);
        hook.env_remove("BATON_HOLDER")
            .env("XDG_STATE_HOME", &self.state)
            .current_dir(&self.repo);
        run_with_input(hook, input).await
    }
}

/// Runs `command` with `input` on stdin; returns its outcome.
pub(crate) async fn run_with_input(mut command: tokio::process::Command, input: &[u8]) -> Outcome {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(input).await.expect("write stdin");
    drop(stdin);
    let output = tokio::time::timeout(COMMAND_TIMEOUT, child.wait_with_output())
        .await
        .expect("the command finishes")
        .expect("wait");
    Outcome {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

pub(crate) fn bytes(event: &Value) -> Vec<u8> {
    serde_json::to_vec(event).expect("JSON")
}

/// The reason of a `deny` decision, checking the decision's exact shape.
pub(crate) fn denial(outcome: &Outcome) -> String {
    outcome.expect_code(0);
    let answer: Value = outcome.json();
    let output = &answer["hookSpecificOutput"];
    assert_eq!(answer.as_object().map(|o| o.len()), Some(1), "{answer}");
    assert_eq!(output["hookEventName"], "PreToolUse", "{answer}");
    assert_eq!(output["permissionDecision"], "deny", "{answer}");
    assert_eq!(output.as_object().map(|o| o.len()), Some(3), "{answer}");
    output["permissionDecisionReason"]
        .as_str()
        .expect("a reason")
        .to_owned()
}

pub(crate) fn allowed(outcome: &Outcome) {
    outcome.expect_code(0);
    assert!(outcome.stdout.is_empty(), "not allowed: {outcome:#?}");
}

async fn lease(cluster: &Cluster, resource: &str) -> Option<Lease> {
    let reply = cluster
        .api()
        .get(cluster.node(1), &format!("/v1/leases/{resource}"))
        .await;
    reply.is_success().then(|| reply.parse())
}

#[tokio::test]
async fn the_claude_code_hook_claims_denies_renews_and_releases() {
    let cluster = Cluster::start(1).await;
    let endpoints = url(&cluster);
    let world = HookWorld::new();
    let agent_a = "aaaaaaaa-1111-4111-8111-111111111111";
    let agent_b = "bbbbbbbb-2222-4222-8222-222222222222";

    // Granted: no output; the lease names the Claude session.
    let edit = world.pre_tool_use(agent_a, "Edit", "src/auth.rs");
    allowed(
        &world
            .hook(&endpoints, &["--ttl", "3s"], &bytes(&edit))
            .await,
    );
    let held = lease(&cluster, "src/auth.rs").await.expect("a lease");
    assert!(held.holder.starts_with("claude-code:aaaaaaaa@"), "{held:?}");
    let state = world.state_file(agent_a);
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&state)
            .expect("a state file")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);

    // Renewed by every call: calls a second apart, spanning more than the 3 s TTL, keep the
    // same lease (a gap of up to 3 s between two calls is tolerated, for a loaded machine).
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        let again = world.pre_tool_use(agent_a, "MultiEdit", "src/auth.rs");
        allowed(
            &world
                .hook(&endpoints, &["--ttl", "3s"], &bytes(&again))
                .await,
        );
    }
    let renewed = lease(&cluster, "src/auth.rs").await.expect("still held");
    assert_eq!(renewed.fence, held.fence, "the session was not renewed");

    // Another Claude session is denied, naming holder and fence.
    let other = world.pre_tool_use(agent_b, "Write", "src/auth.rs");
    let reason = denial(&world.hook(&endpoints, &[], &bytes(&other)).await);
    assert!(
        reason.starts_with("src/auth.rs is held by claude-code:aaaaaaaa@")
            && reason.contains(&format!("(fence {})", held.fence)),
        "{reason}"
    );
    // It may edit other files; notebooks are files too.
    let notebook = world.pre_tool_use(agent_b, "NotebookEdit", "analysis.ipynb");
    allowed(&world.hook(&endpoints, &[], &bytes(&notebook)).await);
    assert!(lease(&cluster, "analysis.ipynb").await.is_some());

    // SessionEnd releases everything and forgets the session.
    let end = world.session_end(agent_a);
    allowed(&world.hook(&endpoints, &[], &bytes(&end)).await);
    assert!(lease(&cluster, "src/auth.rs").await.is_none());
    assert!(!state.exists());
    allowed(&world.hook(&endpoints, &[], &bytes(&other)).await);
    assert!(lease(&cluster, "src/auth.rs")
        .await
        .is_some_and(|lease| lease.holder.starts_with("claude-code:bbbbbbbb@")));
}

#[tokio::test]
async fn the_claude_code_hook_ignores_what_it_does_not_claim() {
    let cluster = Cluster::start(1).await;
    let endpoints = url(&cluster);
    let world = HookWorld::new();
    let session = "cccccccc-3333";

    let read = json!({
        "session_id": session, "cwd": world.repo, "hook_event_name": "PreToolUse",
        "tool_name": "Read", "tool_input": {"file_path": world.repo.join("src/a.rs")},
    });
    let prompt = json!({
        "session_id": session, "cwd": world.repo, "hook_event_name": "UserPromptSubmit",
        "prompt": "hello",
    });
    let outside = json!({
        "session_id": session, "cwd": world.repo, "hook_event_name": "PreToolUse",
        "tool_name": "Edit", "tool_input": {"file_path": "/etc/hosts"},
    });
    for event in [read, prompt, outside] {
        allowed(&world.hook(&endpoints, &[], &bytes(&event)).await);
    }
    let malformed = world.hook(&endpoints, &[], b"{not json").await;
    allowed(&malformed);
    assert_eq!(malformed.stderr.lines().count(), 1, "{malformed:#?}");
    let leases: Value = cluster
        .api()
        .get(cluster.node(1), "/v1/leases")
        .await
        .expect_json(200);
    assert_eq!(leases["leases"], json!([]), "{leases}");

    // --root: paths are named relative to it.
    let edit = world.pre_tool_use(session, "Edit", "src/lib.rs");
    let root = world.repo.join("src");
    let root = root.to_str().expect("UTF-8");
    allowed(
        &world
            .hook(&endpoints, &["--root", root], &bytes(&edit))
            .await,
    );
    assert!(lease(&cluster, "lib.rs").await.is_some());

    // A root named through a symbolic link still holds the file's real path.
    let link = world.repo.parent().expect("a parent").join("link");
    std::os::unix::fs::symlink(&world.repo, &link).expect("a symbolic link");
    let linked = link.to_str().expect("UTF-8");
    let real = world.pre_tool_use(session, "Write", "src/new/mod.rs");
    allowed(
        &world
            .hook(&endpoints, &["--root", linked], &bytes(&real))
            .await,
    );
    assert!(lease(&cluster, "src/new/mod.rs").await.is_some());

    // A corrupt state file is replaced by a new session.
    std::fs::write(world.state_file(session), "\u{0}garbage\n").expect("corrupt it");
    let next = world.pre_tool_use(session, "Edit", "src/main.rs");
    allowed(&world.hook(&endpoints, &[], &bytes(&next)).await);
    let kept = read_state(&world.state_file(session));
    assert!(is_session_id(&kept), "{kept:?}");
}

#[tokio::test]
async fn parallel_first_edits_of_one_claude_session_share_one_baton_session() {
    let cluster = Cluster::start(1).await;
    let endpoints = url(&cluster);
    let world = HookWorld::new();
    let session = "99999999-parallel";
    // Claude Code runs the hooks of parallel tool calls at once.
    let files = ["src/a.rs", "src/b.rs", "src/c.rs", "src/d.rs"];
    let calls = files.map(|file| {
        let event = bytes(&world.pre_tool_use(session, "Edit", file));
        let world = &world;
        let endpoints = &endpoints;
        async move { world.hook(endpoints, &[], &event).await }
    });
    let [a, b, c, d] = calls;
    let outcomes = tokio::join!(a, b, c, d);
    for outcome in [&outcomes.0, &outcomes.1, &outcomes.2, &outcomes.3] {
        allowed(outcome);
    }
    let kept = read_state(&world.state_file(session));
    let info: SessionInfo = cluster
        .api()
        .get(cluster.node(1), &format!("/v1/sessions/{kept}"))
        .await
        .expect_json(200);
    let mut held: Vec<&str> = info.leases.iter().map(|l| l.resource.as_str()).collect();
    held.sort_unstable();
    assert_eq!(held, files, "the kept session does not hold every file");
}

fn read_state(path: &Path) -> String {
    read(path).trim().to_owned()
}

#[tokio::test]
async fn the_claude_code_hook_denies_when_baton_is_unreachable_unless_failing_open() {
    let world = HookWorld::new();
    let closed = format!("http://127.0.0.1:{}", baton_tests::free_port());
    let edit = world.pre_tool_use("dddddddd-4444", "Edit", "src/auth.rs");
    let reason = denial(&world.hook(&closed, &[], &bytes(&edit)).await);
    assert!(reason.contains("unreachable"), "{reason}");
    assert!(reason.starts_with("src/auth.rs "), "{reason}");
    let open = world.hook(&closed, &["--fail-open"], &bytes(&edit)).await;
    allowed(&open);
    assert!(open.stderr.contains("unreachable"), "{open:#?}");
    // An endpoint the client cannot even use is as unreachable: still exit 0.
    let misconfigured = world.hook("https://127.0.0.1:1", &[], &bytes(&edit)).await;
    assert!(
        denial(&misconfigured).contains("unreachable"),
        "{misconfigured:#?}"
    );
}

// ---------------------------------------------------------------------------------------------
// The snippets of docs/agents.md and the README, run as written
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn the_documented_settings_json_hook_claims_and_denies() {
    let readme = snippet("README.md", "settings.json");
    assert_eq!(readme, snippet("docs/agents.md", "settings.json"));
    let settings: Value = serde_json::from_str(&readme).expect("settings.json parses");
    let pre_tool_use = &settings["hooks"]["PreToolUse"][0];
    let matcher = pre_tool_use["matcher"].as_str().expect("a matcher");
    let matched: Vec<&str> = matcher.split('|').collect();
    assert_eq!(matched, ["Edit", "Write", "MultiEdit", "NotebookEdit"]);
    let hook = pre_tool_use["hooks"][0]["command"]
        .as_str()
        .expect("a command");
    assert_eq!(
        settings["hooks"]["SessionEnd"][0]["hooks"][0]["command"], hook,
        "{settings}"
    );

    // Claude Code runs the command with a shell, the event on stdin.
    let cluster = Cluster::start(1).await;
    let endpoints = url(&cluster);
    let world = HookWorld::new();
    let run = async |event: Value| {
        let mut shell = tokio::process::Command::new("sh");
        shell
            .args(["-c", hook])
            .env("PATH", path_with_baton())
            .env("BATON_ENDPOINTS", &endpoints)
            .env_remove("BATON_HOLDER")
            .env("XDG_STATE_HOME", &world.state)
            .current_dir(&world.repo);
        run_with_input(shell, &bytes(&event)).await
    };
    allowed(&run(world.pre_tool_use("eeeeeeee-5", "Edit", "src/db.rs")).await);
    let reason = denial(&run(world.pre_tool_use("ffffffff-6", "Write", "src/db.rs")).await);
    assert!(
        reason.starts_with("src/db.rs is held by claude-code:eeeeeeee@"),
        "{reason}"
    );
    allowed(&run(world.session_end("eeeeeeee-5")).await);
    allowed(&run(world.pre_tool_use("ffffffff-6", "Write", "src/db.rs")).await);
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
