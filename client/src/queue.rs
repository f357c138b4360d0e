//! Work queues (docs/guarantees.md and docs/api.md): enqueue, claim-next, the [`TaskClaim`] handle that
//! completes, fails or releases a claimed task with its fence, and [`Client::work`], a worker
//! loop that claims, runs a closure while the claim is kept alive, and settles the task.
//!
//! A claim is a lease on the task held by a session: the session's background keepalive keeps
//! it alive, and its validity is the session's (docs/guarantees.md G7). Completing, failing and releasing
//! always carry the claim's fence and session, so a claimer that lost its claim without
//! noticing is refused with `STALE_FENCE` and changes nothing (G4). What must never live here:
//! HTTP details and retries (`client.rs`), keepalive and validity rules (`session.rs`).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use reqwest::Method;
use serde_json::Value;

use crate::api::{
    ClaimRequest, ClaimResponse, CompleteRequest, EnqueueRequest, Event, EventKind, FailRequest,
    ListTasksQuery, QueueInfo, SessionId, Task, TaskList, TaskReleaseRequest,
};
use crate::client::{encode, encode_name, millis, Answer, Client, TTL_DEFAULT};
use crate::error::{Error, Result};
use crate::events::EventStream;
use crate::session::{LostReason, Session, Shared};

/// The note a dropped, unsettled [`TaskClaim`] leaves on its task when it releases it.
const DROPPED_NOTE: &str = "the claimer dropped its claim without settling it";

/// A claimed task: the task, the claim's fence and attempt, and the session holding the claim,
/// kept alive in the background. Settle it with [`TaskClaim::complete`], [`TaskClaim::fail`]
/// or [`TaskClaim::release`]; a claim dropped unsettled is released (best effort, in the
/// background), so the task is ready again without counting an attempt.
///
/// ```no_run
/// # async fn example() -> Result<(), baton_client::Error> {
/// use std::time::Duration;
/// use baton_client::Client;
/// use serde_json::json;
///
/// let client = Client::builder(["http://127.0.0.1:7420"]).holder("worker-1").build()?;
/// if let Some(claim) = client.claim("builds", Duration::from_secs(30)).await? {
///     println!("building {} (attempt {})", claim.task().payload, claim.attempt());
///     claim.complete(Some(json!({"artifact": "app.tar"}))).await?;
/// }
/// # Ok(())
/// # }
/// ```
pub struct TaskClaim {
    session: Arc<Shared>,
    queue: String,
    claim: ClaimResponse,
    /// Set once complete, fail or release was sent, so that drop does nothing more.
    settled: bool,
}

impl fmt::Debug for TaskClaim {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("TaskClaim")
            .field("queue", &self.queue)
            .field("task", &self.claim.task.id)
            .field("fence", &self.claim.fence)
            .field("attempt", &self.claim.attempt)
            .field("lost", &self.session.lost_reason())
            .finish()
    }
}

/// How [`Client::work`] claims, and how many tasks it takes.
///
/// ```
/// use std::time::Duration;
/// use baton_client::WorkOptions;
///
/// let options = WorkOptions::new().ttl(Duration::from_secs(10)).tasks_max(100);
/// assert_eq!(options.tasks_max_value(), Some(100));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct WorkOptions<'a> {
    session: Option<&'a Session>,
    ttl: Duration,
    tasks_max: Option<u64>,
}

impl Default for WorkOptions<'_> {
    fn default() -> Self {
        WorkOptions::new()
    }
}

impl<'a> WorkOptions<'a> {
    /// Claim with a session of its own (created by the first claim, with this client's
    /// holder and a 30 s TTL, and ended when the loop returns); no limit on tasks.
    pub fn new() -> WorkOptions<'a> {
        WorkOptions {
            session: None,
            ttl: TTL_DEFAULT,
            tasks_max: None,
        }
    }

    /// Claim with this session instead (it is not ended when the loop returns).
    pub fn session(mut self, session: &'a Session) -> WorkOptions<'a> {
        self.session = Some(session);
        self
    }

    /// The TTL of the loop's own session (ignored with [`WorkOptions::session`]).
    pub fn ttl(mut self, ttl: Duration) -> WorkOptions<'a> {
        self.ttl = ttl;
        self
    }

    /// Return after this many tasks were settled (completed or failed).
    pub fn tasks_max(mut self, tasks_max: u64) -> WorkOptions<'a> {
        self.tasks_max = Some(tasks_max);
        self
    }

    /// The limit set by [`WorkOptions::tasks_max`].
    pub fn tasks_max_value(&self) -> Option<u64> {
        self.tasks_max
    }
}

