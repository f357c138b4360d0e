//! The `baton` command line of docs/cli.md: flags, subcommands, and the dispatch from one to
//! a client call. Global flags (`--endpoints`, `--holder`, `--namespace`, `--json`,
//! `--timeout`) are accepted before or after the subcommand and read `BATON_*` variables.
//! What must never live here: HTTP; every request goes through `baton_client::Client`.

mod admin;
mod commands;
pub mod duration;
mod events;
mod hook;
pub mod output;
mod run;
pub mod supervise;
mod tasks;
mod work;

use std::time::Duration;

use baton_client::api::TaskState;
use baton_client::{Client, Error};
use clap::{Args, Parser, Subcommand};

use duration::{format_duration, parse_duration};
use output::{Failure, EXIT_FAILURE};

/// Longest single attempt of a request, whatever `--timeout` says.
const REQUEST_TIMEOUT_MAX: Duration = Duration::from_secs(5);

/// Leases with fence tokens for agents: claim a file, a migration or a task; see who holds
/// it; run a command while holding it.
#[derive(Debug, Parser)]
#[command(name = "baton", version, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every subcommand takes, before or after its name. `--endpoints`, `--holder`,
/// `--namespace`, `--token` and `--ca-file` fall back to their `BATON_*` variable here, not through clap's `env`, so
/// that a usage error never shows a flag the caller did not type as if it were required.
#[derive(Debug, Args)]
pub struct Global {
    /// Baton nodes to talk to, comma-separated [env: BATON_ENDPOINTS] [default:
    /// http://127.0.0.1:7420].
    #[arg(long, global = true, value_delimiter = ',')]
    pub endpoints: Vec<String>,
    /// Holder name of sessions created here (`BATON_HOLDER`; by default `user@host`).
    #[arg(
        long,
        global = true,
        help = "Holder name of sessions created here [env: BATON_HOLDER] [default: user@host]"
    )]
    pub holder: Option<String>,
    /// Namespace [env: BATON_NAMESPACE] [default: default].
    #[arg(long, global = true)]
    pub namespace: Option<String>,
    /// Bearer token of a cluster with access control [env: BATON_TOKEN]. (Its own id: a
    /// global flag named `token` would clash with `fence check`'s TOKEN argument.)
    #[arg(long = "token", value_name = "SECRET", global = true)]
    pub auth_token: Option<String>,
    /// CA certificates (PEM) to trust for https:// endpoints [env: BATON_CA_FILE].
    #[arg(long, global = true)]
    pub ca_file: Option<std::path::PathBuf>,
    /// Print the API's answer object as JSON on stdout.
    #[arg(long, global = true)]
    pub json: bool,
    /// Time limit of the whole command (a `--wait` adds to it; `run` only limits acquiring).
    #[arg(long, global = true, default_value = "30s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// The endpoint used when neither `--endpoints` nor `BATON_ENDPOINTS` names one.
pub const ENDPOINTS_DEFAULT: &str = "http://127.0.0.1:7420";

impl Global {
    /// `--endpoints`, else `BATON_ENDPOINTS`, else [`ENDPOINTS_DEFAULT`].
    pub fn endpoints(&self) -> Vec<String> {
        let given: Vec<String> = if self.endpoints.is_empty() {
            std::env::var("BATON_ENDPOINTS")
                .unwrap_or_default()
                .split(',')
                .map(str::to_owned)
                .collect()
        } else {
            self.endpoints.clone()
        };
        let given: Vec<String> = given
            .into_iter()
            .filter(|endpoint| !endpoint.trim().is_empty())
            .collect();
        if given.is_empty() {
            vec![ENDPOINTS_DEFAULT.to_owned()]
        } else {
            given
        }
    }

    /// `--holder`, else a non-empty `BATON_HOLDER`.
    pub fn holder(&self) -> Option<String> {
        self.holder.clone().or_else(|| variable("BATON_HOLDER"))
    }

