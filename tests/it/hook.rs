//! `baton hook claude-code` (docs/agents.md) fed real Claude Code hook events against real
//! `batond` processes: it claims, denies, renews and releases; it fails closed on every
//! failure it can meet (docs/agents.md, "Failing closed: the Claude Code hook"); it names a
//! file by the one naming rule; and the snippet of settings.json runs as written.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use baton_client::api::{Lease, SessionInfo};
use baton_tests::{is_session_id, path_with_baton, snippet, Cluster};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use super::cli::{command, url, Outcome, COMMAND_TIMEOUT};

/// The origin remote every test repository has, and the names it gives.
const ORIGIN: &str = "git@github.com:acme/web.git";
const REPO: &str = "github.com/acme/web";

/// `REPO/file`: the name the hook gives `file` of the test repository.
fn named(file: &str) -> String {
    format!("{REPO}/{file}")
}

/// A clone of github.com/acme/web (a `.git` directory with its config) and a state
/// directory for the hook.
pub(crate) struct HookWorld {
    directory: tempfile::TempDir,
    pub(crate) repo: PathBuf,
    pub(crate) state: PathBuf,
}

impl HookWorld {
    pub(crate) fn new() -> HookWorld {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let base = directory.path().canonicalize().expect("a canonical path");
        let repo = base.join("repo");
        git_repository(&repo, Some(ORIGIN));
        let state = base.join("state");
        HookWorld {
            directory,
            repo,
            state,
        }
    }

    /// A directory beside the repository.
    fn path(&self, name: &str) -> PathBuf {
        self.directory
            .path()
            .canonicalize()
            .expect("a canonical path")
            .join(name)
    }

    /// A `PreToolUse` event of `tool` editing `file` (relative to the repository).
    pub(crate) fn pre_tool_use(&self, session: &str, tool: &str, file: &str) -> Value {
        self.pre_tool_use_at(session, tool, &self.repo.join(file), &self.repo)
    }

