//! The harness of the integration tests in `tests/it/`: it builds `batond`, starts real
//! clusters of it on ephemeral ports in temporary directories, talks to them over HTTP, and
//! injects process faults (SIGKILL, SIGTERM, SIGSTOP/SIGCONT, restart on the same data dir).
//!
//! What lives here: process management ([`Cluster`], [`Node`]), an HTTP helper that keeps
//! every answer's status, headers and JSON body ([`Api`], [`Call`], [`HttpReply`]), and
//! [`poll_until`]. What must never live here: a mock or an in-process stand-in of our own
//! server (STYLE rule 12), and sleeps that wait for a state: the harness polls with a deadline.
//!
//! Every process a [`Cluster`] starts is SIGKILLed when the cluster is dropped, also when a
//! test panics; a panicking test also prints the tail of every node's log. Set
//! `BATON_TEST_KEEP_DIRS=1` to keep the data directories and logs of every cluster (their path
//! is printed), and `BATOND_BIN=/path/to/batond` to test a prebuilt server instead of building
//! one.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use tempfile::TempDir;

pub use baton_client::api;
pub use reqwest::Method;
pub use serde_json::{json, Value};

/// How long [`Cluster::start`] waits for every node to be ready and agree on a leader.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long [`Cluster::leader`] waits for the running nodes to agree on a leader.
pub const LEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// The pause between two attempts of a poll loop.
pub const POLL_INTERVAL: Duration = Duration::from_millis(25);
/// Per-request timeout of [`Api`]: a paused or dead node must not hang a test.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How many log lines [`Cluster::dump_logs`] prints per node.
pub const LOG_TAIL_LINES: usize = 60;

/// The `--cluster-secret` of the test clusters started with `--auth` and without TLS.
pub const CLUSTER_SECRET: &str = "cluster-secret-of-the-tests";

/// How long a SIGTERMed node may take to exit before the harness calls it a hang.
const TERMINATE_TIMEOUT: Duration = Duration::from_secs(10);
/// How many times [`Cluster::start`] retries with fresh ports when a port was taken meanwhile.
const START_ATTEMPTS_MAX: u32 = 3;

// ---------------------------------------------------------------------------------------------
// Clusters
// ---------------------------------------------------------------------------------------------

/// The shape and timing of a test cluster. Timings are short so that elections and ticks fit
/// in a test's budget.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Number of nodes (ids `1..=nodes`).
    pub nodes: u64,
    /// `--heartbeat-ms`.
    pub heartbeat_ms: u64,
    /// `--election-timeout-ms` (the minimum; the server uses up to one and a half times this).
    pub election_timeout_ms: u64,
    /// `--tick-ms`: the idle tick that keeps cluster time moving without writes.
    pub tick_ms: u64,
    /// How long [`Cluster::start_with`] waits for readiness.
    pub ready_timeout: Duration,
    /// More flags appended to every node's command line.
    pub extra_args: Vec<String>,
    /// With access control: every node runs with `--auth` and this `BATON_BOOTSTRAP_TOKEN`,
    /// and the cluster's [`Api`] sends it (the bootstrap admin) unless a call says otherwise.
    pub bootstrap_token: Option<String>,
    /// With TLS: every node serves its client API over HTTPS and talks to its peers over
    /// mutual TLS with these certificates, and the cluster's [`Api`] trusts their CA.
    pub tls: Option<TestCerts>,
    /// With a limit: every node starts under `prlimit --nofile=N:N`, so it has at most `N`
    /// file descriptors (its own soft and hard limit).
    pub open_files_max: Option<u64>,
    /// With a backup: every node's data dir is seeded from this file by `batond restore`
    /// (with the cluster's own `--initial-cluster`) before the node first starts.
    pub restore_from: Option<PathBuf>,
}

pub use baton_kit::TestCerts;

impl ClusterConfig {
    /// `nodes` nodes with the fast test timings: heartbeat 50 ms, election timeout 300 ms,
    /// tick 100 ms.
    pub fn new(nodes: u64) -> ClusterConfig {
        ClusterConfig {
            nodes,
            heartbeat_ms: 50,
            election_timeout_ms: 300,
            tick_ms: 100,
            ready_timeout: READY_TIMEOUT,
            extra_args: Vec::new(),
            bootstrap_token: None,
            tls: None,
            open_files_max: None,
            restore_from: None,
        }
    }
}

/// A running test cluster of real `batond` processes. Dropping it kills every process it
/// started (resuming paused ones first) and removes its temporary directory.
pub struct Cluster {
    nodes: Vec<Node>,
    api: Api,
    config: ClusterConfig,
    // Declared after `nodes` so that the processes are dead before their directory goes.
    directory: Option<TempDir>,
}

impl fmt::Debug for Cluster {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("Cluster")
            .field("nodes", &self.nodes)
            .field("config", &self.config)
            .field("directory", &self.directory_path())
            .finish()
    }
}

impl Cluster {
    /// Starts `nodes` nodes (1 or 3) with `batond run` and the fast test timings, and waits
    /// until every node is ready and all agree on a leader. Panics with the nodes' log tails
    /// when that does not happen within [`READY_TIMEOUT`].
    pub async fn start(nodes: u64) -> Cluster {
        Cluster::start_with(ClusterConfig::new(nodes)).await
    }