    /// `builder` with the namespace, token and CA file these flags give, if any: every client
    /// a command builds goes through here.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when the CA file cannot be read.
    pub fn configure(
        &self,
        mut builder: baton_client::ClientBuilder,
    ) -> Result<baton_client::ClientBuilder, Error> {
        if let Some(namespace) = self.namespace() {
            builder = builder.namespace(namespace);
        }
        if let Some(token) = self.token() {
            builder = builder.token(token);
        }
        let ca_file = self
            .ca_file
            .clone()
            .or_else(|| variable("BATON_CA_FILE").map(std::path::PathBuf::from));
        if let Some(path) = ca_file {
            let pem = std::fs::read(&path).map_err(|error| Error::InvalidArgument {
                message: format!("cannot read the CA file {}: {error}", path.display()),
            })?;
            builder = builder.ca_certificates(pem);
        }
        Ok(builder)
    }

    /// `--token`, else a non-empty `BATON_TOKEN`.
    pub fn token(&self) -> Option<String> {
        self.auth_token.clone().or_else(|| variable("BATON_TOKEN"))
    }

    /// `--namespace`, else a non-empty `BATON_NAMESPACE`.
    pub fn namespace(&self) -> Option<String> {
        self.namespace
            .clone()
            .or_else(|| variable("BATON_NAMESPACE"))
    }
}

fn variable(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Acquire a lease; prints its fence and session id.
    Acquire(AcquireArgs),
    /// Release a lease held by a session.
    Release {
        /// The leased resource.
        resource: String,
        /// The session holding it.
        #[arg(long, env = "BATON_SESSION", hide_env_values = true)]
        session: String,
    },
    /// Renew a session and every lease it holds.
    Keepalive {
        /// The session to renew.
        #[arg(long, env = "BATON_SESSION", hide_env_values = true)]
        session: String,
    },
    /// Show the live lease on a resource.
    Get {
        /// The resource.
        resource: String,
    },
    /// List live leases, optionally under a prefix.
    List {
        /// Only resources starting with this prefix.
        prefix: Option<String>,
    },
    /// Create, end or show sessions.
    #[command(subcommand)]
    Session(SessionCommand),
    /// Check fence tokens.
    #[command(subcommand)]
    Fence(FenceCommand),
    /// The fenced key-value store.
    #[command(subcommand)]
    Kv(KvCommand),
    /// Apply a transaction: compares, then ops, all or none. Reads the `POST /v1/txn` body
    /// (`{session_id?, compare, success, failure?}`) as JSON from FILE, or from stdin when FILE
    /// is absent or `-`. Prints `succeeded` or `compare failed` and one line per op run.
    Txn {
        /// A JSON file with the transaction.
        file: Option<std::path::PathBuf>,
    },
    /// Cluster membership and status.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Access tokens (admin): create, list, revoke.
    #[command(subcommand)]
    Token(TokenCommand),
    /// The limits every node decides with: get, or set some (admin).
    #[command(subcommand)]
    Limits(LimitsCommand),
    /// Backups (admin): save the whole replicated state to a file, or check one.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Hold a lease while a command runs: `baton run RESOURCE -- CMD ARGS...`.
    Run(RunArgs),
    /// Work queues: add, claim, complete, fail, release and list tasks.
    #[command(subcommand)]
    Task(TaskCommand),
    /// Serve the Model Context Protocol on stdio: claims, the fenced store and work queues as
    /// tools for one agent, with one Baton session per process.
    Mcp(crate::mcp::McpArgs),
    /// Print the resource name of each file: its repository's identity and its path in it,
    /// links resolved (the rule of the Claude Code hook and `baton mcp`).
    Name {
        /// The files (or directories), absolute or relative to the current directory.
        #[arg(required = true)]
        paths: Vec<std::path::PathBuf>,
        /// Treat this directory as a repository root (default: each file's git top level).
        #[arg(long)]
        root: Option<std::path::PathBuf>,
        /// The identity of the current directory's repository (or of --root), instead of its
        /// `origin` remote.
        #[arg(long)]
        repo: Option<String>,
    },
    /// Print the changes after a revision, one line each: `REVISION TYPE details`.
    Events {
        /// Only changes after this revision (default: from the oldest kept one).
        #[arg(long)]
        after: Option<u64>,
        /// Keep printing changes as they commit, until interrupted.
        #[arg(long)]
        follow: bool,
    },
    /// Tool hooks of agent runtimes: `baton hook claude-code` claims each file an agent is
    /// about to edit.
    #[command(subcommand)]
    Hook(HookCommand),
    /// Internal: runs CMD for `baton run` and `baton task work` so that it never outlives
    /// them (see `supervise.rs`).
    #[command(name = supervise::SUPERVISE_COMMAND, hide = true)]
    Supervise(supervise::SuperviseArgs),
}

