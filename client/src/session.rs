//! [`Session`] and [`LeaseGuard`]: a session that keeps itself alive in the background, and
//! leases whose validity is computed locally, exactly as docs/guarantees.md G7 allows.
//!
//! The rule: a holder may act until `t0 + (expires_in_ms - 1) * (1 - 2 * clock_rate_error)`,
//! where `t0` is the local monotonic send time of the first attempt of the last successful
//! acquire or keepalive, and never past `t_acquire + (max_hold_ms - 1) * (1 - 2 * rate)` when
//! the lease has a max hold. Once that instant passes, or the server says `LEASE_LOST`, the
//! session is lost for good: a late keepalive never revives it, because the holder may already
//! have stopped acting on it. What must never live here: HTTP details and retries (that is
//! `client.rs`), and any notion of validity taken from the server's wall clock.
//!
//! The `Client` calls that hand out or take a guard (`acquire`, `acquire_raw_waiting`,
//! `check_fence`, the fenced kv writes) are defined here too, so that `client.rs` depends on
//! nothing in this file.

use std::fmt;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use reqwest::Method;
use serde::Deserialize;

use crate::api::{
    AcquireRequest, FenceCheckResponse, FenceRef, Grant, KvDeleteRequest, KvDeleteResponse,
    KvPutRequest, KvPutResponse, LeaseMode, Queued, SessionId, WAIT_MS_MAX,
};
use crate::client::{millis, AcquireOptions, Answer, Budget, Client};
use crate::clock::valid_until;
use crate::error::{Error, Result};

/// The longest a [`LeaseGuard::lost`] future sleeps between two looks at its clock (an
/// injected clock may move at any speed).
const LOST_POLL_MAX: Duration = Duration::from_millis(50);
/// The first pause before retrying a failed keepalive; it doubles up to a tenth of the TTL.
const KEEPALIVE_RETRY_INITIAL: Duration = Duration::from_millis(50);
/// The shortest per-request timeout of a keepalive.
const KEEPALIVE_TIMEOUT_MIN: Duration = Duration::from_millis(200);

/// Why a session or lease stopped being valid.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The local G7 deadline passed without a successful renewal.
    Expired,
    /// The lease's max hold passed (G7's second bound).
    MaxHoldReached,
    /// The server answered `LEASE_LOST` (or `NOT_FOUND`): the session is gone.
    Gone {
        /// The server's message.
        message: String,
    },
    /// This process ended the session.
    Ended,
}

impl fmt::Display for LostReason {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LostReason::Expired => {
                formatter.write_str("no keepalive succeeded before the local deadline")
            }
            LostReason::MaxHoldReached => formatter.write_str("max hold reached"),
            LostReason::Gone { message } => {
                write!(formatter, "session ended (the server says: {message})")
            }
            LostReason::Ended => formatter.write_str("session ended"),
        }
    }
}

/// A live session: renewed in the background every third of its TTL, retrying across nodes,
/// until it is ended, dropped, or lost. One keepalive renews every lease it holds.
///
/// A session made by [`Client::session`] is ended (best effort) when the `Session` and every
/// guard acquired through it are dropped; an adopted one ([`Client::adopt_session`]) is only
/// no longer renewed.
///
/// ```no_run
/// # async fn example() -> Result<(), baton_client::Error> {
/// use std::time::Duration;
/// use baton_client::{AcquireOptions, Client};
///
/// let client = Client::new(["http://127.0.0.1:7420"])?;
/// let session = client.session(Duration::from_secs(10)).await?;
/// let auth = session.acquire("repo/src/auth.rs", AcquireOptions::new()).await?;
/// let docs = session.acquire("repo/docs", AcquireOptions::new().subtree()).await?;
/// assert!(auth.is_valid() && docs.is_valid());
/// session.end().await?; // releases both
/// # Ok(())
/// # }
/// ```
pub struct Session {
    pub(crate) shared: Arc<Shared>,
}

/// What a session and its guards share. The keepalive task holds only a [`Weak`] to it, so
/// dropping the last handle stops the renewals.
pub(crate) struct Shared {
    pub(crate) client: Client,
    pub(crate) id: SessionId,
    holder: String,
    ttl: Duration,
    /// End the session when the last handle goes (sessions this process created).
    owned: bool,
    state: Mutex<State>,
    changes: watch::Sender<()>,
    keepalive: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Debug)]
struct State {
    /// The G7 deadline, a reading of the client's clock.
    valid_until: Duration,
    lost: Option<LostReason>,
}

