//! `baton hook claude-code` (docs/agents.md): a Claude Code hook that claims each file an
//! agent is about to edit, so that two agents never edit one file at once. The model never
//! manages a lease: it sees its edit go through, or denied with who holds the file and for
//! how long, and decides what to do.
//!
//! One hook event arrives as JSON on stdin. `PreToolUse` of `Edit`, `Write`, `MultiEdit` or
//! `NotebookEdit` claims the file's path relative to `--root` (default: the git top level
//! containing the file, else the working directory) as an exclusive lease of the Claude
//! session's Baton session. That session is created by the first claim (holder
//! `claude-code:<first 8 of session_id>@host` unless `--holder`/`BATON_HOLDER` names one) and
//! renewed (`--ttl`, default 15m) by every later call; its id lives in a 0600 file under
//! `$XDG_STATE_HOME/baton/claude-code/` (`~/.local/state` when unset), one per Claude
//! session. Granted or already held by this session: exit 0, no output. Held by another:
//! a `deny` decision naming the holder. Baton unreachable: deny saying so, or allow with
//! `--fail-open`. `SessionEnd` ends the Baton session (releasing everything) and removes the
//! file. Anything else: exit 0, no output.
//!
//! A hook keeps no memory but that file: when the Baton session was lost (it expired between
//! two edits, or someone ended it), the next call creates a new one; the leases of the lost
//! one are gone, and another agent may have edited those files meanwhile. A missing, corrupt
//! or unreadable file is replaced the same way. The hook always exits 0, so that a broken
//! hook never blocks Claude Code: malformed input is a one-line warning on stderr.
//!
//! What must never live here: lease rules; the server decides, the hook only asks.

use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use baton_client::api::{AcquireRequest, Labels, LeaseMode, SessionId};
use baton_client::{Client, Error};
use clap::Args;
use nix::fcntl::{Flock, FlockArg};
use serde::Deserialize;
use serde_json::Value;

use super::duration::parse_duration;
use super::output::{note, say, EXIT_OK};
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

/// `baton hook claude-code [--root DIR] [--ttl 15m] [--fail-open]`.
#[derive(Debug, Args)]
pub struct ClaudeCodeArgs {
    /// Claim paths relative to this directory (default: the git top level containing the
    /// file, else the hook's working directory). Files outside it are not claimed.
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// TTL of the Claude session's Baton session; every hook call renews it.
    #[arg(long, default_value = "15m", value_parser = parse_duration)]
    pub ttl: Duration,
    /// Allow the edit when Baton cannot be reached (default: deny it, saying so).
    #[arg(long)]
    pub fail_open: bool,
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

/// Runs the hook; always exit 0 (see the module comment).
pub async fn claude_code(global: &Global, args: ClaudeCodeArgs) -> u8 {
    let mut input = Vec::new();
    if let Err(error) = std::io::stdin()
        .take(EVENT_BYTES_MAX)
        .read_to_end(&mut input)
    {
        note!("baton hook: cannot read the hook event on stdin: {error}");
        return EXIT_OK;
    }
    let event: HookEvent = match serde_json::from_slice(&input) {
        Ok(event) => event,
        Err(error) => {
            note!("baton hook: ignoring a malformed hook event: {error}");
            return EXIT_OK;
        }
    };
    let decision = match event.hook_event_name.as_str() {
        "PreToolUse" => pre_tool_use(global, &args, &event).await,
        "SessionEnd" => {
            session_end(global, &event).await;
            Decision::Allow
        }
        _ => Decision::Allow,
    };
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
    let working_directory = event
        .cwd
        .clone()
        .or_else(|| std::env::current_dir().ok())
        .unwrap_or_else(|| PathBuf::from("/"));
    let file = normalize(&working_directory.join(file));
    let root = match &args.root {
        Some(root) => normalize(&working_directory.join(root)),
        None => git_top_level(&file).unwrap_or_else(|| normalize(&working_directory)),
    };
    // By text first; then through symbolic links (`/tmp` may be `/private/tmp`).
    let resource =
        resource_of(&file, &root).or_else(|| resource_of(&resolve(&file), &resolve(&root)));
    let Some(resource) = resource else {
        return Decision::Allow;
    };
    let client = match hook_client(global, &event.session_id) {
        Ok(client) => client,
        // A bad endpoint: as unreachable as a node that is down.
        Err(error) => return unreachable(args, &resource, &error),
    };
    let state = StateFile::new(&event.session_id);
    let _serialized = state.lock();
    claim(&client, args, &state, &resource).await
}

/// Claims `resource` for the Claude session's Baton session, creating that session when
/// there is none (or it is gone), and renewing it.
async fn claim(
    client: &Client,
    args: &ClaudeCodeArgs,
    state: &StateFile,
    resource: &str,
) -> Decision {
    let request = |session_id: Option<SessionId>| AcquireRequest {
        limit: None,
        resource: resource.to_owned(),
        holder: session_id.is_none().then(|| client.holder().to_owned()),
        ttl_ms: session_id
            .is_none()
            .then(|| u64::try_from(args.ttl.as_millis()).unwrap_or(u64::MAX)),
        session_id,
        mode: LeaseMode::Exclusive,
        max_hold_ms: None,
        labels: Labels::new(),
        reason: Some("editing with Claude Code".to_owned()),
        wait_ms: None,
    };
    if let Some(session_id) = state.read() {
        let with_session = request(Some(session_id.clone()));
        let (renewed, acquired) = tokio::join!(
            client.keepalive(&session_id),
            client.acquire_raw(&with_session)
        );
        let gone = matches!(renewed, Err(Error::Lost { .. } | Error::NotFound { .. }));
        match acquired {
            Ok(_) => return Decision::Allow,
            Err(Error::Held { held_by, message }) if !gone => {
                if held_by.holder == client.holder() && holds(client, &session_id, resource).await {
                    return Decision::Allow;
                }
                return Decision::Deny(message);
            }
            Err(Error::Lost { .. } | Error::NotFound { .. } | Error::Held { .. }) => {}
            Err(error) => return failed(args, resource, &error),
        }
    }
    // No session yet, or it is gone: the acquire creates one in the same write.
    match client.acquire_raw(&request(None)).await {
        Ok(answer) => {
            if let Err(error) = state.write(&answer.value.session_id) {
                note!(
                    "baton hook: cannot keep the session id in {}: {error}",
                    state.path.display()
                );
            }
            Decision::Allow
        }
        Err(Error::Held { message, .. }) => Decision::Deny(message),
        Err(error) => failed(args, resource, &error),
    }
}

/// True when `session_id` holds the lease on `resource` (a refused re-acquire of one's own
/// lease looks like any other refusal but for the holder).
async fn holds(client: &Client, session_id: &SessionId, resource: &str) -> bool {
    client
        .get_session(session_id)
        .await
        .is_ok_and(|info| info.leases.iter().any(|lease| lease.resource == resource))
}

/// The decision when the claim could not be made: unreachable is a denial (or an allowance
/// with `--fail-open`); a name Baton refuses cannot be claimed, so the edit goes ahead.
fn failed(args: &ClaudeCodeArgs, resource: &str, error: &Error) -> Decision {
    match error {
        Error::InvalidArgument { message } | Error::PayloadTooLarge { message } => {
            note!("baton hook: {resource} cannot be claimed: {message}");
            Decision::Allow
        }
        // Configuration, not an outage: --fail-open does not cover it.
        Error::Tls { message } => Decision::Deny(format!(
            "{resource} cannot be claimed: Baton's TLS setup is wrong, so edits are denied \
             until it is fixed ({message})"
        )),
        _ => unreachable(args, resource, error),
    }
}

/// Baton cannot be reached: deny saying so, or allow with `--fail-open`.
fn unreachable(args: &ClaudeCodeArgs, resource: &str, error: &Error) -> Decision {
    if args.fail_open {
        note!(
            "baton hook: Baton is unreachable; allowing the edit of {resource} (--fail-open): {}",
            error.message()
        );
        return Decision::Allow;
    }
    Decision::Deny(format!(
        "{resource} cannot be claimed: Baton is unreachable ({}: {})",
        error.code(),
        error.message()
    ))
}

async fn session_end(global: &Global, event: &HookEvent) {
    let state = StateFile::new(&event.session_id);
    let _serialized = state.lock();
    let Some(session_id) = state.read() else {
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

/// The file an edit tool is about to change, from its `tool_input`.
fn edited_file(event: &HookEvent) -> Option<PathBuf> {
    let tool = event.tool_name.as_deref()?;
    let (_, field) = EDIT_TOOLS.iter().find(|(name, _)| *name == tool)?;
    let path = event.tool_input.as_ref()?.get(field)?.as_str()?;
    (!path.is_empty()).then(|| PathBuf::from(path))
}

/// `path` without `.` and `..` components, resolved by text alone (the file may not exist).
fn normalize(path: &Path) -> PathBuf {
    let mut normal = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                normal.pop();
            }
            other => normal.push(other),
        }
    }
    normal
}

