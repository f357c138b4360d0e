//! `baton hook claude-code` (docs/agents.md): a Claude Code hook that claims each file an
//! agent is about to edit, so that two agents never edit one file at once. The model never
//! manages a lease: it sees its edit go through, or denied with who holds the file and for
//! how long, and decides what to do.
//!
//! One hook event arrives as JSON on stdin. `PreToolUse` of `Edit`, `Write`, `MultiEdit` or
//! `NotebookEdit` claims the file, named by the one rule of `baton_client::names` (its
//! repository's identity and its path in it, links resolved), as an exclusive lease of the
//! Claude session's Baton session. That session is created by the first claim (holder
//! `claude-code:<first 8 of session_id>@host` unless `--holder`/`BATON_HOLDER` names one) and
//! renewed (`--ttl`, default 15m) by the first call after a third of its TTL; its id, when it
//! was last renewed and the fence of each file it was granted live in a 0600 file under
//! `$XDG_STATE_HOME/baton/claude-code/` (`~/.local/state` when unset), one per Claude
//! session. So most calls are one request, the acquire: a refusal by this session's own
//! lease is told from another's by its fence. `Stop` (the end of the agent's turn) and `SessionEnd` end the Baton session,
//! releasing every file (`--keep-claims`: only `SessionEnd`). Anything else: exit 0, no
//! output. `baton hook claude-code release PATH` releases one file an agent of this user
//! claimed.
//!
//! **Fail closed.** Only a grant, or the file already held by this session, lets an edit
//! through. Anything else denies it with a reason the model reads: another holder, a refusal
//! (a 4xx of any kind, from Baton or from something that is not Baton), a bad flag, a state
//! file that cannot be kept, a TLS or token problem. `--fail-open` lets the edit through only
//! when Baton is unreachable (nothing answered, no leader, no answer in time). The hook always
//! exits 0 with its decision on stdout, so that Claude Code reads it.
//!
//! A hook keeps no memory but that file: when the Baton session was lost (it expired between
//! two edits, or someone ended it), the next call creates a new one; the leases of the lost
//! one are gone, and another agent may have edited those files meanwhile. A missing or corrupt
//! file (its first line anything but a session id) is replaced the same way.
//!
//! What must never live here: lease rules; the server decides, the hook only asks.

use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use baton_client::api::{AcquireRequest, ErrorCode, Labels, LeaseMode, SessionId};
use baton_client::{name_file, Client, Error, FileNaming};
use clap::{Args, Subcommand};
use nix::fcntl::{Flock, FlockArg};
use serde::Deserialize;
use serde_json::Value;

use super::duration::parse_duration;
use super::output::{note, say, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE};
use super::Global;

/// Longest single attempt of a hook's request: a hook must answer fast.
const HOOK_REQUEST_TIMEOUT_MAX: Duration = Duration::from_secs(2);
/// Longest time a hook spends retrying (an unreachable Baton included).
const HOOK_RETRY_BUDGET_MAX: Duration = Duration::from_secs(3);
/// Longest hook event read from stdin.
const EVENT_BYTES_MAX: u64 = 4 << 20;
/// Longest Claude session id kept in a state file's name.
const STATE_NAME_BYTES_MAX: usize = 128;
/// The tools whose file the hook claims, with the field of `tool_input` naming it.
const EDIT_TOOLS: [(&str, &str); 4] = [
    ("Edit", "file_path"),
    ("Write", "file_path"),
    ("MultiEdit", "file_path"),
    ("NotebookEdit", "notebook_path"),
];
/// Where a deny reason sends a user whose hook is misconfigured.
const FIX_THE_HOOK: &str = "fix the hook's command in .claude/settings.json";

