//! What one `baton mcp` process holds on behalf of its agent, and the eleven tools as calls to
//! Baton: one [`Session`] (made at the first claim, renewed in the background by the client
//! crate, ended at shutdown), the claims and task claims it holds with their fences, and the
//! record of a lost session, which is announced in every later result until a claim starts
//! a new session, and says so.
//!
//! Every tool answers an [`Outcome`]: one line for the model plus a JSON object. A denial or a
//! refusal is a normal outcome; Baton unreachable is an error outcome (`isError`) that says so,
//! and the server keeps serving. Bad arguments, ours or the server's, are MCP errors naming
//! the argument. What must never live here: MCP transport details (`mod.rs`), and a session id
//! in any text, log or structured result.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use baton_client::api::{
    AcquireRequest, ClaimRequest, CompleteRequest, EnqueueRequest, FailRequest, FenceRef, HeldBy,
    KvPutRequest, LeaseMode, ListLeasesQuery, TaskState,
};
use baton_client::{Client, Error, Session};
use rmcp::ErrorData as McpError;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::tools::{
    invalid_argument, AddTaskArgs, ClaimArgs, CompleteArgs, FailArgs, ListArgs, Mode, QueueArgs,
    ReadArgs, ResourceArgs, WriteArgs, WAIT_SECONDS_MAX,
};
use crate::cli::duration::format_duration;

/// How many leases `list_claims` asks for, and how many it names in its text line.
const LIST_LIMIT: u32 = 200;
const LIST_NAMED_MAX: usize = 20;
/// How much of a JSON value a text line shows.
const VALUE_TEXT_MAX: usize = 300;

/// The answer of one tool call: a line for the model, a JSON object, and whether it is an
/// error (Baton unreachable, outcome unknown).
#[derive(Debug, Clone)]
pub struct Outcome {
    pub text: String,
    pub structured: Value,
    pub is_error: bool,
}

impl Outcome {
    fn ok(text: impl Into<String>, structured: Value) -> Outcome {
        Outcome {
            text: text.into(),
            structured,
            is_error: false,
        }
    }

    fn error(text: impl Into<String>, structured: Value) -> Outcome {
        Outcome {
            text: text.into(),
            structured,
            is_error: true,
        }
    }
}

/// The agent's side of Baton: its client, its session and what it holds.
#[derive(Debug)]
pub struct Agent {
    client: Client,
    ttl: Duration,
    state: Mutex<State>,
    /// Held while a session is being made, so two concurrent claims make one; holds `true`
    /// once the server shuts down, so a call still running then makes no new session.
    session_gate: tokio::sync::Mutex<bool>,
}

#[derive(Debug, Default)]
struct State {
    session: Option<Arc<Session>>,
    /// Resource → the claim this session holds on it.
    claims: BTreeMap<String, Claim>,
    /// (queue, task id) → the task claim this session holds.
    tasks: BTreeMap<(String, String), TaskHold>,
    /// The last session that was lost, until a claim starts a new one.
    lost: Option<Loss>,
}

#[derive(Debug, Clone)]
struct Claim {
    fence: u64,
    mode: LeaseMode,
}

#[derive(Debug, Clone)]
struct TaskHold {
    fence: u64,
    attempt: u32,
}

/// A lost session: why, and what went with it.
#[derive(Debug, Clone)]
struct Loss {
    reason: String,
    claims: Vec<String>,
    tasks: Vec<String>,
}

impl Loss {
    fn sentence(&self) -> String {
        let mut gone: Vec<String> = self.claims.clone();
        gone.extend(self.tasks.iter().map(|task| format!("task {task}")));
        let gone = if gone.is_empty() {
            "it held nothing".to_owned()
        } else {
            format!("your claims on {} are gone", gone.join(", "))
        };
        format!(
            "this agent's Baton session was lost ({}); {gone}: stop acting on them",
            self.reason
        )
    }

    fn to_json(&self) -> Value {
        json!({"reason": self.reason, "claims": self.claims, "tasks": self.tasks})
    }
}

/// Whether a fenced call may go ahead, and with what.
enum Fenced {
    Live(Arc<Session>, u64),
    Refused(Outcome),
}

