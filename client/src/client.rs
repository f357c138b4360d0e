//! [`Client`]: one call per route of docs/api.md, sent to a list of endpoints with bounded,
//! safe retries.
//!
//! What lives here: endpoint choice (prefer the node last named in `Baton-Leader`, rotate when
//! one is down), the retry loop with exponential backoff and jitter, idempotency keys (one per
//! logical operation, reused by every retry of it), and the classification of every failure
//! as "definitely not applied" or "outcome unknown". What must never live here: lease validity
//! and background keepalives (`session.rs`), and any retry of a mutation without its
//! idempotency key.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tokio::time::Instant;

use crate::api::{
    AcquireRequest, AddMemberRequest, Applied, ClusterStatus, CreateSessionRequest,
    CreateSessionResponse, CreateTokenRequest, CreatedToken, EndSessionResponse, FenceCheckRequest,
    FenceCheckResponse, Grant, KeepaliveResponse, KvDeleteRequest, KvDeleteResponse, KvEntry,
    KvPutRequest, KvPutResponse, Labels, Lease, LeaseList, ListLeasesQuery, Problem,
    ReleaseRequest, ReleaseResponse, RevokedToken, SessionId, SessionInfo, TokenList, TxnRequest,
    TxnResponse, DEFAULT_NAMESPACE, HEADER_CLUSTER_TIME, HEADER_IDEMPOTENCY_KEY,
    HEADER_IDEMPOTENT_REPLAYED, HEADER_LEADER, HEADER_NAMESPACE,
};
use crate::clock::{rate_error_ppm, Clock, SystemClock, CLOCK_RATE_ERROR_DEFAULT};
use crate::error::{Error, Result};

/// Default per-request timeout.
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Default number of attempts of one logical operation (the first one included).
pub const ATTEMPTS_MAX_DEFAULT: u32 = 8;
/// Default time budget of one logical operation, all attempts and backoffs included.
pub const RETRY_BUDGET_DEFAULT: Duration = Duration::from_secs(15);
/// First backoff between two attempts; it doubles up to [`BACKOFF_MAX`], with full jitter.
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(50);
/// Longest backoff between two attempts.
pub const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Longest answer body the client reads (the server's own body limit is 1 MiB; a lease list
/// page of 1,000 leases stays well below this).
pub const ANSWER_BYTES_MAX: usize = 8 << 20;
/// How often the client may ask `/v1/cluster` which endpoint a new leader is.
const LEARN_MEMBERS_INTERVAL: Duration = Duration::from_secs(5);
/// Longest wait a server's `Retry-After` may impose on one retry.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(2);

/// A handle on a Baton cluster: a list of endpoints, a namespace, a holder name, timeouts and
/// a retry budget. Cheap to clone; clones share connections and the leader hint.
///
/// Every method is one logical operation. It is sent to the endpoint believed to be the leader
/// (any node answers any request; a follower forwards), and retried on another endpoint while
/// that is safe: always when the request surely did not reach a leader (connection refused,
/// `NO_LEADER`, `RESOURCE_EXHAUSTED`), and after a timeout or `OUTCOME_UNKNOWN` only because
/// every mutation carries an `Idempotency-Key` made once for the operation and reused by each
/// retry, so it is applied at most once (docs/guarantees.md G8).
///
/// ```no_run
/// # async fn example() -> Result<(), baton_client::Error> {
/// use std::time::Duration;
/// use baton_client::{AcquireOptions, Client};
///
/// let client = Client::builder(["http://127.0.0.1:7420"])
///     .holder("agent-a")
///     .request_timeout(Duration::from_secs(2))
///     .build()?;
/// let guard = client.acquire("repo/src/auth.rs", AcquireOptions::new()).await?;
/// println!("fence {}", guard.fence());
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    endpoints: Vec<Endpoint>,
    namespace: Option<String>,
    holder: String,
    /// Sent as `Authorization: Bearer <token>` (docs/api.md, "Security").
    token: Option<Token>,
    request_timeout: Duration,
    attempts_max: u32,
    retry_budget: Duration,
    clock: Arc<dyn Clock>,
    clock_rate_error: f64,
    /// The endpoint to try first: the last one that answered, or the leader's once known.
    preferred: AtomicUsize,
    /// Node id → endpoint index, learned from `GET /v1/cluster`.
    leaders: Mutex<HashMap<u64, usize>>,
    /// When the member addresses were last asked for, so they are asked at most every
    /// [`LEARN_MEMBERS_INTERVAL`].
    learned_at: Mutex<Option<Instant>>,
}

#[derive(Debug, Clone)]
struct Endpoint {
    /// `http://host:port`, no trailing slash.
    base: String,
    /// `host:port`, as `/v1/cluster` lists members' `api_addr`.
    authority: String,
}

impl fmt::Debug for Client {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("Client")
            .field("endpoints", &self.inner.endpoints)
            .field("namespace", &self.inner.namespace)
            .field("holder", &self.inner.holder)
            .field("request_timeout", &self.inner.request_timeout)
            .field("attempts_max", &self.inner.attempts_max)
            .field("retry_budget", &self.inner.retry_budget)
            .finish_non_exhaustive()
    }
}

/// A bearer token: a secret, so its `Debug` never shows it.
#[derive(Clone)]
struct Token(String);

impl fmt::Debug for Token {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("Token(..)")
    }
}

/// Builds a [`Client`]; see [`Client::builder`].
#[derive(Debug)]
pub struct ClientBuilder {
    endpoints: Vec<String>,
    namespace: Option<String>,
    holder: Option<String>,
    token: Option<Token>,
    /// PEM CA certificates trusted for `https://` endpoints, besides the system's.
    ca_pem: Option<Vec<u8>>,
    request_timeout: Duration,
    attempts_max: u32,
    retry_budget: Duration,
    clock: Arc<dyn Clock>,
    clock_rate_error: f64,
}

impl ClientBuilder {
    /// Trusts the CA certificates in `pem` (PEM, one or more) for `https://` endpoints, besides
    /// the system's roots: for a cluster whose certificates a private CA signed.
    pub fn ca_certificates(mut self, pem: impl Into<Vec<u8>>) -> ClientBuilder {
        self.ca_pem = Some(pem.into());
        self
    }

    /// The namespace of every request (header `Baton-Namespace`); `default` when unset.
    pub fn namespace(mut self, namespace: impl Into<String>) -> ClientBuilder {
        self.namespace = Some(namespace.into());
        self
    }

    /// The holder name of sessions this client creates; default `user@host`.
    pub fn holder(mut self, holder: impl Into<String>) -> ClientBuilder {
        self.holder = Some(holder.into());
        self
    }

    /// The bearer token of every request (`Authorization: Bearer <token>`, docs/api.md, "Security");
    /// none by default.
    pub fn token(mut self, token: impl Into<String>) -> ClientBuilder {
        self.token = Some(Token(token.into()));
        self
    }