/// `baton hook claude-code [--root DIR] [--repo ID] [--ttl 15m] [--fail-open] [--keep-claims]`,
/// or `baton hook claude-code release PATH...`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ClaudeCodeArgs {
    /// Treat this directory as the repository root of the files under it (default: each
    /// file's git top level).
    #[arg(long, global = true)]
    pub root: Option<PathBuf>,
    /// The repository identity of the working directory's repository (or of --root), instead
    /// of its `origin` remote: the first part of every name it claims.
    #[arg(long, global = true)]
    pub repo: Option<String>,
    /// TTL of the Claude session's Baton session; the first hook call after a third of it
    /// renews it. A bad value denies every edit, saying so.
    #[arg(long, default_value = "15m")]
    pub ttl: String,
    /// Allow the edit when Baton is unreachable (default: deny it, saying so). Never covers
    /// a refusal, a bad flag or a TLS or token problem.
    #[arg(long)]
    pub fail_open: bool,
    /// Keep the files claimed across the agent's turns, until SessionEnd or --ttl of
    /// silence (default: the end of each turn, Claude Code's Stop event, releases them).
    #[arg(long)]
    pub keep_claims: bool,
    #[command(subcommand)]
    pub action: Option<ClaudeCodeAction>,
}

/// What `baton hook claude-code` does besides answering a hook event.
#[derive(Debug, Subcommand)]
pub enum ClaudeCodeAction {
    /// Release files a Claude Code session of this user claimed through the hook (named as
    /// the hook names them, from the current directory); exit 3 when none held one.
    Release {
        /// The files to release.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
}

/// The fields of a Claude Code hook event the hook reads; the rest is ignored.
#[derive(Debug, Deserialize)]
struct HookEvent {
    session_id: String,
    hook_event_name: String,
    #[serde(default)]
    tool_name: Option<String>,
    #[serde(default)]
    tool_input: Option<Value>,
    #[serde(default)]
    cwd: Option<PathBuf>,
}

/// What the hook tells Claude Code.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    /// Exit 0 without output: the edit goes ahead.
    Allow,
    /// Exit 0 with a `deny` decision and this reason.
    Deny(String),
}

/// Runs the hook, or its `release`; a hook event always exits 0 (see the module comment).
pub async fn claude_code(global: &Global, args: ClaudeCodeArgs) -> u8 {
    if let Some(ClaudeCodeAction::Release { paths }) = &args.action {
        return release(global, &args, paths).await;
    }
    let Some(event) = read_event() else {
        return EXIT_OK;
    };
    let decision = match event.hook_event_name.as_str() {
        "PreToolUse" => pre_tool_use(global, &args, &event).await,
        "Stop" if !args.keep_claims => {
            end_claims(global, &event).await;
            Decision::Allow
        }
        "SessionEnd" => {
            end_claims(global, &event).await;
            Decision::Allow
        }
        _ => Decision::Allow,
    };
    answer(decision)
}

/// The hook's command line did not parse (`error` is clap's): an edit is denied saying so, so
/// that a typo never turns coordination off; any other event is let through with a warning.
pub fn bad_flags(error: &clap::Error) -> u8 {
    let problem = error
        .to_string()
        .lines()
        .next()
        .unwrap_or("a usage error")
        .trim_start_matches("error: ")
        .to_owned();
    let Some(event) = read_event() else {
        return EXIT_OK;
    };
    match edited_file(&event) {
        Some(file) if event.hook_event_name == "PreToolUse" => answer(Decision::Deny(format!(
            "{} cannot be claimed: baton hook claude-code has a bad flag ({problem}); \
             {FIX_THE_HOOK}",
            file.display()
        ))),
        _ => {
            note!("baton hook: a bad flag ({problem}); {FIX_THE_HOOK}");
            EXIT_OK
        }
    }
}

/// The hook event on stdin, or `None` (with a warning) when there is none to read.
fn read_event() -> Option<HookEvent> {
    let mut input = Vec::new();
    if let Err(error) = std::io::stdin()
        .take(EVENT_BYTES_MAX)
        .read_to_end(&mut input)
    {
        note!("baton hook: cannot read the hook event on stdin: {error}");
        return None;
    }
    match serde_json::from_slice(&input) {
        Ok(event) => Some(event),
        Err(error) => {
            note!("baton hook: ignoring a malformed hook event: {error}");
            None
        }
    }
}

fn answer(decision: Decision) -> u8 {
    if let Decision::Deny(reason) = decision {
        let answer = serde_json::json!({
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "deny",
                "permissionDecisionReason": reason,
            }
        });
        say!("{answer}");
    }
    EXIT_OK
}

