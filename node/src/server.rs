//! Starting and stopping one `batond` node: open the store, start openraft with the peer
//! network, bootstrap from `--initial-cluster` on an empty data dir, serve the peer and client
//! APIs, and run until SIGTERM/SIGINT or until openraft stops on a fatal (storage) error. A
//! leader told to stop hands leadership to its most up-to-date follower first.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use baton_raft_store::store::{self, ClusterId, Raft, RaftTiming, SnapshotInbox};
use openraft::async_runtime::WatchReceiver;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::clock::NodeClock;
use crate::config::NodeConfig;
use crate::connections::{self, ConnectionBounds};
use crate::http::{self, AppState, Shared};
use crate::metrics::Metrics;
use crate::network::{peer_router, Identity, LeaderContact, PeerNetwork};
use crate::service::{Relay, Service};
use crate::tls;
use baton_raft_store::proposer::{Proposer, ProposerSettings};

/// Runs the node until it is told to stop. An error means the node could not start, or
/// openraft stopped on a fatal error, or a snapshot sent by a peer could not be stored (a storage
/// error stops the node: docs/guarantees.md G5, STYLE rule 4).
pub async fn run(config: NodeConfig) -> anyhow::Result<()> {
    let tuning = &config.tuning;
    // Certificates are read before anything starts: a bad file stops the node at once.
    let api_tls = tuning
        .api_tls()
        .map(|identity| tls::server_config(&identity, None))
        .transpose()
        .context("--tls-cert/--tls-key")?;
    let peer_identity = tuning.peer_tls();
    let peer_tls = peer_identity
        .as_ref()
        .map(|(identity, ca)| tls::server_config(identity, Some(ca)))
        .transpose()
        .context("--peer-tls-cert/--peer-tls-key/--peer-ca")?;
    let peer_client_tls = peer_identity
        .as_ref()
        .map(|(identity, ca)| tls::client_config(identity, ca))
        .transpose()
        .context("--peer-tls-cert/--peer-tls-key/--peer-ca")?;
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("creating the data dir {}", config.data_dir.display()))?;
    let (log_store, state_machine) = store::open(&config.data_dir)
        .with_context(|| format!("opening the store in {}", config.data_dir.display()))?;
    let machine = state_machine.handle();
    let raft_config = store::raft_config(
        config.id,
        &RaftTiming {
            heartbeat_ms: tuning.heartbeat_ms,
            election_timeout_ms: tuning.election_timeout_ms,
            snapshot_log_entries: tuning.snapshot_log_entries,
            snapshot_chunk_bytes: crate::network::SNAPSHOT_CHUNK_BYTES_MAX as u64,
        },
    )
    .context("raft configuration")?;
    let identity = Identity::of(config.id, state_machine.cluster_file())?;
    let snapshot_inbox = state_machine.snapshot_inbox();
    let network = PeerNetwork::new(
        identity.clone(),
        config.tuning.cluster_secret.clone(),
        peer_client_tls.clone(),
    )?;
    let relay = Relay::spawn(network.clone());
    let raft = Raft::new(
        config.id,
        Arc::new(raft_config),
        network,
        log_store,
        state_machine,
    )
    .await
    .context("starting raft")?;

    if let Some(members) = &config.initial_cluster {
        let first = members.keys().next().copied();
        if !raft.is_initialized().await? && first == Some(config.id) {
            tracing::info!(
                members = members.len(),
                "bootstrapping a new cluster from --initial-cluster"
            );
            // The new cluster's id, recorded before any peer hears of the cluster; the other
            // members learn it from this node's first request.
            let cluster = identity.adopt(ClusterId(rand::random()))?;
            tracing::info!(%cluster, "the new cluster's id");
            if let Err(error) = raft.initialize(members.clone()).await {
                tracing::warn!(%error, "bootstrap refused (already initialized?)");
            }
        }
    }

    let peer_listener = TcpListener::bind(config.peer_listen)
        .await
        .with_context(|| format!("binding --peer-listen {}", config.peer_listen))?;
    let api_listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding --listen {}", config.listen))?;

    let clock = Arc::new(NodeClock::default());
    let leader_contact = LeaderContact::default();
    let election_timeout = Duration::from_millis(tuning.election_timeout_ms);
    // The longest a request waits for a leader (see `Service::leader_wait`).
    let leader_wait = election_timeout * 2 + Duration::from_secs(1);
    let limits = machine.read(|machine, _| machine.limits().clone())?;
    let proposer = Proposer::spawn(
        raft.clone(),
        machine.clone(),
        clock.clone(),
        config.id,
        ProposerSettings {
            tick: Duration::from_millis(tuning.tick_ms),
            sweep: Duration::from_millis(tuning.sweep_ms),
            sweep_batch_max: u32::try_from(limits.sweep_batch_max).unwrap_or(u32::MAX),
            batch_commands_max: tuning.group_commit_max,
            apply_timeout: leader_wait,
        },
    );
    let mut forwarder = reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(1))
        .tcp_nodelay(true);
    if let Some((_, ca)) = &peer_identity {
        // The leader's HTTPS client API may be signed by the peer CA too.
        let pem = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
        for ca in reqwest::Certificate::from_pem_bundle(&pem)? {
            forwarder = forwarder.add_root_certificate(ca);
        }
    }
    let forwarder = forwarder.build()?;
    let service = Service {
        node_id: config.id,
        raft: raft.clone(),
        machine,
        proposer,
        clock,
        relay,
        election_timeout,
        leader_contact: leader_contact.clone(),
    };
    let app = AppState::new(Shared {
        service,
        forwarder,
        metrics: Metrics::default(),
        clock_control: tuning.clock_control,
        event_streams: Arc::new(http::StreamSlots::new(
            tuning.event_streams_max,
            tuning.event_streams_per_token_max,
        )),
        auth: config.auth,
        api_scheme: if api_tls.is_some() { "https" } else { "http" },
        cluster_time_shown: Default::default(),
    });

    if let Some(secret) = config.bootstrap_token.clone() {
        tokio::spawn(crate::http::bootstrap_token(app.clone(), secret));
    }

    let (stop, stopped) = watch::channel(false);
    let bounds = ConnectionBounds {
        connections_max: connections::connections_max(tuning.connections_max),
        request_header_timeout: Duration::from_millis(tuning.request_header_timeout_ms),
        idle_timeout: Duration::from_millis(tuning.idle_timeout_ms),
    };
    let peer_task = tokio::spawn(connections::serve(
        peer_listener,
        peer_tls.map(TlsAcceptor::from),
        peer_router(
            raft.clone(),
            snapshot_inbox.clone(),
            leader_contact,
            tuning.cluster_secret.clone(),
            identity,
            http::relay_routes(app.clone()),
        ),
        bounds,
        stopped.clone(),
        "peer",
    ));
    let api_task = tokio::spawn(connections::serve(
        api_listener,
        api_tls.map(TlsAcceptor::from),
        http::router(app),
        bounds,
        stopped.clone(),
        "api",
    ));
    tracing::info!(id = config.id, listen = %config.listen, peer_listen = %config.peer_listen, "batond is serving");

    // A task, not a branch of this select: `main` runs on a thread of its own, and openraft's
    // metrics change with every entry and heartbeat, so watching them here woke that thread
    // (a context switch) several times per write.
    let raft_watch = tokio::spawn(raft_stopped(raft.clone(), snapshot_inbox.clone()));
    let outcome = tokio::select! {
        () = shutdown_signal() => {
            tracing::info!("shutting down on signal");
            hand_over(&raft, config.id, leader_wait).await;
            Ok(())
        }
        fatal = raft_watch => {
            let fatal = fatal.unwrap_or_else(|join_error| join_error.to_string());
            Err(anyhow::anyhow!("stopping on a fatal error: {fatal}"))
        }
    };
    let _ = stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let _ = api_task.await;
        let _ = peer_task.await;
    })
    .await;
    if let Err(error) = raft.shutdown().await {
        tracing::warn!(%error, "raft shutdown");
    }
    outcome
}