    /// The timeout of one attempt (connect, send, answer). Default 5 s.
    pub fn request_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.request_timeout = timeout;
        self
    }

    /// How many attempts one operation may make (at least 1). Default 8.
    pub fn attempts_max(mut self, attempts: u32) -> ClientBuilder {
        self.attempts_max = attempts.max(1);
        self
    }

    /// How long one operation may take, all attempts and backoffs included. Default 15 s.
    pub fn retry_budget(mut self, budget: Duration) -> ClientBuilder {
        self.retry_budget = budget;
        self
    }

    /// The monotonic clock lease guards measure their validity with (docs/guarantees.md G7); the system's
    /// by default. Tests inject a skewed or manual one.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> ClientBuilder {
        self.clock = clock;
        self
    }

    /// The assumed rate error of monotonic clocks (docs/guarantees.md G6), default 0.01. Must match the
    /// cluster's `clock_rate_error` or exceed it.
    pub fn clock_rate_error(mut self, rate_error: f64) -> ClientBuilder {
        self.clock_rate_error = rate_error;
        self
    }

    /// The client.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when there is no endpoint, an endpoint is not
    /// `http://host:port`, `https://host:port` (or `host:port`), the CA certificates are not
    /// PEM, or the clock rate error is not in `0.0..0.5`.
    pub fn build(self) -> Result<Client> {
        if self.endpoints.is_empty() {
            return Err(invalid("give at least one endpoint"));
        }
        if !(0.0..0.5).contains(&self.clock_rate_error) {
            return Err(invalid(format!(
                "clock_rate_error must be in 0.0..0.5, not {}",
                self.clock_rate_error
            )));
        }
        rate_error_ppm(self.clock_rate_error);
        let endpoints = self
            .endpoints
            .iter()
            .map(|text| parse_endpoint(text))
            .collect::<Result<Vec<_>>>()?;
        let mut http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(self.request_timeout.min(Duration::from_secs(2)))
            .pool_idle_timeout(Duration::from_secs(30));
        if let Some(pem) = &self.ca_pem {
            let certificates = reqwest::Certificate::from_pem_bundle(pem)
                .ok()
                .filter(|certificates| !certificates.is_empty())
                .ok_or_else(|| invalid("the CA file holds no PEM certificate"))?;
            for certificate in certificates {
                http = http.add_root_certificate(certificate);
            }
        }
        if !endpoints
            .iter()
            .any(|endpoint| endpoint.base.starts_with("https://"))
        {
            // Plain HTTP only: no system roots to load. The platform verifier reads every file
            // under /etc/ssl/certs when the client is built, a few milliseconds of CPU that a
            // process per call (the Claude Code hook) pays every time.
            http = http.tls_certs_only([]);
        }
        let http = http
            .build()
            .map_err(|error| invalid(format!("cannot build an HTTP client: {error}")))?;
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                endpoints,
                namespace: self.namespace,
                holder: self.holder.unwrap_or_else(default_holder),
                token: self.token,
                request_timeout: self.request_timeout,
                attempts_max: self.attempts_max,
                retry_budget: self.retry_budget,
                clock: self.clock,
                clock_rate_error: self.clock_rate_error,
                preferred: AtomicUsize::new(0),
                leaders: Mutex::new(HashMap::new()),
                learned_at: Mutex::new(None),
            }),
        })
    }
}

/// A successful answer with what G7 and G8 need to know about it.
#[derive(Debug, Clone)]
pub struct Answer<T> {
    /// The parsed answer body.
    pub value: T,
    /// Local clock reading when the operation's first attempt was sent (G7's `t0`).
    pub sent_at: Duration,
    /// True when the server replayed a recorded answer (`Idempotent-Replayed: true`).
    pub replayed: bool,
    /// `Baton-Leader` of the answer.
    pub leader: Option<u64>,
    /// `Baton-Cluster-Time` of the answer.
    pub cluster_time_ms: Option<u64>,
}

/// How one operation is sent: its own timeout and budget may be shorter than the client's
/// (a keepalive must not outlive its lease).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    pub(crate) request_timeout: Duration,
    pub(crate) deadline: Instant,
}

/// One logical operation: the same method, path, body and idempotency key on every attempt.
struct Operation {
    method: Method,
    path: String,
    body: Option<Vec<u8>>,
    /// `Some` for every mutation.
    idempotency_key: Option<String>,
}

/// What one attempt to open a stream came to ([`Client::open_stream`]).
pub(crate) enum StreamOpen {
    /// The stream is open; its body is unread.
    Open(Box<reqwest::Response>),
    /// Not open, and worth another attempt (on the next endpoint), after the pause if given.
    Retry(Error, Option<Duration>),
    /// A definite refusal (`NOT_FOUND` for a revision older than the kept window, a bad
    /// query): another attempt would get the same.
    Refused(Error),
}

/// What one attempt came to.
enum Attempt {
    Answered(Box<reqwest::Response>),
    /// A definite answer that settles the operation: a refusal.
    Refused(Error),
    /// Surely not applied: the connection was refused, or the server said so.
    NotApplied(Error, Option<Duration>),
    /// Maybe applied: the request may have reached a leader.
    Unknown(Error),
}

