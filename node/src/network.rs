//! The peer network of `batond`: how one node's Raft reaches another's, both ends of it.
//!
//! The client side is `PeerNetwork` (openraft's `RaftNetworkFactory`, and `post` for the write
//! relay) and `PeerClient` (openraft's `RaftNetwork` for one target). Each speaks over HTTP/1.1
//! connections of its own (`Connection`, hyper's bare client over TCP, or TLS with peer TLS): a
//! `PeerClient` keeps one connection to its target, since openraft sends it one RPC at a time,
//! and `post` takes an idle connection to the address or opens one. reqwest's pooled client cost
//! a busy leader a quarter of its CPU in the replication streams (docs/performance.md).
//!
//! The server side is `peer_router`, the axum router mounted on `--peer-listen`. Both speak the same tiny protocol: a POST to
//! `/raft/append`, `/raft/vote` or `/raft/snapshot` whose body is the openraft request in
//! bincode (serde, standard config), answered 200 with `Result<response, RaftError>` in bincode,
//! so a Raft error on the peer reaches the caller as a remote error rather than a transport one.
//! Every body, in either direction, is bounded by `PEER_MESSAGE_BYTES_MAX` and decoded with that
//! limit: garbage is an error, never a panic. With a cluster secret, every request carries it in
//! `Baton-Cluster-Secret` and the server compares it in constant time.
//!
//! What must never live here: the client API (its routes, its error table, its status codes are
//! the `http` module's), anything that interprets commands, and the cluster secret in a log line,
//! an error message or a `Debug` output.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use baton_raft_store::machine::{decode_value, encode_value};
use baton_raft_store::store::{Member, TypeConfig};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use openraft::error::{
    Infallible, InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError,
    RemoteError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{AnyError, RPCTypes, Raft};
use rustls::pki_types::ServerName;
use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::TlsConnector;

/// The header that carries the cluster secret on every peer request when one is configured.
pub const CLUSTER_SECRET_HEADER: &str = "baton-cluster-secret";

/// The largest peer message, request or response, in bytes. It bounds what a node accepts, what
/// it decodes and what it sends: an append larger than this is split (openraft is told to send
/// fewer entries), and openraft's snapshot chunks (3 MiB by default) stay well below it.
pub const PEER_MESSAGE_BYTES_MAX: usize = 64 << 20;

/// How long opening a TCP connection to a peer may take before the peer counts as unreachable.
pub const PEER_CONNECT_TIMEOUT_MS: u64 = 1_000;

/// The Raft-level error a peer RPC can return, with `E` the RPC's own API error.
pub type PeerRpcError<E = Infallible> = RPCError<u64, Member, RaftError<u64, E>>;

/// Why the peer network could not be built: a configuration mistake found at start-up.
#[derive(Debug, thiserror::Error)]
pub enum PeerNetworkError {
    /// The secret is empty or is not a valid HTTP header value (visible ASCII). The message
    /// deliberately does not repeat the secret.
    #[error("the cluster secret must be non-empty visible ASCII (it travels as an HTTP header)")]
    InvalidSecret,
}

/// openraft's network factory for a Baton node: hands out one `PeerClient` per target, each with
/// a connection of its own; `post`'s idle connections are shared by the clones. Cloning is cheap.
#[derive(Clone)]
pub struct PeerNetwork {
    node_id: u64,
    secret: Option<HeaderValue>,
    /// With peer TLS: the client side of the handshake (the peer CA, this node's certificate).
    tls: Option<TlsConnector>,
    /// `post`'s connections not in use, by peer address.
    idle: Arc<Mutex<HashMap<String, Vec<Connection>>>>,
}

/// Idle connections `post` keeps per peer address at most (the relay has four messages out).
const IDLE_CONNECTIONS_MAX: usize = 8;

impl PeerNetwork {
    /// A network for node `node_id` (named in timeout errors), sending `secret` with every peer
    /// request when it is `Some`. Fails on an empty or non-header-safe secret, so a node never
    /// starts with a secret its peers could not receive.
    /// With `tls` (`tls::client_config`: the peer CA and this node's certificate), every peer is
    /// reached over TLS.
    pub fn new(
        node_id: u64,
        secret: Option<String>,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Result<Self, PeerNetworkError> {
        let secret = secret.map(|secret| secret_header(&secret)).transpose()?;
        let tls = tls.map(TlsConnector::from);
        Ok(Self {
            node_id,
            secret,
            tls,
            idle: Arc::default(),
        })
    }

    /// Opens a connection to the peer listener at `peer_addr` (TCP, then TLS with peer TLS,
    /// then HTTP/1.1) before `deadline` and within `PEER_CONNECT_TIMEOUT_MS`: a connect counts
    /// against the time its request is given, so a peer that drops packets costs a relayed
    /// write no more than its bound. Nothing has been sent when it fails.
    async fn connect(&self, peer_addr: &str, deadline: Instant) -> Result<Connection, String> {
        let opened = async {
            let tcp = TcpStream::connect(peer_addr)
                .await
                .map_err(|error| error.to_string())?;
            tcp.set_nodelay(true).map_err(|error| error.to_string())?;
            match &self.tls {
                None => Connection::handshake(tcp).await,
                Some(tls) => {
                    let name = server_name(peer_addr)?;
                    let stream = tls
                        .connect(name, tcp)
                        .await
                        .map_err(|error| format!("TLS: {error}"))?;
                    Connection::handshake(stream).await
                }
            }
        };
        let within = Duration::from_millis(PEER_CONNECT_TIMEOUT_MS)
            .min(deadline.saturating_duration_since(Instant::now()));
        match tokio::time::timeout(within, opened).await {
            Ok(Ok(connection)) => Ok(connection),
            Ok(Err(error)) => Err(format!("connecting to peer {peer_addr}: {error}")),
            Err(_) => Err(format!(
                "connecting to peer {peer_addr}: no connection within {within:?}"
            )),
        }
    }

    /// POSTs `body` to `path` on `connection` (the one given, when it is open, or a new one)
    /// and reads the whole answer before `deadline`. A request that never left a connection
    /// the peer had closed meanwhile (a kept or idle one) goes once more on a new connection.
    /// On success `connection` holds the connection for the next request; on failure it is
    /// dropped.
    async fn send(
        &self,
        connection: &mut Option<Connection>,
        peer_addr: &str,
        path: &str,
        body: Bytes,
        deadline: Instant,
    ) -> Result<(StatusCode, Bytes), ExchangeError> {
        let mut kept = connection.take().filter(|kept| !kept.send.is_closed());
        loop {
            let reused = kept.is_some();
            let mut open = match kept.take() {
                Some(open) => open,
                None => self
                    .connect(peer_addr, deadline)
                    .await
                    .map_err(ExchangeError::NotSent)?,
            };
            match self
                .exchange(&mut open, peer_addr, path, body.clone(), deadline)
                .await
            {
                Ok(answer) => {
                    *connection = Some(open);
                    return Ok(answer);
                }
                Err(ExchangeError::NotSent(_)) if reused => continue,
                Err(error) => return Err(error),
            }
        }
    }

    /// POSTs `body` to `path` on `connection`, with the cluster secret when one is set, and
    /// reads the whole answer (at most `PEER_MESSAGE_BYTES_MAX` bytes) before `deadline`.
    async fn exchange(
        &self,
        connection: &mut Connection,
        peer_addr: &str,
        path: &str,
        body: Bytes,
        deadline: Instant,
    ) -> Result<(StatusCode, Bytes), ExchangeError> {
        let mut request = axum::http::Request::post(path)
            .header(header::HOST, peer_addr)
            .header(header::CONTENT_TYPE, OCTET_STREAM);
        if let Some(secret) = &self.secret {
            request = request.header(CLUSTER_SECRET_HEADER, secret.clone());
        }
        let request = request
            .body(Full::new(body))
            .map_err(|error| ExchangeError::NotSent(error.to_string()))?;
        let exchanged =
            async {
                connection
                    .send
                    .ready()
                    .await
                    .map_err(|error| ExchangeError::NotSent(error.to_string()))?;
                let response = connection.send.try_send_request(request).await.map_err(
                    |mut error| match error.take_message() {
                        // Handed back unserialized: it never left.
                        Some(_) => ExchangeError::NotSent(error.error().to_string()),
                        None => ExchangeError::Failed(error.error().to_string()),
                    },
                )?;
                let status = response.status();
                let body = Limited::new(response.into_body(), PEER_MESSAGE_BYTES_MAX)
                    .collect()
                    .await
                    .map_err(|error| ExchangeError::Failed(format!("reading the answer: {error}")))?
                    .to_bytes();
                Ok((status, body))
            };
        tokio::time::timeout_at(deadline, exchanged)
            .await
            .unwrap_or(Err(ExchangeError::TimedOut))
    }

    fn take_idle(&self, peer_addr: &str) -> Option<Connection> {
        let mut idle = self
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let connections = idle.get_mut(peer_addr)?;
        while let Some(connection) = connections.pop() {
            if !connection.send.is_closed() {
                return Some(connection);
            }
        }
        None
    }

    fn put_idle(&self, peer_addr: &str, connection: Connection) {
        let mut idle = self
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let connections = idle.entry(peer_addr.to_owned()).or_default();
        if connections.len() < IDLE_CONNECTIONS_MAX {
            connections.push(connection);
        }
    }
}

/// One HTTP/1.1 connection to a peer listener: requests go one at a time; hyper's connection
/// task (spawned at the handshake) does the I/O and ends when the connection does.
struct Connection {
    send: SendRequest<Full<Bytes>>,
}

impl Connection {
    async fn handshake<S>(stream: S) -> Result<Connection, String>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let (send, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|error| error.to_string())?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "a peer connection ended");
            }
        });
        Ok(Connection { send })
    }
}