impl Agent {
    pub fn new(client: Client, ttl: Duration) -> Agent {
        Agent {
            client,
            ttl,
            state: Mutex::new(State::default()),
            session_gate: tokio::sync::Mutex::new(false),
        }
    }

    /// Ends the session, releasing everything it holds at once. Called when stdin closes or on
    /// SIGTERM.
    pub async fn shutdown(&self) -> Result<Vec<String>, Error> {
        let mut closed = self.session_gate.lock().await;
        *closed = true;
        let session = {
            let mut state = self.lock();
            state.claims.clear();
            state.tasks.clear();
            state.session.take()
        };
        let Some(session) = session else {
            return Ok(Vec::new());
        };
        match Arc::try_unwrap(session) {
            Ok(session) => session.end().await,
            Err(session) => Ok(self.client.end_session(session.id()).await?.released),
        }
    }

    /// Appends the announcement of a lost session, if any, to an outcome.
    pub fn announce(&self, mut outcome: Outcome) -> Outcome {
        self.observe();
        let lost = self.lock().lost.clone();
        if let Some(loss) = lost {
            outcome.text = format!("{} [NOTE: {}]", outcome.text, loss.sentence());
            if let Value::Object(object) = &mut outcome.structured {
                object.insert("session_lost".to_owned(), loss.to_json());
            }
        }
        outcome
    }

    // -----------------------------------------------------------------------------------------
    // Claims
    // -----------------------------------------------------------------------------------------

    pub async fn claim(&self, args: ClaimArgs) -> Result<Outcome, McpError> {
        let wait = Duration::from_secs(args.wait_seconds.unwrap_or(0));
        if args
            .wait_seconds
            .is_some_and(|seconds| seconds > WAIT_SECONDS_MAX)
        {
            return Err(invalid_argument(
                "claim",
                &format!("argument `wait_seconds`: at most {WAIT_SECONDS_MAX}"),
            ));
        }
        self.observe();
        if let Some(claim) = self.lock().claims.get(&args.resource).cloned() {
            return Ok(Outcome::ok(
                format!(
                    "you already hold {} (fence {}, {})",
                    args.resource,
                    claim.fence,
                    LeaseMode::as_str(claim.mode)
                ),
                json!({"granted": true, "already_held": true, "resource": args.resource,
                       "fence": claim.fence, "mode": claim.mode}),
            ));
        }
        let mode = match args.mode {
            Some(Mode::Subtree) => LeaseMode::Subtree,
            Some(Mode::Exclusive) | None => LeaseMode::Exclusive,
        };
        let deadline = Instant::now() + wait;
        let mut fresh_after: Option<Loss> = None;
        let mut sessions_tried = 0;
        loop {
            let (session, replaced) = match self.session().await {
                Ok(made) => made,
                Err(error) => return session_failure(error, "the claim"),
            };
            sessions_tried += 1;
            if replaced.is_some() {
                fresh_after = replaced;
            }
            let request = AcquireRequest {
                limit: None,
                resource: args.resource.clone(),
                session_id: Some(session.id().clone()),
                holder: None,
                ttl_ms: None,
                mode,
                max_hold_ms: None,
                labels: Default::default(),
                reason: args.reason.clone(),
                wait_ms: None,
            };
            // A wait is spent in the resource's line: first come first served.
            let left = deadline.saturating_duration_since(Instant::now());
            let waiting = (!left.is_zero()).then_some(left);
            match self.client.acquire_raw_waiting(&request, waiting).await {
                Ok(answer) => {
                    let grant = answer.value;
                    self.lock().claims.insert(
                        grant.resource.clone(),
                        Claim {
                            fence: grant.fence,
                            mode: grant.mode,
                        },
                    );
                    let mut text = format!(
                        "claimed {} (fence {}, {}); it is yours until you release it",
                        grant.resource,
                        grant.fence,
                        LeaseMode::as_str(grant.mode)
                    );
                    let mut structured = json!({"granted": true, "resource": grant.resource,
                        "fence": grant.fence, "mode": grant.mode});
                    if let Some(loss) = fresh_after {
                        text.push_str(&format!(
                            " (a new Baton session was started for it because {})",
                            loss.sentence()
                        ));
                        structured["new_session_after_loss"] = loss.to_json();
                    }
                    return Ok(Outcome::ok(text, structured));
                }
                Err(Error::Held { held_by, .. }) => {
                    if let Some(outcome) = self.held_by_us(&session, &args.resource, &held_by).await
                    {
                        return Ok(outcome);
                    }
                    let waited = if wait.is_zero() {
                        String::new()
                    } else {
                        format!(" (waited {})", format_duration(wait))
                    };
                    let mut structured = json!({"granted": false, "resource": args.resource,
                        "held_by": held_by});
                    let mut text = format!(
                        "{}{waited}: pick other work, wait, or escalate",
                        denial(&args.resource, &held_by)
                    );
                    if let Some(loss) = fresh_after {
                        text.push_str(&format!(" (note: {})", loss.sentence()));
                        structured["new_session_after_loss"] = loss.to_json();
                    }
                    return Ok(Outcome::ok(text, structured));
                }
                Err(Error::Lost { message } | Error::NotFound { message })
                    if sessions_tried < 2 =>
                {
                    self.session_gone(&session, &message);
                }
                Err(error) => return failure(error, "claim", "resource", "the claim"),
            }
        }
    }