impl Client {
    /// A client with default settings for these endpoints (`http://host:port` or
    /// `host:port`).
    ///
    /// # Errors
    ///
    /// As [`ClientBuilder::build`].
    pub fn new<I, S>(endpoints: I) -> Result<Client>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Client::builder(endpoints).build()
    }

    /// A builder for these endpoints.
    pub fn builder<I, S>(endpoints: I) -> ClientBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ClientBuilder {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            namespace: None,
            holder: None,
            token: None,
            ca_pem: None,
            request_timeout: REQUEST_TIMEOUT_DEFAULT,
            attempts_max: ATTEMPTS_MAX_DEFAULT,
            retry_budget: RETRY_BUDGET_DEFAULT,
            clock: Arc::new(SystemClock::new()),
            clock_rate_error: CLOCK_RATE_ERROR_DEFAULT,
        }
    }

    /// The holder name of the sessions this client creates.
    pub fn holder(&self) -> &str {
        &self.inner.holder
    }

    /// The namespace of every request.
    pub fn namespace(&self) -> &str {
        self.inner.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE)
    }

    /// The guard clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// The assumed clock rate error.
    pub fn clock_rate_error(&self) -> f64 {
        self.inner.clock_rate_error
    }

    /// The default per-request timeout.
    pub fn request_timeout(&self) -> Duration {
        self.inner.request_timeout
    }

    /// The time budget of one operation, all attempts included; also how long an event
    /// stream keeps trying to reconnect before it gives up.
    pub fn retry_budget(&self) -> Duration {
        self.inner.retry_budget
    }

    // -----------------------------------------------------------------------------------------
    // Sessions
    // -----------------------------------------------------------------------------------------

    /// `POST /v1/sessions`: a bare session record. Most callers want
    /// [`Client::session`], which also keeps it alive.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a TTL out of limits; transport errors as for every call.
    pub async fn create_session_raw(
        &self,
        ttl: Duration,
        labels: Labels,
    ) -> Result<Answer<CreateSessionResponse>> {
        let body = CreateSessionRequest {
            holder: self.inner.holder.clone(),
            ttl_ms: millis(ttl),
            labels,
        };
        self.mutate(Method::POST, "/v1/sessions".to_owned(), Some(&body))
            .await
    }

    /// `POST /v1/sessions/{id}/keepalive`: renews the session and every lease it holds.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] when the session is gone.
    pub async fn keepalive(&self, session_id: &SessionId) -> Result<Answer<KeepaliveResponse>> {
        self.keepalive_within(session_id, self.default_budget())
            .await
    }

    pub(crate) async fn keepalive_within(
        &self,
        session_id: &SessionId,
        budget: Budget,
    ) -> Result<Answer<KeepaliveResponse>> {
        let path = format!(
            "/v1/sessions/{}/keepalive",
            encode_name(session_id.as_str())?
        );
        self.execute(
            Operation {
                method: Method::POST,
                path,
                body: None,
                idempotency_key: Some(idempotency_key()),
            },
            budget,
        )
        .await
    }

    /// `POST /v1/sessions/{id}/release`: frees one resource of the session at once.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] when the session is gone; [`Error::NotFound`] when it holds no lease
    /// on that resource.
    pub async fn release(&self, session_id: &SessionId, resource: &str) -> Result<ReleaseResponse> {
        let path = format!("/v1/sessions/{}/release", encode_name(session_id.as_str())?);
        let body = ReleaseRequest {
            resource: resource.to_owned(),
        };
        Ok(self.mutate(Method::POST, path, Some(&body)).await?.value)
    }

    /// `GET /v1/sessions/{id}`: the session and its leases.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] when the session is gone.
    pub async fn get_session(&self, session_id: &SessionId) -> Result<SessionInfo> {
        let path = format!("/v1/sessions/{}", encode_name(session_id.as_str())?);
        self.read(Method::GET, path, None::<&()>).await
    }

    /// `DELETE /v1/sessions/{id}`: ends the session, releasing everything it holds.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] (or [`Error::Lost`]) when the session is already gone.
    pub async fn end_session(&self, session_id: &SessionId) -> Result<EndSessionResponse> {
        let path = format!("/v1/sessions/{}", encode_name(session_id.as_str())?);
        Ok(self.mutate(Method::DELETE, path, None::<&()>).await?.value)
    }

    // -----------------------------------------------------------------------------------------
    // Leases and fences
    // -----------------------------------------------------------------------------------------

    /// `POST /v1/leases` with any body: one grant, no guard. Most callers want
    /// [`Client::acquire`] or [`crate::Session::acquire`].
    ///
    /// # Errors
    ///
    /// [`Error::Held`] when a conflicting lease is live; [`Error::Lost`] when the named session
    /// is gone; [`Error::InvalidArgument`] for a bad body.
    pub async fn acquire_raw(&self, request: &AcquireRequest) -> Result<Answer<Grant>> {
        self.mutate(Method::POST, "/v1/leases".to_owned(), Some(request))
            .await
    }

    /// [`Client::acquire_raw`] with a caller-chosen idempotency key: for callers (like the
    /// Jepsen harness) that retry an operation themselves across client instances.
    ///
    /// # Errors
    ///
    /// As [`Client::acquire_raw`], plus [`Error::IdempotencyKeyReused`].
    pub async fn acquire_raw_with_key(
        &self,
        request: &AcquireRequest,
        idempotency_key: &str,
    ) -> Result<Answer<Grant>> {
        self.mutate_with_key(
            Method::POST,
            "/v1/leases".to_owned(),
            request,
            idempotency_key,
        )
        .await
    }

    /// `GET /v1/leases/{resource}`: the live lease on exactly that path.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] when no lease is live on it.
    pub async fn get_lease(&self, resource: &str) -> Result<Lease> {
        let path = format!("/v1/leases/{}", encode_path(resource)?);
        self.read(Method::GET, path, None::<&()>).await
    }

    /// `GET /v1/leases?prefix=&limit=&cursor=`: one page of live leases.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad prefix, limit or cursor.
    pub async fn list_leases(&self, query: &ListLeasesQuery) -> Result<LeaseList> {
        let mut parameters = Vec::new();
        if let Some(prefix) = &query.prefix {
            parameters.push(format!("prefix={}", encode(prefix)));
        }
        if let Some(limit) = query.limit {
            parameters.push(format!("limit={limit}"));
        }
        if let Some(cursor) = &query.cursor {
            parameters.push(format!("cursor={}", encode(cursor)));
        }
        let mut path = "/v1/leases".to_owned();
        if !parameters.is_empty() {
            path.push('?');
            path.push_str(&parameters.join("&"));
        }
        self.read(Method::GET, path, None::<&()>).await
    }

    /// `POST /v1/fence/check`: whether `token` is the live fence of `resource`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad path.
    pub async fn fence_check(&self, resource: &str, token: u64) -> Result<FenceCheckResponse> {
        let body = FenceCheckRequest {
            resource: resource.to_owned(),
            fence: token,
        };
        self.read(Method::POST, "/v1/fence/check".to_owned(), Some(&body))
            .await
    }

    // -----------------------------------------------------------------------------------------
    // Fenced key-value store
    // -----------------------------------------------------------------------------------------

    /// `GET /v1/kv/{key}`.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] when the key has no value.
    pub async fn kv_get(&self, key: &str) -> Result<KvEntry> {
        let path = format!("/v1/kv/{}", encode_path(key)?);
        self.read(Method::GET, path, None::<&()>).await
    }

    /// `PUT /v1/kv/{key}` without a fence: an unconditional write.
    ///
    /// # Errors
    ///
    /// [`Error::PayloadTooLarge`] for a value over 256 KiB; [`Error::InvalidArgument`] for a
    /// bad key.
    pub async fn kv_put(&self, key: &str, value: Value) -> Result<KvPutResponse> {
        self.kv_put_request(
            key,
            &KvPutRequest {
                value,
                fence: None,
                session_id: None,
            },
        )
        .await
    }

    /// `PUT /v1/kv/{key}` with any body (for callers holding a fence without a guard).
    ///
    /// # Errors
    ///
    /// As [`Client::kv_put_fenced`].
    pub async fn kv_put_request(&self, key: &str, request: &KvPutRequest) -> Result<KvPutResponse> {
        let path = format!("/v1/kv/{}", encode_path(key)?);
        Ok(self.mutate(Method::PUT, path, Some(request)).await?.value)
    }

    /// `DELETE /v1/kv/{key}` without a fence.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad key.
    pub async fn kv_delete(&self, key: &str) -> Result<KvDeleteResponse> {
        self.kv_delete_request(key, &KvDeleteRequest::default())
            .await
    }

    /// `DELETE /v1/kv/{key}` with any body.
    ///
    /// # Errors
    ///
    /// As [`Client::kv_put_fenced`].
    pub async fn kv_delete_request(
        &self,
        key: &str,
        request: &KvDeleteRequest,
    ) -> Result<KvDeleteResponse> {
        let path = format!("/v1/kv/{}", encode_path(key)?);
        Ok(self
            .mutate(Method::DELETE, path, Some(request))
            .await?
            .value)
    }

    // -----------------------------------------------------------------------------------------
    // Transactions
    // -----------------------------------------------------------------------------------------

    /// `POST /v1/txn`: if every compare holds, the `success` ops, else the `failure` ops, all
    /// applied in one write or none (the outbox: complete a task, enqueue its follow-ups,
    /// record the result and release the lease at once). Retried with one idempotency key, so
    /// it applies at most once.
    ///
    /// ```no_run
    /// # async fn example(client: baton_client::Client, session: baton_client::api::SessionId) -> Result<(), baton_client::Error> {
    /// use baton_client::api::{TxnCompare, TxnOp, TxnRequest};
    /// use serde_json::json;
    ///
    /// let done = client
    ///     .txn(&TxnRequest {
    ///         session_id: Some(session),
    ///         compare: vec![TxnCompare::fence("repo/src/auth.rs", 41)],
    ///         success: vec![
    ///             TxnOp::Put { key: "results/auth".to_owned(), value: json!({"ok": true}) },
    ///             TxnOp::Release { resource: "repo/src/auth.rs".to_owned() },
    ///         ],
    ///         failure: vec![],
    ///     })
    ///     .await?;
    /// assert!(done.succeeded, "the fence was no longer live: nothing was written");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The code of the first op that would be refused ([`Error::StaleFence`] for a fence that is
    /// not live, [`Error::Lost`] for a release of a lease the session does not hold,
    /// [`Error::InvalidArgument`] for over 64 ops or a key, resource or task named twice, ...):
    /// then nothing was applied.
    pub async fn txn(&self, request: &TxnRequest) -> Result<TxnResponse> {
        Ok(self
            .mutate(Method::POST, "/v1/txn".to_owned(), Some(request))
            .await?
            .value)
    }

    // -----------------------------------------------------------------------------------------
    // Cluster
    // -----------------------------------------------------------------------------------------

    /// `GET /v1/cluster` of the first endpoint that answers (each node describes itself).
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] when no endpoint answers.
    pub async fn cluster_status(&self) -> Result<ClusterStatus> {
        self.read(Method::GET, "/v1/cluster".to_owned(), None::<&()>)
            .await
    }

    /// `GET /v1/snapshot` (admin): a backup of the whole replicated state, streamed into `out`
    /// as it arrives (docs/operations.md). Returns the number of bytes written. The bytes are
    /// not checked here: check the whole file with [`baton_api::decode_backup`].
    ///
    /// # Errors
    ///
    /// [`Error::Denied`] without an admin token; [`Error::Indeterminate`] when the
    /// answer broke off or `out` refused a write (a read: nothing changed anywhere).
    pub async fn save_snapshot<W>(&self, out: &mut W) -> Result<u64>
    where
        W: tokio::io::AsyncWrite + Unpin,
    {
        use tokio::io::AsyncWriteExt;
        let operation = Operation {
            method: Method::GET,
            path: "/v1/snapshot".to_owned(),
            body: None,
            idempotency_key: None,
        };
        let (mut response, _) = self.send(&operation, self.default_budget()).await?;
        let broke = |message: String| Error::Indeterminate {
            code: None,
            message,
        };
        let mut written = 0_u64;
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    out.write_all(&chunk)
                        .await
                        .map_err(|error| broke(format!("writing the backup failed: {error}")))?;
                    written += chunk.len() as u64;
                }
                Ok(None) => break,
                Err(error) => {
                    return Err(broke(format!(
                        "the backup broke off after {written} bytes: {}",
                        describe(&error)
                    )))
                }
            }
        }
        out.flush()
            .await
            .map_err(|error| broke(format!("writing the backup failed: {error}")))?;
        Ok(written)
    }

    /// `POST /v1/cluster/members`: adds a node as a learner and, if `voter`, promotes it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad member.
    pub async fn add_member(&self, request: &AddMemberRequest) -> Result<Value> {
        Ok(self
            .mutate(
                Method::POST,
                "/v1/cluster/members".to_owned(),
                Some(request),
            )
            .await?
            .value)
    }

    /// `DELETE /v1/cluster/members/{id}`.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] when there is no such member.
    pub async fn remove_member(&self, id: u64) -> Result<Value> {
        let path = format!("/v1/cluster/members/{id}");
        Ok(self.mutate(Method::DELETE, path, None::<&()>).await?.value)
    }

    /// `POST /v1/auth/tokens` (admin): a new token and its secret, shown this once.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad or taken name or namespace; an auth error without
    /// an admin token.
    pub async fn create_token(&self, request: &CreateTokenRequest) -> Result<CreatedToken> {
        Ok(self
            .mutate(Method::POST, "/v1/auth/tokens".to_owned(), Some(request))
            .await?
            .value)
    }

    /// `GET /v1/auth/tokens` (admin): every token, never a secret.
    pub async fn list_tokens(&self) -> Result<TokenList> {
        self.read(Method::GET, "/v1/auth/tokens".to_owned(), None::<&()>)
            .await
    }

    /// `DELETE /v1/auth/tokens/{name}` (admin): refused cluster-wide from its entry on.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] when no token has that name.
    pub async fn revoke_token(&self, name: &str) -> Result<RevokedToken> {
        let path = format!("/v1/auth/tokens/{}", encode_name(name)?);
        Ok(self.mutate(Method::DELETE, path, None::<&()>).await?.value)
    }

    /// `GET /v1/limits`: every limit the cluster decides with, by name.
    pub async fn limits(&self) -> Result<Value> {
        self.read(Method::GET, "/v1/limits".to_owned(), None::<&()>)
            .await
    }

    /// `PUT /v1/limits` (admin): changes the named limits; answers every limit after.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an unknown limit or a set that contradicts itself.
    pub async fn set_limits(&self, changes: &serde_json::Map<String, Value>) -> Result<Value> {
        Ok(self
            .mutate(Method::PUT, "/v1/limits".to_owned(), Some(changes))
            .await?
            .value)
    }

    // -----------------------------------------------------------------------------------------
    // Streams
    // -----------------------------------------------------------------------------------------

    /// Makes the endpoint after the preferred one preferred: the next call or stream goes to
    /// another node (a stream its node cut off for want of a leader resumes elsewhere).
    pub(crate) fn prefer_next_endpoint(&self) {
        let endpoints = self.inner.endpoints.len();
        let index = self.inner.preferred.load(Ordering::Relaxed) % endpoints;
        self.inner
            .preferred
            .store((index + 1) % endpoints, Ordering::Relaxed);
    }

    /// One attempt to open a streaming `GET` (the event stream) on the preferred endpoint,
    /// with `headers` added. On success the answer's body is left unread, for the caller to
    /// read chunk by chunk without a whole-answer timeout (only sending and the answer's head
    /// are bounded by the request timeout). After a failure the next endpoint becomes the
    /// preferred one, so the caller's next attempt goes to another node.
    pub(crate) async fn open_stream(&self, path: &str, headers: &[(&str, String)]) -> StreamOpen {
        let endpoints = self.inner.endpoints.len();
        let index = self.inner.preferred.load(Ordering::Relaxed) % endpoints;
        let endpoint = &self.inner.endpoints[index];
        let rotate = || {
            self.inner
                .preferred
                .store((index + 1) % endpoints, Ordering::Relaxed);
        };
        let mut request = self
            .inner
            .http
            .get(format!("{}{}", endpoint.base, path))
            .header(reqwest::header::ACCEPT, "text/event-stream");
        if let Some(namespace) = &self.inner.namespace {
            request = request.header(HEADER_NAMESPACE, namespace);
        }
        if let Some(token) = &self.inner.token {
            request = request.bearer_auth(&token.0);
        }
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let unavailable = |message: String| Error::Unavailable {
            code: None,
            message: format!("{}: {message}", endpoint.base),
        };
        let response = match tokio::time::timeout(self.inner.request_timeout, request.send()).await
        {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => {
                if let Some(tls) = Error::from_tls(&error) {
                    return StreamOpen::Refused(tls);
                }
                rotate();
                return StreamOpen::Retry(unavailable(describe(&error)), None);
            }
            Err(_) => {
                rotate();
                let timeout = self.inner.request_timeout;
                return StreamOpen::Retry(
                    unavailable(format!("no answer within {timeout:?}")),
                    None,
                );
            }
        };
        let preferred = self.learn_leader(&response, endpoint).unwrap_or(index);
        self.inner.preferred.store(preferred, Ordering::Relaxed);
        let status = response.status();
        if status.is_success() {
            return StreamOpen::Open(Box::new(response));
        }
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let bytes =
            match tokio::time::timeout(self.inner.request_timeout, read_body(response)).await {
                Ok(Ok(bytes)) => bytes,
                Ok(Err(message)) => {
                    rotate();
                    return StreamOpen::Retry(unavailable(message), None);
                }
                Err(_) => {
                    rotate();
                    return StreamOpen::Retry(
                        unavailable("the refusal was not read in time".into()),
                        None,
                    );
                }
            };
        match serde_json::from_slice::<Problem>(&bytes) {
            Ok(problem) => {
                let retry_after = problem
                    .retry_after_ms
                    .map(Duration::from_millis)
                    .or(retry_after)
                    .map(|wait| wait.min(RETRY_AFTER_MAX));
                let retryable = problem.code.is_indeterminate() || problem.code.is_retryable();
                let error = Error::from_problem(problem);
                if retryable {
                    rotate();
                    StreamOpen::Retry(error, retry_after)
                } else {
                    StreamOpen::Refused(error)
                }
            }
            Err(_) => {
                let message = format!(
                    "HTTP {status} without a problem body: {}",
                    String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
                );
                if status.is_server_error() {
                    rotate();
                    StreamOpen::Retry(unavailable(message), retry_after)
                } else {
                    StreamOpen::Refused(invalid(message))
                }
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // The retry loop
    // -----------------------------------------------------------------------------------------

    pub(crate) fn default_budget(&self) -> Budget {
        Budget {
            request_timeout: self.inner.request_timeout,
            deadline: Instant::now() + self.inner.retry_budget,
        }
    }

    /// A mutation: a fresh idempotency key, reused by every retry.
    pub(crate) async fn mutate<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: String,
        body: Option<&B>,
    ) -> Result<Answer<T>> {
        let body = body
            .map(serde_json::to_vec)
            .transpose()
            .map_err(|error| invalid(error.to_string()))?;
        self.execute(
            Operation {
                method,
                path,
                body,
                idempotency_key: Some(idempotency_key()),
            },
            self.default_budget(),
        )
        .await
    }

    /// A mutation with a caller-chosen idempotency key, so that the caller can send it again
    /// later and learn what the first one did (G8 replays its first answer).
    pub(crate) async fn mutate_with_key<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: String,
        body: &B,
        idempotency_key: &str,
    ) -> Result<Answer<T>> {
        let body = serde_json::to_vec(body).map_err(|error| invalid(error.to_string()))?;
        self.execute(
            Operation {
                method,
                path,
                body: Some(body),
                idempotency_key: Some(idempotency_key.to_owned()),
            },
            self.default_budget(),
        )
        .await
    }

    /// A mutation the server may hold for up to `held` on purpose (a `wait_ms`): each
    /// attempt, and the whole budget, get that much longer.
    pub(crate) async fn mutate_held<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: String,
        body: &B,
        held: Duration,
    ) -> Result<Answer<T>> {
        let body = serde_json::to_vec(body).map_err(|error| invalid(error.to_string()))?;
        let budget = self.default_budget();
        self.execute(
            Operation {
                method,
                path,
                body: Some(body),
                idempotency_key: Some(idempotency_key()),
            },
            Budget {
                request_timeout: budget.request_timeout + held,
                deadline: budget.deadline + held,
            },
        )
        .await
    }

    /// A read: retried freely, no key.
    pub(crate) async fn read<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: String,
        body: Option<&B>,
    ) -> Result<T> {
        let body = body
            .map(serde_json::to_vec)
            .transpose()
            .map_err(|error| invalid(error.to_string()))?;
        let operation = Operation {
            method,
            path,
            body,
            idempotency_key: None,
        };
        Ok(self.execute(operation, self.default_budget()).await?.value)
    }

    /// Sends `operation` until it gets an answer that settles it, the attempts run out, or the
    /// budget's deadline passes. A read is retried after any transport failure; a mutation
    /// too, because it carries its idempotency key. Once any attempt may have been applied,
    /// a later "not applied" failure does not make the whole operation "not applied": the
    /// error is then [`Error::Indeterminate`].
    async fn execute<T: DeserializeOwned>(
        &self,
        operation: Operation,
        budget: Budget,
    ) -> Result<Answer<T>> {
        let (response, sent_at) = self.send(&operation, budget).await?;
        self.settle(response, sent_at, &operation).await
    }

    /// The retries of [`Client::execute`], up to a successful answer whose body is not read
    /// yet: it, and when the first attempt was sent.
    async fn send(
        &self,
        operation: &Operation,
        budget: Budget,
    ) -> Result<(reqwest::Response, Duration)> {
        let sent_at = self.inner.clock.now();
        let endpoints = self.inner.endpoints.len();
        let mut index = self.inner.preferred.load(Ordering::Relaxed) % endpoints;
        // A read has no effect: only a mutation's outcome can be unknown.
        let mutation = operation.idempotency_key.is_some();
        let mut maybe_applied = false;
        let mut failures: Vec<String> = Vec::new();
        let mut last_error: Option<Error> = None;
        for attempt in 1..=self.inner.attempts_max {
            let now = Instant::now();
            if now >= budget.deadline {
                break;
            }
            let timeout = budget.request_timeout.min(budget.deadline - now);
            let endpoint = &self.inner.endpoints[index];
            let outcome = self.attempt(index, operation, timeout).await;
            let retry_after = match outcome {
                Attempt::Answered(response) => return Ok((*response, sent_at)),
                Attempt::Refused(error @ Error::Tls { .. }) if maybe_applied => {
                    // Refused by this endpoint only: an earlier attempt may have been applied.
                    return Err(Error::Indeterminate {
                        code: None,
                        message: format!(
                            "the outcome is unknown: an earlier attempt may have been applied, \
                             and {} refused TLS: {}",
                            endpoint.base,
                            error.message()
                        ),
                    });
                }
                Attempt::Refused(error) => return Err(error),
                Attempt::NotApplied(error, retry_after) => {
                    failures.push(format!("{}: {}", endpoint.base, error.message()));
                    last_error = Some(error);
                    retry_after
                }
                Attempt::Unknown(error) => {
                    failures.push(format!("{}: {}", endpoint.base, error.message()));
                    maybe_applied |= mutation;
                    last_error = Some(error);
                    None
                }
            };
            tracing::debug!(
                attempt,
                endpoint = %endpoint.base,
                route = %operation.method,
                "attempt failed; trying the next endpoint"
            );
            index = (index + 1) % endpoints;
            self.inner.preferred.store(index, Ordering::Relaxed);
            if attempt < self.inner.attempts_max {
                let pause = retry_after
                    .map(|wait| wait.min(RETRY_AFTER_MAX))
                    .unwrap_or_else(|| backoff(attempt));
                let pause = pause.min(budget.deadline.saturating_duration_since(Instant::now()));
                tokio::time::sleep(pause).await;
            }
        }
        let summary = summarize(&failures);
        Err(match last_error {
            Some(error) if maybe_applied || (mutation && error.is_indeterminate()) => {
                Error::Indeterminate {
                    code: match error {
                        Error::Indeterminate { code, .. } => code,
                        _ => None,
                    },
                    message: format!("the outcome is unknown: {summary}"),
                }
            }
            Some(Error::Unavailable { code, .. }) => Error::Unavailable {
                code,
                message: format!("no endpoint could take the request ({summary})"),
            },
            // A read left without an answer: nothing to be unknown, only nobody answered.
            Some(Error::Indeterminate { .. }) => Error::Unavailable {
                code: None,
                message: format!("no endpoint answered the read ({summary})"),
            },
            Some(error) => error,
            None => Error::Unavailable {
                code: None,
                message: summary,
            },
        })
    }

    /// Sends one attempt and sorts out transport failures and retryable refusals.
    async fn attempt(&self, index: usize, operation: &Operation, timeout: Duration) -> Attempt {
        let endpoint = &self.inner.endpoints[index];
        let url = format!("{}{}", endpoint.base, operation.path);
        let mut request = self
            .inner
            .http
            .request(operation.method.clone(), &url)
            .timeout(timeout);
        if let Some(namespace) = &self.inner.namespace {
            request = request.header(HEADER_NAMESPACE, namespace);
        }
        if let Some(token) = &self.inner.token {
            request = request.bearer_auth(&token.0);
        }
        if let Some(key) = &operation.idempotency_key {
            request = request.header(HEADER_IDEMPOTENCY_KEY, key);
        }
        if let Some(body) = &operation.body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.clone());
        }
        let error = match request.send().await {
            Ok(response) => return self.answered(index, response).await,
            Err(error) => error,
        };
        // Before any byte of the request: another attempt would fail the same way.
        if let Some(tls) = Error::from_tls(&error) {
            return Attempt::Refused(tls);
        }
        if error.is_connect() {
            return Attempt::NotApplied(
                Error::Unavailable {
                    code: None,
                    message: format!("cannot connect: {}", describe(&error)),
                },
                None,
            );
        }
        Attempt::Unknown(Error::Indeterminate {
            code: None,
            message: if error.is_timeout() {
                format!("no answer within {timeout:?}")
            } else {
                format!("the request failed after it was sent: {}", describe(&error))
            },
        })
    }

    /// Sorts out an answer: a success, a retryable refusal, or one that settles the operation.
    async fn answered(&self, index: usize, response: reqwest::Response) -> Attempt {
        let endpoint = &self.inner.endpoints[index];
        // Whoever answered is reachable; the leader, once known, is better still.
        let preferred = self.learn_leader(&response, endpoint).unwrap_or(index);
        self.inner.preferred.store(preferred, Ordering::Relaxed);
        let status = response.status();
        if status.is_success() {
            return Attempt::Answered(Box::new(response));
        }
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let bytes = match read_body(response).await {
            Ok(bytes) => bytes,
            Err(message) => {
                return Attempt::Unknown(Error::Indeterminate {
                    code: None,
                    message,
                })
            }
        };
        let error = match serde_json::from_slice::<Problem>(&bytes) {
            Ok(problem) => {
                let retry_after = problem
                    .retry_after_ms
                    .map(Duration::from_millis)
                    .or(retry_after);
                let code = problem.code;
                let error = Error::from_problem(problem);
                match Applied::of_answer(status.as_u16(), Some(code)) {
                    // Only a mutation carrying its key may be sent again after this.
                    Applied::Unknown => return Attempt::Unknown(error),
                    Applied::No if code.is_retryable() => {
                        return Attempt::NotApplied(error, retry_after)
                    }
                    Applied::No | Applied::Yes => error,
                }
            }
            Err(_) if Applied::of_answer(status.as_u16(), None) == Applied::Unknown => {
                // A 5xx without a problem body (a proxy, a crash mid-answer): unknown.
                return Attempt::Unknown(Error::Indeterminate {
                    code: None,
                    message: format!(
                        "HTTP {status} without a problem body: {}",
                        String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
                    ),
                });
            }
            Err(_) => Error::InvalidArgument {
                message: format!(
                    "HTTP {status} without a problem body: {}",
                    String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
                ),
            },
        };
        // A definite refusal: the operation is settled, no retry.
        Attempt::Refused(error)
    }

    async fn settle<T: DeserializeOwned>(
        &self,
        response: reqwest::Response,
        sent_at: Duration,
        operation: &Operation,
    ) -> Result<Answer<T>> {
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        let replayed = header(HEADER_IDEMPOTENT_REPLAYED)
            .is_some_and(|value| value.eq_ignore_ascii_case("true"));
        let leader = header(HEADER_LEADER).and_then(|value| value.trim().parse().ok());
        let cluster_time_ms =
            header(HEADER_CLUSTER_TIME).and_then(|value| value.trim().parse().ok());
        let bytes = read_body(response)
            .await
            .map_err(|message| unknown_if_mutation(operation, message))?;
        let bytes = if bytes.is_empty() {
            b"null".to_vec()
        } else {
            bytes
        };
        let value = serde_json::from_slice(&bytes).map_err(|error| {
            unknown_if_mutation(operation, format!("the answer does not parse: {error}"))
        })?;
        Ok(Answer {
            value,
            sent_at,
            replayed,
            leader,
            cluster_time_ms,
        })
    }

    /// Remembers which endpoint the named leader is, so the next request goes there first.
    fn learn_leader(&self, response: &reqwest::Response, answering: &Endpoint) -> Option<usize> {
        let leader = response
            .headers()
            .get(HEADER_LEADER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())?;
        let known = {
            let leaders = self
                .inner
                .leaders
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            leaders.get(&leader).copied()
        };
        if known.is_none() && self.inner.endpoints.len() > 1 && self.may_learn_members() {
            // Learn the member addresses in the background, if a runtime runs us.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let client = self.clone();
                let base = answering.base.clone();
                runtime.spawn(async move { client.learn_members(&base).await });
            }
        }
        known
    }

    fn may_learn_members(&self) -> bool {
        let mut learned_at = self
            .inner
            .learned_at
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        if learned_at.is_some_and(|at| now.duration_since(at) < LEARN_MEMBERS_INTERVAL) {
            return false;
        }
        *learned_at = Some(now);
        true
    }

    async fn learn_members(&self, base: &str) {
        let url = format!("{base}/v1/cluster");
        let mut request = self
            .inner
            .http
            .get(&url)
            .timeout(self.inner.request_timeout);
        if let Some(token) = &self.inner.token {
            request = request.bearer_auth(&token.0);
        }
        let Ok(response) = request.send().await else {
            return;
        };
        let Ok(bytes) = read_body(response).await else {
            return;
        };
        let Ok(status) = serde_json::from_slice::<ClusterStatus>(&bytes) else {
            return;
        };
        let mut leaders = self
            .inner
            .leaders
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for member in &status.members {
            if let Some(index) = self
                .inner
                .endpoints
                .iter()
                .position(|endpoint| endpoint.authority == member.api_addr)
            {
                leaders.insert(member.id, index);
            }
        }
    }
}