async fn pre_tool_use(global: &Global, args: &ClaudeCodeArgs, event: &HookEvent) -> Decision {
    let Some(file) = edited_file(event) else {
        return Decision::Allow;
    };
    let ttl = match parse_duration(&args.ttl) {
        Ok(ttl) => ttl,
        Err(error) => {
            return Decision::Deny(format!(
                "{} cannot be claimed: the hook's --ttl {:?} is not a duration ({error}); \
                 {FIX_THE_HOOK}",
                file.display(),
                args.ttl
            ))
        }
    };
    let working_directory = event
        .cwd
        .clone()
        .or_else(|| std::env::current_dir().ok())
        .unwrap_or_else(|| PathBuf::from("/"));
    let resource = match name_file(&file, &working_directory, &naming(args)) {
        Ok(name) => name.resource,
        Err(error) => {
            return Decision::Deny(format!("{} cannot be claimed: {error}", file.display()))
        }
    };
    let client = match hook_client(global, &event.session_id) {
        Ok(client) => client,
        Err(error) => {
            return Decision::Deny(format!(
                "{resource} cannot be claimed: the hook's Baton settings are wrong ({}); \
                 {FIX_THE_HOOK}",
                error.message()
            ))
        }
    };
    let state = StateFile::new(&event.session_id);
    let _serialized = state.lock();
    claim(&client, args, ttl, &state, &resource).await
}

fn naming(args: &ClaudeCodeArgs) -> FileNaming {
    FileNaming {
        root: args.root.clone(),
        repo: args.repo.clone(),
    }
}

/// Claims `resource` for the Claude session's Baton session, creating that session when
/// there is none (or it is gone), and renewing it once a third of its TTL has passed since the
/// last renewal. Most calls are one request: the acquire. A refusal by a lease of this
/// session's own holder name is this session's lease when its fence is the one this session
/// was granted for the file (fences are never granted twice); only a file granted before the
/// state file kept fences needs a look at the session.
async fn claim(
    client: &Client,
    args: &ClaudeCodeArgs,
    ttl: Duration,
    state: &StateFile,
    resource: &str,
) -> Decision {
    let request = |session_id: Option<SessionId>| AcquireRequest {
        limit: None,
        resource: resource.to_owned(),
        holder: session_id.is_none().then(|| client.holder().to_owned()),
        ttl_ms: session_id
            .is_none()
            .then(|| u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)),
        session_id,
        mode: LeaseMode::Exclusive,
        max_hold_ms: None,
        labels: Labels::new(),
        reason: Some("editing with Claude Code".to_owned()),
        wait_ms: None,
    };
    let now_ms = wall_ms();
    if let Some(mut kept) = state.read() {
        let with_session = request(Some(kept.session_id.clone()));
        let (renewed, acquired) = if kept.renewal_due(now_ms, ttl) {
            let (renewed, acquired) = tokio::join!(
                client.keepalive(&kept.session_id),
                client.acquire_raw(&with_session)
            );
            (Some(renewed), acquired)
        } else {
            (None, client.acquire_raw(&with_session).await)
        };
        let gone = matches!(
            renewed,
            Some(Err(Error::Lost { .. } | Error::NotFound { .. }))
        );
        if matches!(renewed, Some(Ok(_))) {
            kept.renewed_at_ms = Some(now_ms);
        }
        let decision = match acquired {
            Ok(answer) => {
                kept.granted(resource, answer.value.fence);
                Some(Decision::Allow)
            }
            Err(Error::Held { held_by, message }) if !gone => {
                let ours = held_by.holder == client.holder()
                    && (kept.fence_of(resource) == Some(held_by.fence)
                        || holds(client, &kept.session_id, resource).await);
                if ours {
                    kept.granted(resource, held_by.fence);
                    Some(Decision::Allow)
                } else {
                    Some(Decision::Deny(message))
                }
            }
            // The session is gone: the acquire below makes a new one.
            Err(Error::Lost { .. } | Error::NotFound { .. } | Error::Held { .. }) => None,
            Err(error) => Some(refused(args, resource, &error)),
        };
        if let Some(decision) = decision {
            // What it keeps besides the session id only saves requests later: a state file
            // that cannot be rewritten costs a renewal or a look at the session, not the edit.
            if let Err(error) = state.write(&kept) {
                note!(
                    "baton hook: cannot update {} ({error}); the next call renews the session",
                    state.path.display()
                );
            }
            return decision;
        }
    }
    // No session yet, or it is gone: the acquire creates one in the same write.
    match client.acquire_raw(&request(None)).await {
        Ok(answer) => {
            let mut kept = Kept::new(answer.value.session_id.clone(), now_ms);
            kept.granted(resource, answer.value.fence);
            match state.write(&kept) {
                Ok(()) => Decision::Allow,
                Err(error) => {
                    // A session nobody remembers would hold the file against its own agent.
                    let _ = client.end_session(&answer.value.session_id).await;
                    Decision::Deny(format!(
                        "{resource} cannot be claimed: the hook cannot keep its session in {} \
                         ({error}); make that directory writable or set XDG_STATE_HOME",
                        state.path.display()
                    ))
                }
            }
        }
        Err(Error::Held { message, .. }) => Decision::Deny(message),
        Err(error) => refused(args, resource, &error),
    }
}