    /// A denial by this agent's own session: `resource` is covered by one of its claims, or
    /// an earlier claim whose answer was lost (outcome unknown) was granted after all. The
    /// session's own lease list decides, never the holder name alone (another process may
    /// share it).
    async fn held_by_us(
        &self,
        session: &Arc<Session>,
        resource: &str,
        held_by: &HeldBy,
    ) -> Option<Outcome> {
        if held_by.holder != self.client.holder() {
            return None;
        }
        let known = self
            .lock()
            .claims
            .get(&held_by.resource)
            .is_some_and(|claim| claim.fence == held_by.fence);
        if !known {
            let info = self.client.get_session(session.id()).await.ok()?;
            let lease = info
                .leases
                .iter()
                .find(|lease| lease.resource == held_by.resource && lease.fence == held_by.fence)?;
            self.lock().claims.insert(
                lease.resource.clone(),
                Claim {
                    fence: lease.fence,
                    mode: lease.mode,
                },
            );
        }
        let through = if held_by.resource == resource {
            String::new()
        } else {
            format!(
                " through your {} claim on {}",
                LeaseMode::as_str(held_by.mode),
                held_by.resource
            )
        };
        Some(Outcome::ok(
            format!(
                "you already hold {resource}{through} (fence {})",
                held_by.fence
            ),
            json!({"granted": true, "already_held": true, "resource": held_by.resource,
                   "fence": held_by.fence, "mode": held_by.mode}),
        ))
    }

    pub async fn release(&self, args: ResourceArgs) -> Result<Outcome, McpError> {
        let resource = args.resource;
        let (session, claim) = match self.held(&resource) {
            Fenced::Live(session, _) => {
                let claim = self.lock().claims.get(&resource).cloned();
                (session, claim)
            }
            Fenced::Refused(outcome) => return Ok(outcome),
        };
        match self.client.release(session.id(), &resource).await {
            Ok(_) => {
                self.lock().claims.remove(&resource);
                Ok(Outcome::ok(
                    format!("released {resource}; others may claim it now"),
                    json!({"released": true, "resource": resource,
                           "fence": claim.map(|claim| claim.fence)}),
                ))
            }
            Err(Error::NotFound { message } | Error::Lost { message }) => {
                self.lock().claims.remove(&resource);
                self.verify_session(&session).await;
                Ok(Outcome::ok(
                    format!("{resource} was no longer yours to release: {message}"),
                    json!({"released": false, "resource": resource, "reason": message}),
                ))
            }
            Err(error) => failure(error, "release", "resource", "the release"),
        }
    }

    pub fn my_claims(&self) -> Outcome {
        self.observe();
        let state = self.lock();
        let session = match (&state.session, &state.lost) {
            (Some(_), _) => "live",
            (None, Some(_)) => "lost",
            (None, None) => "none",
        };
        let claims: Vec<Value> = state
            .claims
            .iter()
            .map(|(resource, claim)| {
                json!({"resource": resource, "fence": claim.fence, "mode": claim.mode})
            })
            .collect();
        let tasks: Vec<Value> = state
            .tasks
            .iter()
            .map(|((queue, id), hold)| {
                json!({"queue": queue, "id": id, "fence": hold.fence, "attempt": hold.attempt})
            })
            .collect();
        let mut named: Vec<String> = state
            .claims
            .iter()
            .map(|(resource, claim)| format!("{resource} (fence {})", claim.fence))
            .collect();
        named.extend(
            state
                .tasks
                .iter()
                .map(|((queue, id), hold)| format!("task {queue}/{id} (fence {})", hold.fence)),
        );
        let text = if named.is_empty() {
            format!("{} holds nothing", self.client.holder())
        } else {
            format!("{} holds {}", self.client.holder(), named.join(", "))
        };
        Outcome::ok(
            text,
            json!({"holder": self.client.holder(), "session": session, "claims": claims,
                   "tasks": tasks}),
        )
    }