    /// Like [`Cluster::start`] with explicit timings and flags.
    pub async fn start_with(config: ClusterConfig) -> Cluster {
        assert!(config.nodes >= 1, "a cluster needs at least one node");
        let mut attempt = 1;
        loop {
            let cluster = Cluster::spawn_run(&config);
            match cluster.try_wait_ready(config.ready_timeout).await {
                Ok(()) => return cluster,
                Err(failure) if attempt < START_ATTEMPTS_MAX && cluster.lost_a_port_race() => {
                    eprintln!(
                        "harness: attempt {attempt} to start a cluster lost a port race, \
                         retrying with fresh ports: {failure}"
                    );
                    attempt += 1;
                }
                // Dropping `cluster` while panicking prints every node's log tail.
                Err(failure) => panic!("the cluster did not start: {failure}"),
            }
        }
    }

    /// Starts a one-node cluster with `batond dev` (the quick start of docs/cli.md). Its
    /// node is taken to have id 1, the only id a one-node cluster needs.
    pub async fn dev() -> Cluster {
        let mut attempt = 1;
        loop {
            let directory = new_temp_dir();
            let api_port = free_port();
            let peer_port = free_port();
            let data_dir = directory.path().join("node-1");
            let args: Vec<OsString> = vec![
                "dev".into(),
                "--data-dir".into(),
                data_dir.clone().into(),
                "--listen".into(),
                format!("127.0.0.1:{api_port}").into(),
                "--peer-listen".into(),
                format!("127.0.0.1:{peer_port}").into(),
            ];
            let node = Node::new(
                1,
                api_port,
                peer_port,
                data_dir,
                directory.path().join("node-1.log"),
                args,
            );
            node.spawn();
            let cluster = Cluster {
                nodes: vec![node],
                api: Api::new(),
                config: ClusterConfig::new(1),
                directory: Some(directory),
            };
            match cluster.try_wait_ready(READY_TIMEOUT).await {
                Ok(()) => return cluster,
                Err(failure) if attempt < START_ATTEMPTS_MAX && cluster.lost_a_port_race() => {
                    eprintln!("harness: `batond dev` lost a port race, retrying: {failure}");
                    attempt += 1;
                }
                Err(failure) => panic!("`batond dev` did not start: {failure}"),
            }
        }
    }

    /// Every node, in id order, running or not.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The node with this id.
    pub fn node(&self, id: u64) -> &Node {
        self.nodes
            .iter()
            .find(|node| node.id == id)
            .unwrap_or_else(|| panic!("the cluster has no node {id}"))
    }

    /// The HTTP helper.
    pub fn api(&self) -> &Api {
        &self.api
    }

    /// The timings the cluster was started with.
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    /// The nodes whose process runs and is not paused: the ones that can answer.
    pub fn live_nodes(&self) -> Vec<&Node> {
        self.nodes
            .iter()
            .filter(|node| node.is_running() && !node.is_paused())
            .collect()
    }

    /// The leader, once every live node agrees on it (polls for up to [`LEADER_TIMEOUT`]).
    pub async fn leader(&self) -> &Node {
        self.wait_for_leader(LEADER_TIMEOUT).await
    }