/// A lease held by a [`Session`]: its fence, and whether the holder may still act on it (docs/api.md
/// G7), computed from the guard clock alone. Releasing it is explicit
/// ([`LeaseGuard::release`]) or, best effort, on drop.
///
/// ```no_run
/// # async fn example() -> Result<(), baton_client::Error> {
/// use baton_client::{AcquireOptions, Client};
/// use serde_json::json;
///
/// let client = Client::new(["http://127.0.0.1:7420"])?;
/// let guard = client.acquire("migrations", AcquireOptions::new()).await?;
/// tokio::select! {
///     reason = guard.lost() => eprintln!("stop: {reason}"),
///     written = client.kv_put_fenced(&guard, "migrations/state", json!("v42")) => {
///         written?;
///     }
/// }
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
pub struct LeaseGuard {
    session: Arc<Shared>,
    grant: Grant,
    /// The max-hold bound of G7, a reading of the client's clock.
    max_hold_until: Option<Duration>,
    /// The guard's session was made for it alone: releasing the guard ends the session.
    own_session: bool,
    /// Set by `release`, so that drop does nothing more.
    released: bool,
}

impl fmt::Debug for Session {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("Session")
            .field("id", &self.shared.id)
            .field("holder", &self.shared.holder)
            .field("ttl", &self.shared.ttl)
            .field("state", &*self.shared.lock())
            .finish()
    }
}

impl fmt::Debug for LeaseGuard {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("LeaseGuard")
            .field("resource", &self.grant.resource)
            .field("fence", &self.grant.fence)
            .field("mode", &self.grant.mode)
            .field("valid_until", &self.valid_until())
            .field("lost", &self.session.lock().lost)
            .finish()
    }
}

impl Client {
    /// Creates a session with this client's holder name and `ttl`, and keeps it alive.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a TTL out of limits (1 s .. 1 h by default).
    pub async fn session(&self, ttl: Duration) -> Result<Session> {
        let answer = self
            .create_session_raw(ttl, crate::api::Labels::new())
            .await?;
        let created = answer.value;
        let shared = Shared::start(
            self.clone(),
            created.session_id,
            created.holder,
            Duration::from_millis(created.ttl_ms),
            true,
            valid_until(
                answer.sent_at,
                created.expires_in_ms,
                self.clock_rate_error(),
            ),
        );
        Ok(Session { shared })
    }

    /// Takes over an existing session by id (e.g. one made by `baton session create`): reads
    /// its TTL, renews it once to learn its deadline, and keeps it alive. Dropping the handle
    /// stops the renewals but does not end the session.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] or [`Error::Lost`] when the session is gone.
    pub async fn adopt_session(&self, session_id: SessionId) -> Result<Session> {
        let info = self.get_session(&session_id).await?;
        let answer = self.keepalive(&session_id).await?;
        let shared = Shared::start(
            self.clone(),
            session_id,
            info.holder,
            Duration::from_millis(info.ttl_ms),
            false,
            valid_until(
                answer.sent_at,
                answer.value.expires_in_ms,
                self.clock_rate_error(),
            ),
        );
        Ok(Session { shared })
    }
}

impl Session {
    /// The session id: a secret capability. Never log it.
    pub fn id(&self) -> &SessionId {
        &self.shared.id
    }

    /// The holder name.
    pub fn holder(&self) -> &str {
        &self.shared.holder
    }

    /// The session's TTL.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// True while the holder may act on the session's leases (docs/guarantees.md G7).
    pub fn is_valid(&self) -> bool {
        self.shared.lost_reason().is_none()
    }

    /// The G7 deadline, as a reading of the client's clock ([`Client::clock`]).
    pub fn valid_until(&self) -> Duration {
        self.shared.lock().valid_until
    }

    /// Why the session is no longer valid, or `None` while it is. Once lost, it stays lost.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.lost_reason()
    }

    /// Resolves when the session is lost: its local deadline passed, or the server said it is
    /// gone, or it was ended.
    pub async fn lost(&self) -> LostReason {
        self.shared.lost(None).await
    }

    /// Acquires `resource` for this session. `options.ttl` is ignored (the session has its
    /// own); `options.wait` retries while the resource is held.
    ///
    /// # Errors
    ///
    /// [`Error::Held`] when a conflicting lease is live; [`Error::Lost`] when the session is
    /// gone (or known lost locally, without sending anything).
    pub async fn acquire(&self, resource: &str, options: AcquireOptions) -> Result<LeaseGuard> {
        if let Some(reason) = self.shared.lost_reason() {
            return Err(Error::Lost {
                message: format!("session is lost: {reason}"),
            });
        }
        let request = acquire_request(resource, &options, Owner::Session(&self.shared.id));
        let answer = acquire_waiting(
            &self.shared.client,
            &request,
            options.wait,
            std::future::pending(),
        )
        .await
        .map(granted);
        let answer = match answer {
            Err(Error::Lost { message }) => {
                self.shared.mark_lost(LostReason::Gone {
                    message: message.clone(),
                });
                return Err(Error::Lost { message });
            }
            other => other?,
        };
        Ok(LeaseGuard::new(
            Arc::clone(&self.shared),
            answer,
            options.max_hold,
            false,
        ))
    }

    /// Renews the session now, besides the background renewals.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] when the session is gone (it is then lost for good).
    pub async fn keepalive(&self) -> Result<()> {
        self.shared
            .keepalive_once(self.shared.client.default_budget())
            .await
    }

    /// Ends the session, releasing every lease it holds; its guards become lost.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] or [`Error::Lost`] when it was already gone.
    pub async fn end(self) -> Result<Vec<String>> {
        self.shared.mark_lost(LostReason::Ended);
        let ended = self.shared.client.end_session(&self.shared.id).await?;
        Ok(ended.released)
    }
}

