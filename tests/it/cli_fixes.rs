//! The command line's sharp edges against real `batond` processes: names sent unchanged (docs/api.md
//! section 4), a child that never outlives a SIGKILLed `baton run`, a closed stdout, every
//! `--session` read from `BATON_SESSION`, lost-lease messages that name the real cause, and
//! usage lines that show only what the caller typed or must type.

use std::process::Stdio;
use std::time::Duration;

use baton_client::api::{CreateSessionResponse, SessionInfo};
use baton_tests::{is_session_id, poll_until, try_poll_until, Cluster};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::cli::{baton, command, process_exists, url, KillOnDrop, Outcome};

#[tokio::test]
async fn a_path_with_dot_segments_reaches_the_server_unchanged() {
    let cluster = Cluster::start(1).await;
    let endpoints = url(&cluster);

    // A URL library would send `dots/b`; the server must see `dots/a/../b` and refuse it.
    let put = baton(&endpoints, &["kv", "put", "dots/a/../b", "1"]).await;
    let stored_elsewhere = baton(&endpoints, &["kv", "get", "dots/b"]).await;
    stored_elsewhere.expect_code(3);
    put.expect_code(2);
    assert!(
        put.error_line().starts_with("error[INVALID_ARGUMENT]: "),
        "{put:#?}"
    );

    // A name that is nothing but a dot segment cannot travel in a URL: refused as the server
    // would refuse it, whatever the route.
    for args in [
        &["kv", "put", "..", "1"][..],
        &["get", "."][..],
        &["task", "add", "..", "{}"][..],
        &[
            "task",
            "complete",
            "q",
            "..",
            "--session",
            "s",
            "--fence",
            "1",
        ][..],
        &["session", "get", ".."][..],
    ] {
        let refused = baton(&endpoints, args).await;
        refused.expect_code(2);
        assert!(
            refused
                .error_line()
                .starts_with("error[INVALID_ARGUMENT]: "),
            "{args:?}: {refused:#?}"
        );
    }
}