/// Options of an acquire: TTL of a new session, mode, max hold, labels, reason, and how long
/// to wait while the resource is held.
///
/// ```
/// use std::time::Duration;
/// use baton_client::AcquireOptions;
///
/// let options = AcquireOptions::new()
///     .ttl(Duration::from_secs(10))
///     .subtree()
///     .max_hold(Duration::from_secs(600))
///     .label("task", "refactor")
///     .reason("splitting auth.rs")
///     .wait(Duration::from_secs(30));
/// assert_eq!(options.ttl_value(), Duration::from_secs(10));
/// ```
#[derive(Debug, Clone)]
pub struct AcquireOptions {
    pub(crate) ttl: Duration,
    pub(crate) mode: crate::api::LeaseMode,
    pub(crate) limit: Option<u32>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) labels: Labels,
    pub(crate) reason: Option<String>,
    pub(crate) wait: Option<Duration>,
}

/// The TTL of a session created by an acquire when none is given.
pub const TTL_DEFAULT: Duration = Duration::from_secs(30);

impl Default for AcquireOptions {
    fn default() -> AcquireOptions {
        AcquireOptions::new()
    }
}

impl AcquireOptions {
    /// An exclusive lease, 30 s session TTL, no max hold, no wait.
    pub fn new() -> AcquireOptions {
        AcquireOptions {
            ttl: TTL_DEFAULT,
            mode: crate::api::LeaseMode::Exclusive,
            limit: None,
            max_hold: None,
            labels: Labels::new(),
            reason: None,
            wait: None,
        }
    }