impl LeaseGuard {
    fn new(
        session: Arc<Shared>,
        answer: Answer<Grant>,
        max_hold: Option<Duration>,
        own_session: bool,
    ) -> LeaseGuard {
        let rate_error = session.client.clock_rate_error();
        session.record_renewal(answer.sent_at, answer.value.expires_in_ms);
        let max_hold_ms = answer.value.max_hold_ms.or(max_hold.map(millis));
        let max_hold_until =
            max_hold_ms.map(|max_hold_ms| valid_until(answer.sent_at, max_hold_ms, rate_error));
        LeaseGuard {
            session,
            grant: answer.value,
            max_hold_until,
            own_session,
            released: false,
        }
    }

    /// The lease's fence token.
    pub fn fence(&self) -> u64 {
        self.grant.fence
    }

    /// The leased path.
    pub fn resource(&self) -> &str {
        &self.grant.resource
    }

    /// `exclusive` or `subtree`.
    pub fn mode(&self) -> LeaseMode {
        self.grant.mode
    }

    /// The session holding the lease: a secret. Never log it.
    pub fn session_id(&self) -> &SessionId {
        &self.session.id
    }

    /// The holder name.
    pub fn holder(&self) -> &str {
        &self.grant.holder
    }

    /// The server's grant, as answered.
    pub fn grant(&self) -> &Grant {
        &self.grant
    }

    /// `{resource, token}`, as fenced writes carry it.
    pub fn fence_ref(&self) -> FenceRef {
        FenceRef {
            resource: self.grant.resource.clone(),
            token: self.grant.fence,
        }
    }

    /// True while the holder may act on the lease: before the G7 deadline of the last
    /// successful acquire or keepalive, before the max hold, and no `LEASE_LOST` seen. Once
    /// false, it stays false.
    pub fn is_valid(&self) -> bool {
        self.lost_reason().is_none()
    }

    /// The instant (a reading of [`Client::clock`]) until which the guard is valid, as far as
    /// the renewals so far go.
    pub fn valid_until(&self) -> Duration {
        let session_until = self.session.lock().valid_until;
        match self.max_hold_until {
            Some(max_hold_until) => session_until.min(max_hold_until),
            None => session_until,
        }
    }

    /// Why the guard is no longer valid, or `None` while it is.
    pub fn lost_reason(&self) -> Option<LostReason> {
        // Max hold first: a new session's first deadline is its lease's, which the max hold
        // caps, so both pass at the same instant and the real cause is the max hold.
        let now = self.session.client.clock().now();
        match self.max_hold_until {
            Some(max_hold_until) if now >= max_hold_until => Some(LostReason::MaxHoldReached),
            _ => self.session.lost_reason(),
        }
    }

    /// Resolves the moment the guard stops being valid (and at once if it already is not).
    /// Cancel-safe: drop it and call again at will.
    pub async fn lost(&self) -> LostReason {
        self.session.lost(self.max_hold_until).await
    }

    /// `Ok` while valid, else [`Error::Lost`] naming why.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] when the guard is no longer valid.
    pub fn ensure_valid(&self) -> Result<()> {
        match self.lost_reason() {
            None => Ok(()),
            Some(reason) => Err(Error::Lost {
                message: format!("the lease on {} is lost: {reason}", self.grant.resource),
            }),
        }
    }

    /// Releases the lease now; the resource is acquirable at once. A guard from
    /// [`Client::acquire`] ends its own session instead (which releases the lease too).
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] (or [`Error::NotFound`]) when the lease or session was already gone;
    /// transport errors as for every call (the lease then expires with its session).
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        if self.own_session {
            self.session.mark_lost(LostReason::Ended);
            self.session.client.end_session(&self.session.id).await?;
        } else {
            self.session
                .client
                .release(&self.session.id, &self.grant.resource)
                .await?;
        }
        Ok(())
    }
}

impl Drop for LeaseGuard {
    /// Best effort: releases the lease in the background when a Tokio runtime is running.
    /// (A guard that owns its session leaves that to the session's own drop.)
    fn drop(&mut self) {
        if self.released || self.own_session || self.session.lost_reason().is_some() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let client = self.session.client.clone();
        let session_id = self.session.id.clone();
        let resource = self.grant.resource.clone();
        runtime.spawn(async move {
            if let Err(error) = client.release(&session_id, &resource).await {
                tracing::debug!(%error, "best-effort release on drop failed");
            }
        });
    }
}