#[tokio::test]
async fn the_command_of_a_sigkilled_run_dies_with_its_children() {
    let cluster = Cluster::start(1).await;
    let directory = tempfile::tempdir().expect("a temporary directory");
    let pids = directory.path().join("pids");
    let script = format!(
        "sleep 300 & echo $$ $! > {pids}.tmp && mv {pids}.tmp {pids}; wait",
        pids = pids.display()
    );
    let mut run = command(
        &url(&cluster),
        &["run", "jobs/kill", "--", "sh", "-c", &script],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("spawn baton run");
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
    assert!(process_exists(child) && process_exists(grandchild));

    run.start_kill().expect("SIGKILL baton run");
    run.wait().await.expect("reap baton run");
    let gone = try_poll_until(
        std::time::Instant::now() + Duration::from_secs(2),
        async || (!process_exists(child) && !process_exists(grandchild)).then_some(()),
    )
    .await;
    assert!(
        gone.is_some(),
        "the command ({child}: {}) or its child ({grandchild}: {}) outlived a SIGKILLed baton run",
        process_exists(child),
        process_exists(grandchild)
    );
}

#[tokio::test]
async fn a_closed_stdout_ends_baton_events_quietly() {
    let cluster = Cluster::start(1).await;
    let endpoints = url(&cluster);
    baton(&endpoints, &["kv", "put", "first", "1"])
        .await
        .expect_code(0);
    let mut events = command(&endpoints, &["events", "--follow"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn baton events");
    // `| head -1`: read one line, then close the pipe.
    let mut lines = BufReader::new(events.stdout.take().expect("stdout")).lines();
    let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("the first event in time")
        .expect("read stdout");
    assert!(first.is_some_and(|line| line.contains("kv_written key=first")));
    drop(lines);
    // The next event meets the closed pipe.
    baton(&endpoints, &["kv", "put", "second", "1"])
        .await
        .expect_code(0);
    let output = tokio::time::timeout(Duration::from_secs(20), events.wait_with_output())
        .await
        .expect("baton events ends once its stdout is closed")
        .expect("wait for baton events");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.is_empty(), "not quiet: {stderr}");
}

#[tokio::test]
async fn every_command_that_takes_a_session_reads_baton_session() {
    let cluster = Cluster::start(1).await;
    let endpoints = url(&cluster);
    let created: CreateSessionResponse = baton(&endpoints, &["session", "create", "--json"])
        .await
        .expect_code(0)
        .json();
    let session = created.session_id.as_str().to_owned();
    let with_session = async |args: &[&str]| -> Outcome {
        let output = command(&endpoints, args)
            .env("BATON_SESSION", &session)
            .stdin(Stdio::null())
            .output()
            .await
            .expect("run baton");
        Outcome {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    };

    // acquire joins the session; so does a second one.
    for resource in ["env/a", "env/b"] {
        with_session(&["acquire", resource]).await.expect_code(0);
    }
    let info: SessionInfo = with_session(&["session", "get", "--json"])
        .await
        .expect_code(0)
        .json();
    let mut held: Vec<&str> = info.leases.iter().map(|l| l.resource.as_str()).collect();
    held.sort_unstable();
    assert_eq!(held, ["env/a", "env/b"]);
    let fence = info.leases[0].fence;
    let fenced = format!("{}:{fence}", info.leases[0].resource);

    with_session(&["keepalive"]).await.expect_code(0);
    with_session(&["kv", "put", "env/k", "1", "--fence", &fenced])
        .await
        .expect_code(0);
    // Without --fence the session is not sent: an unconditional write.
    with_session(&["kv", "put", "env/plain", "1"])
        .await
        .expect_code(0);
    with_session(&["kv", "delete", "env/k", "--fence", &fenced])
        .await
        .expect_code(0);
    with_session(&["release", "env/a"]).await.expect_code(0);
    let ended = with_session(&["session", "end"]).await;
    ended.expect_code(0);
    assert!(ended.stdout.contains("released env/b"), "{ended:#?}");
    // The session is gone: the next command naming it through the variable says so.
    with_session(&["keepalive"]).await.expect_code(4);
    assert!(is_session_id(&session));
}

#[tokio::test]
async fn a_lease_cut_by_max_hold_says_so() {
    let cluster = Cluster::start(1).await;
    let run = baton(
        &url(&cluster),
        &[
            "run",
            "jobs/capped",
            "--ttl",
            "3s",
            "--max-hold",
            "1s",
            "--grace",
            "1s",
            "--",
            "sleep",
            "30",
        ],
    )
    .await;
    run.expect_code(4);
    let line = run.error_line();
    assert!(line.starts_with("error[LEASE_LOST]: "), "{run:#?}");
    assert!(line.contains("max hold reached"), "{run:#?}");
    assert!(!line.contains("keepalive"), "{run:#?}");
}

#[tokio::test]
async fn usage_lines_show_no_flag_the_caller_did_not_type() {
    // BATON_ENDPOINTS and BATON_HOLDER are set by `command`; BATON_NAMESPACE here.
    let output = command("http://127.0.0.1:9", &["get"])
        .env("BATON_NAMESPACE", "ns")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run baton");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    let usage = stderr
        .lines()
        .find(|line| line.starts_with("Usage: "))
        .unwrap_or_else(|| panic!("no usage line: {stderr}"));
    assert_eq!(usage, "Usage: baton get <RESOURCE>");

    // The variables still count.
    let help = baton("http://127.0.0.1:9", &["--help"]).await;
    help.expect_code(0);
    for variable in ["BATON_ENDPOINTS", "BATON_HOLDER", "BATON_NAMESPACE"] {
        assert!(help.stdout.contains(variable), "{variable}: {help:#?}");
    }
}

#[tokio::test]
async fn an_interactive_command_owns_the_terminal() {
    // `script` gives `baton run` a terminal. CMD runs in a process group of its own: unless
    // that group is handed the terminal's foreground, its read stops it with SIGTTIN.
    let cluster = Cluster::start(1).await;
    let inner = format!(
        "{} run jobs/tty -- sh -c 'read line; echo \"got $line\"'",
        baton_tests::baton_path().display()
    );
    let mut script = tokio::process::Command::new("script");
    script
        .args(["-qec", &inner, "/dev/null"])
        .env("BATON_ENDPOINTS", url(&cluster))
        .env_remove("BATON_SESSION");
    let mut child = script
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn script (util-linux)");
    let mut stdin = child.stdin.take().expect("stdin");
    tokio::io::AsyncWriteExt::write_all(&mut stdin, b"hello\n")
        .await
        .expect("type a line");
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("the interactive command finishes (a hang: stopped by SIGTTIN)")
        .expect("wait for script");
    drop(stdin);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("got hello"), "{stdout}");
    assert_eq!(output.status.code(), Some(0), "{stdout}");
}

#[tokio::test]
async fn closed_outputs_never_panic_nor_change_a_failures_status() {
    let cluster = Cluster::start(1).await;
    for (args, closed_stdout, closed_stderr) in [
        (&["get", "missing"][..], false, true),
        (&["get", "missing", "--json"][..], true, true),
        (&["get", "missing", "--json"][..], true, false),
    ] {
        let mut child = command(&url(&cluster), args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn baton");
        // The readers are gone before baton writes anything.
        if closed_stdout {
            drop(child.stdout.take());
        }
        if closed_stderr {
            drop(child.stderr.take());
        }
        let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
            .await
            .expect("baton finishes")
            .expect("wait for baton");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(3), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[tokio::test]
async fn a_command_that_cannot_start_exits_127_and_frees_the_lease() {
    let cluster = Cluster::start(1).await;
    let run = baton(
        &url(&cluster),
        &["run", "jobs/missing", "--", "/nonexistent/command", "arg"],
    )
    .await;
    run.expect_code(127);
    assert!(
        run.stderr.contains("cannot start \"/nonexistent/command\""),
        "{run:#?}"
    );
    cluster
        .api()
        .get(cluster.node(1), "/v1/leases/jobs/missing")
        .await
        .expect_status(404);
}
