//! The nemesis: faults injected on a seeded schedule while the workload runs, each a window
//! recorded in the history (`start` and `stop` events of process `nemesis`), and a heal that
//! undoes everything at the end.
//!
//! Faults: `kill` (SIGKILL and restart, sometimes of the leader, sometimes faster than the
//! election timeout), `kill-all` (every node SIGKILLed at once, then all restarted), `power`
//! (the same, with what no node synced dropped from their disks before the restart: every
//! data dir is on a lazy file system of its own, `lazyfs`), `pause` (SIGSTOP/SIGCONT of a node, and for workloads that honour it,
//! clients stalled inside their critical section), `partition` (isolate a node, isolate the
//! leader, a bridge, a one-way cut), `clock` (node rates within the 1% rate error, wall
//! offsets of any size, guard clocks within the rate error), `clock-beyond` (rates and jumps
//! outside G6's assumptions), `membership` (remove a node, add it back), `upgrade` (a
//! rolling upgrade: one node at a time stopped with SIGTERM and started again on the same data
//! dir with the new `batond`, the others still on the earlier release; once all run the new one,
//! a SIGTERM and restart of any node, the leader's hand-over included) and `restore` (a backup
//! through any node, a moment of writes the restore will undo, every node SIGKILLed, and every
//! data dir replaced by `batond restore` from the backup: a new cluster at the same addresses;
//! the checkers read the window from the backup to the restore as undone, `history::undone`). What must never
//! live here: any fault aimed at something the harness did not start.
//!
//! Every restart must succeed: a node that cannot be restarted (spawn fails, it exits, it is
//! never ready) ends the run at once with a [`NodeFailure`], which the runner turns into
//! exit 2. So does a node found to have exited by itself: restarting it would hide the crash. In snapshot-heavy runs (nodes started with a tiny `--snapshot-log-entries`) half the
//! kills are aimed at a snapshot install: a follower is kept down until the leader has
//! snapshotted and purged past it, restarted, and SIGKILLed the moment its log says
//! `installing snapshot`; then it must restart again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::cluster::{Cluster, LogKill, NodeFailure, NodeFault, Readiness, RESTART_READY_TIMEOUT};
use crate::history::History;
use crate::net::cut_between;
use crate::workloads::{ClientPause, GuardClock};

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// SIGKILL and restart.
    Kill,
    /// SIGKILL every node at once, then restart them all.
    KillAll,
    /// Cut the power of every node at once: SIGKILL all, drop what their disks had not
    /// synced, restart them all.
    Power,
    /// SIGSTOP and SIGCONT (and client stalls).
    Pause,
    /// Network partitions through the network backend (namespaces or proxy mesh).
    Partition,
    /// Clock faults within the rate error.
    Clock,
    /// Clock faults beyond it.
    ClockBeyond,
    /// Remove a node and add it back.
    Membership,
    /// Stop a node with SIGTERM and start it on the new binary (a rolling upgrade).
    Upgrade,
    /// Back the cluster up, lose it whole, and restore every member from the backup.
    Restore,
}

impl Fault {
    /// Parses a command-line name; `none` is no fault.
    pub fn parse(name: &str) -> anyhow::Result<Option<Fault>> {
        Ok(Some(match name {
            "kill" => Fault::Kill,
            "kill-all" => Fault::KillAll,
            "power" => Fault::Power,
            "pause" => Fault::Pause,
            "partition" => Fault::Partition,
            "clock" => Fault::Clock,
            "clock-beyond" => Fault::ClockBeyond,
            "membership" => Fault::Membership,
            "upgrade" => Fault::Upgrade,
            "restore" => Fault::Restore,
            "none" | "" => return Ok(None),
            other => anyhow::bail!(
                "unknown nemesis {other:?}: kill, kill-all, power, pause, partition, clock, clock-beyond, membership, upgrade, restore, none"
            ),
        }))
    }

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::KillAll => "kill-all",
            Fault::Power => "power",
            Fault::Pause => "pause",
            Fault::Partition => "partition",
            Fault::Clock => "clock",
            Fault::ClockBeyond => "clock-beyond",
            Fault::Membership => "membership",
            Fault::Upgrade => "upgrade",
            Fault::Restore => "restore",
        }
    }
}