    pub async fn who_holds(&self, args: ResourceArgs) -> Result<Outcome, McpError> {
        let resource = args.resource;
        match self.client.get_lease(&resource).await {
            Ok(lease) => {
                let yours = self
                    .lock()
                    .claims
                    .get(&lease.resource)
                    .is_some_and(|claim| claim.fence == lease.fence);
                let through = if lease.resource == resource {
                    String::new()
                } else {
                    format!(
                        " through its {} claim on {}",
                        LeaseMode::as_str(lease.mode),
                        lease.resource
                    )
                };
                let who = if yours {
                    format!("you, {},", lease.holder)
                } else {
                    lease.holder.clone()
                };
                Ok(Outcome::ok(
                    format!(
                        "{resource} is held by {who}{through} (fence {}) for {} more",
                        lease.fence,
                        format_duration(Duration::from_millis(lease.expires_in_ms))
                    ),
                    json!({"resource": resource, "held": true, "yours": yours, "lease": lease}),
                ))
            }
            Err(Error::NotFound { .. }) => Ok(Outcome::ok(
                format!("nobody holds {resource}"),
                json!({"resource": resource, "held": false}),
            )),
            Err(error) => failure(error, "who_holds", "resource", "the lookup"),
        }
    }

    pub async fn list_claims(&self, args: ListArgs) -> Result<Outcome, McpError> {
        let query = ListLeasesQuery {
            prefix: args.prefix.clone(),
            limit: Some(LIST_LIMIT),
            cursor: None,
        };
        let list = match self.client.list_leases(&query).await {
            Ok(list) => list,
            Err(error) => return failure(error, "list_claims", "prefix", "the listing"),
        };
        let under = args
            .prefix
            .as_deref()
            .map_or(String::new(), |prefix| format!(" under {prefix}"));
        let mut named: Vec<String> = list
            .leases
            .iter()
            .take(LIST_NAMED_MAX)
            .map(|lease| {
                format!(
                    "{} by {} (fence {})",
                    lease.resource, lease.holder, lease.fence
                )
            })
            .collect();
        if list.leases.len() > LIST_NAMED_MAX || list.next_cursor.is_some() {
            named.push("…".to_owned());
        }
        let more = if list.next_cursor.is_some() { "+" } else { "" };
        let text = if list.leases.is_empty() {
            format!("no live claims{under}")
        } else {
            format!(
                "{}{more} live claims{under}: {}",
                list.leases.len(),
                named.join(", ")
            )
        };
        Ok(Outcome::ok(
            text,
            json!({"claims": list.leases, "truncated": list.next_cursor.is_some()}),
        ))
    }

    // -----------------------------------------------------------------------------------------
    // The fenced store
    // -----------------------------------------------------------------------------------------