#[derive(Debug, Subcommand)]
pub enum HookCommand {
    /// A Claude Code hook (PreToolUse, Stop, SessionEnd): reads one hook event as JSON on
    /// stdin. Before Edit, Write, MultiEdit and NotebookEdit it claims the file for the Claude
    /// session, or denies the edit saying why; Stop and SessionEnd release all.
    ClaudeCode(hook::ClaudeCodeArgs),
}

#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// Add a task; prints its id.
    Add {
        /// The queue.
        queue: String,
        /// The payload: JSON; text that is not JSON is stored as a string.
        payload: String,
        /// The task id (unique in the queue); generated when absent.
        #[arg(long)]
        id: Option<String>,
        /// Higher is claimed first.
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        priority: i32,
        /// Ids of tasks in the queue that must be done first, comma-separated.
        #[arg(long, value_delimiter = ',')]
        depends_on: Vec<String>,
        /// Attempts before the task is dead (server default: 3).
        #[arg(long)]
        max_attempts: Option<u32>,
        /// Claimable only after this delay.
        #[arg(long, value_parser = parse_duration)]
        delay: Option<Duration>,
        /// When the task goes dead, enqueue a compensating task in this queue.
        #[arg(long, requires = "on_dead_payload")]
        on_dead: Option<String>,
        /// The compensating task's payload (JSON; text that is not JSON is stored as a string).
        #[arg(long, requires = "on_dead")]
        on_dead_payload: Option<String>,
    },
    /// Claim the best ready task; prints its id (exit 3 when none is ready). The claim's
    /// session is not kept alive: renew it with `baton keepalive --session S` while working,
    /// or pick a TTL longer than the work.
    Claim {
        /// The queue.
        queue: String,
        /// TTL of the session created with the claim (not with --session).
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        ttl: Duration,
        /// Claim for this existing session instead of creating one.
        #[arg(long, env = "BATON_SESSION", hide_env_values = true)]
        session: Option<String>,
        /// Print BATON_QUEUE=, BATON_TASK=, BATON_SESSION=, BATON_FENCE= and BATON_ATTEMPT=
        /// lines instead of the id alone.
        #[arg(long, conflicts_with = "json")]
        env: bool,
    },
    /// Complete a claimed task.
    Complete {
        #[command(flatten)]
        claim: ClaimRef,
        /// A result kept on the task: JSON; text that is not JSON is stored as a string.
        #[arg(long)]
        result: Option<String>,
    },
    /// Fail this attempt of a claimed task (ready again while attempts remain).
    Fail {
        #[command(flatten)]
        claim: ClaimRef,
        /// Why it failed; kept on the task.
        #[arg(long)]
        reason: String,
        /// Make the task dead now instead of ready again.
        #[arg(long)]
        no_retry: bool,
    },
    /// Give a claimed task back without counting an attempt.
    Release {
        #[command(flatten)]
        claim: ClaimRef,
        /// A note for the next claimer.
        #[arg(long)]
        note: Option<String>,
    },
    /// List a queue's tasks, optionally in one state.
    List {
        /// The queue.
        queue: String,
        /// Only tasks in this state.
        #[arg(long, value_parser = parse_task_state)]
        state: Option<TaskState>,
    },
    /// Show a queue's task counts by state.
    Counts {
        /// The queue.
        queue: String,
    },
    /// Claim tasks one after another and run CMD for each: `baton task work QUEUE -- CMD`.
    /// Exit 0 from CMD completes the task, any other status fails it; exits 0 once the queue
    /// is empty (3 when it was empty at the start), 4 when a claim is lost.
    Work(WorkArgs),
}

