//! Cluster control: three `batond` processes with fresh data dirs under the run directory,
//! started, SIGKILLed, restarted on their data, paused (SIGSTOP) and resumed (SIGCONT), and
//! the few node-local calls the nemesis and the final checks need (who leads, readiness,
//! clock control, digests).
//!
//! Every process started here is owned by a [`Cluster`], and [`ClusterGuard`] (held by the
//! run, never shared) resumes and SIGKILLs all of them when it is dropped: at the end of a run,
//! when the run future is dropped on Ctrl-C or SIGTERM, or while unwinding from a panic. What
//! must never live here: workload logic, or any address the network backend did not give.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::lazyfs::{Cut, LazyMount, Torn};
use crate::net::{self, Net, NetChoice, Pids};

/// How long a cluster may take to elect a leader with every node ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Per-request timeout of the harness's own control calls.
const CONTROL_TIMEOUT: Duration = Duration::from_millis(1_000);
/// How long a backup (`GET /v1/snapshot`) may take.
const BACKUP_TIMEOUT: Duration = Duration::from_secs(20);
/// The line the harness writes into a node's log when it restores the node's data dir from a
/// backup: what the node logs after it is a member of a new cluster.
pub const RESTORED_MARKER: &str = "---- baton-jepsen: data dir restored";

/// Timings and flags of the nodes.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// The `batond` binary.
    pub batond: PathBuf,
    /// Where data dirs and logs go.
    pub run_dir: PathBuf,
    /// `--heartbeat-ms` (`None`: batond's default).
    pub heartbeat_ms: Option<u64>,
    /// `--election-timeout-ms` (`None`: batond's default).
    pub election_timeout_ms: Option<u64>,
    /// `--tick-ms` (`None`: batond's default).
    pub tick_ms: Option<u64>,
    /// Start with `--clock-control`.
    pub clock_control: bool,
    /// Which network backend (`--net`).
    pub net: NetChoice,
    /// `--snapshot-log-entries`, when the run asks for more snapshots than batond's default.
    pub snapshot_log_entries: Option<u64>,
    /// `--secure`: access control and TLS (HTTPS, mutual TLS between peers) with a CA and a
    /// bootstrap token made for the run.
    pub secure: bool,
    /// Every node's data dir on a lazy file system of its own (`lazyfs`), for power cuts.
    pub lazy_data_dirs: Option<Torn>,
    /// An earlier release's `batond`: every node starts on it, until the `upgrade` nemesis
    /// moves it to `batond` on the same data dir.
    pub batond_before: Option<PathBuf>,
}

/// What a secured cluster runs with: its certificates and the bootstrap admin token the
/// harness's clients send.
#[derive(Debug, Clone)]
pub struct Security {
    pub certs: baton_kit::TestCerts,
    pub token: String,
}

/// How long a restarted node may take to answer `/readyz` before the restart counts as
/// failed. Generous: a restart on a loaded two-core machine replays its log and may catch up
/// through a snapshot, and a slow restart must not be mistaken for a broken one.
pub const RESTART_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Lines of a node's log quoted when it cannot be restarted.
const LOG_TAIL_LINES: usize = 15;

/// What went wrong with a node, and whose fault it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeFault {
    /// The harness or its environment could not start the process (spawn failed, port taken):
    /// nothing was learnt about Baton.
    Harness,
    /// The process started and then exited or never became ready: that is a finding about
    /// batond (a node that cannot restart on its own data), though the run cannot be judged.
    Restart,
    /// The process exited by itself while the run went on (no kill asked for it).
    Crashed,
}

/// A node that could not be restarted, or that died by itself. The run stops at once on it
/// (exit 2): every later fault and check would be about a two-node cluster the run did not ask
/// for, and restarting a crashed node would hide the crash.
#[derive(Debug, Clone)]
pub struct NodeFailure {
    /// The node.
    pub node: u64,
    /// Whose fault.
    pub fault: NodeFault,
    /// What happened, in one line.
    pub cause: String,
    /// The last lines of the node's log (of every start; the last start's are last).
    pub log_tail: Vec<String>,
}

