//! The peer network of `batond`: how one node's Raft reaches another's, both ends of it.
//!
//! The client side is `PeerNetwork` (openraft's `RaftNetworkFactory`, and `post` for the write
//! relay) and `PeerClient` (openraft's `RaftNetworkV2` for one target). Each speaks over HTTP/1.1
//! connections of its own (`Connection`, hyper's bare client over TCP, or TLS with peer TLS): a
//! `PeerClient` keeps one connection to its target, since openraft sends it one RPC at a time,
//! and `post` takes an idle connection to the address or opens one. reqwest's pooled client cost
//! a busy leader a quarter of its CPU in the replication streams (docs/performance.md).
//!
//! The server side is `peer_router`, the axum router mounted on `--peer-listen`. Both speak the
//! same tiny protocol: a POST to `/raft/append`, `/raft/vote`, `/raft/pre-vote`,
//! `/raft/transfer-leader` or `/raft/snapshot` whose body is the request in bincode (serde,
//! standard config), answered 200 with `Result<response, RaftError>` in bincode.
//!
//! The protocol is the one the release before openraft 0.10 spoke, so that old and new nodes
//! serve together during a rolling upgrade: a vote that is not part of a leadership transfer
//! travels without the field 0.10 added (`wire::VoteOf09`), and a snapshot travels in chunks of
//! openraft 0.9's layout (`wire::SnapshotChunk`), read from the snapshot file a chunk at a
//! time, which the receiving side writes to a file of its own as it comes
//! (`SnapshotInbox`) and installs from there: no snapshot is held whole in memory. Pre-vote and leadership transfer are new routes: an old node answers them 404, which
//! counts as a refusal.
//! Every body, in either direction, is bounded by `PEER_MESSAGE_BYTES_MAX` and decoded with that
//! limit: garbage is an error, never a panic. With a cluster secret, every request carries it in
//! `Baton-Cluster-Secret` and the server compares it in constant time.
//!
//! Every request also names the node it is meant for (`Baton-Peer-To`) and, once the sender
//! knows it, its cluster (`Baton-Cluster`, the data dir's `ClusterId`); the server answers 421
//! to a request meant for another node or another cluster, before reading its body
//! (`Identity`). So a node of a cluster that was replaced and still runs, or an address given
//! for the wrong node, never reaches a Raft. A request without those headers (a node of an
//! earlier release, during a rolling upgrade) is served as before.
//!
//! What must never live here: the client API (its routes, its error table, its status codes are
//! the `http` module's), anything that interprets commands, and the cluster secret in a log line,
//! an error message or a `Debug` output.

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
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
use baton_raft_store::store::{
    ClusterFile, ClusterId, Member, Raft, Snapshot, SnapshotData, SnapshotInbox, StoreError,
    TypeConfig, Vote,
};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use openraft::async_runtime::WatchReceiver;
use openraft::errors::{
    NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::{OptionalSend, RPCTypes};
use rustls::pki_types::ServerName;
use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::TlsConnector;

/// The header that carries the cluster secret on every peer request when one is configured.
pub const CLUSTER_SECRET_HEADER: &str = "baton-cluster-secret";
/// The header naming the cluster a peer request is meant for.
const CLUSTER_HEADER: &str = "baton-cluster";
/// The header naming the node a peer request is meant for.
const PEER_TO_HEADER: &str = "baton-peer-to";

/// Which node this is and which cluster it belongs to, as its peers see it: named in every peer
/// request it sends, checked in every one it receives. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Identity {
    node_id: u64,
    cluster: Arc<Mutex<Option<ClusterId>>>,
    /// Where a cluster learned later is recorded (none in the network's own tests).
    file: Option<ClusterFile>,
}

impl Identity {
    /// Node `node_id`, of the cluster its data dir records, if it records one.
    pub fn of(node_id: u64, file: ClusterFile) -> Result<Identity, StoreError> {
        Ok(Identity {
            node_id,
            cluster: Arc::new(Mutex::new(file.read()?)),
            file: Some(file),
        })
    }

    /// Node `node_id` with no data dir: a cluster it learns is kept in memory only.
    #[cfg(test)]
    fn in_memory(node_id: u64, cluster: Option<ClusterId>) -> Identity {
        Identity {
            node_id,
            cluster: Arc::new(Mutex::new(cluster)),
            file: None,
        }
    }

    pub fn cluster(&self) -> Option<ClusterId> {
        *self
            .cluster
            .lock()
            .expect("the identity's lock is never poisoned")
    }

    /// Makes `named` this node's cluster, durably, unless it has one already; returns the one
    /// it has afterwards. Only a node that is a member of nothing yet may learn one: a new
    /// cluster's bootstrap, or a member added to a cluster, from the first request it gets.
    pub fn adopt(&self, named: ClusterId) -> Result<ClusterId, StoreError> {
        let mut cluster = self
            .cluster
            .lock()
            .expect("the identity's lock is never poisoned");
        if let Some(own) = *cluster {
            return Ok(own);
        }
        if let Some(file) = &self.file {
            file.write(named)?;
        }
        *cluster = Some(named);
        Ok(named)
    }
}

/// The largest peer message, request or response, in bytes. It bounds what a node accepts, what
/// it decodes and what it sends: the log store reads at most a quarter of it of entries for one
/// append (`REPLICATION_READ_BYTES_MAX`), and a snapshot travels in chunks of at most
/// `SNAPSHOT_CHUNK_BYTES_MAX`.
pub const PEER_MESSAGE_BYTES_MAX: usize = 64 << 20;

/// The largest chunk of a snapshot sent in one message (openraft's `snapshot_max_chunk_size`
/// asks for less by default).
pub const SNAPSHOT_CHUNK_BYTES_MAX: usize = 16 << 20;