/// Why a request got no answer.
enum ExchangeError {
    /// It never left: no connection could be opened, or the connection was gone first.
    NotSent(String),
    /// It may have reached the peer, and no whole answer came before the deadline.
    TimedOut,
    /// It may have reached the peer, and the connection broke or the answer was unreadable.
    Failed(String),
}

/// The name a peer's certificate must carry: the host of its `host:port` address (an IP address
/// or a DNS name).
fn server_name(peer_addr: &str) -> Result<ServerName<'static>, String> {
    let host = peer_addr
        .rsplit_once(':')
        .map_or(peer_addr, |(host, _)| host)
        .trim_start_matches('[')
        .trim_end_matches(']');
    ServerName::try_from(host.to_owned())
        .map_err(|error| format!("{host} is no server name: {error}"))
}

/// Why `PeerNetwork::post` got no answer.
#[derive(Debug, Clone)]
pub enum PeerPostError {
    /// No connection was made: the request surely did not reach the peer.
    NotDelivered(String),
    /// The request may have reached the peer (a timeout, a cut, a refusal, a bad answer).
    MaybeDelivered(String),
}

impl PeerNetwork {
    /// POSTs `body` to `path` on the peer listener at `peer_addr`, with the cluster secret when
    /// one is set, and returns the 200 answer's body (at most `PEER_MESSAGE_BYTES_MAX` bytes).
    /// For peer routes other than openraft's own (the write relay); the bytes are the caller's.
    pub async fn post(
        &self,
        peer_addr: &str,
        path: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Bytes, PeerPostError> {
        let deadline = Instant::now() + timeout;
        let mut connection = self.take_idle(peer_addr);
        let (status, body) = match self
            .send(
                &mut connection,
                peer_addr,
                path,
                Bytes::from(body),
                deadline,
            )
            .await
        {
            Ok(answer) => answer,
            Err(ExchangeError::NotSent(error)) => return Err(PeerPostError::NotDelivered(error)),
            Err(ExchangeError::TimedOut) => {
                return Err(PeerPostError::MaybeDelivered(format!(
                    "peer {peer_addr} did not answer {path} within {timeout:?}"
                )))
            }
            Err(ExchangeError::Failed(error)) => {
                return Err(PeerPostError::MaybeDelivered(format!(
                    "peer {peer_addr}, {path}: {error}"
                )))
            }
        };
        if let Some(connection) = connection {
            self.put_idle(peer_addr, connection);
        }
        if !status.is_success() {
            return Err(PeerPostError::MaybeDelivered(refused(
                &format!("peer {peer_addr}"),
                path,
                status,
                &body,
            )));
        }
        Ok(body)
    }
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, node: &Member) -> PeerClient {
        PeerClient {
            target,
            member: node.clone(),
            network: self.clone(),
            connection: None,
        }
    }
}