impl NodeFailure {
    /// `node failed to restart` or `harness failure`, for messages and `results.json`.
    pub fn kind(&self) -> &'static str {
        match self.fault {
            NodeFault::Harness => "harness failure",
            NodeFault::Restart => "node failed to restart",
            NodeFault::Crashed => "node crashed",
        }
    }

    /// The failure as `results.json` records it.
    pub fn to_json(&self) -> Value {
        json!({"kind": self.kind(), "node": self.node, "cause": self.cause,
               "log_tail": self.log_tail})
    }
}

impl std::fmt::Display for NodeFailure {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "{}: node {}: {}; its log ends with:",
            self.kind(),
            self.node,
            self.cause
        )?;
        for line in &self.log_tail {
            write!(formatter, "\n    {line}")?;
        }
        Ok(())
    }
}

impl std::error::Error for NodeFailure {}

/// One `batond` process.
#[derive(Debug)]
pub struct Node {
    /// `--id`.
    pub id: u64,
    /// Where clients reach it directly (`--listen`).
    pub api: SocketAddr,
    args: Vec<OsString>,
    /// The process, its log (stdout and stderr of every start) and its faults.
    process: baton_kit::Process,
}

/// What a restart waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// `/readyz`: a member that knows its leader and has caught up.
    Ready,
    /// `/healthz`: the process serves. For a node that may have been removed from the
    /// membership (it never becomes ready until added back).
    Serving,
}

/// The three nodes, their network, and an HTTP client for control calls.
#[derive(Debug)]
pub struct Cluster {
    /// Every node, in id order.
    pub nodes: Vec<Node>,
    /// The network between them.
    pub net: Arc<dyn Net>,
    /// Why that network was chosen.
    pub net_selection: String,
    config: ClusterConfig,
    /// With `--secure`.
    security: Option<Security>,
    pids: Pids,
    http: reqwest::Client,
    /// Set by [`Cluster::stop_all`]: no process is started after it.
    stopped: std::sync::atomic::AtomicBool,
    /// The lazy file systems the data dirs are on (`lazy_data_dirs`), in id order; unmounted
    /// when the cluster goes, after its processes.
    mounts: Vec<LazyMount>,
    /// The nodes that run `batond` rather than `batond_before` (all of them without one).
    upgraded: Mutex<std::collections::BTreeSet<u64>>,
    /// `--initial-cluster` of every node: `id=API@PEER`, comma-separated.
    initial_cluster: String,
}

/// Owns the right to stop a cluster: dropping it resumes and kills every node process.
#[derive(Debug)]
pub struct ClusterGuard(pub Arc<Cluster>);

impl Drop for ClusterGuard {
    fn drop(&mut self) {
        self.0.stop_all();
    }
}

