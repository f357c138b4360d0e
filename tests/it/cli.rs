//! The `baton` command line against real `batond` processes: every exit code of docs/cli.md
//! in its real situation, the one-line error format, `--json` output that parses, and
//! `baton run` holding a lease exactly as long as its command runs.
//!
//! `baton` is built once (like `batond` by the harness) and found next to `batond`; set
//! `BATON_BIN` to test a prebuilt one. Every process a test starts is killed on drop.

use std::process::Stdio;
use std::time::{Duration, Instant};

use baton_client::api::{
    ClusterStatus, CreateSessionResponse, EndSessionResponse, FenceCheckResponse, Grant,
    KeepaliveResponse, KvDeleteResponse, KvEntry, KvPutResponse, Lease, LeaseList, ReleaseResponse,
    SessionInfo,
};
use baton_tests::{
    baton_path, free_port, is_session_id, mentions_number, poll_until, Cluster, Method,
};
use serde::de::DeserializeOwned;

/// How long one `baton` command may take before the test calls it a hang.
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// The outcome of one `baton` command.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Outcome {
    pub(crate) fn expect_code(&self, code: i32) -> &Outcome {
        assert_eq!(self.code, Some(code), "unexpected exit: {self:#?}");
        self
    }

    /// The last line on stderr: where the error line must be.
    pub(crate) fn error_line(&self) -> &str {
        self.stderr.lines().last().unwrap_or_default()
    }

    pub(crate) fn json<T: DeserializeOwned>(&self) -> T {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|error| panic!("stdout is not the expected JSON ({error}): {self:#?}"))
    }
}

