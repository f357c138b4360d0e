//! Node-local routes (`/v1/cluster`, `/v1/debug/*`, health, metrics) and the membership routes.
//! Local routes describe the answering node and are never forwarded (docs/guarantees.md G1 exemptions).

use std::collections::{BTreeMap, BTreeSet};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use baton_api::{
    AddMemberRequest, BackupHeader, BackupWriter, ClusterStatus, Digest, ErrorCode,
    Member as WireMember, BACKUP_CONTENT_TYPE, HEADER_CLUSTER_TIME,
};
use baton_raft_store::machine::{Namespace, Role};
use baton_raft_store::store::{encode_machine_to, encoded_len, Member, TypeConfig};
use openraft::async_runtime::WatchReceiver;
use openraft::errors::{ClientWriteError, RaftError};
use openraft::ChangeMembers;
use serde::Deserialize;
use sha2::Sha256;

use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, Ns, Token};
use super::{ApiAnswer, AppState};

/// How far a node's applied index may trail its log and still call itself ready.
const READY_LAG_MAX: u64 = 64;

/// The node's view, with the revision of `namespace` when it is `Some` (the caller may read it).
fn cluster_status(app: &AppState, namespace: Option<&Namespace>) -> ClusterStatus {
    let metrics = app.raft.metrics();
    let metrics = metrics.borrow_watched();
    let membership = metrics.membership_config.membership();
    let voters: BTreeSet<u64> = membership.voter_ids().collect();
    let members = membership
        .nodes()
        .map(|(id, member)| WireMember {
            id: *id,
            api_addr: member.api_addr.clone(),
            peer_addr: member.peer_addr.clone(),
            voter: voters.contains(id),
        })
        .collect();
    let (cluster_time_ms, revision, (sessions, leases)) = app
        .machine
        .read(|machine, _| {
            let revision = namespace.map_or(0, |namespace| machine.revision(namespace));
            (machine.time_ms(), revision, machine.counts())
        })
        .unwrap_or_default();
    ClusterStatus {
        node_id: app.node_id,
        leader_id: metrics.current_leader,
        term: metrics.current_term,
        // Every applied entry is known committed; a node's own view of its commit index.
        commit_index: metrics.last_applied.map_or(0, |log_id| log_id.index),
        cluster_time_ms,
        revision,
        sessions: sessions as u64,
        leases: leases as u64,
        members,
    }
}

#[utoipa::path(
    get,
    path = "/v1/cluster",
    tag = "cluster",
    summary = "How this node sees the cluster",
    params(
        ("Baton-Namespace" = Option<String>, Header, description = "The namespace whose revision is shown; `default` when absent")
    ),
    responses(
        (status = 200, description = "This node's view", body = baton_api::ClusterStatus),
        (status = "4XX", description = "Refused: a `Baton-Namespace` that is not a valid namespace name, or a bad token", body = baton_api::Problem, content_type = "application/problem+json")
    )
)]
pub async fn status(
    State(app): State<AppState>,
    Ns(namespace): Ns,
    Token(token): Token,
) -> ApiAnswer {
    // Each namespace's revision is its tenant's: a token shows only one it may use.
    let readable = token
        .is_none_or(|(caller, _)| caller.role == Role::Admin || caller.scope.allows(&namespace));
    let namespace = readable.then_some(&namespace);
    ApiAnswer::local(StatusCode::OK, &cluster_status(&app, namespace))
}