/// Milliseconds since the Unix epoch by this machine's clock (0 before it).
fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

/// True when `session_id` holds the lease on `resource` (a refused re-acquire of one's own
/// lease looks like any other refusal but for the holder).
async fn holds(client: &Client, session_id: &SessionId, resource: &str) -> bool {
    client
        .get_session(session_id)
        .await
        .is_ok_and(|info| info.leases.iter().any(|lease| lease.resource == resource))
}

/// True when `error` means Baton could not be reached or could not decide (nothing answered,
/// no leader, no answer in time, an answer lost or a gateway's 5xx): the one failure
/// `--fail-open` covers. A refusal, a quota, a TLS or token problem is an answer, not an
/// outage.
fn is_unreachable(error: &Error) -> bool {
    match error {
        Error::Unavailable { code, .. } => matches!(code, None | Some(ErrorCode::NoLeader)),
        Error::Indeterminate { .. } => true,
        _ => false,
    }
}

/// The decision when the claim was not granted for another reason than another holder:
/// deny, saying why; with `--fail-open`, allow only when Baton is unreachable.
fn refused(args: &ClaudeCodeArgs, resource: &str, error: &Error) -> Decision {
    if is_unreachable(error) {
        if args.fail_open {
            note!(
                "baton hook: Baton is unreachable; allowing the edit of {resource} (--fail-open): {}",
                error.message()
            );
            return Decision::Allow;
        }
        return Decision::Deny(format!(
            "{resource} cannot be claimed: Baton is unreachable ({}: {})",
            error.code(),
            error.message()
        ));
    }
    let because = match error {
        Error::Tls { message } => {
            return Decision::Deny(format!(
                "{resource} cannot be claimed: Baton's TLS setup is wrong, so edits are denied \
                 until it is fixed ({message}); {FIX_THE_HOOK} (--ca-file) or the server's \
                 certificate"
            ))
        }
        Error::Denied { .. } => format!("; {FIX_THE_HOOK} (--token, or BATON_TOKEN)"),
        Error::InvalidArgument { .. } | Error::PayloadTooLarge { .. } => {
            format!(
                "; check the hook's flags (--ttl {}) and the file's name",
                args.ttl
            )
        }
        _ => String::new(),
    };
    Decision::Deny(format!(
        "{resource} cannot be claimed: Baton refused the claim ({}: {}){because}",
        error.code(),
        error.message()
    ))
}

/// `Stop` or `SessionEnd`: ends the Claude session's Baton session, releasing every file it
/// claimed, and forgets it. A failure leaves the files to expire with the session's TTL.
async fn end_claims(global: &Global, event: &HookEvent) {
    let state = StateFile::new(&event.session_id);
    let _serialized = state.lock();
    let Some(Kept { session_id, .. }) = state.read() else {
        state.remove();
        return;
    };
    let ended = match hook_client(global, &event.session_id) {
        Ok(client) => client.end_session(&session_id).await.map(drop),
        Err(error) => Err(error),
    };
    match ended {
        Ok(()) | Err(Error::Lost { .. } | Error::NotFound { .. }) => {}
        Err(error) => note!(
            "baton hook: ending the Baton session failed (it expires by itself): {}",
            error.message()
        ),
    }
    state.remove();
}