/// What a [`Client::work`] loop did, and why it returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkReport {
    /// Tasks the closure finished and whose `complete` was accepted.
    pub completed: u64,
    /// Tasks the closure failed and whose `fail` (with retry) was accepted.
    pub failed: u64,
    /// Why the loop returned.
    pub stopped: WorkStopped,
}

/// Why a [`Client::work`] loop returned.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkStopped {
    /// A claim found no ready task.
    QueueEmpty,
    /// [`WorkOptions::tasks_max`] tasks were settled.
    TasksMax,
    /// A claim was lost while its task ran (the closure's future was dropped) or was refused
    /// when settled (`STALE_FENCE`): the task returns to the queue for someone else, and the
    /// worker's session is not to be trusted any more.
    ClaimLost {
        /// The task whose claim was lost.
        task_id: String,
        /// Why.
        reason: LostReason,
    },
}

impl Client {
    /// `POST /v1/queues/{queue}/tasks`: adds a task (201).
    ///
    /// ```no_run
    /// # async fn example(client: baton_client::Client) -> Result<(), baton_client::Error> {
    /// use baton_client::api::EnqueueRequest;
    /// use serde_json::json;
    ///
    /// let task = client
    ///     .enqueue(
    ///         "builds",
    ///         EnqueueRequest {
    ///             id: Some("build-42".to_owned()),
    ///             payload: json!({"commit": "a1b2c3"}),
    ///             priority: 5,
    ///             depends_on: vec![],
    ///             max_attempts: Some(3),
    ///             not_before_ms: None,
    ///             on_dead: None,
    ///         },
    ///     )
    ///     .await?;
    /// assert_eq!(task.id, "build-42");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad queue name or id, an id that already exists in the
    /// queue, or an unknown dependency; [`Error::PayloadTooLarge`] for a payload over 256 KiB;
    /// transport errors as for every call (a retry reuses the idempotency key, so the task is
    /// enqueued at most once).
    pub async fn enqueue(&self, queue: &str, request: EnqueueRequest) -> Result<Task> {
        let path = format!("/v1/queues/{}/tasks", encode_name(queue)?);
        Ok(self.mutate(Method::POST, path, Some(&request)).await?.value)
    }