    /// A `PreToolUse` event of `tool` editing `file` as given, from `cwd`.
    fn pre_tool_use_at(&self, session: &str, tool: &str, file: &Path, cwd: &Path) -> Value {
        let field = if tool == "NotebookEdit" {
            "notebook_path"
        } else {
            "file_path"
        };
        json!({
            "session_id": session,
            "transcript_path": format!("/home/u/.claude/projects/x/{session}.jsonl"),
            "cwd": cwd,
            "permission_mode": "default",
            "hook_event_name": "PreToolUse",
            "tool_name": tool,
            "tool_input": {field: file, "old_string": "a", "new_string": "b"},
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

    /// The end of the agent's turn.
    fn stop(&self, session: &str) -> Value {
        json!({
            "session_id": session,
            "transcript_path": format!("/home/u/.claude/projects/x/{session}.jsonl"),
            "cwd": self.repo,
            "hook_event_name": "Stop",
            "stop_hook_active": false,
        })
    }

    pub(crate) fn state_file(&self, session: &str) -> PathBuf {
        self.state.join("baton").join("claude-code").join(session)
    }

    /// `baton hook claude-code ARGS` with `input` on stdin.
    pub(crate) async fn hook(&self, endpoints: &str, args: &[&str], input: &[u8]) -> Outcome {
        let mut full = vec!["hook", "claude-code"];
        full.extend_from_slice(args);
        self.baton(endpoints, &full, input).await
    }

    /// `baton ARGS` as the hook runs it (its state directory, in the repository).
    async fn baton(&self, endpoints: &str, args: &[&str], input: &[u8]) -> Outcome {
        let mut hook = command(endpoints, args);
        hook.env_remove("BATON_HOLDER")
            .env("XDG_STATE_HOME", &self.state)
            .current_dir(&self.repo);
        run_with_input(hook, input).await
    }
}

/// A git repository at `path` (a `.git` directory, `src/`), with an origin remote if given.
fn git_repository(path: &Path, origin: Option<&str>) {
    std::fs::create_dir_all(path.join(".git")).expect("a .git directory");
    std::fs::create_dir_all(path.join("src")).expect("src");
    let config = origin.map_or(String::new(), |url| {
        format!(
            "[remote \"origin\"]\n\turl = {url}\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n"
        )
    });
    std::fs::write(path.join(".git/config"), config).expect("a git config");
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

async fn lease_count(cluster: &Cluster) -> usize {
    let leases: Value = cluster
        .api()
        .get(cluster.node(1), "/v1/leases")
        .await
        .expect_json(200);
    leases["leases"].as_array().map_or(0, Vec::len)
}

/// The session id a state file keeps (its first line).
fn read_state(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned()
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
    let held = lease(&cluster, &named("src/auth.rs"))
        .await
        .expect("a lease");
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
    let renewed = lease(&cluster, &named("src/auth.rs"))
        .await
        .expect("still held");
    assert_eq!(renewed.fence, held.fence, "the session was not renewed");

    // Another Claude session is denied, naming holder and fence.
    let other = world.pre_tool_use(agent_b, "Write", "src/auth.rs");
    let reason = denial(&world.hook(&endpoints, &[], &bytes(&other)).await);
    assert!(
        reason.starts_with(&format!(
            "{} is held by claude-code:aaaaaaaa@",
            named("src/auth.rs")
        )) && reason.contains(&format!("(fence {})", held.fence)),
        "{reason}"
    );
    // It may edit other files; notebooks are files too.
    let notebook = world.pre_tool_use(agent_b, "NotebookEdit", "analysis.ipynb");
    allowed(&world.hook(&endpoints, &[], &bytes(&notebook)).await);
    assert!(lease(&cluster, &named("analysis.ipynb")).await.is_some());

    // SessionEnd releases everything and forgets the session.
    let end = world.session_end(agent_a);
    allowed(&world.hook(&endpoints, &[], &bytes(&end)).await);
    assert!(lease(&cluster, &named("src/auth.rs")).await.is_none());
    assert!(!state.exists());
    allowed(&world.hook(&endpoints, &[], &bytes(&other)).await);
    assert!(lease(&cluster, &named("src/auth.rs"))
        .await
        .is_some_and(|lease| lease.holder.starts_with("claude-code:bbbbbbbb@")));
}

/// How many `method route` requests `node` answered, by its `/metrics`.
async fn answered(cluster: &Cluster, method: &str, route: &str) -> u64 {
    let metrics = cluster.api().get(&cluster.nodes()[0], "/metrics").await;
    let labels = format!("route=\"{route}\",method=\"{method}\",");
    metrics
        .text
        .lines()
        .filter(|line| line.starts_with("baton_http_requests_total{") && line.contains(&labels))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum()
}

/// Acquires, keepalives and session reads `cluster`'s one node answered.
async fn hook_requests(cluster: &Cluster) -> [u64; 3] {
    [
        answered(cluster, "POST", "/v1/leases").await,
        answered(cluster, "POST", "/v1/sessions/{id}/keepalive").await,
        answered(cluster, "GET", "/v1/sessions/{id}").await,
    ]
}

/// Most hook calls are one request, the acquire: a file the session already holds is told
/// from another's lease by the fence the hook kept, and the session is renewed by the first
/// call after a third of its TTL, not by every call. A state file of an earlier release (the
/// session id alone) costs one renewal and one look at the session, then calls are one request
/// again.
#[tokio::test]
async fn a_hook_call_is_one_request_until_its_session_is_due_for_renewal() {
    let cluster = Cluster::start(1).await;
    let endpoints = url(&cluster);
    let world = HookWorld::new();
    let agent = "iiiiiiii-one-request";
    let edit = |file: &str| bytes(&world.pre_tool_use(agent, "Edit", file));
    allowed(
        &world
            .hook(&endpoints, &["--ttl", "60s"], &edit("src/one.rs"))
            .await,
    );
    let before = hook_requests(&cluster).await;
    for file in ["src/two.rs", "src/one.rs", "src/two.rs", "src/one.rs"] {
        allowed(&world.hook(&endpoints, &["--ttl", "60s"], &edit(file)).await);
    }
    let after = hook_requests(&cluster).await;
    let sent = |from: [u64; 3], to: [u64; 3]| [to[0] - from[0], to[1] - from[1], to[2] - from[2]];
    assert_eq!(
        sent(before, after),
        [4, 0, 0],
        "acquires, keepalives, session reads"
    );

    let state = world.state_file(agent);
    let session = read_state(&state);
    std::fs::write(&state, format!("{session}\n")).expect("an earlier release's state file");
    allowed(
        &world
            .hook(&endpoints, &["--ttl", "60s"], &edit("src/one.rs"))
            .await,
    );
    let upgraded = hook_requests(&cluster).await;
    assert_eq!(sent(after, upgraded), [1, 1, 1]);
    allowed(
        &world
            .hook(&endpoints, &["--ttl", "60s"], &edit("src/one.rs"))
            .await,
    );
    assert_eq!(sent(upgraded, hook_requests(&cluster).await), [1, 0, 0]);
    assert_eq!(read_state(&state), session, "the same session all along");

    // Another Claude session is still refused the files, by the same one request.
    let other = world.pre_tool_use("jjjjjjjj-other", "Edit", "src/one.rs");
    let reason = denial(&world.hook(&endpoints, &[], &bytes(&other)).await);
    assert!(
        reason.contains("is held by claude-code:iiiiiiii@"),
        "{reason}"
    );
}

#[tokio::test]
async fn a_plain_http_hook_needs_no_system_certificates() {
    // The client built its TLS verifier from the system's CA store even for http:// endpoints:
    // a hook process read every file under /etc/ssl/certs on each call (half its CPU), and
    // where that store cannot be read (a container without ca-certificates) every edit was
    // denied with "cannot build an HTTP client".
    let cluster = Cluster::start(1).await;
    let endpoints = url(&cluster);
    let world = HookWorld::new();
    let edit = world.pre_tool_use("cccccccc-3333-4333-8333-333333333333", "Edit", "src/a.rs");
    let mut hook = command(&endpoints, &["hook", "claude-code"]);
    hook.env_remove("BATON_HOLDER")
        .env("XDG_STATE_HOME", &world.state)
        .env("SSL_CERT_FILE", "/nonexistent/ca.pem")
        .env("SSL_CERT_DIR", "/nonexistent")
        .current_dir(&world.repo);
    allowed(&run_with_input(hook, &bytes(&edit)).await);
    assert!(lease(&cluster, &named("src/a.rs")).await.is_some());
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
    for event in [read, prompt] {
        allowed(&world.hook(&endpoints, &[], &bytes(&event)).await);
    }
    let malformed = world.hook(&endpoints, &[], b"{not json").await;
    allowed(&malformed);
    assert_eq!(malformed.stderr.lines().count(), 1, "{malformed:#?}");
    assert_eq!(lease_count(&cluster).await, 0);
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
    assert_eq!(
        held,
        files.map(named),
        "the kept session does not hold every file"
    );
}

// ---------------------------------------------------------------------------------------------
// Failing closed (issue: the hook allowed the edit on any 4xx, a bad flag, a corrupt state)
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn the_claude_code_hook_denies_when_baton_is_unreachable_unless_failing_open() {
    let world = HookWorld::new();
    let closed = format!("http://127.0.0.1:{}", baton_tests::free_port());
    let edit = world.pre_tool_use("dddddddd-4444", "Edit", "src/auth.rs");
    let reason = denial(&world.hook(&closed, &[], &bytes(&edit)).await);
    assert!(reason.contains("unreachable"), "{reason}");
    assert!(reason.starts_with(&named("src/auth.rs")), "{reason}");
    let open = world.hook(&closed, &["--fail-open"], &bytes(&edit)).await;
    allowed(&open);
    assert!(open.stderr.contains("unreachable"), "{open:#?}");
    // A gateway's 5xx: Baton behind it did not answer.
    let gateway = not_baton("502 Bad Gateway", "<html>upstream down</html>");
    let reason = denial(&world.hook(&gateway, &[], &bytes(&edit)).await);
    assert!(
        reason.contains("unreachable") && reason.contains("502"),
        "{reason}"
    );
    allowed(&world.hook(&gateway, &["--fail-open"], &bytes(&edit)).await);
}

/// A server on a loopback port that answers every request with `status` and `body`, as a
/// proxy, a load balancer or another service on Baton's port would.
fn not_baton(status: &'static str, body: &'static str) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("an address");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = [0u8; 4096];
            let _ = std::io::Read::read(&mut stream, &mut request);
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\ncontent-type: text/html\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    format!("http://{address}")
}

#[tokio::test]
async fn every_refusal_denies_the_edit_and_fail_open_covers_none_of_them() {
    let cluster = Cluster::start(1).await;
    let endpoints = url(&cluster);
    let world = HookWorld::new();
    let edit = world.pre_tool_use("eeeeeeee-refusals", "Edit", "src/auth.rs");
    let file = named("src/auth.rs");

    // A TTL over Baton's limit (1 h) is Baton's INVALID_ARGUMENT: before, the edit went
    // ahead unclaimed, so two sessions could edit one file.
    for extra in [&[][..], &["--fail-open"][..]] {
        let mut args = vec!["--ttl", "2h"];
        args.extend_from_slice(extra);
        let reason = denial(&world.hook(&endpoints, &args, &bytes(&edit)).await);
        assert!(
            reason.starts_with(&format!(
                "{file} cannot be claimed: Baton refused the claim"
            )) && reason.contains("INVALID_ARGUMENT")
                && reason.contains("--ttl 2h"),
            "{reason}"
        );
    }
    // Endpoints that are not Baton: a proxy's 401, 403, 404 without a problem body, and the
    // node's own peer port, which answers every client route with its own refusal.
    for (status, body) in [
        ("401 Unauthorized", "<html>log in</html>"),
        ("403 Forbidden", "<html>no</html>"),
        ("404 Not Found", "<html>not here</html>"),
    ] {
        let proxy = not_baton(status, body);
        for args in [&[][..], &["--fail-open"][..]] {
            let reason = denial(&world.hook(&proxy, args, &bytes(&edit)).await);
            assert!(
                reason.starts_with(&format!(
                    "{file} cannot be claimed: Baton refused the claim"
                )) && reason.contains(&status[..3]),
                "{status} {args:?}: {reason}"
            );
        }
    }
    let peer = format!("http://{}", cluster.node(1).peer_addr());
    let reason = denial(&world.hook(&peer, &["--fail-open"], &bytes(&edit)).await);
    assert!(
        reason.starts_with(&format!("{file} cannot be claimed")),
        "{reason}"
    );
    assert_eq!(lease_count(&cluster).await, 0, "nothing was claimed");
}

#[tokio::test]
async fn a_bad_flag_denies_each_edit_saying_which_and_lets_other_events_through() {
    let cluster = Cluster::start(1).await;
    let endpoints = url(&cluster);
    let world = HookWorld::new();
    let session = "ffffffff-flags";
    let edit = world.pre_tool_use(session, "Edit", "src/auth.rs");
    for (args, names) in [
        (&["--ttl", "banana"][..], "--ttl"),
        (&["--timeout", "soon"][..], "--timeout"),
        (&["--no-such-flag"][..], "--no-such-flag"),
        (&["--fail-open", "--ttl", "banana"][..], "--ttl"),
    ] {
        let reason = denial(&world.hook(&endpoints, args, &bytes(&edit)).await);
        assert!(
            reason.contains("cannot be claimed")
                && reason.contains(names)
                && reason.contains(".claude/settings.json"),
            "{args:?}: {reason}"
        );
    }
    // Events the hook does not claim for are let through, with the warning on stderr.
    let end = world
        .hook(
            &endpoints,
            &["--no-such-flag"],
            &bytes(&world.session_end(session)),
        )
        .await;
    allowed(&end);
    assert!(end.stderr.contains("--no-such-flag"), "{end:#?}");
    assert_eq!(lease_count(&cluster).await, 0, "nothing was claimed");
}

#[tokio::test]
async fn a_corrupt_state_file_is_replaced_and_one_that_cannot_be_kept_denies() {
    let cluster = Cluster::start(1).await;
    let endpoints = url(&cluster);
    let world = HookWorld::new();
    let session = "gggggggg-state";
    let edit = world.pre_tool_use(session, "Edit", "src/main.rs");
    allowed(&world.hook(&endpoints, &[], &bytes(&edit)).await);
    // "garbage" looked like a session id before: Baton answered INVALID_ARGUMENT, the edit
    // went ahead unclaimed, and the file was never replaced.
    for corrupt in ["garbage\n", "\u{0}garbage\n", ""] {
        std::fs::write(world.state_file(session), corrupt).expect("corrupt it");
        let next = world.pre_tool_use(session, "Edit", &format!("src/{}.rs", corrupt.len()));
        allowed(&world.hook(&endpoints, &[], &bytes(&next)).await);
        let kept = read_state(&world.state_file(session));
        assert!(
            is_session_id(&kept),
            "{corrupt:?} was not replaced: {kept:?}"
        );
        assert!(
            lease(&cluster, &named(&format!("src/{}.rs", corrupt.len())))
                .await
                .is_some()
        );
    }
    // A state directory that cannot be made: the new session is ended and the edit denied.
    let blocked = HookWorld::new();
    std::fs::write(&blocked.state, "a file where a directory must go").expect("block it");
    let other = blocked.pre_tool_use("hhhhhhhh-state", "Edit", "src/lib.rs");
    let reason = denial(&blocked.hook(&endpoints, &[], &bytes(&other)).await);
    assert!(reason.contains("cannot keep its session"), "{reason}");
    assert!(lease(&cluster, &named("src/lib.rs")).await.is_none());
}

// ---------------------------------------------------------------------------------------------
// One name per file (issue: two repositories' src/shared.rs collided; outside git a name
// depended on the working directory)
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_file_has_one_name_and_two_repositories_two() {
    let cluster = Cluster::start(1).await;
    let endpoints = url(&cluster);
    let world = HookWorld::new();
    let (agent_a, agent_b) = ("aaaa1111-names", "bbbb2222-names");

    // Another repository's src/shared.rs is another file.
    let other = world.path("other");
    git_repository(&other, Some("https://gitlab.example.org/acme/api.git"));
    let mine = world.pre_tool_use(agent_a, "Edit", "src/shared.rs");
    allowed(&world.hook(&endpoints, &[], &bytes(&mine)).await);
    let theirs = world.pre_tool_use_at(agent_b, "Edit", &other.join("src/shared.rs"), &other);
    allowed(&world.hook(&endpoints, &[], &bytes(&theirs)).await);
    assert!(lease(&cluster, &named("src/shared.rs")).await.is_some());
    assert!(lease(&cluster, "gitlab.example.org/acme/api/src/shared.rs")
        .await
        .is_some());

    // Outside git, one file named from two working directories is one name: the second
    // agent is denied (both were allowed before, as `b.txt` and `sub/b.txt`).
    let loose = world.path("loose");
    std::fs::create_dir_all(loose.join("sub")).expect("loose/sub");
    let first = world.pre_tool_use_at(agent_a, "Write", Path::new("b.txt"), &loose);
    allowed(&world.hook(&endpoints, &[], &bytes(&first)).await);
    let second = world.pre_tool_use_at(agent_b, "Write", Path::new("../b.txt"), &loose.join("sub"));
    let reason = denial(&world.hook(&endpoints, &[], &bytes(&second)).await);
    let loose_name = format!("{}/b.txt", loose.display())
        .trim_start_matches('/')
        .to_owned();
    assert!(
        reason.starts_with(&format!("{loose_name} is held by")),
        "{reason}"
    );

    // A symbolic link claims its target: editing through it is denied to agent b.
    std::fs::write(world.repo.join("src/real.rs"), "").expect("a file");
    let link = world.path("link.rs");
    std::os::unix::fs::symlink(world.repo.join("src/real.rs"), &link).expect("a link");
    allowed(
        &world
            .hook(
                &endpoints,
                &[],
                &bytes(&world.pre_tool_use(agent_a, "Edit", "src/real.rs")),
            )
            .await,
    );
    let through = world.pre_tool_use_at(agent_b, "Edit", &link, &world.path(""));
    let reason = denial(&world.hook(&endpoints, &[], &bytes(&through)).await);
    assert!(
        reason.starts_with(&format!("{} is held by", named("src/real.rs"))),
        "{reason}"
    );

    // --repo names the working directory's repository; --root with it, a tree inside one.
    let configured = world.pre_tool_use(agent_a, "Edit", "src/lib.rs");
    allowed(
        &world
            .hook(&endpoints, &["--repo", "web"], &bytes(&configured))
            .await,
    );
    assert!(lease(&cluster, "web/src/lib.rs").await.is_some());
    let rooted = world.pre_tool_use(agent_a, "Edit", "src/mod.rs");
    allowed(
        &world
            .hook(
                &endpoints,
                &["--root", "src", "--repo", "web-src"],
                &bytes(&rooted),
            )
            .await,
    );
    assert!(lease(&cluster, "web-src/mod.rs").await.is_some());

    // A subtree claim in the way: the denial names the file and the subtree covering it.
    let holder = baton_client::Client::builder([endpoints.as_str()])
        .holder("agent-c")
        .build()
        .expect("a client");
    let _docs = holder
        .acquire(
            &named("docs"),
            baton_client::AcquireOptions::new()
                .subtree()
                .ttl(Duration::from_secs(60)),
        )
        .await
        .expect("a subtree lease");
    let edit_docs = world.pre_tool_use(agent_a, "Write", "docs/login.md");
    let reason = denial(&world.hook(&endpoints, &[], &bytes(&edit_docs)).await);
    assert!(
        reason.starts_with(&format!(
            "{} is inside {}, held (subtree) by agent-c",
            named("docs/login.md"),
            named("docs")
        )),
        "{reason}"
    );
}

// ---------------------------------------------------------------------------------------------
// Claims end with the agent's turn (issue: a long session kept every file it touched)
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn the_end_of_a_turn_releases_the_claims_and_release_frees_one_file() {
    let cluster = Cluster::start(1).await;
    let endpoints = url(&cluster);
    let world = HookWorld::new();
    let session = "iiiiiiii-turns";
    for file in ["src/a.rs", "src/b.rs"] {
        let edit = world.pre_tool_use(session, "Edit", file);
        allowed(&world.hook(&endpoints, &[], &bytes(&edit)).await);
    }
    // One file released by hand, named as the hook names it, from a subdirectory.
    let mut release = command(&endpoints, &["hook", "claude-code", "release", "a.rs"]);
    release
        .env("XDG_STATE_HOME", &world.state)
        .current_dir(world.repo.join("src"));
    let released = run_with_input(release, b"").await;
    released.expect_code(0);
    assert_eq!(
        released.stdout.trim(),
        format!("released {}", named("src/a.rs"))
    );
    assert!(lease(&cluster, &named("src/a.rs")).await.is_none());
    assert!(lease(&cluster, &named("src/b.rs")).await.is_some());
    let again = world
        .baton(
            &endpoints,
            &["hook", "claude-code", "release", "src/a.rs"],
            b"",
        )
        .await;
    again.expect_code(3);
    assert!(
        again.error_line().contains("error[NOT_FOUND]"),
        "{again:#?}"
    );

    // Stop, the end of the agent's turn, releases the rest; the next edit claims again.
    allowed(
        &world
            .hook(&endpoints, &[], &bytes(&world.stop(session)))
            .await,
    );
    assert_eq!(lease_count(&cluster).await, 0);
    assert!(!world.state_file(session).exists());
    let next = world.pre_tool_use(session, "Edit", "src/b.rs");
    allowed(&world.hook(&endpoints, &[], &bytes(&next)).await);
    assert!(lease(&cluster, &named("src/b.rs")).await.is_some());

    // --keep-claims keeps them across turns, until SessionEnd.
    allowed(
        &world
            .hook(&endpoints, &["--keep-claims"], &bytes(&world.stop(session)))
            .await,
    );
    assert!(lease(&cluster, &named("src/b.rs")).await.is_some());
    allowed(
        &world
            .hook(&endpoints, &[], &bytes(&world.session_end(session)))
            .await,
    );
    assert_eq!(lease_count(&cluster).await, 0);
}

// ---------------------------------------------------------------------------------------------
// The snippet of docs/agents.md and the README, run as written
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
    for event in ["Stop", "SessionEnd"] {
        assert_eq!(
            settings["hooks"][event][0]["hooks"][0]["command"], hook,
            "{event}: {settings}"
        );
    }

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
        reason.starts_with(&format!(
            "{} is held by claude-code:eeeeeeee@",
            named("src/db.rs")
        )),
        "{reason}"
    );
    allowed(&run(world.stop("eeeeeeee-5")).await);
    allowed(&run(world.pre_tool_use("ffffffff-6", "Write", "src/db.rs")).await);
    allowed(&run(world.session_end("ffffffff-6")).await);
    assert!(lease(&cluster, &named("src/db.rs")).await.is_none());
}