/// The largest snapshot a node gathers from its chunks: a bound on the disk one transfer takes
/// (a million leases encode to about 45 MB; the snapshot file holds at most 4 GiB).
pub const SNAPSHOT_BYTES_MAX: u64 = 2 << 30;

/// How long opening a TCP connection to a peer may take before the peer counts as unreachable.
pub const PEER_CONNECT_TIMEOUT_MS: u64 = 1_000;

/// The error a peer RPC returns to openraft: a timeout, an unreachable peer, or a network error.
pub type PeerRpcError = RPCError<TypeConfig>;

/// Why the peer network could not be built: a configuration mistake found at start-up.
#[derive(Debug, thiserror::Error)]
pub enum PeerNetworkError {
    /// The secret is empty or is not a valid HTTP header value (visible ASCII). The message
    /// deliberately does not repeat the secret.
    #[error("the cluster secret must be non-empty visible ASCII (it travels as an HTTP header)")]
    InvalidSecret,
}

/// When this node last accepted an append (a heartbeat included) from its leader: how a
/// follower knows it is still in touch with one. With pre-vote a follower cut off from the
/// others never campaigns, so openraft goes on naming its last leader; contact tells the two
/// apart. Cloning is cheap and shares the reading.
#[derive(Debug, Clone)]
pub struct LeaderContact {
    epoch: Instant,
    /// Milliseconds from `epoch` to the last contact, plus one (0: never).
    last_ms: Arc<std::sync::atomic::AtomicU64>,
}

impl Default for LeaderContact {
    fn default() -> LeaderContact {
        LeaderContact {
            epoch: Instant::now(),
            last_ms: Arc::default(),
        }
    }
}