    /// `POST /v1/queues/{queue}/claim` with any body: the claim answer, or `None` when no task
    /// is ready (204, and no session was created). No keepalive: most callers want
    /// [`Client::claim`] or [`Session::claim`].
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] when the named session is gone; [`Error::InvalidArgument`] for a bad
    /// queue name, TTL or body.
    pub async fn claim_raw(
        &self,
        queue: &str,
        request: &ClaimRequest,
    ) -> Result<Answer<Option<ClaimResponse>>> {
        let path = format!("/v1/queues/{}/claim", encode_name(queue)?);
        self.mutate(Method::POST, path, Some(request)).await
    }

    /// [`Client::claim_raw`] with a caller-chosen idempotency key: sent again with the same
    /// key after an unknown outcome, it answers what the first one did, if it was applied.
    ///
    /// # Errors
    ///
    /// As [`Client::claim_raw`], plus [`Error::IdempotencyKeyReused`].
    pub async fn claim_raw_with_key(
        &self,
        queue: &str,
        request: &ClaimRequest,
        idempotency_key: &str,
    ) -> Result<Answer<Option<ClaimResponse>>> {
        let path = format!("/v1/queues/{}/claim", encode_name(queue)?);
        self.mutate_with_key(Method::POST, path, request, idempotency_key)
            .await
    }

    /// Claims the best ready task of `queue` with a new session created in the same write
    /// (this client's holder, `ttl`), kept alive in the background while the [`TaskClaim`]
    /// lives and ended when it is dropped. `None` when no task is ready (no session is made).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad queue name or a TTL out of limits; transport
    /// errors as for every call.
    pub async fn claim(&self, queue: &str, ttl: Duration) -> Result<Option<TaskClaim>> {
        let request = ClaimRequest {
            session_id: None,
            holder: Some(self.holder().to_owned()),
            ttl_ms: Some(millis(ttl)),
            wait_ms: None,
        };
        let Some(answer) = claimed(self.claim_raw(queue, &request).await?) else {
            return Ok(None);
        };
        let shared = Shared::start(
            self.clone(),
            answer.value.session_id.clone(),
            answer
                .value
                .task
                .holder
                .clone()
                .unwrap_or_else(|| self.holder().to_owned()),
            ttl,
            true,
            crate::clock::valid_until(
                answer.sent_at,
                answer.value.expires_in_ms,
                self.clock_rate_error(),
            ),
        );
        Ok(Some(TaskClaim::new(shared, queue, answer)))
    }

    /// `POST /v1/queues/{queue}/tasks/{id}/complete` with any body (for callers holding a
    /// fence and session without a [`TaskClaim`], like `baton task complete`).
    ///
    /// # Errors
    ///
    /// [`Error::StaleFence`] when the claim is not live for that fence and session (an old
    /// fence, a lapsed or ended session, a second complete); [`Error::NotFound`] for an
    /// unknown task.
    pub async fn complete_task(
        &self,
        queue: &str,
        task_id: &str,
        request: &CompleteRequest,
    ) -> Result<Task> {
        let path = task_path(queue, task_id, "complete")?;
        Ok(self.mutate(Method::POST, path, Some(request)).await?.value)
    }

    /// `POST /v1/queues/{queue}/tasks/{id}/fail` with any body: with `retry` the task is ready
    /// again while attempts remain, without it the task is dead.
    ///
    /// # Errors
    ///
    /// As [`Client::complete_task`].
    pub async fn fail_task(
        &self,
        queue: &str,
        task_id: &str,
        request: &FailRequest,
    ) -> Result<Task> {
        let path = task_path(queue, task_id, "fail")?;
        Ok(self.mutate(Method::POST, path, Some(request)).await?.value)
    }

    /// `POST /v1/queues/{queue}/tasks/{id}/release` with any body: the task is ready again, no
    /// attempt counted, the note kept on it.
    ///
    /// # Errors
    ///
    /// As [`Client::complete_task`].
    pub async fn release_task(
        &self,
        queue: &str,
        task_id: &str,
        request: &TaskReleaseRequest,
    ) -> Result<Task> {
        let path = task_path(queue, task_id, "release")?;
        Ok(self.mutate(Method::POST, path, Some(request)).await?.value)
    }

    /// `GET /v1/queues/{queue}`: the queue's task counts by state.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad queue name.
    pub async fn queue_info(&self, queue: &str) -> Result<QueueInfo> {
        let path = format!("/v1/queues/{}", encode_name(queue)?);
        self.read(Method::GET, path, None::<&()>).await
    }

    /// `GET /v1/queues/{queue}/tasks?state=&limit=&cursor=`: one page of tasks.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad queue name, limit or cursor.
    pub async fn list_tasks(&self, queue: &str, query: &ListTasksQuery) -> Result<TaskList> {
        let mut parameters = Vec::new();
        if let Some(state) = query.state {
            let state = serde_json::to_value(state).unwrap_or_default();
            parameters.push(format!("state={}", state.as_str().unwrap_or_default()));
        }
        if let Some(limit) = query.limit {
            parameters.push(format!("limit={limit}"));
        }
        if let Some(cursor) = &query.cursor {
            parameters.push(format!("cursor={}", encode(cursor)));
        }
        let mut path = format!("/v1/queues/{}/tasks", encode_name(queue)?);
        if !parameters.is_empty() {
            path.push('?');
            path.push_str(&parameters.join("&"));
        }
        self.read(Method::GET, path, None::<&()>).await
    }

    /// A worker loop: claims the best ready task of `queue`, runs `handler` on it while the
    /// claim is kept alive by its session, then completes the task with its fence (and the
    /// closure's result) on `Ok`, or fails it with retry on `Err`. It returns when a claim
    /// finds the queue empty, after [`WorkOptions::tasks_max`] tasks, or when a claim is lost:
    /// the moment the claim's session is lost, the closure's future is dropped and the loop
    /// stops ([`WorkStopped::ClaimLost`]); a settle refused with `STALE_FENCE` stops it too.
    ///
    /// ```no_run
    /// # async fn example(client: baton_client::Client) -> Result<(), baton_client::Error> {
    /// use std::time::Duration;
    /// use baton_client::WorkOptions;
    /// use serde_json::json;
    ///
    /// let options = WorkOptions::new().ttl(Duration::from_secs(10));
    /// let report = client
    ///     .work("builds", options, |task| async move {
    ///         match task.payload.get("commit") {
    ///             Some(commit) => Ok(Some(json!({"built": commit}))),
    ///             None => Err("no commit in the payload".to_owned()),
    ///         }
    ///     })
    ///     .await?;
    /// println!("{} done, {} failed, stopped: {:?}", report.completed, report.failed, report.stopped);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// Errors of claiming, completing or failing other than a lost claim (those end the loop
    /// with a report): transport errors, [`Error::InvalidArgument`] for a bad queue name,
    /// [`Error::Lost`] when the given session is gone before a claim.
    pub async fn work<F, Fut>(
        &self,
        queue: &str,
        options: WorkOptions<'_>,
        mut handler: F,
    ) -> Result<WorkReport>
    where
        F: FnMut(Task) -> Fut,
        Fut: Future<Output = std::result::Result<Option<Value>, String>>,
    {
        // The loop's own session: made by its first claim, reused by the next ones.
        let mut own_session: Option<Session> = None;
        let mut report = WorkReport {
            completed: 0,
            failed: 0,
            stopped: WorkStopped::QueueEmpty,
        };
        let outcome = loop {
            if options
                .tasks_max
                .is_some_and(|max| report.completed + report.failed >= max)
            {
                break Ok(WorkStopped::TasksMax);
            }
            let claimed = match options.session.or(own_session.as_ref()) {
                Some(session) => session.claim(queue).await,
                None => {
                    let claimed = self.claim(queue, options.ttl).await;
                    if let Ok(Some(claim)) = &claimed {
                        own_session = Some(Session {
                            shared: Arc::clone(&claim.session),
                        });
                    }
                    claimed
                }
            };
            let claim = match claimed {
                Ok(Some(claim)) => claim,
                Ok(None) => break Ok(WorkStopped::QueueEmpty),
                Err(error) => break Err(error),
            };
            let task_id = claim.task().id.clone();
            let outcome = tokio::select! {
                outcome = handler(claim.task().clone()) => outcome,
                reason = claim.lost() => break Ok(WorkStopped::ClaimLost { task_id, reason }),
            };
            let settled = match outcome {
                Ok(result) => claim.complete(result).await.map(|_| report.completed += 1),
                Err(reason) => claim.fail(reason, true).await.map(|_| report.failed += 1),
            };
            match settled {
                Ok(()) => {}
                Err(Error::StaleFence { message, .. } | Error::Lost { message }) => {
                    let reason = LostReason::Gone { message };
                    break Ok(WorkStopped::ClaimLost { task_id, reason });
                }
                Err(error) => break Err(error),
            }
        };
        if let Some(session) = own_session {
            if let Err(error) = session.end().await {
                tracing::debug!(%error, "ending the worker's session failed");
            }
        }
        report.stopped = outcome?;
        Ok(report)
    }
}