/// `baton hook claude-code release PATH...`: each file is released by whichever of this
/// user's Claude Code sessions holds it.
async fn release(global: &Global, args: &ClaudeCodeArgs, paths: &[PathBuf]) -> u8 {
    let working_directory = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let client = match hook_client(global, "release") {
        Ok(client) => client,
        Err(error) => {
            note!("error[{}]: {}", error.code(), error.message());
            return EXIT_USAGE;
        }
    };
    let sessions = StateFile::all();
    let mut code = EXIT_OK;
    for path in paths {
        let resource = match name_file(path, &working_directory, &naming(args)) {
            Ok(name) => name.resource,
            Err(error) => {
                note!("error[INVALID_ARGUMENT]: {error}");
                return EXIT_USAGE;
            }
        };
        let mut released = false;
        for session_id in &sessions {
            match client.release(session_id, &resource).await {
                Ok(_) => {
                    released = true;
                    break;
                }
                Err(Error::Lost { .. } | Error::NotFound { .. }) => {}
                Err(error) => {
                    note!("error[{}]: {resource}: {}", error.code(), error.message());
                    return super::output::EXIT_FAILURE;
                }
            }
        }
        if released {
            say!("released {resource}");
        } else {
            note!("error[NOT_FOUND]: no Claude Code session of yours holds {resource}");
            code = EXIT_NOT_FOUND;
        }
    }
    code
}

/// The file an edit tool is about to change, from its `tool_input`.
fn edited_file(event: &HookEvent) -> Option<PathBuf> {
    let tool = event.tool_name.as_deref()?;
    let (_, field) = EDIT_TOOLS.iter().find(|(name, _)| *name == tool)?;
    let path = event.tool_input.as_ref()?.get(field)?.as_str()?;
    (!path.is_empty()).then(|| PathBuf::from(path))
}

/// A client for the hook: short timeouts, and the Claude session's own holder name.
fn hook_client(global: &Global, claude_session: &str) -> Result<Client, Error> {
    let holder = global.holder().unwrap_or_else(|| {
        let default = baton_client::default_holder();
        let host = default
            .rsplit_once('@')
            .map_or("localhost", |(_, host)| host);
        let short: String = claude_session.chars().take(8).collect();
        format!("claude-code:{short}@{host}")
    });
    let builder = Client::builder(global.endpoints())
        .holder(holder)
        .request_timeout(global.timeout.min(HOOK_REQUEST_TIMEOUT_MAX))
        .retry_budget(global.timeout.min(HOOK_RETRY_BUDGET_MAX));
    global.configure(builder)?.build()
}

/// The file keeping one Claude session's Baton session id.
#[derive(Debug)]
struct StateFile {
    path: PathBuf,
}

impl StateFile {
    fn new(claude_session: &str) -> StateFile {
        let base = std::env::var_os("XDG_STATE_HOME")
            .map(PathBuf::from)
            .filter(|path| path.is_absolute())
            .or_else(|| {
                std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/state"))
            })
            .unwrap_or_else(std::env::temp_dir);
        let name: String = claude_session
            .chars()
            .take(STATE_NAME_BYTES_MAX)
            .map(|c| match c {
                'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' => c,
                _ => '_',
            })
            .collect();
        let name = if name.is_empty() {
            "unnamed".to_owned()
        } else {
            name
        };
        StateFile {
            path: base.join("baton").join("claude-code").join(name),
        }
    }

    /// What the file keeps, or `None` when there is none or its first line is anything but a
    /// session id (32 lowercase hex digits): a corrupt file is replaced by a new session.
    fn read(&self) -> Option<Kept> {
        Kept::parse(&std::fs::read_to_string(&self.path).ok()?)
    }

    /// The session ids kept for every Claude session of this user.
    fn all() -> Vec<SessionId> {
        let Ok(entries) = std::fs::read_dir(StateFile::new("").directory()) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter(|entry| entry.path().extension().is_none())
            .filter_map(|entry| Kept::parse(&std::fs::read_to_string(entry.path()).ok()?))
            .map(|kept| kept.session_id)
            .collect()
    }

    fn directory(&self) -> &Path {
        self.path.parent().unwrap_or_else(|| Path::new("."))
    }

