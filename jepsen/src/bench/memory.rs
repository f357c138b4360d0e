//! `--workload memory`: three `batond` processes of its own (batond's default flags), filled
//! with `--leases` live leases held by sessions that are kept alive; then every node's resident
//! memory (VmRSS, and the peak VmHWM) and data directory size, and the time a SIGKILLed
//! follower takes from its start to answering `/readyz` again, with its RSS after.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::report::{Chart, Figures};
use super::sessions::{acquire_many, create_sessions, renew_all, LEASES_PER_SESSION};
use super::{own_cluster, BenchArgs};
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
    let http = super::client::Http::default();
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
    let filling = Instant::now();
    let failures = acquire_many(&http, &sessions, leases, None, FILL_IN_FLIGHT, |done| {
        eprintln!(
            "baton-jepsen bench: {done} leases acquired in {:.0} s",
            filling.elapsed().as_secs_f64()
        )
    })
    .await;
    let fill_seconds = filling.elapsed().as_secs_f64();
    let granted = leases as u64 - failures.total();
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
    renewer.abort();

    println!(
        "memory: {granted} leases ({failures}) in {} sessions, filled in {fill_seconds:.0} s; {}; node {follower} restarted serving in {restart_seconds:.1} s, RSS after {:.0} MiB",
        sessions.len(),
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
        after_restart.rss_mib
    );
    let json = serde_json::json!({
        "workload": "memory",
        "leases": granted,
        "acquire_failed": failures.by_cause,
        "sessions": sessions.len(),
        "fill_seconds": fill_seconds,
        "leader": leader,
        "nodes": nodes.iter().map(|node| serde_json::json!({
            "id": node.id,
            "rss_mib": node.rss_mib,
            "peak_rss_mib": node.peak_mib,
            "data_mib": node.data_mib,
        })).collect::<Vec<_>>(),
        "restarted": {
            "id": follower,
            "ready_seconds": restart_seconds,
            "rss_mib": after_restart.rss_mib,
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