impl Session {
    /// Claims the best ready task of `queue` for this session. `None` when no task is ready.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] when the session is gone (or known lost locally, without sending
    /// anything); [`Error::InvalidArgument`] for a bad queue name.
    pub async fn claim(&self, queue: &str) -> Result<Option<TaskClaim>> {
        if let Some(reason) = self.shared.lost_reason() {
            return Err(Error::Lost {
                message: format!("session is lost: {reason}"),
            });
        }
        let request = ClaimRequest {
            session_id: Some(self.shared.id.clone()),
            holder: None,
            ttl_ms: None,
            wait_ms: None,
        };
        let answer = match self.shared.client.claim_raw(queue, &request).await {
            Err(Error::Lost { message }) => {
                self.shared.mark_lost(LostReason::Gone {
                    message: message.clone(),
                });
                return Err(Error::Lost { message });
            }
            other => other?,
        };
        Ok(claimed(answer).map(|answer| TaskClaim::new(Arc::clone(&self.shared), queue, answer)))
    }
}

impl TaskClaim {
    fn new(session: Arc<Shared>, queue: &str, answer: Answer<ClaimResponse>) -> TaskClaim {
        session.record_renewal(answer.sent_at, answer.value.expires_in_ms);
        TaskClaim {
            session,
            queue: queue.to_owned(),
            claim: answer.value,
            settled: false,
        }
    }