    pub async fn write_value(&self, args: WriteArgs) -> Result<Outcome, McpError> {
        let key = args.key;
        let Some(resource) = args.claim else {
            let request = KvPutRequest {
                value: args.value,
                fence: None,
                session_id: None,
            };
            return match self.client.kv_put_request(&key, &request).await {
                Ok(put) => Ok(Outcome::ok(
                    format!("wrote {key} (revision {}), unfenced", put.revision),
                    json!({"written": true, "key": key, "revision": put.revision}),
                )),
                Err(error) => {
                    let argument = value_or("key", &error);
                    failure(error, "write_value", argument, "the write")
                }
            };
        };
        let (session, fence) = match self.held(&resource) {
            Fenced::Live(session, fence) => (session, fence),
            Fenced::Refused(outcome) => {
                return Ok(refused_write(&key, &resource, &outcome.text));
            }
        };
        let request = KvPutRequest {
            value: args.value,
            fence: Some(FenceRef {
                resource: resource.clone(),
                token: fence,
            }),
            session_id: Some(session.id().clone()),
        };
        match self.client.kv_put_request(&key, &request).await {
            Ok(put) => Ok(Outcome::ok(
                format!(
                    "wrote {key} (revision {}), fenced by your claim on {resource} (fence {fence})",
                    put.revision
                ),
                json!({"written": true, "key": key, "revision": put.revision,
                       "fence": {"resource": resource, "token": fence}}),
            )),
            Err(Error::StaleFence { message, .. } | Error::Lost { message }) => {
                self.claim_gone(&session, &resource).await;
                Ok(refused_write(
                    &key,
                    &resource,
                    &format!(
                        "your claim on {resource} (fence {fence}) is no longer live: {message}"
                    ),
                ))
            }
            Err(error) => {
                let argument = value_or("key", &error);
                failure(error, "write_value", argument, "the write")
            }
        }
    }

    pub async fn read_value(&self, args: ReadArgs) -> Result<Outcome, McpError> {
        let key = args.key;
        match self.client.kv_get(&key).await {
            Ok(entry) => {
                let written = entry.fence.as_ref().map_or(String::new(), |fence| {
                    format!(
                        ", written under fence {} of {}",
                        fence.token, fence.resource
                    )
                });
                Ok(Outcome::ok(
                    format!(
                        "{key} = {} (revision {}{written})",
                        short(&entry.value),
                        entry.revision
                    ),
                    json!({"found": true, "key": key, "value": entry.value,
                           "revision": entry.revision, "fence": entry.fence}),
                ))
            }
            Err(Error::NotFound { .. }) => Ok(Outcome::ok(
                format!("{key} has no value"),
                json!({"found": false, "key": key}),
            )),
            Err(error) => failure(error, "read_value", "key", "the read"),
        }
    }

    // -----------------------------------------------------------------------------------------
    // Work queues
    // -----------------------------------------------------------------------------------------

    pub async fn add_task(&self, args: AddTaskArgs) -> Result<Outcome, McpError> {
        let request = EnqueueRequest {
            id: None,
            payload: args.payload,
            priority: args.priority.unwrap_or(0),
            depends_on: args.depends_on.unwrap_or_default(),
            max_attempts: None,
            not_before_ms: None,
            on_dead: None,
        };
        match self.client.enqueue(&args.queue, request).await {
            Ok(task) => {
                let waits = if task.depends_on.is_empty() {
                    String::new()
                } else {
                    format!(", after {}", task.depends_on.join(", "))
                };
                Ok(Outcome::ok(
                    format!(
                        "added task {} to {} (priority {}{waits})",
                        task.id, task.queue, task.priority
                    ),
                    json!({"added": true, "task": task}),
                ))
            }
            Err(error) => {
                let argument = match &error {
                    Error::PayloadTooLarge { .. } => "payload",
                    error if error.message().contains("depend") => "depends_on",
                    _ => "queue",
                };
                failure(error, "add_task", argument, "adding the task")
            }
        }
    }

    pub async fn next_task(&self, args: QueueArgs) -> Result<Outcome, McpError> {
        let queue = args.queue;
        let mut sessions_tried = 0;
        let mut fresh_after: Option<Loss> = None;
        loop {
            let (session, replaced) = match self.session().await {
                Ok(made) => made,
                Err(error) => return session_failure(error, "the claim"),
            };
            sessions_tried += 1;
            if replaced.is_some() {
                fresh_after = replaced;
            }
            let request = ClaimRequest {
                session_id: Some(session.id().clone()),
                holder: None,
                ttl_ms: None,
                wait_ms: None,
            };
            let mut outcome = match self.client.claim_raw(&queue, &request).await {
                Ok(answer) => match answer.value {
                    Some(claimed) => {
                        let task = claimed.task;
                        self.lock().tasks.insert(
                            (queue.clone(), task.id.clone()),
                            TaskHold {
                                fence: claimed.fence,
                                attempt: claimed.attempt,
                            },
                        );
                        Outcome::ok(
                            format!(
                                "claimed task {} of {queue} (attempt {}, fence {}): {}",
                                task.id,
                                claimed.attempt,
                                claimed.fence,
                                short(&task.payload)
                            ),
                            json!({"claimed": true, "queue": queue, "id": task.id,
                                   "fence": claimed.fence, "attempt": claimed.attempt,
                                   "payload": task.payload}),
                        )
                    }
                    None => Outcome::ok(
                        format!("no task of {queue} is ready"),
                        json!({"claimed": false, "queue": queue}),
                    ),
                },
                Err(Error::Lost { message }) if sessions_tried < 2 => {
                    self.session_gone(&session, &message);
                    continue;
                }
                Err(error) => return failure(error, "next_task", "queue", "the claim"),
            };
            if let Some(loss) = fresh_after {
                outcome.text.push_str(&format!(
                    " (a new Baton session was started because {})",
                    loss.sentence()
                ));
                outcome.structured["new_session_after_loss"] = loss.to_json();
            }
            return Ok(outcome);
        }
    }