    /// An exclusive lock on the Claude session's calls, held until dropped, or `None` when the
    /// lock file cannot be made (then calls are not serialized). Claude Code runs the hooks
    /// of parallel tool calls at once: unserialized, two first edits would create two
    /// sessions, and the one whose id is not kept would hold its file, unrenewed, against its
    /// own agent until it expires.
    fn lock(&self) -> Option<Flock<std::fs::File>> {
        self.create_directory().ok()?;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(self.path.with_extension("lock"))
            .ok()?;
        Flock::lock(file, FlockArg::LockExclusive).ok()
    }

    fn create_directory(&self) -> std::io::Result<()> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(self.directory())
    }

    /// Replaces the file (0600, in a 0700 directory) with `kept`.
    fn write(&self, kept: &Kept) -> std::io::Result<()> {
        self.create_directory()?;
        let temporary = self
            .path
            .with_extension(format!("tmp{}", std::process::id()));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)?;
        file.write_all(kept.to_string().as_bytes())?;
        drop(file);
        std::fs::rename(&temporary, &self.path)
    }

    /// Removes the file and its lock file.
    fn remove(&self) {
        for path in [self.path.clone(), self.path.with_extension("lock")] {
            if let Err(error) = std::fs::remove_file(&path) {
                if error.kind() != std::io::ErrorKind::NotFound {
                    note!("baton hook: cannot remove {}: {error}", path.display());
                }
            }
        }
    }
}

/// What a state file keeps of a Claude session's Baton session, one item a line: the session
/// id, then `renewed MS` (when the hook last renewed it, by this machine's clock), then
/// `granted FENCE RESOURCE` for each file it was granted, oldest first (the newest
/// `KEPT_GRANTS_MAX`). A file of the session id alone (what earlier releases wrote) is read as
/// due for renewal with no fence known; a line that does not parse is dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Kept {
    session_id: SessionId,
    renewed_at_ms: Option<u64>,
    grants: Vec<(String, u64)>,
}

/// How many files' fences a state file keeps.
const KEPT_GRANTS_MAX: usize = 1_000;

impl Kept {
    fn new(session_id: SessionId, renewed_at_ms: u64) -> Kept {
        Kept {
            session_id,
            renewed_at_ms: Some(renewed_at_ms),
            grants: Vec::new(),
        }
    }

    fn parse(text: &str) -> Option<Kept> {
        let mut lines = text.lines();
        let mut kept = Kept {
            session_id: session_id_of(lines.next()?)?,
            renewed_at_ms: None,
            grants: Vec::new(),
        };
        for line in lines {
            if let Some(at) = line.strip_prefix("renewed ") {
                kept.renewed_at_ms = at.parse().ok();
            } else if let Some(grant) = line.strip_prefix("granted ") {
                if let Some((fence, resource)) = grant.split_once(' ') {
                    if let Ok(fence) = fence.parse() {
                        kept.granted(resource, fence);
                    }
                }
            }
        }
        Some(kept)
    }

    /// True once a third of `ttl` has passed since the last renewal (or the clock went back,
    /// or none is known): the session has at least two thirds of its TTL left otherwise.
    fn renewal_due(&self, now_ms: u64, ttl: Duration) -> bool {
        let third = u64::try_from(ttl.as_millis() / 3).unwrap_or(u64::MAX);
        self.renewed_at_ms
            .is_none_or(|at| now_ms < at || now_ms - at >= third)
    }

    /// Records that this session was granted `resource` with `fence`.
    fn granted(&mut self, resource: &str, fence: u64) {
        if resource.contains(['\n', '\r']) {
            return;
        }
        self.grants.retain(|(kept, _)| kept != resource);
        self.grants.push((resource.to_owned(), fence));
        if self.grants.len() > KEPT_GRANTS_MAX {
            self.grants.remove(0);
        }
    }

    /// The fence this session was granted `resource` with, if it is kept.
    fn fence_of(&self, resource: &str) -> Option<u64> {
        self.grants
            .iter()
            .find(|(kept, _)| kept == resource)
            .map(|(_, fence)| *fence)
    }
}

impl std::fmt::Display for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}", self.session_id.as_str())?;
        if let Some(at) = self.renewed_at_ms {
            writeln!(f, "renewed {at}")?;
        }
        for (resource, fence) in &self.grants {
            writeln!(f, "granted {fence} {resource}")?;
        }
        Ok(())
    }
}