/// What the nemesis works on.
#[derive(Debug, Clone)]
pub struct Nemesis {
    /// The cluster.
    pub cluster: Arc<Cluster>,
    /// The recorder.
    pub history: History,
    /// The workers' guard clocks.
    pub clocks: Vec<Arc<GuardClock>>,
    /// Client stalls.
    pub client_pause: Arc<ClientPause>,
    /// Whether the workload's clients honour stalls (`unfenced-lock`).
    pub stall_clients: bool,
    /// Enabled faults.
    pub faults: Vec<Fault>,
    /// No fault starts after this.
    pub deadline: Instant,
    /// The seed.
    pub seed: u64,
    /// `--snapshot-log-entries` of the nodes in a snapshot-heavy run: the kill nemesis then
    /// also aims at snapshot installs.
    pub snapshot_log_entries: Option<u64>,
}

/// The line batond logs when it starts installing a snapshot sent by the leader.
pub const INSTALL_STARTED: &str = "installing snapshot";
/// The line batond logs when the install is complete.
pub const INSTALL_FINISHED: &str = "snapshot installed";
/// How long the install-kill waits for an install to start after the restart.
const INSTALL_WATCH: Duration = Duration::from_secs(5);
/// How long a follower stays down at most while the others commit past its log.
const LAG_WAIT_MAX: Duration = Duration::from_secs(8);
/// How long a node told to stop (SIGTERM) may take to exit, a leader's hand-over included.
const UPGRADE_STOP_MAX: Duration = Duration::from_secs(10);

/// How many faults of each kind were injected.
pub type Injected = BTreeMap<String, u64>;

/// How long each sync takes on a leader's disk made slow before a power cut (`kill_all`):
/// long beside a follower's sync, so the followers commit what the leader has not synced.
const SLOW_SYNC: Duration = Duration::from_millis(40);

/// The first fault comes after this quiet time.
const QUIET_FIRST: Duration = Duration::from_millis(1_500);

impl Nemesis {
    /// Runs the schedule until the deadline, then heals. Returns the faults injected, or the
    /// first node that could not be restarted (recorded in the history as `restart-failed`).
    pub async fn run(self) -> Result<Injected, NodeFailure> {
        let result = self.schedule().await;
        if let Err(failure) = &result {
            self.record(failure);
        }
        result
    }

    /// Records a failure in the history: `crashed` or `restart-failed`.
    fn record(&self, failure: &NodeFailure) {
        let event = if failure.fault == NodeFault::Crashed {
            "crashed"
        } else {
            "restart-failed"
        };
        self.history.nemesis(event, failure.to_json());
    }

    async fn schedule(&self) -> Result<Injected, NodeFailure> {
        let mut injected = Injected::new();
        if self.faults.is_empty() {
            return Ok(injected);
        }
        let mut rng = StdRng::seed_from_u64(self.seed ^ 0x006E_656D_6573_6973);
        tokio::time::sleep(QUIET_FIRST).await;
        while Instant::now() + Duration::from_secs(2) < self.deadline {
            if let Some(crash) = self.cluster.crashed() {
                return Err(crash);
            }
            let fault = self.faults[rng.random_range(0..self.faults.len())];
            let name = match fault {
                Fault::Kill => self.kill(&mut rng).await?,
                Fault::KillAll => self.kill_all(&mut rng, Fault::KillAll).await?,
                Fault::Power => self.kill_all(&mut rng, Fault::Power).await?,
                Fault::Pause => self.pause(&mut rng).await,
                Fault::Partition => self.partition(&mut rng).await,
                Fault::Clock => self.clock(&mut rng, false).await,
                Fault::ClockBeyond => self.clock(&mut rng, true).await,
                Fault::Membership => self.membership(&mut rng).await,
                Fault::Upgrade => self.upgrade(&mut rng).await?,
                Fault::Restore => self.restore(&mut rng).await?,
            };
            *injected.entry(name).or_default() += 1;
            self.sleep(Duration::from_millis(rng.random_range(800..2_000)))
                .await;
        }
        self.heal_everything().await?;
        Ok(injected)
    }