    /// The TTL of the session created with the lease ([`Client::acquire`] only; a
    /// [`crate::Session`] has its own).
    pub fn ttl(mut self, ttl: Duration) -> AcquireOptions {
        self.ttl = ttl;
        self
    }

    /// The TTL set by [`AcquireOptions::ttl`].
    pub fn ttl_value(&self) -> Duration {
        self.ttl
    }

    /// A subtree lease: the path and everything under it.
    pub fn subtree(mut self) -> AcquireOptions {
        self.mode = crate::api::LeaseMode::Subtree;
        self.limit = None;
        self
    }

    /// A shared lease (a semaphore): up to `limit` sessions hold the path at once, each with
    /// its own fence; every holder gives the same `limit`.
    pub fn shared(mut self, limit: u32) -> AcquireOptions {
        self.mode = crate::api::LeaseMode::Shared;
        self.limit = Some(limit);
        self
    }

    /// Exclusive or subtree (a shared lease needs its limit: [`AcquireOptions::shared`]).
    pub fn mode(mut self, mode: crate::api::LeaseMode) -> AcquireOptions {
        self.mode = mode;
        self.limit = None;
        self
    }

    /// Caps the lease's life even while keepalives continue.
    pub fn max_hold(mut self, max_hold: Duration) -> AcquireOptions {
        self.max_hold = Some(max_hold);
        self
    }