impl Shared {
    pub(crate) fn start(
        client: Client,
        id: SessionId,
        holder: String,
        ttl: Duration,
        owned: bool,
        valid_until: Duration,
    ) -> Arc<Shared> {
        let (changes, _) = watch::channel(());
        let shared = Arc::new(Shared {
            client,
            id,
            holder,
            ttl,
            owned,
            state: Mutex::new(State {
                valid_until,
                lost: None,
            }),
            changes,
            keepalive: Mutex::new(None),
        });
        let task = tokio::spawn(keepalive_loop(Arc::downgrade(&shared)));
        *shared
            .keepalive
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(task);
        shared
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The reason the session is lost, marking it lost (for good) when its deadline passed.
    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        let now = self.client.clock().now();
        let mut state = self.lock();
        if state.lost.is_none() && now >= state.valid_until {
            state.lost = Some(LostReason::Expired);
            drop(state);
            self.changes.send_replace(());
            return Some(LostReason::Expired);
        }
        state.lost.clone()
    }

    pub(crate) fn mark_lost(&self, reason: LostReason) {
        let mut state = self.lock();
        if state.lost.is_none() {
            state.lost = Some(reason);
        }
        drop(state);
        self.changes.send_replace(());
    }

    /// Moves the deadline forward after a successful acquire or keepalive whose first attempt
    /// was sent at `sent_at`. A session whose deadline already passed stays lost.
    pub(crate) fn record_renewal(&self, sent_at: Duration, expires_in_ms: u64) {
        let until = valid_until(sent_at, expires_in_ms, self.client.clock_rate_error());
        let now = self.client.clock().now();
        let mut state = self.lock();
        if state.lost.is_some() {
            return;
        }
        if now >= state.valid_until {
            state.lost = Some(LostReason::Expired);
        } else {
            state.valid_until = state.valid_until.max(until);
        }
        drop(state);
        self.changes.send_replace(());
    }

    async fn keepalive_once(&self, budget: Budget) -> Result<()> {
        match self.client.keepalive_within(&self.id, budget).await {
            Ok(answer) => {
                self.record_renewal(answer.sent_at, answer.value.expires_in_ms);
                match self.lost_reason() {
                    None => Ok(()),
                    Some(reason) => Err(Error::Lost {
                        message: format!("session is lost: {reason}"),
                    }),
                }
            }
            Err(Error::Lost { message } | Error::NotFound { message }) => {
                self.mark_lost(LostReason::Gone {
                    message: message.clone(),
                });
                Err(Error::Lost { message })
            }
            Err(error) => Err(error),
        }
    }