/// `baton ARGS` against `endpoints`, with a clean `BATON_*` environment and holder `tester`.
pub(crate) async fn baton(endpoints: &str, args: &[&str]) -> Outcome {
    let child = command(endpoints, args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn baton");
    let output = tokio::time::timeout(COMMAND_TIMEOUT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("baton {args:?} did not finish within {COMMAND_TIMEOUT:?}"))
        .expect("wait for baton");
    Outcome {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

pub(crate) fn command(endpoints: &str, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(baton_path());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("BATON_") {
            command.env_remove(key);
        }
    }
    command
        .args(args)
        .env("BATON_ENDPOINTS", endpoints)
        .env("BATON_HOLDER", "tester")
        .kill_on_drop(true);
    command
}

pub(crate) fn url(cluster: &Cluster) -> String {
    cluster.node(1).api_url()
}

/// True when `line` names a remaining time such as `38s` or `1m5s`.
fn names_remaining_time(line: &str) -> bool {
    line.split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .any(|word| {
            word.len() > 1 && word.ends_with('s') && word.starts_with(|c: char| c.is_ascii_digit())
        })
}

#[tokio::test]
async fn every_exit_code_in_its_real_situation() {
    let cluster = Cluster::start(1).await;
    let endpoints = url(&cluster);

    // 0: granted.
    let granted = baton(
        &endpoints,
        &["acquire", "repo/src/auth.rs", "--holder", "agent-a"],
    )
    .await;
    granted.expect_code(0);
    let line = granted.stdout.trim();
    assert!(
        line.starts_with("acquired repo/src/auth.rs fence=") && line.contains(" session="),
        "{granted:#?}"
    );
    let lease: Lease = cluster
        .api()
        .get(cluster.node(1), "/v1/leases/repo/src/auth.rs")
        .await
        .expect_json(200);

    // 4: held by someone else; one error line that names holder, fence and time left.
    let held = baton(
        &endpoints,
        &["acquire", "repo/src/auth.rs", "--holder", "agent-b"],
    )
    .await;
    held.expect_code(4);
    let error = held.error_line();
    assert!(error.starts_with("error[LEASE_HELD]: "), "{held:#?}");
    assert!(
        error.contains("agent-a"),
        "the holder is not named: {error}"
    );
    assert!(
        mentions_number(error, lease.fence),
        "the fence is not named: {error}"
    );
    assert!(
        names_remaining_time(error),
        "the time left is not named: {error}"
    );
    assert!(held.stdout.is_empty(), "{held:#?}");

    // 5: a --wait that runs out, after waiting.
    let started = Instant::now();
    let waited = baton(
        &endpoints,
        &[
            "acquire",
            "repo/src/auth.rs",
            "--holder",
            "agent-b",
            "--wait",
            "1s",
        ],
    )
    .await;
    waited.expect_code(5);
    assert!(started.elapsed() >= Duration::from_secs(1), "{waited:#?}");
    assert!(
        waited.error_line().starts_with("error[LEASE_HELD]: "),
        "{waited:#?}"
    );

    // 3: no lease there.
    let missing = baton(&endpoints, &["get", "repo/src/missing.rs"]).await;
    missing.expect_code(3);
    assert!(
        missing.error_line().starts_with("error[NOT_FOUND]: "),
        "{missing:#?}"
    );

    // 2: a bad flag value, an unknown flag, a missing argument, and the server's
    // INVALID_ARGUMENT.
    for args in [
        &["acquire", "x", "--ttl", "banana"][..],
        &["acquire", "x", "--bogus"][..],
        &["release", "x"][..],
        &["acquire", "x", "--ttl", "10ms"][..],
    ] {
        let usage = baton(&endpoints, args).await;
        usage.expect_code(2);
        assert!(!usage.stderr.is_empty(), "{usage:#?}");
    }
    let invalid = baton(&endpoints, &["acquire", "x", "--ttl", "10ms"]).await;
    assert!(
        invalid
            .error_line()
            .starts_with("error[INVALID_ARGUMENT]: "),
        "{invalid:#?}"
    );

    // 1: nobody listens.
    let closed = format!("http://127.0.0.1:{}", free_port());
    let unreachable = baton(&closed, &["get", "x", "--timeout", "3s"]).await;
    unreachable.expect_code(1);
    assert!(
        unreachable.error_line().starts_with("error["),
        "{unreachable:#?}"
    );

    // 4: a fence check that is not current; 0 when it is.
    let current = lease.fence.to_string();
    baton(
        &endpoints,
        &["fence", "check", "repo/src/auth.rs", &current],
    )
    .await
    .expect_code(0);
    let stale = (lease.fence + 100).to_string();
    let checked = baton(&endpoints, &["fence", "check", "repo/src/auth.rs", &stale]).await;
    checked.expect_code(4);
    assert!(
        checked.error_line().starts_with("error[STALE_FENCE]: "),
        "{checked:#?}"
    );

    // Global flags after the subcommand, and --endpoints overriding BATON_ENDPOINTS.
    baton(
        &closed,
        &["get", "repo/src/auth.rs", "--endpoints", &endpoints],
    )
    .await
    .expect_code(0);

    // 4: releasing through a session that is gone.
    let session = line
        .split_whitespace()
        .find_map(|word| word.strip_prefix("session="))
        .expect("a session id")
        .to_owned();
    baton(
        &endpoints,
        &["release", "repo/src/auth.rs", "--session", &session],
    )
    .await
    .expect_code(0);
    baton(&endpoints, &["get", "repo/src/auth.rs"])
        .await
        .expect_code(3);
    baton(&endpoints, &["session", "end", &session])
        .await
        .expect_code(0);
    let lost = baton(&endpoints, &["keepalive", "--session", &session]).await;
    lost.expect_code(4);
    assert!(
        lost.error_line().starts_with("error[LEASE_LOST]: "),
        "{lost:#?}"
    );
}

#[tokio::test]
async fn json_output_is_the_api_answer_and_parses() {
    let cluster = Cluster::start(1).await;
    let endpoints = url(&cluster);

    let grant: Grant = baton(
        &endpoints,
        &["--json", "acquire", "docs", "--subtree", "--ttl", "20s"],
    )
    .await
    .expect_code(0)
    .json();
    assert!(is_session_id(grant.session_id.as_str()));
    assert_eq!(grant.holder, "tester");
    let session = grant.session_id.as_str().to_owned();
    let fence = format!("docs:{}", grant.fence);

    let lease: Lease = baton(&endpoints, &["get", "docs", "--json"])
        .await
        .expect_code(0)
        .json();
    assert_eq!(lease.fence, grant.fence);
    let list: LeaseList = baton(&endpoints, &["list", "do", "--json"])
        .await
        .expect_code(0)
        .json();
    assert_eq!(list.leases.len(), 1);
    let renewed: KeepaliveResponse =
        baton(&endpoints, &["keepalive", "--session", &session, "--json"])
            .await
            .expect_code(0)
            .json();
    assert!(renewed.expires_in_ms > 0);
    let info: SessionInfo = baton(
        &endpoints,
        &["session", "get", "--session", &session, "--json"],
    )
    .await
    .expect_code(0)
    .json();
    assert_eq!(info.leases.len(), 1);

    let written: KvPutResponse = baton(
        &endpoints,
        &[
            "kv",
            "put",
            "docs/owner",
            "{\"who\":\"tester\"}",
            "--fence",
            &fence,
            "--session",
            &session,
            "--json",
        ],
    )
    .await
    .expect_code(0)
    .json();
    let entry: KvEntry = baton(&endpoints, &["kv", "get", "docs/owner", "--json"])
        .await
        .expect_code(0)
        .json();
    assert_eq!(entry.revision, written.revision);
    assert_eq!(entry.value["who"], "tester");
    let plain: KvPutResponse = baton(&endpoints, &["kv", "put", "notes", "just text", "--json"])
        .await
        .expect_code(0)
        .json();
    let note: KvEntry = baton(&endpoints, &["kv", "get", "notes", "--json"])
        .await
        .json();
    assert_eq!(
        (note.revision, note.value.as_str()),
        (plain.revision, Some("just text"))
    );
    let checked: FenceCheckResponse = baton(
        &endpoints,
        &["fence", "check", "docs", &grant.fence.to_string(), "--json"],
    )
    .await
    .expect_code(0)
    .json();
    assert!(checked.current);
    let status: ClusterStatus = baton(&endpoints, &["cluster", "status", "--json"])
        .await
        .expect_code(0)
        .json();
    assert_eq!(status.node_id, 1);

    // A refusal with --json: the problem on stdout, the error line on stderr.
    let other = baton(
        &endpoints,
        &["acquire", "docs/a", "--holder", "agent-b", "--json"],
    )
    .await;
    other.expect_code(4);
    let problem: serde_json::Value = other.json();
    assert_eq!(problem["code"], "LEASE_HELD");
    assert_eq!(problem["held_by"]["holder"], "tester");
    assert!(other.error_line().starts_with("error[LEASE_HELD]: "));

    // A fenced write with a fence that is not live is STALE_FENCE, exit 4.
    let stale = format!("docs:{}", grant.fence + 100);
    let refused = baton(
        &endpoints,
        &[
            "kv",
            "put",
            "docs/owner",
            "2",
            "--fence",
            &stale,
            "--session",
            &session,
        ],
    )
    .await;
    refused.expect_code(4);
    assert!(
        refused.error_line().starts_with("error[STALE_FENCE]: "),
        "{refused:#?}"
    );

    let deleted: KvDeleteResponse = baton(&endpoints, &["kv", "delete", "notes", "--json"])
        .await
        .expect_code(0)
        .json();
    assert!(deleted.deleted);
    baton(&endpoints, &["kv", "get", "notes"])
        .await
        .expect_code(3);
    let released: ReleaseResponse = baton(
        &endpoints,
        &["release", "docs", "--session", &session, "--json"],
    )
    .await
    .expect_code(0)
    .json();
    assert_eq!(released.released, "docs");
    let ended: EndSessionResponse = baton(&endpoints, &["session", "end", &session, "--json"])
        .await
        .expect_code(0)
        .json();
    assert!(ended.released.is_empty());

    // --env prints lines a shell can source; `session create --env` too.
    let env = baton(&endpoints, &["acquire", "tasks/42", "--env"]).await;
    env.expect_code(0);
    let lines: Vec<&str> = env.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{env:#?}");
    assert_eq!(lines[0], "BATON_RESOURCE=tasks/42");
    assert!(
        lines[1]
            .strip_prefix("BATON_SESSION=")
            .is_some_and(is_session_id),
        "{env:#?}"
    );
    assert!(lines[2]
        .strip_prefix("BATON_FENCE=")
        .is_some_and(|f| f.parse::<u64>().is_ok()));
    let created: CreateSessionResponse =
        baton(&endpoints, &["session", "create", "--ttl", "5s", "--json"])
            .await
            .expect_code(0)
            .json();
    assert_eq!(created.ttl_ms, 5_000);
}

#[tokio::test]
async fn run_gives_the_command_its_fence_and_releases_as_soon_as_it_exits() {
    let cluster = Cluster::start(1).await;
    let endpoints = url(&cluster);
    let ran = baton(
        &endpoints,
        &[
            "run",
            "jobs/build",
            "--ttl",
            "5s",
            "--",
            "sh",
            "-c",
            "echo \"$BATON_RESOURCE $BATON_FENCE $BATON_SESSION\"; exit 7",
        ],
    )
    .await;
    // CMD's status, CMD's stdout only.
    ran.expect_code(7);
    let fields: Vec<&str> = ran.stdout.split_whitespace().collect();
    assert_eq!(fields.len(), 3, "{ran:#?}");
    assert_eq!(fields[0], "jobs/build");
    assert!(
        fields[1].parse::<u64>().is_ok_and(|fence| fence > 0),
        "{ran:#?}"
    );
    assert!(is_session_id(fields[2]), "{ran:#?}");
    // Released at once: the very next read finds no lease.
    cluster
        .api()
        .get(cluster.node(1), "/v1/leases/jobs/build")
        .await
        .expect_status(404);
    cluster
        .api()
        .get(cluster.node(1), &format!("/v1/sessions/{}", fields[2]))
        .await
        .expect_status(404);

    // Held by someone else: exit 4 without running CMD; with --wait that runs out, 5.
    let holder = baton(&endpoints, &["acquire", "jobs/build"]).await;
    holder.expect_code(0);
    let blocked = baton(
        &endpoints,
        &["run", "jobs/build", "--", "sh", "-c", "echo ran"],
    )
    .await;
    blocked.expect_code(4);
    assert!(blocked.stdout.is_empty(), "{blocked:#?}");
    let waited = baton(
        &endpoints,
        &[
            "run",
            "jobs/build",
            "--wait",
            "500ms",
            "--",
            "sh",
            "-c",
            "echo ran",
        ],
    )
    .await;
    waited.expect_code(5);
    assert!(waited.stdout.is_empty(), "{waited:#?}");
}

/// `baton run --shared N`: N commands run at once under one shared lease; one more is refused.
#[tokio::test]
async fn run_shared_lets_n_commands_run_at_once_and_refuses_one_more() {
    let cluster = Cluster::start(1).await;
    let endpoints = url(&cluster);
    let run = |endpoints: String| async move {
        baton(
            &endpoints,
            &[
                "run",
                "ci/suite",
                "--shared",
                "2",
                "--ttl",
                "5s",
                "--",
                "sh",
                "-c",
                "echo $BATON_FENCE; sleep 2",
            ],
        )
        .await
    };
    let first = tokio::spawn(run(endpoints.clone()));
    let second = tokio::spawn(run(endpoints.clone()));
    // Both hold their place while they sleep: two holders listed, a third is refused.
    let listed = poll_until(Duration::from_secs(10), "both runs to hold", async || {
        let list: LeaseList = cluster
            .api()
            .get(cluster.node(1), "/v1/leases?prefix=ci/")
            .await
            .expect_json(200);
        (list.leases.len() == 2).then_some(list)
    })
    .await;
    assert!(listed
        .leases
        .iter()
        .all(|lease| lease.limit == Some(2) && lease.resource == "ci/suite"));
    let third = baton(
        &endpoints,
        &[
            "run", "ci/suite", "--shared", "2", "--", "sh", "-c", "echo ran",
        ],
    )
    .await;
    third.expect_code(4);
    assert!(third.stdout.is_empty(), "{third:#?}");
    let (first, second) = (first.await.expect("joined"), second.await.expect("joined"));
    first.expect_code(0);
    second.expect_code(0);
    assert_ne!(
        first.stdout.trim(),
        second.stdout.trim(),
        "each its own fence"
    );
    cluster
        .api()
        .get(cluster.node(1), "/v1/leases/ci/suite")
        .await
        .expect_status(404);
}

#[tokio::test]
async fn run_stops_the_command_and_exits_4_when_its_session_is_ended_elsewhere() {
    let cluster = Cluster::start(1).await;
    let directory = tempfile::tempdir().expect("a temporary directory");
    let pid_file = directory.path().join("pid");
    let session_file = directory.path().join("session");
    let script = format!(
        "echo $$ > {pid}.tmp && mv {pid}.tmp {pid}; echo $BATON_SESSION > {session}; exec sleep 60",
        pid = pid_file.display(),
        session = session_file.display()
    );
    let run = command(
        &url(&cluster),
        &[
            "run",
            "jobs/deploy",
            "--ttl",
            "3s",
            "--grace",
            "2s",
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn baton run");
    let pid: u32 = poll_until(
        Duration::from_secs(20),
        "the command to start",
        async || std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok(),
    )
    .await;
    let _reaper = KillOnDrop(pid);
    let session = poll_until(Duration::from_secs(5), "the session file", async || {
        let text = std::fs::read_to_string(&session_file).ok()?;
        is_session_id(text.trim()).then(|| text.trim().to_owned())
    })
    .await;

    let ended_at = Instant::now();
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
    let output = tokio::time::timeout(Duration::from_secs(10), run.wait_with_output())
        .await
        .expect("baton run exits once its session is gone")
        .expect("wait for baton run");
    let outcome = Outcome {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    outcome.expect_code(4);
    assert!(
        outcome.error_line().starts_with("error[LEASE_LOST]: "),
        "{outcome:#?}"
    );
    assert!(
        outcome.error_line().contains("session ended"),
        "the real cause is not named: {outcome:#?}"
    );
    // A keepalive every third of the TTL notices; SIGTERM stops `sleep` at once.
    assert!(
        ended_at.elapsed() < Duration::from_secs(3),
        "{:?}",
        ended_at.elapsed()
    );
    assert!(!process_exists(pid), "the command still runs: {outcome:#?}");
}

#[tokio::test]
async fn run_passes_signals_on_to_the_command_and_releases_after_it() {
    let cluster = Cluster::start(1).await;
    let directory = tempfile::tempdir().expect("a temporary directory");
    let ready = directory.path().join("ready");
    // Only builtins once the pid is written (see agents.rs, the interrupted worker).
    let script = format!(
        "trap 'exit 42' TERM; mkfifo {fifo}; exec 3<>{fifo}; echo $$ > {ready}; \
         while :; do read line <&3; done",
        fifo = directory.path().join("fifo").display(),
        ready = ready.display()
    );
    let run = command(
        &url(&cluster),
        &["run", "jobs/signal", "--", "sh", "-c", &script],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn baton run");
    let pid: u32 = poll_until(
        Duration::from_secs(20),
        "the command to start",
        async || std::fs::read_to_string(&ready).ok()?.trim().parse().ok(),
    )
    .await;
    let _reaper = KillOnDrop(pid);
    let run_pid = run.id().expect("baton run's pid");
    let sent = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(run_pid.to_string())
        .status()
        .expect("run kill");
    assert!(sent.success());
    let output = tokio::time::timeout(Duration::from_secs(10), run.wait_with_output())
        .await
        .expect("baton run exits after its command")
        .expect("wait for baton run");
    assert_eq!(output.status.code(), Some(42), "{output:?}");
    cluster
        .api()
        .get(cluster.node(1), "/v1/leases/jobs/signal")
        .await
        .expect_status(404);
}

/// SIGKILLs a process the test did not start directly (a `baton run` command) on drop.
pub(crate) struct KillOnDrop(pub(crate) u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if process_exists(self.0) {
            let _ = std::process::Command::new("kill")
                .arg("-KILL")
                .arg(self.0.to_string())
                .stderr(Stdio::null())
                .status();
        }
    }
}

pub(crate) fn process_exists(pid: u32) -> bool {
    // A zombie is not running: only a live process has a state other than Z.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let after_name = stat.rsplit_once(')')?.1.trim_start().to_owned();
            after_name.chars().next()
        })
        .is_some_and(|state| state != 'Z')
}