    /// Undoes every fault: resumes nodes, heals the network, restarts stopped nodes (each
    /// must come back ready, else the first failure is returned at once), resets clocks,
    /// re-adds removed members. Safe to call at any time.
    pub async fn heal(&self) -> Result<(), NodeFailure> {
        let result = self.heal_everything().await;
        if let Err(failure) = &result {
            self.record(failure);
        }
        result
    }

    async fn heal_everything(&self) -> Result<(), NodeFailure> {
        self.client_pause.clear();
        for id in self.cluster.ids() {
            self.cluster.resume(id);
        }
        self.cluster.net.heal();
        if let Some(crash) = self.cluster.crashed() {
            return Err(crash);
        }
        for id in self.cluster.ids() {
            if !self.cluster.is_running(id) {
                self.cluster.restart(id, self.readiness()).await?;
            }
        }
        for clock in &self.clocks {
            clock.set_rate(1.0);
        }
        if self.cluster.config().clock_control {
            for id in self.cluster.ids() {
                let _ = self.cluster.set_clock(id, 1.0, 0).await;
            }
        }
        if self.faults.contains(&Fault::Membership) {
            for id in self.cluster.ids() {
                let _ = self.add_back(id, Duration::from_secs(20)).await;
            }
        }
        self.history.nemesis("heal", json!({}));
        Ok(())
    }

    /// What a restart must reach: ready, unless the membership fault may have left the node
    /// outside the cluster (it is then only asked to serve).
    fn readiness(&self) -> Readiness {
        if self.faults.contains(&Fault::Membership) {
            Readiness::Serving
        } else {
            Readiness::Ready
        }
    }

    async fn sleep(&self, duration: Duration) {
        let until = (Instant::now() + duration).min(self.deadline);
        tokio::time::sleep_until(until.into()).await;
    }

    async fn target(&self, rng: &mut StdRng) -> (u64, bool) {
        if rng.random_bool(0.5) {
            if let Some(leader) = self.cluster.leader().await {
                return (leader, true);
            }
        }
        let ids = self.cluster.ids();
        (ids[rng.random_range(0..ids.len())], false)
    }

    fn start(&self, fault: &str, value: Value) {
        let mut value = value;
        value["fault"] = Value::from(fault);
        self.history.nemesis("start", value);
    }

    fn stop(&self, fault: &str, value: Value) {
        let mut value = value;
        value["fault"] = Value::from(fault);
        self.history.nemesis("stop", value);
    }

    async fn kill(&self, rng: &mut StdRng) -> Result<String, NodeFailure> {
        if let Some(entries) = self.snapshot_log_entries {
            if rng.random_bool(0.5) {
                return self.kill_during_install(rng, entries).await;
            }
        }
        let (node, leader) = self.target(rng).await;
        // Sometimes back faster than the election timeout: the node resumes in the same term.
        let fast = rng.random_bool(0.4);
        let down = if fast {
            Duration::from_millis(rng.random_range(30..150))
        } else {
            Duration::from_millis(rng.random_range(500..2_500))
        };
        self.start(
            "kill",
            json!({"node": node, "leader": leader, "fast": fast}),
        );
        self.cluster.kill(node);
        tokio::time::sleep(down).await;
        let restarted = self.cluster.restart(node, self.readiness()).await;
        self.stop(
            "kill",
            json!({"node": node, "restarted": restarted.is_ok()}),
        );
        restarted.map(|()| "kill".to_owned())
    }

