//! The one-shot subcommands: one client call each (a few pages for `list`), then one human
//! line per fact on stdout, or the API's answer object with `--json`. What must never live
//! here: background work; nothing here outlives its call (see `run.rs` for that).

use std::time::Duration;

use baton_client::api::{
    AcquireRequest, AddMemberRequest, FenceRef, KvDeleteRequest, KvPutRequest, Labels, Lease,
    LeaseList, LeaseMode, ListLeasesQuery, SessionId, TxnOpResult, TxnRequest,
};
use baton_client::{Client, Error};
use serde_json::Value;

use super::duration::format_duration;
use super::output::{
    note, print_json, say, Failure, EXIT_CONFLICT, EXIT_OK, EXIT_USAGE, EXIT_WAIT_EXPIRED,
};
use super::{
    AcquireArgs, ClusterCommand, Command, FenceArg, FenceCommand, KvCommand, SessionCommand,
};

/// Most pages `baton list` reads (1,000 leases each) before it stops and says so.
const LIST_PAGES_MAX: usize = 100;

/// Runs one subcommand other than `run`.
pub async fn execute(client: &Client, command: Command, json: bool) -> Result<u8, Failure> {
    match command {
        Command::Acquire(args) => acquire(client, args, json).await,
        Command::Release { resource, session } => {
            let released = client.release(&SessionId::new(session), &resource).await?;
            if json {
                print_json(&released);
            } else {
                say!("released {}", released.released);
            }
            Ok(EXIT_OK)
        }
        Command::Keepalive { session } => {
            let answer = client.keepalive(&SessionId::new(session)).await?;
            if json {
                print_json(&answer.value);
            } else {
                say!(
                    "renewed session, expires in {}",
                    format_duration(Duration::from_millis(answer.value.expires_in_ms))
                );
            }
            Ok(EXIT_OK)
        }
        Command::Name { paths, root, repo } => name(&paths, root, repo, json),
        Command::Get { resource } => {
            let lease = client.get_lease(&resource).await?;
            if json {
                print_json(&lease);
            } else {
                say!("{}", describe_lease(&lease));
            }
            Ok(EXIT_OK)
        }
        Command::List { prefix } => list(client, prefix, json).await,
        Command::Session(command) => session(client, command, json).await,
        Command::Fence(FenceCommand::Check { resource, token }) => {
            let checked = client.fence_check(&resource, token).await?;
            if json {
                print_json(&checked);
            }
            if checked.current {
                if !json {
                    say!("fence {token} is current for {resource}");
                }
                return Ok(EXIT_OK);
            }
            let live = match checked.fence {
                Some(fence) => format!("the live fence is {fence}"),
                None => "no lease is live on it".to_owned(),
            };
            Err(Failure::new(
                EXIT_CONFLICT,
                "STALE_FENCE",
                format!("fence {token} is not current for {resource}: {live}"),
            ))
        }
        Command::Kv(command) => kv(client, command, json).await,
        Command::Txn { file } => txn(client, file, json).await,
        Command::Cluster(command) => cluster(client, command, json).await,
        Command::Token(command) => super::admin::token(client, command, json).await,
        Command::Limits(command) => super::admin::limits(client, command, json).await,
        Command::Snapshot(command) => super::admin::snapshot(client, command, json).await,
        Command::Task(command) => super::tasks::execute(client, command, json).await,
        Command::Events { after, .. } => super::events::print_after(client, after, json).await,
        Command::Run(_) | Command::Mcp(_) | Command::Hook(_) | Command::Supervise(_) => {
            not_one_shot()
        }
    }
}

fn not_one_shot() -> Result<u8, Failure> {
    Err(Failure::new(
        super::output::EXIT_FAILURE,
        "INTERNAL",
        "`run`, `hook` and `__supervise` are dispatched before one-shot commands",
    ))
}