/// A membership change that openraft did not complete. Only the leader runs these (followers
/// forward them). A change is two entries (joint, then uniform): openraft's `ForwardToLeader`
/// for the second comes after the first committed, and `LogEntryDiscarded` for either after it
/// was appended, possibly committed by a new leader: so losing the leader here is
/// `OUTCOME_UNKNOWN`, never `NO_LEADER`.
fn membership_error(error: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> ApiError {
    match error {
        RaftError::APIError(
            ClientWriteError::ForwardToLeader(forward)
            | ClientWriteError::LogEntryDiscarded(forward),
        ) => {
            let mut error = ApiError::outcome_unknown(
                "this node stopped being the leader while changing the membership",
            );
            error.problem.leader = forward.leader_id;
            error
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(error)) => ApiError::new(
            ErrorCode::InvalidArgument,
            format!("membership change refused: {error}"),
        ),
        RaftError::APIError(ClientWriteError::PreconditionFailed(error)) => ApiError::new(
            ErrorCode::InvalidArgument,
            format!("membership change refused: {error}"),
        ),
        RaftError::Fatal(fatal) => ApiError::outcome_unknown(fatal),
    }
}

#[utoipa::path(
    post,
    path = "/v1/cluster/members",
    tag = "cluster",
    summary = "Add a node: a learner, then a voter unless `voter` is false",
    request_body = baton_api::AddMemberRequest,
    responses(
        (status = 200, description = "The new membership", body = baton_api::ClusterStatus)
    )
)]
pub async fn add_member(
    State(app): State<AppState>,
    body: ApiJson<AddMemberRequest>,
) -> Result<ApiAnswer, ApiError> {
    let request = body.value;
    if request.id == 0 {
        return Err(ApiError::invalid("id must be a positive integer"));
    }
    for address in [&request.api_addr, &request.peer_addr] {
        address
            .parse::<std::net::SocketAddr>()
            .map_err(|_| ApiError::invalid(format!("{address:?} is not host:port")))?;
    }
    let member = Member {
        api_addr: request.api_addr,
        peer_addr: request.peer_addr,
    };
    refuse_address_conflicts(&app, request.id, &member)?;
    app.raft
        .add_learner(request.id, member, true)
        .await
        .map_err(membership_error)?;
    if request.voter {
        let voters = ChangeMembers::AddVoterIds(BTreeSet::from([request.id]));
        app.raft
            .change_membership(voters, false)
            .await
            .map_err(membership_error)?;
    }
    Ok(ApiAnswer::local(
        StatusCode::OK,
        &cluster_status(&app, None),
    ))
}

/// One process is never two members: an id that is already a member must come with the
/// addresses it has, and an address may belong to one member only.
fn refuse_address_conflicts(app: &AppState, id: u64, member: &Member) -> Result<(), ApiError> {
    let metrics = app.raft.metrics();
    let metrics = metrics.borrow_watched();
    let membership = metrics.membership_config.membership();
    if let Some(existing) = membership.get_node(&id) {
        if existing != member {
            return Err(ApiError::invalid(format!(
                "node {id} is already a member at {existing}; remove it first to change its addresses"
            )));
        }
    }
    for (other_id, other) in membership.nodes().filter(|(other_id, _)| **other_id != id) {
        let shared = [&member.api_addr, &member.peer_addr]
            .into_iter()
            .find(|address| **address == other.api_addr || **address == other.peer_addr);
        if let Some(address) = shared {
            return Err(ApiError::invalid(format!(
                "{address} already belongs to node {other_id}: one process cannot be two members"
            )));
        }
    }
    Ok(())
}

#[utoipa::path(
    delete,
    path = "/v1/cluster/members/{id}",
    tag = "cluster",
    summary = "Remove a node",
    params(
        ("id" = u64, Path, description = "The node id")
    ),
    responses(
        (status = 200, description = "The new membership", body = baton_api::ClusterStatus)
    )
)]
pub async fn remove_member(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<u64>,
) -> Result<ApiAnswer, ApiError> {
    let (is_voter, is_member) = {
        let metrics = app.raft.metrics();
        let metrics = metrics.borrow_watched();
        let membership = metrics.membership_config.membership();
        let is_voter = membership.voter_ids().any(|voter| voter == id);
        (is_voter, membership.get_node(&id).is_some())
    };
    if !is_member {
        return Err(ApiError::not_found(format!("node {id} is not a member")));
    }
    let change = if is_voter {
        ChangeMembers::RemoveVoters(BTreeSet::from([id]))
    } else {
        ChangeMembers::RemoveNodes(BTreeSet::from([id]))
    };
    app.raft
        .change_membership(change, false)
        .await
        .map_err(membership_error)?;
    Ok(ApiAnswer::local(
        StatusCode::OK,
        &cluster_status(&app, None),
    ))
}

#[utoipa::path(
    get,
    path = "/v1/debug/digest",
    tag = "debug",
    summary = "A digest of this node's applied state",
    responses(
        (status = 200, description = "The digest at its applied index", body = baton_api::Digest),
        (status = "5XX", description = "INTERNAL: the applied state could not be read", body = baton_api::Problem, content_type = "application/problem+json")
    )
)]
pub async fn digest(State(app): State<AppState>) -> Result<ApiAnswer, ApiError> {
    use sha2::Digest as _;
    let copy = app.machine.copy().map_err(ApiError::internal)?;
    let applied_index = copy.last_applied.map_or(0, |log_id| log_id.index);
    let cluster_time_ms = copy.machine.time_ms();
    // Encoding a large state is a fraction of a second of CPU: off the async workers.
    let bytes = tokio::task::spawn_blocking(move || copy.machine.encode_snapshot())
        .await
        .map_err(ApiError::internal)?
        .map_err(ApiError::internal)?;
    let hash = Sha256::digest(&bytes);
    let digest = hash.iter().map(|byte| format!("{byte:02x}")).collect();
    let answer = Digest {
        node_id: app.node_id,
        applied_index,
        cluster_time_ms,
        digest,
    };
    Ok(ApiAnswer::local(StatusCode::OK, &answer))
}

