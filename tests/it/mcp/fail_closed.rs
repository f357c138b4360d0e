//! `baton mcp` failing closed (docs/agents.md, "Failing closed: MCP"): every failure an agent
//! can meet, provoked for real, and what the model sees. A cancelled call takes nothing (it
//! leaves the line, and a grant that raced the cancel is given back); a claim whose answer was
//! lost, or a wait cut short, leaves nothing behind; bad arguments are error results; a line
//! that is not JSON-RPC gets a JSON-RPC error; bad flags stop the server before it serves; TLS,
//! token and leader failures are error results that say so and claim nothing.
//!
//! These tests speak the protocol as bytes (`Raw`), as Claude Code does, so that request ids,
//! cancellations and malformed lines are exactly what the test writes.

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_client::api::{self, EventKind};
use baton_tests::{baton_path, poll_until, Cluster, ClusterConfig, Method, TestCerts};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::{clean_command, lease, Agent, STATE_TIMEOUT};

/// How long a freed resource may take to be free for everyone after the release that freed it.
const FREED_WITHIN: Duration = Duration::from_secs(3);
/// The TTL of the leases the tests hold through the HTTP API: longer than any test.
const HOLD_TTL_MS: u64 = 120_000;

/// A `baton mcp` spoken to line by line: the test writes each JSON-RPC message itself and
/// reads every message the server writes.
struct Raw {
    stdin: tokio::process::ChildStdin,
    messages: mpsc::UnboundedReceiver<Value>,
    /// Messages read while looking for another one.
    seen: Vec<Value>,
    child: tokio::process::Child,
}

impl Raw {
    /// Starts `baton mcp --endpoints NODE --holder HOLDER ARGS...` and completes the handshake
    /// at protocol version 2025-11-25.
    async fn start(cluster: &Cluster, holder: &str, args: &[&str]) -> Raw {
        let mut command = clean_command(baton_path());
        command
            .arg("mcp")
            .args([
                "--endpoints",
                &cluster.node(1).api_url(),
                "--holder",
                holder,
            ])
            .args(args);
        Raw::spawn(command).await
    }

    async fn spawn(mut command: tokio::process::Command) -> Raw {
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let mut child = command.spawn().expect("spawn baton mcp");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (sender, messages) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let message: Value = serde_json::from_str(&line).unwrap_or_else(|error| {
                    panic!("the server wrote a line that is not JSON ({error}): {line}")
                });
                if sender.send(message).is_err() {
                    return;
                }
            }
        });
        let mut raw = Raw {
            stdin,
            messages,
            seen: Vec::new(),
            child,
        };
        raw.send(
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "raw-test-client", "version": "0"},
            }}),
        )
        .await;
        let initialized = raw.reply(json!(0)).await;
        assert_eq!(
            initialized["result"]["protocolVersion"], "2025-11-25",
            "{initialized}"
        );
        raw.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        raw
    }

    async fn send_line(&mut self, line: &str) {
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write to baton mcp");
        self.stdin.flush().await.expect("flush baton mcp's stdin");
    }

    async fn send(&mut self, message: Value) {
        self.send_line(&message.to_string()).await;
    }

    /// The next message the server writes, or `None` when none comes within `timeout`.
    async fn next(&mut self, timeout: Duration) -> Option<Value> {
        tokio::time::timeout(timeout, self.messages.recv())
            .await
            .ok()
            .flatten()
    }

    /// The server's answer to request `id` (a result or an error); panics when none comes
    /// within [`STATE_TIMEOUT`]. Other messages are kept in `seen`.
    async fn reply(&mut self, id: Value) -> Value {
        if let Some(at) = self.seen.iter().position(|message| message["id"] == id) {
            return self.seen.remove(at);
        }
        loop {
            match self.next(STATE_TIMEOUT).await {
                Some(message) if message.get("id") == Some(&id) => return message,
                Some(message) => self.seen.push(message),
                None => panic!(
                    "no answer to request {id} within {STATE_TIMEOUT:?}; read meanwhile: {:?}",
                    self.seen
                ),
            }
        }
    }

    /// Sends `tools/call` for `tool` as request `id`, without waiting for its answer.
    async fn start_call(&mut self, id: u64, tool: &str, arguments: Value) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                         "params": {"name": tool, "arguments": arguments}}))
            .await;
    }

    /// Calls `tool` as request `id` and returns the tool result; panics on a JSON-RPC error.
    async fn call(&mut self, id: u64, tool: &str, arguments: Value) -> Value {
        self.start_call(id, tool, arguments.clone()).await;
        let reply = self.reply(json!(id)).await;
        match reply.get("result") {
            Some(result) => result.clone(),
            None => panic!("{tool} {arguments}: a JSON-RPC error: {reply}"),
        }
    }

    /// `notifications/cancelled` for request `id`, as Claude Code sends it when the user
    /// presses Esc.
    async fn cancel(&mut self, id: u64) {
        self.send(
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                         "params": {"requestId": id, "reason": "the user pressed Esc"}}),
        )
        .await;
    }

    /// The claims `my_claims` lists, asked as request `id`.
    async fn my_claims(&mut self, id: u64) -> Value {
        self.call(id, "my_claims", json!({})).await
    }

    /// True if the server answered request `id` among the messages read so far.
    fn answered(&self, id: u64) -> bool {
        self.seen.iter().any(|message| message["id"] == id)
    }

    /// Closes stdin and waits for the server to exit.
    async fn close(mut self) {
        drop(self.stdin);
        let status = tokio::time::timeout(STATE_TIMEOUT, self.child.wait())
            .await
            .expect("baton mcp exits when stdin closes")
            .expect("wait for baton mcp");
        assert!(status.success(), "baton mcp exited with {status}");
    }
}

