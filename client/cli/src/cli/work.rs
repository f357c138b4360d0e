//! `baton task work QUEUE [--ttl 5m] [--once] [--follow] -- CMD ARGS...` (docs/agents.md):
//! claim the next task, run CMD for it with the task in its environment while the claim is
//! kept alive, and settle the task by CMD's status: 0 completes it, anything else fails it
//! with the reason `exit status N` (ready again while attempts remain). Repeat until the queue
//! is empty (exit 0; exit 3 when it was empty at the start); `--follow` waits on the event
//! stream for the next task instead, `--once` takes one.
//!
//! Each task is claimed with a session of its own (`--ttl`), ended once the task is settled.
//! A lost claim stops CMD as `baton run` does (SIGTERM, SIGKILL after `--grace`) and exits 4;
//! the task returns to the queue for someone else. The worker follows the event stream from
//! its start, so a claim that ends on the server (its session ended, the task settled with its
//! fence elsewhere) stops CMD within moments, not at the next renewal. A signal sent to `baton task work` is
//! passed on to CMD; once CMD has exited, its task is released without counting an attempt
//! (the worker was interrupted; the task did not fail), or completed if CMD exited 0 anyway,
//! and the worker exits with CMD's status. Between tasks a signal ends the worker at once
//! (128 + its number).
//! CMD runs under the supervisor of `supervise.rs`, so it never outlives the worker. What
//! must never live here: claim validity (the client's `TaskClaim` has it).

use std::time::Duration;

use baton_client::api::{Event, EventKind};
use baton_client::{Client, Error, EventStream, TaskClaim};
use futures_util::{FutureExt, StreamExt};
use nix::sys::signal::Signal;
use tokio::time::Instant;

use super::output::{note, Failure, EXIT_CONFLICT, EXIT_FAILURE, EXIT_NOT_FOUND, EXIT_OK};
use super::supervise::{Ended, Signals, Supervised};
use super::WorkArgs;

/// With `--follow`, how often the queue is claimed from even without an event: a delay that
/// passes or a claim that lapses without a sweep makes a task ready without an event.
const FOLLOW_RECHECK_INTERVAL: Duration = Duration::from_secs(10);
/// Most pages of events read to find the newest revision before following.
const HEAD_PAGES_MAX: usize = 1_000;
/// The note left on a task released because the worker was interrupted.
const INTERRUPTED_NOTE: &str = "baton task work was interrupted";

/// Runs `baton task work`; returns the exit code, or a failure.
pub async fn work(client: &Client, args: WorkArgs) -> Result<u8, Failure> {
    // Listened for from the start: between tasks too, a signal must end the worker.
    let mut signals = Signals::new().map_err(|error| {
        Failure::new(
            EXIT_FAILURE,
            "INTERNAL",
            format!("cannot catch signals: {error}"),
        )
    })?;
    // Followed from before the first claim: it tells of a claim ended on the server while CMD
    // runs and, with `--follow`, of new tasks.
    let mut waiter = TaskWaiter::start(client, &args.queue).await?;
    let mut settled: u64 = 0;
    loop {
        // Never cancelled: a claim made on the server must reach a `TaskClaim` to be settled.
        let claimed = client.claim(&args.queue, args.ttl).await?;
        if let Some(signal) = signals.next().now_or_never() {
            if let Some(claim) = claimed {
                let label = format!("{}/{}", args.queue, claim.task().id);
                if let Err(error) = claim.release(Some(INTERRUPTED_NOTE.to_owned())).await {
                    note!("baton: releasing task {label} failed: {error}");
                }
            }
            return Ok(interrupted(signal));
        }
        let Some(claim) = claimed else {
            if args.follow {
                tokio::select! {
                    waited = waiter.wait(client) => waited?,
                    signal = signals.next() => return Ok(interrupted(signal)),
                }
                continue;
            }
            if settled == 0 {
                return Err(Failure::new(
                    EXIT_NOT_FOUND,
                    "EMPTY",
                    format!("queue {} has no task ready to claim", args.queue),
                ));
            }
            note!(
                "baton: queue {} has no task ready; {settled} task(s) worked",
                args.queue
            );
            return Ok(EXIT_OK);
        };
        if let Some(code) = work_one(claim, &args, &mut waiter.events).await? {
            return Ok(code);
        }
        settled += 1;
        if args.once {
            return Ok(EXIT_OK);
        }
    }
}

