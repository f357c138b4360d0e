//! `baton mcp` spoken to as a real MCP client does: the rmcp client over the child's stdio,
//! against a real `batond dev`. Each agent is its own `baton mcp` process with its own holder
//! name and Baton session; the tests check what docs/agents.md promises the model: eleven
//! tools with schemas, a denial that names the holder, everything freed when stdin closes, a
//! fenced write refused once the claim was lost, and Baton unreachable as a tool error the
//! server recovers from. `fail_closed` provokes every other failure and checks that none takes
//! a claim the model was not told of.
//!
//! `demo_two_agents_share_a_repo` prints a transcript of two agents working side by side
//! (`cargo test -p baton-tests --test it mcp::demo -- --nocapture`).

mod fail_closed;

use std::process::Stdio;
use std::time::{Duration, Instant};

use baton_tests::{baton_path, path_with_baton, poll_until, snippet, Cluster, Method};
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::transport::TokioChildProcess;
use rmcp::ServiceExt;
use serde_json::{json, Value};

/// How long a test waits for a state before it calls it a failure.
const STATE_TIMEOUT: Duration = Duration::from_secs(15);
/// docs/agents.md: closing stdin ends the session, which frees what it held at once.
const FREED_WITHIN: Duration = Duration::from_secs(1);

/// `program` with no `BATON_*` variable of the test's own environment.
fn clean_command(program: impl AsRef<std::ffi::OsStr>) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(program);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("BATON_") {
            command.env_remove(key);
        }
    }
    command
}

/// One agent: a `baton mcp` child and the MCP client session over its stdio.
struct Agent {
    holder: String,
    pid: u32,
    client: RunningService<RoleClient, ()>,
}

impl Agent {
    /// Starts `baton mcp --holder HOLDER ARGS...` against the cluster's node and completes
    /// the MCP handshake.
    async fn start(cluster: &Cluster, holder: &str, args: &[&str]) -> Agent {
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
        Agent::spawn(command, holder).await
    }

    /// Starts `command` (a `baton mcp` however it is written) and completes the handshake;
    /// `holder` is the name its claims will carry.
    async fn spawn(mut command: tokio::process::Command, holder: &str) -> Agent {
        command.kill_on_drop(true);
        let (transport, _) = TokioChildProcess::builder(command)
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn baton mcp");
        let pid = transport.id().expect("the child's pid");
        let client = ().serve(transport).await.expect("the MCP handshake");
        Agent {
            holder: holder.to_owned(),
            pid,
            client,
        }
    }

    /// Calls a tool; panics on an MCP error.
    async fn call(&self, tool: &str, arguments: Value) -> ToolResult {
        match self.try_call(tool, arguments.clone()).await {
            Ok(answer) => answer,
            Err(error) => panic!("{tool} {arguments}: MCP error {error}"),
        }
    }

    async fn try_call(&self, tool: &str, arguments: Value) -> Result<ToolResult, ServiceError> {
        let Value::Object(arguments) = arguments else {
            panic!("arguments must be an object");
        };
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        self.client.call_tool(params).await.map(ToolResult::from)
    }

    /// The MCP error message of a call that must fail.
    async fn call_error(&self, tool: &str, arguments: Value) -> String {
        match self.try_call(tool, arguments.clone()).await {
            Ok(answer) => panic!("{tool} {arguments} should be an MCP error, got {answer:?}"),
            Err(ServiceError::McpError(error)) => error.message.to_string(),
            Err(other) => panic!("{tool} {arguments}: not an MCP error: {other}"),
        }
    }

    fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([format!("-{signal}"), self.pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {}", self.pid);
    }

    /// Closes the server's stdin and waits for it to exit.
    async fn close(self) {
        self.client.cancel().await.expect("close the MCP session");
    }
}

/// A tool result: its one text line, `structuredContent`, and `isError`.
#[derive(Debug)]
struct ToolResult {
    text: String,
    structured: Value,
    is_error: bool,
}

impl From<CallToolResult> for ToolResult {
    fn from(result: CallToolResult) -> ToolResult {
        let text = result
            .content
            .iter()
            .filter_map(|content| content.as_text())
            .map(|text| text.text.clone())
            .collect::<Vec<_>>()
            .join("\n");
        ToolResult {
            text,
            structured: result.structured_content.unwrap_or(Value::Null),
            is_error: result.is_error.unwrap_or(false),
        }
    }
}

/// The live lease on `resource` as the cluster answers it (`None` for 404).
async fn lease(cluster: &Cluster, resource: &str) -> Option<Value> {
    let reply = cluster
        .api()
        .call(
            Method::GET,
            cluster.node(1),
            &format!("/v1/leases/{resource}"),
        )
        .send()
        .await;
    match reply.status {
        200 => Some(reply.parse()),
        404 => None,
        status => panic!("GET /v1/leases/{resource}: {status} {reply:?}"),
    }
}

const TOOLS: [&str; 11] = [
    "claim",
    "release",
    "my_claims",
    "who_holds",
    "list_claims",
    "write_value",
    "read_value",
    "add_task",
    "next_task",
    "complete_task",
    "fail_task",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_list_shows_the_eleven_tools_with_their_schemas() {
    let cluster = Cluster::dev().await;
    let agent = Agent::start(&cluster, "agent-a", &[]).await;
    let info = agent
        .client
        .peer_info()
        .expect("the server's initialize answer");
    let server = info.server_info.as_ref().expect("the server names itself");
    assert_eq!(server.name, "baton");
    assert!(info.capabilities.tools.is_some());

    let tools = agent.client.list_all_tools().await.expect("tools/list");
    let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
    assert_eq!(names, TOOLS);
    let required = |name: &str| -> Vec<String> {
        let tool = tools.iter().find(|tool| tool.name == name).expect("listed");
        assert_eq!(tool.input_schema["type"], "object", "{name}");
        assert!(
            tool.description
                .as_deref()
                .is_some_and(|text| !text.is_empty()),
            "{name} has a description"
        );
        let mut required: Vec<String> = tool
            .input_schema
            .get("required")
            .and_then(Value::as_array)
            .map(|list| {
                list.iter()
                    .filter_map(|name| name.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        required.sort();
        required
    };
    // `resource` or `path`, one of the two: the call says so when neither or both is given.
    for tool in ["claim", "release", "who_holds"] {
        assert!(required(tool).is_empty(), "{tool}");
        let properties = tools
            .iter()
            .find(|listed| listed.name == tool)
            .and_then(|listed| listed.input_schema["properties"].as_object().cloned())
            .unwrap_or_default();
        assert!(
            properties.contains_key("resource") && properties.contains_key("path"),
            "{tool}: {properties:?}"
        );
    }
    assert!(required("my_claims").is_empty());
    assert!(required("list_claims").is_empty());
    assert_eq!(required("write_value"), ["key", "value"]);
    assert_eq!(required("read_value"), ["key"]);
    assert_eq!(required("add_task"), ["payload", "queue"]);
    assert_eq!(required("next_task"), ["queue"]);
    assert_eq!(required("complete_task"), ["id", "queue"]);
    assert_eq!(required("fail_task"), ["id", "queue", "reason"]);
    let claim = tools
        .iter()
        .find(|tool| tool.name == "claim")
        .expect("claim");
    let properties = claim.input_schema["properties"]
        .as_object()
        .expect("claim has properties");
    for argument in ["resource", "path", "mode", "reason", "wait_seconds"] {
        assert!(properties.contains_key(argument), "claim takes {argument}");
    }
    assert_eq!(
        properties["wait_seconds"]["maximum"], 60,
        "the schema caps the wait: {}",
        properties["wait_seconds"]
    );
    agent.close().await;
}

/// One name per file for every runtime: a file claimed through MCP's `path` (relative, or an
/// absolute `resource`) is the file the Claude Code hook claims and `baton name` names; MCP
/// refused absolute paths and its docs named files otherwise than the hook before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_claimed_through_mcp_is_the_file_the_hook_claims() {
    let cluster = Cluster::start(1).await;
    let world = crate::hook::HookWorld::new();
    let mut command = clean_command(baton_path());
    command
        .args([
            "mcp",
            "--endpoints",
            &cluster.node(1).api_url(),
            "--holder",
            "agent-m",
        ])
        .current_dir(&world.repo);
    let agent = Agent::spawn(command, "agent-m").await;

    let claimed = agent.call("claim", json!({"path": "src/auth.rs"})).await;
    assert!(!claimed.is_error, "{claimed:?}");
    assert_eq!(
        claimed.structured["resource"], "github.com/acme/web/src/auth.rs",
        "{claimed:?}"
    );
    let absolute = world.repo.join("src/db.rs");
    let claimed = agent
        .call("claim", json!({"resource": absolute, "mode": "exclusive"}))
        .await;
    assert_eq!(
        claimed.structured["resource"], "github.com/acme/web/src/db.rs",
        "{claimed:?}"
    );
    let named = crate::cli::baton(
        &cluster.node(1).api_url(),
        &["name", absolute.to_str().expect("UTF-8")],
    )
    .await;
    assert_eq!(
        named.stdout.trim(),
        "github.com/acme/web/src/db.rs",
        "{named:?}"
    );

    // The hook of a Claude session is denied the same file, named the same way.
    let edit = world.pre_tool_use("cccccccc-mcp", "Edit", "src/auth.rs");
    let reason = crate::hook::denial(
        &world
            .hook(&cluster.node(1).api_url(), &[], &crate::hook::bytes(&edit))
            .await,
    );
    assert!(
        reason.starts_with("github.com/acme/web/src/auth.rs is held by agent-m"),
        "{reason}"
    );
    let held = agent
        .call("who_holds", json!({"path": "src/auth.rs"}))
        .await;
    assert!(held.text.contains("agent-m"), "{held:?}");
    let released = agent
        .call("release", json!({"path": world.repo.join("src/auth.rs")}))
        .await;
    assert!(!released.is_error, "{released:?}");
    assert!(lease(&cluster, "github.com/acme/web/src/auth.rs")
        .await
        .is_none());

    // Both, or neither: an error result naming them.
    for arguments in [json!({}), json!({"resource": "a", "path": "b"})] {
        let refused = agent.call("claim", arguments.clone()).await;
        assert!(
            refused.is_error
                && refused.text.contains("`resource`")
                && refused.text.contains("`path`"),
            "{arguments}: {refused:?}"
        );
    }
    agent.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_race_for_a_path_one_wins_the_other_is_told_who_and_closing_stdin_frees_it() {
    let cluster = Cluster::dev().await;
    let (a, b) = tokio::join!(
        Agent::start(&cluster, "agent-a", &[]),
        Agent::start(&cluster, "agent-b", &[])
    );
    let path = "repo/src/auth.rs";
    let claim = json!({"resource": path, "reason": "fix the login bug"});
    let (from_a, from_b) = tokio::join!(a.call("claim", claim.clone()), b.call("claim", claim));
    let granted = |answer: &ToolResult| answer.structured["granted"] == true;
    assert!(
        granted(&from_a) != granted(&from_b),
        "exactly one is granted: {from_a:?} {from_b:?}"
    );
    let (winner, loser, denial) = if granted(&from_a) {
        (a, b, from_b)
    } else {
        (b, a, from_a)
    };
    assert!(!denial.is_error, "a denial is a normal result: {denial:?}");
    assert_eq!(
        denial.structured["held_by"]["holder"],
        winner.holder.as_str()
    );
    assert!(
        denial.text.contains(path) && denial.text.contains(&winner.holder),
        "the denial names the path and the holder: {}",
        denial.text
    );
    assert!(
        denial.text.ends_with("pick other work, wait, or escalate"),
        "{}",
        denial.text
    );
    let fence = lease(&cluster, path).await.expect("held")["fence"].clone();
    assert_eq!(denial.structured["held_by"]["fence"], fence);

    let who = loser.call("who_holds", json!({"resource": path})).await;
    assert_eq!(who.structured["held"], true);
    assert_eq!(who.structured["lease"]["holder"], winner.holder.as_str());

    // Closing the winner's stdin ends its session: the path is free at once, not after
    // the 60 s TTL.
    let closed_at = Instant::now();
    winner.close().await;
    let remaining = FREED_WITHIN.saturating_sub(closed_at.elapsed());
    poll_until(
        remaining,
        "the path to be freed after stdin closed",
        async || lease(&cluster, path).await.is_none().then_some(()),
    )
    .await;
    let again = loser.call("claim", json!({"resource": path})).await;
    assert_eq!(again.structured["granted"], true, "{again:?}");
    loser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_waits_follows_the_release_instead_of_the_ttl() {
    let cluster = Cluster::dev().await;
    let (a, b) = tokio::join!(
        Agent::start(&cluster, "agent-a", &[]),
        Agent::start(&cluster, "agent-b", &[])
    );
    let path = "migrations";
    let first = a.call("claim", json!({"resource": path})).await;
    assert_eq!(first.structured["granted"], true, "{first:?}");
    let started = Instant::now();
    let (waited, released) = tokio::join!(
        b.call("claim", json!({"resource": path, "wait_seconds": 30})),
        async {
            // Let b be denied and start waiting, then release.
            tokio::time::sleep(Duration::from_millis(700)).await;
            // A waiting claim does not block b's other calls.
            let meanwhile = b.call("my_claims", json!({})).await;
            assert_eq!(meanwhile.structured["claims"], json!([]), "{meanwhile:?}");
            a.call("release", json!({"resource": path})).await
        }
    );
    assert_eq!(released.structured["released"], true, "{released:?}");
    assert_eq!(waited.structured["granted"], true, "{waited:?}");
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(600),
        "b was granted only after the release: {elapsed:?}"
    );
    assert!(
        elapsed < Duration::from_secs(10),
        "b followed the release, not the 60 s TTL: {elapsed:?}"
    );
    // Without a wait, a denial comes back at once.
    let denied = a.call("claim", json!({"resource": path})).await;
    assert_eq!(denied.structured["granted"], false, "{denied:?}");
    assert!(denied.text.contains("agent-b"), "{}", denied.text);
    a.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_fenced_by_a_claim_lost_to_expiry_is_refused_and_the_loss_is_announced() {
    let cluster = Cluster::dev().await;
    let (a, b) = tokio::join!(
        Agent::start(&cluster, "agent-a", &["--ttl", "1s"]),
        Agent::start(&cluster, "agent-b", &[])
    );
    let path = "db/schema";
    let granted = a.call("claim", json!({"resource": path})).await;
    assert_eq!(granted.structured["granted"], true, "{granted:?}");
    let written = a
        .call(
            "write_value",
            json!({"key": "db/schema/version", "value": 1, "claim": path}),
        )
        .await;
    assert_eq!(written.structured["written"], true, "{written:?}");

    // A pause longer than the TTL: no keepalive, the session expires, b takes the path.
    a.signal("STOP");
    poll_until(STATE_TIMEOUT, "agent-a's lease to expire", async || {
        lease(&cluster, path).await.is_none().then_some(())
    })
    .await;
    let taken = b.call("claim", json!({"resource": path})).await;
    assert_eq!(taken.structured["granted"], true, "{taken:?}");
    a.signal("CONT");

    let refused = a
        .call(
            "write_value",
            json!({"key": "db/schema/version", "value": 2, "claim": path}),
        )
        .await;
    assert!(
        !refused.is_error,
        "a refusal is a normal result: {refused:?}"
    );
    assert_eq!(refused.structured["written"], false, "{refused:?}");
    assert!(refused.text.contains("refused"), "{}", refused.text);
    assert!(
        refused.structured["session_lost"]["claims"]
            .as_array()
            .is_some_and(|claims| claims.contains(&json!(path))),
        "the loss names the claim: {refused:?}"
    );
    let value = b
        .call("read_value", json!({"key": "db/schema/version"}))
        .await;
    assert_eq!(
        value.structured["value"], 1,
        "the refused write changed nothing"
    );

    // Every later result announces the loss, until a claim starts a new session and says so.
    let mine = a.call("my_claims", json!({})).await;
    assert_eq!(mine.structured["session"], "lost", "{mine:?}");
    assert!(mine.text.contains("session was lost"), "{}", mine.text);
    let fresh = a.call("claim", json!({"resource": "docs"})).await;
    assert_eq!(fresh.structured["granted"], true, "{fresh:?}");
    assert!(fresh.text.contains("new Baton session"), "{}", fresh.text);
    let after = a.call("my_claims", json!({})).await;
    assert_eq!(after.structured["session"], "live", "{after:?}");
    assert!(after.structured.get("session_lost").is_none(), "{after:?}");
    a.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baton_unreachable_is_a_tool_error_and_the_server_recovers() {
    let cluster = Cluster::dev().await;
    let (a, b) = tokio::join!(
        Agent::start(&cluster, "agent-a", &[]),
        Agent::start(&cluster, "agent-b", &["--ttl", "1s"])
    );
    let granted = a.call("claim", json!({"resource": "api/server"})).await;
    assert_eq!(granted.structured["granted"], true, "{granted:?}");
    let short = b.call("claim", json!({"resource": "api/cache"})).await;
    assert_eq!(short.structured["granted"], true, "{short:?}");

    cluster.node(1).kill();
    let unreachable = a.call("who_holds", json!({"resource": "api/server"})).await;
    assert!(unreachable.is_error, "{unreachable:?}");
    assert!(
        unreachable.text.contains("unreachable"),
        "{}",
        unreachable.text
    );
    // b's 1 s session cannot be renewed meanwhile: it is lost, and b says so.
    let lapsed = poll_until(
        STATE_TIMEOUT,
        "agent-b to see its session lost",
        async || {
            let mine = b.call("my_claims", json!({})).await;
            (mine.structured["session"] == "lost").then_some(mine)
        },
    )
    .await;
    assert!(lapsed.text.contains("api/cache"), "{}", lapsed.text);

    cluster.node(1).restart();
    cluster.wait_ready(STATE_TIMEOUT).await;
    // a's session (60 s TTL) outlived the outage: its claim still holds, its writes go through.
    let back = poll_until(STATE_TIMEOUT, "agent-a to reach Baton again", async || {
        let who = a.call("who_holds", json!({"resource": "api/server"})).await;
        (!who.is_error).then_some(who)
    })
    .await;
    assert_eq!(back.structured["yours"], true, "{back:?}");
    let written = a
        .call(
            "write_value",
            json!({"key": "api/server/port", "value": 8080, "claim": "api/server"}),
        )
        .await;
    assert_eq!(written.structured["written"], true, "{written:?}");
    // b's lost claim is not assumed back: a fenced write with it is refused.
    let refused = b
        .call(
            "write_value",
            json!({"key": "api/cache/size", "value": 1, "claim": "api/cache"}),
        )
        .await;
    assert_eq!(refused.structured["written"], false, "{refused:?}");
    assert!(
        refused.structured.get("session_lost").is_some(),
        "{refused:?}"
    );
    a.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_are_claimed_completed_and_failed_with_their_fences() {
    let cluster = Cluster::dev().await;
    let (a, b) = tokio::join!(
        Agent::start(&cluster, "agent-a", &[]),
        Agent::start(&cluster, "agent-b", &[])
    );
    let build = a
        .call(
            "add_task",
            json!({"queue": "builds", "payload": {"crate": "node"}, "priority": 5}),
        )
        .await;
    let lint = a
        .call(
            "add_task",
            json!({"queue": "builds", "payload": {"crate": "client"}}),
        )
        .await;
    let build_id = build.structured["task"]["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    let lint_id = lint.structured["task"]["id"]
        .as_str()
        .expect("an id")
        .to_owned();

    let first = b.call("next_task", json!({"queue": "builds"})).await;
    assert_eq!(
        first.structured["id"],
        build_id.as_str(),
        "priority first: {first:?}"
    );
    let second = a.call("next_task", json!({"queue": "builds"})).await;
    assert_eq!(second.structured["id"], lint_id.as_str(), "{second:?}");
    let none = a.call("next_task", json!({"queue": "builds"})).await;
    assert_eq!(none.structured["claimed"], false, "{none:?}");

    // Only the claimer may settle a task.
    let not_yours = a
        .call("complete_task", json!({"queue": "builds", "id": build_id}))
        .await;
    assert_eq!(not_yours.structured["refused"], true, "{not_yours:?}");
    let done = b
        .call(
            "complete_task",
            json!({"queue": "builds", "id": build_id, "result": {"ok": true}}),
        )
        .await;
    assert_eq!(done.structured["completed"], true, "{done:?}");
    let twice = b
        .call("complete_task", json!({"queue": "builds", "id": build_id}))
        .await;
    assert_eq!(twice.structured["refused"], true, "{twice:?}");

    let failed = a
        .call(
            "fail_task",
            json!({"queue": "builds", "id": lint_id, "reason": "clippy found 3 warnings"}),
        )
        .await;
    assert_eq!(failed.structured["failed"], true, "{failed:?}");
    assert_eq!(
        failed.structured["task"]["state"], "ready",
        "retried: {failed:?}"
    );
    let retried = b.call("next_task", json!({"queue": "builds"})).await;
    assert_eq!(retried.structured["id"], lint_id.as_str(), "{retried:?}");
    assert_eq!(retried.structured["attempt"], 2, "{retried:?}");
    a.close().await;
    b.close().await;
}

/// A transcript of two agents sharing a repository through `baton mcp`, printed for the
/// docs and checked line by line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_two_agents_share_a_repo() {
    let cluster = Cluster::dev().await;
    let (a, b) = tokio::join!(
        Agent::start(&cluster, "agent-a", &[]),
        Agent::start(&cluster, "agent-b", &[])
    );
    let mut transcript = Vec::new();
    let mut step = async |agent: &Agent, tool: &str, arguments: Value| -> ToolResult {
        let answer = agent.call(tool, arguments.clone()).await;
        transcript.push(format!(
            "{} → {tool} {arguments}\n    {}{}",
            agent.holder,
            if answer.is_error { "[isError] " } else { "" },
            answer.text
        ));
        answer
    };
    let claimed = step(
        &a,
        "claim",
        json!({"resource": "repo/src/auth.rs", "reason": "fix login"}),
    )
    .await;
    assert_eq!(claimed.structured["granted"], true);
    let denied = step(&b, "claim", json!({"resource": "repo/src/auth.rs"})).await;
    assert_eq!(denied.structured["granted"], false);
    let other = step(
        &b,
        "claim",
        json!({"resource": "repo/docs", "mode": "subtree"}),
    )
    .await;
    assert_eq!(other.structured["granted"], true);
    let covered = step(&a, "claim", json!({"resource": "repo/docs/login.md"})).await;
    assert_eq!(covered.structured["granted"], false);
    assert!(
        covered.text.starts_with(
            "repo/docs/login.md is held by agent-b through its subtree claim on repo/docs"
        ),
        "{}",
        covered.text
    );
    let inside = step(&b, "claim", json!({"resource": "repo/docs/api.md"})).await;
    assert_eq!(inside.structured["already_held"], true, "{inside:?}");
    step(
        &a,
        "write_value",
        json!({"key": "repo/status/auth", "value": "fixing", "claim": "repo/src/auth.rs"}),
    )
    .await;
    step(&b, "read_value", json!({"key": "repo/status/auth"})).await;
    step(&b, "list_claims", json!({"prefix": "repo/"})).await;
    step(
        &a,
        "add_task",
        json!({"queue": "reviews", "payload": {"file": "repo/src/auth.rs"}}),
    )
    .await;
    let task = step(&b, "next_task", json!({"queue": "reviews"})).await;
    let task_id = task.structured["id"].as_str().expect("claimed").to_owned();
    step(
        &b,
        "complete_task",
        json!({"queue": "reviews", "id": task_id, "result": "LGTM"}),
    )
    .await;
    step(&a, "release", json!({"resource": "repo/src/auth.rs"})).await;
    let after = step(&b, "claim", json!({"resource": "repo/src/auth.rs"})).await;
    assert_eq!(after.structured["granted"], true);
    step(&b, "my_claims", json!({})).await;
    println!("{}", transcript.join("\n"));
    a.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_the_session_and_frees_everything_at_once() {
    let cluster = Cluster::dev().await;
    let agent = Agent::start(&cluster, "agent-a", &[]).await;
    for resource in ["svc/dev-server", "svc/db"] {
        let granted = agent.call("claim", json!({"resource": resource})).await;
        assert_eq!(granted.structured["granted"], true, "{granted:?}");
    }
    let signalled_at = Instant::now();
    agent.signal("TERM");
    let remaining = FREED_WITHIN.saturating_sub(signalled_at.elapsed());
    poll_until(
        remaining,
        "both claims to be freed after SIGTERM",
        async || {
            let listed = cluster
                .api()
                .get(cluster.node(1), "/v1/leases?prefix=svc/")
                .await;
            let leases: Value = listed.expect_json(200);
            (leases["leases"] == json!([])).then_some(())
        },
    )
    .await;
}

/// The two ways docs/agents.md adds the server to Claude Code, run as written but for the
/// endpoint (the test cluster's, not 127.0.0.1:7420): `claude mcp add`'s command and `-e`
/// variables, and `.mcp.json`'s command, arguments and env. Both serve the eleven tools, and
/// the second agent is told the first one holds the path, by the holder name the line sets.
#[tokio::test]
async fn the_documented_claude_mcp_add_line_and_mcp_json_start_working_servers() {
    let cluster = Cluster::start(1).await;
    let endpoint = cluster.node(1).api_url();

    let line = snippet("docs/agents.md", "claude-mcp-add");
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words[..4], ["claude", "mcp", "add", "baton"], "{line}");
    let dashes = words
        .iter()
        .position(|word| *word == "--")
        .expect("a -- in the line");
    let mut command = clean_command(words[dashes + 1]);
    command.env("PATH", path_with_baton());
    let mut holder = None;
    for pair in words[4..dashes].windows(2) {
        if pair[0] == "-e" {
            let (key, value) = pair[1].split_once('=').expect("-e KEY=VALUE");
            command.env(key, value);
            if key == "BATON_HOLDER" {
                holder = Some(value.to_owned());
            }
        }
    }
    let holder = holder.expect("the line names a holder");
    let mut arguments: Vec<String> = words[dashes + 2..]
        .iter()
        .map(|word| word.to_string())
        .collect();
    let at = arguments
        .iter()
        .position(|word| word == "--endpoints")
        .expect("the line names --endpoints");
    arguments[at + 1] = endpoint.clone();
    command.args(&arguments);
    let first = Agent::spawn(command, &holder).await;

    let config: Value =
        serde_json::from_str(&snippet("docs/agents.md", "mcp.json")).expect(".mcp.json parses");
    let server = &config["mcpServers"]["baton"];
    let mut command = clean_command(server["command"].as_str().expect("a command"));
    command.env("PATH", path_with_baton());
    for (key, value) in server["env"].as_object().expect("an env object") {
        command.env(key, value.as_str().expect("a string value"));
    }
    command.env("BATON_ENDPOINTS", &endpoint);
    command.env("BATON_HOLDER", "from-mcp-json");
    let arguments: Vec<&str> = server["args"]
        .as_array()
        .expect("an args array")
        .iter()
        .map(|arg| arg.as_str().expect("a string argument"))
        .collect();
    command.args(&arguments);
    let second = Agent::spawn(command, "from-mcp-json").await;

    for agent in [&first, &second] {
        let tools = agent.client.list_all_tools().await.expect("tools/list");
        assert_eq!(tools.len(), 11, "{}: {tools:?}", agent.holder);
    }
    let granted = first
        .call("claim", json!({"resource": "repo/src/main.rs"}))
        .await;
    assert!(
        granted.text.starts_with("claimed repo/src/main.rs"),
        "{granted:?}"
    );
    let denied = second
        .call("claim", json!({"resource": "repo/src/main.rs"}))
        .await;
    assert!(
        denied.text.contains(&format!("held by {holder}")),
        "{denied:?}"
    );
    first.close().await;
    second.close().await;
}