    /// A label on the lease.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> AcquireOptions {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Why the caller wants the resource.
    pub fn reason(mut self, reason: impl Into<String>) -> AcquireOptions {
        self.reason = Some(reason.into());
        self
    }

    /// While the resource is held, retry (with backoff) for up to `wait` before giving up
    /// with [`Error::Held`].
    pub fn wait(mut self, wait: Duration) -> AcquireOptions {
        self.wait = Some(wait);
        self
    }
}

/// A fresh idempotency key: a UUIDv4 from 16 random bytes (version and variant bits set).
pub fn idempotency_key() -> String {
    crate::api::uuid_v4(rand::random())
}

/// Whole milliseconds of a duration, saturating.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `user@host` from `$USER` and the host name, for sessions that name no holder.
pub fn default_holder() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .filter(|user| !user.trim().is_empty())
        .unwrap_or_else(|| "agent".to_owned());
    format!("{}@{}", user.trim(), host_name())
}

fn host_name() -> String {
    let from_file = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|text| text.trim().to_owned())
        .filter(|name| !name.is_empty());
    from_file
        .or_else(|| {
            let output = std::process::Command::new("hostname").output().ok()?;
            let name = String::from_utf8_lossy(&output.stdout).trim().to_owned();
            (output.status.success() && !name.is_empty()).then_some(name)
        })
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Exponential backoff with full jitter: a random pause in `[base/2, base]` where `base`
/// doubles from [`BACKOFF_INITIAL`] up to [`BACKOFF_MAX`].
pub(crate) fn backoff(attempt: u32) -> Duration {
    let base = BACKOFF_INITIAL
        .saturating_mul(1 << attempt.saturating_sub(1).min(16))
        .min(BACKOFF_MAX);
    let jitter: f64 = rand::random::<f64>() * 0.5 + 0.5;
    base.mul_f64(jitter)
}