impl fmt::Debug for PeerNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerNetwork")
            .field("node_id", &self.node_id)
            .field("secret", &redacted(&self.secret))
            .finish_non_exhaustive()
    }
}

/// openraft's connection to one peer: each RPC is one HTTP POST on a connection this client
/// keeps to its target (opened again after any failure), bounded by the RPC's hard TTL.
///
/// Errors: a connection that cannot be opened (refused, connect timeout, DNS, a TLS handshake
/// refused, an unusable address) is `Unreachable`, so openraft backs off; a timeout once the
/// request may have been sent is `Timeout`; a broken connection, a non-2xx answer or an
/// undecodable one is `Network`; a Raft error returned by the peer is `RemoteError`; an append
/// too large to send is `PayloadTooLarge`.
pub struct PeerClient {
    target: u64,
    member: Member,
    network: PeerNetwork,
    connection: Option<Connection>,
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, PeerRpcError> {
        let body = encode(&rpc).map_err(|error| network_error(&error))?;
        if body.len() > PEER_MESSAGE_BYTES_MAX {
            return Err(append_too_large(rpc.entries.len(), body.len()));
        }
        self.call(RPCTypes::AppendEntries, APPEND_PATH, body, &option)
            .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, PeerRpcError<InstallSnapshotError>> {
        let body = encode(&rpc).map_err(|error| network_error(&error))?;
        self.call(RPCTypes::InstallSnapshot, SNAPSHOT_PATH, body, &option)
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, PeerRpcError> {
        let body = encode(&rpc).map_err(|error| network_error(&error))?;
        self.call(RPCTypes::Vote, VOTE_PATH, body, &option).await
    }
}

impl fmt::Debug for PeerClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerClient")
            .field("target", &self.target)
            .field("peer_addr", &self.member.peer_addr)
            .field("network", &self.network)
            .finish_non_exhaustive()
    }
}

