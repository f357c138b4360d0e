//! What one `baton mcp` process holds on behalf of its agent, and the eleven tools as calls to
//! Baton: one [`Session`] (made at the first claim, renewed in the background by the client
//! crate, ended at shutdown), the claims and task claims it holds with their fences, and the
//! record of a lost session, which is announced in every later result until a claim starts
//! a new session, and says so.
//!
//! Every tool answers an [`Outcome`]: one line for the model plus a JSON object. A denial or a
//! refusal is a normal outcome; Baton unreachable is an error outcome (`isError`) that says so,
//! and the server keeps serving. Bad arguments, ours or the server's, are error outcomes naming
//! the argument (SEP-1303).
//!
//! Nothing is ever held that the model was not told of. A claim or task claim that a cancelled
//! call took is given back ([`Agent::give_back`]); one whose answer was lost (outcome unknown),
//! or a wait cut short by an outage, is given back in the background as soon as Baton answers,
//! and a new claim of that path waits for it. What must never live here: MCP transport details
//! (`mod.rs`, `transport.rs`), and a session id in any text, log or structured result.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use baton_client::api::{
    AcquireRequest, ClaimRequest, CompleteRequest, EnqueueRequest, FailRequest, FenceRef, HeldBy,
    KvPutRequest, LeaseMode, ListLeasesQuery, TaskReleaseRequest, TaskState,
};
use baton_client::{idempotency_key, name_file, Client, Error, FileNaming, Session};
use serde_json::{json, Value};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

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
/// The pauses between two tries of a give-back while Baton does not answer.
const GIVE_BACK_PAUSE_FIRST: Duration = Duration::from_millis(250);
const GIVE_BACK_PAUSE_MAX: Duration = Duration::from_secs(2);
/// How long a claim waits for the give-back of an earlier claim of the same path.
const GIVE_BACK_WAIT_MAX: Duration = Duration::from_secs(10);
/// How many notes (give-backs) wait for the next result; older ones are dropped.
const NOTES_MAX: usize = 32;

/// The answer of one tool call: a line for the model, a JSON object, whether it is an error
/// (bad arguments, Baton unreachable, outcome unknown), and what the call took, to be given
/// back if the call turns out cancelled.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub text: String,
    pub structured: Value,
    pub is_error: bool,
    pub taken: Option<Taken>,
}

impl Outcome {
    fn ok(text: impl Into<String>, structured: Value) -> Outcome {
        Outcome {
            text: text.into(),
            structured,
            is_error: false,
            taken: None,
        }
    }

    fn error(text: impl Into<String>, structured: Value) -> Outcome {
        Outcome {
            text: text.into(),
            structured,
            is_error: true,
            taken: None,
        }
    }

    /// Bad arguments: an error result naming the argument (SEP-1303), nothing changed.
    pub fn invalid(message: String) -> Outcome {
        let structured = json!({"error": {"code": "INVALID_ARGUMENT", "message": message}});
        Outcome::error(
            format!("invalid arguments, nothing was done: {message}"),
            structured,
        )
    }

    /// The answer to a call the client cancelled (it is not sent: the client stopped waiting).
    pub fn cancelled() -> Outcome {
        Outcome::ok("cancelled", json!({"cancelled": true}))
    }
}

/// What a tool call took: given back if the call is cancelled.
#[derive(Debug, Clone)]
pub enum Taken {
    Claim {
        session: Arc<Session>,
        resource: String,
        fence: u64,
    },
    Task {
        session: Arc<Session>,
        queue: String,
        id: String,
        fence: u64,
    },
}

/// What a background give-back still has to do.
#[derive(Debug)]
enum GiveBack {
    /// Release the session's lease on `resource`, or take it out of the line.
    Release { resource: String },
    /// Send a claim whose answer was lost again with the same key, to learn what it did
    /// (Baton replays its first answer), then release what it took.
    Replay {
        request: AcquireRequest,
        key: String,
    },
    /// The same for a task claim.
    ReplayTask {
        queue: String,
        request: ClaimRequest,
        key: String,
    },
    /// Release a task claim.
    ReleaseTask {
        queue: String,
        id: String,
        fence: u64,
    },
}

/// The give-backs running in the background (by the path they free), and the notes for the
/// model that give-backs leave, said in the next result.
#[derive(Debug, Default)]
struct GiveBacks {
    /// Path → (the give-back's number, cancelled when it ends).
    pending: BTreeMap<String, (u64, CancellationToken)>,
    numbered: u64,
    notes: Vec<String>,
}