/// A leader about to stop hands leadership to its most up-to-date voter and waits, at most
/// `within`, until that one leads: the cluster's writes then pause for the hand-over, not for
/// an election timeout. Anything else stops at once; a hand-over that does not complete in time
/// leaves the rest to an election.
async fn hand_over(raft: &Raft, node_id: u64, within: Duration) {
    let target = {
        let metrics = raft.metrics();
        let metrics = metrics.borrow_watched();
        if !metrics.state.is_leader() || metrics.current_leader != Some(node_id) {
            return;
        }
        let voters: BTreeSet<u64> = metrics.membership_config.membership().voter_ids().collect();
        metrics.replication.as_ref().and_then(|matched| {
            matched
                .iter()
                .filter(|(id, _)| **id != node_id && voters.contains(id))
                .max_by_key(|(_, log_id)| **log_id)
                .map(|(id, _)| *id)
        })
    };
    let Some(target) = target else {
        return;
    };
    tracing::info!(target, "handing leadership over before stopping");
    if let Err(error) = raft.trigger().transfer_leader(target).await {
        tracing::warn!(%error, "leadership hand-over not started");
        return;
    }
    match raft
        .wait(Some(within))
        .current_leader(target, "leadership hand-over")
        .await
    {
        Ok(_) => tracing::info!(target, "leadership handed over"),
        Err(error) => tracing::warn!(%error, "leadership hand-over did not complete"),
    }
}

/// Resolves when openraft's core stops with a fatal error, or a storage error is met while a
/// snapshot sent by a peer is gathered (storage work openraft does not call), with its
/// description: either stops the node.
async fn raft_stopped(raft: Raft, inbox: SnapshotInbox) -> String {
    let fatal = async {
        let mut metrics = raft.metrics();
        loop {
            if let Err(fatal) = &metrics.borrow_watched().running_state {
                return fatal.to_string();
            }
            if metrics.changed().await.is_err() {
                return "the raft core is gone".to_owned();
            }
        }
    };
    tokio::select! {
        fatal = fatal => fatal,
        failure = inbox.failed() => format!("a snapshot sent by a peer could not be stored: {failure}"),
    }
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing SIGTERM handler");
    tokio::select! {
        _ = interrupt => {}
        _ = terminate.recv() => {}
    }
}