/// The peer-facing router: `POST /raft/append`, `/raft/vote` and `/raft/snapshot`, each taking
/// the bincode openraft request and answering 200 with the bincode `Result<response, RaftError>`
/// of the local `raft`. A malformed body is 400 with a short reason, a body over
/// `PEER_MESSAGE_BYTES_MAX` is 413. With `secret`, a request without the right
/// `Baton-Cluster-Secret` is 401 before its body is read. The secret is expected to have been
/// validated at the edge like `PeerNetwork::new` does (non-empty, header-safe). `more` adds the
/// node's other peer routes (the write relay), behind the same secret check and body limit.
pub fn peer_router(raft: Raft<TypeConfig>, secret: Option<String>, more: Router) -> Router {
    // Only the digest is kept: the comparison is over fixed-length digests, so neither the
    // secret's bytes nor its length leak through timing.
    let secret_digest = secret.map(|secret| digest(secret.as_bytes()));
    Router::new()
        .route(APPEND_PATH, post(serve_append))
        .route(VOTE_PATH, post(serve_vote))
        .route(SNAPSHOT_PATH, post(serve_snapshot))
        .with_state(raft)
        .merge(more)
        .route_layer(middleware::from_fn_with_state(secret_digest, authenticate))
        .layer(DefaultBodyLimit::max(PEER_MESSAGE_BYTES_MAX))
}

// ---- helpers ----

const APPEND_PATH: &str = "/raft/append";
const VOTE_PATH: &str = "/raft/vote";
const SNAPSHOT_PATH: &str = "/raft/snapshot";
const OCTET_STREAM: &str = "application/octet-stream";
/// How much of a non-2xx answer's body is quoted in the error, in bytes.
const ERROR_BODY_QUOTE_BYTES_MAX: usize = 256;

type SecretDigest = [u8; 32];

impl PeerClient {
    /// Sends one encoded request and decodes the peer's `Result<Resp, RaftError<E>>`.
    async fn call<Resp, E>(
        &mut self,
        rpc_type: RPCTypes,
        path: &str,
        body: Vec<u8>,
        option: &RPCOption,
    ) -> Result<Resp, PeerRpcError<E>>
    where
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let ttl = option.hard_ttl();
        let deadline = Instant::now() + ttl;
        let sent = self
            .network
            .send(
                &mut self.connection,
                &self.member.peer_addr,
                path,
                Bytes::from(body),
                deadline,
            )
            .await;
        let (status, body) = match sent {
            Ok(answer) => answer,
            Err(ExchangeError::NotSent(error)) => {
                return Err(RPCError::Unreachable(Unreachable::new(&AnyError::error(
                    error,
                ))))
            }
            Err(ExchangeError::TimedOut) => {
                return Err(RPCError::Timeout(Timeout {
                    action: rpc_type,
                    id: self.network.node_id,
                    target: self.target,
                    timeout: ttl,
                }))
            }
            Err(ExchangeError::Failed(error)) => {
                return Err(network_error(&AnyError::error(format!(
                    "peer {}, {rpc_type}: {error}",
                    self.target
                ))))
            }
        };
        if !status.is_success() {
            let message = refused(
                &format!("peer {}", self.target),
                &rpc_type.to_string(),
                status,
                &body,
            );
            return Err(network_error(&AnyError::error(message)));
        }
        let answer: Result<Resp, RaftError<u64, E>> =
            decode(&body).map_err(|error| network_error(&error))?;
        answer.map_err(|raft_error| {
            RPCError::RemoteError(RemoteError::new_with_node(
                self.target,
                self.member.clone(),
                raft_error,
            ))
        })
    }
}

/// An append whose encoding is over the limit: ask openraft for half the entries, or, when a
/// single entry is already too large (splitting cannot help, and an entries hint of 1 would
/// retry forever), fail it as a network error.
fn append_too_large(entries: usize, bytes: usize) -> PeerRpcError {
    if entries > 1 {
        let hint = u64::try_from(entries / 2).unwrap_or(u64::MAX);
        RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(hint))
    } else {
        network_error(&WireError::TooLarge { bytes })
    }
}

/// What a peer's non-2xx answer to `what` says, with the start of its body quoted.
fn refused(peer: &str, what: &str, status: StatusCode, body: &[u8]) -> String {
    let quoted = &body[..body.len().min(ERROR_BODY_QUOTE_BYTES_MAX)];
    format!(
        "{peer} answered {what} with {status}: {}",
        String::from_utf8_lossy(quoted).trim()
    )
}

fn network_error<E: std::error::Error + 'static, R: std::error::Error>(
    error: &E,
) -> RPCError<u64, Member, R> {
    RPCError::Network(NetworkError::new(error))
}

fn secret_header(secret: &str) -> Result<HeaderValue, PeerNetworkError> {
    if secret.is_empty() {
        return Err(PeerNetworkError::InvalidSecret);
    }
    let mut value = HeaderValue::from_str(secret).map_err(|_| PeerNetworkError::InvalidSecret)?;
    // Keeps the value out of hyper's and reqwest's debug output.
    value.set_sensitive(true);
    Ok(value)
}

fn redacted(secret: &Option<HeaderValue>) -> &'static str {
    match secret {
        Some(_) => "<redacted>",
        None => "<none>",
    }
}

async fn authenticate(
    State(expected): State<Option<SecretDigest>>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(expected) = expected {
        let presented = request
            .headers()
            .get(CLUSTER_SECRET_HEADER)
            .map(|value| digest(value.as_bytes()));
        let accepted = presented.is_some_and(|presented| constant_time_eq(&presented, &expected));
        if !accepted {
            // The matched route pattern, never the raw path (docs/api.md).
            let route = request
                .extensions()
                .get::<MatchedPath>()
                .map_or("unmatched", MatchedPath::as_str);
            tracing::warn!(
                route,
                "refused a peer request without the right cluster secret"
            );
            return (StatusCode::UNAUTHORIZED, "missing or wrong cluster secret").into_response();
        }
    }
    next.run(request).await
}