    /// The claimed task, as the claim answered it.
    pub fn task(&self) -> &Task {
        &self.claim.task
    }

    /// The queue's name.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The claim's fence token.
    pub fn fence(&self) -> u64 {
        self.claim.fence
    }

    /// This attempt's number, from 1.
    pub fn attempt(&self) -> u32 {
        self.claim.attempt
    }

    /// The session holding the claim: a secret. Never log it.
    pub fn session_id(&self) -> &SessionId {
        &self.session.id
    }

    /// The server's claim answer.
    pub fn claim(&self) -> &ClaimResponse {
        &self.claim
    }

    /// True while the claimer may act on the claim (docs/guarantees.md G7, through its session). Once
    /// false, it stays false.
    pub fn is_valid(&self) -> bool {
        self.session.lost_reason().is_none()
    }

    /// Why the claim is no longer valid, or `None` while it is.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.session.lost_reason()
    }

    /// Resolves the moment the claim stops being valid. Cancel-safe.
    pub async fn lost(&self) -> LostReason {
        self.session.lost(None).await
    }

    /// [`TaskClaim::lost`], or the moment `events` shows that the claim ended on the server:
    /// its session ended or lapsed (`task_expired`), or the task was completed, failed or
    /// released with this claim's fence by someone else. That is within moments of the
    /// server, where [`TaskClaim::lost`] alone hears of an ended session at the next renewal
    /// (a third of the TTL). A session that ended is then lost for good.
    ///
    /// `events` must follow this client's namespace from a revision before the claim; the
    /// events of other tasks and claims are skipped. If the stream ends (after the client's
    /// retry budget without a node), only [`TaskClaim::lost`] is awaited. Cancel-safe.
    pub async fn lost_or_ended(&self, events: &mut EventStream) -> LostReason {
        let mut following = true;
        loop {
            tokio::select! {
                reason = self.lost() => return reason,
                event = events.next(), if following => match event {
                    Some(Ok(event)) => {
                        if let Some(reason) = self.ended_by(&event) {
                            return reason;
                        }
                    }
                    Some(Err(error)) => {
                        tracing::debug!(%error, "the event stream ended; the claim is watched by its renewals only");
                        following = false;
                    }
                    None => following = false,
                }
            }
        }
    }

    /// Whether `event` ends this claim, and why; an ended session is marked lost.
    fn ended_by(&self, event: &Event) -> Option<LostReason> {
        let (change, what) = match &event.kind {
            EventKind::TaskExpired(change) => (change, None),
            EventKind::TaskCompleted(change) => (change, Some("completed")),
            EventKind::TaskFailed(change) => (change, Some("failed")),
            EventKind::TaskReleased(change) => (change, Some("released")),
            _ => return None,
        };
        let ours = change.queue == self.queue
            && change.task_id == self.claim.task.id
            && change.fence == Some(self.claim.fence);
        if !ours {
            return None;
        }
        let task = format!("{}/{}", self.queue, self.claim.task.id);
        let reason = match what {
            None => {
                let reason = LostReason::Gone {
                    message: format!(
                        "the claim on task {task} lapsed with its session (event {})",
                        event.revision
                    ),
                };
                self.session.mark_lost(reason.clone());
                reason
            }
            Some(what) => LostReason::Gone {
                message: format!(
                    "task {task} was {what} with this claim's fence elsewhere (event {})",
                    event.revision
                ),
            },
        };
        Some(reason)
    }

    /// Completes the task with the claim's fence and session, keeping `result` on it. Sent
    /// even when the claim is known lost locally: the fence makes a late complete harmless,
    /// and the server is the one to say whether the claim is still live.
    ///
    /// # Errors
    ///
    /// [`Error::StaleFence`] when the claim is no longer live (its session lapsed or was
    /// ended, or the task was settled already): the task was not completed by this call.
    pub async fn complete(mut self, result: Option<Value>) -> Result<Task> {
        self.settled = true;
        let request = CompleteRequest {
            session_id: self.session.id.clone(),
            fence: self.claim.fence,
            result,
        };
        let client = &self.session.client;
        client
            .complete_task(&self.queue, &self.claim.task.id, &request)
            .await
    }

    /// Fails this attempt with the claim's fence and session: with `retry` the task is ready
    /// again while attempts remain; without, it is dead.
    ///
    /// # Errors
    ///
    /// As [`TaskClaim::complete`].
    pub async fn fail(mut self, reason: impl Into<String>, retry: bool) -> Result<Task> {
        self.settled = true;
        let request = FailRequest {
            session_id: self.session.id.clone(),
            fence: self.claim.fence,
            reason: reason.into(),
            retry,
        };
        let client = &self.session.client;
        client
            .fail_task(&self.queue, &self.claim.task.id, &request)
            .await
    }

    /// Gives the task back without counting an attempt, leaving `note` on it for the next
    /// claimer.
    ///
    /// # Errors
    ///
    /// As [`TaskClaim::complete`].
    pub async fn release(mut self, note: Option<String>) -> Result<Task> {
        self.settled = true;
        let client = self.session.client.clone();
        release_claim(&client, &self.session.id, &self.queue, &self.claim, note).await
    }
}