async fn acquire(client: &Client, args: AcquireArgs, json: bool) -> Result<u8, Failure> {
    let (session_id, holder, ttl_ms) = match &args.session {
        Some(session) => (Some(SessionId::new(session.as_str())), None, None),
        None => (
            None,
            Some(client.holder().to_owned()),
            Some(millis(args.ttl)),
        ),
    };
    let request = AcquireRequest {
        resource: args.resource.clone(),
        session_id,
        holder,
        ttl_ms,
        mode: match (args.subtree, args.shared) {
            (true, _) => LeaseMode::Subtree,
            (false, Some(_)) => LeaseMode::Shared,
            (false, None) => LeaseMode::Exclusive,
        },
        limit: args.shared,
        max_hold_ms: args.max_hold.map(millis),
        labels: Labels::new(),
        reason: args.reason.clone(),
        wait_ms: None,
    };
    let grant = match acquire_waiting(client, &request, args.wait).await {
        Ok(grant) => grant,
        Err(failure) => return Err(failure),
    };
    if json {
        print_json(&grant);
    } else if args.env {
        say!("BATON_RESOURCE={}", grant.resource);
        say!("BATON_SESSION={}", grant.session_id.as_str());
        say!("BATON_FENCE={}", grant.fence);
    } else {
        say!(
            "acquired {} fence={} session={} expires in {}",
            grant.resource,
            grant.fence,
            grant.session_id.as_str(),
            format_duration(Duration::from_millis(grant.expires_in_ms))
        );
    }
    Ok(EXIT_OK)
}

/// Acquires, retrying while `LEASE_HELD` for up to `wait`; a wait that runs out is exit 5.
pub async fn acquire_waiting(
    client: &Client,
    request: &AcquireRequest,
    wait: Option<Duration>,
) -> Result<baton_client::api::Grant, Failure> {
    match client.acquire_raw_waiting(request, wait).await {
        Ok(answer) => Ok(answer.value),
        Err(error @ Error::Held { .. }) if wait.is_some() => {
            let mut failure = Failure::from(error);
            failure.exit = EXIT_WAIT_EXPIRED;
            failure.message = format!(
                "{} (gave up after waiting {})",
                failure.message,
                format_duration(wait.unwrap_or_default())
            );
            Err(failure)
        }
        Err(error) => Err(error.into()),
    }
}

async fn list(client: &Client, prefix: Option<String>, json: bool) -> Result<u8, Failure> {
    let mut all = LeaseList {
        leases: Vec::new(),
        next_cursor: None,
    };
    let mut cursor = None;
    for _ in 0..LIST_PAGES_MAX {
        let page = client
            .list_leases(&ListLeasesQuery {
                prefix: prefix.clone(),
                limit: None,
                cursor: cursor.take(),
            })
            .await?;
        all.leases.extend(page.leases);
        match page.next_cursor {
            Some(next) => {
                all.next_cursor = Some(next.clone());
                cursor = Some(next);
            }
            None => {
                all.next_cursor = None;
                break;
            }
        }
    }
    if json {
        print_json(&all);
        return Ok(EXIT_OK);
    }
    for lease in &all.leases {
        say!("{}", describe_lease(lease));
    }
    if all.leases.is_empty() {
        note!(
            "no live leases{}",
            prefix.map(|p| format!(" under {p}")).unwrap_or_default()
        );
    }
    if all.next_cursor.is_some() {
        note!("(stopped after {LIST_PAGES_MAX} pages; narrow the prefix)");
    }
    Ok(EXIT_OK)
}