    /// The leader, once a live node says it leads and every other live node names it in
    /// `/v1/cluster`. Panics with the nodes' views and log tails after `timeout`.
    pub async fn wait_for_leader(&self, timeout: Duration) -> &Node {
        let deadline = Instant::now() + timeout;
        let mut last_views = String::new();
        loop {
            let (leader, views) = self.agreed_leader().await;
            if let Some(leader) = leader {
                return self.node(leader);
            }
            last_views = views.unwrap_or(last_views);
            if Instant::now() >= deadline {
                panic!("no leader agreed on by the live nodes within {timeout:?}: {last_views}");
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// The live nodes other than the leader.
    pub async fn followers(&self) -> Vec<&Node> {
        let leader = self.leader().await.id;
        self.live_nodes()
            .into_iter()
            .filter(|node| node.id != leader)
            .collect()
    }

    /// Waits until every live node answers `/readyz` 200 and all agree on a leader; fails
    /// fast, with its log tail, when a node's process exits meanwhile.
    pub async fn wait_ready(&self, timeout: Duration) {
        if let Err(failure) = self.try_wait_ready(timeout).await {
            panic!("the cluster did not become ready: {failure}");
        }
    }

    /// Sends the request `request` builds to each of `nodes` in turn until one acknowledges
    /// it (2xx); retries on transport errors, `NO_LEADER` and `OUTCOME_UNKNOWN` (give the
    /// request an `Idempotency-Key` when a retry must not apply it twice), fails the test on
    /// any other answer or after `timeout`. Returns the answer and how long it took.
    pub async fn retry_until_acknowledged(
        &self,
        nodes: &[&Node],
        timeout: Duration,
        request: impl Fn(&Node) -> Call,
    ) -> (HttpReply, Duration) {
        assert!(!nodes.is_empty(), "no node to send to");
        let started = Instant::now();
        let mut attempt = 0;
        let mut last = String::new();
        let acknowledged = try_poll_until(started + timeout, async || {
            let node = nodes[attempt % nodes.len()];
            attempt += 1;
            match request(node).try_send().await {
                Ok(reply) if reply.is_success() => Some(reply),
                Ok(reply) if matches!(reply.code(), Some("NO_LEADER" | "OUTCOME_UNKNOWN")) => {
                    last = reply.to_string();
                    None
                }
                Ok(reply) => panic!("unexpected answer while retrying: {reply}"),
                Err(error) => {
                    last = error;
                    None
                }
            }
        })
        .await;
        match acknowledged {
            Some(reply) => {
                if attempt > 1 {
                    eprintln!(
                        "harness: acknowledged after {attempt} attempts in {:?}; last refusal: {last}",
                        started.elapsed()
                    );
                }
                (reply, started.elapsed())
            }
            None => panic!("not acknowledged within {timeout:?} ({attempt} attempts): {last}"),
        }
    }

    /// SIGKILLs every running node, one right after the other.
    pub fn kill_all(&self) {
        for node in &self.nodes {
            if node.is_running() {
                node.kill();
            }
        }
    }

    /// Restarts every node that is not running, on its own data dir.
    pub fn restart_all(&self) {
        for node in &self.nodes {
            if !node.is_running() {
                node.restart();
            }
        }
    }

    /// Prints the tail of every node's log to stderr (captured by the test runner and shown
    /// when the test fails).
    pub fn dump_logs(&self) {
        for node in &self.nodes {
            eprintln!(
                "==== node {} ({}), last {LOG_TAIL_LINES} lines of {} ====\n{}",
                node.id,
                node.describe_state(),
                node.log_path().display(),
                node.log_tail(LOG_TAIL_LINES)
            );
        }
    }

    /// The temporary directory holding every node's data dir and log.
    pub fn directory_path(&self) -> Option<&Path> {
        self.directory.as_ref().map(TempDir::path)
    }

    fn spawn_run(config: &ClusterConfig) -> Cluster {
        let directory = new_temp_dir();
        let ports: Vec<(u64, u16, u16)> = (1..=config.nodes)
            .map(|id| (id, free_port(), free_port()))
            .collect();
        let initial_cluster = ports
            .iter()
            .map(|(id, api_port, peer_port)| {
                format!("{id}=127.0.0.1:{api_port}@127.0.0.1:{peer_port}")
            })
            .collect::<Vec<_>>()
            .join(",");
        let nodes: Vec<Node> = ports
            .iter()
            .map(|&(id, api_port, peer_port)| {
                let data_dir = directory.path().join(format!("node-{id}"));
                fs::create_dir_all(&data_dir).expect("create a node's data dir");
                if let Some(backup) = &config.restore_from {
                    restore(backup, id, &data_dir, &initial_cluster);
                }
                let mut args = baton_kit::RunArgs {
                    id,
                    data_dir: data_dir.clone(),
                    listen: format!("127.0.0.1:{api_port}"),
                    peer_listen: format!("127.0.0.1:{peer_port}"),
                    initial_cluster: initial_cluster.clone(),
                    heartbeat_ms: Some(config.heartbeat_ms),
                    election_timeout_ms: Some(config.election_timeout_ms),
                    tick_ms: Some(config.tick_ms),
                }
                .to_args();
                args.extend(["--log-format".into(), "human".into()]);
                args.extend(config.extra_args.iter().map(OsString::from));
                if let Some(certs) = &config.tls {
                    args.extend(certs.batond_args());
                }
                let mut env = Vec::new();
                if let Some(secret) = &config.bootstrap_token {
                    args.push("--auth".into());
                    env.push(("BATON_BOOTSTRAP_TOKEN".to_owned(), secret.clone()));
                    // `--auth` needs an authenticated peer port: peer TLS, or this secret.
                    if config.tls.is_none() {
                        args.extend(["--cluster-secret".into(), CLUSTER_SECRET.into()]);
                    }
                }
                let mut node = Node::new(
                    id,
                    api_port,
                    peer_port,
                    data_dir,
                    directory.path().join(format!("node-{id}.log")),
                    args,
                );
                node.env = env;
                node.open_files_max = config.open_files_max;
                node.https = config.tls.is_some();
                node
            })
            .collect();
        for node in &nodes {
            node.spawn();
        }
        Cluster {
            nodes,
            api: Api {
                token: config.bootstrap_token.clone(),
                ..Api::with_ca(config.tls.as_ref().map(TestCerts::ca_pem))
            },
            config: config.clone(),
            directory: Some(directory),
        }
    }

    async fn try_wait_ready(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            for node in &self.nodes {
                if let Some(status) = node.exit_status() {
                    return Err(format!(
                        "node {} exited with {status} while waiting for readiness; \
                         last lines of {}:\n{}",
                        node.id,
                        node.log_path().display(),
                        node.log_tail(10)
                    ));
                }
            }
            let mut not_ready = Vec::new();
            for node in self.live_nodes() {
                match self.api.call(Method::GET, node, "/readyz").try_send().await {
                    Ok(reply) if reply.status == 200 => {}
                    Ok(reply) => not_ready.push(format!("node {}: /readyz {}", node.id, reply)),
                    Err(error) => not_ready.push(format!("node {}: {error}", node.id)),
                }
            }
            let (leader, views) = self.agreed_leader().await;
            if not_ready.is_empty() && leader.is_some() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "not ready within {timeout:?}: {}; {}; see the node logs",
                    not_ready.join("; "),
                    views.unwrap_or_default()
                ));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// The leader every live node names, if they agree and it is live and says so itself;
    /// otherwise `None` and a description of the views.
    async fn agreed_leader(&self) -> (Option<u64>, Option<String>) {
        let live = self.live_nodes();
        let mut views: Vec<(u64, Option<api::ClusterStatus>)> = Vec::new();
        let mut descriptions = Vec::new();
        for node in &live {
            match self
                .api
                .call(Method::GET, node, "/v1/cluster")
                .try_send()
                .await
            {
                Ok(reply) if reply.status == 200 => {
                    match serde_json::from_value::<api::ClusterStatus>(reply.body.clone()) {
                        Ok(status) => {
                            descriptions.push(format!(
                                "node {} sees leader {:?} in term {}",
                                node.id, status.leader_id, status.term
                            ));
                            views.push((node.id, Some(status)));
                        }
                        Err(error) => {
                            descriptions.push(format!(
                                "node {}: /v1/cluster answer does not parse ({error}): {}",
                                node.id, reply.text
                            ));
                            views.push((node.id, None));
                        }
                    }
                }
                Ok(reply) => {
                    descriptions.push(format!("node {}: {reply}", node.id));
                    views.push((node.id, None));
                }
                Err(error) => {
                    descriptions.push(format!("node {}: {error}", node.id));
                    views.push((node.id, None));
                }
            }
        }
        let description = Some(descriptions.join("; "));
        if views.is_empty() {
            return (None, Some("no live node".to_owned()));
        }
        let leaders: BTreeSet<Option<u64>> = views
            .iter()
            .map(|(_, status)| status.as_ref().and_then(|status| status.leader_id))
            .collect();
        let Some(Some(leader)) = leaders
            .iter()
            .next()
            .copied()
            .filter(|_| leaders.len() == 1)
        else {
            return (None, description);
        };
        let leader_says_so = views.iter().any(|(id, status)| {
            *id == leader
                && status.as_ref().is_some_and(|status| {
                    status.node_id == leader && status.leader_id == Some(leader)
                })
        });
        if leader_says_so {
            (Some(leader), description)
        } else {
            (None, description)
        }
    }

    fn lost_a_port_race(&self) -> bool {
        self.nodes.iter().any(|node| {
            let log = fs::read_to_string(node.log_path())
                .unwrap_or_default()
                .to_lowercase();
            log.contains("address already in use")
                || log.contains("addrinuse")
                || log.contains("os error 98")
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump_logs();
        }
        for node in &self.nodes {
            node.process.kill();
        }
        if std::env::var_os("BATON_TEST_KEEP_DIRS").is_some() {
            if let Some(directory) = self.directory.take() {
                eprintln!(
                    "harness: kept the cluster's data dirs and logs in {}",
                    directory.keep().display()
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Nodes
// ---------------------------------------------------------------------------------------------

/// One `batond` process of a [`Cluster`], with its ports, data dir and log file. Its fault
/// methods take `&self`, so a test can hold several nodes of a cluster at once; they panic
/// when the node is not in a state the fault applies to (the test is wrong then).
#[derive(Debug)]
pub struct Node {
    /// The node id given to `--id`.
    pub id: u64,
    api_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    args: Vec<OsString>,
    /// Environment variables set for the process.
    env: Vec<(String, String)>,
    /// Whether its client API is HTTPS.
    https: bool,
    /// `ClusterConfig::open_files_max`.
    open_files_max: Option<u64>,
    process: baton_kit::Process,
}

impl Node {
    fn new(
        id: u64,
        api_port: u16,
        peer_port: u16,
        data_dir: PathBuf,
        log_path: PathBuf,
        args: Vec<OsString>,
    ) -> Node {
        Node {
            id,
            api_port,
            peer_port,
            data_dir,
            args,
            env: Vec::new(),
            https: false,
            open_files_max: None,
            process: baton_kit::Process::new(log_path),
        }
    }

    /// `http://127.0.0.1:PORT`, the base of every API request to this node.
    pub fn api_url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}", self.api_addr())
    }

    /// `127.0.0.1:PORT` of `--listen`.
    pub fn api_addr(&self) -> String {
        format!("127.0.0.1:{}", self.api_port)
    }

    /// `127.0.0.1:PORT` of `--peer-listen`.
    pub fn peer_addr(&self) -> String {
        format!("127.0.0.1:{}", self.peer_port)
    }

    /// The node's `--data-dir`.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The file that receives the node's stdout and stderr, across restarts.
    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    /// True while the process runs (paused or not).
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// True between [`Node::pause`] and [`Node::resume`].
    pub fn is_paused(&self) -> bool {
        self.process.is_paused()
    }

    /// The exit status, when the process has exited without the harness stopping it.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.process.exit_status()
    }

    /// SIGKILL (resuming it first if paused), then reap the process.
    pub fn kill(&self) {
        assert!(
            self.process.pid().is_some(),
            "kill: node {} is not running",
            self.id
        );
        self.process.kill();
    }

    /// SIGTERM, then wait (polling) for the process to exit; returns its exit status. A node
    /// that has not exited within 10 s is SIGKILLed and the test fails: SIGTERM must shut
    /// down cleanly (docs/cli.md).
    pub async fn terminate(&self) -> ExitStatus {
        assert!(!self.is_paused(), "terminate: node {} is paused", self.id);
        if let Err(error) = self.process.signal("TERM") {
            panic!("terminate: node {}: {error}", self.id);
        }
        let deadline = Instant::now() + TERMINATE_TIMEOUT;
        loop {
            if let Some(status) = self.process.try_reap() {
                return status;
            }
            if Instant::now() >= deadline {
                self.process.kill();
                panic!(
                    "node {} did not exit within {TERMINATE_TIMEOUT:?} of SIGTERM; log:\n{}",
                    self.id,
                    self.log_tail(LOG_TAIL_LINES)
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Starts the process again with the same arguments and data dir. The node must have been
    /// killed or terminated.
    pub fn restart(&self) {
        assert!(
            !self.is_running(),
            "restart: node {} is still running",
            self.id
        );
        self.process.kill();
        self.spawn();
    }

    /// SIGSTOP: the process stays alive but answers nothing, like a long GC pause.
    pub fn pause(&self) {
        assert!(
            !self.is_paused(),
            "pause: node {} is already paused",
            self.id
        );
        if let Err(error) = self.process.pause() {
            panic!("pause: node {}: {error}", self.id);
        }
    }

    /// SIGCONT after [`Node::pause`].
    pub fn resume(&self) {
        assert!(self.is_paused(), "resume: node {} is not paused", self.id);
        if let Err(error) = self.process.resume() {
            panic!("resume: node {}: {error}", self.id);
        }
    }

    /// The last `lines` lines of the node's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines).join("\n")
    }

    fn describe_state(&self) -> String {
        match self.exit_status() {
            Some(status) => format!("exited with {status}"),
            None if self.is_paused() => "paused".to_owned(),
            None if self.process.pid().is_some() => "running".to_owned(),
            None => "stopped by the harness".to_owned(),
        }
    }

    fn spawn(&self) {
        let mut command = match self.open_files_max {
            // prlimit sets the limit and then executes batond in its own process.
            Some(limit) => {
                let mut command = Command::new("prlimit");
                command
                    .arg(format!("--nofile={limit}:{limit}"))
                    .arg("--")
                    .arg(batond_path());
                command
            }
            None => Command::new(batond_path()),
        };
        command.args(&self.args);
        command.envs(self.env.iter().map(|(name, value)| (name, value)));
        let banner = format!(
            "harness: node {}: {} {}",
            self.id,
            batond_path().display(),
            self.args
                .iter()
                .map(|arg| arg.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" ")
        );
        if let Err(error) = self.process.start(command, &banner) {
            panic!("spawn {}: {error}", batond_path().display());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The batond binary, ports, directories
// ---------------------------------------------------------------------------------------------

/// `batond restore BACKUP` into `data_dir` as member `id` of `initial_cluster`; panics with its
/// output when it fails.
fn restore(backup: &Path, id: u64, data_dir: &Path, initial_cluster: &str) {
    let output = std::process::Command::new(batond_path())
        .arg("restore")
        .arg(backup)
        .args([
            "--id",
            &id.to_string(),
            "--initial-cluster",
            initial_cluster,
        ])
        .arg("--data-dir")
        .arg(data_dir)
        .output()
        .expect("run batond restore");
    assert!(
        output.status.success(),
        "batond restore of node {id}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The path of the `batond` binary, built on first use in the tests' own profile (see
/// `build_binaries`), or `BATOND_BIN` when set. Panics with cargo's output when the build
/// fails.
pub fn batond_path() -> &'static Path {
    static BATOND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match BATOND.get_or_init(|| binary("BATOND_BIN", "batond")) {
        Ok(path) => path,
        Err(message) => panic!("{message}"),
    }
}

/// The `baton` command line, found the same way (`BATON_BIN`, or built).
pub fn baton_path() -> &'static Path {
    static BATON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match BATON.get_or_init(|| binary("BATON_BIN", "baton")) {
        Ok(path) => path,
        Err(message) => panic!("{message}"),
    }
}

/// `$override_var` when set, else `bin` as [`build_binaries`] left it in the target directory.
fn binary(override_var: &str, bin: &str) -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(override_var) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("{override_var}={} is not a file", path.display()))
        };
    }
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    BUILT.get_or_init(build_binaries).clone()?;
    let profile_dir = profile_dir();
    let binary = format!("{bin}{}", std::env::consts::EXE_SUFFIX);
    let mut candidates = Vec::new();
    if let Some(directory) = &profile_dir {
        candidates.push(directory.join(&binary));
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        candidates.push(PathBuf::from(target).join(profile()).join(&binary));
    }
    candidates.push(
        workspace_root()
            .join("target")
            .join(profile())
            .join(&binary),
    );
    candidates
        .iter()
        .find(|path| path.is_file())
        .cloned()
        .ok_or_else(|| format!("{bin} was built but is not at any of {candidates:?}"))
}

/// Builds `batond` and `baton` with `$CARGO build` in the tests' own profile, once per test
/// process. The build selects the whole workspace and its tests, as `cargo test --workspace`
/// does, so that cargo unifies the dependencies' features the same way and reuses what that
/// command built: a build of the two packages alone resolved other features and rebuilt some
/// forty dependencies twice (108 s of a CI run, against 23 s for the two binaries).
fn build_binaries() -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(&cargo);
    command
        .args(["build", "--quiet", "--workspace", "--tests"])
        .args(["--bin", "batond", "--bin", "baton"])
        .arg("--manifest-path")
        .arg(workspace_root().join("Cargo.toml"));
    if profile() == "release" {
        command.arg("--release");
    }
    let output = command.output().map_err(|error| {
        format!(
            "could not run `{} build` for batond and baton: {error}",
            cargo.to_string_lossy()
        )
    })?;
    if !output.status.success() {
        return Err(format!(
            "building batond and baton failed ({}); the integration tests need them.\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(())
}

/// `release` when the tests were built in release, else `debug`.
fn profile() -> &'static str {
    let release = profile_dir()
        .as_deref()
        .and_then(Path::file_name)
        .is_some_and(|name| name == "release");
    if release {
        "release"
    } else {
        "debug"
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// `…/target/debug` from the test binary's `…/target/debug/deps/it-xxxx`.
fn profile_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    if deps.file_name()? == "deps" {
        deps.parent().map(Path::to_path_buf)
    } else {
        Some(deps.to_path_buf())
    }
}

/// A port that was free a moment ago on 127.0.0.1, never handed out twice by this process.
/// Another process may take it before the node binds it: [`Cluster::start`] retries then.
pub fn free_port() -> u16 {
    static TAKEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        let port = listener
            .local_addr()
            .expect("an ephemeral port's address")
            .port();
        let mut taken = match TAKEN.lock() {
            Ok(taken) => taken,
            Err(poisoned) => poisoned.into_inner(),
        };
        if taken.insert(port) {
            return port;
        }
    }
}

fn new_temp_dir() -> TempDir {
    tempfile::Builder::new()
        .prefix("baton-it-")
        .tempdir()
        .expect("create a temporary directory")
}

/// A fresh `Idempotency-Key`: the client crate's own (a random UUIDv4).
pub fn idempotency_key() -> String {
    baton_client::idempotency_key()
}

// ---------------------------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------------------------

/// A thin HTTP helper over `reqwest`: every call returns a [`HttpReply`] with the status, the
/// headers and the body parsed as JSON. Connections are not pooled, so a restarted node is
/// never reached through a dead connection.
#[derive(Debug, Clone)]
pub struct Api {
    client: reqwest::Client,
    /// Sent as `Authorization: Bearer` by every call that does not set its own.
    token: Option<String>,
}

impl Default for Api {
    fn default() -> Api {
        Api::new()
    }
}

impl Api {
    /// A client with a [`REQUEST_TIMEOUT`] per request and no proxy.
    pub fn new() -> Api {
        Api::with_ca(None)
    }

    /// Like [`Api::new`], trusting the CA certificate `ca_pem` for HTTPS.
    pub fn with_ca(ca_pem: Option<Vec<u8>>) -> Api {
        let mut builder = reqwest::Client::builder()
            .no_proxy()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(1))
            .pool_max_idle_per_host(0);
        if let Some(pem) = ca_pem {
            builder = builder
                .add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("a PEM CA"));
        }
        Api {
            client: builder.build().expect("build an HTTP client"),
            token: None,
        }
    }

    /// A request to build further (namespace, idempotency key, body) and send.
    pub fn call(&self, method: Method, node: &Node, path: &str) -> Call {
        Call {
            client: self.client.clone(),
            method,
            url: format!("{}{path}", node.api_url()),
            headers: Vec::new(),
            token: self.token.clone(),
            body: None,
            timeout: None,
        }
    }

    /// `GET path`; panics on a transport error.
    pub async fn get(&self, node: &Node, path: &str) -> HttpReply {
        self.call(Method::GET, node, path).send().await
    }

    /// Every event after revision `after` that `node` keeps, in order, page by page.
    pub async fn events_after(&self, node: &Node, mut after: u64) -> Vec<api::Event> {
        let mut events = Vec::new();
        loop {
            let page: api::EventsPage = self
                .get(node, &format!("/v1/events?after={after}&limit=1000"))
                .await
                .expect_json(200);
            if page.events.is_empty() {
                return events;
            }
            after = page.next;
            events.extend(page.events);
        }
    }

    /// The revision of the last event `node` has applied.
    pub async fn last_revision(&self, node: &Node) -> u64 {
        let mut after = 0;
        loop {
            let page: api::EventsPage = self
                .get(node, &format!("/v1/events?after={after}&limit=1000"))
                .await
                .expect_json(200);
            if page.events.is_empty() {
                return page.next;
            }
            after = page.next;
        }
    }

    /// `POST path` with a JSON body; panics on a transport error.
    pub async fn post(&self, node: &Node, path: &str, body: &Value) -> HttpReply {
        self.call(Method::POST, node, path).json(body).send().await
    }

    /// `PUT path` with a JSON body; panics on a transport error.
    pub async fn put(&self, node: &Node, path: &str, body: &Value) -> HttpReply {
        self.call(Method::PUT, node, path).json(body).send().await
    }

    /// `DELETE path` without a body; panics on a transport error.
    pub async fn delete(&self, node: &Node, path: &str) -> HttpReply {
        self.call(Method::DELETE, node, path).send().await
    }
}

/// One request being built by [`Api::call`].
#[derive(Debug)]
pub struct Call {
    client: reqwest::Client,
    method: Method,
    url: String,
    headers: Vec<(String, String)>,
    /// `Authorization: Bearer`: the cluster's default, replaced by [`Call::token`].
    token: Option<String>,
    body: Option<(Vec<u8>, String)>,
    timeout: Option<Duration>,
}

impl Call {
    /// A JSON body.
    pub fn json(self, body: &Value) -> Call {
        let bytes = serde_json::to_vec(body).expect("serialize a JSON body");
        self.raw(bytes, "application/json")
    }

    /// A body of raw bytes with this content type (for malformed or oversized bodies).
    pub fn raw(mut self, body: impl Into<Vec<u8>>, content_type: &str) -> Call {
        self.body = Some((body.into(), content_type.to_owned()));
        self
    }

    /// Header `Baton-Namespace`.
    pub fn namespace(self, namespace: &str) -> Call {
        self.header(api::HEADER_NAMESPACE, namespace)
    }

    /// Header `Idempotency-Key`.
    pub fn idempotency_key(self, key: &str) -> Call {
        self.header(api::HEADER_IDEMPOTENCY_KEY, key)
    }

    /// `Authorization: Bearer <secret>` instead of the cluster's default; `None` sends none.
    pub fn token(mut self, secret: Option<&str>) -> Call {
        self.token = secret.map(str::to_owned);
        self
    }

    /// Any other header.
    pub fn header(mut self, name: &str, value: &str) -> Call {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// A longer (or shorter) timeout than [`REQUEST_TIMEOUT`] for this request.
    pub fn timeout(mut self, timeout: Duration) -> Call {
        self.timeout = Some(timeout);
        self
    }

    /// Sends the request; `Err` describes a transport failure (refused, reset, timeout).
    pub async fn try_send(self) -> Result<HttpReply, String> {
        let request = format!("{} {}", self.method, self.url);
        let mut builder = self.client.request(self.method, &self.url);
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        if let Some(secret) = &self.token {
            builder = builder.bearer_auth(secret);
        }
        if let Some(timeout) = self.timeout {
            builder = builder.timeout(timeout);
        }
        if let Some((body, content_type)) = self.body {
            builder = builder
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(body);
        }
        let response = builder
            .send()
            .await
            .map_err(|error| format!("{request}: {error:#}"))?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response
            .bytes()
            .await
            .map_err(|error| format!("{request}: reading the body: {error:#}"))?;
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let body = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|_| Value::String(text.clone()))
        };
        Ok(HttpReply {
            request,
            status,
            headers,
            body,
            text,
        })
    }

    /// Sends the request; panics on a transport failure.
    pub async fn send(self) -> HttpReply {
        match self.try_send().await {
            Ok(reply) => reply,
            Err(error) => panic!("request failed: {error}"),
        }
    }
}

/// An HTTP answer: status, headers, and the body as JSON (`Null` when empty, a JSON string
/// holding the text when it is not JSON).
#[derive(Debug, Clone)]
pub struct HttpReply {
    /// `METHOD url` of the request, for messages.
    pub request: String,
    /// The HTTP status.
    pub status: u16,
    /// The response headers.
    pub headers: reqwest::header::HeaderMap,
    /// The body as JSON.
    pub body: Value,
    /// The body as text.
    pub text: String,
}

impl fmt::Display for HttpReply {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            formatter,
            "{} -> {} [Baton-Leader: {:?}, Baton-Cluster-Time: {:?}, Content-Type: {:?}] {}",
            self.request,
            self.status,
            self.header(api::HEADER_LEADER),
            self.header(api::HEADER_CLUSTER_TIME),
            self.content_type(),
            self.text
        )
    }
}

impl HttpReply {
    /// A response header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    /// The `Content-Type` header.
    pub fn content_type(&self) -> Option<&str> {
        self.header("content-type")
    }

    /// The problem `code` of an error answer.
    pub fn code(&self) -> Option<&str> {
        self.body.get("code").and_then(Value::as_str)
    }

    /// The `Baton-Cluster-Time` header; panics when it is missing or not an integer.
    pub fn cluster_time(&self) -> u64 {
        self.try_cluster_time()
            .unwrap_or_else(|| panic!("no integer Baton-Cluster-Time header: {self}"))
    }

    /// The `Baton-Cluster-Time` header, if present and an integer.
    pub fn try_cluster_time(&self) -> Option<u64> {
        self.header(api::HEADER_CLUSTER_TIME)?.trim().parse().ok()
    }

    /// The `Baton-Leader` header as a node id, if present and an integer.
    pub fn leader(&self) -> Option<u64> {
        self.header(api::HEADER_LEADER)?.trim().parse().ok()
    }

    /// True when the `Idempotent-Replayed` header says `true`.
    pub fn replayed(&self) -> bool {
        self.header(api::HEADER_IDEMPOTENT_REPLAYED)
            .is_some_and(|value| value.eq_ignore_ascii_case("true"))
    }

    /// True for a 2xx status.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// Asserts the status, showing the whole answer when it differs.
    pub fn expect_status(&self, status: u16) -> &HttpReply {
        assert_eq!(self.status, status, "unexpected status: {self}");
        self
    }

    /// Asserts the status and parses the body.
    pub fn expect_json<T: DeserializeOwned>(&self, status: u16) -> T {
        self.expect_status(status).parse()
    }

    /// Parses the body; panics with the answer when it does not fit `T`.
    pub fn parse<T: DeserializeOwned>(&self) -> T {
        serde_json::from_value(self.body.clone()).unwrap_or_else(|error| {
            panic!(
                "the answer does not parse as {}: {error}: {self}",
                std::any::type_name::<T>()
            )
        })
    }

    /// Asserts an error answer as docs/api.md shapes it: this status, content type
    /// `application/problem+json`, this `code`, a non-empty `message`, and the two headers
    /// every response carries. Returns the parsed problem.
    pub fn expect_problem(&self, status: u16, code: api::ErrorCode) -> api::Problem {
        assert_eq!(self.status, status, "unexpected status: {self}");
        let content_type = self.content_type().unwrap_or_default();
        assert!(
            content_type.starts_with(api::PROBLEM_CONTENT_TYPE),
            "an error is not {}: {self}",
            api::PROBLEM_CONTENT_TYPE
        );
        let problem: api::Problem = self.parse();
        assert_eq!(problem.code, code, "unexpected code: {self}");
        assert!(
            !problem.message.trim().is_empty(),
            "an empty message: {self}"
        );
        self.expect_baton_headers();
        problem
    }

    /// Asserts the `Baton-Leader` and `Baton-Cluster-Time` headers every response carries.
    pub fn expect_baton_headers(&self) -> &HttpReply {
        assert!(
            self.header(api::HEADER_LEADER).is_some(),
            "no Baton-Leader header: {self}"
        );
        assert!(
            self.try_cluster_time().is_some(),
            "no integer Baton-Cluster-Time header: {self}"
        );
        self
    }
}

// ---------------------------------------------------------------------------------------------
// Polling
// ---------------------------------------------------------------------------------------------

/// Calls `check` every [`POLL_INTERVAL`] until it returns `Some`, and returns that; panics
/// naming `what` after `timeout`. This is how tests wait for a state: never a bare sleep.
pub async fn poll_until<T>(
    timeout: Duration,
    what: &str,
    check: impl AsyncFnMut() -> Option<T>,
) -> T {
    match try_poll_until(Instant::now() + timeout, check).await {
        Some(value) => value,
        None => panic!("timed out after {timeout:?} waiting for {what}"),
    }
}

/// Calls `check` every [`POLL_INTERVAL`] until it returns `Some` (then that) or `deadline`
/// passes (then `None`). `check` runs at least once.
pub async fn try_poll_until<T>(
    deadline: Instant,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> Option<T> {
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Opens a file for appending a note to a node log; used by tests that want to mark a phase.
pub fn note_in_log(node: &Node, note: &str) {
    if let Ok(mut log) = OpenOptions::new().append(true).open(node.log_path()) {
        let _ = writeln!(log, "---- test: {note} ----");
    }
}

// ---------------------------------------------------------------------------------------------
// Small checks shared by the tests
// ---------------------------------------------------------------------------------------------

/// True for a session id as the server mints them: 32 lowercase hex characters.
pub fn is_session_id(text: &str) -> bool {
    text.len() == 32
        && text
            .bytes()
            .all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
}

/// True when `text` contains `number` as a whole number (not as part of a longer one).
pub fn mentions_number(text: &str, number: u64) -> bool {
    text.split(|c: char| !c.is_ascii_digit())
        .any(|word| word == number.to_string())
}

/// The code block after the line `<!-- a test runs this snippet: NAME -->` of a repository
/// file: the documents' snippets are run as they are written.
pub fn snippet(file: &str, name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("read the document");
    let marker = format!("<!-- a test runs this snippet: {name} -->");
    let after = &text[text
        .find(&marker)
        .unwrap_or_else(|| panic!("{file}: no {marker}"))..];
    let mut lines = after.lines().skip(1);
    assert!(
        lines.next().is_some_and(|fence| fence.starts_with("```")),
        "{file}: {name} is not followed by a code block"
    );
    let mut code = String::new();
    for line in lines.take_while(|line| *line != "```") {
        code.push_str(line);
        code.push('\n');
    }
    code
}

/// A `PATH` with `baton` first.
pub fn path_with_baton() -> String {
    let directory = baton_path()
        .parent()
        .expect("baton's directory")
        .to_path_buf();
    format!(
        "{}:{}",
        directory.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}