impl Drop for TaskClaim {
    /// Best effort: releases an unsettled, still valid claim in the background when a Tokio
    /// runtime is running. The spawned release holds the session until it is answered, so a
    /// claim's own session is ended only after it.
    fn drop(&mut self) {
        if self.settled || self.session.lost_reason().is_some() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let session = Arc::clone(&self.session);
        let queue = self.queue.clone();
        let claim = self.claim.clone();
        runtime.spawn(async move {
            let client = session.client.clone();
            let note = Some(DROPPED_NOTE.to_owned());
            if let Err(error) = release_claim(&client, &session.id, &queue, &claim, note).await {
                tracing::debug!(%error, "best-effort release of a dropped claim failed");
            }
            drop(session);
        });
    }
}

async fn release_claim(
    client: &Client,
    session_id: &SessionId,
    queue: &str,
    claim: &ClaimResponse,
    note: Option<String>,
) -> Result<Task> {
    let request = TaskReleaseRequest {
        session_id: session_id.clone(),
        fence: claim.fence,
        note,
    };
    client.release_task(queue, &claim.task.id, &request).await
}

/// The claim answer, or `None` for an empty queue (204).
fn claimed(answer: Answer<Option<ClaimResponse>>) -> Option<Answer<ClaimResponse>> {
    let Answer {
        value,
        sent_at,
        replayed,
        leader,
        cluster_time_ms,
    } = answer;
    value.map(|value| Answer {
        value,
        sent_at,
        replayed,
        leader,
        cluster_time_ms,
    })
}

fn task_path(queue: &str, task_id: &str, action: &str) -> Result<String> {
    Ok(format!(
        "/v1/queues/{}/tasks/{}/{action}",
        encode_name(queue)?,
        encode_name(task_id)?
    ))
}