async fn session(client: &Client, command: SessionCommand, json: bool) -> Result<u8, Failure> {
    match command {
        SessionCommand::Create { ttl, env } => {
            let created = client.create_session_raw(ttl, Labels::new()).await?.value;
            if json {
                print_json(&created);
            } else if env {
                say!("BATON_SESSION={}", created.session_id.as_str());
            } else {
                say!(
                    "created session {} holder={} ttl={}",
                    created.session_id.as_str(),
                    created.holder,
                    format_duration(Duration::from_millis(created.ttl_ms))
                );
            }
        }
        SessionCommand::End(session) => {
            let ended = client.end_session(&SessionId::new(session.id()?)).await?;
            if json {
                print_json(&ended);
            } else {
                say!("ended session");
                for resource in &ended.released {
                    say!("released {resource}");
                }
            }
        }
        SessionCommand::Get(session) => {
            let info = client.get_session(&SessionId::new(session.id()?)).await?;
            if json {
                print_json(&info);
            } else {
                say!(
                    "session holder={} ttl={} expires in {} leases={}",
                    info.holder,
                    format_duration(Duration::from_millis(info.ttl_ms)),
                    format_duration(Duration::from_millis(info.expires_in_ms)),
                    info.leases.len()
                );
                for lease in &info.leases {
                    say!("{}", describe_lease(lease));
                }
            }
        }
    }
    Ok(EXIT_OK)
}

/// `baton txn [FILE]`: the transaction's JSON from FILE or stdin; exit 0 whether the compares
/// held or not (the output says which), the refusal's code when an op was refused.
async fn txn(client: &Client, file: Option<std::path::PathBuf>, json: bool) -> Result<u8, Failure> {
    let text = match file.as_deref() {
        Some(path) if path != std::path::Path::new("-") => {
            std::fs::read_to_string(path).map_err(|error| {
                Failure::new(
                    EXIT_USAGE,
                    "INVALID_ARGUMENT",
                    format!("cannot read {}: {error}", path.display()),
                )
            })?
        }
        _ => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map_err(|error| {
                Failure::new(
                    EXIT_USAGE,
                    "INVALID_ARGUMENT",
                    format!("cannot read stdin: {error}"),
                )
            })?;
            text
        }
    };
    let request: TxnRequest = serde_json::from_str(&text).map_err(|error| {
        Failure::new(
            EXIT_USAGE,
            "INVALID_ARGUMENT",
            format!("the transaction is not valid JSON for POST /v1/txn: {error}"),
        )
    })?;
    let done = client.txn(&request).await?;
    if json {
        print_json(&done);
        return Ok(EXIT_OK);
    }
    say!(
        "{}",
        if done.succeeded {
            "succeeded"
        } else {
            "compare failed: ran the failure ops"
        }
    );
    for result in &done.results {
        match result {
            TxnOpResult::Put { revision } => say!("put revision={revision}"),
            TxnOpResult::Delete { revision } => say!("delete revision={revision}"),
            TxnOpResult::Release { released, fence } => say!("release {released} fence={fence}"),
            TxnOpResult::AddTask { task } => say!("add_task {}/{}", task.queue, task.id),
            TxnOpResult::CompleteTask { task } => say!("complete_task {}/{}", task.queue, task.id),
            TxnOpResult::FailTask { task } => {
                say!(
                    "fail_task {}/{} {}",
                    task.queue,
                    task.id,
                    super::tasks::state_name(task.state)
                )
            }
        }
    }
    Ok(EXIT_OK)
}

async fn kv(client: &Client, command: KvCommand, json: bool) -> Result<u8, Failure> {
    match command {
        KvCommand::Get { key } => {
            let entry = client.kv_get(&key).await?;
            if json {
                print_json(&entry);
            } else {
                let fence = entry
                    .fence
                    .map(|fence| format!(" fence={}:{}", fence.resource, fence.token))
                    .unwrap_or_default();
                say!(
                    "{}={} revision={}{fence}",
                    entry.key,
                    entry.value,
                    entry.revision
                );
            }
        }
        KvCommand::Put {
            key,
            value,
            fence,
            session,
        } => {
            let value: Value =
                serde_json::from_str(&value).unwrap_or_else(|_| Value::String(value.clone()));
            let (fence, session_id) = fenced(fence, session);
            let written = client
                .kv_put_request(
                    &key,
                    &KvPutRequest {
                        value,
                        fence,
                        session_id,
                    },
                )
                .await?;
            if json {
                print_json(&written);
            } else {
                say!("wrote {key} revision={}", written.revision);
            }
        }
        KvCommand::Delete {
            key,
            fence,
            session,
        } => {
            let (fence, session_id) = fenced(fence, session);
            let deleted = client
                .kv_delete_request(&key, &KvDeleteRequest { fence, session_id })
                .await?;
            if json {
                print_json(&deleted);
            } else if let (true, Some(revision)) = (deleted.deleted, deleted.revision) {
                say!("deleted {key} revision={revision}");
            } else {
                say!("{key} had no value");
            }
        }
    }
    Ok(EXIT_OK)
}