/// The session id a line holds, if it holds exactly one.
fn session_id_of(line: &str) -> Option<SessionId> {
    let id = line.trim();
    let well_formed = id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    well_formed.then(|| SessionId::new(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_file_holds_a_session_id_or_nothing() {
        let id = "0123456789abcdef0123456789abcdef";
        assert_eq!(session_id_of(&format!("{id}\n")), Some(SessionId::new(id)));
        for corrupt in [
            "garbage",
            "",
            "0123456789ABCDEF0123456789ABCDEF",
            "\u{0}garbage",
        ] {
            assert_eq!(session_id_of(corrupt), None, "{corrupt:?}");
        }
    }

    #[test]
    fn a_state_file_keeps_the_renewal_and_the_fences_and_reads_an_earlier_ones() {
        let id = "0123456789abcdef0123456789abcdef";
        let earlier = Kept::parse(&format!("{id}\n")).expect("a session id alone");
        assert_eq!(earlier.renewed_at_ms, None);
        assert!(earlier.renewal_due(5, Duration::from_secs(900)));
        assert_eq!(earlier.fence_of("repo/src/a.rs"), None);

        let mut kept = Kept::new(SessionId::new(id), 1_000);
        kept.granted("repo/src/a.rs", 7);
        kept.granted("repo/a file with spaces", 9);
        kept.granted("repo/src/a.rs", 12);
        kept.granted("not\nkept", 13);
        let text = kept.to_string();
        assert_eq!(
            text,
            format!(
                "{id}\nrenewed 1000\ngranted 9 repo/a file with spaces\ngranted 12 repo/src/a.rs\n"
            )
        );
        let read = Kept::parse(&text).expect("reads back");
        assert_eq!(read, kept);
        assert_eq!(read.fence_of("repo/src/a.rs"), Some(12));
        assert_eq!(read.fence_of("repo/a file with spaces"), Some(9));

        let ttl = Duration::from_secs(900);
        assert!(!read.renewal_due(1_000 + 299_999, ttl));
        assert!(read.renewal_due(1_000 + 300_000, ttl));
        assert!(read.renewal_due(999, ttl), "the clock went back");

        // Lines that do not parse are dropped; a first line that is no session id is no file.
        let damaged =
            Kept::parse(&format!("{id}\nrenewed soon\ngranted x y\ngranted 3\n")).unwrap();
        assert_eq!((damaged.renewed_at_ms, damaged.grants.len()), (None, 0));
        assert_eq!(Kept::parse(&format!("garbage\n{id}\n")), None);

        let mut many = Kept::new(SessionId::new(id), 0);
        for index in 0..KEPT_GRANTS_MAX + 5 {
            many.granted(&format!("repo/{index}"), index as u64);
        }
        assert_eq!(many.grants.len(), KEPT_GRANTS_MAX);
        assert_eq!(many.fence_of("repo/4"), None, "the oldest go first");
        assert_eq!(many.fence_of("repo/5"), Some(5));
    }

    #[test]
    fn only_edit_tools_name_a_file() {
        let event = |tool: &str, input: Value| HookEvent {
            session_id: "s".to_owned(),
            hook_event_name: "PreToolUse".to_owned(),
            tool_name: Some(tool.to_owned()),
            tool_input: Some(input),
            cwd: None,
        };
        let cases = [
            ("Edit", serde_json::json!({"file_path": "/a"}), Some("/a")),
            ("Write", serde_json::json!({"file_path": "/b"}), Some("/b")),
            (
                "MultiEdit",
                serde_json::json!({"file_path": "/c"}),
                Some("/c"),
            ),
            (
                "NotebookEdit",
                serde_json::json!({"notebook_path": "/d.ipynb"}),
                Some("/d.ipynb"),
            ),
            ("Read", serde_json::json!({"file_path": "/a"}), None),
            ("Bash", serde_json::json!({"command": "ls"}), None),
            ("Edit", serde_json::json!({}), None),
        ];
        for (tool, input, file) in cases {
            assert_eq!(
                edited_file(&event(tool, input)),
                file.map(PathBuf::from),
                "{tool}"
            );
        }
    }
}