    /// One step of a rolling upgrade: a node still on the earlier release (any node once none
    /// is) is stopped with SIGTERM, which must exit 0, and started again on the new binary; it
    /// must come back ready.
    async fn upgrade(&self, rng: &mut StdRng) -> Result<String, NodeFailure> {
        let pending: Vec<u64> = self
            .cluster
            .ids()
            .into_iter()
            .filter(|id| !self.cluster.is_upgraded(*id))
            .collect();
        let leader = self.cluster.leader().await;
        let node = match pending.as_slice() {
            [] => self.target(rng).await.0,
            pending => pending[rng.random_range(0..pending.len())],
        };
        let upgrade = !pending.is_empty();
        self.start(
            "upgrade",
            json!({"node": node, "leader": leader == Some(node), "upgrade": upgrade}),
        );
        let stopped = self.cluster.terminate(node, UPGRADE_STOP_MAX).await;
        let stopped = match stopped {
            Ok(status) if status.success() => Ok(()),
            Ok(status) => Err(format!("it exited with {status} on SIGTERM")),
            Err(error) => Err(format!("{error:#}")),
        };
        if let Err(cause) = stopped {
            return Err(NodeFailure {
                node,
                fault: NodeFault::Crashed,
                cause,
                log_tail: self.cluster.log_tail(node),
            });
        }
        if upgrade {
            self.cluster.upgrade(node);
        }
        let restarted = self.cluster.restart(node, self.readiness()).await;
        self.stop(
            "upgrade",
            json!({"node": node, "restarted": restarted.is_ok()}),
        );
        restarted.map(|()| "upgrade".to_owned())
    }

    /// A backup, then the whole cluster lost and restored from it. The backup comes from a
    /// random node (`nemesis` event `backup`, with the file's header); the cluster runs on for a
    /// moment, granting fences and taking writes the restore will undo; then every node is
    /// SIGKILLed, its data dir replaced by `batond restore` from the file, and all are started
    /// again and must come back ready. A backup that fails (no leader at that moment) ends the
    /// fault with nothing lost: `saved` false.
    async fn restore(&self, rng: &mut StdRng) -> Result<String, NodeFailure> {
        let ids = self.cluster.ids();
        let from = ids[rng.random_range(0..ids.len())];
        let after_save = Duration::from_millis(rng.random_range(100..1_000));
        let down = Duration::from_millis(rng.random_range(50..500));
        self.start("restore", json!({"node": from}));
        let file = self
            .cluster
            .config()
            .run_dir
            .join(format!("backup-{}.bak", self.history.now_ns()));
        match self.cluster.save_backup(from, &file).await {
            Ok(header) => self.history.nemesis(
                "backup",
                json!({"node": from, "file": file.display().to_string(), "header": header}),
            ),
            Err(error) => {
                self.stop(
                    "restore",
                    json!({"saved": false, "error": format!("{error:#}")}),
                );
                return Ok("restore-unsaved".to_owned());
            }
        }
        tokio::time::sleep(after_save).await;
        for id in &ids {
            self.cluster.kill(*id);
        }
        tokio::time::sleep(down).await;
        let mut restored = Ok(());
        for id in &ids {
            if let Err(error) = self.cluster.restore_node(*id, &file) {
                restored = Err(NodeFailure {
                    node: *id,
                    fault: NodeFault::Restart,
                    cause: format!("{error:#}"),
                    log_tail: self.cluster.log_tail(*id),
                });
                break;
            }
        }
        if restored.is_ok() {
            restored = ids.iter().try_for_each(|id| self.cluster.start_again(*id));
        }
        if restored.is_ok() {
            for id in &ids {
                restored = self
                    .cluster
                    .wait_restarted(*id, self.readiness(), RESTART_READY_TIMEOUT)
                    .await;
                if restored.is_err() {
                    break;
                }
            }
        }
        self.stop(
            "restore",
            json!({"saved": true, "restarted": restored.is_ok()}),
        );
        restored.map(|()| "restore".to_owned())
    }