async fn cluster(client: &Client, command: ClusterCommand, json: bool) -> Result<u8, Failure> {
    let answer = match command {
        ClusterCommand::Status => {
            let status = client.cluster_status().await?;
            if json {
                print_json(&status);
            } else {
                let leader = status
                    .leader_id
                    .map_or_else(|| "none".to_owned(), |id| id.to_string());
                say!(
                    "node={} leader={leader} term={} commit_index={}",
                    status.node_id,
                    status.term,
                    status.commit_index
                );
                for member in &status.members {
                    say!(
                        "member {} api={} peer={} {}",
                        member.id,
                        member.api_addr,
                        member.peer_addr,
                        if member.voter { "voter" } else { "learner" }
                    );
                }
            }
            return Ok(EXIT_OK);
        }
        ClusterCommand::Add {
            id,
            api_addr,
            peer_addr,
            learner,
        } => {
            let answer = client
                .add_member(&AddMemberRequest {
                    id,
                    api_addr,
                    peer_addr,
                    voter: !learner,
                })
                .await?;
            if !json {
                say!(
                    "added node {id}{}",
                    if learner { " as a learner" } else { "" }
                );
            }
            answer
        }
        ClusterCommand::Remove { id } => {
            let answer = client.remove_member(id).await?;
            if !json {
                say!("removed node {id}");
            }
            answer
        }
    };
    if json {
        print_json(&answer);
    }
    Ok(EXIT_OK)
}

/// `acquired`-style line of a public lease.
fn describe_lease(lease: &Lease) -> String {
    let mode = lease.mode.as_str();
    format!(
        "{} held by {} fence={} mode={mode} expires in {}",
        lease.resource,
        lease.holder,
        lease.fence,
        format_duration(Duration::from_millis(lease.expires_in_ms))
    )
}

fn fenced(
    fence: Option<FenceArg>,
    session: Option<String>,
) -> (Option<FenceRef>, Option<SessionId>) {
    // `BATON_SESSION` may be set for other commands: a session goes along with a fence only.
    match fence {
        Some(fence) => (
            Some(FenceRef {
                resource: fence.resource,
                token: fence.token,
            }),
            session.map(SessionId::new),
        ),
        None => (None, None),
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `baton name PATH...`: one name a line, or `[{path, resource}]` with `--json`.
fn name(
    paths: &[std::path::PathBuf],
    root: Option<std::path::PathBuf>,
    repo: Option<String>,
    json: bool,
) -> Result<u8, Failure> {
    let naming = baton_client::FileNaming { root, repo };
    let here = std::env::current_dir().map_err(|error| {
        Failure::new(
            super::output::EXIT_FAILURE,
            "INTERNAL",
            format!("no current directory: {error}"),
        )
    })?;
    let mut named = Vec::new();
    for path in paths {
        let name = baton_client::name_file(path, &here, &naming)
            .map_err(|error| Failure::new(EXIT_USAGE, "INVALID_ARGUMENT", error.to_string()))?;
        named.push((path, name.resource));
    }
    if json {
        let list: Vec<serde_json::Value> = named
            .iter()
            .map(|(path, resource)| serde_json::json!({"path": path, "resource": resource}))
            .collect();
        print_json(&list);
    } else {
        for (_, resource) in &named {
            say!("{resource}");
        }
    }
    Ok(EXIT_OK)
}