impl GiveBacks {
    fn note(&mut self, note: String) {
        if self.notes.len() >= NOTES_MAX {
            self.notes.remove(0);
        }
        self.notes.push(note);
    }
}

/// The agent's side of Baton: its client, its session and what it holds.
#[derive(Debug)]
pub struct Agent {
    client: Client,
    ttl: Duration,
    /// How a `path` argument is named (`--root`, `--repo`), from this directory.
    naming: FileNaming,
    working_directory: PathBuf,
    state: Mutex<State>,
    /// Held while a session is being made, so two concurrent claims make one; holds `true`
    /// once the server shuts down, so a call still running then makes no new session.
    session_gate: tokio::sync::Mutex<bool>,
    give_backs: Arc<Mutex<GiveBacks>>,
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
    pub fn new(client: Client, ttl: Duration, naming: FileNaming) -> Agent {
        Agent {
            client,
            ttl,
            naming,
            working_directory: std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
            state: Mutex::new(State::default()),
            session_gate: tokio::sync::Mutex::new(false),
            give_backs: Arc::default(),
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

    /// Appends the announcement of a lost session, if any, and the notes give-backs left
    /// since the last result, to an outcome.
    pub fn announce(&self, mut outcome: Outcome) -> Outcome {
        self.observe();
        let notes = std::mem::take(&mut lock(&self.give_backs).notes);
        if !notes.is_empty() {
            for note in &notes {
                outcome.text = format!("{} [NOTE: {note}]", outcome.text);
            }
            if let Value::Object(object) = &mut outcome.structured {
                object.insert("notes".to_owned(), json!(notes));
            }
        }
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

    /// The resource a call names: `resource` as given, or `path` named by the one rule of
    /// `baton_client::names` (an absolute `resource` is a path: no name starts with `/`).
    /// Exactly one of the two; else the message of an error result naming them.
    fn name(
        &self,
        tool: &str,
        resource: Option<&str>,
        path: Option<&str>,
    ) -> Result<String, String> {
        let path = match (resource, path) {
            (Some(resource), None) if !resource.starts_with('/') => return Ok(resource.to_owned()),
            (Some(path), None) | (None, Some(path)) => path,
            (Some(_), Some(_)) => {
                return Err(invalid_argument(
                    tool,
                    "give `resource` (a name) or `path` (a file or directory), not both",
                ))
            }
            (None, None) => {
                return Err(invalid_argument(
                    tool,
                    "missing argument: give `resource` (a name) or `path` (a file or directory)",
                ))
            }
        };
        name_file(Path::new(path), &self.working_directory, &self.naming)
            .map(|name| name.resource)
            .map_err(|error| invalid_argument(tool, &format!("argument `path`: {error}")))
    }

    /// `claim`. `stop` is the call's cancellation: a wait in the line stops at once, and
    /// leaves the line.
    pub async fn claim(&self, args: ClaimArgs, stop: &CancellationToken) -> Outcome {
        if args
            .wait_seconds
            .is_some_and(|seconds| seconds > WAIT_SECONDS_MAX)
        {
            return Outcome::invalid(invalid_argument(
                "claim",
                &format!("argument `wait_seconds`: at most {WAIT_SECONDS_MAX}"),
            ));
        }
        let resource = match self.name("claim", args.resource.as_deref(), args.path.as_deref()) {
            Ok(resource) => resource,
            Err(message) => return Outcome::invalid(message),
        };
        let wait = Duration::from_secs(args.wait_seconds.unwrap_or(0));
        self.observe();
        if let Some(claim) = self.lock().claims.get(&resource).cloned() {
            return Outcome::ok(
                format!(
                    "you already hold {} (fence {}, {})",
                    resource,
                    claim.fence,
                    LeaseMode::as_str(claim.mode)
                ),
                json!({"granted": true, "already_held": true, "resource": resource,
                       "fence": claim.fence, "mode": claim.mode}),
            );
        }
        if let Err(outcome) = self.given_back_first(&resource).await {
            return outcome;
        }
        if self.lock().session.is_none() {
            // Baton judges the path with a read before a session is made for it, so that a
            // path it refuses makes nothing.
            match self.client.get_lease(&resource).await {
                Ok(_) | Err(Error::NotFound { .. }) => {}
                Err(error) => return failure(error, "claim", "resource", "the claim", false),
            }
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
                resource: resource.clone(),
                session_id: Some(session.id().clone()),
                holder: None,
                ttl_ms: None,
                mode,
                max_hold_ms: None,
                labels: Default::default(),
                reason: args.reason.clone(),
                wait_ms: None,
            };
            // A wait is spent in the resource's line: first come first served. A plain claim
            // carries a key of ours, so that a lost answer can be asked again.
            let left = deadline.saturating_duration_since(Instant::now());
            let waiting = (!left.is_zero()).then_some(left);
            let key = idempotency_key();
            let answer = match waiting {
                None => self
                    .client
                    .acquire_raw_with_key(&request, &key)
                    .await
                    .map(Some),
                Some(_) => {
                    self.client
                        .acquire_raw_waiting_or_stop(&request, waiting, stop.cancelled())
                        .await
                }
            };
            match answer {
                Ok(Some(answer)) => {
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
                    let mut outcome = Outcome::ok(text, structured);
                    outcome.taken = Some(Taken::Claim {
                        session,
                        resource: grant.resource,
                        fence: grant.fence,
                    });
                    return outcome;
                }
                Ok(None) => {
                    // Stopped: the wait left the line and let go of a grant that raced it.
                    lock(&self.give_backs).note(format!(
                        "your claim on {} was cancelled; you do not hold it",
                        resource
                    ));
                    return Outcome::cancelled();
                }
                Err(Error::Held { held_by, .. }) => {
                    if let Some(outcome) = self.held_by_us(&session, &resource, &held_by).await {
                        return outcome;
                    }
                    let waited = if wait.is_zero() {
                        String::new()
                    } else {
                        format!(" (waited {})", format_duration(wait))
                    };
                    let mut structured = json!({"granted": false, "resource": resource,
                        "held_by": held_by});
                    let mut text = format!(
                        "{}{waited}: pick other work, wait, or escalate",
                        denial(&resource, &held_by)
                    );
                    if let Some(loss) = fresh_after {
                        text.push_str(&format!(" (note: {})", loss.sentence()));
                        structured["new_session_after_loss"] = loss.to_json();
                    }
                    return Outcome::ok(text, structured);
                }
                Err(Error::Lost { message } | Error::NotFound { message })
                    if sessions_tried < 2 =>
                {
                    self.session_gone(&session, &message);
                }
                Err(error) => {
                    // What the claim may have left behind: a grant whose answer was lost, a
                    // place in the line of a wait cut short. Given back once Baton answers.
                    let left_behind = match (&error, waiting) {
                        (Error::Indeterminate { .. }, None) => {
                            Some(GiveBack::Replay { request, key })
                        }
                        (Error::Indeterminate { .. } | Error::Unavailable { .. }, Some(_)) => {
                            Some(GiveBack::Release {
                                resource: resource.clone(),
                            })
                        }
                        _ => None,
                    };
                    let given_back = left_behind.is_some();
                    if let Some(left_behind) = left_behind {
                        self.give_back_later(session, left_behind);
                    }
                    return failure(error, "claim", "resource", "the claim", given_back);
                }
            }
        }
    }

    /// Waits for the give-back of an earlier claim of `resource` (one whose outcome was
    /// unknown), so that it cannot take back what a new claim gets; refuses the claim if the
    /// give-back does not end soon.
    async fn given_back_first(&self, resource: &str) -> Result<(), Outcome> {
        let pending = lock(&self.give_backs).pending.get(resource).cloned();
        let Some((_, done)) = pending else {
            return Ok(());
        };
        if tokio::time::timeout(GIVE_BACK_WAIT_MAX, done.cancelled())
            .await
            .is_ok()
        {
            return Ok(());
        }
        Err(Outcome::error(
            format!(
                "an earlier claim of yours on {resource}, whose outcome is unknown, is still \
                 being given back (Baton does not answer): the claim did not happen; try again \
                 shortly, or escalate"
            ),
            json!({"granted": false, "resource": resource, "giving_back": true}),
        ))
    }

    /// Gives back what a cancelled call took: the claim or task claim is released (the model
    /// never heard of it), and the next result says so. If Baton does not answer, the
    /// release goes on in the background.
    pub async fn give_back(&self, taken: Taken) {
        match taken {
            Taken::Claim {
                session,
                resource,
                fence,
            } => {
                {
                    let mut state = self.lock();
                    if state
                        .claims
                        .get(&resource)
                        .is_some_and(|claim| claim.fence == fence)
                    {
                        state.claims.remove(&resource);
                    }
                }
                let what = format!("your cancelled claim on {resource} (fence {fence})");
                match self.client.release(session.id(), &resource).await {
                    Ok(_) | Err(Error::NotFound { .. } | Error::Lost { .. }) => {
                        lock(&self.give_backs).note(format!(
                            "{what} was given back; claim it again if you need it"
                        ));
                    }
                    Err(error) => {
                        lock(&self.give_backs).note(format!(
                            "{what} is being given back ({error}); do not act on it"
                        ));
                        self.give_back_later(session, GiveBack::Release { resource });
                    }
                }
            }
            Taken::Task {
                session,
                queue,
                id,
                fence,
            } => {
                self.lock().tasks.remove(&(queue.clone(), id.clone()));
                let what = format!("your cancelled claim on task {id} of {queue}");
                match release_task(&self.client, &session, &queue, &id, fence).await {
                    Ok(()) => lock(&self.give_backs).note(format!(
                        "{what} was given back: it is ready for anyone again"
                    )),
                    Err(error) => {
                        lock(&self.give_backs).note(format!(
                            "{what} is being given back ({error}); do not work on it"
                        ));
                        self.give_back_later(session, GiveBack::ReleaseTask { queue, id, fence });
                    }
                }
            }
        }
    }

    /// Runs `what` in the background until Baton answers it, or the session is lost (then
    /// Baton frees what it held when its TTL runs out). A claim of the same path meanwhile
    /// waits for it ([`Agent::given_back_first`]).
    fn give_back_later(&self, session: Arc<Session>, what: GiveBack) {
        let done = CancellationToken::new();
        let number = {
            let mut give_backs = lock(&self.give_backs);
            give_backs.numbered += 1;
            let number = give_backs.numbered;
            if let GiveBack::Release { resource }
            | GiveBack::Replay {
                request: AcquireRequest { resource, .. },
                ..
            } = &what
            {
                give_backs
                    .pending
                    .insert(resource.clone(), (number, done.clone()));
            }
            number
        };
        let client = self.client.clone();
        let give_backs = Arc::clone(&self.give_backs);
        tokio::spawn(async move {
            let _done = done.drop_guard();
            let freed = give_back_until_answered(&client, &session, what).await;
            let mut give_backs = lock(&give_backs);
            give_backs
                .pending
                .retain(|_, (pending, _)| *pending != number);
            if let Some(freed) = freed {
                give_backs.note(format!(
                    "{freed}, whose outcome was unknown, was given back"
                ));
            }
        });
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

    pub async fn release(&self, args: ResourceArgs) -> Outcome {
        let resource = match self.name("release", args.resource.as_deref(), args.path.as_deref()) {
            Ok(resource) => resource,
            Err(message) => return Outcome::invalid(message),
        };
        let (session, claim) = match self.held(&resource) {
            Fenced::Live(session, _) => {
                let claim = self.lock().claims.get(&resource).cloned();
                (session, claim)
            }
            Fenced::Refused(outcome) => return outcome,
        };
        match self.client.release(session.id(), &resource).await {
            Ok(_) => {
                self.lock().claims.remove(&resource);
                Outcome::ok(
                    format!("released {resource}; others may claim it now"),
                    json!({"released": true, "resource": resource,
                           "fence": claim.map(|claim| claim.fence)}),
                )
            }
            Err(Error::NotFound { message } | Error::Lost { message }) => {
                self.lock().claims.remove(&resource);
                self.verify_session(&session).await;
                Outcome::ok(
                    format!("{resource} was no longer yours to release: {message}"),
                    json!({"released": false, "resource": resource, "reason": message}),
                )
            }
            Err(error) => failure(error, "release", "resource", "the release", false),
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

    pub async fn who_holds(&self, args: ResourceArgs) -> Outcome {
        let resource = match self.name("who_holds", args.resource.as_deref(), args.path.as_deref())
        {
            Ok(resource) => resource,
            Err(message) => return Outcome::invalid(message),
        };
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
                Outcome::ok(
                    format!(
                        "{resource} is held by {who}{through} (fence {}) for {} more",
                        lease.fence,
                        format_duration(Duration::from_millis(lease.expires_in_ms))
                    ),
                    json!({"resource": resource, "held": true, "yours": yours, "lease": lease}),
                )
            }
            Err(Error::NotFound { .. }) => Outcome::ok(
                format!("nobody holds {resource}"),
                json!({"resource": resource, "held": false}),
            ),
            Err(error) => failure(error, "who_holds", "resource", "the lookup", false),
        }
    }

    pub async fn list_claims(&self, args: ListArgs) -> Outcome {
        let query = ListLeasesQuery {
            prefix: args.prefix.clone(),
            limit: Some(LIST_LIMIT),
            cursor: None,
        };
        let list = match self.client.list_leases(&query).await {
            Ok(list) => list,
            Err(error) => return failure(error, "list_claims", "prefix", "the listing", false),
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
        Outcome::ok(
            text,
            json!({"claims": list.leases, "truncated": list.next_cursor.is_some()}),
        )
    }

    // -----------------------------------------------------------------------------------------
    // The fenced store
    // -----------------------------------------------------------------------------------------

    pub async fn write_value(&self, args: WriteArgs) -> Outcome {
        let key = args.key;
        let Some(resource) = args.claim else {
            let request = KvPutRequest {
                value: args.value,
                fence: None,
                session_id: None,
            };
            return match self.client.kv_put_request(&key, &request).await {
                Ok(put) => Outcome::ok(
                    format!("wrote {key} (revision {}), unfenced", put.revision),
                    json!({"written": true, "key": key, "revision": put.revision}),
                ),
                Err(error) => {
                    let argument = value_or("key", &error);
                    failure(error, "write_value", argument, "the write", false)
                }
            };
        };
        let (session, fence) = match self.held(&resource) {
            Fenced::Live(session, fence) => (session, fence),
            Fenced::Refused(outcome) => {
                return refused_write(&key, &resource, &outcome.text);
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
            Ok(put) => Outcome::ok(
                format!(
                    "wrote {key} (revision {}), fenced by your claim on {resource} (fence {fence})",
                    put.revision
                ),
                json!({"written": true, "key": key, "revision": put.revision,
                       "fence": {"resource": resource, "token": fence}}),
            ),
            Err(Error::StaleFence { message, .. } | Error::Lost { message }) => {
                self.claim_gone(&session, &resource).await;
                refused_write(
                    &key,
                    &resource,
                    &format!(
                        "your claim on {resource} (fence {fence}) is no longer live: {message}"
                    ),
                )
            }
            Err(error) => {
                let argument = value_or("key", &error);
                failure(error, "write_value", argument, "the write", false)
            }
        }
    }

    pub async fn read_value(&self, args: ReadArgs) -> Outcome {
        let key = args.key;
        match self.client.kv_get(&key).await {
            Ok(entry) => {
                let written = entry.fence.as_ref().map_or(String::new(), |fence| {
                    format!(
                        ", written under fence {} of {}",
                        fence.token, fence.resource
                    )
                });
                Outcome::ok(
                    format!(
                        "{key} = {} (revision {}{written})",
                        short(&entry.value),
                        entry.revision
                    ),
                    json!({"found": true, "key": key, "value": entry.value,
                           "revision": entry.revision, "fence": entry.fence}),
                )
            }
            Err(Error::NotFound { .. }) => Outcome::ok(
                format!("{key} has no value"),
                json!({"found": false, "key": key}),
            ),
            Err(error) => failure(error, "read_value", "key", "the read", false),
        }
    }

    // -----------------------------------------------------------------------------------------
    // Work queues
    // -----------------------------------------------------------------------------------------

    pub async fn add_task(&self, args: AddTaskArgs) -> Outcome {
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
                Outcome::ok(
                    format!(
                        "added task {} to {} (priority {}{waits})",
                        task.id, task.queue, task.priority
                    ),
                    json!({"added": true, "task": task}),
                )
            }
            Err(error) => {
                let argument = match &error {
                    Error::PayloadTooLarge { .. } => "payload",
                    error if error.message().contains("depend") => "depends_on",
                    _ => "queue",
                };
                failure(error, "add_task", argument, "adding the task", false)
            }
        }
    }

    pub async fn next_task(&self, args: QueueArgs) -> Outcome {
        let queue = args.queue;
        if self.lock().session.is_none() {
            // As for a claim: a queue name Baton refuses makes no session.
            match self.client.queue_info(&queue).await {
                Ok(_) | Err(Error::NotFound { .. }) => {}
                Err(error) => return failure(error, "next_task", "queue", "the claim", false),
            }
        }
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
            let key = idempotency_key();
            let mut outcome = match self.client.claim_raw_with_key(&queue, &request, &key).await {
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
                        let mut outcome = Outcome::ok(
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
                        );
                        outcome.taken = Some(Taken::Task {
                            session,
                            queue: queue.clone(),
                            id: task.id,
                            fence: claimed.fence,
                        });
                        outcome
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
                Err(error) => {
                    let lost_answer = error.is_indeterminate();
                    if lost_answer {
                        let what = GiveBack::ReplayTask {
                            queue: queue.clone(),
                            request,
                            key,
                        };
                        self.give_back_later(session, what);
                    }
                    return failure(error, "next_task", "queue", "the claim", lost_answer);
                }
            };
            if let Some(loss) = fresh_after {
                outcome.text.push_str(&format!(
                    " (a new Baton session was started because {})",
                    loss.sentence()
                ));
                outcome.structured["new_session_after_loss"] = loss.to_json();
            }
            return outcome;
        }
    }

    pub async fn complete_task(&self, args: CompleteArgs) -> Outcome {
        let (queue, id) = (args.queue, args.id);
        let (session, fence) = match self.holds_task(&queue, &id) {
            Fenced::Live(session, fence) => (session, fence),
            Fenced::Refused(outcome) => return outcome,
        };
        let request = CompleteRequest {
            session_id: session.id().clone(),
            fence,
            result: args.result,
        };
        match self.client.complete_task(&queue, &id, &request).await {
            Ok(task) => {
                self.lock().tasks.remove(&(queue.clone(), id.clone()));
                Outcome::ok(
                    format!("completed task {id} of {queue}"),
                    json!({"completed": true, "queue": queue, "id": id, "task": task}),
                )
            }
            Err(
                Error::StaleFence { message, .. }
                | Error::Lost { message }
                | Error::NotFound { message },
            ) => {
                self.task_gone(&session, &queue, &id).await;
                refused_task("complete", &queue, &id, &message)
            }
            Err(error) => failure(error, "complete_task", "id", "completing the task", false),
        }
    }

    pub async fn fail_task(&self, args: FailArgs) -> Outcome {
        let (queue, id) = (args.queue, args.id);
        let (session, fence) = match self.holds_task(&queue, &id) {
            Fenced::Live(session, fence) => (session, fence),
            Fenced::Refused(outcome) => return outcome,
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
                Outcome::ok(
                    format!("failed task {id} of {queue}; {next}"),
                    json!({"failed": true, "queue": queue, "id": id, "task": task}),
                )
            }
            Err(
                Error::StaleFence { message, .. }
                | Error::Lost { message }
                | Error::NotFound { message },
            ) => {
                self.task_gone(&session, &queue, &id).await;
                refused_task("fail", &queue, &id, &message)
            }
            Err(error) => failure(error, "fail_task", "id", "failing the task", false),
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

/// A failed call as the model should see it, always an error result: bad input names
/// `argument`; Baton unreachable or an unknown outcome says so (and, when `given_back`, that
/// whatever the call may have taken is given back as soon as Baton answers); any other
/// refusal gives Baton's code and message.
fn failure(error: Error, tool: &str, argument: &str, what: &str, given_back: bool) -> Outcome {
    let structured = json!({"error": error.to_problem(), "given_back": given_back});
    let given_back = if given_back {
        "; whatever it may have taken is given back as soon as Baton answers, so you hold \
         nothing from it"
    } else {
        ""
    };
    match &error {
        Error::InvalidArgument { message } | Error::PayloadTooLarge { message } => {
            Outcome::invalid(invalid_argument(
                tool,
                &format!("argument `{argument}`: {message}"),
            ))
        }
        Error::Unavailable { .. } => Outcome::error(
            format!(
                "Baton is unreachable, so {what} did not happen ({}){given_back}; this server \
                 keeps serving: try again shortly, or escalate",
                error.message()
            ),
            structured,
        ),
        Error::Indeterminate { .. } if !given_back.is_empty() => Outcome::error(
            format!(
                "Baton did not answer in time, so whether {what} happened is unknown ({}){given_back}: \
                 try again shortly",
                error.message()
            ),
            structured,
        ),
        Error::Tls { message } => Outcome::error(
            format!(
                "Baton cannot be used until its TLS setup is fixed, so {what} did not happen \
                 ({message}); this is configuration, not something to retry: escalate"
            ),
            structured,
        ),
        Error::Indeterminate { .. } => Outcome::error(
            format!(
                "Baton did not answer in time, so whether {what} happened is unknown ({}); \
                 check with my_claims or who_holds, then try again",
                error.message()
            ),
            structured,
        ),
        _ => Outcome::error(format!("Baton refused {what}: {error}"), structured),
    }
}

/// A session that could not be made: a refusal of its TTL is this server's configuration,
/// not the model's argument, so it is an error result that says so.
fn session_failure(error: Error, what: &str) -> Outcome {
    match &error {
        Error::InvalidArgument { message } => Outcome::error(
            format!(
                "Baton refused this server's session, so {what} did not happen ({message}): \
                 the server's --ttl or --holder needs fixing; escalate"
            ),
            json!({"error": error.to_problem()}),
        ),
        _ => failure(error, "claim", "resource", what, false),
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

/// Does `what` until Baton answers it or `session` is lost; returns what was released, for
/// the note, if anything was.
async fn give_back_until_answered(
    client: &Client,
    session: &Session,
    mut what: GiveBack,
) -> Option<String> {
    let mut pause = GIVE_BACK_PAUSE_FIRST;
    loop {
        if let Some(reason) = session.lost_reason() {
            // Baton frees what the session held when it expires.
            tracing::debug!(%reason, ?what, "a give-back ends with its session");
            return None;
        }
        let next = match &what {
            GiveBack::Release { resource } => match client.release(session.id(), resource).await {
                Ok(_) => return Some(format!("your claim on {resource}")),
                Err(Error::NotFound { .. } | Error::Lost { .. }) => return None,
                Err(error) => Err(error),
            },
            GiveBack::Replay { request, key } => {
                match client.acquire_raw_with_key(request, key).await {
                    Ok(answer) => Ok(GiveBack::Release {
                        resource: answer.value.resource,
                    }),
                    // Not granted to this session, or the session is gone: nothing to free.
                    Err(Error::Held { .. } | Error::Lost { .. } | Error::NotFound { .. }) => {
                        return None
                    }
                    Err(
                        error @ (Error::Unavailable { .. }
                        | Error::Indeterminate { .. }
                        | Error::Denied { .. }),
                    ) => Err(error),
                    // What the claim did cannot be learnt (its key was forgotten): release
                    // the path anyway, which frees it if it was granted.
                    Err(error) => {
                        tracing::debug!(%error, "a lost claim could not be asked again");
                        Ok(GiveBack::Release {
                            resource: request.resource.clone(),
                        })
                    }
                }
            }
            GiveBack::ReplayTask {
                queue,
                request,
                key,
            } => match client.claim_raw_with_key(queue, request, key).await {
                Ok(answer) => match answer.value {
                    Some(claimed) => Ok(GiveBack::ReleaseTask {
                        queue: queue.clone(),
                        id: claimed.task.id,
                        fence: claimed.fence,
                    }),
                    None => return None,
                },
                Err(Error::Lost { .. } | Error::NotFound { .. }) => return None,
                Err(
                    error @ (Error::Unavailable { .. }
                    | Error::Indeterminate { .. }
                    | Error::Denied { .. }),
                ) => Err(error),
                Err(error) => {
                    // The task claim, if it was made, ends with the session's TTL.
                    tracing::warn!(%error, "a lost task claim could not be asked again");
                    return None;
                }
            },
            GiveBack::ReleaseTask { queue, id, fence } => {
                match release_task(client, session, queue, id, *fence).await {
                    Ok(()) => return Some(format!("your claim on task {id} of {queue}")),
                    Err(error) => Err(error),
                }
            }
        };
        match next {
            Ok(then) => what = then,
            Err(error) => {
                tracing::debug!(%error, ?what, "a give-back waits for Baton");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(GIVE_BACK_PAUSE_MAX);
            }
        }
    }
}

/// Releases task `id` of `queue` (no attempt counted); a claim already gone counts as done.
async fn release_task(
    client: &Client,
    session: &Session,
    queue: &str,
    id: &str,
    fence: u64,
) -> Result<(), Error> {
    let request = TaskReleaseRequest {
        session_id: session.id().clone(),
        fence,
        note: Some("the claiming call was cancelled".to_owned()),
    };
    match client.release_task(queue, id, &request).await {
        Ok(_) | Err(Error::StaleFence { .. } | Error::NotFound { .. } | Error::Lost { .. }) => {
            Ok(())
        }
        Err(error) => Err(error),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
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