#[derive(Debug, Args)]
pub struct WorkArgs {
    /// The queue.
    pub queue: String,
    /// TTL of each claim's session; renewed every third of it while CMD runs.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub ttl: Duration,
    /// Take one task, then exit.
    #[arg(long)]
    pub once: bool,
    /// When the queue is empty, wait for new tasks (on the event stream) instead of exiting.
    #[arg(long, conflicts_with = "once")]
    pub follow: bool,
    /// After SIGTERM on a lost claim, how long CMD has before SIGKILL.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub grace: Duration,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// A claim named on the command line: queue, task id, and the claim's session and fence
/// (`BATON_SESSION` and `BATON_FENCE` by default, as `baton task claim --env` prints them).
#[derive(Debug, Args)]
pub struct ClaimRef {
    /// The queue.
    pub queue: String,
    /// The task id.
    pub id: String,
    /// The session holding the claim.
    #[arg(long, env = "BATON_SESSION", hide_env_values = true)]
    pub session: String,
    /// The claim's fence.
    #[arg(long, env = "BATON_FENCE")]
    pub fence: u64,
}

fn parse_task_state(text: &str) -> Result<TaskState, String> {
    serde_json::from_value(serde_json::Value::String(text.to_owned()))
        .map_err(|_| format!("{text:?} is not one of ready, waiting, claimed, done, dead"))
}

#[derive(Debug, Args)]
pub struct AcquireArgs {
    /// The resource to claim, e.g. repo/src/auth.rs.
    pub resource: String,
    /// TTL of the session created with the lease (not with --session).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub ttl: Duration,
    /// Claim the path and everything under it.
    #[arg(long, conflicts_with = "shared")]
    pub subtree: bool,
    /// A shared lease (a semaphore): up to N sessions hold the path at once, each with its
    /// own fence; every holder gives the same N.
    #[arg(long, value_name = "N")]
    pub shared: Option<u32>,
    /// Acquire for this existing session instead of creating one.
    #[arg(long, env = "BATON_SESSION", hide_env_values = true)]
    pub session: Option<String>,
    /// Cap the lease's life even while keepalives continue.
    #[arg(long, value_parser = parse_duration)]
    pub max_hold: Option<Duration>,
    /// Why you want it (shown to others).
    #[arg(long)]
    pub reason: Option<String>,
    /// While held by someone else, retry for up to this long (exit 5 when it runs out).
    #[arg(long, value_parser = parse_duration)]
    pub wait: Option<Duration>,
    /// Print BATON_RESOURCE=, BATON_SESSION= and BATON_FENCE= lines.
    #[arg(long, conflicts_with = "json")]
    pub env: bool,
}

#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Create a session (no keepalives: renew it with `baton keepalive`).
    Create {
        /// Session TTL.
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        ttl: Duration,
        /// Print a BATON_SESSION= line.
        #[arg(long, conflicts_with = "json")]
        env: bool,
    },
    /// End a session, releasing every lease it holds.
    End(SessionRef),
    /// Show a session and its leases.
    Get(SessionRef),
}

/// A session named by position, by `--session` or by `BATON_SESSION` (in that order).
#[derive(Debug, Args)]
pub struct SessionRef {
    /// The session id.
    pub id: Option<String>,
    /// The session id (when no positional one is given).
    #[arg(long, env = "BATON_SESSION", hide_env_values = true)]
    pub session: Option<String>,
}