async fn serve_append(State(raft): State<Raft<TypeConfig>>, body: Bytes) -> Response {
    match decode::<AppendEntriesRequest<TypeConfig>>(&body) {
        Ok(request) => answer(&raft.append_entries(request).await),
        Err(error) => malformed(APPEND_PATH, &error),
    }
}

async fn serve_vote(State(raft): State<Raft<TypeConfig>>, body: Bytes) -> Response {
    match decode::<VoteRequest<u64>>(&body) {
        Ok(request) => answer(&raft.vote(request).await),
        Err(error) => malformed(VOTE_PATH, &error),
    }
}

async fn serve_snapshot(State(raft): State<Raft<TypeConfig>>, body: Bytes) -> Response {
    match decode::<InstallSnapshotRequest<TypeConfig>>(&body) {
        Ok(request) => answer(&raft.install_snapshot(request).await),
        Err(error) => malformed(SNAPSHOT_PATH, &error),
    }
}

/// 200 with the bincode answer, Raft error included: the caller tells them apart after decoding.
fn answer<T: Serialize>(result: &T) -> Response {
    match encode(result) {
        Ok(bytes) => ([(header::CONTENT_TYPE, OCTET_STREAM)], bytes).into_response(),
        Err(error) => {
            tracing::error!(%error, "encoding a peer answer failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "encoding the answer failed",
            )
                .into_response()
        }
    }
}

fn malformed(route: &'static str, error: &WireError) -> Response {
    tracing::warn!(route, %error, "refused a malformed peer request");
    (
        StatusCode::BAD_REQUEST,
        format!("malformed request: {error}"),
    )
        .into_response()
}

/// Why a peer message could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
enum WireError {
    #[error("{0}")]
    Codec(String),
    #[error("{bytes} bytes is over the {PEER_MESSAGE_BYTES_MAX}-byte peer message limit")]
    TooLarge { bytes: usize },
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, WireError> {
    let bytes = encode_value(value).map_err(|error| WireError::Codec(error.to_string()))?;
    if bytes.len() > PEER_MESSAGE_BYTES_MAX {
        return Err(WireError::TooLarge { bytes: bytes.len() });
    }
    Ok(bytes)
}

/// Decodes exactly one value: over the limit, malformed or followed by trailing bytes is an
/// error, and a forged length prefix cannot make it reserve gigabytes (see `decode_value`).
fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, WireError> {
    if bytes.len() > PEER_MESSAGE_BYTES_MAX {
        return Err(WireError::TooLarge { bytes: bytes.len() });
    }
    decode_value(bytes, PEER_MESSAGE_BYTES_MAX).map_err(|error| WireError::Codec(error.to_string()))
}

fn digest(bytes: &[u8]) -> SecretDigest {
    Sha256::digest(bytes).into()
}

/// Compares two digests without stopping at the first difference, so the time taken says
/// nothing about how much of a guess was right.
fn constant_time_eq(left: &SecretDigest, right: &SecretDigest) -> bool {
    let difference = left
        .iter()
        .zip(right)
        .fold(0u8, |difference, (left, right)| difference | (left ^ right));
    std::hint::black_box(difference) == 0
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::Arc;

    use baton_raft_store::machine::Batch;
    use openraft::error::Fatal;
    use openraft::{CommittedLeaderId, Config, Entry, EntryPayload, LogId, SnapshotMeta, Vote};
    use tempfile::TempDir;
    use tokio::task::JoinHandle;

    use super::*;

    const SECRET: &str = "correct horse battery staple";

    #[test]
    fn append_request_round_trips() {
        let request = AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(3, 1),
            prev_log_id: Some(log_id(3, 7)),
            entries: vec![
                Entry {
                    log_id: log_id(3, 8),
                    payload: EntryPayload::Blank,
                },
                Entry {
                    log_id: log_id(3, 9),
                    payload: EntryPayload::Normal(Batch::tick(4_000)),
                },
            ],
            leader_commit: Some(log_id(3, 8)),
        };
        let bytes = encode(&request).expect("encode");
        let decoded: AppendEntriesRequest<TypeConfig> = decode(&bytes).expect("decode");
        assert_eq!(decoded.vote, request.vote);
        assert_eq!(decoded.prev_log_id, request.prev_log_id);
        assert_eq!(decoded.entries, request.entries);
        assert_eq!(decoded.leader_commit, request.leader_commit);
    }

    #[test]
    fn vote_request_round_trips() {
        let request = VoteRequest {
            vote: Vote::new(5, 2),
            last_log_id: Some(log_id(4, 12)),
        };
        let bytes = encode(&request).expect("encode");
        assert_eq!(decode::<VoteRequest<u64>>(&bytes).expect("decode"), request);
    }