impl Cluster {
    /// Starts three nodes with fresh data dirs and waits until they agree on a leader.
    pub async fn start(config: ClusterConfig) -> anyhow::Result<ClusterGuard> {
        let ids = [1u64, 2, 3];
        let pids: Pids = Arc::new(Mutex::new(BTreeMap::new()));
        // Dropping `net` on an error below releases whatever the backend set up.
        let (net, net_selection) = net::choose(config.net, &ids, pids.clone()).await?;
        let initial_cluster = ids
            .iter()
            .map(|&id| {
                format!(
                    "{id}={}@{}",
                    net.advertised_api_addr(id),
                    net.advertised_peer_addr(id)
                )
            })
            .collect::<Vec<_>>()
            .join(",");
        // The harness's networks are private (loopback, or namespaces of its own): peers prove
        // themselves with a secret of this run, and the open client API is on purpose.
        let cluster_secret = format!("harness-{:032x}", rand::random::<u128>());
        let security = config.secure.then(|| {
            let hosts: Vec<String> = ids
                .iter()
                .flat_map(|&id| [net.advertised_api_addr(id), net.advertised_peer_addr(id)])
                .map(|address| {
                    address
                        .rsplit_once(':')
                        .map_or(address.clone(), |(host, _)| host.to_owned())
                })
                .collect();
            let dir = config.run_dir.join("certs");
            fs::create_dir_all(&dir).expect("create the certificates' directory");
            Security {
                certs: baton_kit::TestCerts::generate(&dir, "harness", &hosts),
                token: format!("harness-admin-{:032x}", rand::random::<u128>()),
            }
        });
        let mut nodes = Vec::new();
        let mut mounts = Vec::new();
        for id in ids {
            let (api, peer) = (net.api_addr(id), net.peer_listen_addr(id));
            let data_dir = node_data_dir(&config.run_dir, id);
            fs::create_dir_all(&data_dir)?;
            if config.lazy_data_dirs.is_some() {
                // A node's disk: a power cut drops what it did not sync. Not mounting is a
                // failure of the run, never a quiet fall back to the real disk.
                mounts.push(LazyMount::mount(&data_dir).with_context(|| {
                    format!(
                        "mount a lazy file system on {} (needs /dev/fuse and fusermount3: apt-get install fuse3)",
                        data_dir.display()
                    )
                })?);
            }
            let mut args = baton_kit::RunArgs {
                id,
                data_dir,
                listen: api.to_string(),
                peer_listen: peer.to_string(),
                initial_cluster: initial_cluster.clone(),
                heartbeat_ms: config.heartbeat_ms,
                election_timeout_ms: config.election_timeout_ms,
                tick_ms: config.tick_ms,
            }
            .to_args();
            args.extend([
                "--insecure".into(),
                "--cluster-secret".into(),
                cluster_secret.clone().into(),
            ]);
            if let Some(security) = &security {
                args.push("--auth".into());
                args.extend(security.certs.batond_args());
            }
            if config.clock_control {
                args.push("--clock-control".into());
            }
            if let Some(entries) = config.snapshot_log_entries {
                args.push("--snapshot-log-entries".into());
                args.push(entries.to_string().into());
            }
            nodes.push(Node {
                id,
                api,
                args,
                process: baton_kit::Process::new(config.run_dir.join(format!("n{id}.log"))),
            });
        }
        let http = client_builder(security.as_ref())?
            .timeout(CONTROL_TIMEOUT)
            .build()?;
        let cluster = ClusterGuard(Arc::new(Cluster {
            nodes,
            net,
            net_selection,
            config,
            security,
            pids,
            http,
            stopped: std::sync::atomic::AtomicBool::new(false),
            mounts,
            upgraded: Mutex::default(),
            initial_cluster,
        }));
        for node in &cluster.0.nodes {
            cluster.0.spawn(node)?;
        }
        cluster.0.wait_ready(READY_TIMEOUT).await?;
        Ok(cluster)
    }

    /// The node with this id.
    pub fn node(&self, id: u64) -> &Node {
        &self.nodes[usize::try_from(id - 1).unwrap_or(0)]
    }