impl SessionRef {
    fn id(&self) -> Result<String, Failure> {
        self.id
            .clone()
            .or_else(|| self.session.clone())
            .ok_or_else(|| {
                Failure::new(
                    output::EXIT_USAGE,
                    "USAGE",
                    "name the session: ID, --session ID or BATON_SESSION",
                )
            })
    }
}

#[derive(Debug, Subcommand)]
pub enum FenceCommand {
    /// Exit 0 if TOKEN is the live fence of RESOURCE, else 4.
    Check {
        /// The resource.
        resource: String,
        /// The fence token.
        token: u64,
    },
}

/// `RESOURCE:TOKEN`, as `--fence` takes it.
#[derive(Debug, Clone)]
pub struct FenceArg {
    pub resource: String,
    pub token: u64,
}

fn parse_fence(text: &str) -> Result<FenceArg, String> {
    let (resource, token) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("{text:?} is not RESOURCE:TOKEN"))?;
    let token = token
        .parse()
        .map_err(|_| format!("{text:?}: the token {token:?} is not a positive integer"))?;
    if resource.is_empty() {
        return Err(format!("{text:?} names no resource"));
    }
    Ok(FenceArg {
        resource: resource.to_owned(),
        token,
    })
}

#[derive(Debug, Subcommand)]
pub enum KvCommand {
    /// Read a key: value, revision and the fence that wrote it.
    Get {
        /// The key.
        key: String,
    },
    /// Write a key. VALUE is JSON; text that is not JSON is stored as a string.
    Put {
        /// The key.
        key: String,
        /// The value.
        value: String,
        /// Only if this fence is live for --session: RESOURCE:TOKEN.
        #[arg(long, value_parser = parse_fence, requires = "session")]
        fence: Option<FenceArg>,
        /// The session holding --fence (used only with --fence).
        #[arg(long, env = "BATON_SESSION", hide_env_values = true)]
        session: Option<String>,
    },
    /// Delete a key.
    Delete {
        /// The key.
        key: String,
        /// Only if this fence is live for --session: RESOURCE:TOKEN.
        #[arg(long, value_parser = parse_fence, requires = "session")]
        fence: Option<FenceArg>,
        /// The session holding --fence (used only with --fence).
        #[arg(long, env = "BATON_SESSION", hide_env_values = true)]
        session: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// How the first reachable node sees the cluster.
    Status,
    /// Add a node (as a learner, then a voter unless --learner).
    Add {
        /// The new node's id.
        id: u64,
        /// Its HTTP API address, host:port.
        api_addr: String,
        /// Its Raft peer address, host:port.
        peer_addr: String,
        /// Keep it a non-voting learner.
        #[arg(long)]
        learner: bool,
    },
    /// Remove a node.
    Remove {
        /// The node's id.
        id: u64,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token; prints its secret, which is shown this once.
    Create {
        /// Its name: 1..=128 of `A-Z a-z 0-9 . _ : -`.
        name: String,
        /// reader (reads and events), agent (every lease, kv and queue call), admin (all).
        #[arg(long, value_enum)]
        role: TokenRoleArg,
        /// The namespaces it may use, comma-separated; `*` for all.
        #[arg(long, value_delimiter = ',', required = true)]
        namespaces: Vec<String>,
        /// Most live sessions it may hold (past it: RESOURCE_EXHAUSTED).
        #[arg(long)]
        sessions_max: Option<u64>,
        /// Most live leases it may hold over all its sessions.
        #[arg(long)]
        leases_max: Option<u64>,
    },
    /// List the tokens (never their secrets).
    List,
    /// Revoke a token: every node refuses it from then on.
    Revoke {
        /// The token's name.
        name: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TokenRoleArg {
    Reader,
    Agent,
    Admin,
}

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Save a backup to FILE: every write acknowledged before it, at one applied index. FILE
    /// appears only once the whole backup is synced and checked; restore it with `batond restore`.
    Save {
        /// Where to write it (replaced if it exists); `-` writes it to stdout, once it is
        /// whole and checked.
        file: std::path::PathBuf,
    },
    /// Check a backup file (magic, format, lengths, checksum) and print its header.
    Inspect {
        /// The backup file; `-` reads it from stdin.
        file: std::path::PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum LimitsCommand {
    /// Print every limit, `name=value` per line.
    Get,
    /// Change limits: `baton limits set ttl_ms_max=600000 leases_per_session_max=100`.
    Set {
        /// `NAME=VALUE` pairs; VALUE a non-negative integer.
        #[arg(required = true, value_parser = parse_limit)]
        changes: Vec<(String, u64)>,
    },
}

/// `NAME=VALUE` with an integer value.
fn parse_limit(text: &str) -> Result<(String, u64), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not NAME=VALUE"))?;
    let value = value.parse().map_err(|_| {
        format!("the value of {name} must be a non-negative integer, got {value:?}")
    })?;
    Ok((name.to_owned(), value))
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The resource to hold while CMD runs.
    pub resource: String,
    /// Session TTL; the lease is renewed every third of it.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub ttl: Duration,
    /// Claim the path and everything under it.
    #[arg(long, conflicts_with = "shared")]
    pub subtree: bool,
    /// Hold a place in a shared lease of N holders (a semaphore: at most N such commands run
    /// at once).
    #[arg(long, value_name = "N")]
    pub shared: Option<u32>,
    /// While held by someone else, retry for up to this long (exit 5 when it runs out).
    #[arg(long, value_parser = parse_duration)]
    pub wait: Option<Duration>,
    /// After SIGTERM on a lost lease, how long CMD has before SIGKILL.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub grace: Duration,
    /// Cap the lease's life even while keepalives continue.
    #[arg(long, value_parser = parse_duration)]
    pub max_hold: Option<Duration>,
    /// Why you want it (shown to others).
    #[arg(long)]
    pub reason: Option<String>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// A command line that did not parse: clap's message and exit 2, or, for a hook answering
/// an agent's event, the hook's own decision (a bad flag must deny an edit, saying so, not
/// fail in a way the agent never reads).
pub fn usage_error(error: &clap::Error) -> u8 {
    use clap::error::ErrorKind;
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let hook_event = arguments
        .iter()
        .position(|argument| argument == "hook")
        .is_some_and(|at| {
            arguments[at + 1..].first().map(String::as_str) == Some("claude-code")
                && !arguments[at + 2..]
                    .iter()
                    .any(|argument| argument == "release")
        });
    let shown = matches!(
        error.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
    if hook_event && !shown {
        return hook::bad_flags(error);
    }
    let _ = error.print();
    if error.use_stderr() {
        output::EXIT_USAGE
    } else {
        output::EXIT_OK
    }
}

/// Runs the parsed command line; returns the exit code.
pub async fn main(cli: Cli) -> u8 {
    // A hook builds its own client and always exits 0: it must never block an agent by accident.
    let cli = match cli {
        Cli {
            global,
            command: Command::Hook(HookCommand::ClaudeCode(args)),
        } => return hook::claude_code(&global, args).await,
        cli => cli,
    };
    let json = cli.global.json;
    let client = match client(&cli.global) {
        Ok(client) => client,
        Err(error) => {
            Failure::from(error).report(json);
            return output::EXIT_USAGE;
        }
    };
    let timeout = cli.global.timeout;
    let result = match cli.command {
        Command::Run(args) => run::run(&client, args, timeout).await,
        Command::Mcp(args) => Ok(crate::mcp::serve(&cli.global, args).await),
        Command::Task(TaskCommand::Work(args)) => work::work(&client, args).await,
        Command::Events {
            after,
            follow: true,
        } => events::follow(&client, after, json).await,
        command => {
            let budget = timeout + command_wait(&command).unwrap_or_default();
            match tokio::time::timeout(budget, commands::execute(&client, command, json)).await {
                Ok(result) => result,
                Err(_) => Err(Failure::new(
                    EXIT_FAILURE,
                    "TIMEOUT",
                    format!(
                        "the command did not finish within --timeout {}; its outcome is unknown",
                        format_duration(timeout)
                    ),
                )),
            }
        }
    };
    match result {
        Ok(code) => code,
        Err(failure) => {
            failure.report(json);
            failure.exit
        }
    }
}

fn command_wait(command: &Command) -> Option<Duration> {
    match command {
        Command::Acquire(args) => args.wait,
        _ => None,
    }
}

/// The client of the global flags (and their `BATON_*` variables).
pub(crate) fn client(global: &Global) -> Result<Client, Error> {
    let mut builder = Client::builder(global.endpoints())
        .request_timeout(global.timeout.min(REQUEST_TIMEOUT_MAX))
        .retry_budget(global.timeout);
    if let Some(holder) = global.holder() {
        builder = builder.holder(holder);
    }
    global.configure(builder)?.build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn the_global_token_flag_and_a_fence_token_argument_do_not_clash() {
        let cli = Cli::try_parse_from([
            "baton",
            "--token",
            "secret-0123456789abcdef",
            "fence",
            "check",
            "repo/a",
            "7",
        ])
        .expect("parses");
        assert_eq!(
            cli.global.token().as_deref(),
            Some("secret-0123456789abcdef")
        );
        let Command::Fence(FenceCommand::Check { token, .. }) = cli.command else {
            panic!("not a fence check")
        };
        assert_eq!(token, 7);
    }

    #[test]
    fn global_flags_go_before_or_after_the_subcommand() {
        for args in [
            &["baton", "--json", "--endpoints", "a:1,b:2", "get", "x"][..],
            &["baton", "get", "x", "--endpoints", "a:1,b:2", "--json"][..],
        ] {
            let cli = Cli::try_parse_from(args).expect("parses");
            assert!(cli.global.json);
            assert_eq!(cli.global.endpoints, ["a:1", "b:2"]);
        }
    }

    #[test]
    fn run_takes_the_command_after_a_double_dash() {
        let cli = Cli::try_parse_from(["baton", "run", "r", "--ttl", "5s", "--", "sh", "-c", "x"])
            .expect("parses");
        let Command::Run(args) = cli.command else {
            panic!("not run");
        };
        assert_eq!(args.command, ["sh", "-c", "x"]);
        assert_eq!(args.ttl, Duration::from_secs(5));
        assert!(Cli::try_parse_from(["baton", "run", "r"]).is_err());
    }

    #[test]
    fn usage_errors_exit_2() {
        for args in [
            &["baton", "acquire", "r", "--ttl", "banana"][..],
            &["baton", "acquire"][..],
            &["baton", "frobnicate"][..],
            &[
                "baton",
                "kv",
                "put",
                "k",
                "v",
                "--fence",
                "nocolon",
                "--session",
                "s",
            ][..],
            &["baton", "kv", "put", "k", "v", "--fence", "r:1"][..],
            &[
                "baton", "task", "work", "q", "--once", "--follow", "--", "true",
            ][..],
            &["baton", "task", "work", "q"][..],
        ] {
            let error = Cli::try_parse_from(args).expect_err("a usage error");
            assert_eq!(error.exit_code(), 2, "{args:?}");
        }
    }

    #[test]
    fn fences_parse_as_resource_colon_token() {
        let fence = parse_fence("repo/a:b.rs:42").expect("parses");
        assert_eq!((fence.resource.as_str(), fence.token), ("repo/a:b.rs", 42));
        assert!(parse_fence(":4").is_err());
        assert!(parse_fence("a:x").is_err());
    }
}