    #[test]
    fn garbage_is_refused_without_panicking() {
        let valid = encode(&VoteRequest {
            vote: Vote::new(5, 2),
            last_log_id: Some(log_id(4, 12)),
        })
        .expect("encode");
        let mut garbage: Vec<Vec<u8>> = vec![Vec::new(), vec![0xff; 64]];
        // Every strict prefix of a valid message is truncated.
        garbage.extend((0..valid.len()).map(|length| valid[..length].to_vec()));
        let mut trailing = valid.clone();
        trailing.push(0);
        garbage.push(trailing);
        for bytes in &garbage {
            assert!(decode::<VoteRequest<u64>>(bytes).is_err(), "{bytes:?}");
            assert!(
                decode::<AppendEntriesRequest<TypeConfig>>(bytes).is_err(),
                "{bytes:?}"
            );
        }

        // A forged length prefix (u64::MAX entries) is refused, not allocated.
        let mut forged = encode(&AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(3, 1),
            prev_log_id: None,
            entries: Vec::new(),
            leader_commit: None,
        })
        .expect("encode");
        let entries_length_at = forged.len() - 2; // then `leader_commit: None` (1 byte)
        assert_eq!(forged[entries_length_at], 0);
        forged.splice(
            entries_length_at..=entries_length_at,
            [0xfd; 1].into_iter().chain([0xff; 8]),
        );
        assert!(decode::<AppendEntriesRequest<TypeConfig>>(&forged).is_err());