/// The one text line of a tool result.
fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_default()
}

fn is_error(result: &Value) -> bool {
    result["isError"] == true
}

/// A new session of `holder` holding `resource`, through the HTTP API: its id.
async fn hold(cluster: &Cluster, resource: &str, holder: &str) -> String {
    let granted: Value = cluster
        .api()
        .post(
            cluster.node(1),
            "/v1/leases",
            &json!({"resource": resource, "holder": holder, "ttl_ms": HOLD_TTL_MS}),
        )
        .await
        .expect_json(201);
    granted["session_id"]
        .as_str()
        .expect("a session id")
        .to_owned()
}

async fn release(cluster: &Cluster, session: &str, resource: &str) {
    cluster
        .api()
        .post(
            cluster.node(1),
            &format!("/v1/sessions/{session}/release"),
            &json!({"resource": resource}),
        )
        .await
        .expect_status(200);
}

/// Waits for an event after revision `after` that `wanted` picks.
async fn event(cluster: &Cluster, after: u64, what: &str, wanted: impl Fn(&EventKind) -> bool) {
    poll_until(STATE_TIMEOUT, what, async || {
        let events = cluster.api().events_after(cluster.node(1), after).await;
        events.iter().any(|event| wanted(&event.kind)).then_some(())
    })
    .await;
}

/// Waits until nobody holds `resource`.
async fn free(cluster: &Cluster, resource: &str, within: Duration) {
    poll_until(within, &format!("{resource} to be free"), async || {
        lease(cluster, resource).await.is_none().then_some(())
    })
    .await;
}

