//! `baton task add|claim|complete|fail|release|list|counts QUEUE ...`: one client call each (a
//! few pages for `list`). `claim` prints the task id alone on stdout, so that
//! `id=$(baton task claim q) && work` runs `work` only when a task was claimed (an empty queue
//! exits 3); the claim's fence and session go to stderr, or to stdout with `--env` or
//! `--json`. What must never live here: keepalives or anything else that outlives its call.

use std::time::Duration;

use baton_client::api::{
    ClaimRequest, CompleteRequest, EnqueueRequest, FailRequest, ListTasksQuery, OnDead, SessionId,
    Task, TaskList, TaskReleaseRequest, TaskState,
};
use baton_client::Client;
use serde_json::Value;

use super::duration::format_duration;
use super::output::{note, print_json, say, Failure, EXIT_NOT_FOUND, EXIT_OK};
use super::{ClaimRef, TaskCommand};

/// Most pages `baton task list` reads (1,000 tasks each) before it stops and says so.
const LIST_PAGES_MAX: usize = 100;

/// Runs one `baton task` subcommand.
pub async fn execute(client: &Client, command: TaskCommand, json: bool) -> Result<u8, Failure> {
    match command {
        TaskCommand::Add {
            queue,
            payload,
            id,
            priority,
            depends_on,
            max_attempts,
            delay,
            on_dead,
            on_dead_payload,
        } => {
            let on_dead = on_dead.zip(on_dead_payload).map(|(queue, payload)| OnDead {
                queue,
                payload: json_or_text(&payload),
                max_attempts: None,
            });
            let request = EnqueueRequest {
                id,
                payload: json_or_text(&payload),
                priority,
                depends_on: depends_on
                    .into_iter()
                    .filter(|id| !id.trim().is_empty())
                    .collect(),
                max_attempts,
                not_before_ms: delay.map(millis),
                on_dead,
            };
            let task = client.enqueue(&queue, request).await?;
            if json {
                print_json(&task);
            } else {
                say!("{}", task.id);
            }
            Ok(EXIT_OK)
        }
        TaskCommand::Claim {
            queue,
            ttl,
            session,
            env,
        } => claim(client, &queue, ttl, session, env, json).await,
        TaskCommand::Complete { claim, result } => {
            let request = CompleteRequest {
                session_id: SessionId::new(claim.session.as_str()),
                fence: claim.fence,
                result: result.as_deref().map(json_or_text),
            };
            let task = client
                .complete_task(&claim.queue, &claim.id, &request)
                .await?;
            settled(&task, "completed", json);
            Ok(EXIT_OK)
        }
        TaskCommand::Fail {
            claim,
            reason,
            no_retry,
        } => {
            let request = FailRequest {
                session_id: SessionId::new(claim.session.as_str()),
                fence: claim.fence,
                reason,
                retry: !no_retry,
            };
            let task = client.fail_task(&claim.queue, &claim.id, &request).await?;
            settled(&task, "failed", json);
            Ok(EXIT_OK)
        }
        TaskCommand::Release { claim, note } => release(client, claim, note, json).await,
        TaskCommand::List { queue, state } => list(client, &queue, state, json).await,
        TaskCommand::Counts { queue } => {
            let info = client.queue_info(&queue).await?;
            if json {
                print_json(&info);
            } else {
                let counts = info.counts;
                say!(
                    "{} ready={} waiting={} claimed={} done={} dead={}",
                    info.queue,
                    counts.ready,
                    counts.waiting,
                    counts.claimed,
                    counts.done,
                    counts.dead
                );
            }
            Ok(EXIT_OK)
        }
        TaskCommand::Work(_) => Err(Failure::new(
            super::output::EXIT_FAILURE,
            "INTERNAL",
            "`task work` is dispatched before one-shot commands",
        )),
    }
}