        // Random bytes: any answer but a panic.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..2_000 {
            let length = (next_random(&mut state) % 200) as usize;
            let bytes: Vec<u8> = (0..length).map(|_| next_random(&mut state) as u8).collect();
            let _ = decode::<AppendEntriesRequest<TypeConfig>>(&bytes);
            let _ = decode::<VoteRequest<u64>>(&bytes);
            let _ = decode::<InstallSnapshotRequest<TypeConfig>>(&bytes);
            let _ = decode::<Result<VoteResponse<u64>, RaftError<u64>>>(&bytes);
        }
    }

    #[test]
    fn oversized_append_asks_for_fewer_entries_until_one_entry_is_left() {
        match append_too_large(10, PEER_MESSAGE_BYTES_MAX + 1) {
            RPCError::PayloadTooLarge(too_large) => assert_eq!(too_large.entries_hint(), 5),
            other => panic!("expected PayloadTooLarge, got {other:?}"),
        }
        assert!(matches!(
            append_too_large(1, PEER_MESSAGE_BYTES_MAX + 1),
            RPCError::Network(_)
        ));
    }

    #[test]
    fn secrets_compare_by_digest_and_never_show() {
        assert!(constant_time_eq(&digest(b"same"), &digest(b"same")));
        assert!(!constant_time_eq(&digest(b"same"), &digest(b"sane")));
        assert!(!constant_time_eq(&digest(b"same"), &digest(b"same ")));

        let network = PeerNetwork::new(1, Some(SECRET.to_owned()), None).expect("network");
        assert!(!format!("{network:?}").contains(SECRET));
        assert!(matches!(
            PeerNetwork::new(1, Some(String::new()), None),
            Err(PeerNetworkError::InvalidSecret)
        ));
        assert!(matches!(
            PeerNetwork::new(1, Some("line\nbreak".to_owned()), None),
            Err(PeerNetworkError::InvalidSecret)
        ));
    }

    #[tokio::test]
    async fn vote_travels_over_loopback() {
        let peer = TestPeer::start(Some(SECRET)).await;
        let mut client = client_for(peer.address, Some(SECRET)).await;
        let response = client
            .vote(
                VoteRequest {
                    vote: Vote::new(5, 2),
                    last_log_id: None,
                },
                options(),
            )
            .await
            .expect("vote answered");
        assert_eq!(response.vote, Vote::new(5, 2));
        assert!(response.vote_granted);
        peer.stop().await;
    }

    #[tokio::test]
    async fn raft_errors_on_the_peer_arrive_as_remote_errors() {
        let peer = TestPeer::start(None).await;
        let mut client = client_for(peer.address, None).await;

        // A chunk that does not start at offset 0 of an unknown snapshot is an API error.
        let chunk = InstallSnapshotRequest {
            vote: Vote::new_committed(5, 2),
            meta: SnapshotMeta {
                snapshot_id: "5-2-9".to_owned(),
                ..SnapshotMeta::default()
            },
            offset: 10,
            data: vec![1, 2, 3],
            done: false,
        };
        match client.install_snapshot(chunk, options()).await {
            Err(RPCError::RemoteError(remote)) => {
                assert_eq!(remote.target, 1);
                assert!(matches!(
                    remote.source,
                    RaftError::APIError(InstallSnapshotError::SnapshotMismatch(_))
                ));
            }
            other => panic!("expected a snapshot mismatch, got {other:?}"),
        }

        peer.raft.shutdown().await.expect("shutdown");
        let vote = VoteRequest {
            vote: Vote::new(5, 2),
            last_log_id: None,
        };
        match client.vote(vote, options()).await {
            Err(RPCError::RemoteError(remote)) => {
                assert!(matches!(remote.source, RaftError::Fatal(Fatal::Stopped)));
            }
            other => panic!("expected a remote Fatal::Stopped, got {other:?}"),
        }
        peer.server.abort();
    }

    #[tokio::test]
    async fn wrong_or_missing_secret_is_refused() {
        let peer = TestPeer::start(Some(SECRET)).await;
        for secret in [Some("not the secret"), None] {
            let mut client = client_for(peer.address, secret).await;
            let vote = VoteRequest {
                vote: Vote::new(5, 2),
                last_log_id: None,
            };
            match client.vote(vote, options()).await {
                Err(RPCError::Network(error)) => {
                    let message = error.to_string();
                    assert!(message.contains("401"), "{message}");
                    assert!(!message.contains(SECRET), "{message}");
                }
                other => panic!("expected a refusal, got {other:?}"),
            }
        }
        peer.stop().await;
    }

    const ECHO_PATH: &str = "/raft/echo";

    /// `PeerNetwork::post` reaches the node's own peer routes behind the same secret, and tells
    /// a request that surely did not arrive from one that may have.
    #[tokio::test]
    async fn more_routes_answer_posts_behind_the_same_secret() {
        let peer = TestPeer::start(Some(SECRET)).await;
        let address = peer.address.to_string();
        let timeout = Duration::from_secs(5);
        let network = PeerNetwork::new(2, Some(SECRET.to_owned()), None).expect("network");
        let echoed = network
            .post(&address, ECHO_PATH, b"relayed".to_vec(), timeout)
            .await
            .expect("an answer");
        assert_eq!(&echoed[..], b"relayed");
        for secret in [Some("not the secret"), None] {
            let network = PeerNetwork::new(2, secret.map(str::to_owned), None).expect("network");
            match network
                .post(&address, ECHO_PATH, b"x".to_vec(), timeout)
                .await
            {
                Err(PeerPostError::MaybeDelivered(message)) => {
                    assert!(message.contains("401"), "{message}");
                    assert!(!message.contains(SECRET), "{message}");
                }
                other => panic!("expected a refusal, got {other:?}"),
            }
        }
        peer.stop().await;

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let closed = listener.local_addr().expect("address").to_string();
        drop(listener);
        assert!(matches!(
            network.post(&closed, ECHO_PATH, Vec::new(), timeout).await,
            Err(PeerPostError::NotDelivered(_))
        ));
    }

    #[tokio::test]
    async fn malformed_body_is_a_400() {
        let peer = TestPeer::start(None).await;
        let http = reqwest::Client::new();
        for path in [APPEND_PATH, VOTE_PATH, SNAPSHOT_PATH] {
            let response = http
                .post(format!("http://{}{path}", peer.address))
                .body(vec![0xff; 32])
                .send()
                .await
                .expect("sent");
            assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{path}");
        }
        peer.stop().await;
    }

    #[tokio::test]
    async fn closed_port_is_unreachable() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        drop(listener);
        let mut client = client_for(address, None).await;
        let vote = VoteRequest {
            vote: Vote::new(5, 2),
            last_log_id: None,
        };
        match client.vote(vote, options()).await {
            Err(RPCError::Unreachable(_)) => {}
            other => panic!("expected Unreachable, got {other:?}"),
        }
    }

    /// An address nothing can connect to is refused before anything is sent: unreachable for
    /// Raft, not delivered for a relay message, with the address in the reason.
    #[tokio::test]
    async fn a_peer_address_that_cannot_be_reached_is_never_sent_to() {
        let mut network = PeerNetwork::new(2, None, None).expect("network");
        let member = Member {
            api_addr: "127.0.0.1:1".to_owned(),
            peer_addr: "no such host:port".to_owned(),
        };
        let mut client = network.new_client(1, &member).await;
        let vote = VoteRequest {
            vote: Vote::new(5, 2),
            last_log_id: None,
        };
        match client.vote(vote, options()).await {
            Err(RPCError::Unreachable(unreachable)) => {
                assert!(
                    unreachable.to_string().contains("no such host:port"),
                    "{unreachable}"
                )
            }
            other => panic!("expected Unreachable, got {other:?}"),
        }
        let posted = network
            .post(
                "no such host:port",
                "/raft/echo",
                Vec::new(),
                Duration::from_secs(1),
            )
            .await;
        assert!(
            matches!(posted, Err(PeerPostError::NotDelivered(_))),
            "{posted:?}"
        );
    }

    /// A `PeerClient` keeps its connection between RPCs (and drops it after a failure: the
    /// timeout test below; a restarted peer is the failover integration tests').
    #[tokio::test]
    async fn rpcs_reuse_the_clients_connection() {
        let peer = TestPeer::start(None).await;
        let mut client = client_for(peer.address, None).await;
        assert!(client.connection.is_none());
        for _ in 0..2 {
            let vote = VoteRequest {
                vote: Vote::new(5, 2),
                last_log_id: None,
            };
            client.vote(vote, options()).await.expect("vote");
            let open = client
                .connection
                .as_ref()
                .map(|connection| !connection.send.is_closed());
            assert_eq!(open, Some(true));
        }
        peer.stop().await;
    }

    /// A peer that takes the TCP connection and never answers the TLS handshake (as one behind a
    /// partition that passes only the SYN would): the connect counts against the request's own
    /// time, so a relay message and an RPC give up within it, not after the 1 s connect bound,
    /// and neither was delivered.
    #[tokio::test]
    async fn a_connect_that_hangs_gives_up_within_the_requests_time() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        let holder = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let certified =
            rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).expect("cert");
        let pems = tempfile::tempdir().expect("temp dir");
        let identity = crate::tls::Identity {
            cert: pems.path().join("cert.pem"),
            key: pems.path().join("key.pem"),
        };
        std::fs::write(&identity.cert, certified.cert.pem()).expect("write the cert");
        std::fs::write(&identity.key, certified.signing_key.serialize_pem())
            .expect("write the key");
        let tls = crate::tls::client_config(&identity, &identity.cert).expect("client config");
        let mut network = PeerNetwork::new(2, None, Some(tls)).expect("network");
        let within = Duration::from_millis(200);
        let started = Instant::now();
        let posted = network.post(&address, ECHO_PATH, Vec::new(), within).await;
        assert!(
            matches!(posted, Err(PeerPostError::NotDelivered(_))),
            "{posted:?}"
        );
        assert!(
            started.elapsed() < Duration::from_millis(700),
            "{:?}",
            started.elapsed()
        );
        let member = Member {
            api_addr: "127.0.0.1:1".to_owned(),
            peer_addr: address,
        };
        let mut client = network.new_client(1, &member).await;
        let vote = VoteRequest {
            vote: Vote::new(5, 2),
            last_log_id: None,
        };
        let started = Instant::now();
        let voted = client.vote(vote, RPCOption::new(within)).await;
        assert!(matches!(voted, Err(RPCError::Unreachable(_))), "{voted:?}");
        assert!(
            started.elapsed() < Duration::from_millis(700),
            "{:?}",
            started.elapsed()
        );
        holder.abort();
    }

    #[tokio::test]
    async fn silent_peer_is_a_timeout() {
        // Accepts connections (the kernel completes the handshake) and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let mut client = client_for(address, None).await;
        let vote = VoteRequest {
            vote: Vote::new(5, 2),
            last_log_id: None,
        };
        let ttl = Duration::from_millis(200);
        match client.vote(vote, RPCOption::new(ttl)).await {
            Err(RPCError::Timeout(timeout)) => {
                assert_eq!((timeout.id, timeout.target, timeout.timeout), (2, 1, ttl));
            }
            other => panic!("expected Timeout, got {other:?}"),
        }
        // The connection a request may still be on is given up.
        assert!(client.connection.is_none());
        drop(listener);
    }

    /// A real single-node Raft (node 1, uninitialized) on a temp dir, served by `peer_router`
    /// on an ephemeral loopback port.
    struct TestPeer {
        raft: Raft<TypeConfig>,
        address: SocketAddr,
        server: JoinHandle<std::io::Result<()>>,
        _data_dir: TempDir,
    }

    impl TestPeer {
        async fn start(secret: Option<&str>) -> TestPeer {
            let data_dir = tempfile::tempdir().expect("temp dir");
            let (log_store, state_machine) =
                baton_raft_store::store::open(data_dir.path()).expect("open store");
            let config = Config {
                cluster_name: "baton-network-test".to_owned(),
                ..Config::default()
            };
            let config = Arc::new(config.validate().expect("config"));
            let network = PeerNetwork::new(1, secret.map(str::to_owned), None).expect("network");
            let raft = Raft::new(1, config, network, log_store, state_machine)
                .await
                .expect("raft");
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let address = listener.local_addr().expect("address");
            // A route of the node's own beside openraft's, as the relay's is mounted.
            let echo = Router::new().route(ECHO_PATH, post(|body: Bytes| async move { body }));
            let router = peer_router(raft.clone(), secret.map(str::to_owned), echo);
            let server = tokio::spawn(async move { axum::serve(listener, router).await });
            TestPeer {
                raft,
                address,
                server,
                _data_dir: data_dir,
            }
        }

        async fn stop(self) {
            self.raft.shutdown().await.expect("shutdown");
            self.server.abort();
        }
    }

    /// Node 2's client for node 1 at `address`.
    async fn client_for(address: SocketAddr, secret: Option<&str>) -> PeerClient {
        let mut network = PeerNetwork::new(2, secret.map(str::to_owned), None).expect("network");
        let member = Member {
            api_addr: "127.0.0.1:1".to_owned(),
            peer_addr: address.to_string(),
        };
        network.new_client(1, &member).await
    }

    fn options() -> RPCOption {
        RPCOption::new(Duration::from_secs(5))
    }

    fn log_id(term: u64, index: u64) -> LogId<u64> {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    /// xorshift64: a seeded, replayable stream of garbage.
    fn next_random(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }
}