/// Test-only clock control (`--clock-control`): the monotonic rate and the wall-clock offset.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClockRequest {
    rate: Option<f64>,
    wall_offset_ms: Option<i64>,
}

#[utoipa::path(
    post,
    path = "/v1/debug/clock",
    tag = "debug",
    summary = "Test only: change this node's clock (needs --clock-control)",
    request_body = ClockRequest,
    responses(
        (status = 200, description = "Changed", body = Object)
    )
)]
pub async fn set_clock(
    State(app): State<AppState>,
    body: ApiJson<ClockRequest>,
) -> Result<ApiAnswer, ApiError> {
    if !app.clock_control {
        return Err(ApiError::new(
            ErrorCode::PermissionDenied,
            "clock control is off: start batond with --clock-control",
        ));
    }
    if let Some(rate) = body.value.rate {
        if !(0.0..=10.0).contains(&rate) {
            return Err(ApiError::invalid("rate must be within 0..=10"));
        }
        app.clock.set_rate(rate);
    }
    if let Some(offset_ms) = body.value.wall_offset_ms {
        app.clock.set_wall_offset_ms(offset_ms);
    }
    tracing::warn!(rate = ?body.value.rate, wall_offset_ms = ?body.value.wall_offset_ms, "clock changed by test control");
    Ok(ApiAnswer::local(
        StatusCode::OK,
        &BTreeMap::from([("ok", true)]),
    ))
}

#[utoipa::path(
    get,
    path = "/healthz",
    tag = "health",
    summary = "The process serves",
    responses(
        (status = 200, description = "Serving", body = Object)
    )
)]
pub async fn healthz() -> ApiAnswer {
    ApiAnswer::local(StatusCode::OK, &BTreeMap::from([("status", "ok")]))
}

#[utoipa::path(
    get,
    path = "/readyz",
    tag = "health",
    summary = "This node knows a leader and has caught up",
    responses(
        (status = 200, description = "Ready", body = Object),
        (status = "5XX", description = "NO_LEADER: not ready (no leader in touch, or not caught up with the log)", body = baton_api::Problem, content_type = "application/problem+json")
    )
)]
pub async fn readyz(State(app): State<AppState>) -> Result<ApiAnswer, ApiError> {
    let ready = {
        let metrics = app.raft.metrics();
        let metrics = metrics.borrow_watched();
        let applied = metrics.last_applied.map_or(0, |log_id| log_id.index);
        let lag = metrics.last_log_index.unwrap_or(0).saturating_sub(applied);
        let caught_up = if metrics.current_leader == Some(app.node_id) {
            app.proposer.is_leader_ready(metrics.current_term)
        } else {
            lag <= READY_LAG_MAX
        };
        metrics.running_state.is_ok() && caught_up
    };
    let ready = ready && app.leader().is_some();
    if !ready {
        return Err(ApiError::no_leader(None));
    }
    Ok(ApiAnswer::local(
        StatusCode::OK,
        &BTreeMap::from([("status", "ready")]),
    ))
}