    /// SIGKILLs every node at once (paused ones too), keeps them down a moment (for `power`,
    /// drops what their disks had not synced), then starts them all before waiting for any
    /// (one alone cannot become ready without a quorum). Every one must come back:
    /// acknowledged writes are on disk, whatever the crash cut short.
    ///
    /// Half the power cuts first give the leader a slow disk (each sync takes
    /// `SLOW_SYNC` for a moment under load): the followers then hold, synced, entries
    /// the leader has written and not yet synced, and the cut takes them from the leader
    /// alone. A leader that came back in its old term with a shorter log would write other
    /// entries at those indexes, and the replicas would part (the digest checker sees it).
    async fn kill_all(&self, rng: &mut StdRng, fault: Fault) -> Result<String, NodeFailure> {
        let down = Duration::from_millis(rng.random_range(50..1_500));
        let name = fault.name();
        let slow_leader = if fault == Fault::Power && rng.random_bool(0.5) {
            self.cluster.leader().await
        } else {
            None
        };
        if let Some(leader) = slow_leader {
            self.cluster.set_sync_delay(leader, SLOW_SYNC);
            tokio::time::sleep(Duration::from_millis(rng.random_range(100..600))).await;
        }
        self.start(
            name,
            json!({"down_ms": down.as_millis() as u64, "slow_sync_node": slow_leader}),
        );
        let ids = self.cluster.ids();
        if fault == Fault::Power {
            self.cluster.kill_all_powered_off();
        } else {
            for id in &ids {
                self.cluster.kill(*id);
            }
        }
        if fault == Fault::Power {
            // The processes are gone: `kill` waits for each to exit.
            let lost: Vec<Value> = self
                .cluster
                .cut_power()
                .iter()
                .zip(&ids)
                .map(|(cut, id)| {
                    json!({"node": id, "files": cut.files, "bytes": cut.bytes,
                           "dirs": cut.dirs, "torn": cut.torn})
                })
                .collect();
            self.history.nemesis("power-cut", json!({"lost": lost}));
            if let Some(leader) = slow_leader {
                self.cluster.set_sync_delay(leader, Duration::ZERO);
            }
        }
        tokio::time::sleep(down).await;
        let mut restarted = ids.iter().try_for_each(|id| self.cluster.start_again(*id));
        if restarted.is_ok() {
            for id in &ids {
                restarted = self
                    .cluster
                    .wait_restarted(*id, self.readiness(), RESTART_READY_TIMEOUT)
                    .await;
                if restarted.is_err() {
                    break;
                }
            }
        }
        self.stop(name, json!({"restarted": restarted.is_ok()}));
        restarted.map(|()| name.to_owned())
    }

    /// Kills a follower, keeps it down until the others have committed more than twice what
    /// the leader keeps after a snapshot (`entries`), restarts it so that the leader must send
    /// it a snapshot, and SIGKILLs it as soon as its log says the install started. Then it
    /// must restart: a node whose storage cannot survive a kill inside an install (say, a log
    /// purged past what its durable snapshot covers) fails to come back, and the run stops
    /// with exit 2 naming it. The `install-kill` event says whether the kill hit an install.
    async fn kill_during_install(
        &self,
        rng: &mut StdRng,
        entries: u64,
    ) -> Result<String, NodeFailure> {
        let leader = self.cluster.leader().await;
        let followers: Vec<u64> = self
            .cluster
            .ids()
            .into_iter()
            .filter(|id| Some(*id) != leader)
            .collect();
        let node = followers[rng.random_range(0..followers.len())];
        self.start(
            "kill",
            json!({"node": node, "leader": false, "aim": "snapshot-install"}),
        );
        self.cluster.kill(node);
        let behind = self.wait_for_commits(entries * 3, LAG_WAIT_MAX).await;
        let log_from = self.cluster.log_len(node);
        if let Err(failure) = self.cluster.start_again(node) {
            self.stop("kill", json!({"node": node, "restarted": false}));
            return Err(failure);
        }
        // Mostly at once; sometimes a few milliseconds in, to land later inside the install
        // (after the snapshot is written, around the purge of the log it covers).
        let delay = Duration::from_millis([0, 0, 2, 5, 10][rng.random_range(0..5)]);
        let cluster = self.cluster.clone();
        let watched = tokio::task::spawn_blocking(move || {
            cluster.kill_on_log_line(
                node,
                log_from,
                INSTALL_STARTED,
                INSTALL_FINISHED,
                delay,
                INSTALL_WATCH,
            )
        })
        .await
        .unwrap_or(LogKill::NotSeen);
        let name = match &watched {
            LogKill::Killed { after, line } => {
                // Logged by the time of the kill, the install had finished: the kill came
                // too late to land inside it.
                let finished = self.cluster.log_contains(node, log_from, INSTALL_FINISHED);
                self.history.nemesis(
                    "install-kill",
                    json!({"node": node, "hit": true, "after_restart_ms": after.as_millis() as u64,
                           "kill_delay_ms": delay.as_millis() as u64,
                           "install_finished_before_kill": finished, "entries_behind": behind,
                           "line": line}),
                );
                // Down briefly, as after any kill, then the restart that must succeed.
                tokio::time::sleep(Duration::from_millis(rng.random_range(30..300))).await;
                "kill/install-hit"
            }
            LogKill::NotSeen | LogKill::Passed | LogKill::Exited => {
                let why = match watched {
                    LogKill::Exited => "the node exited by itself",
                    // A batond that does not log the start of an install.
                    LogKill::Passed => "an install finished without its start being logged",
                    _ => "no install started in time",
                };
                self.history.nemesis(
                    "install-kill",
                    json!({"node": node, "hit": false, "entries_behind": behind, "why": why}),
                );
                "kill/install-missed"
            }
        };
        let restarted = match watched {
            // A node that exits by itself after a restart has failed to restart; it is not
            // started a third time to hide that.
            LogKill::Exited => {
                self.cluster
                    .wait_restarted(node, self.readiness(), Duration::ZERO)
                    .await
            }
            _ => self.cluster.restart(node, self.readiness()).await,
        };
        self.stop(
            "kill",
            json!({"node": node, "restarted": restarted.is_ok()}),
        );
        restarted.map(|()| name.to_owned())
    }