fn invalid(message: impl Into<String>) -> Error {
    Error::InvalidArgument {
        message: message.into(),
    }
}

fn unknown_if_mutation(operation: &Operation, message: String) -> Error {
    if operation.idempotency_key.is_some() {
        Error::Indeterminate {
            code: None,
            message,
        }
    } else {
        Error::Unavailable {
            code: None,
            message,
        }
    }
}

/// The body of an answer, at most [`ANSWER_BYTES_MAX`] bytes.
async fn read_body(mut response: reqwest::Response) -> std::result::Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if bytes.len() + chunk.len() > ANSWER_BYTES_MAX {
                    return Err(format!(
                        "the answer is longer than {ANSWER_BYTES_MAX} bytes"
                    ));
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(bytes),
            Err(error) => return Err(format!("reading the answer failed: {}", describe(&error))),
        }
    }
}

/// The root cause of a reqwest error (`Connection refused (os error 111)`), which says more
/// than the wrappers around it.
fn describe(error: &reqwest::Error) -> String {
    let mut cause: &dyn std::error::Error = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

/// `N attempt(s); endpoint: its last failure; ...`, one entry per endpoint tried.
fn summarize(failures: &[String]) -> String {
    if failures.is_empty() {
        return "the retry budget was spent before any attempt".to_owned();
    }
    let mut last_per_endpoint: Vec<(&str, &str)> = Vec::new();
    for failure in failures {
        let (endpoint, message) = failure.split_once(": ").unwrap_or((failure, ""));
        match last_per_endpoint
            .iter_mut()
            .find(|(seen, _)| *seen == endpoint)
        {
            Some(entry) => entry.1 = message,
            None => last_per_endpoint.push((endpoint, message)),
        }
    }
    let details: Vec<String> = last_per_endpoint
        .iter()
        .map(|(endpoint, message)| format!("{endpoint}: {message}"))
        .collect();
    format!("{} attempt(s); {}", failures.len(), details.join("; "))
}

/// `http://host:port`, `https://host:port` (or `host:port`, plain HTTP) as an [`Endpoint`].
fn parse_endpoint(text: &str) -> Result<Endpoint> {
    let trimmed = text.trim().trim_end_matches('/');
    let base = if trimmed.contains("://") {
        trimmed.to_owned()
    } else {
        format!("http://{trimmed}")
    };
    let Some(authority) = base
        .strip_prefix("http://")
        .or_else(|| base.strip_prefix("https://"))
    else {
        return Err(invalid(format!(
            "endpoint {text:?}: only http://host:port and https://host:port are supported"
        )));
    };
    if authority.is_empty() || authority.contains('/') || !authority.contains(':') {
        return Err(invalid(format!(
            "endpoint {text:?} is not http://host:port or https://host:port"
        )));
    }
    Ok(Endpoint {
        authority: authority.to_owned(),
        base,
    })
}

/// One name (a queue, a task id, a session id) as one URL path segment, sent unchanged: every
/// byte but RFC 3986's unreserved ones percent-encoded, `/` included.
///
/// # Errors
///
/// [`Error::InvalidArgument`] for `.` and `..`: URL libraries remove such a segment even
/// percent-encoded (WHATWG treats `%2E%2E` as `..`), and the server refuses it anyway (docs/api.md
/// section 4, "Names").
pub(crate) fn encode_name(name: &str) -> Result<String> {
    if is_dot_segment(name) {
        return Err(dot_segment(name));
    }
    Ok(encode(name))
}

/// A resource path or kv key as URL path text, sent unchanged: each `/`-separated segment
/// percent-encoded (docs/guarantees.md, "Semantics"). A path with a `.` or `..` segment travels with its `/`s
/// encoded as `%2F`, as one URL segment, so that no URL library collapses it (the server
/// decodes it back and refuses it, or stores it as the exact bytes); a path that is nothing
/// but `.` or `..` is refused here, as the server would.
///
/// # Errors
///
/// [`Error::InvalidArgument`] for a path that is `.` or `..`.
pub(crate) fn encode_path(path: &str) -> Result<String> {
    if is_dot_segment(path) {
        return Err(dot_segment(path));
    }
    if path.split('/').any(is_dot_segment) {
        return Ok(encode(path));
    }
    Ok(path.split('/').map(encode).collect::<Vec<_>>().join("/"))
}

fn is_dot_segment(segment: &str) -> bool {
    segment == "." || segment == ".."
}

fn dot_segment(name: &str) -> Error {
    invalid(format!(
        "{name:?} is not a name: a path segment may not be . or .."
    ))
}

/// Percent-encodes everything but RFC 3986 unreserved characters (for query values and
/// through [`encode_name`] and [`encode_path`] for paths).
pub(crate) fn encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_keys_are_uuid_v4() {
        let first = idempotency_key();
        let second = idempotency_key();
        assert_ne!(first, second);
        for key in [first, second] {
            assert_eq!(key.len(), 36, "{key}");
            let groups: Vec<&str> = key.split('-').collect();
            assert_eq!(
                groups.iter().map(|group| group.len()).collect::<Vec<_>>(),
                [8, 4, 4, 4, 12]
            );
            assert!(groups[2].starts_with('4'), "{key}");
            assert!(matches!(&groups[3][..1], "8" | "9" | "a" | "b"), "{key}");
        }
    }

    #[test]
    fn endpoints_and_paths_are_parsed_and_encoded() {
        let endpoint = parse_endpoint("127.0.0.1:7420/").expect("host:port");
        assert_eq!(endpoint.base, "http://127.0.0.1:7420");
        assert_eq!(endpoint.authority, "127.0.0.1:7420");
        let secure = parse_endpoint("https://a:1").expect("https://host:port");
        assert_eq!(
            (secure.base.as_str(), secure.authority.as_str()),
            ("https://a:1", "a:1")
        );
        assert!(parse_endpoint("ftp://a:1").is_err());
        assert!(parse_endpoint("http://a:1/v1").is_err());
        assert!(parse_endpoint("https://a:1/v1").is_err());
        assert!(parse_endpoint("nohost").is_err());
        assert_eq!(
            encode_path("repo/src/a b?.rs").expect("a path"),
            "repo/src/a%20b%3F.rs"
        );
        assert_eq!(encode_name("a/b").expect("a name"), "a%2Fb");
    }

    #[test]
    fn dot_segments_travel_unchanged_or_are_refused() {
        // Glued with %2F so that no URL library sees a `..` segment to remove.
        assert_eq!(
            encode_path("dots/a/../b").expect("a path"),
            "dots%2Fa%2F..%2Fb"
        );
        assert_eq!(encode_path("./x").expect("a path"), ".%2Fx");
        assert_eq!(
            encode_path("a/.hidden/..b").expect("a path"),
            "a/.hidden/..b"
        );
        for name in [".", ".."] {
            assert!(matches!(
                encode_path(name),
                Err(Error::InvalidArgument { .. })
            ));
            assert!(matches!(
                encode_name(name),
                Err(Error::InvalidArgument { .. })
            ));
        }
        // What reqwest sends is what was built: nothing is collapsed.
        for path in ["dots/a/../b", "./x", "a/./b/.."] {
            let url = format!(
                "http://127.0.0.1:1/v1/kv/{}",
                encode_path(path).expect("a path")
            );
            let parsed = reqwest::Url::parse(&url).expect("a URL");
            assert_eq!(parsed.as_str(), url, "{path}");
        }
    }

    #[test]
    fn backoff_grows_and_stays_bounded() {
        for attempt in 1..40 {
            let pause = backoff(attempt);
            assert!(pause <= BACKOFF_MAX, "{attempt}: {pause:?}");
            assert!(pause >= BACKOFF_INITIAL / 2, "{attempt}: {pause:?}");
        }
        assert!(backoff(10) >= BACKOFF_MAX / 2);
    }
}