#[utoipa::path(
    get,
    path = "/metrics",
    tag = "health",
    summary = "Prometheus metrics of this node",
    responses(
        (status = 200, description = "Metrics in the Prometheus text format", body = String, content_type = "text/plain")
    )
)]
pub async fn metrics(State(app): State<AppState>) -> Response {
    let (sessions, leases) = app
        .machine
        .read(|machine, _| machine.counts())
        .unwrap_or_default();
    let text = {
        let metrics = app.raft.metrics();
        let metrics = metrics.borrow_watched();
        app.metrics.render(
            &metrics,
            sessions,
            leases,
            app.proposer.batches_in_flight(),
            app.relay.counters(),
        )
    };
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

#[utoipa::path(
    get,
    path = "/v1/snapshot",
    tag = "cluster",
    summary = "A backup of the whole replicated state (admin): the backup file of docs/operations.md",
    responses(
        (status = 200, description = "The backup file: every write acknowledged before the request, at one applied index", body = Vec<u8>, content_type = "application/vnd.baton.backup"),
        (status = "4XX", description = "Refused, nothing changed: a token that is not an admin's", body = baton_api::Problem, content_type = "application/problem+json"),
        (status = "5XX", description = "NO_LEADER (no read index to cut the copy at) or INTERNAL", body = baton_api::Problem, content_type = "application/problem+json")
    )
)]
pub async fn snapshot(State(app): State<AppState>) -> Result<Response, ApiError> {
    // Linearizable: a read index first, so the copy holds every write acknowledged before it.
    app.read_here(|_| ()).await?;
    let (node_id, saved_at_ms) = (app.node_id, app.clock.wall_ms());
    let copy = app.machine.copy().map_err(ApiError::internal)?;
    // The file gives the state's length before the state, so the copy is encoded twice, never
    // held whole: once to count its bytes, then again as it is sent, a chunk at a time. Both
    // off the async workers, and off the state's lock (the copy is the state at its log index),
    // so applies go on meanwhile.
    let (copy, header) = tokio::task::spawn_blocking(move || {
        let state_bytes = encoded_len(&copy.machine)?;
        let machine = &copy.machine;
        let (sessions, leases) = machine.counts();
        let header = BackupHeader {
            index: copy.last_applied.map_or(0, |log_id| log_id.index),
            term: copy.last_applied.map_or(0, |log_id| log_id.leader_id.term),
            cluster_time_ms: machine.time_ms(),
            fence: machine.fence_counter(),
            members: copy
                .last_membership
                .membership()
                .nodes()
                .map(|(id, member)| format!("{id}={member}"))
                .collect(),
            saved_by: node_id,
            saved_at: baton_api::rfc3339(saved_at_ms),
            sessions: sessions as u64,
            leases: leases as u64,
            state_bytes,
        };
        Ok::<_, baton_raft_store::machine::CodecError>((copy, header))
    })
    .await
    .map_err(ApiError::internal)?
    .map_err(ApiError::internal)?;
    let cluster_time_ms = header.cluster_time_ms;
    let length = BackupWriter::new(std::io::sink(), &header, header.state_bytes)
        .map_err(ApiError::internal)?
        .file_len();
    let (sender, chunks) = tokio::sync::mpsc::channel(BACKUP_CHUNKS_IN_FLIGHT);
    tokio::task::spawn_blocking(move || {
        let mut out = ChunkSender {
            sender,
            chunk: Vec::with_capacity(BACKUP_CHUNK_BYTES),
        };
        let written = BackupWriter::new(&mut out, &header, header.state_bytes)
            .and_then(|mut file| {
                encode_machine_to(&copy.machine, &mut file).map_err(std::io::Error::other)?;
                file.finish()
            })
            .and_then(|out| out.send_chunk());
        match written {
            Ok(()) => tracing::info!(bytes = length, "backup served"),
            Err(error) => {
                // The body ends in an error: the client sees the answer cut short.
                tracing::warn!(%error, "a backup was not served whole");
                let _ = out.sender.blocking_send(Err(error));
            }
        }
    });
    let body = axum::body::Body::from_stream(futures_util::stream::unfold(
        chunks,
        |mut chunks| async move { chunks.recv().await.map(|chunk| (chunk, chunks)) },
    ));
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(BACKUP_CONTENT_TYPE),
    );
    headers.insert(header::CONTENT_LENGTH, header::HeaderValue::from(length));
    headers.insert(
        HEADER_CLUSTER_TIME,
        header::HeaderValue::from(cluster_time_ms),
    );
    Ok(response)
}

/// A backup is sent in chunks of this many bytes...
const BACKUP_CHUNK_BYTES: usize = 256 << 10;
/// ...with at most this many encoded ahead of the client: what one backup holds in memory.
const BACKUP_CHUNKS_IN_FLIGHT: usize = 4;

/// Gathers what is written to it into chunks and sends each, full, to the response body,
/// waiting while the client is `BACKUP_CHUNKS_IN_FLIGHT` chunks behind. A client gone is an
/// error, which stops the encoding.
struct ChunkSender {
    sender: tokio::sync::mpsc::Sender<std::io::Result<axum::body::Bytes>>,
    chunk: Vec<u8>,
}

impl ChunkSender {
    fn send_chunk(&mut self) -> std::io::Result<()> {
        if self.chunk.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.chunk, Vec::with_capacity(BACKUP_CHUNK_BYTES));
        self.sender.blocking_send(Ok(chunk.into())).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away")
        })
    }
}

impl std::io::Write for ChunkSender {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.chunk.extend_from_slice(bytes);
        if self.chunk.len() >= BACKUP_CHUNK_BYTES {
            self.send_chunk()?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