    /// Resolves when the session is lost or, with `max_hold_until`, when that passes.
    pub(crate) async fn lost(&self, max_hold_until: Option<Duration>) -> LostReason {
        let mut changes = self.changes.subscribe();
        loop {
            changes.borrow_and_update();
            // Max hold first, as in `LeaseGuard::lost_reason`.
            let now = self.client.clock().now();
            if max_hold_until.is_some_and(|until| now >= until) {
                return LostReason::MaxHoldReached;
            }
            if let Some(reason) = self.lost_reason() {
                return reason;
            }
            let session_until = self.lock().valid_until;
            let until = max_hold_until.map_or(session_until, |hold| hold.min(session_until));
            let pause = until.saturating_sub(now).min(LOST_POLL_MAX);
            tokio::select! {
                _ = changes.changed() => {}
                () = tokio::time::sleep(pause) => {}
            }
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(task) = self
            .keepalive
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
        {
            task.abort();
        }
        let lost = self
            .state
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .lost
            .clone();
        if !self.owned || matches!(lost, Some(LostReason::Ended | LostReason::Gone { .. })) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let client = self.client.clone();
        let id = self.id.clone();
        runtime.spawn(async move {
            if let Err(error) = client.end_session(&id).await {
                tracing::debug!(%error, "best-effort end of a dropped session failed");
            }
        });
    }
}

/// Renews the session every third of its TTL (measured from the previous renewal's send) until
/// it is lost or its last handle is dropped. A failed renewal is retried across nodes with a
/// growing pause until the local deadline; each attempt's timeout is a quarter of the TTL, so
/// a paused node cannot hold a renewal past the deadline.
async fn keepalive_loop(session: Weak<Shared>) {
    let (ttl, request_timeout) = match session.upgrade() {
        Some(shared) => (
            shared.ttl,
            shared
                .client
                .request_timeout()
                .min((shared.ttl / 4).max(KEEPALIVE_TIMEOUT_MIN)),
        ),
        None => return,
    };
    let interval = ttl / 3;
    let retry_max = (ttl / 10).max(KEEPALIVE_RETRY_INITIAL);
    let mut next = Instant::now() + interval;
    let mut retry = KEEPALIVE_RETRY_INITIAL;
    loop {
        tokio::time::sleep_until(next).await;
        let Some(shared) = session.upgrade() else {
            return;
        };
        let remaining = {
            let now = shared.client.clock().now();
            let state = shared.lock();
            if state.lost.is_some() {
                return;
            }
            state.valid_until.saturating_sub(now)
        };
        if remaining.is_zero() {
            shared.lost_reason();
            return;
        }
        let started = Instant::now();
        let budget = Budget {
            request_timeout,
            deadline: started + remaining,
        };
        match shared.keepalive_once(budget).await {
            Ok(()) => {
                retry = KEEPALIVE_RETRY_INITIAL;
                next = started + interval;
            }
            Err(Error::Lost { .. }) => return,
            Err(error) => {
                tracing::debug!(%error, "keepalive failed; retrying");
                if shared.lost_reason().is_some() {
                    return;
                }
                next = Instant::now() + retry;
                retry = (retry * 2).min(retry_max);
            }
        }
    }
}

/// Who the acquire is for.
enum Owner<'a> {
    Session(&'a SessionId),
    NewSession { holder: &'a str, ttl: Duration },
}

fn acquire_request(resource: &str, options: &AcquireOptions, owner: Owner<'_>) -> AcquireRequest {
    let (session_id, holder, ttl_ms) = match owner {
        Owner::Session(id) => (Some(id.clone()), None, None),
        Owner::NewSession { holder, ttl } => (None, Some(holder.to_owned()), Some(millis(ttl))),
    };
    AcquireRequest {
        resource: resource.to_owned(),
        session_id,
        holder,
        ttl_ms,
        mode: options.mode,
        limit: options.limit,
        max_hold_ms: options.max_hold.map(millis),
        labels: options.labels.clone(),
        reason: options.reason.clone(),
        wait_ms: None,
    }
}

/// The calls that take or hand out a [`LeaseGuard`]: they live with the guard, so that the
/// client's transport knows nothing of sessions.
impl Client {
    /// [`Client::acquire_raw`], retrying while `LEASE_HELD` for up to `wait` (a pause that
    /// grows, with jitter, and is cut short when the holder's lease is due to expire).
    ///
    /// # Errors
    ///
    /// As [`Client::acquire_raw`]; [`Error::Held`] once `wait` ran out.
    pub async fn acquire_raw_waiting(
        &self,
        request: &AcquireRequest,
        wait: Option<Duration>,
    ) -> Result<Answer<Grant>> {
        acquire_waiting(self, request, wait, std::future::pending())
            .await
            .map(granted)
    }

    /// [`Client::acquire_raw_waiting`] that gives up when `stop` resolves (a cancelled tool
    /// call): the session then leaves the line, or lets go of a grant that raced the stop (a
    /// session this acquire created is ended), and the answer is `Ok(None)`. A request already
    /// sent is never abandoned: its answer is awaited first (a waiter that left its line is
    /// answered at once), so nothing it did is left behind unseen.
    ///
    /// # Errors
    ///
    /// As [`Client::acquire_raw_waiting`]. After a stop, an error means leaving the line or
    /// letting go failed: what the acquire took may still be held.
    pub async fn acquire_raw_waiting_or_stop(
        &self,
        request: &AcquireRequest,
        wait: Option<Duration>,
        stop: impl Future<Output = ()>,
    ) -> Result<Option<Answer<Grant>>> {
        acquire_waiting(self, request, wait, stop).await
    }

    /// Acquires `resource` with a new session created in the same write (holder and TTL from
    /// this client and `options`), and returns a guard that keeps the session alive and
    /// ends it when released or dropped. A refused acquire creates no session.
    ///
    /// # Errors
    ///
    /// [`Error::Held`] when a conflicting lease is live (after `options.wait` ran out, if set);
    /// [`Error::InvalidArgument`] for a bad path or TTL; transport errors as for every call.
    pub async fn acquire(&self, resource: &str, options: AcquireOptions) -> Result<LeaseGuard> {
        acquire_with_new_session(self, resource, options).await
    }

    /// Whether the guard's fence is still the live fence of its resource, as the cluster sees
    /// it now.
    ///
    /// # Errors
    ///
    /// As [`Client::fence_check`].
    pub async fn check_fence(&self, guard: &LeaseGuard) -> Result<FenceCheckResponse> {
        self.fence_check(guard.resource(), guard.fence()).await
    }

    /// `PUT /v1/kv/{key}` fenced by `guard`: applied only if the guard's fence is the live
    /// fence of its resource, held by its session, when the write applies (docs/guarantees.md G4).
    ///
    /// # Errors
    ///
    /// [`Error::StaleFence`] when the fence is no longer live; [`Error::Lost`] without sending
    /// anything when the guard already knows it is no longer valid.
    pub async fn kv_put_fenced(
        &self,
        guard: &LeaseGuard,
        key: &str,
        value: Value,
    ) -> Result<KvPutResponse> {
        guard.ensure_valid()?;
        self.kv_put_request(
            key,
            &KvPutRequest {
                value,
                fence: Some(guard.fence_ref()),
                session_id: Some(guard.session_id().clone()),
            },
        )
        .await
    }

    /// `DELETE /v1/kv/{key}` fenced by `guard`.
    ///
    /// # Errors
    ///
    /// As [`Client::kv_put_fenced`].
    pub async fn kv_delete_fenced(
        &self,
        guard: &LeaseGuard,
        key: &str,
    ) -> Result<KvDeleteResponse> {
        guard.ensure_valid()?;
        self.kv_delete_request(
            key,
            &KvDeleteRequest {
                fence: Some(guard.fence_ref()),
                session_id: Some(guard.session_id().clone()),
            },
        )
        .await
    }
}

/// What a waiting acquire answers: granted (201), or still in line (202).
#[derive(Deserialize)]
#[serde(untagged)]
enum InLine {
    Queued(Queued),
    Granted(Grant),
}

/// Acquires, waiting up to `wait` in the resource's line when it is held: the server grants
/// it to the first waiter in the same write that frees it, so the answer comes as soon as the
/// resource is ours. Each round asks the server to hold the request for at most a third of
/// the session's TTL (and `WAIT_MS_MAX`), and renews the session between rounds. When `wait`
/// runs out the session leaves the line (a session this wait created is ended), and one last
/// plain acquire either takes the resource or reports who holds it.
///
/// When `stop` resolves, the session leaves the line at once (so the next waiter is served),
/// the round in flight is still awaited, and whatever it left (a place in the line, a grant
/// that raced the stop, a session this acquire created) is let go before `Ok(None)`. `stop` is
/// looked at only while a round waits in the line and between requests: a plain acquire runs
/// to its answer, then lets go of its grant if `stop` resolved meanwhile.
pub(crate) async fn acquire_waiting(
    client: &Client,
    request: &AcquireRequest,
    wait: Option<Duration>,
    stop: impl Future<Output = ()>,
) -> Result<Option<Answer<Grant>>> {
    let mut stop = pin!(stop);
    let mut stopped = false;
    let Some(wait) = wait else {
        return last_try(client, request, stop.as_mut(), &mut stopped).await;
    };
    let deadline = Instant::now() + wait;
    let ttl_ms = match (&request.session_id, request.ttl_ms) {
        (Some(session_id), _) => client.get_session(session_id).await?.ttl_ms,
        (None, Some(ttl_ms)) => ttl_ms,
        (None, None) => WAIT_MS_MAX,
    };
    let round_max = Duration::from_millis((ttl_ms / 3).clamp(1, WAIT_MS_MAX));
    let mut waiting = request.clone();
    // Whether the session in `waiting` was created by this wait (then it is ended, not only
    // taken out of the line).
    let mut created = false;
    loop {
        if has_stopped(stop.as_mut(), &mut stopped) {
            let_go(
                client,
                waiting.session_id.as_ref(),
                created,
                &request.resource,
            )
            .await?;
            return Ok(None);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let round = left.min(round_max);
        waiting.wait_ms = Some(millis(round));
        let answer = {
            let send = client.mutate_held::<_, InLine>(
                Method::POST,
                "/v1/leases".to_owned(),
                &waiting,
                round,
            );
            let mut send = pin!(send);
            tokio::select! {
                answer = &mut send => answer,
                () = stop.as_mut() => {
                    stopped = true;
                    // Out of the line now, so the next waiter is served at once; the server
                    // then answers this round LEASE_LOST, which is awaited here.
                    if let Some(session_id) = &waiting.session_id {
                        if let Err(error) = client.release(session_id, &request.resource).await {
                            tracing::debug!(%error, "leaving the line early failed; retried below");
                        }
                    }
                    send.await
                }
            }
        };
        if stopped {
            if let Ok(answer) = &answer {
                let (session_id, made) = match &answer.value {
                    InLine::Granted(grant) => {
                        (grant.session_id.clone(), waiting.session_id.is_none())
                    }
                    InLine::Queued(queued) => (queued.session_id.clone(), queued.session_created),
                };
                created |= made;
                waiting.session_id = Some(session_id);
            }
            let known = waiting.session_id.is_some();
            let_go(
                client,
                waiting.session_id.as_ref(),
                created,
                &request.resource,
            )
            .await?;
            return match answer {
                // Out of the line and holding nothing, whatever the round did.
                Ok(_) | Err(Error::Lost { .. }) => Ok(None),
                Err(_) if known => Ok(None),
                // A session this round was to create, of unknown id: it may hold the grant.
                Err(error) => Err(error),
            };
        }
        let answer = match answer {
            Err(Error::Lost { .. }) if created => {
                // The session this wait made for itself died between rounds (renewed too late,
                // as on a loaded machine): the place is lost, not the acquire. Join again.
                let_go(client, waiting.session_id.as_ref(), true, &request.resource).await?;
                waiting = request.clone();
                created = false;
                if Instant::now() < deadline {
                    continue;
                }
                return last_try(client, request, stop.as_mut(), &mut stopped).await;
            }
            answer => answer?,
        };
        let queued = match answer.value {
            InLine::Granted(grant) => {
                return Ok(Some(Answer {
                    value: grant,
                    sent_at: answer.sent_at,
                    replayed: answer.replayed,
                    leader: answer.leader,
                    cluster_time_ms: answer.cluster_time_ms,
                }))
            }
            InLine::Queued(queued) => queued,
        };
        created |= queued.session_created;
        // Later rounds keep the same place: the same session asks again.
        waiting.session_id = Some(queued.session_id.clone());
        waiting.holder = None;
        waiting.ttl_ms = None;
        if Instant::now() >= deadline {
            // Out of the line, or a grant that raced the deadline let go, before the last try.
            let_go(client, Some(&queued.session_id), created, &queued.resource).await?;
            return last_try(client, request, stop.as_mut(), &mut stopped).await;
        }
        match client.keepalive(&queued.session_id).await {
            Ok(_) => {}
            // Our own session, gone: the next round is refused and joins the line again (above).
            Err(Error::Lost { .. }) if created => {}
            Err(error) => return Err(error),
        }
    }
}

/// The plain acquire that ends a wait: the grant, or who holds the resource. A grant that
/// `stop` overtook is let go.
async fn last_try(
    client: &Client,
    request: &AcquireRequest,
    stop: Pin<&mut impl Future<Output = ()>>,
    stopped: &mut bool,
) -> Result<Option<Answer<Grant>>> {
    let answer = client.acquire_raw(request).await?;
    if has_stopped(stop, stopped) {
        let grant = &answer.value;
        let made = request.session_id.is_none();
        let_go(client, Some(&grant.session_id), made, &request.resource).await?;
        return Ok(None);
    }
    Ok(Some(answer))
}

/// Whether `stop` has resolved, looking at it once (and never again once it has).
fn has_stopped(stop: Pin<&mut impl Future<Output = ()>>, stopped: &mut bool) -> bool {
    if !*stopped && futures_util::FutureExt::now_or_never(stop).is_some() {
        *stopped = true;
    }
    *stopped
}

/// Takes `session_id` out of `resource`'s line or releases its grant there, or ends the
/// session when this acquire `created` it. Already gone counts as done.
async fn let_go(
    client: &Client,
    session_id: Option<&SessionId>,
    created: bool,
    resource: &str,
) -> Result<()> {
    let Some(session_id) = session_id else {
        return Ok(());
    };
    let done = if created {
        client.end_session(session_id).await.map(drop)
    } else {
        client.release(session_id, resource).await.map(drop)
    };
    match done {
        Ok(()) | Err(Error::NotFound { .. } | Error::Lost { .. }) => Ok(()),
        Err(error) => Err(error),
    }
}

/// The answer of a wait that cannot stop: a grant (or an error, returned before).
fn granted(answer: Option<Answer<Grant>>) -> Answer<Grant> {
    answer.expect("an acquire whose stop never resolves ends in a grant or an error")
}

/// [`Client::acquire`]: the lease and its own session in one write.
pub(crate) async fn acquire_with_new_session(
    client: &Client,
    resource: &str,
    options: AcquireOptions,
) -> Result<LeaseGuard> {
    let request = acquire_request(
        resource,
        &options,
        Owner::NewSession {
            holder: client.holder(),
            ttl: options.ttl,
        },
    );
    let answer =
        granted(acquire_waiting(client, &request, options.wait, std::future::pending()).await?);
    let grant = &answer.value;
    let shared = Shared::start(
        client.clone(),
        grant.session_id.clone(),
        grant.holder.clone(),
        options.ttl,
        true,
        valid_until(
            answer.sent_at,
            grant.expires_in_ms,
            client.clock_rate_error(),
        ),
    );
    Ok(LeaseGuard::new(shared, answer, options.max_hold, true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Labels;
    use crate::clock::{Clock, ManualClock};

    fn grant(expires_in_ms: u64, max_hold_ms: Option<u64>) -> Grant {
        Grant {
            limit: None,
            resource: "repo/a.rs".to_owned(),
            fence: 7,
            session_id: SessionId::new("0123456789abcdef0123456789abcdef"),
            holder: "agent-a".to_owned(),
            mode: LeaseMode::Exclusive,
            labels: Labels::new(),
            max_hold_ms,
            acquired_at: String::new(),
            expires_in_ms,
            expires_at: String::new(),
        }
    }

    /// A guard on a session whose endpoint nobody listens on: its keepalives fail, so only
    /// the first answer's deadline counts. The clock is driven by hand.
    fn guard_at(
        clock: &Arc<ManualClock>,
        sent_at_ms: u64,
        expires_in_ms: u64,
        max_hold_ms: Option<u64>,
    ) -> LeaseGuard {
        let client = Client::builder(["http://127.0.0.1:9"])
            .clock(Arc::clone(clock) as Arc<dyn crate::Clock>)
            .build()
            .expect("a client");
        let sent_at = Duration::from_millis(sent_at_ms);
        let answer = Answer {
            value: grant(expires_in_ms, max_hold_ms),
            sent_at,
            replayed: false,
            leader: None,
            cluster_time_ms: None,
        };
        let shared = Shared::start(
            client.clone(),
            answer.value.session_id.clone(),
            "agent-a".to_owned(),
            Duration::from_secs(3600),
            false,
            valid_until(sent_at, expires_in_ms, client.clock_rate_error()),
        );
        LeaseGuard::new(shared, answer, None, false)
    }

    #[tokio::test]
    async fn a_guard_is_valid_exactly_until_its_g7_deadline() {
        let clock = Arc::new(ManualClock::new());
        clock.set(Duration::from_millis(1_000));
        // Sent at 1,000 ms, 30 s granted: valid until 1,000 + 29,999 * 0.98 = 30,399.02 ms.
        let guard = guard_at(&clock, 1_000, 30_000, None);
        let deadline = Duration::from_nanos(30_399_020_000);
        assert_eq!(guard.valid_until(), deadline);
        clock.set(deadline - Duration::from_nanos(1));
        assert!(guard.is_valid());
        clock.set(deadline);
        assert!(!guard.is_valid());
        assert_eq!(guard.lost().await, LostReason::Expired);
        // A late renewal does not revive it.
        guard.session.record_renewal(deadline, 30_000);
        assert!(!guard.is_valid());
    }

    #[tokio::test]
    async fn the_max_hold_caps_validity_even_after_renewals() {
        let clock = Arc::new(ManualClock::new());
        let guard = guard_at(&clock, 0, 10_000, Some(15_000));
        // 14,999 * 0.98 = 14,699.02 ms.
        let max_hold = Duration::from_nanos(14_699_020_000);
        clock.set(Duration::from_millis(5_000));
        guard
            .session
            .record_renewal(Duration::from_millis(5_000), 10_000);
        clock.set(Duration::from_millis(10_000));
        guard
            .session
            .record_renewal(Duration::from_millis(10_000), 10_000);
        assert_eq!(guard.valid_until(), max_hold);
        clock.set(max_hold - Duration::from_nanos(1));
        assert!(guard.is_valid());
        clock.set(max_hold);
        assert_eq!(guard.lost_reason(), Some(LostReason::MaxHoldReached));
        assert_eq!(guard.lost().await, LostReason::MaxHoldReached);
    }

    #[tokio::test]
    async fn a_first_deadline_capped_by_the_max_hold_is_lost_to_the_max_hold() {
        // The server caps a new lease's `expires_in_ms` at its max hold: the session's first
        // deadline and the max hold pass together, and the cause is the max hold.
        let clock = Arc::new(ManualClock::new());
        let guard = guard_at(&clock, 0, 1_000, Some(1_000));
        clock.set(Duration::from_millis(1_000));
        assert_eq!(guard.lost_reason(), Some(LostReason::MaxHoldReached));
        assert_eq!(guard.lost().await, LostReason::MaxHoldReached);
        assert_eq!(LostReason::MaxHoldReached.to_string(), "max hold reached");
    }

    #[tokio::test]
    async fn lost_resolves_when_the_clock_reaches_the_deadline() {
        let clock = Arc::new(ManualClock::new());
        let guard = guard_at(&clock, 0, 1_000, None);
        let waiter = async { guard.lost().await };
        let mover = async {
            clock.set(Duration::from_millis(500));
            tokio::task::yield_now().await;
            clock.set(Duration::from_millis(979));
            tokio::time::sleep(Duration::from_millis(60)).await;
            clock.set(Duration::from_millis(980));
        };
        let (reason, ()) = tokio::join!(waiter, mover);
        assert_eq!(reason, LostReason::Expired);
        assert!(clock.now() >= Duration::from_millis(980));
    }

    #[tokio::test]
    async fn a_server_lease_lost_ends_validity_at_once() {
        let clock = Arc::new(ManualClock::new());
        let guard = guard_at(&clock, 0, 30_000, None);
        guard.session.mark_lost(LostReason::Gone {
            message: "session is gone".to_owned(),
        });
        assert!(!guard.is_valid());
        assert!(matches!(guard.lost().await, LostReason::Gone { .. }));
        assert!(matches!(guard.ensure_valid(), Err(Error::Lost { .. })));
    }
}