impl LeaderContact {
    fn touch(&self) {
        let now_ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(
            now_ms.saturating_add(1),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Whether the last contact is less than `within` ago.
    pub fn within(&self, within: Duration) -> bool {
        match self.last_ms.load(std::sync::atomic::Ordering::Relaxed) {
            0 => false,
            last_ms => {
                let since = self
                    .epoch
                    .elapsed()
                    .saturating_sub(Duration::from_millis(last_ms - 1));
                since < within
            }
        }
    }
}

/// openraft's network factory for a Baton node: hands out one `PeerClient` per target, each with
/// a connection of its own; `post`'s idle connections are shared by the clones. Cloning is cheap.
#[derive(Clone)]
pub struct PeerNetwork {
    identity: Identity,
    secret: Option<HeaderValue>,
    /// With peer TLS: the client side of the handshake (the peer CA, this node's certificate).
    tls: Option<TlsConnector>,
    /// `post`'s connections not in use, by peer address.
    idle: Arc<Mutex<HashMap<String, Vec<Connection>>>>,
}

/// Idle connections `post` keeps per peer address at most (the relay has four messages out).
const IDLE_CONNECTIONS_MAX: usize = 8;

impl PeerNetwork {
    /// A network for the node `identity` names, sending `secret` with every peer request when
    /// it is `Some`. Fails on an empty or non-header-safe secret, so a node never
    /// starts with a secret its peers could not receive.
    /// With `tls` (`tls::client_config`: the peer CA and this node's certificate), every peer is
    /// reached over TLS.
    pub fn new(
        identity: Identity,
        secret: Option<String>,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Result<Self, PeerNetworkError> {
        let secret = secret.map(|secret| secret_header(&secret)).transpose()?;
        let tls = tls.map(TlsConnector::from);
        Ok(Self {
            identity,
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
        (to, peer_addr): (u64, &str),
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
                .exchange(&mut open, (to, peer_addr), path, body.clone(), deadline)
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

    /// POSTs `body` to `path` on `connection` for node `to`, with the cluster secret when one is
    /// set and the cluster when this node knows it, and reads the whole answer (at most
    /// `PEER_MESSAGE_BYTES_MAX` bytes) before `deadline`.
    async fn exchange(
        &self,
        connection: &mut Connection,
        (to, peer_addr): (u64, &str),
        path: &str,
        body: Bytes,
        deadline: Instant,
    ) -> Result<(StatusCode, Bytes), ExchangeError> {
        let mut request = axum::http::Request::post(path)
            .header(header::HOST, peer_addr)
            .header(header::CONTENT_TYPE, OCTET_STREAM)
            .header(PEER_TO_HEADER, to);
        if let Some(secret) = &self.secret {
            request = request.header(CLUSTER_SECRET_HEADER, secret.clone());
        }
        if let Some(cluster) = self.identity.cluster() {
            request = request.header(CLUSTER_HEADER, cluster.to_string());
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
    /// POSTs `body` to `path` on the peer listener of node `to` at `peer_addr`, with the
    /// cluster secret when one is set, and returns the 200 answer's body (at most
    /// `PEER_MESSAGE_BYTES_MAX` bytes). For peer routes other than openraft's own (the write
    /// relay); the bytes are the caller's. A 421 (meant for another node or cluster: see
    /// `Identity`) was refused before anything was read, so it is `NotDelivered`.
    pub async fn post(
        &self,
        (to, peer_addr): (u64, &str),
        path: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Bytes, PeerPostError> {
        let deadline = Instant::now() + timeout;
        let mut connection = self.take_idle(peer_addr);
        let (status, body) = match self
            .send(
                &mut connection,
                (to, peer_addr),
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
            let refusal = refused(&format!("peer {peer_addr}"), path, status, &body);
            return Err(if status == StatusCode::MISDIRECTED_REQUEST {
                PeerPostError::NotDelivered(refusal)
            } else {
                PeerPostError::MaybeDelivered(refusal)
            });
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
            .field("node_id", &self.identity.node_id)
            .field("secret", &redacted(&self.secret))
            .finish_non_exhaustive()
    }
}

/// openraft's connection to one peer: each RPC is one HTTP POST on a connection this client
/// keeps to its target (opened again after any failure), bounded by the RPC's hard TTL.
///
/// Errors: a connection that cannot be opened (refused, connect timeout, DNS, a TLS handshake
/// refused, an unusable address) is `Unreachable`, so openraft backs off, and so is a peer
/// that answers with a fatal Raft error (it is stopping); a timeout once the request may have
/// been sent is `Timeout`; a broken connection, a non-2xx answer (an old node without the
/// route included) or an undecodable one is `Network`.
pub struct PeerClient {
    target: u64,
    member: Member,
    network: PeerNetwork,
    connection: Option<Connection>,
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, PeerRpcError> {
        let body = encode(&rpc).map_err(|error| network_error(&error))?;
        self.call(RPCTypes::AppendEntries, APPEND_PATH, body, &option)
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, PeerRpcError> {
        let body = wire::encode_vote(&rpc).map_err(|error| network_error(&error))?;
        self.call(RPCTypes::Vote, VOTE_PATH, body, &option).await
    }

    /// A pre-vote is answered by the peer's own rules and changes nothing there. Any failure
    /// is an error, never a grant: an unreachable peer, or one of the release before, which has
    /// no such route, does not count toward the candidate's quorum.
    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, PeerRpcError> {
        let body = wire::encode_vote(&rpc).map_err(|error| network_error(&error))?;
        self.call(RPCTypes::Vote, PRE_VOTE_PATH, body, &option)
            .await
    }

    async fn transfer_leader(
        &mut self,
        rpc: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, PeerRpcError> {
        let body = encode(&rpc).map_err(|error| network_error(&error))?;
        self.call(
            RPCTypes::TransferLeader,
            TRANSFER_LEADER_PATH,
            body,
            &option,
        )
        .await
    }

    /// Sends the snapshot in chunks of openraft 0.9's layout, each a message of its own bounded
    /// by the RPC's hard TTL, and stops at once when openraft closes the replication (`cancel`)
    /// or the peer answers with a higher vote.
    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl std::future::Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let chunk_bytes = option
            .snapshot_chunk_size()
            .unwrap_or(SNAPSHOT_CHUNK_BYTES_MAX)
            .clamp(1, SNAPSHOT_CHUNK_BYTES_MAX);
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            sent = self.send_snapshot(vote, snapshot, chunk_bytes, &option) => {
                sent.map_err(StreamingError::from)
            }
        }
    }
}

impl PeerClient {
    /// Sends `snapshot` in chunks of `chunk_bytes`, one message each; returns the peer's answer
    /// to the last chunk, or to the first that shows a higher vote than `vote`.
    async fn send_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        chunk_bytes: usize,
        option: &RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, PeerRpcError> {
        let Snapshot { meta, mut snapshot } = snapshot;
        let total = snapshot.len();
        let mut offset = 0;
        loop {
            // Reading the snapshot file is blocking I/O: off the async workers.
            let (read, rest) = tokio::task::spawn_blocking(move || {
                let mut data = Vec::new();
                let read = (&mut snapshot)
                    .take(chunk_bytes as u64)
                    .read_to_end(&mut data)
                    .map(|_| data);
                (read, snapshot)
            })
            .await
            .map_err(|error| network_error(&error))?;
            snapshot = rest;
            let data = read.map_err(|error| network_error(&error))?;
            let end = offset + data.len() as u64;
            if data.is_empty() && end < total {
                let ended = std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("the snapshot ended at byte {end} of {total}"),
                );
                return Err(network_error(&ended));
            }
            let chunk = wire::SnapshotChunk {
                vote,
                meta: meta.clone(),
                offset,
                data,
                done: end >= total,
            };
            let body = encode(&chunk).map_err(|error| network_error(&error))?;
            let answer: SnapshotResponse<TypeConfig> = self
                .call(RPCTypes::InstallSnapshot, SNAPSHOT_PATH, body, option)
                .await?;
            if chunk.done || answer.vote > vote {
                return Ok(answer);
            }
            offset = end;
        }
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

/// The peer-facing router: `POST /raft/append`, `/raft/vote`, `/raft/pre-vote`,
/// `/raft/transfer-leader` and `/raft/snapshot`, each taking the bincode request and answering
/// 200 with the bincode `Result<response, RaftError>` of the local `raft`. A malformed body is
/// 400 with a short reason, a body over `PEER_MESSAGE_BYTES_MAX` is 413, a snapshot chunk that
/// does not follow the one before is 409. With `secret`, a request without the right
/// `Baton-Cluster-Secret` is 401 before its body is read. The secret is expected to have been
/// validated at the edge like `PeerNetwork::new` does (non-empty, header-safe). `more` adds the
/// node's other peer routes (the write relay), behind the same secret check and body limit.
pub fn peer_router(
    raft: Raft,
    inbox: SnapshotInbox,
    contact: LeaderContact,
    secret: Option<String>,
    identity: Identity,
    more: Router,
) -> Router {
    // Only the digest is kept: the comparison is over fixed-length digests, so neither the
    // secret's bytes nor its length leak through timing.
    let secret_digest = secret.map(|secret| digest(secret.as_bytes()));
    let state = PeerState {
        raft: raft.clone(),
        contact,
        inbox,
        receiving: Arc::default(),
    };
    Router::new()
        .route(APPEND_PATH, post(serve_append))
        .route(VOTE_PATH, post(serve_vote))
        .route(PRE_VOTE_PATH, post(serve_pre_vote))
        .route(TRANSFER_LEADER_PATH, post(serve_transfer_leader))
        .route(SNAPSHOT_PATH, post(serve_snapshot))
        .with_state(state)
        .merge(more)
        .route_layer(middleware::from_fn_with_state(
            (identity, raft),
            check_identity,
        ))
        .route_layer(middleware::from_fn_with_state(secret_digest, authenticate))
        .layer(DefaultBodyLimit::max(PEER_MESSAGE_BYTES_MAX))
}

/// What the peer routes share: the node's Raft, its contact with the leader, where snapshots
/// are gathered, and the snapshot being gathered from its chunks.
#[derive(Clone)]
struct PeerState {
    raft: Raft,
    contact: LeaderContact,
    inbox: SnapshotInbox,
    receiving: Arc<Mutex<Option<wire::Gathered>>>,
}

// ---- helpers ----

const APPEND_PATH: &str = "/raft/append";
const VOTE_PATH: &str = "/raft/vote";
const PRE_VOTE_PATH: &str = "/raft/pre-vote";
const TRANSFER_LEADER_PATH: &str = "/raft/transfer-leader";
const SNAPSHOT_PATH: &str = "/raft/snapshot";
const OCTET_STREAM: &str = "application/octet-stream";
/// How much of a non-2xx answer's body is quoted in the error, in bytes.
const ERROR_BODY_QUOTE_BYTES_MAX: usize = 256;

type SecretDigest = [u8; 32];

impl PeerClient {
    /// Sends one encoded request and decodes the peer's `Result<Resp, RaftError>`.
    async fn call<Resp>(
        &mut self,
        rpc_type: RPCTypes,
        path: &str,
        body: Vec<u8>,
        option: &RPCOption,
    ) -> Result<Resp, PeerRpcError>
    where
        Resp: DeserializeOwned,
    {
        let ttl = option.hard_ttl();
        let deadline = Instant::now() + ttl;
        let sent = self
            .network
            .send(
                &mut self.connection,
                (self.target, &self.member.peer_addr),
                path,
                Bytes::from(body),
                deadline,
            )
            .await;
        let (status, body) = match sent {
            Ok(answer) => answer,
            Err(ExchangeError::NotSent(error)) => {
                return Err(RPCError::Unreachable(Unreachable::from_string(error)))
            }
            Err(ExchangeError::TimedOut) => {
                return Err(RPCError::Timeout(Timeout {
                    action: rpc_type,
                    id: self.network.identity.node_id,
                    target: self.target,
                    timeout: ttl,
                }))
            }
            Err(ExchangeError::Failed(error)) => {
                return Err(RPCError::Network(NetworkError::from_string(format!(
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
            if status == StatusCode::MISDIRECTED_REQUEST {
                // Another node or another cluster answers at that address: openraft backs off
                // from an unreachable peer instead of sending again at once.
                tracing::warn!(target = self.target, %message, "a peer refused a request meant for another node or cluster");
                return Err(RPCError::Unreachable(Unreachable::from_string(message)));
            }
            return Err(RPCError::Network(NetworkError::from_string(message)));
        }
        let answer: Result<Resp, RaftError<TypeConfig>> =
            decode(&body).map_err(|error| network_error(&error))?;
        answer.map_err(|raft_error| {
            RPCError::Unreachable(Unreachable::from_string(format!(
                "peer {} is stopping: {raft_error}",
                self.target
            )))
        })
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

fn network_error<E: std::error::Error + 'static>(error: &E) -> PeerRpcError {
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

/// Answers 421 to a request meant for another node or another cluster (see `Identity`); a node
/// that is a member of nothing yet learns its cluster from the first request that names one.
async fn check_identity(
    State((identity, raft)): State<(Identity, Raft)>,
    request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    if let Some(to) = headers.get(PEER_TO_HEADER) {
        let to = to.to_str().ok().and_then(|to| to.parse::<u64>().ok());
        if to != Some(identity.node_id) {
            let to = to.map_or_else(|| "?".to_owned(), |to| to.to_string());
            return misdirected(format!(
                "this is node {}, not node {to}: the sender's membership gives this address to another node",
                identity.node_id
            ));
        }
    }
    if let Some(named) = headers.get(CLUSTER_HEADER) {
        let Some(named) = named
            .to_str()
            .ok()
            .and_then(|named| named.parse::<ClusterId>().ok())
        else {
            return (StatusCode::BAD_REQUEST, "Baton-Cluster is not a cluster id").into_response();
        };
        let own = match identity.cluster() {
            Some(own) => own,
            // A member of nothing yet: the cluster that added it (or the one it bootstraps
            // with) is the first to speak to it.
            None if !raft.is_initialized().await.unwrap_or(true) => {
                match identity.adopt(named) {
                    Ok(own) => {
                        tracing::info!(cluster = %own, "joined cluster");
                        own
                    }
                    Err(error) => {
                        tracing::error!(%error, "recording the cluster id failed");
                        return (StatusCode::INTERNAL_SERVER_ERROR, "recording the cluster id failed")
                            .into_response();
                    }
                }
            }
            None => {
                return misdirected(format!(
                    "this node belongs to a cluster made before clusters had ids, not to cluster {named}"
                ))
            }
        };
        if own != named {
            return misdirected(format!(
                "this node belongs to cluster {own}, not {named}: is an old or another cluster's node still running at an address of this one?"
            ));
        }
    }
    next.run(request).await
}

fn misdirected(reason: String) -> Response {
    tracing::warn!(%reason, "refused a peer request meant for another node or cluster");
    (StatusCode::MISDIRECTED_REQUEST, reason).into_response()
}

async fn serve_append(State(peer): State<PeerState>, body: Bytes) -> Response {
    match decode::<AppendEntriesRequest<TypeConfig>>(&body) {
        Ok(request) => {
            let answered = peer.raft.append_entries(request).await;
            // Any answer but a higher vote means the sender is this node's leader.
            if matches!(&answered, Ok(response) if !matches!(response, AppendEntriesResponse::HigherVote(_)))
            {
                peer.contact.touch();
            }
            answer(&answered)
        }
        Err(error) => malformed(APPEND_PATH, &error),
    }
}

async fn serve_vote(State(peer): State<PeerState>, body: Bytes) -> Response {
    match wire::decode_vote(&body) {
        Ok(request) => answer(&peer.raft.vote(request).await),
        Err(error) => malformed(VOTE_PATH, &error),
    }
}

async fn serve_pre_vote(State(peer): State<PeerState>, body: Bytes) -> Response {
    match wire::decode_vote(&body) {
        Ok(request) => answer(&peer.raft.pre_vote(request).await),
        Err(error) => malformed(PRE_VOTE_PATH, &error),
    }
}

async fn serve_transfer_leader(State(peer): State<PeerState>, body: Bytes) -> Response {
    match decode::<TransferLeaderRequest<TypeConfig>>(&body) {
        Ok(request) => {
            let handled = peer
                .raft
                .handle_transfer_leader(request)
                .await
                .map_err(RaftError::<TypeConfig>::Fatal);
            answer(&handled)
        }
        Err(error) => malformed(TRANSFER_LEADER_PATH, &error),
    }
}

/// One chunk of a snapshot: gathered in order into a file; the last one installs the snapshot
/// from it. Every chunk is answered with this node's vote, so a deposed sender learns of it
/// early. A chunk out of order is 409; one that cannot be written, 500: either way the sender
/// starts over.
async fn serve_snapshot(State(peer): State<PeerState>, body: Bytes) -> Response {
    let chunk = match decode::<wire::SnapshotChunk>(&body) {
        Ok(chunk) => chunk,
        Err(error) => return malformed(SNAPSHOT_PATH, &error),
    };
    let (receiving, inbox) = (peer.receiving.clone(), peer.inbox.clone());
    // Writing the chunk is blocking I/O: off the async workers.
    let gathered = tokio::task::spawn_blocking(move || {
        let mut receiving = receiving
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        wire::gather(&mut receiving, &inbox, chunk)?;
        match receiving.take_if(|gathered| gathered.done) {
            Some(gathered) => Ok(Some((
                gathered.vote,
                gathered.meta,
                gathered.data.finish()?,
            ))),
            None => Ok(None),
        }
    })
    .await
    .unwrap_or_else(|error| Err(wire::Refusal::Failed(error.to_string())));
    let (vote, meta, data) = match gathered {
        Ok(Some(done)) => done,
        Ok(None) => {
            let vote = peer.raft.metrics().borrow_watched().vote;
            let answered = SnapshotResponse::<TypeConfig>::new(vote);
            return answer(&Ok::<_, RaftError<TypeConfig>>(answered));
        }
        Err(wire::Refusal::OutOfOrder(refusal)) => {
            tracing::warn!(refusal, "refused a snapshot chunk");
            return (StatusCode::CONFLICT, refusal).into_response();
        }
        Err(wire::Refusal::Failed(error)) => {
            tracing::error!(%error, "gathering a snapshot failed");
            return (StatusCode::INTERNAL_SERVER_ERROR, error).into_response();
        }
    };
    let snapshot = Snapshot {
        meta,
        snapshot: data,
    };
    let installed = peer
        .raft
        .install_full_snapshot(vote, snapshot)
        .await
        .map_err(RaftError::<TypeConfig>::Fatal);
    answer(&installed)
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

/// The peer protocol's own message shapes: those of the release before openraft 0.10, so that
/// old and new nodes understand each other during a rolling upgrade.
mod wire {
    use baton_raft_store::store::{
        LogId, ReceivingSnapshot, SnapshotInbox, SnapshotMeta, StoreError,
    };
    use serde::{Deserialize, Serialize};

    use super::{decode, encode, TypeConfig, Vote, VoteRequest, WireError, SNAPSHOT_BYTES_MAX};

    /// A vote request as openraft 0.9 encodes it: 0.10 added `leadership_transfer` after these.
    #[derive(Serialize, Deserialize)]
    struct VoteOf09 {
        vote: Vote,
        last_log_id: Option<LogId>,
    }

    /// A vote request for the wire: in 0.9's shape, unless it is a leadership transfer's, which
    /// only a node of this release may grant (an old one refuses the longer message).
    pub(super) fn encode_vote(request: &VoteRequest<TypeConfig>) -> Result<Vec<u8>, WireError> {
        if request.leadership_transfer {
            return encode(request);
        }
        encode(&VoteOf09 {
            vote: request.vote,
            last_log_id: request.last_log_id,
        })
    }

    /// A vote request in either shape: exactly one of them decodes a given message whole.
    pub(super) fn decode_vote(bytes: &[u8]) -> Result<VoteRequest<TypeConfig>, WireError> {
        match decode::<VoteOf09>(bytes) {
            Ok(old) => Ok(VoteRequest::new(old.vote, old.last_log_id)),
            Err(_) => decode::<VoteRequest<TypeConfig>>(bytes),
        }
    }

    /// One chunk of a snapshot, in the layout of openraft 0.9's `InstallSnapshotRequest`.
    #[derive(Debug, Serialize, Deserialize)]
    pub(super) struct SnapshotChunk {
        pub(super) vote: Vote,
        pub(super) meta: SnapshotMeta,
        /// Where `data` starts in the snapshot's bytes.
        pub(super) offset: u64,
        pub(super) data: Vec<u8>,
        /// The last chunk.
        pub(super) done: bool,
    }

    /// A snapshot being gathered from its chunks.
    #[derive(Debug)]
    pub(super) struct Gathered {
        pub(super) vote: Vote,
        pub(super) meta: SnapshotMeta,
        pub(super) data: ReceivingSnapshot,
        /// Its last chunk arrived.
        pub(super) done: bool,
    }

    /// Why a chunk was not gathered.
    #[derive(Debug)]
    pub(super) enum Refusal {
        /// It does not continue the snapshot being gathered, or would take it past
        /// `SNAPSHOT_BYTES_MAX`.
        OutOfOrder(String),
        /// It could not be written.
        Failed(String),
    }

    impl From<StoreError> for Refusal {
        fn from(error: StoreError) -> Refusal {
            Refusal::Failed(error.to_string())
        }
    }

    /// Adds `chunk` to the snapshot being gathered, written to its file in `inbox`. A chunk at
    /// offset 0 starts a transfer afresh (one at a time: a newer transfer replaces an unfinished
    /// one, whose file goes); any other must continue the one gathered, from the same vote and
    /// meta at the next byte. A refusal leaves the sender to start over, and past
    /// `SNAPSHOT_BYTES_MAX` drops what was gathered. Blocking.
    pub(super) fn gather(
        receiving: &mut Option<Gathered>,
        inbox: &SnapshotInbox,
        chunk: SnapshotChunk,
    ) -> Result<(), Refusal> {
        if chunk.offset == 0 {
            *receiving = None;
            *receiving = Some(Gathered {
                vote: chunk.vote,
                meta: chunk.meta,
                data: inbox.receive()?,
                done: false,
            });
        } else {
            let follows = receiving.as_ref().is_some_and(|gathered| {
                gathered.vote == chunk.vote
                    && gathered.meta == chunk.meta
                    && gathered.data.len() == chunk.offset
            });
            if !follows {
                return Err(Refusal::OutOfOrder(format!(
                    "a chunk at byte {} of a snapshot that is not being received up to there",
                    chunk.offset
                )));
            }
        }
        let Some(gathered) = receiving.as_mut() else {
            return Err(Refusal::OutOfOrder(
                "no snapshot is being received".to_owned(),
            ));
        };
        if gathered.data.len() + chunk.data.len() as u64 > SNAPSHOT_BYTES_MAX {
            *receiving = None;
            return Err(Refusal::OutOfOrder(format!(
                "a snapshot over the {SNAPSHOT_BYTES_MAX}-byte limit"
            )));
        }
        if let Err(error) = gathered.data.append(&chunk.data) {
            *receiving = None;
            return Err(error.into());
        }
        gathered.done = chunk.done;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::Arc;

    use baton_raft_store::machine::Batch;
    use baton_raft_store::store::{Entry, LogId, SnapshotMeta};
    use openraft::{Config, EntryPayload};
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

    /// A plain vote travels in openraft 0.9's shape, one byte shorter than 0.10's; a leadership
    /// transfer's in 0.10's. Both decode as what was sent.
    #[test]
    fn vote_requests_round_trip_in_either_shape() {
        let plain = VoteRequest::new(Vote::new(5, 2), Some(log_id(4, 12)));
        let mut transfer = plain.clone();
        transfer.leadership_transfer = true;
        let plain_bytes = wire::encode_vote(&plain).expect("encode");
        let transfer_bytes = wire::encode_vote(&transfer).expect("encode");
        assert_eq!(transfer_bytes.len(), plain_bytes.len() + 1);
        assert_eq!(wire::decode_vote(&plain_bytes).expect("decode"), plain);
        assert_eq!(
            wire::decode_vote(&transfer_bytes).expect("decode"),
            transfer
        );
    }

    #[test]
    fn garbage_is_refused_without_panicking() {
        let valid = wire::encode_vote(&VoteRequest::new(Vote::new(5, 2), Some(log_id(4, 12))))
            .expect("encode");
        let mut garbage: Vec<Vec<u8>> = vec![Vec::new(), vec![0xff; 64]];
        // Every strict prefix of a valid message is truncated.
        garbage.extend((0..valid.len()).map(|length| valid[..length].to_vec()));
        // Bytes after a plain vote (one would be 0.10's `leadership_transfer`, two an append).
        let mut trailing = valid.clone();
        trailing.extend([0, 0, 0]);
        garbage.push(trailing);
        for bytes in &garbage {
            assert!(wire::decode_vote(bytes).is_err(), "{bytes:?}");
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
            let _ = wire::decode_vote(&bytes);
            let _ = decode::<wire::SnapshotChunk>(&bytes);
            let _ = decode::<Result<VoteResponse<TypeConfig>, RaftError<TypeConfig>>>(&bytes);
        }
    }

    #[test]
    fn secrets_compare_by_digest_and_never_show() {
        assert!(constant_time_eq(&digest(b"same"), &digest(b"same")));
        assert!(!constant_time_eq(&digest(b"same"), &digest(b"sane")));
        assert!(!constant_time_eq(&digest(b"same"), &digest(b"same ")));

        let network = PeerNetwork::new(Identity::in_memory(1, None), Some(SECRET.to_owned()), None)
            .expect("network");
        assert!(!format!("{network:?}").contains(SECRET));
        assert!(matches!(
            PeerNetwork::new(Identity::in_memory(1, None), Some(String::new()), None),
            Err(PeerNetworkError::InvalidSecret)
        ));
        assert!(matches!(
            PeerNetwork::new(
                Identity::in_memory(1, None),
                Some("line\nbreak".to_owned()),
                None
            ),
            Err(PeerNetworkError::InvalidSecret)
        ));
    }

    #[tokio::test]
    async fn vote_travels_over_loopback() {
        let peer = TestPeer::start(Some(SECRET)).await;
        let mut client = client_for(peer.address, Some(SECRET)).await;
        let response = client
            .vote(VoteRequest::new(Vote::new(5, 2), None), options())
            .await
            .expect("vote answered");
        assert_eq!(response.vote, Vote::new(5, 2));
        assert!(response.vote_granted);
        peer.stop().await;
    }

    /// A chunk that does not continue the snapshot being gathered is refused (the sender
    /// starts over); a peer whose Raft stopped is unreachable.
    #[tokio::test]
    async fn a_stray_chunk_is_refused_and_a_stopped_peer_is_unreachable() {
        let peer = TestPeer::start(None).await;
        let mut client = client_for(peer.address, None).await;
        let chunk = wire::SnapshotChunk {
            vote: Vote::new_committed(5, 2),
            meta: SnapshotMeta::default(),
            offset: 10,
            data: vec![1, 2, 3],
            done: false,
        };
        let body = encode(&chunk).expect("encode");
        let refused = client
            .call::<SnapshotResponse<TypeConfig>>(
                RPCTypes::InstallSnapshot,
                SNAPSHOT_PATH,
                body,
                &options(),
            )
            .await;
        match refused {
            Err(RPCError::Network(error)) => {
                assert!(error.to_string().contains("409"), "{error}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }

        peer.raft.shutdown().await.expect("shutdown");
        let vote = VoteRequest::new(Vote::new(5, 2), None);
        match client.vote(vote, options()).await {
            Err(RPCError::Unreachable(error)) => {
                assert!(error.to_string().contains("is stopping"), "{error}");
            }
            other => panic!("expected Unreachable, got {other:?}"),
        }
        peer.server.abort();
    }

    /// A snapshot travels in chunks and is installed whole on the peer, which then holds what
    /// the snapshot holds.
    #[tokio::test]
    async fn a_snapshot_travels_in_chunks_and_installs_on_the_peer() {
        let source_dir = tempfile::tempdir().expect("temp dir");
        let (_log, source) = baton_raft_store::store::open(source_dir.path()).expect("open");
        let session = baton_raft_store::machine::NewSession {
            session_id: baton_raft_store::machine::SessionId(7),
            holder: "agent-a".to_owned(),
            ttl_ms: 60_000,
            labels: Default::default(),
        };
        let batch = Batch {
            stamp_ms: 1_000,
            commands: vec![baton_raft_store::machine::Command::Namespaced {
                namespace: baton_raft_store::machine::Namespace::default_namespace(),
                idempotency: None,
                op: baton_raft_store::machine::Op::CreateSession(session),
            }],
        };
        source
            .apply_entries([Entry {
                log_id: log_id(1, 1),
                payload: EntryPayload::Normal(batch),
            }])
            .expect("apply");
        let mut source = source;
        let mut builder =
            openraft::storage::RaftStateMachine::get_snapshot_builder(&mut source).await;
        let snapshot = openraft::RaftSnapshotBuilder::build_snapshot(&mut builder)
            .await
            .expect("a snapshot");
        let bytes = source
            .handle()
            .read(|machine, _| machine.encode_snapshot().expect("encode"))
            .expect("read");
        assert!(bytes.len() > 16, "several chunks of 16 bytes");

        let peer = TestPeer::start(None).await;
        let mut client = client_for(peer.address, None).await;
        let vote = Vote::new_committed(1, 2);
        let answer = client
            .send_snapshot(vote, snapshot, 16, &options())
            .await
            .expect("installed");
        assert_eq!(answer.vote, vote);
        let installed = peer
            .raft
            .with_state_machine(|machine: &mut baton_raft_store::store::StateMachineStore| {
                Box::pin(async move {
                    machine
                        .handle()
                        .read(|machine, last_applied| {
                            (machine.encode_snapshot().expect("encode"), last_applied)
                        })
                        .expect("read")
                })
            })
            .await
            .expect("the state machine");
        assert_eq!(installed, (bytes, Some(log_id(1, 1))));
        let received: Vec<_> = std::fs::read_dir(peer.data_dir.path())
            .expect("the data dir")
            .map(|entry| entry.expect("an entry").file_name())
            .filter(|name| name.to_string_lossy().starts_with("snapshot-received-"))
            .collect();
        assert!(
            received.is_empty(),
            "gathered into a file, removed once installed: {received:?}"
        );
        peer.stop().await;
    }

    #[tokio::test]
    async fn a_request_meant_for_another_node_or_cluster_is_refused_and_a_new_member_learns_its_cluster(
    ) {
        let peer = TestPeer::start(None).await;
        let (ours, theirs) = (ClusterId([1; 16]), ClusterId([2; 16]));
        // An address the sender's membership gives to node 3.
        let mut wrong_node = client_as(Identity::in_memory(2, Some(ours)), peer.address, 3).await;
        misdirected(&mut wrong_node, "this is node 1, not node 3").await;
        assert_eq!(
            peer.identity.cluster(),
            None,
            "a refused request teaches nothing"
        );
        // A member of nothing yet learns its cluster from the first request naming one, durably.
        let mut member = client_as(Identity::in_memory(2, Some(ours)), peer.address, 1).await;
        let vote = VoteRequest::new(Vote::new(5, 2), None);
        member.vote(vote, options()).await.expect("vote answered");
        assert_eq!(peer.identity.cluster(), Some(ours));
        let file = peer.identity.file.as_ref().expect("a data dir");
        assert_eq!(file.read().expect("read"), Some(ours));
        // Then another cluster's node is refused, before any Raft sees its vote.
        let mut stranger = client_as(Identity::in_memory(2, Some(theirs)), peer.address, 1).await;
        misdirected(
            &mut stranger,
            &format!("belongs to cluster {ours}, not {theirs}"),
        )
        .await;
        assert_eq!(peer.raft.metrics().borrow_watched().current_term, 5);
        // A node of an earlier release names no cluster: served as before.
        let mut earlier = client_as(Identity::in_memory(2, None), peer.address, 1).await;
        earlier
            .vote(VoteRequest::new(Vote::new(6, 2), None), options())
            .await
            .expect("vote answered");
        peer.stop().await;
    }

    #[tokio::test]
    async fn a_member_of_a_cluster_without_an_id_never_learns_one() {
        let peer = TestPeer::start(None).await;
        let member = Member {
            api_addr: "127.0.0.1:1".to_owned(),
            peer_addr: peer.address.to_string(),
        };
        peer.raft
            .initialize(std::collections::BTreeMap::from([(1, member)]))
            .await
            .expect("initialize");
        let named = ClusterId([3; 16]);
        let mut client = client_as(Identity::in_memory(2, Some(named)), peer.address, 1).await;
        misdirected(&mut client, "made before clusters had ids").await;
        assert_eq!(peer.identity.cluster(), None);
        peer.stop().await;
    }

    #[tokio::test]
    async fn wrong_or_missing_secret_is_refused() {
        let peer = TestPeer::start(Some(SECRET)).await;
        for secret in [Some("not the secret"), None] {
            let mut client = client_for(peer.address, secret).await;
            let vote = VoteRequest::new(Vote::new(5, 2), None);
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
        let network = PeerNetwork::new(Identity::in_memory(2, None), Some(SECRET.to_owned()), None)
            .expect("network");
        let echoed = network
            .post((1, &address), ECHO_PATH, b"relayed".to_vec(), timeout)
            .await
            .expect("an answer");
        assert_eq!(&echoed[..], b"relayed");
        for secret in [Some("not the secret"), None] {
            let network = PeerNetwork::new(
                Identity::in_memory(2, None),
                secret.map(str::to_owned),
                None,
            )
            .expect("network");
            match network
                .post((1, &address), ECHO_PATH, b"x".to_vec(), timeout)
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
            network
                .post((1, &closed), ECHO_PATH, Vec::new(), timeout)
                .await,
            Err(PeerPostError::NotDelivered(_))
        ));
    }

    #[tokio::test]
    async fn malformed_body_is_a_400() {
        let peer = TestPeer::start(None).await;
        let http = reqwest::Client::new();
        for path in [
            APPEND_PATH,
            VOTE_PATH,
            PRE_VOTE_PATH,
            TRANSFER_LEADER_PATH,
            SNAPSHOT_PATH,
        ] {
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
        let vote = VoteRequest::new(Vote::new(5, 2), None);
        match client.vote(vote, options()).await {
            Err(RPCError::Unreachable(_)) => {}
            other => panic!("expected Unreachable, got {other:?}"),
        }
    }

    /// An address nothing can connect to is refused before anything is sent: unreachable for
    /// Raft, not delivered for a relay message, with the address in the reason.
    #[tokio::test]
    async fn a_peer_address_that_cannot_be_reached_is_never_sent_to() {
        let mut network =
            PeerNetwork::new(Identity::in_memory(2, None), None, None).expect("network");
        let member = Member {
            api_addr: "127.0.0.1:1".to_owned(),
            peer_addr: "no such host:port".to_owned(),
        };
        let mut client = network.new_client(1, &member).await;
        let vote = VoteRequest::new(Vote::new(5, 2), None);
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
                (1, "no such host:port"),
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
            let vote = VoteRequest::new(Vote::new(5, 2), None);
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
        let mut network =
            PeerNetwork::new(Identity::in_memory(2, None), None, Some(tls)).expect("network");
        let within = Duration::from_millis(200);
        let started = Instant::now();
        let posted = network
            .post((1, &address), ECHO_PATH, Vec::new(), within)
            .await;
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
        let vote = VoteRequest::new(Vote::new(5, 2), None);
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
        let vote = VoteRequest::new(Vote::new(5, 2), None);
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
        raft: Raft,
        identity: Identity,
        address: SocketAddr,
        server: JoinHandle<std::io::Result<()>>,
        data_dir: TempDir,
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
            let identity = Identity::of(1, state_machine.cluster_file()).expect("the cluster file");
            let inbox = state_machine.snapshot_inbox();
            let network = PeerNetwork::new(identity.clone(), secret.map(str::to_owned), None)
                .expect("network");
            let raft = Raft::new(1, config, network, log_store, state_machine)
                .await
                .expect("raft");
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let address = listener.local_addr().expect("address");
            // A route of the node's own beside openraft's, as the relay's is mounted.
            let echo = Router::new().route(ECHO_PATH, post(|body: Bytes| async move { body }));
            let router = peer_router(
                raft.clone(),
                inbox,
                LeaderContact::default(),
                secret.map(str::to_owned),
                identity.clone(),
                echo,
            );
            let server = tokio::spawn(async move { axum::serve(listener, router).await });
            TestPeer {
                raft,
                identity,
                address,
                server,
                data_dir,
            }
        }

        async fn stop(self) {
            self.raft.shutdown().await.expect("shutdown");
            self.server.abort();
        }
    }

    /// Node 2's client for node 1 at `address`.
    async fn client_for(address: SocketAddr, secret: Option<&str>) -> PeerClient {
        let mut network = PeerNetwork::new(
            Identity::in_memory(2, None),
            secret.map(str::to_owned),
            None,
        )
        .expect("network");
        let member = Member {
            api_addr: "127.0.0.1:1".to_owned(),
            peer_addr: address.to_string(),
        };
        network.new_client(1, &member).await
    }

    /// A client of the node `identity` names for node `target` at `address`.
    async fn client_as(identity: Identity, address: SocketAddr, target: u64) -> PeerClient {
        let mut network = PeerNetwork::new(identity, None, None).expect("network");
        let member = Member {
            api_addr: "127.0.0.1:1".to_owned(),
            peer_addr: address.to_string(),
        };
        network.new_client(target, &member).await
    }

    /// The vote's refusal, which must be a 421 saying `why`.
    async fn misdirected(client: &mut PeerClient, why: &str) {
        match client
            .vote(VoteRequest::new(Vote::new(5, 2), None), options())
            .await
        {
            Err(RPCError::Unreachable(error)) => {
                let message = error.to_string();
                assert!(
                    message.contains("421") && message.contains(why),
                    "{message}"
                );
            }
            other => panic!("expected a 421 saying {why:?}, got {other:?}"),
        }
    }

    fn options() -> RPCOption {
        RPCOption::new(Duration::from_secs(5))
    }

    fn log_id(term: u64, index: u64) -> LogId {
        baton_raft_store::store::log_id(term, 1, index)
    }

    /// xorshift64: a seeded, replayable stream of garbage.
    fn next_random(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }
}