    pub async fn complete_task(&self, args: CompleteArgs) -> Result<Outcome, McpError> {
        let (queue, id) = (args.queue, args.id);
        let (session, fence) = match self.holds_task(&queue, &id) {
            Fenced::Live(session, fence) => (session, fence),
            Fenced::Refused(outcome) => return Ok(outcome),
        };
        let request = CompleteRequest {
            session_id: session.id().clone(),
            fence,
            result: args.result,
        };
        match self.client.complete_task(&queue, &id, &request).await {
            Ok(task) => {
                self.lock().tasks.remove(&(queue.clone(), id.clone()));
                Ok(Outcome::ok(
                    format!("completed task {id} of {queue}"),
                    json!({"completed": true, "queue": queue, "id": id, "task": task}),
                ))
            }
            Err(
                Error::StaleFence { message, .. }
                | Error::Lost { message }
                | Error::NotFound { message },
            ) => {
                self.task_gone(&session, &queue, &id).await;
                Ok(refused_task("complete", &queue, &id, &message))
            }
            Err(error) => failure(error, "complete_task", "id", "completing the task"),
        }
    }

    pub async fn fail_task(&self, args: FailArgs) -> Result<Outcome, McpError> {
        let (queue, id) = (args.queue, args.id);
        let (session, fence) = match self.holds_task(&queue, &id) {
            Fenced::Live(session, fence) => (session, fence),
            Fenced::Refused(outcome) => return Ok(outcome),
        };
        let request = FailRequest {
            session_id: session.id().clone(),
            fence,
            reason: args.reason,
            retry: true,
        };
        match self.client.fail_task(&queue, &id, &request).await {
            Ok(task) => {
                self.lock().tasks.remove(&(queue.clone(), id.clone()));
                let next = match task.state {
                    TaskState::Dead => "it is dead: no attempts remain".to_owned(),
                    _ => format!(
                        "it will be retried (attempt {} of {})",
                        task.attempt + 1,
                        task.max_attempts
                    ),
                };
                Ok(Outcome::ok(
                    format!("failed task {id} of {queue}; {next}"),
                    json!({"failed": true, "queue": queue, "id": id, "task": task}),
                ))
            }
            Err(
                Error::StaleFence { message, .. }
                | Error::Lost { message }
                | Error::NotFound { message },
            ) => {
                self.task_gone(&session, &queue, &id).await;
                Ok(refused_task("fail", &queue, &id, &message))
            }
            Err(error) => failure(error, "fail_task", "id", "failing the task"),
        }
    }

    // -----------------------------------------------------------------------------------------
    // The session
    // -----------------------------------------------------------------------------------------

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The live session, made now if there is none. The second value is the loss it replaces,
    /// if the previous session was lost: the caller must say so.
    async fn session(&self) -> Result<(Arc<Session>, Option<Loss>), Error> {
        let closed = self.session_gate.lock().await;
        if *closed {
            return Err(Error::Unavailable {
                code: None,
                message: "this MCP server is shutting down".to_owned(),
            });
        }
        self.observe();
        if let Some(session) = self.lock().session.clone() {
            return Ok((session, None));
        }
        let session = Arc::new(self.client.session(self.ttl).await?);
        let mut state = self.lock();
        state.session = Some(Arc::clone(&session));
        Ok((session, state.lost.take()))
    }