    /// `https` for a secured cluster, else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.security.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// Every node's client API URL, in id order (`https://` for a secured cluster).
    pub fn api_urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|node| format!("{}://{}", self.scheme(), node.api))
            .collect()
    }

    /// An HTTP client builder for this cluster's client API: no proxy, and for a secured
    /// cluster its CA and the bootstrap admin token on every request.
    pub fn client_builder(&self) -> anyhow::Result<reqwest::ClientBuilder> {
        client_builder(self.security.as_ref())
    }

    /// The pid of node `id`'s process while it runs.
    pub fn pid(&self, id: u64) -> Option<u32> {
        self.node(id).process.pid()
    }

    /// Node `id`'s data directory.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        node_data_dir(&self.config.run_dir, id)
    }

    /// Node ids.
    pub fn ids(&self) -> Vec<u64> {
        self.nodes.iter().map(|node| node.id).collect()
    }

    /// The configuration the cluster was started with.
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    /// True while the node's process runs (paused or not).
    pub fn is_running(&self, id: u64) -> bool {
        self.node(id).process.is_running()
    }

    /// True between [`Cluster::pause`] and [`Cluster::resume`].
    pub fn is_paused(&self, id: u64) -> bool {
        self.node(id).process.is_paused()
    }

    /// SIGKILL (resuming first if paused), reaped at once.
    pub fn kill(&self, id: u64) {
        self.node(id).process.kill();
    }

    /// The binary node `id` runs: the earlier release's until it is upgraded.
    fn batond_of(&self, id: u64) -> PathBuf {
        match &self.config.batond_before {
            Some(before) if !lock(&self.upgraded).contains(&id) => before.clone(),
            _ => self.config.batond.clone(),
        }
    }

    /// Whether node `id` runs `batond` (always so without an earlier release).
    pub fn is_upgraded(&self, id: u64) -> bool {
        self.config.batond_before.is_none() || lock(&self.upgraded).contains(&id)
    }

    /// From its next start on, node `id` runs `batond` instead of the earlier release.
    pub fn upgrade(&self, id: u64) {
        lock(&self.upgraded).insert(id);
    }

    /// SIGTERM, then waits up to `within` for the process to exit and reaps it: its status.
    /// A process still running then is SIGKILLed and the stop is an error.
    pub async fn terminate(
        &self,
        id: u64,
        within: Duration,
    ) -> anyhow::Result<std::process::ExitStatus> {
        let process = &self.node(id).process;
        process
            .signal("TERM")
            .map_err(|error| anyhow::anyhow!("SIGTERM to node {id}: {error}"))?;
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = process.try_reap() {
                return Ok(status);
            }
            if Instant::now() > deadline {
                process.kill();
                bail!("node {id} did not exit within {within:?} of SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Takes a backup through node `id`'s `GET /v1/snapshot` (any node answers, after a read
    /// index: the file holds every write acknowledged before the request) into `file`, checked
    /// whole. Returns the backup's header.
    pub async fn save_backup(&self, id: u64, file: &Path) -> anyhow::Result<Value> {
        let url = format!("{}://{}/v1/snapshot", self.scheme(), self.node(id).api);
        let response = self.http.get(url).timeout(BACKUP_TIMEOUT).send().await?;
        let status = response.status();
        let bytes = response.bytes().await?;
        if !status.is_success() {
            bail!(
                "GET /v1/snapshot on node {id}: {status} {}",
                String::from_utf8_lossy(&bytes)
            );
        }
        let (header, _) = baton_client::api::decode_backup(&bytes)
            .map_err(|error| anyhow::anyhow!("the backup from node {id} is refused: {error}"))?;
        fs::write(file, &bytes).with_context(|| format!("write {}", file.display()))?;
        Ok(serde_json::to_value(header)?)
    }

    /// Replaces node `id`'s data dir (the node must be stopped) with one seeded from `backup` by
    /// `batond restore`, as a member of a new cluster of the same members at the same
    /// addresses. The old dir's files are deleted (a lazy file system's mount point stays).
    /// The node's log gets [`RESTORED_MARKER`] and what `batond restore` printed: the votes
    /// saved after it belong to the new cluster.
    pub fn restore_node(&self, id: u64, backup: &Path) -> anyhow::Result<()> {
        if self.is_running(id) {
            bail!("node {id} runs: stop it before restoring its data dir");
        }
        let dir = self.data_dir(id);
        for entry in fs::read_dir(&dir).with_context(|| format!("read {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            }
            .with_context(|| format!("remove {}", path.display()))?;
        }
        let output = std::process::Command::new(self.batond_of(id))
            .arg("restore")
            .arg(backup)
            .args(["--id", &id.to_string(), "--data-dir"])
            .arg(&dir)
            .args(["--initial-cluster", &self.initial_cluster])
            .env_remove("BATON_DATA_DIR")
            .output()
            .context("run batond restore")?;
        let mut log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(id))?;
        writeln!(log, "{RESTORED_MARKER} from {}", backup.display())?;
        log.write_all(&output.stdout)?;
        log.write_all(&output.stderr)?;
        if !output.status.success() {
            bail!(
                "batond restore of node {id} exited with {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(())
    }

    /// The first node found to have exited by itself (not by a kill of the harness), with the
    /// tail of its log. The run stops on it: a crash is a finding, and a restart must not
    /// cover it up.
    pub fn crashed(&self) -> Option<NodeFailure> {
        if self.stopped.load(std::sync::atomic::Ordering::SeqCst) {
            return None;
        }
        for node in &self.nodes {
            if let Some(status) = node.process.crashed() {
                return Some(NodeFailure {
                    node: node.id,
                    fault: NodeFault::Crashed,
                    cause: format!("it exited by itself ({status}) while the run went on"),
                    log_tail: self.log_tail(node.id),
                });
            }
        }
        None
    }

    /// Starts a killed node again on its data dir, without waiting for it: for the nemesis
    /// that must watch the start itself. Most callers want [`Cluster::restart`].
    pub fn start_again(&self, id: u64) -> Result<(), NodeFailure> {
        if self.is_running(id) {
            return Ok(());
        }
        self.spawn(self.node(id)).map_err(|error| NodeFailure {
            node: id,
            fault: NodeFault::Harness,
            cause: format!("could not start batond: {error:#}"),
            log_tail: self.log_tail(id),
        })
    }

    /// Starts a killed node again on its data dir and waits until it answers `/readyz`. A
    /// node that exits instead, or is not ready within [`RESTART_READY_TIMEOUT`], is a
    /// [`NodeFailure`]: the caller stops the run rather than carry on with two nodes.
    pub async fn restart(&self, id: u64, readiness: Readiness) -> Result<(), NodeFailure> {
        self.start_again(id)?;
        self.wait_restarted(id, readiness, RESTART_READY_TIMEOUT)
            .await
    }

    /// Waits until node `id`, just started, answers `/readyz` (or `/healthz`); fails if it
    /// exits first or the timeout passes.
    pub async fn wait_restarted(
        &self,
        id: u64,
        readiness: Readiness,
        timeout: Duration,
    ) -> Result<(), NodeFailure> {
        let started = Instant::now();
        let route = match readiness {
            Readiness::Ready => "readyz",
            Readiness::Serving => "healthz",
        };
        let url = format!("{}://{}/{route}", self.scheme(), self.node(id).api);
        loop {
            if let Some(status) = self.exit_status(id) {
                let log_tail = self.log_tail(id);
                // A port still held by someone else is the environment's fault, not batond's.
                let port_taken = log_tail.iter().any(|line| {
                    line.contains("Address already in use") || line.contains("AddrInUse")
                });
                let (fault, cause) = if port_taken {
                    (
                        NodeFault::Harness,
                        format!(
                            "its port is taken: it exited ({status}) {} ms after start",
                            started.elapsed().as_millis()
                        ),
                    )
                } else {
                    (
                        NodeFault::Restart,
                        format!(
                            "it exited ({status}) {} ms after start",
                            started.elapsed().as_millis()
                        ),
                    )
                };
                return Err(NodeFailure {
                    node: id,
                    fault,
                    cause,
                    log_tail,
                });
            }
            if !self.is_running(id) {
                // Killed by someone else meanwhile (the run is stopping): not a failure to restart.
                return Ok(());
            }
            let ready = matches!(self.http.get(&url).send().await, Ok(answer) if answer.status().is_success());
            if ready {
                return Ok(());
            }
            if started.elapsed() >= timeout {
                // Whether the others had a leader, and how loaded the machine is, tell a node
                // that cannot rejoin from a cluster that lost its leader on a starved machine.
                let mut others = Vec::new();
                for other in self.ids().into_iter().filter(|other| *other != id) {
                    let leader = match self.get_json(other, "/v1/cluster").await {
                        Ok(status) => status["leader_id"]
                            .as_u64()
                            .map_or("no leader".to_owned(), |leader| format!("leader {leader}")),
                        Err(_) => "no answer".to_owned(),
                    };
                    others.push(format!("node {other}: {leader}"));
                }
                return Err(NodeFailure {
                    node: id,
                    fault: NodeFault::Restart,
                    cause: format!(
                        "it runs but did not answer /{route} within {} s of its restart \
                         (the others say {}; load average {})",
                        timeout.as_secs(),
                        others.join(", "),
                        load_average()
                    ),
                    log_tail: self.log_tail(id),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The exit status of node `id` if its process has exited by itself (it stays recorded
    /// until the node is started again).
    fn exit_status(&self, id: u64) -> Option<std::process::ExitStatus> {
        self.node(id).process.exit_status()
    }

    /// Watches node `id`'s log from byte `from` (where its current start's lines begin) and
    /// SIGKILLs it the moment a line containing `needle` appears. Polls every millisecond, on
    /// the calling thread (run it on a blocking thread): the point is to land inside the
    /// window the line opens. Gives up at `timeout`, when the process exits by itself, or
    /// when a line containing `give_up_on` appears first (the window is already over).
    /// `delay` (small) postpones the kill after the line, to land at other points inside the
    /// window. Returns what happened.
    pub fn kill_on_log_line(
        &self,
        id: u64,
        from: u64,
        needle: &str,
        give_up_on: &str,
        delay: Duration,
        timeout: Duration,
    ) -> LogKill {
        use std::io::{Read, Seek, SeekFrom};
        let started = Instant::now();
        let mut seen: Vec<u8> = Vec::new();
        let mut offset = from;
        loop {
            if let Ok(mut file) = fs::File::open(self.node(id).process.log_path()) {
                if file.seek(SeekFrom::Start(offset)).is_ok() {
                    let mut fresh = Vec::new();
                    if file.read_to_end(&mut fresh).is_ok() {
                        offset += fresh.len() as u64;
                        seen.extend_from_slice(&fresh);
                    }
                }
            }
            if let Some(at) = baton_kit::find(&seen, needle.as_bytes()) {
                if !delay.is_zero() {
                    std::thread::sleep(delay);
                }
                self.kill(id);
                let line_end = seen[at..]
                    .iter()
                    .position(|&byte| byte == b'\n')
                    .map_or(seen.len(), |end| at + end);
                return LogKill::Killed {
                    after: started.elapsed(),
                    line: String::from_utf8_lossy(&seen[..line_end])
                        .lines()
                        .last()
                        .unwrap_or("")
                        .to_owned(),
                };
            }
            if self.exit_status(id).is_some() || !self.is_running(id) {
                return LogKill::Exited;
            }
            if baton_kit::find(&seen, give_up_on.as_bytes()).is_some() {
                return LogKill::Passed;
            }
            if started.elapsed() >= timeout {
                return LogKill::NotSeen;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// True when node `id`'s log from byte `from` on contains `needle`.
    pub fn log_contains(&self, id: u64, from: u64, needle: &str) -> bool {
        self.node(id).process.log_contains(from, needle)
    }

    /// Cuts the power of every node's disk: what no node synced is dropped, and with
    /// `lazy_data_dirs` `Torn::LastWrite` each file's last unsynced write is torn. Call it with
    /// every node killed. What each node's disk lost, in id order; empty without lazy dirs.
    pub fn cut_power(&self) -> Vec<Cut> {
        let torn = self.config.lazy_data_dirs.unwrap_or(Torn::No);
        self.mounts
            .iter()
            .map(|mount| mount.cut_power(torn))
            .collect()
    }

    /// SIGKILLs every node at the instant their disks lose power: no sync completes from the
    /// moment before the signals (`LazyMount::power_off`), and each process is reaped. Then
    /// `cut_power` drops what they had not synced.
    pub fn kill_all_powered_off(&self) {
        for mount in &self.mounts {
            mount.power_off();
        }
        for node in &self.nodes {
            node.process.send_kill();
        }
        for mount in &self.mounts {
            mount.killing();
        }
        for node in &self.nodes {
            node.process.kill();
        }
    }

    /// Makes every sync on node `id`'s lazy disk take `delay` (zero: at once); nothing without
    /// lazy data dirs.
    pub fn set_sync_delay(&self, id: u64, delay: Duration) {
        let position = self.ids().iter().position(|each| *each == id);
        if let Some(mount) = position.and_then(|position| self.mounts.get(position)) {
            mount.set_sync_delay(delay);
        }
    }

    /// Node `id`'s log file (every start's stdout and stderr).
    pub fn log_path(&self, id: u64) -> &std::path::Path {
        self.node(id).process.log_path()
    }

    /// The size of node `id`'s log file: where the next start's lines begin.
    pub fn log_len(&self, id: u64) -> u64 {
        self.node(id).process.log_len()
    }

    /// The last lines of node `id`'s log.
    pub fn log_tail(&self, id: u64) -> Vec<String> {
        self.node(id).process.log_tail(LOG_TAIL_LINES)
    }

    /// SIGSTOP (nothing when the node is not running).
    pub fn pause(&self, id: u64) {
        let _ = self.node(id).process.pause();
    }

    /// SIGCONT (nothing when the node is not running).
    pub fn resume(&self, id: u64) {
        let _ = self.node(id).process.resume();
    }

    /// Resumes and SIGKILLs every node, then releases the network. Never panics; safe to call
    /// more than once.
    pub fn stop_all(&self) {
        self.stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
        for node in &self.nodes {
            self.kill(node.id);
        }
        self.net.shutdown();
    }

    /// How many times each node was started.
    pub fn starts(&self) -> BTreeMap<u64, u32> {
        self.nodes
            .iter()
            .map(|node| (node.id, node.process.starts()))
            .collect()
    }

    /// `GET` a node-local route of node `id`, parsed as JSON.
    pub async fn get_json(&self, id: u64, path: &str) -> anyhow::Result<Value> {
        let url = format!("{}://{}{path}", self.scheme(), self.node(id).api);
        let response = self.http.get(url).send().await?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("{path} on node {id}: {status} {body}");
        }
        Ok(body)
    }

    /// One gauge from node `id`'s `/metrics` (a line `name value`).
    pub async fn gauge(&self, id: u64, name: &str) -> anyhow::Result<u64> {
        let url = format!("{}://{}/metrics", self.scheme(), self.node(id).api);
        let text = self
            .http
            .get(url)
            .timeout(CONTROL_TIMEOUT)
            .send()
            .await?
            .text()
            .await?;
        let value = text
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .with_context(|| format!("node {id} shows no {name} in /metrics"))?;
        Ok(value.trim().parse()?)
    }

    /// Sends a JSON request to node `id` with a timeout; returns status and body.
    pub async fn call(
        &self,
        id: u64,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> anyhow::Result<(u16, Value)> {
        let url = format!("{}://{}{path}", self.scheme(), self.node(id).api);
        let mut request = self.http.request(method, url).timeout(timeout);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        Ok((status, body))
    }

    /// The leader as the running, unpaused nodes see it, if one of them says it leads.
    pub async fn leader(&self) -> Option<u64> {
        for node in &self.nodes {
            if !self.is_running(node.id) || self.is_paused(node.id) {
                continue;
            }
            if let Ok(status) = self.get_json(node.id, "/v1/cluster").await {
                if status["leader_id"].as_u64() == Some(node.id) {
                    return Some(node.id);
                }
            }
        }
        None
    }

    /// Sets a node's clock (`--clock-control`): rate and wall offset.
    pub async fn set_clock(&self, id: u64, rate: f64, wall_offset_ms: i64) -> anyhow::Result<()> {
        let body = json!({"rate": rate, "wall_offset_ms": wall_offset_ms});
        let (status, answer) = self
            .call(
                id,
                reqwest::Method::POST,
                "/v1/debug/clock",
                Some(&body),
                CONTROL_TIMEOUT,
            )
            .await?;
        if status != 200 {
            bail!("clock control on node {id}: {status} {answer}");
        }
        Ok(())
    }

    /// Waits until every running node answers `/readyz` 200 and one leads.
    pub async fn wait_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut ready = true;
            for node in &self.nodes {
                if !self.is_running(node.id) {
                    continue;
                }
                let url = format!("{}://{}/readyz", self.scheme(), node.api);
                let ok = matches!(self.http.get(url).send().await, Ok(answer) if answer.status().is_success());
                ready &= ok;
            }
            if ready && self.leader().await.is_some() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "the cluster was not ready within {timeout:?}; see the node logs in {}",
                    self.config.run_dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn spawn(&self, node: &Node) -> anyhow::Result<()> {
        let stopped = || self.stopped.load(std::sync::atomic::Ordering::SeqCst);
        if stopped() {
            bail!("the cluster is stopped");
        }
        let batond = self.batond_of(node.id);
        let mut command = self.net.command(node.id, &batond);
        command.args(&node.args);
        if let Some(security) = &self.security {
            command.env("BATON_BOOTSTRAP_TOKEN", &security.token);
        }
        let pid = node
            .process
            .start(command, &format!("baton-jepsen: node {}", node.id))
            .with_context(|| format!("spawn {}", batond.display()))?;
        lock(&self.pids).insert(node.id, pid);
        // `stop_all` may have run between the check above and the start: it killed nothing
        // then, so this start must not outlive it.
        if stopped() {
            node.process.kill();
            bail!("the cluster is stopped");
        }
        Ok(())
    }
}

fn client_builder(security: Option<&Security>) -> anyhow::Result<reqwest::ClientBuilder> {
    let mut builder = reqwest::Client::builder().no_proxy();
    if let Some(security) = security {
        let mut headers = reqwest::header::HeaderMap::new();
        let mut bearer =
            reqwest::header::HeaderValue::from_str(&format!("Bearer {}", security.token))?;
        bearer.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, bearer);
        builder = builder
            .default_headers(headers)
            .add_root_certificate(reqwest::Certificate::from_pem(&security.certs.ca_pem())?);
    }
    Ok(builder)
}

/// Where node `id` of a cluster run in `run_dir` keeps its data.
fn node_data_dir(run_dir: &Path, id: u64) -> PathBuf {
    run_dir.join(format!("n{id}"))
}

/// What [`Cluster::kill_on_log_line`] did.
#[derive(Debug, Clone)]
pub enum LogKill {
    /// The line appeared and the node was SIGKILLed this long after the watch began.
    Killed {
        /// From the start of the watch to the kill.
        after: Duration,
        /// The line that triggered it.
        line: String,
    },
    /// The line did not appear in time; the node runs on.
    NotSeen,
    /// The give-up line appeared without the line before it; the node runs on.
    Passed,
    /// The node exited by itself before the line appeared.
    Exited,
}

/// The machine's 1-minute load average, for messages (`?` where unknown).
fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

/// Finds the `batond` binary: the flag, `BATOND_BIN`, next to this executable, or `PATH`.
pub fn find_batond(flag: Option<&Path>) -> anyhow::Result<PathBuf> {
    find_binary(
        "batond",
        flag,
        "BATOND_BIN",
        "cargo build --release -p baton-node",
    )
}

/// The binary `name`: `flag` (`--NAME PATH`), else `$env`, else next to this binary, else on
/// `PATH`; `build` says how to make it when there is none. Always an absolute path: the harness
/// starts processes in directories of their own.
pub fn find_binary(
    name: &str,
    flag: Option<&Path>,
    env: &str,
    build: &str,
) -> anyhow::Result<PathBuf> {
    let absolute =
        |path: &Path| std::path::absolute(path).with_context(|| format!("{}", path.display()));
    if let Some(path) = flag {
        if path.is_file() {
            return absolute(path);
        }
        bail!("--{name} {} is not a file", path.display());
    }
    if let Some(path) = std::env::var_os(env) {
        return absolute(Path::new(&path));
    }
    if let Some(sibling) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(name)))
        .filter(|path| path.is_file())
    {
        return Ok(sibling);
    }
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!("no {name} binary: pass --{name} PATH (build it with `{build}`)")
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found with `bench --workload hooks --baton target/release/baton`: every hook failed,
    /// since each agent spawns it from a working directory of its own.
    #[test]
    fn a_binary_named_by_a_relative_path_is_found_from_any_directory() {
        let found =
            find_binary("x", Some(Path::new("Cargo.toml")), "X_BIN", "build it").expect("a file");
        assert!(found.is_absolute(), "{}", found.display());
        assert!(found.ends_with("jepsen/Cargo.toml"), "{}", found.display());
    }

    #[test]
    fn a_node_failure_says_whose_fault_it_is_and_quotes_the_log() {
        let failure = NodeFailure {
            node: 2,
            fault: NodeFault::Restart,
            cause: "it exited (exit status: 1) 23 ms after start".to_owned(),
            log_tail: vec!["ERROR Failed to get log entries".to_owned()],
        };
        let text = failure.to_string();
        assert!(text.starts_with("node failed to restart: node 2: it exited"));
        assert!(text.contains("Failed to get log entries"));
        assert_eq!(failure.to_json()["kind"], "node failed to restart");
        let harness = NodeFailure {
            fault: NodeFault::Harness,
            ..failure.clone()
        };
        assert_eq!(harness.kind(), "harness failure");
        let crashed = NodeFailure {
            fault: NodeFault::Crashed,
            ..failure
        };
        assert_eq!(crashed.kind(), "node crashed");
    }
}