/// `path` with its nearest existing ancestor resolved through symbolic links (the file itself
/// may not exist yet).
fn resolve(path: &Path) -> PathBuf {
    path.ancestors()
        .find_map(|ancestor| {
            let real = ancestor.canonicalize().ok()?;
            Some(real.join(path.strip_prefix(ancestor).ok()?))
        })
        .unwrap_or_else(|| path.to_path_buf())
}

/// The nearest directory above `file` with a `.git` entry.
fn git_top_level(file: &Path) -> Option<PathBuf> {
    file.ancestors()
        .skip(1)
        .find(|directory| directory.join(".git").exists())
        .map(Path::to_path_buf)
}

/// `file` relative to `root` with `/` separators, or `None` when it is not under `root`.
fn resource_of(file: &Path, root: &Path) -> Option<String> {
    let relative = file.strip_prefix(root).ok()?;
    let parts: Option<Vec<&str>> = relative
        .components()
        .map(|component| match component {
            Component::Normal(part) => part.to_str(),
            _ => None,
        })
        .collect();
    let parts = parts?;
    (!parts.is_empty()).then(|| parts.join("/"))
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

    /// The session id kept, or `None` when there is none or the file is not one.
    fn read(&self) -> Option<SessionId> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        let id = text.trim();
        let plausible = !id.is_empty()
            && id.len() <= STATE_NAME_BYTES_MAX
            && id
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_');
        plausible.then(|| SessionId::new(id))
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
        let directory = self.path.parent().unwrap_or_else(|| Path::new("."));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(directory)
    }

    /// Replaces the file (0600, in a 0700 directory) with `session_id`.
    fn write(&self, session_id: &SessionId) -> std::io::Result<()> {
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
        file.write_all(session_id.as_str().as_bytes())?;
        file.write_all(b"\n")?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_named_relative_to_the_root_or_not_at_all() {
        let root = Path::new("/repo");
        let cases = [
            ("/repo/src/auth.rs", Some("src/auth.rs")),
            ("/repo/./src/../lib.rs", Some("lib.rs")),
            ("/repo", None),
            ("/elsewhere/x.rs", None),
            ("/repo/../repo2/x.rs", None),
        ];
        for (file, resource) in cases {
            assert_eq!(
                resource_of(&normalize(Path::new(file)), root).as_deref(),
                resource,
                "{file}"
            );
        }
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
