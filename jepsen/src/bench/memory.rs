//! `--workload memory`: three `batond` processes of its own (batond's default flags), filled
//! with `--leases` live leases held by sessions that are kept alive, with every acquire's
//! latency and the elections the fill caused (the fill crosses many snapshots of a growing
//! state); then every node's resident memory (VmRSS, and the peak VmHWM) and data directory
//! size, and the time a SIGKILLed follower takes from its start to answering `/readyz` again,
//! with its RSS after.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::client::Http;
use super::cycles::cycles_until;
use super::report::{Chart, Figures};
use super::sessions::{acquire_many, create_sessions, renew_all, LEASES_PER_SESSION};
use super::{own_cluster, percentile_ms, term, BenchArgs};
use crate::cluster::Cluster;

/// The sessions' TTL, and how often they are renewed while the bench runs.
const TTL: Duration = Duration::from_secs(600);
const RENEW_EVERY: Duration = Duration::from_secs(60);
/// Acquires in flight while filling.
const FILL_IN_FLIGHT: usize = 192;
/// Let followers apply the last entries before measuring.
const SETTLE: Duration = Duration::from_secs(3);
/// How long the restarted node may take before the bench gives up.
const RESTART_TIMEOUT: Duration = Duration::from_secs(120);

/// An acquire slower than this is counted: snapshots must not hold any request up this long.
const SLOW: Duration = Duration::from_millis(100);

/// The fill's acquire latencies.
#[derive(Debug)]
struct FillLatency {
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    max_ms: f64,
    /// How many took longer than `SLOW`.
    slow: usize,
}

impl FillLatency {
    fn of(sorted: &[Duration]) -> FillLatency {
        FillLatency {
            p50_ms: percentile_ms(sorted, 0.50),
            p99_ms: percentile_ms(sorted, 0.99),
            p999_ms: percentile_ms(sorted, 0.999),
            max_ms: percentile_ms(sorted, 1.0),
            slow: sorted.len() - sorted.partition_point(|took| *took <= SLOW),
        }
    }
}

/// The lease load beside which backups are saved: as `--workload leases --clients 64`.
const LOAD_CLIENTS: usize = 64;
const LOAD: Duration = Duration::from_secs(10);

/// What the lease load did in `LOAD`, and the backups saved meanwhile.
#[derive(Debug)]
struct LoadFigures {
    cycles_per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    errors: u64,
    saves: u64,
    save_failures: u64,
}

impl LoadFigures {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "cycles_per_second": self.cycles_per_second.round(),
            "acquire_p50_ms": self.p50_ms,
            "acquire_p99_ms": self.p99_ms,
            "acquire_max_ms": self.max_ms,
            "errors": self.errors,
            "saves": self.saves,
            "save_failures": self.save_failures,
        })
    }
}

impl std::fmt::Display for LoadFigures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.0} cycles/s, acquire p50 {:.2} ms, p99 {:.2} ms, max {:.1} ms, {} errors",
            self.cycles_per_second, self.p50_ms, self.p99_ms, self.max_ms, self.errors
        )?;
        if self.save_failures > 0 {
            write!(f, ", {} backups failed", self.save_failures)?;
        }
        Ok(())
    }
}