/// The exit code of a worker ended by `signal` while no command ran: 128 + its number.
fn interrupted(signal: Signal) -> u8 {
    note!("baton: interrupted ({signal}) between tasks");
    u8::try_from(128 + signal as i32).unwrap_or(EXIT_FAILURE)
}

/// Runs CMD for one claimed task and settles it. `Some(code)` when the worker must stop with
/// that exit code (it was interrupted: a CMD that exits 0 anyway completes its task, any other
/// status releases it).
async fn work_one(
    claim: TaskClaim,
    args: &WorkArgs,
    events: &mut EventStream,
) -> Result<Option<u8>, Failure> {
    let task = claim.task().clone();
    let label = format!("{}/{}", args.queue, task.id);
    note!(
        "baton: claimed task {label} attempt={} fence={}; running {}",
        claim.attempt(),
        claim.fence(),
        args.command.join(" ")
    );
    let environment = [
        ("BATON_QUEUE", args.queue.clone()),
        ("BATON_TASK_ID", task.id.clone()),
        ("BATON_TASK_PAYLOAD", task.payload.to_string()),
        ("BATON_TASK_ATTEMPT", claim.attempt().to_string()),
        ("BATON_FENCE", claim.fence().to_string()),
        ("BATON_SESSION", claim.session_id().as_str().to_owned()),
    ];
    let mut child = match Supervised::spawn(&args.command, &environment) {
        Ok(child) => child,
        Err(error) => {
            if let Err(error) = claim.release(Some(format!("{error:#}"))).await {
                note!("baton: releasing task {label} failed: {error}");
            }
            return Err(Failure::new(EXIT_FAILURE, "SPAWN", format!("{error:#}")));
        }
    };
    let what = format!("the claim on task {label}");
    let ended = child
        .watch(claim.lost_or_ended(events), args.grace, &what)
        .await
        .map_err(|error| {
            Failure::new(
                EXIT_FAILURE,
                "INTERNAL",
                format!("waiting for the command failed: {error}"),
            )
        })?;
    let lost = |reason: String| {
        Failure::new(
            EXIT_CONFLICT,
            "LEASE_LOST",
            format!("{what} was lost ({reason}); the command was stopped"),
        )
    };
    match ended {
        Ended::Lost(reason) => {
            drop(claim);
            Err(lost(reason.to_string()))
        }
        Ended::Exited {
            code: 0,
            interrupted,
        } => match claim.complete(None).await {
            Ok(_) => {
                note!("baton: completed task {label}");
                // Told to stop while CMD finished its task anyway: stop now, as CMD did.
                Ok(interrupted.map(|_| 0))
            }
            Err(error @ Error::StaleFence { .. }) => Err(lost(format!(
                "completing it was refused: {}",
                error.message()
            ))),
            Err(error) => Err(error.into()),
        },
        Ended::Exited {
            code,
            interrupted: Some(signal),
        } => {
            note!("baton: interrupted ({signal}); releasing task {label}");
            if let Err(error) = claim.release(Some(INTERRUPTED_NOTE.to_owned())).await {
                note!("baton: releasing task {label} failed: {error}");
            }
            Ok(Some(code))
        }
        Ended::Exited {
            code,
            interrupted: None,
        } => {
            let reason = format!("exit status {code}");
            match claim.fail(reason.clone(), true).await {
                Ok(failed) => {
                    note!(
                        "baton: failed task {label} ({reason}); attempt {} of {}, now {}",
                        failed.attempt,
                        failed.max_attempts,
                        serde_json::to_value(failed.state)
                            .ok()
                            .and_then(|state| state.as_str().map(str::to_owned))
                            .unwrap_or_default()
                    );
                    Ok(None)
                }
                Err(error @ Error::StaleFence { .. }) => {
                    Err(lost(format!("failing it was refused: {}", error.message())))
                }
                Err(error) => Err(error.into()),
            }
        }
    }
}