    /// Waits (at most `timeout`) until the leader's commit index has moved `count` entries
    /// past where it is now; returns how far it moved.
    async fn wait_for_commits(&self, count: u64, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        let mut first: Option<u64> = None;
        let mut moved = 0;
        while Instant::now() < deadline {
            if let Some(leader) = self.cluster.leader().await {
                if let Ok(status) = self.cluster.get_json(leader, "/v1/cluster").await {
                    if let Some(commit) = status["commit_index"].as_u64() {
                        let first = *first.get_or_insert(commit);
                        moved = commit.saturating_sub(first);
                        if moved >= count {
                            break;
                        }
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        moved
    }

    async fn pause(&self, rng: &mut StdRng) -> String {
        let (node, leader) = self.target(rng).await;
        let duration = Duration::from_millis(rng.random_range(800..3_000));
        let clients = if self.stall_clients { 2 } else { 0 };
        self.start(
            "pause",
            json!({"node": node, "leader": leader, "clients": clients}),
        );
        self.cluster.pause(node);
        if clients > 0 {
            self.client_pause.request(clients);
        }
        self.sleep(duration).await;
        self.cluster.resume(node);
        self.stop("pause", json!({"node": node}));
        "pause".to_owned()
    }

    async fn partition(&self, rng: &mut StdRng) -> String {
        let ids = self.cluster.ids();
        let kind = ["isolate", "isolate-leader", "bridge", "one-way"][rng.random_range(0..4)];
        let links: BTreeSet<(u64, u64)> = match kind {
            "isolate-leader" => {
                let node = match self.cluster.leader().await {
                    Some(leader) => leader,
                    None => ids[rng.random_range(0..ids.len())],
                };
                cut_between(&[node], &ids)
            }
            "bridge" => {
                // The middle node sees both sides; the two ends do not see each other.
                let mut order = ids.clone();
                let middle = order.remove(rng.random_range(0..order.len()));
                let _ = middle;
                BTreeSet::from([(order[0], order[1]), (order[1], order[0])])
            }
            "one-way" => {
                // One node cannot send to the others, but hears them.
                let node = ids[rng.random_range(0..ids.len())];
                ids.iter()
                    .filter(|&&other| other != node)
                    .map(|&other| (node, other))
                    .collect()
            }
            _ => {
                let node = ids[rng.random_range(0..ids.len())];
                cut_between(&[node], &ids)
            }
        };
        let duration = Duration::from_millis(rng.random_range(1_500..4_000));
        let shown: Vec<[u64; 2]> = links.iter().map(|&(from, to)| [from, to]).collect();
        self.start("partition", json!({"kind": kind, "blocked": shown}));
        self.cluster.net.set_blocked(&links);
        self.sleep(duration).await;
        self.cluster.net.heal();
        self.stop("partition", json!({"kind": kind}));
        format!("partition/{kind}")
    }

    async fn clock(&self, rng: &mut StdRng, beyond: bool) -> String {
        let fault = if beyond { "clock-beyond" } else { "clock" };
        let mut settings = Vec::new();
        for id in self.cluster.ids() {
            let rate = if beyond {
                [0.5, 0.8, 1.05, 1.3, 2.0][rng.random_range(0..5)]
            } else {
                rng.random_range(0.99..=1.01)
            };
            // Wall offsets of any size, up to a day either way: they must not matter.
            let offset = rng.random_range(-86_400_000i64..=86_400_000);
            let applied = self.cluster.set_clock(id, rate, offset).await.is_ok();
            settings.push(
                json!({"node": id, "rate": rate, "wall_offset_ms": offset, "applied": applied}),
            );
        }
        let mut client_rates = Vec::new();
        for clock in &self.clocks {
            let rate = if beyond {
                rng.random_range(0.9..=1.1)
            } else {
                rng.random_range(0.99..=1.01)
            };
            clock.set_rate(rate);
            client_rates.push(rate);
        }
        self.start(
            fault,
            json!({"nodes": settings, "client_rates": client_rates}),
        );
        self.sleep(Duration::from_millis(rng.random_range(2_000..5_000)))
            .await;
        for id in self.cluster.ids() {
            let _ = self.cluster.set_clock(id, 1.0, 0).await;
        }
        for clock in &self.clocks {
            clock.set_rate(1.0);
        }
        self.stop(fault, json!({}));
        fault.to_owned()
    }

    async fn membership(&self, rng: &mut StdRng) -> String {
        let (node, leader) = self.target(rng).await;
        let others: Vec<u64> = self
            .cluster
            .ids()
            .into_iter()
            .filter(|id| *id != node)
            .collect();
        self.start("membership", json!({"node": node, "leader": leader}));
        let mut removed = false;
        let deadline = Instant::now() + Duration::from_secs(5);
        while !removed && Instant::now() < deadline {
            for &via in &others {
                let path = format!("/v1/cluster/members/{node}");
                if let Ok((200, _)) = self
                    .cluster
                    .call(
                        via,
                        reqwest::Method::DELETE,
                        &path,
                        None,
                        Duration::from_secs(3),
                    )
                    .await
                {
                    removed = true;
                    break;
                }
            }
            if !removed {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        self.history
            .nemesis("remove", json!({"node": node, "removed": removed}));
        self.sleep(Duration::from_millis(rng.random_range(1_000..3_000)))
            .await;
        let added = self.add_back(node, Duration::from_secs(10)).await;
        self.stop("membership", json!({"node": node, "added": added}));
        "membership".to_owned()
    }

    /// Adds node `node` back unless a leader other than it lists it as a voter; true when
    /// one does. The request goes to the other nodes (a removed leader may still think it
    /// leads a configuration without itself).
    async fn add_back(&self, node: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let others: Vec<u64> = self
            .cluster
            .ids()
            .into_iter()
            .filter(|id| *id != node)
            .collect();
        while Instant::now() < deadline {
            for &via in &others {
                let Ok(status) = self.cluster.get_json(via, "/v1/cluster").await else {
                    continue;
                };
                if status["leader_id"].as_u64() == Some(node) {
                    return true; // it leads: it is a voter
                }
                if status["leader_id"].as_u64() != Some(via) {
                    continue;
                }
                let voter = status["members"].as_array().is_some_and(|members| {
                    members.iter().any(|member| {
                        member["id"].as_u64() == Some(node)
                            && member["voter"].as_bool() != Some(false)
                    })
                });
                if voter {
                    return true;
                }
                let body = serde_json::to_value(baton_client::api::AddMemberRequest {
                    id: node,
                    api_addr: self.cluster.net.advertised_api_addr(node).to_string(),
                    peer_addr: self.cluster.net.advertised_peer_addr(node).to_string(),
                    voter: true,
                })
                .expect("a wire type always serializes");
                let _ = self
                    .cluster
                    .call(
                        via,
                        reqwest::Method::POST,
                        "/v1/cluster/members",
                        Some(&body),
                        Duration::from_secs(8),
                    )
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        false
    }
}