    /// Notices a session that stopped being valid (its local G7 deadline passed, or the
    /// server said it is gone) and records the loss of everything it held.
    fn observe(&self) {
        let mut state = self.lock();
        let reason = match &state.session {
            Some(session) => match session.lost_reason() {
                Some(reason) => reason.to_string(),
                None => return,
            },
            None => return,
        };
        lose(&mut state, reason);
    }

    /// The server said `session` is gone: record the loss if it is still the current one.
    fn session_gone(&self, session: &Arc<Session>, message: &str) {
        let mut state = self.lock();
        if state
            .session
            .as_ref()
            .is_some_and(|current| Arc::ptr_eq(current, session))
        {
            lose(&mut state, format!("Baton says: {message}"));
        }
    }

    /// After a refused fenced call: is the session itself gone, or only that claim? A
    /// keepalive tells (and marks the session lost when the server says so).
    async fn verify_session(&self, session: &Arc<Session>) {
        if let Err(Error::Lost { message }) = session.keepalive().await {
            self.session_gone(session, &message);
        }
    }

    async fn claim_gone(&self, session: &Arc<Session>, resource: &str) {
        self.verify_session(session).await;
        self.lock().claims.remove(resource);
    }

    async fn task_gone(&self, session: &Arc<Session>, queue: &str, id: &str) {
        self.verify_session(session).await;
        self.lock().tasks.remove(&(queue.to_owned(), id.to_owned()));
    }

    /// The live session and fence of this agent's claim on `resource`, or the refusal.
    fn held(&self, resource: &str) -> Fenced {
        self.observe();
        let state = self.lock();
        match (&state.session, state.claims.get(resource)) {
            (Some(session), Some(claim)) => Fenced::Live(Arc::clone(session), claim.fence),
            _ => {
                let reason = match &state.lost {
                    Some(loss) if loss.claims.iter().any(|lost| lost == resource) => {
                        format!("your claim on {resource} was lost with the session")
                    }
                    _ => format!("you hold no claim on {resource}: claim it first"),
                };
                Fenced::Refused(Outcome::ok(
                    reason.clone(),
                    json!({"refused": true, "resource": resource, "reason": reason}),
                ))
            }
        }
    }

    /// The live session and fence of this agent's claim on task `id` of `queue`, or the
    /// refusal.
    fn holds_task(&self, queue: &str, id: &str) -> Fenced {
        self.observe();
        let state = self.lock();
        let key = (queue.to_owned(), id.to_owned());
        match (&state.session, state.tasks.get(&key)) {
            (Some(session), Some(hold)) => Fenced::Live(Arc::clone(session), hold.fence),
            _ => {
                let name = format!("{queue}/{id}");
                let reason = match &state.lost {
                    Some(loss) if loss.tasks.contains(&name) => {
                        format!("refused: your claim on task {name} was lost with the session; someone else may redo it")
                    }
                    _ => format!(
                        "refused: you hold no claim on task {name}: claim one with next_task"
                    ),
                };
                Fenced::Refused(Outcome::ok(
                    reason.clone(),
                    json!({"refused": true, "queue": queue, "id": id, "reason": reason}),
                ))
            }
        }
    }
}

/// Moves the current session and everything it held into the record of a loss.
fn lose(state: &mut State, reason: String) {
    let claims = std::mem::take(&mut state.claims).into_keys().collect();
    let tasks = std::mem::take(&mut state.tasks)
        .into_keys()
        .map(|(queue, id)| format!("{queue}/{id}"))
        .collect();
    state.session = None;
    state.lost = Some(Loss {
        reason,
        claims,
        tasks,
    });
}

/// `src/auth.rs is held by agent-b (fence 41) for 38s more`, naming the lease's own path when
/// it covers `resource` from above.
fn denial(resource: &str, held_by: &HeldBy) -> String {
    let through = if held_by.resource == resource {
        String::new()
    } else {
        format!(
            " through its {} claim on {}",
            LeaseMode::as_str(held_by.mode),
            held_by.resource
        )
    };
    format!(
        "{resource} is held by {}{through} (fence {}) for {} more",
        held_by.holder,
        held_by.fence,
        format_duration(Duration::from_millis(held_by.expires_in_ms))
    )
}