/// The event stream of the worker's namespace: watched for the end of a claim while CMD runs,
/// and for a task of the queue to become ready (`--follow`).
struct TaskWaiter {
    queue: String,
    events: EventStream,
}

impl TaskWaiter {
    /// Follows the events after the newest one now, so that nothing enqueued from here on is
    /// missed while CMD runs or the queue is claimed from.
    async fn start(client: &Client, queue: &str) -> Result<TaskWaiter, Failure> {
        let head = newest_revision(client).await?;
        Ok(TaskWaiter {
            queue: queue.to_owned(),
            events: client.follow_events(Some(head)),
        })
    }

    /// Returns after an event of the queue that may make a task ready, or after
    /// [`FOLLOW_RECHECK_INTERVAL`] without one.
    async fn wait(&mut self, client: &Client) -> Result<(), Failure> {
        let deadline = Instant::now() + FOLLOW_RECHECK_INTERVAL;
        loop {
            match tokio::time::timeout_at(deadline, self.events.next()).await {
                Err(_) => return Ok(()),
                Ok(Some(Ok(event))) => {
                    if may_ready_a_task(&event, &self.queue) {
                        return Ok(());
                    }
                }
                Ok(Some(Err(error))) => {
                    // The stream gave up (a revision out of the kept window, no node for a
                    // while): start again from the newest revision.
                    tracing::debug!(%error, "the event stream ended; following it again");
                    *self = TaskWaiter::start(client, &self.queue).await?;
                    return Ok(());
                }
                Ok(None) => {
                    *self = TaskWaiter::start(client, &self.queue).await?;
                    return Ok(());
                }
            }
        }
    }
}

/// True for the events of `queue` after which claim-next may find a task: one enqueued, given
/// back, failed with a retry, lapsed, or completed (a task depending on it may be ready now).
fn may_ready_a_task(event: &Event, queue: &str) -> bool {
    match &event.kind {
        EventKind::TaskEnqueued(change)
        | EventKind::TaskReleased(change)
        | EventKind::TaskFailed(change)
        | EventKind::TaskExpired(change)
        | EventKind::TaskCompleted(change) => change.queue == queue,
        _ => false,
    }
}

/// The newest committed revision of the client's namespace.
async fn newest_revision(client: &Client) -> Result<u64, Failure> {
    let mut after = None;
    for _ in 0..HEAD_PAGES_MAX {
        let page = client.events(after, None).await?;
        if page.events.is_empty() || after == Some(page.next) {
            return Ok(page.next);
        }
        after = Some(page.next);
    }
    Ok(after.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_client::api::TaskChange;

    #[test]
    fn only_changes_of_the_queue_that_may_ready_a_task_wake_a_follower() {
        let event = |kind| Event {
            revision: 1,
            namespace: "default".to_owned(),
            cluster_time_ms: 1,
            kind,
            by: None,
        };
        let change = |queue: &str| TaskChange {
            queue: queue.to_owned(),
            task_id: "t".to_owned(),
            fence: None,
            attempt: None,
            retry: None,
        };
        assert!(may_ready_a_task(
            &event(EventKind::TaskEnqueued(change("q"))),
            "q"
        ));
        assert!(may_ready_a_task(
            &event(EventKind::TaskCompleted(change("q"))),
            "q"
        ));
        assert!(!may_ready_a_task(
            &event(EventKind::TaskEnqueued(change("other"))),
            "q"
        ));
        assert!(!may_ready_a_task(
            &event(EventKind::TaskClaimed(change("q"))),
            "q"
        ));
        assert!(!may_ready_a_task(
            &event(EventKind::KvDeleted {
                key: "q".to_owned()
            }),
            "q"
        ));
    }
}