async fn claim(
    client: &Client,
    queue: &str,
    ttl: Duration,
    session: Option<String>,
    env: bool,
    json: bool,
) -> Result<u8, Failure> {
    let request = match session {
        Some(session) => ClaimRequest {
            session_id: Some(SessionId::new(session)),
            holder: None,
            ttl_ms: None,
            wait_ms: None,
        },
        None => ClaimRequest {
            session_id: None,
            holder: Some(client.holder().to_owned()),
            ttl_ms: Some(millis(ttl)),
            wait_ms: None,
        },
    };
    let Some(claimed) = client.claim_raw(queue, &request).await?.value else {
        return Err(Failure::new(
            EXIT_NOT_FOUND,
            "EMPTY",
            format!("queue {queue} has no task ready to claim"),
        ));
    };
    if json {
        print_json(&claimed);
    } else if env {
        say!("BATON_QUEUE={queue}");
        say!("BATON_TASK={}", claimed.task.id);
        say!("BATON_SESSION={}", claimed.session_id.as_str());
        say!("BATON_FENCE={}", claimed.fence);
        say!("BATON_ATTEMPT={}", claimed.attempt);
    } else {
        say!("{}", claimed.task.id);
        note!(
            "claimed {queue}/{} attempt={} fence={} session={} expires in {}",
            claimed.task.id,
            claimed.attempt,
            claimed.fence,
            claimed.session_id.as_str(),
            format_duration(Duration::from_millis(claimed.expires_in_ms))
        );
    }
    Ok(EXIT_OK)
}

async fn release(
    client: &Client,
    claim: ClaimRef,
    note: Option<String>,
    json: bool,
) -> Result<u8, Failure> {
    let request = TaskReleaseRequest {
        session_id: SessionId::new(claim.session.as_str()),
        fence: claim.fence,
        note,
    };
    let task = client
        .release_task(&claim.queue, &claim.id, &request)
        .await?;
    settled(&task, "released", json);
    Ok(EXIT_OK)
}

async fn list(
    client: &Client,
    queue: &str,
    state: Option<TaskState>,
    json: bool,
) -> Result<u8, Failure> {
    let mut all = TaskList {
        tasks: Vec::new(),
        next_cursor: None,
    };
    let mut cursor = None;
    for _ in 0..LIST_PAGES_MAX {
        let page = client
            .list_tasks(
                queue,
                &ListTasksQuery {
                    state,
                    limit: None,
                    cursor: cursor.take(),
                },
            )
            .await?;
        all.tasks.extend(page.tasks);
        all.next_cursor = page.next_cursor.clone();
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    if json {
        print_json(&all);
        return Ok(EXIT_OK);
    }
    for task in &all.tasks {
        say!("{}", describe_task(task));
    }
    if all.tasks.is_empty() {
        note!("no tasks in {queue}");
    }
    if all.next_cursor.is_some() {
        note!("(stopped after {LIST_PAGES_MAX} pages; filter with --state)");
    }
    Ok(EXIT_OK)
}

/// `ID STATE attempt=A/M priority=P [fence=F holder=H] [waiting_on=N]`.
fn describe_task(task: &Task) -> String {
    let mut line = format!(
        "{} {} attempt={}/{} priority={}",
        task.id,
        state_name(task.state),
        task.attempt,
        task.max_attempts,
        task.priority
    );
    if let Some(fence) = task.fence {
        line.push_str(&format!(" fence={fence}"));
    }
    if let Some(holder) = &task.holder {
        line.push_str(&format!(" holder={holder}"));
    }
    if task.waiting_on > 0 {
        line.push_str(&format!(" waiting_on={}", task.waiting_on));
    }
    line
}

fn settled(task: &Task, verb: &str, json: bool) {
    if json {
        print_json(task);
    } else {
        say!(
            "{verb} {}/{}: now {} (attempt {}/{})",
            task.queue,
            task.id,
            state_name(task.state),
            task.attempt,
            task.max_attempts
        );
    }
}

pub(super) fn state_name(state: TaskState) -> &'static str {
    match state {
        TaskState::Ready => "ready",
        TaskState::Waiting => "waiting",
        TaskState::Claimed => "claimed",
        TaskState::Done => "done",
        TaskState::Dead => "dead",
    }
}

/// JSON when it parses, else the text as a JSON string (as `baton kv put` does).
fn json_or_text(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