/// A failed call as the model should see it: bad input is an MCP error naming `argument`;
/// Baton unreachable or an unknown outcome is an error outcome that says so; any other
/// refusal is an error outcome with Baton's code and message.
fn failure(error: Error, tool: &str, argument: &str, what: &str) -> Result<Outcome, McpError> {
    let structured = json!({"error": error.to_problem()});
    match &error {
        Error::InvalidArgument { message } | Error::PayloadTooLarge { message } => Err(
            invalid_argument(tool, &format!("argument `{argument}`: {message}")),
        ),
        Error::Unavailable { .. } => Ok(Outcome::error(
            format!(
                "Baton is unreachable, so {what} did not happen ({}); this server keeps \
                 serving: try again shortly, or escalate",
                error.message()
            ),
            structured,
        )),
        Error::Indeterminate { .. } => Ok(Outcome::error(
            format!(
                "Baton did not answer in time, so whether {what} happened is unknown ({}); \
                 check with my_claims or who_holds, then try again",
                error.message()
            ),
            structured,
        )),
        _ => Ok(Outcome::error(
            format!("Baton refused {what}: {error}"),
            structured,
        )),
    }
}

/// A session that could not be made: a refusal of its TTL is this server's configuration,
/// not the model's argument, so it is an error result that says so.
fn session_failure(error: Error, what: &str) -> Result<Outcome, McpError> {
    match &error {
        Error::InvalidArgument { message } => Ok(Outcome::error(
            format!(
                "Baton refused this server's session, so {what} did not happen ({message}): \
                 the server's --ttl or --holder needs fixing; escalate"
            ),
            json!({"error": error.to_problem()}),
        )),
        _ => failure(error, "claim", "resource", what),
    }
}

fn value_or<'a>(otherwise: &'a str, error: &Error) -> &'a str {
    match error {
        Error::PayloadTooLarge { .. } => "value",
        _ => otherwise,
    }
}

fn refused_write(key: &str, resource: &str, reason: &str) -> Outcome {
    Outcome::ok(
        format!("write to {key} refused: {reason}"),
        json!({"written": false, "refused": true, "key": key, "claim": resource,
               "reason": reason}),
    )
}

fn refused_task(action: &str, queue: &str, id: &str, message: &str) -> Outcome {
    let reason = format!(
        "your claim on task {queue}/{id} is no longer live ({message}); someone else may redo it"
    );
    Outcome::ok(
        format!("{action} of task {id} refused: {reason}"),
        json!({"refused": true, "queue": queue, "id": id, "reason": reason}),
    )
}

/// A JSON value for a text line, cut at [`VALUE_TEXT_MAX`] characters.
fn short(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= VALUE_TEXT_MAX {
        return text;
    }
    let cut: String = text.chars().take(VALUE_TEXT_MAX).collect();
    format!("{cut}…")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_by(resource: &str, mode: LeaseMode, expires_in_ms: u64) -> HeldBy {
        HeldBy {
            limit: None,
            holders_total: None,
            holders: Vec::new(),
            holder: "agent-b".to_owned(),
            resource: resource.to_owned(),
            mode,
            fence: 41,
            labels: Default::default(),
            acquired_at: String::new(),
            expires_in_ms,
            expires_at: String::new(),
        }
    }

    #[test]
    fn a_denial_names_the_path_the_holder_the_fence_and_the_time_left() {
        for (resource, held, expected) in [
            (
                "src/auth.rs",
                held_by("src/auth.rs", LeaseMode::Exclusive, 38_000),
                "src/auth.rs is held by agent-b (fence 41) for 38s more",
            ),
            (
                "src/auth.rs",
                held_by("src", LeaseMode::Subtree, 90_000),
                "src/auth.rs is held by agent-b through its subtree claim on src (fence 41) for 1m30s more",
            ),
        ] {
            assert_eq!(denial(resource, &held), expected);
        }
    }

    #[test]
    fn a_loss_names_what_went_with_the_session() {
        let loss = Loss {
            reason: "no keepalive succeeded before the local deadline".to_owned(),
            claims: vec!["db/schema".to_owned()],
            tasks: vec!["builds/7".to_owned()],
        };
        assert_eq!(
            loss.sentence(),
            "this agent's Baton session was lost (no keepalive succeeded before the local \
             deadline); your claims on db/schema, task builds/7 are gone: stop acting on them"
        );
    }
}