/// `LOAD_CLIENTS` clients cycling leases over every endpoint for `LOAD` (each with connections
/// of its own), and, with `saving_from`, backups fetched from that node back to back meanwhile.
async fn lease_load(
    http: &Http,
    endpoints: &[String],
    saving_from: Option<&str>,
) -> anyhow::Result<LoadFigures> {
    let deadline = Instant::now() + LOAD;
    let saver = saving_from.map(|endpoint| {
        let (http, endpoint) = (http.clone(), endpoint.to_owned());
        tokio::spawn(async move {
            let (mut saves, mut failures) = (0_u64, 0_u64);
            while Instant::now() < deadline {
                match http.get(&endpoint, "/v1/snapshot", None).await {
                    Ok(answer) if answer.status.is_success() => saves += 1,
                    _ => failures += 1,
                }
            }
            (saves, failures)
        })
    });
    let started = Instant::now();
    let clients: Vec<_> = (0..LOAD_CLIENTS)
        .map(|client| {
            let endpoint = endpoints[client % endpoints.len()].clone();
            let prefix = format!("load/{}/{client}", saving_from.is_some());
            tokio::spawn(cycles_until(Http::default(), endpoint, prefix, deadline))
        })
        .collect();
    let (mut cycles, mut errors, mut latencies) = (0, 0, Vec::new());
    for client in clients {
        let result = client.await.context("a load client")?;
        cycles += result.cycles;
        errors += result.errors;
        latencies.extend(result.acquire_latencies);
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let (saves, save_failures) = match saver {
        Some(saver) => saver.await.context("the backups")?,
        None => (0, 0),
    };
    Ok(LoadFigures {
        cycles_per_second: cycles as f64 / elapsed,
        p50_ms: percentile_ms(&latencies, 0.5),
        p99_ms: percentile_ms(&latencies, 0.99),
        max_ms: percentile_ms(&latencies, 1.0),
        errors,
        saves,
        save_failures,
    })
}

/// One node's figures.
#[derive(Debug)]
struct NodeMemory {
    id: u64,
    rss_mib: f64,
    peak_mib: f64,
    data_mib: f64,
}

pub(super) async fn run(args: &BenchArgs, run_dir: &Path) -> anyhow::Result<Figures> {
    let leases = args.leases.unwrap_or(1_000_000);
    if leases == 0 || leases > 2_000_000 {
        bail!("give --leases 1..=2000000");
    }
    let guard = own_cluster(args, run_dir).await?;
    let cluster = guard.0.clone();
    let endpoints = cluster.api_urls();
    let http = Http::default();
    let sessions = create_sessions(
        &http,
        &endpoints,
        leases.div_ceil(LEASES_PER_SESSION),
        TTL.as_millis() as u64,
        None,
    )
    .await?;
    let renewer = {
        let (http, sessions) = (http.clone(), sessions.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RENEW_EVERY).await;
                renew_all(&http, &sessions, None, 32).await;
            }
        })
    };
    let term_before = term(&http, &endpoints[0]).await?;
    let filling = Instant::now();
    let fill = acquire_many(&http, &sessions, leases, None, FILL_IN_FLIGHT, |done| {
        eprintln!(
            "baton-jepsen bench: {done} leases acquired in {:.0} s",
            filling.elapsed().as_secs_f64()
        )
    })
    .await;
    let fill_seconds = filling.elapsed().as_secs_f64();
    let failures = &fill.failures;
    let granted = leases as u64 - failures.total();
    let latency = FillLatency::of(&fill.latencies);
    let elections = term(&http, &endpoints[0]).await? - term_before;
    let slow_seconds = fill.slow_seconds(SLOW);
    tokio::time::sleep(SETTLE).await;
    let leader = cluster.leader().await.context("no leader after filling")?;
    let mut nodes = Vec::new();
    for id in cluster.ids() {
        nodes.push(measure(&cluster, id)?);
    }

    let follower = cluster
        .ids()
        .into_iter()
        .rev()
        .find(|id| *id != leader)
        .context("no follower")?;
    cluster.kill(follower);
    let restart = Instant::now();
    cluster
        .start_again(follower)
        .map_err(|failure| anyhow::anyhow!("{}: {}", failure.kind(), failure.cause))?;
    cluster
        .wait_restarted(follower, crate::cluster::Readiness::Ready, RESTART_TIMEOUT)
        .await
        .map_err(|failure| anyhow::anyhow!("{}: {}", failure.kind(), failure.cause))?;
    let restart_seconds = restart.elapsed().as_secs_f64();
    let after_restart = measure(&cluster, follower)?;
    // Backups beside the lease load: the load alone, then with backups saved back to back from
    // the leader, whose copy of the whole state is then encoded over and over.
    let leader_endpoint = format!("{}://{}", cluster.scheme(), cluster.node(leader).api);
    let alone = lease_load(&http, &endpoints, None).await?;
    let saving = lease_load(&http, &endpoints, Some(&leader_endpoint)).await?;
    let elections_after_fill = term(&http, &endpoints[0]).await? - term_before - elections;
    renewer.abort();

    println!(
        "memory: {granted} leases ({failures}) in {} sessions, filled in {fill_seconds:.0} s ({FILL_IN_FLIGHT} in flight: acquire p50 {:.1} ms, p99 {:.1} ms, p99.9 {:.1} ms, max {:.1} ms, {} over {} ms; {elections} elections); {}; node {follower} restarted serving in {restart_seconds:.1} s, RSS after {:.0} MiB (peak {:.0}: the snapshot decoded from its file, the log after it replayed)",
        sessions.len(),
        latency.p50_ms,
        latency.p99_ms,
        latency.p999_ms,
        latency.max_ms,
        latency.slow,
        SLOW.as_millis(),
        nodes
            .iter()
            .map(|node| format!(
                "node {}{} RSS {:.0} MiB (peak {:.0}), data {:.0} MiB",
                node.id,
                if node.id == leader { " (leader)" } else { "" },
                node.rss_mib,
                node.peak_mib,
                node.data_mib
            ))
            .collect::<Vec<_>>()
            .join("; "),
        after_restart.rss_mib,
        after_restart.peak_mib
    );
    if !slow_seconds.is_empty() {
        println!(
            "memory: acquires over {} ms by the second they were sent (UTC, as in the nodes' logs): {}",
            SLOW.as_millis(),
            slow_seconds
                .iter()
                .map(|(at, count, slowest)| format!("{at} {count} (max {} ms)", slowest.as_millis()))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    println!(
        "memory: {LOAD_CLIENTS} clients' lease cycles for {} s each: alone {alone}; beside {} backups saved from the leader (node {leader}) {saving}; {elections_after_fill} elections",
        LOAD.as_secs(),
        saving.saves,
    );
    let json = serde_json::json!({
        "workload": "memory",
        "leases": granted,
        "acquire_failed": failures.by_cause,
        "sessions": sessions.len(),
        "fill_seconds": fill_seconds,
        "fill_in_flight": FILL_IN_FLIGHT,
        "acquire_ms": {
            "p50": latency.p50_ms,
            "p99": latency.p99_ms,
            "p999": latency.p999_ms,
            "max": latency.max_ms,
        },
        "acquires_over_slow_ms": latency.slow,
        "slow_ms": SLOW.as_millis() as u64,
        "elections": elections,
        "slow_seconds": slow_seconds.iter().map(|(at, count, slowest)| serde_json::json!({
            "second": at, "acquires": count, "max_ms": slowest.as_millis() as u64,
        })).collect::<Vec<_>>(),
        "leader": leader,
        "nodes": nodes.iter().map(|node| serde_json::json!({
            "id": node.id,
            "rss_mib": node.rss_mib,
            "peak_rss_mib": node.peak_mib,
            "data_mib": node.data_mib,
        })).collect::<Vec<_>>(),
        "load": {
            "clients": LOAD_CLIENTS,
            "seconds": LOAD.as_secs(),
            "alone": alone.json(),
            "saving": saving.json(),
            "elections": elections_after_fill,
        },
        "restarted": {
            "id": follower,
            "ready_seconds": restart_seconds,
            "rss_mib": after_restart.rss_mib,
            "peak_mib": after_restart.peak_mib,
        },
    });
    let mut bars: Vec<(String, f64)> = nodes
        .iter()
        .map(|node| (format!("node {}", node.id), node.rss_mib))
        .collect();
    bars.push((format!("node {follower} restarted"), after_restart.rss_mib));
    let chart = Chart {
        title: format!("resident memory per node with {granted} live leases"),
        unit: "MiB (VmRSS)".to_owned(),
        bars,
    };
    drop(guard);
    Ok(Figures { json, chart })
}

fn measure(cluster: &Cluster, id: u64) -> anyhow::Result<NodeMemory> {
    let pid = cluster
        .pid(id)
        .with_context(|| format!("node {id} is not running"))?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    let kib = |field: &str| -> anyhow::Result<f64> {
        status
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .with_context(|| format!("no {field} in /proc/{pid}/status"))
    };
    Ok(NodeMemory {
        id,
        rss_mib: kib("VmRSS:")? / 1_024.0,
        peak_mib: kib("VmHWM:")? / 1_024.0,
        data_mib: dir_bytes(&cluster.data_dir(id))? as f64 / (1_024.0 * 1_024.0),
    })
}

/// The bytes of every file under `dir`.
fn dir_bytes(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let entry = entry?;
        let metadata = entry.metadata()?;
        total += if metadata.is_dir() {
            dir_bytes(&entry.path())?
        } else {
            metadata.len()
        };
    }
    Ok(total)
}
