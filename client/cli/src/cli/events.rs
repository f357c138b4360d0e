//! `baton events [--after REV] [--follow]`: the changes after a revision, one line each
//! (`REVISION TYPE details`, or the event's JSON with `--json`). Without `--follow` it prints
//! what is committed now and exits; with it, it keeps printing as changes commit, reconnecting
//! by itself, until interrupted (not limited by `--timeout`). What must never live here: the
//! stream's resume logic (that is the client's `EventStream`).

use baton_client::api::{Event, EventKind, TaskChange};
use baton_client::Client;
use futures_util::StreamExt;

use super::output::{note, print_json, say, Failure, EXIT_OK};

/// Most pages (1,000 events each) one `baton events` prints before it stops and says so.
const PAGES_MAX: usize = 100;

/// Prints the events after `after` that are committed now.
pub async fn print_after(client: &Client, after: Option<u64>, json: bool) -> Result<u8, Failure> {
    let mut after = after;
    for _ in 0..PAGES_MAX {
        let page = client.events(after, None).await?;
        for event in &page.events {
            print_event(event, json);
        }
        if after == Some(page.next) {
            return Ok(EXIT_OK);
        }
        after = Some(page.next);
    }
    note!(
        "(stopped after {PAGES_MAX} pages; continue with --after {})",
        after.unwrap_or_default()
    );
    Ok(EXIT_OK)
}

/// Prints the events after `after` as they commit, until the stream ends with an error.
pub async fn follow(client: &Client, after: Option<u64>, json: bool) -> Result<u8, Failure> {
    let mut events = client.follow_events(after);
    while let Some(event) = events.next().await {
        print_event(&event?, json);
    }
    Ok(EXIT_OK)
}

fn print_event(event: &Event, json: bool) {
    if json {
        print_json(event);
    } else {
        say!("{}", describe_event(event));
    }
}

/// `REVISION TYPE details`, e.g. `12 granted resource=a holder=agent-a fence=3 mode=exclusive`,
/// ending in `by=TOKEN` on a cluster with access control.
pub fn describe_event(event: &Event) -> String {
    let (kind, details) = match &event.kind {
        EventKind::Granted {
            resource,
            holder,
            fence,
            mode,
        } => {
            let mode = mode.as_str();
            (
                "granted",
                format!("resource={resource} holder={holder} fence={fence} mode={mode}"),
            )
        }
        EventKind::Released { resource, fence } => {
            ("released", format!("resource={resource} fence={fence}"))
        }
        EventKind::Expired { resource, fence } => {
            ("expired", format!("resource={resource} fence={fence}"))
        }
        EventKind::KvWritten {
            key,
            revision: _,
            fence,
        } => {
            let fence = fence.map(|fence| format!(" fence={fence}"));
            (
                "kv_written",
                format!("key={key}{}", fence.unwrap_or_default()),
            )
        }
        EventKind::KvDeleted { key } => ("kv_deleted", format!("key={key}")),
        EventKind::TaskEnqueued(change) => ("task_enqueued", task_details(change)),
        EventKind::TaskClaimed(change) => ("task_claimed", task_details(change)),
        EventKind::TaskCompleted(change) => ("task_completed", task_details(change)),
        EventKind::TaskFailed(change) => ("task_failed", task_details(change)),
        EventKind::TaskReleased(change) => ("task_released", task_details(change)),
        EventKind::TaskDead(change) => ("task_dead", task_details(change)),
        EventKind::TaskExpired(change) => ("task_expired", task_details(change)),
        _ => ("unknown", String::new()),
    };
    let by = event
        .by
        .as_ref()
        .map(|token| format!(" by={token}"))
        .unwrap_or_default();
    format!("{} {kind} {details}{by}", event.revision)
        .trim_end()
        .to_owned()
}

fn task_details(change: &TaskChange) -> String {
    let mut details = format!("queue={} task={}", change.queue, change.task_id);
    if let Some(fence) = change.fence {
        details.push_str(&format!(" fence={fence}"));
    }
    if let Some(attempt) = change.attempt {
        details.push_str(&format!(" attempt={attempt}"));
    }
    if let Some(retry) = change.retry {
        details.push_str(&format!(" retry={retry}"));
    }
    details
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_client::api::LeaseMode;

    #[test]
    fn events_print_as_revision_type_details() {
        let event = |revision, kind| Event {
            revision,
            namespace: "default".to_owned(),
            cluster_time_ms: 1,
            kind,
            by: None,
        };
        let change = TaskChange {
            queue: "q".to_owned(),
            task_id: "t1".to_owned(),
            fence: Some(9),
            attempt: Some(2),
            retry: None,
        };
        let cases = [
            (
                event(
                    3,
                    EventKind::Granted {
                        resource: "a/b".to_owned(),
                        holder: "agent-a".to_owned(),
                        fence: 4,
                        mode: LeaseMode::Subtree,
                    },
                ),
                "3 granted resource=a/b holder=agent-a fence=4 mode=subtree",
            ),
            (
                event(
                    5,
                    EventKind::KvWritten {
                        key: "k".to_owned(),
                        revision: 5,
                        fence: None,
                    },
                ),
                "5 kv_written key=k",
            ),
            (
                event(7, EventKind::TaskClaimed(change)),
                "7 task_claimed queue=q task=t1 fence=9 attempt=2",
            ),
            (event(8, EventKind::Unknown), "8 unknown"),
            (
                Event {
                    by: Some("team-a".to_owned()),
                    ..event(
                        9,
                        EventKind::KvDeleted {
                            key: "k".to_owned(),
                        },
                    )
                },
                "9 kv_deleted key=k by=team-a",
            ),
        ];
        for (event, line) in cases {
            assert_eq!(describe_event(&event), line);
        }
    }
}