/// The claimed resources `my_claims` lists.
fn claimed(mine: &Value) -> Vec<String> {
    mine["structuredContent"]["claims"]
        .as_array()
        .expect("a list of claims")
        .iter()
        .map(|claim| claim["resource"].as_str().expect("a resource").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_leaves_the_line_and_the_release_goes_to_whoever_asks_next() {
    let cluster = Cluster::dev().await;
    let path = "repo/src/auth.rs";
    let holder = hold(&cluster, path, "agent-a").await;
    let mut b = Raw::start(&cluster, "agent-b", &[]).await;
    let after = cluster.api().last_revision(cluster.node(1)).await;

    b.start_call(2, "claim", json!({"resource": path, "wait_seconds": 20}))
        .await;
    event(&cluster, after, "agent-b to join the line", |kind| {
        matches!(kind, EventKind::Queued { resource, holder, .. }
                 if resource == path && holder == "agent-b")
    })
    .await;
    b.cancel(2).await;
    event(&cluster, after, "agent-b to leave the line", |kind| {
        matches!(kind, EventKind::LeftLine { resource, holder }
                 if resource == path && holder == "agent-b")
    })
    .await;

    release(&cluster, &holder, path).await;
    free(&cluster, path, FREED_WITHIN).await;
    // Free for anyone at once: another agent's claim is granted.
    cluster
        .api()
        .post(
            cluster.node(1),
            "/v1/leases",
            &json!({"resource": path, "holder": "agent-c", "ttl_ms": HOLD_TTL_MS}),
        )
        .await
        .expect_status(201);
    let mine = b.my_claims(3).await;
    assert!(claimed(&mine).is_empty(), "{mine}");
    assert!(
        !b.answered(2),
        "a cancelled call gets no answer: {:?}",
        b.seen
    );
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_or_a_task_that_raced_the_cancel_is_given_back_and_the_model_is_told() {
    let cluster = Cluster::dev().await;
    let path = "db/migrations";
    let holder = hold(&cluster, path, "agent-a").await;
    let mut b = Raw::start(&cluster, "agent-b", &[]).await;
    let after = cluster.api().last_revision(cluster.node(1)).await;

    // The grant comes first, the cancel after it (the answer crossed it on the wire).
    b.start_call(2, "claim", json!({"resource": path, "wait_seconds": 20}))
        .await;
    event(
        &cluster,
        after,
        "agent-b to join the line",
        |kind| matches!(kind, EventKind::Queued { resource, .. } if resource == path),
    )
    .await;
    release(&cluster, &holder, path).await;
    event(&cluster, after, "the grant to agent-b", |kind| {
        matches!(kind, EventKind::Granted { resource, holder, .. }
                 if resource == path && holder == "agent-b")
    })
    .await;
    b.cancel(2).await;
    free(&cluster, path, FREED_WITHIN).await;
    let mine = b.my_claims(3).await;
    assert!(claimed(&mine).is_empty(), "{mine}");
    assert!(
        text(&mine).contains("cancelled") && text(&mine).contains(path),
        "the model hears that its cancelled claim was given back: {mine}"
    );

    // The same for a task: claimed, then the call cancelled: the task is ready again.
    let added: Value = cluster
        .api()
        .post(
            cluster.node(1),
            "/v1/queues/reviews/tasks",
            &json!({"payload": {"file": path}}),
        )
        .await
        .expect_json(201);
    b.start_call(4, "next_task", json!({"queue": "reviews"}))
        .await;
    event(&cluster, after, "agent-b to claim the task", |kind| {
        matches!(kind, EventKind::TaskClaimed { .. })
    })
    .await;
    b.cancel(4).await;
    poll_until(STATE_TIMEOUT, "the task to be ready again", async || {
        let queue: Value = cluster
            .api()
            .get(cluster.node(1), "/v1/queues/reviews")
            .await
            .expect_json(200);
        (queue["counts"]["ready"] == 1 && queue["counts"]["claimed"] == 0).then_some(())
    })
    .await;
    let mine = b.my_claims(5).await;
    assert_eq!(mine["structuredContent"]["tasks"], json!([]), "{mine}");
    assert!(
        text(&mine).contains(added["id"].as_str().expect("an id")),
        "the model hears that its cancelled task claim was given back: {mine}"
    );
    b.close().await;
}

/// A TCP proxy in front of a node that passes requests on and, while `deliver` is false,
/// throws the node's answers away: a claim is granted and its answer lost.
struct LossyProxy {
    port: u16,
    deliver: Arc<AtomicBool>,
}

impl LossyProxy {
    async fn start(upstream: String) -> LossyProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("the proxy's address").port();
        let deliver = Arc::new(AtomicBool::new(true));
        let delivering = Arc::clone(&deliver);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let delivering = Arc::clone(&delivering);
                tokio::spawn(async move {
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                    });
                    let mut buffer = vec![0; 16 * 1024];
                    while let Ok(read) = server_read.read(&mut buffer).await {
                        if read == 0 {
                            return;
                        }
                        if delivering.load(Ordering::SeqCst)
                            && client_write.write_all(&buffer[..read]).await.is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        LossyProxy { port, deliver }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn deliver(&self, deliver: bool) {
        self.deliver.store(deliver, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_answer_was_lost_is_given_back_and_the_model_is_told_so() {
    let cluster = Cluster::dev().await;
    let proxy = LossyProxy::start(cluster.node(1).api_addr()).await;
    let mut command = clean_command(baton_path());
    command.args(["mcp", "--endpoints", &proxy.url(), "--holder", "agent-b"]);
    let mut b = Raw::spawn(command).await;
    let path = "deploy/prod";
    // A first claim makes the session, with every answer delivered.
    let first = b
        .call(1, "claim", json!({"resource": "deploy/staging"}))
        .await;
    assert_eq!(first["structuredContent"]["granted"], true, "{first}");

    proxy.deliver(false);
    let after = cluster.api().last_revision(cluster.node(1)).await;
    let lost = b.call(2, "claim", json!({"resource": path})).await;
    assert!(
        is_error(&lost),
        "an unknown outcome is an error result: {lost}"
    );
    assert!(
        text(&lost).contains("unknown") && text(&lost).contains("given back"),
        "the model hears the outcome is unknown and what the server does about it: {lost}"
    );
    // The grant did happen, behind the lost answer.
    event(
        &cluster,
        after,
        "the grant whose answer was lost",
        |kind| matches!(kind, EventKind::Granted { resource, .. } if resource == path),
    )
    .await;

    proxy.deliver(true);
    free(&cluster, path, STATE_TIMEOUT).await;
    let mine = b.my_claims(3).await;
    assert_eq!(claimed(&mine), ["deploy/staging"], "{mine}");
    // Claimed again, it is granted and the model hears a plain grant.
    let again = b.call(4, "claim", json!({"resource": path})).await;
    assert_eq!(again["structuredContent"]["granted"], true, "{again}");
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_cut_short_by_an_outage_leaves_the_line_once_baton_is_back() {
    let cluster = Cluster::dev().await;
    let path = "svc/dev-server";
    let holder = hold(&cluster, path, "agent-a").await;
    let mut b = Raw::start(&cluster, "agent-b", &[]).await;
    let after = cluster.api().last_revision(cluster.node(1)).await;
    b.start_call(2, "claim", json!({"resource": path, "wait_seconds": 30}))
        .await;
    event(
        &cluster,
        after,
        "agent-b to join the line",
        |kind| matches!(kind, EventKind::Queued { resource, .. } if resource == path),
    )
    .await;

    cluster.node(1).kill();
    let cut = b.reply(json!(2)).await;
    let cut = &cut["result"];
    assert!(
        is_error(cut),
        "a wait Baton cut short is an error result: {cut}"
    );
    assert_ne!(cut["structuredContent"]["granted"], true, "{cut}");

    cluster.node(1).restart();
    cluster.wait_ready(STATE_TIMEOUT).await;
    event(&cluster, after, "agent-b to leave the line", |kind| {
        matches!(kind, EventKind::LeftLine { resource, holder }
                 if resource == path && holder == "agent-b")
    })
    .await;
    release(&cluster, &holder, path).await;
    free(&cluster, path, FREED_WITHIN).await;
    let mine = b.my_claims(3).await;
    assert!(claimed(&mine).is_empty(), "{mine}");
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_that_is_not_json_rpc_gets_a_json_rpc_error_and_the_server_keeps_serving() {
    let cluster = Cluster::dev().await;
    let mut raw = Raw::start(&cluster, "agent-a", &[]).await;
    let error_of = |reply: &Value| reply["error"]["code"].as_i64();

    raw.send_line("this is not JSON").await;
    let parse = raw
        .next(STATE_TIMEOUT)
        .await
        .expect("an answer to a non-JSON line");
    assert_eq!(error_of(&parse), Some(-32700), "{parse}");
    assert_eq!(parse.get("id"), Some(&Value::Null), "{parse}");

    for invalid in [
        r#"{"foo": "bar"}"#,
        "[]",
        "42",
        r#"{"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}"#,
    ] {
        raw.send_line(invalid).await;
        let reply = raw
            .next(STATE_TIMEOUT)
            .await
            .expect("an answer to an invalid request");
        assert_eq!(error_of(&reply), Some(-32600), "{invalid}: {reply}");
        assert_eq!(reply.get("id"), Some(&Value::Null), "{invalid}: {reply}");
    }
    // An id that can be read is answered with that id.
    raw.send_line(r#"{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": "claim"}"#)
        .await;
    let params = raw.reply(json!(7)).await;
    assert_eq!(error_of(&params), Some(-32602), "{params}");
    raw.send_line(r#"{"jsonrpc": "1.0", "id": 8, "method": "ping"}"#)
        .await;
    let version = raw.reply(json!(8)).await;
    assert_eq!(error_of(&version), Some(-32600), "{version}");

    // A malformed notification gets no answer; the server still serves.
    raw.send_line(r#"{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": 5}"#)
        .await;
    raw.send(json!({"jsonrpc": "2.0", "id": 9, "method": "ping"}))
        .await;
    let ping = raw.next(STATE_TIMEOUT).await.expect("the ping's answer");
    assert_eq!(ping["id"], 9, "{ping}");
    assert!(ping.get("result").is_some(), "{ping}");
    let listed = raw.call(10, "my_claims", json!({})).await;
    assert!(!is_error(&listed), "{listed}");
    raw.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_flags_stop_the_server_before_it_serves_or_say_so_in_every_claim() {
    let cluster = Cluster::dev().await;
    for flags in [&["--ttl", "banana"][..], &["--endpoints", "not a url"][..]] {
        let output = clean_command(baton_path())
            .arg("mcp")
            .args(flags)
            .stdin(Stdio::null())
            .output()
            .await
            .expect("run baton mcp");
        assert_eq!(output.status.code(), Some(2), "{flags:?}: {output:?}");
        assert!(
            output.stdout.is_empty(),
            "{flags:?}: nothing on stdout: {output:?}"
        );
        assert!(!output.stderr.is_empty(), "{flags:?}: says why on stderr");
    }
    // A TTL Baton refuses is found at the first claim: an error result naming the flag.
    let mut raw = Raw::start(&cluster, "agent-a", &["--ttl", "500ms"]).await;
    let refused = raw.call(1, "claim", json!({"resource": "x"})).await;
    assert!(is_error(&refused), "{refused}");
    assert!(text(&refused).contains("--ttl"), "{refused}");
    assert!(lease(&cluster, "x").await.is_none());
    raw.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_token_failures_are_error_results_that_say_so_and_claim_nothing() {
    const BOOTSTRAP: &str = "bootstrap-secret-for-mcp-tests-01";
    let dir = tempfile::tempdir().expect("a directory for certificates");
    let certs = TestCerts::generate(dir.path(), "cluster", &[]);
    let cluster = Cluster::start_with(ClusterConfig {
        bootstrap_token: Some(BOOTSTRAP.to_owned()),
        tls: Some(certs.clone()),
        ..ClusterConfig::new(1)
    })
    .await;
    let created: Value = cluster
        .api()
        .post(
            cluster.node(1),
            "/v1/auth/tokens",
            &json!({"name": "agent-b", "role": "agent", "namespaces": ["*"]}),
        )
        .await
        .expect_json(201);
    let secret = created["secret"].as_str().expect("a secret").to_owned();
    let ca = certs.ca.to_string_lossy().into_owned();

    // No CA for the node's certificate: the TLS handshake fails.
    let mut untrusting = Raw::start(&cluster, "agent-b", &["--token", &secret]).await;
    let tls = untrusting.call(1, "claim", json!({"resource": "a"})).await;
    assert!(is_error(&tls), "{tls}");
    assert!(
        text(&tls).contains("TLS setup") && text(&tls).contains("--ca-file"),
        "{tls}"
    );
    untrusting.close().await;

    // A token the cluster does not know.
    let mut stranger = Raw::start(
        &cluster,
        "agent-b",
        &["--ca-file", &ca, "--token", "not-a-token-of-this-cluster"],
    )
    .await;
    let unknown = stranger.call(1, "claim", json!({"resource": "a"})).await;
    assert!(is_error(&unknown), "{unknown}");
    assert!(text(&unknown).contains("UNAUTHENTICATED"), "{unknown}");
    stranger.close().await;

    // A good token, then revoked: the next claim is refused, and says why.
    let mut agent = Raw::start(&cluster, "agent-b", &["--ca-file", &ca, "--token", &secret]).await;
    let granted = agent.call(1, "claim", json!({"resource": "a"})).await;
    assert_eq!(granted["structuredContent"]["granted"], true, "{granted}");
    cluster
        .api()
        .call(Method::DELETE, cluster.node(1), "/v1/auth/tokens/agent-b")
        .send()
        .await
        .expect_status(200);
    let revoked = agent.call(2, "claim", json!({"resource": "b"})).await;
    assert!(is_error(&revoked), "{revoked}");
    assert!(text(&revoked).contains("UNAUTHENTICATED"), "{revoked}");
    let listed: api::LeaseList = cluster
        .api()
        .get(cluster.node(1), "/v1/leases")
        .await
        .expect_json(200);
    let resources: Vec<&str> = listed
        .leases
        .iter()
        .map(|lease| lease.resource.as_str())
        .collect();
    assert_eq!(resources, ["a"], "only the claim made with the good token");
    agent.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_a_leader_is_an_error_result_and_claims_nothing() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await.id;
    let survivor = cluster
        .nodes()
        .iter()
        .find(|node| node.id != leader)
        .expect("a follower")
        .id;
    let mut command = clean_command(baton_path());
    command.args([
        "mcp",
        "--endpoints",
        &cluster.node(survivor).api_url(),
        "--holder",
        "agent-a",
    ]);
    let mut raw = Raw::spawn(command).await;
    for node in cluster.nodes() {
        if node.id != survivor {
            node.kill();
        }
    }
    let refused = raw.call(1, "claim", json!({"resource": "a"})).await;
    assert!(is_error(&refused), "{refused}");
    assert!(
        text(&refused).contains("did not happen") || text(&refused).contains("unknown"),
        "{refused}"
    );
    assert_ne!(refused["structuredContent"]["granted"], true, "{refused}");
    raw.close().await;
}

/// The rmcp client's view of a bad argument: an error result (SEP-1303), not a JSON-RPC error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_are_error_results_naming_the_argument_and_change_nothing() {
    let cluster = Cluster::dev().await;
    let agent = Agent::start(&cluster, "agent-a", &[]).await;
    for (tool, arguments, named) in [
        ("claim", json!({}), "resource"),
        ("claim", json!({"resource": 7}), "resource"),
        ("claim", json!({"resource": "x", "mode": "forever"}), "mode"),
        (
            "claim",
            json!({"resource": "x", "wait_seconds": 61}),
            "wait_seconds",
        ),
        ("claim", json!({"resource": "x", "colour": "red"}), "colour"),
        // Baton's own INVALID_ARGUMENT: a `..` segment.
        ("claim", json!({"resource": "a/../b"}), "resource"),
        ("write_value", json!({"key": "k"}), "value"),
        (
            "add_task",
            json!({"queue": "q", "payload": 1, "priority": "high"}),
            "priority",
        ),
        ("complete_task", json!({"queue": "q"}), "id"),
        ("fail_task", json!({"queue": "q", "id": "t"}), "reason"),
        ("my_claims", json!({"everything": true}), "everything"),
    ] {
        let answer = agent.call(tool, arguments.clone()).await;
        assert!(
            answer.is_error,
            "{tool} {arguments}: an error result: {answer:?}"
        );
        assert!(
            answer.text.contains(named),
            "{tool} {arguments}: the result names {named}: {}",
            answer.text
        );
    }
    // An unknown tool is a protocol error (the 2025-11-25 spec), naming the tools there are.
    let unknown = agent
        .call_error("steal_lease", json!({"resource": "x"}))
        .await;
    assert!(
        unknown.contains("steal_lease") && unknown.contains("claim"),
        "{unknown}"
    );
    let listed = cluster.api().get(cluster.node(1), "/v1/leases").await;
    let leases: Value = listed.expect_json(200);
    assert_eq!(leases["leases"], json!([]), "nothing was claimed");
    let mine = agent.call("my_claims", json!({})).await;
    assert_eq!(
        mine.structured["session"], "none",
        "no session was made: {mine:?}"
    );
    agent.close().await;
}
